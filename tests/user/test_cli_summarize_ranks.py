"""``torchmon summarize events-rank*.jsonl`` across ranks: totals, and the
min and max of every aggregation with the rank that held them (docs/cli.md)."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from fractions import Fraction
from pathlib import Path

import torchmon
from torchmon.handlers.jsonl import JsonlEventHandler
from torchmon.testing import ManualClock

AGGREGATIONS = [
    torchmon.COUNT,
    torchmon.SUM,
    torchmon.MIN,
    torchmon.MAX,
    torchmon.P50,
    torchmon.P99,
]


def write_rank(path: Path, windows: list[list[float]]) -> None:
    """Real Stat windows of ``windows``' samples, logged to ``path`` with
    their distributions."""
    handler = JsonlEventHandler(path, distributions=True)
    handle = torchmon.register_event_handler(handler)
    try:
        with ManualClock() as clock:
            stat = torchmon.Stat("train.step_time", AGGREGATIONS, timedelta(seconds=1))
            for samples in windows:
                stat.add_many(samples)
                clock.advance(1000)
            # Closes the last window; this sample's own window is never logged,
            # as the handler is gone before it could close.
            stat.add(1.0)
    finally:
        torchmon.unregister_event_handler(handle)
        handler.close()
    del stat


def summarize(cwd: Path, *files: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(
        [sys.executable, "-m", "torchmon", "summarize", *files],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def table(out: str, header: list[str]) -> list[list[str]]:
    """The rows of the table whose header is ``header``."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split() == header)
    rows = []
    for line in lines[start + 1 :]:
        if not line:
            break
        rows.append(line.split())
    return rows


T0 = datetime(2025, 1, 2, 3, 4, 5)
RANK_HEADER = ["stat", "aggregation", "ranks", "total", "min", "min_rank", "max", "max_rank"]


def test_rank_files_merge_with_the_straggler_view(tmp_path: Path) -> None:
    rng = random.Random(17)
    # Multiples of 1/1024 s: every sum is exact in floating point.
    samples: dict[int, list[list[float]]] = {
        rank: [[rng.randint(8, 40) / 1024 for _ in range(150)] for _ in range(3)]
        for rank in range(4)
    }
    samples[2][1][7] = 900 / 1024  # rank 2's straggler step: the max
    samples[1][2][3] = 1 / 1024  # rank 1's quickest step: the min
    for rank, windows in samples.items():
        write_rank(tmp_path / f"events-rank{rank}.jsonl", windows)
    every = [x for windows in samples.values() for window in windows for x in window]

    files = sorted(p.name for p in tmp_path.glob("events-rank*.jsonl"))
    result = summarize(tmp_path, *files)
    assert (result.returncode, result.stderr) == (0, "")
    rows = {row[1]: row for row in table(result.stdout, RANK_HEADER)}
    # Every window counts 150 samples; on a tie the first rank given holds it.
    total = str(len(every))
    assert rows["count"] == ["train.step_time", "count", "4", total, "150", "0", "150", "0"]
    assert rows["sum"][2:4] == ["4", f"{math.fsum(every):.6g}"]
    window_sums = {
        (rank, i): math.fsum(w) for rank, windows in samples.items() for i, w in enumerate(windows)
    }
    lowest = min(window_sums, key=lambda k: (window_sums[k], k))
    highest = max(window_sums, key=lambda k: (window_sums[k], -k[0]))
    assert rows["sum"][4:] == [
        f"{window_sums[lowest]:.6g}",
        str(lowest[0]),
        f"{window_sums[highest]:.6g}",
        "2",
    ]
    assert highest[0] == 2

    def extreme(pick: Callable[..., float], of: Callable[..., float]) -> list[str]:
        """``pick`` over the windows of each window's ``of``, and its rank
        (the first rank given on a tie)."""
        value = pick(of(w) for windows in samples.values() for w in windows)
        rank = next(r for r, windows in samples.items() if value in map(of, windows))
        return [f"{value:.6g}", str(rank)]

    assert rows["max"][3:] == ["-", *extreme(min, max), f"{900 / 1024:.6g}", "2"]
    assert rows["min"][3:] == ["-", f"{1 / 1024:.6g}", "1", *extreme(max, min)]

    quantiles = {
        row[0]: row[1:]
        for row in table(result.stdout, ["stat", "windows", "samples", "p50", "p90", "p99", "p999"])
    }
    n_windows, count, *shown = quantiles["train.step_time"]
    assert (n_windows, count) == ("12", str(len(every)))
    ordered = sorted(every)
    for q, value in zip(("0.5", "0.9", "0.99", "0.999"), shown):
        exact = ordered[math.ceil(Fraction(q) * len(ordered)) - 1]
        assert abs(float(value) - exact) <= 0.01 * exact, (q, value, exact)


