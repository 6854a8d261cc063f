"""``torchmon to-tensorboard`` with the core's reader of Stat lines
(crates/torchmon-core/src/tensorboard/convert.rs) against the Python reader
of every line (``to_tensorboard._NATIVE_READER = False``): the same scalars
and histograms read back by TensorBoard's EventAccumulator, the same records
in the event file, the same output and the same errors, over logs that mix
the lines the core is sure of with those it leaves to Python, and any mix
of such lines (hypothesis)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import struct
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchmon
from torchmon import Aggregation, JsonlEventHandler, Stat
from torchmon.cli import main, to_tensorboard
from torchmon.testing import ManualClock

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

STAT = torchmon.STAT_EVENT
P_AGGS = [Aggregation.MEAN, Aggregation.MAX, Aggregation.COUNT, Aggregation.P50, Aggregation.P99]


def stat_line(stamp: str, data: dict[str, Any], **extra: Any) -> str:
    return json.dumps({"name": STAT, "timestamp": stamp, "data": data, **extra})


def other_line(name: str, stamp: str, data: dict[str, Any]) -> str:
    return json.dumps({"name": name, "timestamp": stamp, "data": data})


def windows_of_stats(path: Path) -> None:
    """Real Stats' windows through the JSON-lines sink: stored
    distributions, NaN and infinite samples, a Stat re-created with other
    aggregations (its tags' window counts then differ)."""
    handler = JsonlEventHandler(path, distributions=True)
    handle = torchmon.register_event_handler(handler)
    try:
        with ManualClock(0) as clock:
            with_p = Stat("train.latency_ms", P_AGGS, timedelta(seconds=1))
            plain = Stat("train.loss", [Aggregation.MEAN, Aggregation.MIN], timedelta(seconds=1))
            for w in range(12):
                with_p.add(1.0 + w)
                with_p.add(w * 0.25)
                plain.add(0.5 / (w + 1))
                if w == 3:
                    plain.add(float("nan"))
                if w == 5:
                    with_p.add(float("inf"))
                    plain.add(float("-inf"))
                clock.advance(1000)
            for stat in (with_p, plain):
                stat._flush_window()
            again = Stat("train.loss", [Aggregation.MEAN, Aggregation.MAX], timedelta(seconds=1))
            again.add(2.0)
            again._flush_window()
    finally:
        torchmon.unregister_event_handler(handle)
        handler.close()


def mixed_log(path: Path) -> int:
    """Stat windows as the sink writes them, then hand-made lines: ones the
    core is sure of and ones it leaves to Python (an unusual timestamp, -0,
    a duplicate key, an integer beyond 64 bits in a float's place), each
    touching tags the other kind touched too, other events with and without
    the step field, blank lines and a last line without its newline.
    Returns the number of the first hand-made line."""
    windows_of_stats(path)
    first = path.read_bytes().count(b"\n") + 1
    naive = "2025-01-02T03:04:05"
    lines = [
        "",
        stat_line(naive + ".250000", {"train.loss.mean": 1.5, "train.loss.min": 1}),
        stat_line("2025-01-02 03:04:06", {"train.loss.mean": 2.5, "note": "text"}),
        stat_line(naive + "+02:00", {"train.loss.mean": -0.0, "flag": True}),
        stat_line(naive + ".000001-05:30", {"train.loss.mean": {"$float": "nan"}}),
        f'{{"name": "{STAT}", "timestamp": "{naive}", "data": {{"x.mean": 1, "x.mean": 2}}}}',
        stat_line(naive, {"train.loss.mean": 1e300, ".mean": 3, "x": 4, "y.p50": 5}),
        stat_line(naive, {"big.mean": 9223372036854775807.0}),
        stat_line(naive, {"only": "text"}),
        "   ",
        other_line("train.epoch", naive, {"epoch": 3, "loss": 0.5, "ok": True}),
        other_line("train.epoch", naive + "+00:00", {"loss": {"$float": "inf"}}),
        other_line("train.epoch", naive, {"epoch": 7, "loss": 0.25}),
        stat_line(naive + ".999999", {"train.loss.mean": {"$float": "-inf"}}),
    ]
    with path.open("a") as f:
        f.write("\n".join(lines[:-1]) + "\n" + lines[-1])
    return first


def convert(log: Path, logdir: Path, *args: str, native: bool) -> tuple[int, str, str]:
    """The command run in this process with the reader chosen: exit code,
    stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    saved = to_tensorboard._NATIVE_READER
    to_tensorboard._NATIVE_READER = native
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(["to-tensorboard", str(log), str(logdir), *args])
            except SystemExit as exc:
                code = int(exc.code or 0)
    finally:
        to_tensorboard._NATIVE_READER = saved
    return code, out.getvalue().replace(str(logdir), "LOGDIR"), err.getvalue()


def read_back(logdir: Path) -> dict[str, str]:
    """Every scalar and histogram EventAccumulator reads, as text (NaN
    equals NaN then)."""
    acc = event_accumulator.EventAccumulator(
        str(logdir),
        size_guidance={event_accumulator.SCALARS: 0, event_accumulator.HISTOGRAMS: 0},
    )
    acc.Reload()
    read = {
        f"scalar {tag}": repr([(e.wall_time, e.step, e.value) for e in acc.Scalars(tag)])
        for tag in acc.Tags()["scalars"]
    }
    for tag in acc.Tags()["histograms"]:
        read[f"histogram {tag}"] = repr(
            [(e.wall_time, e.step, e.histogram_value) for e in acc.Histograms(tag)]
        )
    return read


def records(logdir: Path) -> list[bytes]:
    """The records of the one event file, but its first (the file_version
    event, stamped with the time the file was made)."""
    (path,) = logdir.glob("*tfevents*")
    data = path.read_bytes()
    found, at = [], 0
    while at < len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        found.append(data[at + 12 : at + 12 + length])
        at += 12 + length + 4
    return found[1:]


def same_conversion(tmp_path: Path, log: Path, *args: str) -> dict[str, str]:
    native = convert(log, tmp_path / "native", *args, native=True)
    python = convert(log, tmp_path / "python", *args, native=False)
    assert native == python
    assert native[0] == 0, native
    assert records(tmp_path / "native") == records(tmp_path / "python")
    read = read_back(tmp_path / "native")
    assert read == read_back(tmp_path / "python")
    return read


@pytest.mark.parametrize(
    "args",
    [(), ("--layout", "grouped"), ("--step-field", "epoch"), ("--step-field", "nosuch")],
)
def test_the_core_reader_writes_what_the_python_reader_writes(tmp_path, args):
    log = tmp_path / "log.jsonl"
    mixed_log(log)
    read = same_conversion(tmp_path, log, *args)
    grouped = args == ("--layout", "grouped")
    loss = "scalar train.loss/mean" if grouped else "scalar train.loss.mean"
    histogram = f"histogram train.latency_ms{'/' if grouped else '.'}histogram"
    assert histogram in read
    assert "nan" in read[loss] and "inf" in read[loss]
    assert "scalar train.epoch/loss" in read


@pytest.fixture
def new_york() -> Iterator[None]:
    """The local time zone with a daylight-saving change, as TZ sets it."""
    saved = os.environ.get("TZ")
    os.environ["TZ"] = "America/New_York"
    time.tzset()
    try:
        if not time.daylight:
            pytest.skip("no zone data for America/New_York (tzdata)")
        yield
    finally:
        if saved is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = saved
        time.tzset()


def test_naive_wall_times_across_daylight_saving_changes(tmp_path, new_york):
    """The skipped hour, the repeated one (both folds) and its edges, read
    through the C library's local time by the core as Python reads them."""
    log = tmp_path / "log.jsonl"
    stamps = [
        ("2024-03-10T01:59:59.999999", 0),
        ("2024-03-10T02:30:00", 0),
        ("2024-03-10T03:00:00", 0),
        ("2024-11-03T00:59:59", 0),
        ("2024-11-03T01:30:00.500000", 0),
        ("2024-11-03T01:30:00.500000", 1),
        ("2024-11-03T02:00:00", 0),
        ("1969-12-31T23:59:59.000001", 0),
        ("0002-01-01T00:00:00", 0),
        ("9998-12-31T23:59:59", 0),
    ]
    lines = [
        stat_line(stamp, {f"t{i}.mean": float(i)}, **({"fold": 1} if fold else {}))
        for i, (stamp, fold) in enumerate(stamps)
    ]
    log.write_text("\n".join(lines) + "\n")
    read = same_conversion(tmp_path, log)
    assert len(read) == len(stamps)


@pytest.mark.parametrize(
    "bad",
    [
        "not json",
        stat_line(
            "2025-01-02T03:04:05",
            {"a.count": 1},
            distribution={"count": 5, "sum": 1.0, "min": 0.0, "max": 1.0},
        ),
        stat_line("2025-13-02T03:04:05", {"a.count": 1}),
    ],
)
def test_a_bad_line_after_core_read_ones_is_the_python_readers_error(tmp_path, bad):
    log = tmp_path / "log.jsonl"
    good = stat_line("2025-01-02T03:04:05", {"a.mean": 1.0})
    log.write_text(f"{good}\n{good}\n{bad}\n{good}\n")
    native = convert(log, tmp_path / "native", native=True)
    python = convert(log, tmp_path / "python", native=False)
    assert native[0] == 2
    assert native == (python[0], python[1], python[2].replace("python", "native"))
    assert f"{log}:3: " in native[2]
    assert not (tmp_path / "native").exists()


def test_the_core_leaves_python_only_the_lines_it_is_not_sure_of(tmp_path, monkeypatch):
    from torchmon.handlers.jsonl import JsonlReader

    relayed: list[int] = []
    line = JsonlReader._line

    def counted(self: Any, raw: bytes, lineno: int) -> Any:
        relayed.append(lineno)
        return line(self, raw, lineno)

    monkeypatch.setattr(JsonlReader, "_line", counted)
    log = tmp_path / "log.jsonl"
    first = mixed_log(log)
    assert convert(log, tmp_path / "tb", native=True)[0] == 0
    # An unusual timestamp, -0, a duplicate key, floats of 2**63 and more,
    # and the three other events; the blank lines are no one's.
    assert [n - first for n in relayed] == [2, 3, 5, 6, 7, 10, 11, 12]


def test_the_progress_counts_of_a_core_read_log(tmp_path):
    """The counts the command prints come from the core for its lines."""
    log = tmp_path / "log.jsonl"
    windows_of_stats(log)
    code, out, err = convert(log, tmp_path / "tb", native=True)
    assert code == 0
    events = sum(1 for _ in torchmon.read_jsonl(log))
    assert events > 20
    assert out.startswith("wrote ")
    assert "from other events" in out and ", 0 from other events" in out
    assert "NaN or infinite" in err


# --- any mix of lines ---------------------------------------------------------


KEYS = ["a.mean", "a.max", "a.p50", "b.count", "c", ".mean", "a/mean", "epoch"]


def _json_value(value: object) -> object:
    if isinstance(value, float) and value != value:
        return {"$float": "nan"}
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return {"$float": "inf" if value > 0 else "-inf"}
    return value


values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**63), 2**63 - 1),
    st.booleans(),
    st.sampled_from(["text", ""]),
)
stamps = st.tuples(
    st.datetimes(min_value=datetime(1960, 1, 1), max_value=datetime(2100, 12, 31)),
    st.sampled_from(["", "+00:00", "+05:30", "-08:00", " "]),
    st.sampled_from([0, 1]),
)


@st.composite
def lines(draw: st.DrawFn) -> str:
    moment, zone, fold = draw(stamps)
    stamp = moment.isoformat() + zone if zone != " " else moment.isoformat(" ")
    data = draw(st.dictionaries(st.sampled_from(KEYS), values, max_size=5))
    record: dict[str, Any] = {
        "name": draw(st.sampled_from([STAT, STAT, STAT, "train.epoch"])),
        "timestamp": stamp,
        "data": {key: _json_value(value) for key, value in data.items()},
    }
    if fold:
        record["fold"] = 1
    return json.dumps(record)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(lines(), min_size=1, max_size=30), st.sampled_from(["torch", "grouped"]))
def test_any_mix_of_lines_converts_alike(tmp_path_factory, log_lines, layout):
    tmp = tmp_path_factory.mktemp("mix")
    log = tmp / "log.jsonl"
    log.write_text("\n".join(log_lines) + "\n")
    native = convert(log, tmp / "native", "--layout", layout, "--step-field", "epoch", native=True)
    python = convert(log, tmp / "python", "--layout", layout, "--step-field", "epoch", native=False)
    assert native == python
    if native[0] == 0:
        assert records(tmp / "native") == records(tmp / "python")
