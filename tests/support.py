"""Helpers shared by the tests (import with `from support import ...`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def run_python(code: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Runs `code` in a fresh interpreter (for crashes, hangs and exit behaviour)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_child_writing(
    prelude: str, body: str, out: Path, timeout: float = 60.0
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Runs `prelude` (a format string naming `{out!r}`, the file the child
    writes) followed by `body` in a fresh interpreter; returns the process and
    the lines of that file, read after the child exited (none if it wrote
    nothing). A child that does not exit within `timeout` fails the test."""
    code = prelude.format(out=str(out)) + textwrap.dedent(body)
    try:
        proc = run_python(code, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child did not exit within {timeout}s")
    lines = out.read_text(encoding="utf-8").splitlines() if out.exists() else []
    return proc, lines
