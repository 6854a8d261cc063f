"""Bad arguments to the integrations raise a TypeError or ValueError naming
the argument (docs/integrations.md), checked in one fresh interpreter per
framework (their imports take seconds and warn)."""

from __future__ import annotations

import importlib.util

import pytest
from support import run_python

CASES = {
    "transformers": (
        "from torchmon.integrations.transformers import TorchmonCallback as C",
        [
            ("C(window=0)", "ValueError", "TorchmonCallback(window)"),
            ("C(window='1s')", "TypeError", "TorchmonCallback(window)"),
            ("C(window=float('nan'))", "ValueError", "TorchmonCallback(window)"),
            ("C(prefix=1)", "TypeError", "TorchmonCallback(prefix)"),
            ("C(log_dir=3)", "TypeError", "TorchmonCallback(log_dir)"),
            ("C('d', tensorboard='yes')", "TypeError", "TorchmonCallback(tensorboard)"),
        ],
    ),
    "lightning": (
        "from torchmon.integrations.lightning import TorchmonLogger as L, TorchmonCallback as C",
        [
            ("L(window=-1)", "ValueError", "TorchmonLogger(window)"),
            ("L(name=None)", "TypeError", "TorchmonLogger(name)"),
            ("L(version=1.5)", "TypeError", "TorchmonLogger(version)"),
            ("L(log_dir=b'd')", "TypeError", "TorchmonLogger(log_dir)"),
            ("L(tensorboard=1)", "TypeError", "TorchmonLogger(tensorboard)"),
            ("C(window=True)", "TypeError", "TorchmonCallback(window)"),
            ("C(prefix=b'x')", "TypeError", "TorchmonCallback(prefix)"),
        ],
    ),
}


@pytest.mark.parametrize("framework", sorted(CASES))
def test_bad_arguments_name_the_argument(framework: str) -> None:
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"needs {framework}")
    imports, cases = CASES[framework]
    calls = "\n".join(
        f"""
try:
    {call}
except Exception as exc:
    print(type(exc).__name__, "|", exc)
else:
    print("no error |", {call!r})"""
        for call, _, _ in cases
    )
    # A deadline for a hung child, not a speed check (the import alone takes seconds).
    proc = run_python(
        f"import warnings\nwarnings.simplefilter('ignore')\n{imports}\n{calls}", timeout=240.0
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == len(cases), proc.stdout
    for (call, kind, named), line in zip(cases, lines):
        got_kind, message = line.split(" | ", 1)
        assert got_kind == kind, (call, line)
        assert message.startswith(named), (call, line)
