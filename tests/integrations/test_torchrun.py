"""examples/hf_trainer.py under real torchrun (2 ranks, gloo, CPU, on
127.0.0.1): each rank writes its own events file, names its rank, records
every one of its steps, and its loss windows hold what the Trainer logged;
`torchmon summarize` over both files gives the cross-rank step-time table
(docs/integrations.md, "Several ranks"). The process group is stopped by pid
whatever happens."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_server import free_port
from runs import (
    CHILD_ENV,
    EXAMPLES,
    check_logged_windows,
    check_step_time_windows,
    events,
    windows_of,
)

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

pytestmark = pytest.mark.slow

RANKS = 2
STEPS = 20
TIMEOUT = 300.0  # a deadline for a hung job, not a speed check


def test_two_ranks_under_torchrun(tmp_path: Path) -> None:
    log_dir = tmp_path / "run"
    torchrun = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={RANKS}",
            "--master-addr=127.0.0.1",
            f"--master-port={free_port()}",
            str(EXAMPLES / "hf_trainer.py"),
            f"--log-dir={log_dir}",
            f"--steps={STEPS}",
        ],
        cwd=tmp_path,
        env=CHILD_ENV,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = torchrun.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(torchrun.pid, signal.SIGKILL)
        torchrun.communicate()
        pytest.fail(f"torchrun did not finish in {TIMEOUT} s")
    finally:
        if torchrun.poll() is None:
            os.killpg(torchrun.pid, signal.SIGKILL)
            torchrun.wait()
    log = output.decode(errors="replace")
    assert torchrun.returncode == 0, log[-4000:]

    history = json.loads((log_dir / "trainer_state.json").read_text())["log_history"]
    logged_loss = [entry["loss"] for entry in history if "loss" in entry]
    for rank in range(RANKS):
        evs = events(log_dir / f"events-rank{rank}.jsonl")
        (run,) = [e.data for e in evs if e.name == "torchmon.run"]
        assert (run["rank"], run["local_rank"], run["world_size"]) == (str(rank), str(rank), 2)
        check_step_time_windows(windows_of(evs, "train.step_time"), STEPS)
        # The Trainer logs the loss averaged over the ranks, on every rank.
        check_logged_windows(windows_of(evs, "train.loss"), logged_loss)

    summary = subprocess.run(
        [sys.executable, "-m", "torchmon", "summarize", *sorted(map(str, log_dir.glob("*.jsonl")))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert summary.returncode == 0, summary.stderr
    rows = [line.split() for line in summary.stdout.splitlines()]
    header = next(row for row in rows if "min_rank" in row)
    p50 = next(
        row
        for row in rows[rows.index(header) :]
        if row[:2] == ["train.step_time", "p50"] and len(row) == len(header)
    )
    assert p50[header.index("ranks")] == str(RANKS)
    assert {p50[header.index("min_rank")], p50[header.index("max_rank")]} <= {"0", "1"}
