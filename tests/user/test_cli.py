"""The torchmon command: demo, summarize, to-tensorboard, --version."""

from __future__ import annotations

import io
import math
import re
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

import torchmon
from torchmon.cli import main
from torchmon.handlers.jsonl import JsonlEventHandler, read_jsonl

EPOCHS, STEPS = 2, 700  # >= 0.8 ms each: over 1.1 s, so at least two 1-second windows
DEMO_STATS = (
    "train.loss",
    "train.sample_loss",
    "train.grad_norm",
    "train.throughput",
    "train.step_time_us",
)


def run_cli(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchmon", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def read_scalars(logdir: Path) -> dict[str, list[tuple[int, float, float]]]:
    """(step, wall_time, value) of every scalar, by tag, read by TensorBoard's own reader."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {
        tag: [(s.step, s.wall_time, s.value) for s in acc.Scalars(tag)]
        for tag in acc.Tags()["scalars"]
    }


def stat_series(events: list[torchmon.Event]) -> dict[str, list[tuple[float, float]]]:
    """(walltime, value) of every Stat event key, in file order."""
    series: dict[str, list[tuple[float, float]]] = {}
    for event in events:
        if event.name == torchmon.STAT_EVENT:
            for key, value in event.data.items():
                series.setdefault(key, []).append((event.timestamp.timestamp(), value))
    return series


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    pytest.importorskip("tensorboardX")
    logdir = tmp_path_factory.mktemp("cli") / "demo"
    result = run_cli(
        "demo", "--logdir", str(logdir), "--epochs", str(EPOCHS), "--steps", str(STEPS)
    )
    return result, logdir


@pytest.fixture(scope="module")
def demo_events(demo: tuple[subprocess.CompletedProcess[str], Path]) -> list[torchmon.Event]:
    result, logdir = demo
    assert result.returncode == 0, result.stderr
    return list(read_jsonl(str(logdir / "events.jsonl")))


# --- demo -------------------------------------------------------------------


def test_demo_exits_0_and_prints_epochs_summary_and_tensorboard_command(demo):
    result, logdir = demo
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"writing to {logdir}" in out
    for epoch in range(1, EPOCHS + 1):
        assert f"epoch {epoch}/{EPOCHS}  loss " in out
    for stat in DEMO_STATS:
        assert f"\n{stat} " in out  # a summary row
    assert f"tensorboard --logdir {logdir}" in out
    # stderr is not a terminal here: no progress bar.
    assert "[#" not in result.stderr
    assert "\r" not in result.stderr


def test_demo_shows_step_time_percentiles_and_memory_in_readable_units(demo):
    """What torchmon adds, where the demo's reader looks first: P50/P99 of
    the step time over the whole run and the memory as `237 MB`, not
    `2.36536e+08` (docs/cli.md, `torchmon demo`)."""
    result, logdir = demo
    assert result.returncode == 0, result.stderr
    out = result.stdout
    section = out[out.index("Beyond torch.monitor") :].split("\n\n")[0]
    step = re.search(r"step time +P50 ([0-9.]+) ms +P99 ([0-9.]+) ms +over (\d+) steps", section)
    assert step is not None, section
    p50, p99, steps = float(step[1]), float(step[2]), int(step[3])
    assert steps == EPOCHS * STEPS
    # Each step sleeps 0.8 ms (a few stall for 5.8 ms); the percentiles are
    # within 1% of true order statistics.
    assert 0.79 <= p50 <= p99
    memory = re.search(r"memory +process ([0-9.]+) (MB|GB)", section)
    assert memory is not None, section
    assert "e+" not in section
    # The same figure as the log's largest process.memory.usage.max.
    largest = max(
        e.data["process.memory.usage.max"]
        for e in read_jsonl(str(logdir / "events.jsonl"))
        if "process.memory.usage.max" in e.data
    )
    scale = 1e6 if memory[2] == "MB" else 1e9
    assert abs(float(memory[1]) * scale - largest) <= 0.01 * largest


def test_docs_cli_md_states_the_steps_the_default_demo_runs(tmp_path):
    """docs/cli.md's sample of the demo's closing lines gives the step count
    of `torchmon demo` run as it says, with no option (the timings and the
    memory differ per machine; the count does not)."""
    docs = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
    if not docs.is_file():
        pytest.skip("not run from a checkout: docs/ is not beside tests/")
    pattern = r"step time +P50 [0-9.]+ ms +P99 [0-9.]+ ms +over (\d+) steps"
    documented = re.findall(pattern, docs.read_text(encoding="utf-8"))
    assert documented, "docs/cli.md shows no 'over N steps' line"
    result = subprocess.run(
        [sys.executable, "-m", "torchmon", "demo"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    ran = re.findall(pattern, result.stdout)
    assert len(ran) == 1, result.stdout
    assert documented == ran
    epochs = re.findall(r"^epoch (\d+)/(\d+)  loss ", result.stdout, re.MULTILINE)
    assert int(ran[0]) == int(epochs[-1][1]) * 800  # --steps' documented default


@pytest.mark.parametrize(
    ("value", "shown"),
    [(3.56024e7, "35.6 MB"), (2.36536e8, "237 MB"), (2.3829e9, "2.38 GB"), (512.0, "512 B")],
)
def test_demo_bytes_are_shown_in_decimal_units(value: float, shown: str) -> None:
    from torchmon.cli.summarize import _readable_bytes

    assert _readable_bytes(value) == shown


def test_summarize_shows_memory_stats_in_decimal_units(tmp_path):
    """The table's memory rows read `35.6 MB`, not `3.56024e+07`; counts
    and other Stats keep plain numbers (docs/cli.md, `torchmon summarize`)."""
    log = tmp_path / "events.jsonl"
    handler = torchmon.JsonlEventHandler(str(log))
    handle = torchmon.register_event_handler(handler)
    try:
        for memory, loss in ((3.56024e7, 0.5), (3.61e7, 0.25)):
            data = {
                "process.memory.usage.max": memory,
                "process.memory.usage.count": 2048.0,
                "train.loss.mean": loss,
            }
            torchmon.log_event(torchmon.Event(torchmon.STAT_EVENT, datetime.now(), data))
    finally:
        torchmon.unregister_event_handler(handle)
        handler.close()
    result = run_cli("summarize", str(log))
    assert result.returncode == 0, result.stderr
    rows = {tuple(line.split()[:2]): line for line in result.stdout.splitlines() if line}
    memory_max = rows[("process.memory.usage", "max")]
    assert "36.1 MB" in memory_max and "35.6 MB" in memory_max, memory_max
    assert "e+07" not in result.stdout
    assert "2048" in rows[("process.memory.usage", "count")]
    assert "0.375" in rows[("train.loss", "mean")]


def test_demo_jsonl_holds_every_stat_window_and_the_epoch_events(demo_events):
    stat_events = [e for e in demo_events if e.name == torchmon.STAT_EVENT]
    epoch_events = [e for e in demo_events if e.name == "train.epoch_end"]
    assert len(stat_events) + len(epoch_events) == len(demo_events)
    keys = {key for e in stat_events for key in e.data}
    assert {
        "train.loss.mean",
        "train.loss.min",
        "train.loss.max",
        "train.loss.count",
        "train.step_time_us.count",
        "train.step_time_us.sum",
        "train.step_time_us.max",
        "train.sample_loss.mean",
        "train.grad_norm.max",
        "train.throughput.mean",
    } <= keys
    # Every sample is in some window: the last, partial windows were emitted
    # (the Stats and the step timer's counter) before the sinks closed.
    series = stat_series(demo_events)
    assert sum(v for _, v in series["train.loss.count"]) == EPOCHS * STEPS
    assert sum(v for _, v in series["train.step_time_us.count"]) == EPOCHS * STEPS
    # Each step sleeps at least 0.8 ms inside the step timer's guard.
    assert sum(v for _, v in series["train.step_time_us.sum"]) >= EPOCHS * STEPS * 800
    lows, means, highs = (
        [v for _, v in series[f"train.loss.{agg}"]] for agg in ("min", "mean", "max")
    )
    assert len(lows) == len(means) == len(highs) >= 2
    assert all(lo <= mean <= hi for lo, mean, hi in zip(lows, means, highs))

    assert [e.data["epoch"] for e in epoch_events] == list(range(1, EPOCHS + 1))
    for event in epoch_events:
        assert set(event.data) >= {"epoch", "loss", "accuracy", "steps", "seconds"}
        assert event.data["steps"] == STEPS
        assert 0.0 <= event.data["accuracy"] <= 1.0
    # The simulated loss decreases.
    assert epoch_events[-1].data["loss"] < epoch_events[0].data["loss"]


def test_demo_tensorboard_files_read_back(demo, demo_events):
    _, logdir = demo
    assert list(logdir.glob("events.out.tfevents.*"))
    scalars = read_scalars(logdir)
    for key, points in stat_series(demo_events).items():
        assert [v for _, _, v in scalars[key]] == pytest.approx([v for _, v in points], rel=1e-6)
        assert [w for _, w, _ in scalars[key]] == pytest.approx([w for w, _ in points], abs=1e-3)
    # The epoch events, with the epoch as the step.
    epoch_events = [e for e in demo_events if e.name == "train.epoch_end"]
    loss = scalars["train.epoch_end/loss"]
    assert [step for step, _, _ in loss] == [e.data["epoch"] for e in epoch_events]
    assert [v for _, _, v in loss] == pytest.approx([e.data["loss"] for e in epoch_events])


def test_demo_refuses_a_non_empty_logdir(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    assert main(["demo", "--logdir", str(tmp_path), "--epochs", "1", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "not empty" in err
    assert (tmp_path / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize("option", ["--epochs", "--steps"])
def test_demo_rejects_non_positive_counts(tmp_path, capsys, option):
    assert main(["demo", "--logdir", str(tmp_path / "d"), option, "0"]) == 2
    assert f"{option} must be at least 1" in capsys.readouterr().err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_demo_in_process_draws_a_progress_bar_on_a_terminal(tmp_path, monkeypatch, capsys):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    logdir = tmp_path / "tty"
    assert main(["demo", "--logdir", str(logdir), "--epochs", "2", "--steps", "40"]) == 0
    drawn = terminal.getvalue()
    # Drawn from the first step of each epoch on, erased before each epoch's line.
    assert drawn.startswith("\r[..............................]   1%  epoch 1/2  step 1/80  loss ")
    assert "epoch 2/2  step 41/80" in drawn
    assert re.search(r"\r +\r$", drawn)  # the bar is erased at the end
    out = capsys.readouterr().out
    assert "epoch 2/2" in out
    events = list(read_jsonl(str(logdir / "events.jsonl")))
    counts = stat_series(events)["train.loss.count"]
    assert sum(v for _, v in counts) == 80


# --- summarize ----------------------------------------------------------------


def write_log(path: Path, events: list[torchmon.Event]) -> None:
    handler = JsonlEventHandler(str(path))
    try:
        for event in events:
            handler(event)
    finally:
        handler.close()


T0 = datetime(2025, 1, 2, 3, 4, 5)


def stat_event(seconds: int, data: dict[str, float]) -> torchmon.Event:
    return torchmon.Event(torchmon.STAT_EVENT, T0 + timedelta(seconds=seconds), data)


def test_summarize_table_values(tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    write_log(
        log,
        [
            stat_event(1, {"a.b.mean": 1.0, "a.b.count": 2.0}),
            stat_event(1, {"other.sum": 10.0}),
            stat_event(2, {"a.b.mean": 4.0, "a.b.count": 4.0}),
            torchmon.Event("epoch", T0, {"epoch": 1, "loss": 0.5, "tag": "x"}),
            stat_event(3, {"a.b.mean": 2.5, "a.b.count": 6.0}),
        ],
    )
    assert main(["summarize", str(log)]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines]
    assert rows[0] == ["stat", "aggregation", "windows", "last", "mean", "min", "max", "trend"]
    # a.b: 3 windows; mean column values 1, 4, 2.5 -> last 2.5, mean 2.5, min 1, max 4;
    # the trend: 1 the lowest bar, 4 the highest, 2.5 halfway (the fifth of eight).
    assert ["a.b", "mean", "3", "2.5", "2.5", "1", "4", "\u2581\u2588\u2585"] in rows
    assert ["a.b", "count", "3", "6", "4", "2", "6", "\u2581\u2585\u2588"] in rows
    assert ["other", "sum", "1", "10", "10", "10", "10", "\u2584"] in rows
    # Aligned: text columns start, number columns end, where their headers do.
    table = lines[: lines.index("")]
    header = table[0]
    agg_start = header.index("aggregation")
    windows_end = header.index("windows") + len("windows")
    trend_start = header.index("trend")
    for line, row in zip(table[1:], rows[1:]):
        assert line[agg_start:].startswith(row[1])
        assert line[:windows_end].endswith(" " + row[2])
        assert line[trend_start:] == row[7]
    # The other events are counted, with their last data.
    assert any(line.split()[:2] == ["epoch", "1"] and "loss=0.5" in line for line in lines)


_BYTE_UNITS = {"B": 1.0, "kB": 1e3, "MB": 1e6, "GB": 1e9}


def _cells(line: str) -> list[str]:
    """A summarize row's cells: a value in bytes (`237 MB`) is one cell."""
    cells: list[str] = []
    for token in line.split():
        if token in _BYTE_UNITS and cells:
            cells[-1] = f"{cells[-1]} {token}"
        else:
            cells.append(token)
    return cells


def _shown_value(cell: str) -> float:
    number, _, unit = cell.partition(" ")
    return float(number) * _BYTE_UNITS[unit] if unit else float(number)


def test_summarize_on_the_demo_log_prints_every_stat(demo, demo_events):
    _, logdir = demo
    result = run_cli("summarize", str(logdir / "events.jsonl"))
    assert result.returncode == 0, result.stderr
    rows = [_cells(line) for line in result.stdout.splitlines()]
    series = stat_series(demo_events)
    for key, points in series.items():
        stat, _, agg = key.rpartition(".")
        row = next(r for r in rows if r[:2] == [stat, agg])
        windows = int(row[2])
        assert windows == len(points)
        # Memory is shown as `237 MB`: three significant digits.
        rel = 5e-3 if row[3].endswith("B") else 1e-5
        assert _shown_value(row[3]) == pytest.approx(points[-1][1], rel=rel)  # last
        assert _shown_value(row[5]) == pytest.approx(min(v for _, v in points), rel=rel)
        assert _shown_value(row[6]) == pytest.approx(max(v for _, v in points), rel=rel)
    assert any(r[:2] == ["train.epoch_end", str(EPOCHS)] for r in rows)


def test_summarize_strict_exits_2_at_a_malformed_line(tmp_path):
    log = tmp_path / "bad.jsonl"
    write_log(log, [stat_event(1, {"a.sum": 1.0})])
    with log.open("a") as f:
        f.write("{this is not json\n")
    result = run_cli("summarize", "--strict", str(log))
    assert result.returncode == 2
    assert result.stderr == f"torchmon summarize: {log}:2: not valid JSON: " + (
        "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)\n"
    )


def test_summarize_skips_unreadable_lines_and_says_how_many(tmp_path):
    """A torn line (a writer killed mid-line) and a line json cannot read do
    not hide the windows after them (docs/cli.md)."""
    log = tmp_path / "torn.jsonl"
    write_log(log, [stat_event(1, {"a.sum": 1.0})])
    with log.open("a") as f:
        f.write('{"name":"torch.monitor.Stat","timest\n' + "[" * 100_000 + "\n")
    write_log(log, [stat_event(2, {"a.sum": 2.0}), stat_event(3, {"a.sum": 4.0})])
    result = run_cli("summarize", str(log))
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()]
    assert ["a", "sum", "3", "4", "2.33333", "1", "4", "\u2581\u2583\u2588"] in rows
    assert result.stderr.startswith(
        f"torchmon summarize: skipped 2 unreadable lines (the first: {log}:2: not valid JSON: "
    )
    assert result.stderr.endswith("; --strict stops at it instead\n")
    assert result.stderr.count("\n") == 1
    # json's recursion limit is a one-line error too, not a traceback.
    (tmp_path / "nested.jsonl").write_text("[" * 100_000 + "\n")
    strict = run_cli("summarize", "--strict", str(tmp_path / "nested.jsonl"))
    assert strict.returncode == 2
    assert strict.stderr == (
        f"torchmon summarize: {tmp_path / 'nested.jsonl'}:1: not readable: JSON nested too deeply\n"
    )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("[" * 100_000, "not readable: JSON nested too deeply"),
        ('{"name":"x","timestamp":"2020-01-01T00:00:00","data":{"a":%s}}' % ("7" * 5000), "digits"),
    ],
)
def test_lines_beyond_json_limits_are_one_line_errors(tmp_path, line, message):
    """read_jsonl's RecursionError and int-digits ValueError used to escape
    as tracebacks (docs/cli.md: one line, exit code 2)."""
    log = tmp_path / "deep.jsonl"
    log.write_text(line + "\n")
    for args in (["summarize", "--strict", str(log)], ["to-tensorboard", str(log), "tb"]):
        result = run_cli(*args)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith(f"torchmon {args[0]}: {log}:1: "), result.stderr
        assert message in result.stderr
        assert result.stderr.count("\n") == 1, result.stderr


