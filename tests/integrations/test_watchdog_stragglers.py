"""The watchdog's straggler scores under real torchrun (4 ranks, gloo, CPU, on
127.0.0.1; docs/stragglers.md): rank 2's "compute" section takes 4x as long
as the others' (tests/straggler_rank.py). From the JSON-lines files the
ranks write: by the second report tick, rank 2's
``straggler.compute.relative`` is below 0.3 and every other rank's at least
0.9, and stays so; the whole-step time (``train.step_time``) scores every
rank alike, rank 2 included, because the fast ranks wait for it inside the
all-reduce. The process group is stopped by pid whatever happens."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from prometheus_server import free_port
from runs import CHILD_ENV, events, windows_of

import torchmon

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

RANKS = 4
SLOW_RANK = 2
INTERVAL = 2.0
SECONDS = 9.0
RANK_SCRIPT = Path(__file__).resolve().parents[1] / "straggler_rank.py"
TIMEOUT = 120.0  # a deadline for a hung job, not a speed check


def run_scenario(log_dir: Path, seconds: float = SECONDS, interval: float = INTERVAL) -> str:
    """Runs tests/straggler_rank.py on RANKS ranks; returns torchrun's output."""
    torchrun = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={RANKS}",
            "--master-addr=127.0.0.1",
            f"--master-port={free_port()}",
            str(RANK_SCRIPT),
            f"--log-dir={log_dir}",
            f"--seconds={seconds}",
            f"--interval={interval}",
            f"--slow-rank={SLOW_RANK}",
        ],
        cwd=log_dir.parent,
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
    return log


def scores_by_tick(evs: list[torchmon.Event], stat: str) -> dict[int, float]:
    """The VALUE of ``stat`` at each report tick (its event's wall-clock
    time, which follows the tick by the store read, floored to the interval)."""
    key = f"{stat}.value"
    return {
        math.floor(e.timestamp.timestamp() / INTERVAL): float(e.data[key])
        for e in evs
        if e.name == torchmon.STAT_EVENT and key in e.data
    }


def test_the_section_score_finds_the_slow_rank_the_step_time_does_not(tmp_path: Path) -> None:
    log_dir = tmp_path / "run"
    run_scenario(log_dir)
    by_rank = {r: events(log_dir / f"events-rank{r}.jsonl") for r in range(RANKS)}

    steps = {
        next(e.data["steps"] for e in evs if e.name == "straggler.done") for evs in by_rank.values()
    }
    assert len(steps) == 1, steps  # the all-reduce keeps the ranks in step

    relative: dict[int, dict[int, float]] = defaultdict(dict)
    for rank, evs in by_rank.items():
        for tick, score in scores_by_tick(evs, "straggler.compute.relative").items():
            relative[tick][rank] = score
    assert relative, "no straggler score recorded"
    first = min(relative)
    complete = sorted(t for t, ranks in relative.items() if len(ranks) == RANKS)
    # Seen within two report intervals of the first tick ...
    assert complete and complete[0] <= first + 1, dict(relative)
    # ... and on every tick where every rank scored.
    for tick in complete:
        scores = relative[tick]
        assert scores[SLOW_RANK] < 0.3, (tick, scores)
        for rank in set(range(RANKS)) - {SLOW_RANK}:
            assert scores[rank] >= 0.9, (tick, scores)

    # The whole step: fast ranks wait for rank 2 inside the all-reduce, so
    # every rank's step takes as long as the slow rank's (summarize's
    # score: the fastest rank's mean window p50 over this rank's).
    p50 = {
        rank: math.fsum(w["p50"] for w in ws) / len(ws)
        for rank, evs in by_rank.items()
        if (ws := windows_of(evs, "train.step_time"))
    }
    assert set(p50) == set(range(RANKS))
    fastest = min(p50.values())
    step_scores = {rank: fastest / value for rank, value in p50.items()}
    assert min(step_scores.values()) >= 0.9, step_scores

    # torchmon summarize over the four files: the same, per section.
    summary = subprocess.run(
        [sys.executable, "-m", "torchmon", "summarize",
         *(str(log_dir / f"events-rank{r}.jsonl") for r in range(RANKS))],
        capture_output=True, text=True, timeout=120, env=CHILD_ENV,
    )  # fmt: skip
    assert summary.returncode == 0, summary.stderr
    rows = [line.split() for line in summary.stdout.splitlines()]
    start = rows.index(["section", "rank", "p50", "score"])
    compute = {int(r[1]): float(r[3]) for r in rows[start + 1 :] if r[:1] == ["compute"]}
    assert compute[SLOW_RANK] < 0.3, summary.stdout
    assert min(s for r, s in compute.items() if r != SLOW_RANK) >= 0.9, summary.stdout
    steps_rows = [r for r in rows if r[:1] == ["train.step_time"] and len(r) == 4]
    assert min(float(r[3]) for r in steps_rows) >= 0.9, summary.stdout
    assert "whole-step score cannot see a straggler" in summary.stdout
