"""``torchmon summarize`` over many files, merging the stored distributions of
every window into quantiles (docs/cli.md)."""

from __future__ import annotations

import math
import random
import subprocess
import sys
from datetime import datetime, timedelta
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from dist_samples import from_samples, oracle_index

import torchmon
from torchmon.cli import main
from torchmon.handlers.jsonl import JsonlEventHandler

T0 = datetime(2025, 1, 2, 3, 4, 5)


def window_event(seconds: int, stat: str, samples: list[float]) -> Any:
    """A Stat window event carrying the distribution of ``samples``: an
    event-like object, as a Python-made torchmon.Event has none."""
    return SimpleNamespace(
        name=torchmon.STAT_EVENT,
        timestamp=T0 + timedelta(seconds=seconds),
        data={f"{stat}.count": float(len(samples))},
        distribution=from_samples(samples),
    )


def write_log(path: Path, events: list[Any]) -> None:
    with JsonlEventHandler(path, distributions=True) as handler:
        for event in events:
            handler(event)


def exact_quantile(q: str, samples: list[float]) -> float:
    ordered = sorted(x for x in samples if not math.isnan(x))
    return ordered[max(1, math.ceil(Fraction(q) * len(ordered))) - 1]


def quantile_table(out: str) -> dict[str, list[str]]:
    """The rows of the quantile table, by stat, after its header."""
    lines = out.splitlines()
    start = next(
        i for i, line in enumerate(lines) if line.split()[:3] == ["stat", "windows", "samples"]
    )
    assert lines[start].split() == ["stat", "windows", "samples", "p50", "p90", "p99", "p999"]
    rows = {}
    for line in lines[start + 1 :]:
        if not line:
            break
        rows[line.split()[0]] = line.split()[1:]
    return rows


def test_quantiles_merge_every_window_of_every_file(tmp_path: Path, capsys: Any) -> None:
    rng = random.Random(7)
    samples: dict[str, list[float]] = {"step.time": [], "loss": []}
    paths = []
    for rank in range(3):
        events = []
        for second in range(4):
            window = [rng.lognormvariate(-4.0, 1.5) for _ in range(250)]
            samples["step.time"] += window
            events.append(window_event(second, "step.time", window))
            losses = [rng.gauss(0.0, 1.0) for _ in range(50)] + [0.0, math.nan]
            samples["loss"] += losses
            events.append(window_event(second, "loss", losses))
        events.append(torchmon.Event(torchmon.STAT_EVENT, T0, {"plain.mean": float(rank)}))
        paths.append(tmp_path / f"events-rank{rank}.jsonl")
        write_log(paths[-1], events)
    assert main(["summarize", *map(str, paths)]) == 0
    out = capsys.readouterr().out
    rows = quantile_table(out)
    assert set(rows) == {"step.time", "loss"}  # "plain" stored no distribution
    for stat, every in samples.items():
        windows, count, *quantiles = rows[stat]
        assert (int(windows), int(count)) == (12, len(every))
        for q, shown in zip(("0.5", "0.9", "0.99", "0.999"), quantiles):
            exact = exact_quantile(q, every)
            value = float(shown)
            # the bucket's representative (0.55%), then printed with 6 digits
            assert abs(value - exact) <= (0.0055 + 1e-5) * abs(exact), (stat, q, value, exact)
    # The per-window table counts the windows of all the files too.
    stat_rows = [line.split()[:7] for line in out.splitlines()]  # without the trend
    assert ["step.time", "count", "12", "250", "250", "250", "250"] in stat_rows
    assert ["plain", "mean", "3", "2", "1", "0", "2"] in stat_rows