def test_summarize_series_with_infinities_and_huge_values(tmp_path, capsys):
    """Valid logs on which math.fsum raises: inf with -inf, and a sum past
    the float range."""
    log = tmp_path / "log.jsonl"
    write_log(
        log,
        [
            stat_event(1, {"x.max": math.inf, "y.sum": 1.5e308, "z.min": -math.inf}),
            stat_event(2, {"x.max": -math.inf, "y.sum": 1.7e308, "z.min": 1.0}),
            stat_event(3, {"x.max": 2.0, "y.sum": 1.6e308, "z.min": math.nan}),
        ],
    )
    assert main(["summarize", str(log)]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split()[:7] for line in lines]
    assert ["x", "max", "3", "2", "nan", "-inf", "inf"] in rows
    assert ["y", "sum", "3", "1.6e+308", "1.6e+308", "1.5e+308", "1.7e+308"] in rows
    assert ["z", "min", "3", "nan", "-inf", "-inf", "1"] in rows
    # The trend leaves non-finite windows blank and spans 1.5e308..1.7e308,
    # whose difference alone is past the float range.
    trends = {line.split()[0]: line[lines[0].index("trend") :] for line in lines[1:4]}
    assert trends == {"x": "  \u2584", "y": "\u2581\u2588\u2585", "z": " \u2584"}


