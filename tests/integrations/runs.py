"""Helpers of the framework integration tests (docs/integrations.md): the
examples run as a user runs them, in a fresh interpreter with a timeout, and
what they wrote read back independently."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import torchmon

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: No download, no telemetry, one thread per process: the run is CPU-bound and small.
CHILD_ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "OMP_NUM_THREADS": "1",
}


#: A deadline for a hung run, not a speed check (a run takes ~10 s of CPU,
#: but minutes of wall time on a 2-core machine shared with other builds).
TIMEOUT = 300.0


def run_example(name: str, *args: str, cwd: Path, timeout: float = TIMEOUT) -> str:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=cwd,
        env=CHILD_ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    return proc.stdout


def events(path: Path) -> list[torchmon.Event]:
    return list(torchmon.read_jsonl(path))


def windows_of(evs: list[torchmon.Event], stat: str) -> list[dict[str, Any]]:
    """The windows of one Stat, each as {aggregation suffix: value}."""
    prefix = f"{stat}."
    found = []
    for event in evs:
        if event.name != torchmon.STAT_EVENT:
            continue
        window = {
            key[len(prefix) :]: value for key, value in event.data.items() if key.startswith(prefix)
        }
        if window:
            found.append(window)
    return found


def total(windows: list[dict[str, Any]], aggregation: str) -> float:
    return math.fsum(w[aggregation] for w in windows)


def check_step_time_windows(windows: list[dict[str, Any]], steps: int) -> None:
    """Every step in exactly one window; each window's quantiles ordered and
    within its extremes (P99 may be a bucket estimate: docs/api.md)."""
    assert windows, "no step-time window"
    assert total(windows, "count") == steps
    for w in windows:
        assert set(w) == {"count", "mean", "p50", "p99", "max"}, w
        assert 0 < w["p50"] <= w["p99"] <= w["max"], w
        assert w["mean"] <= w["max"], w


def check_logged_windows(windows: list[dict[str, Any]], logged: list[float]) -> None:
    """The windows of a logged value hold exactly the values the framework logged."""
    assert logged, "the framework logged nothing"
    assert total(windows, "count") == len(logged)
    assert total(windows, "sum") == pytest.approx(math.fsum(logged), rel=1e-12)
    assert min(w["min"] for w in windows) == min(logged)
    assert max(w["max"] for w in windows) == max(logged)
    assert windows[-1]["value"] == logged[-1]


def tensorboard_scalars(logdir: Path) -> dict[str, list[float]]:
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = accumulator.EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [ev.value for ev in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
