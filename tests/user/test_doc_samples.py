"""Every Python code block of README.md and docs/*.md runs as shown, on its
own, in a fresh process and an empty directory, so that a sample cannot rot.

A block that needs a module this environment lacks (an optional sink
library, torch) is skipped, naming it. A block that is deliberately a sketch
is preceded in the markdown by ``<!-- doc-test: skip (why) -->``; keep those
few.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)
_SKIP = re.compile(r"<!--\s*doc-test:\s*skip\s*(.*?)\s*-->\s*$")


def blocks() -> list[tuple[str, str, str | None]]:
    """(``file:line``, code, skip reason) of every Python block."""
    found = []
    for doc in DOCS:
        if not doc.is_file():
            continue
        text = doc.read_text(encoding="utf-8")
        for match in _BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marker = _SKIP.search(before)
            reason = (marker.group(1).strip("() ") or "a sketch") if marker else None
            found.append((f"{doc.relative_to(REPO)}:{line}", match.group(1), reason))
    return found


BLOCKS = blocks()


def missing_modules(code: str) -> list[str]:
    """The top-level modules the block imports that cannot be imported here."""
    missing = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            try:
                found = importlib.util.find_spec(name) is not None
            except ImportError:  # a parent package is missing
                found = False
            if not found and name not in missing:
                missing.append(name)
    return missing


def test_the_docs_have_python_samples() -> None:
    if not (REPO / "docs").is_dir():
        pytest.skip("not run from a checkout")
    assert len(BLOCKS) >= 20
    # Sketches that are not run stay the exception.
    assert sum(reason is not None for _, _, reason in BLOCKS) <= 3


@pytest.mark.parametrize(("where", "code", "skip"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_doc_sample_runs_as_shown(where: str, code: str, skip: str | None, tmp_path: Path) -> None:
    if skip is not None:
        pytest.skip(f"{where}: marked in the markdown: {skip}")
    missing = missing_modules(code)
    if missing:
        pytest.skip(f"{where} needs {', '.join(missing)}, which is not installed")
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, f"{where} failed:\n{result.stderr}"


def test_the_readme_example_prints_the_window_it_talks_about(tmp_path: Path) -> None:
    """README's first example says each window is logged as an Event: its
    `print` handler shows the Stat window, then the epoch event."""
    readme = [code for where, code, _ in BLOCKS if where.startswith("README.md")]
    if not readme:
        pytest.skip("not run from a checkout")
    code = readme[0]
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2, result.stdout
    assert "name='torch.monitor.Stat'" in lines[0] and "'train.loss.mean'" in lines[0]
    assert "name='train.epoch_end'" in lines[1]
