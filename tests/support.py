"""Helpers shared by the tests (import with `from support import ...`)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


#: The reference folder: the torch 2.13 CPU wheel (wheels/) and the
#: conformance vectors recorded from torch.monitor (conformance/). Where
#: TORCHMON_SHARED says, else ../shared beside the checkout; the tests that
#: need it skip without it (README.md, "Tests and examples that need torch").
SHARED = Path(os.environ.get("TORCHMON_SHARED") or Path(__file__).resolve().parents[2] / "shared")
#: The torch 2.13 vectors and replay.py.
CONFORMANCE = SHARED / "conformance"


def load_conformance() -> tuple[Any, list[dict[str, Any]]]:
    """replay.py as a module, and the scenarios of torch-2.13-vectors.jsonl;
    `(None, [])` when the shared folder is absent."""
    replay_path = CONFORMANCE / "replay.py"
    vectors = CONFORMANCE / "torch-2.13-vectors.jsonl"
    if not (replay_path.is_file() and vectors.is_file()):
        return None, []
    spec = importlib.util.spec_from_file_location("torchmon_conformance_replay", replay_path)
    assert spec is not None and spec.loader is not None
    replay = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(replay)
    with vectors.open(encoding="utf-8") as f:
        scenarios = [json.loads(line) for line in f if line.strip()]
    return replay, scenarios


def assert_scenario_replays(replay: Any, module: Any, scenario: dict[str, Any]) -> None:
    """Runs one vector scenario against `module` (torchmon or the reference
    model); fails naming the first op whose result differs (-0.0 != 0.0)."""
    got = replay.run_scenario(module, scenario)
    i = replay.first_mismatch(scenario["expect"], got, strict_zero=True)
    if i is not None:
        op = scenario["ops"][i] if i < len(scenario["ops"]) else None
        expected = scenario["expect"][i] if i < len(scenario["expect"]) else None
        actual = got[i] if i < len(got) else None
        pytest.fail(
            f"op #{i}: {replay.dumps(op)}\n"
            f"expected: {replay.dumps(expected)}\n"
            f"got:      {replay.dumps(actual)}"
        )


@contextlib.contextmanager
def registered(handler: Any) -> Iterator[None]:
    """`handler` registered with torchmon for the block."""
    import torchmon

    handle = torchmon.register_event_handler(handler)
    try:
        yield
    finally:
        torchmon.unregister_event_handler(handle)


TORCHRUN_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "TORCHELASTIC_RUN_ID",
)


def clear_torchrun_env(monkeypatch: Any) -> None:
    """The process environment without any of torchrun's variables."""
    for variable in TORCHRUN_VARIABLES:
        monkeypatch.delenv(variable, raising=False)


def emit_open_windows(*stats: Any) -> None:
    """Emits these Stats' open windows now, as ``torchmon.flush()`` does for
    every live Stat: a test comparing what a sink received uses this, so that
    a Stat another test left alive (or a sampler's) adds nothing to it."""
    for stat in stats:
        stat._flush_window()