def test_summarize_missing_file_exits_2(tmp_path, capsys):
    missing = tmp_path / "nope.jsonl"
    assert main(["summarize", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"{missing}: no such file" in err


def test_summarize_directory_exits_2(tmp_path, capsys):
    assert main(["summarize", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_summarize_empty_file(tmp_path, capsys):
    log = tmp_path / "empty.jsonl"
    log.write_text("")
    assert main(["summarize", str(log)]) == 0
    assert "no events" in capsys.readouterr().out


def test_a_file_with_content_but_no_event_is_not_a_log(tmp_path):
    """A CSV file and a TensorBoard event file used to exit 0 with "no
    events"; docs/cli.md promises exit 2 and one line for a malformed file.
    An empty log, or one whose only line is still being written, has no
    events yet: exit 0."""
    csv = tmp_path / "x.csv"
    csv.write_text("a,b\n1,2\n")
    binary = tmp_path / "events.out.tfevents.1"
    binary.write_bytes(b"\x18\x00\x00\x00\x00\x00\x00\x00\xa3\x7fK\x22\t\x00")
    for command, detail in (
        (["summarize", str(csv)], "no line holds an event (the 2 lines are unreadable; the first"),
        (["summarize", str(binary)], "it does not start with a JSON object"),
        (["to-tensorboard", str(binary), str(tmp_path / "tb")], "it does not start with a JSON"),
    ):
        path = command[1]
        result = run_cli(*command)
        assert result.returncode == 2, result
        assert result.stderr.startswith(
            f"torchmon {command[0]}: {path}: not a JSON-lines log: {detail}"
        ), result.stderr
        assert result.stderr.count("\n") == 1
        assert result.stdout == ""
    assert not (tmp_path / "tb").exists()
    being_written = tmp_path / "new.jsonl"
    being_written.write_text('{"name": "torch.monitor.Stat", "timest')
    result = run_cli("summarize", str(being_written))
    assert (result.returncode, result.stdout) == (0, f"{being_written}: no events\n")


def test_summarize_trend_of_many_windows_stays_short_and_follows_the_values(tmp_path, capsys):
    """The trend (docs/cli.md) of 1,000 windows is one sparkline of at most
    24 runs of consecutive windows; a rising series draws rising bars."""
    log = tmp_path / "log.jsonl"
    write_log(log, [stat_event(i, {"x.mean": float(i), "y.max": 5.0}) for i in range(1000)])
    assert main(["summarize", str(log)]) == 0
    lines = capsys.readouterr().out.splitlines()
    column = lines[0].index("trend")
    trends = {line.split()[0]: line[column:] for line in lines[1:3]}
    rising = trends["x"]
    assert 12 <= len(rising) <= 24
    assert rising[0] == "\u2581" and rising[-1] == "\u2588"
    assert list(rising) == sorted(rising)
    assert trends["y"] == "\u2584" * len(trends["y"])


# --- to-tensorboard -----------------------------------------------------------


def test_to_tensorboard_converts_the_demo_log(demo, demo_events, tmp_path):
    _, logdir = demo
    out_dir = tmp_path / "converted"
    result = run_cli("to-tensorboard", str(logdir / "events.jsonl"), str(out_dir))
    assert result.returncode == 0, result.stderr
    scalars = read_scalars(out_dir)
    series = stat_series(demo_events)
    for key, points in series.items():
        assert [v for _, _, v in scalars[key]] == pytest.approx([v for _, v in points], rel=1e-6)
        # walltime is the event's timestamp; the step numbers the tag's windows
        assert [w for _, w, _ in scalars[key]] == pytest.approx([w for w, _ in points], abs=1e-3)
        assert [step for step, _, _ in scalars[key]] == list(range(1, len(points) + 1))
    epoch_events = [e for e in demo_events if e.name == "train.epoch_end"]
    for field in ("loss", "accuracy", "epoch", "steps", "seconds"):
        got = scalars[f"train.epoch_end/{field}"]
        assert [v for _, _, v in got] == pytest.approx([e.data[field] for e in epoch_events])
        assert [step for step, _, _ in got] == list(range(EPOCHS))  # ordinal steps
    total = sum(len(points) for points in scalars.values())
    assert total == sum(len(p) for p in series.values()) + 5 * EPOCHS
    assert f"wrote {total} scalars to {out_dir}" in result.stdout


def test_to_tensorboard_of_the_demo_log_is_what_the_demo_wrote_live(demo, demo_events, tmp_path):
    """docs/cli.md: a converted log looks like one written live: the same tags,
    steps, values and wall times (the demo takes the epoch events' steps from
    their "epoch" field)."""
    _, logdir = demo
    out_dir = tmp_path / "converted"
    result = run_cli(
        "to-tensorboard", str(logdir / "events.jsonl"), str(out_dir), "--step-field", "epoch"
    )
    assert result.returncode == 0, result.stderr
    live, converted = read_scalars(logdir), read_scalars(out_dir)
    assert sorted(converted) == sorted(live)
    for tag, points in live.items():
        assert [s for s, _, _ in converted[tag]] == [s for s, _, _ in points], tag
        assert [v for _, _, v in converted[tag]] == pytest.approx([v for _, _, v in points])
        assert [w for _, w, _ in converted[tag]] == pytest.approx([w for _, w, _ in points])
    # every window its own step, in both
    windows = len(stat_series(demo_events)["train.loss.mean"])
    assert windows >= 2
    assert [s for s, _, _ in live["train.loss.mean"]] == list(range(1, windows + 1))


def one_line_error(result: subprocess.CompletedProcess[str], *parts: str) -> None:
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("torchmon to-tensorboard: ")
    for part in parts:
        assert part in result.stderr


def test_to_tensorboard_refuses_a_logdir_with_event_files_unless_append(tmp_path):
    """A second conversion into the same LOGDIR would show every point twice."""
    log = tmp_path / "log.jsonl"
    write_log(log, [stat_event(i, {"a.sum": float(i)}) for i in range(3)])
    out_dir = tmp_path / "tb"
    assert run_cli("to-tensorboard", str(log), str(out_dir)).returncode == 0
    files = sorted(out_dir.iterdir())
    assert len(files) == 1

    one_line_error(run_cli("to-tensorboard", str(log), str(out_dir)), str(out_dir), "--append")
    assert sorted(out_dir.iterdir()) == files  # nothing written
    assert [(s, v) for s, _, v in read_scalars(out_dir)["a.sum"]] == [(1, 0), (2, 1), (3, 2)]

    result = run_cli("to-tensorboard", str(log), str(out_dir), "--append")
    assert result.returncode == 0, result.stderr
    assert len(list(out_dir.iterdir())) == 2
    # Other files (a JSON-lines log, a run in a subdirectory) are no reason to refuse.
    assert main(["to-tensorboard", str(log), str(tmp_path / "tb" / "run1")]) == 0
    assert main(["to-tensorboard", str(log), str(tmp_path)]) == 0


def test_to_tensorboard_append_in_the_same_second_keeps_both_files(tmp_path, monkeypatch):
    """tensorboardX names an event file after the second and the host only: an
    --append conversion started in the second of the previous one must not
    overwrite it (docs/cli.md, --append writes beside the files)."""
    log = tmp_path / "log.jsonl"
    write_log(log, [stat_event(i, {"a.sum": float(i)}) for i in range(3)])
    out_dir = tmp_path / "tb"
    frozen = time.time()
    monkeypatch.setattr(time, "time", lambda: frozen)
    assert main(["to-tensorboard", str(log), str(out_dir)]) == 0
    assert main(["to-tensorboard", str(log), str(out_dir), "--append"]) == 0
    monkeypatch.undo()
    assert len(list(out_dir.iterdir())) == 2
    points = sorted((s, v) for s, _, v in read_scalars(out_dir)["a.sum"])
    assert points == [(1, 0), (1, 0), (2, 1), (2, 1), (3, 2), (3, 2)]


def test_to_tensorboard_logdir_that_is_a_file_or_cannot_be_created(tmp_path):
    log = tmp_path / "log.jsonl"
    write_log(log, [stat_event(0, {"a.sum": 1.0})])
    a_file = tmp_path / "a_file"
    a_file.write_text("mine")
    one_line_error(
        run_cli("to-tensorboard", str(log), str(a_file)), f"{a_file}: exists and is not a directory"
    )
    under_a_file = a_file / "tb"
    one_line_error(
        run_cli("to-tensorboard", str(log), str(under_a_file)), f"{under_a_file}: cannot create it"
    )
    assert a_file.read_text() == "mine"


def test_to_tensorboard_grouped_layout(tmp_path, capsys):
    pytest.importorskip("tensorboardX")
    log = tmp_path / "log.jsonl"
    write_log(log, [stat_event(i, {"a.sum": float(i), "a.max": 2.0 * i}) for i in range(2)])
    out_dir = tmp_path / "tb"
    assert main(["to-tensorboard", str(log), str(out_dir), "--layout", "grouped"]) == 0
    scalars = read_scalars(out_dir)
    assert {tag: [(s, v) for s, _, v in pts] for tag, pts in scalars.items()} == {
        "a/sum": [(1, 0.0), (2, 1.0)],
        "a/max": [(1, 0.0), (2, 2.0)],
    }


def test_to_tensorboard_step_field(tmp_path, capsys):
    pytest.importorskip("tensorboardX")
    log = tmp_path / "log.jsonl"
    write_log(
        log,
        [
            torchmon.Event("val", T0, {"epoch": 5, "acc": 0.5, "name": "x", "ok": True}),
            torchmon.Event("val", T0 + timedelta(seconds=1), {"epoch": 7, "acc": 0.75}),
        ],
    )
    out_dir = tmp_path / "tb"
    assert main(["to-tensorboard", str(log), str(out_dir), "--step-field", "epoch"]) == 0
    # str and bool fields are skipped, and the step field is the step, not a scalar.
    assert "wrote 2 scalars" in capsys.readouterr().out
    scalars = read_scalars(out_dir)
    assert sorted(scalars) == ["val/acc"]
    assert [(step, value) for step, _, value in scalars["val/acc"]] == [(5, 0.5), (7, 0.75)]
    assert [w for _, w, _ in scalars["val/acc"]] == pytest.approx(
        [T0.timestamp(), T0.timestamp() + 1], abs=1e-3
    )


def test_to_tensorboard_malformed_file_exits_2(tmp_path, capsys):
    log = tmp_path / "bad.jsonl"
    log.write_text("[1, 2, 3]\n")
    out_dir = tmp_path / "tb"
    assert main(["to-tensorboard", str(log), str(out_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"torchmon to-tensorboard: {log}:1: ")
    assert not out_dir.exists()  # nothing is written from a log that cannot be read


def test_to_tensorboard_a_bad_line_after_good_ones_leaves_logdir_as_it_was(tmp_path):
    """to-tensorboard writes as it reads (docs/cli.md); a malformed line
    found after scalars were written removes what this run wrote."""
    pytest.importorskip("tensorboardX")
    log = tmp_path / "bad.jsonl"
    write_log(log, [stat_event(i, {"a.sum": float(i)}) for i in range(200)])
    with log.open("a") as f:
        f.write("{torn\n")
    new_dir = tmp_path / "new" / "tb"
    result = run_cli("to-tensorboard", str(log), str(new_dir))
    one_line_error(result, f"torchmon to-tensorboard: {log}:201: not valid JSON")
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "events.out.tfevents.earlier").write_bytes(b"earlier run")
    result = run_cli("to-tensorboard", str(log), str(kept), "--append")
    assert result.returncode == 2
    assert sorted(p.name for p in kept.iterdir()) == ["events.out.tfevents.earlier"]


def test_to_tensorboard_step_field_that_no_event_has_warns(tmp_path):
    pytest.importorskip("tensorboardX")
    log = tmp_path / "log.jsonl"
    write_log(log, [torchmon.Event("val", T0, {"epoch": 5, "acc": 0.5})])
    result = run_cli("to-tensorboard", str(log), str(tmp_path / "tb"), "--step-field", "epoch")
    assert (result.returncode, result.stderr) == (0, "")
    result = run_cli("to-tensorboard", str(log), str(tmp_path / "tb2"), "--step-field", "nosuch")
    assert result.returncode == 0
    assert result.stderr == (
        "torchmon to-tensorboard: warning: no event has the field 'nosuch' (--step-field), "
        "so other events' steps are their ordinals (0, 1, 2, ...)\n"
    )


def test_to_tensorboard_draws_progress_on_a_terminal_only(tmp_path, monkeypatch, capsys):
    pytest.importorskip("tensorboardX")
    log = tmp_path / "log.jsonl"
    write_log(log, [stat_event(i, {"a.sum": float(i)}) for i in range(300)])
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["to-tensorboard", str(log), str(tmp_path / "tty")]) == 0
    drawn = terminal.getvalue()
    assert drawn.startswith("\r[")
    assert "1 events  1 scalars" in drawn  # the first line's update, drawn at once
    assert re.search(r"\r +\r$", drawn)  # erased before the result line
    assert "wrote 300 scalars" in capsys.readouterr().out
    piped = run_cli("to-tensorboard", str(log), str(tmp_path / "pipe"))
    assert (piped.returncode, piped.stderr) == (0, "")


# --- the rest -----------------------------------------------------------------


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"torchmon {torchmon.__version__}"
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"torchmon {torchmon.__version__}"


def test_no_command_prints_usage_and_exits_2(capsys):
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "usage: torchmon" in err
    for command in ("demo", "summarize", "to-tensorboard"):
        assert command in err


def test_unknown_command_exits_2(capsys):
    assert main(["frobnicate"]) == 2
    assert "invalid choice" in capsys.readouterr().err


def run_without_tensorboardx(*args: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys\n"
        "sys.modules['tensorboardX'] = None  # makes `import tensorboardX` fail\n"
        "from torchmon.cli import main\n"
        f"sys.exit(main({list(args)!r}))\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_demo_without_tensorboardx_writes_tensorboard_files_too(tmp_path):
    """torchmon writes the event files itself (TensorboardEventHandler.logdir):
    tensorboardX is not needed."""
    logdir = tmp_path / "no-tbx"
    result = run_without_tensorboardx(
        "demo", "--logdir", str(logdir), "--epochs", "1", "--steps", "20"
    )
    assert result.returncode == 0, result.stderr
    assert "no TensorBoard output" not in result.stderr
    names = sorted(p.name for p in logdir.iterdir())
    assert names[0] == "events.jsonl" and names[1].startswith("events.out.tfevents.")
    assert len(names) == 2
    events = list(read_jsonl(str(logdir / "events.jsonl")))
    series = stat_series(events)
    assert sum(v for _, v in series["train.loss.count"]) == 20
    scalars = read_scalars(logdir)
    assert [v for _, _, v in scalars["train.loss.count"]] == [
        v for _, v in series["train.loss.count"]
    ]


def test_to_tensorboard_without_tensorboardx_converts(tmp_path):
    log = tmp_path / "log.jsonl"
    write_log(log, [stat_event(1, {"a.sum": 1.5}), stat_event(2, {"a.sum": 2.5})])
    result = run_without_tensorboardx("to-tensorboard", str(log), str(tmp_path / "tb"))
    assert result.returncode == 0, result.stderr
    assert "wrote 2 scalars" in result.stdout
    assert [(s, v) for s, _, v in read_scalars(tmp_path / "tb")["a.sum"]] == [(1, 1.5), (2, 2.5)]
