"""Without its framework an integration module raises an ImportError naming
the extra to install, and `import torchmon` loads no integration, framework
or torch (docs/integrations.md). The frameworks are hidden from a fresh
interpreter by a meta path finder, so these run whether or not they are
installed."""

from __future__ import annotations

import pytest
from support import run_python

HIDE = """
import sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {hidden!r}:
            raise ImportError(f"No module named {{name!r}}")
        return None
sys.meta_path.insert(0, Hide())
"""


@pytest.mark.parametrize(
    ("module", "hidden", "extra"),
    [
        ("torchmon.integrations.transformers", ("transformers",), "transformers"),
        ("torchmon.integrations.lightning", ("lightning",), "lightning"),
    ],
)
def test_a_missing_framework_names_the_extra(module: str, hidden: tuple[str], extra: str) -> None:
    proc = run_python(
        HIDE.format(hidden=set(hidden))
        + f"""
import torchmon.integrations
try:
    import {module}
except ImportError as exc:
    print(exc)
else:
    print("imported")
"""
    )
    assert proc.returncode == 0, proc.stderr
    message = proc.stdout.strip()
    assert f'pip install "torchmon[{extra}]"' in message, message
    assert module in message, message


def test_import_torchmon_loads_no_integration() -> None:
    proc = run_python(
        """
        import sys, torchmon
        torchmon.Stat("x", [torchmon.MEAN], 1.0).add(1.0)
        print(sorted(m for m in sys.modules
                     if m.split(".")[0] in ("torch", "transformers", "lightning", "accelerate")
                     or m.startswith("torchmon.integrations")))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
