"""Helpers shared by the tests (import with `from support import ...`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run_python(code: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Runs `code` in a fresh interpreter (for crashes, hangs and exit behaviour)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
