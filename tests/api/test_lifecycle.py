"""What runs at exit and in a forked child is one ordered list, in one module
(docs/internals.md, "Exit" and "Fork"): this scan of python/torchmon fails on
an `atexit.register`, `os.register_at_fork` or `threading._register_atexit`
call anywhere but python/torchmon/_lifecycle.py. The steps' behaviour is
tested where it is promised (tests/robustness, docs/reliability.md)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import torchmon

PACKAGE = Path(torchmon.__file__).parent
REGISTRATIONS = {
    ("atexit", "register"),
    ("os", "register_at_fork"),
    ("threading", "_register_atexit"),
}


def _registrations(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if (node.value.id, node.attr) in REGISTRATIONS:
                found.append(f"{node.value.id}.{node.attr} (line {node.lineno})")
    return found


def test_only_the_lifecycle_module_registers_exit_and_fork_steps() -> None:
    elsewhere = {
        str(path.relative_to(PACKAGE)): found
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "_lifecycle.py" and (found := _registrations(path))
    }
    assert elsewhere == {}
    assert _registrations(PACKAGE / "_lifecycle.py")  # the scan sees them there


def test_import_registers_one_exit_gate_step_and_one_last_step() -> None:
    """`import torchmon` adds exactly two atexit handlers (the exit gate's and
    `_last_steps`); the flush and drain are added at threading's exit hook."""
    code = (
        "import atexit; before = atexit._ncallbacks(); import torchmon; "
        "print(atexit._ncallbacks() - before)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "2"
