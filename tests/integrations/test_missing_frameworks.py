"""Without its framework an integration module raises an ImportError naming
the extra to install, and `import torchmon` loads no integration, framework
or torch (docs/integrations.md). The frameworks are hidden from a fresh
interpreter by a meta path finder, so these run whether or not they are
installed."""

from __future__ import annotations

from pathlib import Path

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
    ("module", "hidden", "extra", "pip_names"),
    [
        (
            "torchmon.integrations.transformers",
            ("transformers",),
            "transformers",
            "transformers accelerate",
        ),
        ("torchmon.integrations.lightning", ("lightning",), "lightning", "lightning"),
    ],
)
def test_a_missing_framework_names_the_extra(
    module: str, hidden: tuple[str], extra: str, pip_names: str
) -> None:
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
    # Commands that work: torchmon is on no package index (README.md).
    assert f"pip install {pip_names} (in a torchmon checkout: pip install '.[{extra}]')" in message
    assert "torchmon[" not in message, message
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


@pytest.mark.parametrize(
    ("example", "hidden", "extra"),
    [
        ("hf_trainer.py", ("transformers",), "transformers"),
        ("lightning_trainer.py", ("lightning",), "lightning"),
    ],
)
def test_an_example_says_which_framework_is_missing(
    example: str, hidden: tuple[str], extra: str
) -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / example
    proc = run_python(
        HIDE.format(hidden=set(hidden))
        + f"""
import runpy
sys.argv = [{str(path)!r}]
runpy.run_path({str(path)!r}, run_name="__main__")
"""
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert f"this example needs {extra}" in proc.stderr
    assert f"pip install '.[{extra}]'" in proc.stderr
    assert "torchmon[" not in proc.stderr, proc.stderr


def test_peak_memory_is_read_only_from_an_initialised_cuda() -> None:
    """Neither imports torch nor initialises CUDA (docs/integrations.md)."""
    proc = run_python(
        """
        import sys, types
        from torchmon.integrations._common import peak_memory_bytes
        print(peak_memory_bytes(), "torch" in sys.modules)  # torch never imported
        class Cuda:
            initialised = False
            def is_initialized(self): return self.initialised
            def max_memory_allocated(self): return 123
        fake = types.ModuleType("torch"); fake.cuda = Cuda()
        sys.modules["torch"] = fake
        print(peak_memory_bytes())
        fake.cuda.initialised = True
        print(peak_memory_bytes())
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:3] == ["None False", "None", "123.0"]