def test_merged_quantile_is_in_the_bucket_of_the_exact_sample(tmp_path: Path, capsys: Any) -> None:
    # Few samples, far apart: the printed p50 must be in the true sample's bucket.
    first, second = [1.0, 1000.0, 5.0], [3.0, 0.001, 70.0, 70.0]
    write_log(tmp_path / "a.jsonl", [window_event(0, "x", first)])
    write_log(tmp_path / "b.jsonl", [window_event(0, "x", second)])
    assert main(["summarize", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]) == 0
    windows, count, p50, p90, p99, p999 = quantile_table(capsys.readouterr().out)["x"]
    # sorted: 0.001, 1, 3, 5, 70, 70, 1000 -> rank 4 is 5.0; ranks 7 are the max.
    assert (windows, count) == ("2", "7")
    assert oracle_index(float(p50)) == oracle_index(5.0)
    assert p90 == p99 == p999 == "1000"


def test_without_stored_distributions_no_quantile_table(tmp_path: Path, capsys: Any) -> None:
    for name in ("a", "b"):
        with JsonlEventHandler(tmp_path / f"{name}.jsonl") as handler:
            handler(torchmon.Event(torchmon.STAT_EVENT, T0, {"x.sum": 2.0}))
    assert main(["summarize", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "p99" not in out
    assert ["x", "sum", "2", "2", "2", "2", "2", "\u2584\u2584"] in [
        line.split() for line in out.splitlines()
    ]


def test_many_empty_files_and_a_missing_one(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "a.jsonl").write_text("")
    (tmp_path / "b.jsonl").write_text("")
    assert main(["summarize", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]) == 0
    assert capsys.readouterr().out == "2 files: no events\n"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchmon",
            "summarize",
            str(tmp_path / "a.jsonl"),
            str(tmp_path / "nope.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2
    assert result.stderr == f"torchmon summarize: {tmp_path / 'nope.jsonl'}: no such file\n"


@pytest.mark.parametrize("strict", [False, True])
def test_unreadable_lines_counted_across_files(tmp_path: Path, capsys: Any, strict: bool) -> None:
    write_log(tmp_path / "a.jsonl", [window_event(0, "x", [1.0])])
    with (tmp_path / "a.jsonl").open("a") as f:
        f.write("{torn\n")
    write_log(tmp_path / "b.jsonl", [window_event(0, "x", [2.0])])
    args = [
        "summarize",
        *(["--strict"] if strict else []),
        str(tmp_path / "a.jsonl"),
        str(tmp_path / "b.jsonl"),
    ]
    code = main(args)
    captured = capsys.readouterr()
    if strict:
        assert code == 2 and f"{tmp_path / 'a.jsonl'}:2: not valid JSON" in captured.err
    else:
        assert code == 0 and "skipped 1 unreadable line" in captured.err
        assert quantile_table(captured.out)["x"][:2] == ["2", "2"]


def test_a_distribution_beyond_the_float_range_is_skipped_or_one_line_under_strict(
    tmp_path: Path,
) -> None:
    """A line whose distribution has a 400-digit int sum used to end
    summarize with an OverflowError traceback (docs/cli.md: skipped and
    counted, or exit 2 and one line with --strict)."""
    import json

    log = tmp_path / "huge.jsonl"
    write_log(log, [window_event(1, "lat", [1.0, 2.0]), window_event(2, "lat", [4.0])])
    first, second = log.read_text().splitlines()
    record = json.loads(second)
    record["distribution"]["sum"] = 10**400
    log.write_text(f"{first}\n{json.dumps(record)}\n")
    command = [sys.executable, "-m", "torchmon", "summarize"]
    skipped = subprocess.run([*command, str(log)], capture_output=True, text=True, timeout=60)
    assert skipped.returncode == 0, skipped.stderr
    assert skipped.stderr.startswith(
        f"torchmon summarize: skipped 1 unreadable line (the first: {log}:2: "
        "not a valid distribution: Distribution(sum): sum must be within the float range"
    )
    assert skipped.stderr.count("\n") == 1
    assert quantile_table(skipped.stdout)["lat"][:2] == ["1", "2"]
    strict = subprocess.run(
        [*command, "--strict", str(log)], capture_output=True, text=True, timeout=60
    )
    assert strict.returncode == 2
    assert strict.stderr.startswith(f"torchmon summarize: {log}:2: not a valid distribution: ")
    assert strict.stderr.count("\n") == 1