def test_one_file_has_no_rank_table(tmp_path: Path) -> None:
    write_rank(tmp_path / "events-rank0.jsonl", [[0.5, 0.25]])
    result = summarize(tmp_path, "events-rank0.jsonl")
    assert result.returncode == 0
    assert "max_rank" not in result.stdout


def test_names_without_ranks_show_the_paths(tmp_path: Path) -> None:
    write_rank(tmp_path / "a.jsonl", [[1.0, 3.0]])
    write_rank(tmp_path / "events-rank4.jsonl", [[0.5, 9.0]])
    result = summarize(tmp_path, "a.jsonl", "events-rank4.jsonl")
    assert result.returncode == 0
    rows = {row[1]: row for row in table(result.stdout, RANK_HEADER)}
    assert rows["min"][4:] == ["0.5", "events-rank4.jsonl", "1", "a.jsonl"]
    assert rows["max"][4:] == ["3", "a.jsonl", "9", "events-rank4.jsonl"]
    assert rows["count"][3] == "4"


def test_a_missing_rank_file_is_one_line(tmp_path: Path) -> None:
    write_rank(tmp_path / "events-rank0.jsonl", [[1.0]])
    result = summarize(tmp_path, "events-rank0.jsonl", "events-rank1.jsonl")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == "torchmon summarize: events-rank1.jsonl: no such file\n"


STRAGGLER_HEADER = ["stat", "rank", "p50", "score"]


def test_straggler_score_is_the_fastest_ranks_p50_over_each_ranks(tmp_path: Path) -> None:
    """docs/cli.md, "straggler score": from the rank's merged distribution
    when stored (one value per rank here, so its p50 is that value exactly),
    else from the mean of the rank's windows' p50."""
    for rank, step in ((0, 0.010), (1, 0.025), (2, 0.0125)):
        write_rank(tmp_path / f"events-rank{rank}.jsonl", [[step] * 5, [step] * 3])
    result = summarize(tmp_path, *(f"events-rank{rank}.jsonl" for rank in range(3)))
    assert (result.returncode, result.stderr) == (0, "")
    assert table(result.stdout, STRAGGLER_HEADER) == [
        ["train.step_time", "0", "0.01", "1.000"],
        ["train.step_time", "1", "0.025", "0.400"],
        ["train.step_time", "2", "0.0125", "0.800"],
    ]

    for rank, p50s in ((0, [1.0, 3.0]), (1, [4.0])):
        with JsonlEventHandler(tmp_path / f"p50-rank{rank}.jsonl") as handler:
            for p50 in p50s:
                handler(torchmon.Event(torchmon.STAT_EVENT, T0, {"lat.p50": p50, "lat.max": 9.0}))
    result = summarize(tmp_path, "p50-rank0.jsonl", "p50-rank1.jsonl")
    assert (result.returncode, result.stderr) == (0, "")
    assert table(result.stdout, STRAGGLER_HEADER) == [
        ["lat", "0", "2", "1.000"],
        ["lat", "1", "4", "0.500"],
    ]


def test_no_straggler_table_without_a_median(tmp_path: Path) -> None:
    for rank in range(2):
        with JsonlEventHandler(tmp_path / f"events-rank{rank}.jsonl") as handler:
            handler(torchmon.Event(torchmon.STAT_EVENT, T0, {"x.max": 1.0}))
    result = summarize(tmp_path, "events-rank0.jsonl", "events-rank1.jsonl")
    assert result.returncode == 0
    assert "score" not in result.stdout
