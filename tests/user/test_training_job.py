"""A real training job (examples/preemptible_training.py: torch on the CPU, a
DataLoader with two fork workers, JSON lines per process and TensorBoard)
loses no sample: killed by SIGTERM in the middle of its 60-second windows,
and when it ends normally (docs/reliability.md "A real job")."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import torchmon

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="needs torch (the job is a torch job)"
)

JOB = Path(__file__).resolve().parents[2] / "examples" / "preemptible_training.py"
STEPS = 20
TIMEOUT = 120.0


def stat_windows(path: Path) -> list[dict[str, Any]]:
    return [e.data for e in torchmon.read_jsonl(path) if e.name == torchmon.STAT_EVENT]


def total(windows: list[dict[str, Any]], key: str) -> float:
    return math.fsum(w[key] for w in windows if key in w)


def truth(out: Path) -> dict[int, list[dict[str, Any]]]:
    lines: dict[int, list[dict[str, Any]]] = {}
    for path in out.glob("truth-*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            lines.setdefault(record["pid"], []).append(record)
    return lines


def is_running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended


def wait_for_workers(pids: list[int], timeout: float = 60.0) -> None:
    """The workers outlive a killed main process until they notice it is gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(is_running(pid) for pid in pids):
            return
        time.sleep(0.1)
    for pid in pids:
        if is_running(pid):
            os.kill(pid, signal.SIGKILL)
    pytest.fail(f"workers {pids} were still running {timeout}s after the main process ended")


def check_every_sample_arrived(out: Path, main_pid: int) -> None:
    recorded = truth(out)
    main = recorded.pop(main_pid)
    assert len(main) == STEPS
    assert len(recorded) == 2, sorted(recorded)  # two workers

    windows = stat_windows(out / "main.jsonl")
    assert total(windows, "train.loss.count") == STEPS
    assert total(windows, "train.samples.sum") == sum(r["samples"] for r in main)
    assert total(windows, "train.step.count") == STEPS
    loss_sum = sum(
        w["train.loss.count"] * w["train.loss.mean"] for w in windows if "train.loss.count" in w
    )
    assert loss_sum == pytest.approx(sum(r["loss"] for r in main), rel=1e-9)

    for pid, items in recorded.items():
        windows = stat_windows(out / f"worker-{pid}.jsonl")
        assert total(windows, "data.items.count") == len(items)
        assert total(windows, "data.items.sum") == sum(r["item"] for r in items)
        assert not any("train.loss.count" in w for w in windows)

    if importlib.util.find_spec("tensorboardX") is not None:
        accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
        events = accumulator.EventAccumulator(str(out / "tb"))
        events.Reload()
        assert math.fsum(s.value for s in events.Scalars("train.loss.count")) == STEPS
        samples = math.fsum(s.value for s in events.Scalars("train.samples.sum"))
        assert samples == sum(r["samples"] for r in main)


def test_a_job_killed_by_sigterm_mid_window_loses_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, str(JOB), "--out", str(out), "--steps", str(STEPS), "--wait-for-signal"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()
        assert ready.strip() == "ready", proc.stderr.read() if proc.stderr else ""
        worker_pids = [pid for pid in truth(out) if pid != proc.pid]
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -signal.SIGTERM, stderr
    wait_for_workers(worker_pids)
    check_every_sample_arrived(out, proc.pid)


def test_the_same_job_ending_normally_loses_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, str(JOB), "--out", str(out), "--steps", str(STEPS)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"trained {STEPS} steps" in proc.stdout
    main_pid = next(pid for pid, lines in truth(out).items() if "loss" in lines[0])
    check_every_sample_arrived(out, main_pid)
    # One epoch of exactly STEPS batches: every item was loaded once.
    items = sorted(r["item"] for pid, lines in truth(out).items() for r in lines if "item" in r)
    assert items == list(range(STEPS * 8))
