"""JsonlEventHandler and read_jsonl: the line format, exact round trips (types,
NaN/inf/-0.0, timestamps), append mode, per-event flushing, rotation, threads,
close, malformed input."""

from __future__ import annotations

import gc
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
from datetime import datetime, timedelta, timezone
from itertools import chain
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import registered

import torchmon
from torchmon import Aggregation, Event, JsonlEventHandler, Stat, read_jsonl
from torchmon.handlers.jsonl import FLOAT_TAG
from torchmon.testing import ManualClock

INT64 = (-(2**63), 2**63 - 1)


def tagged(v: object) -> tuple[str, str]:
    """Type and repr: tells int from float from bool, -0.0 from 0.0; NaN == NaN."""
    return (type(v).__name__, repr(v))


def fingerprint(e: Event) -> tuple[object, ...]:
    ts = e.timestamp
    return (
        e.name,
        ts,
        ts.utcoffset(),
        ts.fold if ts.utcoffset() is None else 0,
        {k: tagged(v) for k, v in e.data.items()},
    )


def strict_json(line: str) -> Any:
    """json.loads that rejects the NaN/Infinity extension: RFC 8259 only."""

    def reject(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(line, parse_constant=reject)


def lines(path: Path) -> list[str]:
    return path.read_bytes().decode("utf-8").split("\n")[:-1]


# --- end to end ---------------------------------------------------------------


def test_stats_and_events_round_trip_end_to_end(tmp_path: Path) -> None:
    """Real Stat windows (rolled by the test clock) and logged events go through
    the registry to the file; read_jsonl gives back equal events."""
    path = tmp_path / "events.jsonl"
    seen: list[Event] = []
    with JsonlEventHandler(path) as sink:
        with registered(sink), registered(seen.append), ManualClock(0) as clock:
            s = Stat("train.loss", [Aggregation.MEAN, Aggregation.MAX, Aggregation.COUNT], 1.0)
            for v in (1.0, 2.0, 4.5):
                s.add(v)
            clock.advance(1000)
            s.add(math.nan)  # closes window 1; window 2 holds a NaN
            torchmon.log_event(
                Event(
                    "train.epoch_end",
                    datetime(2024, 5, 6, 7, 8, 9, 123456),
                    {"epoch": 1, "loss": 2.5, "best": True, "note": "ok", "big": INT64[1]},
                )
            )
            clock.advance(1000)
            s.add(-0.0)  # closes window 2
            del s  # flushes window 3
            gc.collect()
    got = list(read_jsonl(path))
    assert [fingerprint(e) for e in got] == [fingerprint(e) for e in seen]
    assert [e.name for e in got] == [torchmon.STAT_EVENT, "train.epoch_end"] + [
        torchmon.STAT_EVENT
    ] * 2
    assert got[0].data == {"train.loss.mean": 2.5, "train.loss.max": 4.5, "train.loss.count": 3.0}
    assert math.isnan(got[2].data["train.loss.mean"])
    assert tagged(got[3].data["train.loss.max"]) == ("float", "-0.0")
    assert got[1].data["epoch"] == 1 and type(got[1].data["epoch"]) is int
    assert got[1].data["best"] is True
    assert got[1].data["big"] == INT64[1]
    assert got[1].timestamp == datetime(2024, 5, 6, 7, 8, 9, 123456)
    # Stat events carry naive local time, and come back naive
    assert got[0].timestamp.tzinfo is None
    assert abs((got[0].timestamp - datetime.now()).total_seconds()) < 60


def test_line_format(tmp_path: Path) -> None:
    """One RFC 8259 object per line: name, timestamp (ISO 8601), data; floats
    keep a fraction or exponent; NaN/inf as {"$float": ...}."""
    path = tmp_path / "e.jsonl"
    data = {
        "i": 3,
        "f": 3.0,
        "tiny": 5e-324,
        "huge": 1e300,
        "negzero": -0.0,
        "b": False,
        "s": "é\u2028\x00\n",
        "nan": math.nan,
        "inf": math.inf,
        "ninf": -math.inf,
    }
    with JsonlEventHandler(str(path)) as sink:
        sink(Event("my.event", datetime(2020, 1, 2, 3, 4, 5), data))
        sink(Event("aware", datetime(2020, 1, 2, 3, 4, 5, 6, timezone(timedelta(hours=-3))), {}))
    raw = path.read_bytes()
    assert raw.count(b"\n") == 2 and raw.endswith(b"\n")
    first, second = lines(path)
    assert len("x\n".join([first, second]).splitlines()) == 2  # no other line breaks
    assert first == (
        '{"name":"my.event","timestamp":"2020-01-02T03:04:05","data":{"i":3,"f":3.0,'
        '"tiny":5e-324,"huge":1e+300,"negzero":-0.0,"b":false,"s":"é\\u2028\\u0000\\n",'
        '"nan":{"$float":"nan"},"inf":{"$float":"inf"},"ninf":{"$float":"-inf"}}}'
    )
    assert strict_json(second) == {
        "name": "aware",
        "timestamp": "2020-01-02T03:04:05.000006-03:00",
        "data": {},
    }
    assert strict_json(first)["data"]["nan"] == {FLOAT_TAG: "nan"}


def test_timestamps_round_trip(tmp_path: Path) -> None:
    zoneinfo = pytest.importorskip("zoneinfo")
    try:
        berlin = zoneinfo.ZoneInfo("Europe/Berlin")
    except zoneinfo.ZoneInfoNotFoundError:
        pytest.skip("no time zone database")
    stamps = [
        datetime(2020, 1, 1),
        datetime(1, 1, 1),
        datetime(9999, 12, 31, 23, 59, 59, 999999),
        datetime(2021, 10, 31, 2, 30, fold=1),  # naive, second occurrence of a repeated hour
        datetime(2020, 6, 1, 12, tzinfo=timezone.utc),
        datetime(2020, 6, 1, 12, tzinfo=timezone(timedelta(hours=5, minutes=30))),
        datetime(2020, 6, 1, 12, tzinfo=timezone(-timedelta(hours=23, minutes=59, seconds=59))),
        # under a second: CPython's fromisoformat alone reads these as UTC
        datetime(2000, 1, 1, tzinfo=timezone(timedelta(microseconds=1))),
        datetime(2000, 1, 1, tzinfo=timezone(-timedelta(microseconds=999999))),
        datetime(2021, 10, 31, 2, 30, fold=1, tzinfo=berlin),  # CET, +01:00
        datetime(2021, 10, 31, 2, 30, fold=0, tzinfo=berlin),  # CEST, +02:00
    ]
    path = tmp_path / "ts.jsonl"
    with JsonlEventHandler(path) as sink:
        for ts in stamps:
            sink(Event("t", ts, {}))
    got = [e.timestamp for e in read_jsonl(path)]
    assert got[:9] == stamps[:9]
    # A ZoneInfo time comes back with its fixed offset: the same instant and
    # offset, but Python never finds a time in a zone's repeated hour equal to
    # one in another zone (PEP 495), so the instants are compared.
    assert [type(g.tzinfo) for g in got[9:]] == [timezone, timezone]
    assert [g.utcoffset() for g in got] == [s.utcoffset() for s in stamps]
    assert [g.tzinfo is None for g in got] == [s.tzinfo is None for s in stamps]
    assert got[3].fold == 1 and got[0].fold == 0
    assert [g.timestamp() for g in got[4:]] == [s.timestamp() for s in stamps[4:]]
    assert '"fold":1' in lines(path)[3] and "fold" not in lines(path)[9]


def test_append_mode_keeps_earlier_lines(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    ts = datetime(2020, 1, 1)
    with JsonlEventHandler(path) as sink:
        sink(Event("first", ts, {"n": 1}))
    with JsonlEventHandler(path) as sink:
        sink(Event("second", ts, {"n": 2}))
    assert [(e.name, e.data) for e in read_jsonl(path)] == [
        ("first", {"n": 1}),
        ("second", {"n": 2}),
    ]


@pytest.mark.skipif(not hasattr(os, "O_NOFOLLOW"), reason="no O_NOFOLLOW here")
@pytest.mark.parametrize("dangling", [False, True])
def test_a_symlink_planted_at_the_path_is_refused_and_not_written_through(
    tmp_path: Path, dangling: bool
) -> None:
    """In a shared directory another user may plant a link at the name a job
    will append to; the handler refuses it, naming the path, and leaves its
    target as it was (docs/sinks.md, "Symbolic links")."""
    victim = tmp_path / "victim"
    if not dangling:
        victim.write_bytes(b"precious\n")
    link = tmp_path / "shared" / "events.jsonl"
    link.parent.mkdir()
    link.symlink_to(victim)
    with pytest.raises(OSError) as info:
        JsonlEventHandler(link)
    assert info.value.filename == str(link)
    assert "symbolic link" in str(info.value) and str(link) in str(info.value)
    if dangling:
        assert not victim.exists()
    else:
        assert victim.read_bytes() == b"precious\n"
    # The same through for_rank, and a link to a directory above still works.
    with pytest.raises(OSError, match="symbolic link"):
        JsonlEventHandler.for_rank(link.parent, "events.jsonl")
    (tmp_path / "real").mkdir()
    (tmp_path / "via").symlink_to(tmp_path / "real")
    with JsonlEventHandler(tmp_path / "via" / "e.jsonl") as handler:
        handler(Event("e", datetime(2024, 1, 1), {"x": 1}))
    assert [e.data for e in read_jsonl(tmp_path / "real" / "e.jsonl")] == [{"x": 1}]


def test_each_event_is_flushed_for_another_process(tmp_path: Path) -> None:
    """While the handler is open, another process reads every line written so far."""
    path = tmp_path / "e.jsonl"
    reader = (
        "import sys, torchmon\nprint([e.data['i'] for e in torchmon.read_jsonl(sys.argv[1])])\n"
    )
    with JsonlEventHandler(path) as sink, registered(sink):
        for i in range(3):
            torchmon.log_event(Event("tick", datetime.now(), {"i": i}))
        out = subprocess.run(
            [sys.executable, "-c", reader, str(path)],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
        assert out.strip() == "[0, 1, 2]"
        # and in this process through an independent file object
        torchmon.log_event(Event("tick", datetime.now(), {"i": 3}))
        assert [e.data["i"] for e in read_jsonl(path)] == [0, 1, 2, 3]


# --- rotation -----------------------------------------------------------------


def numbered(i: int) -> Event:
    return Event("n", datetime(2020, 1, 1), {"i": i, "pad": "x" * (i % 7)})


def test_rotation(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    max_bytes = 300
    with JsonlEventHandler(path, max_bytes=max_bytes, backup_count=2) as sink, registered(sink):
        for i in range(60):
            torchmon.log_event(numbered(i))
    files = [Path(f"{path}.2"), Path(f"{path}.1"), path]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.jsonl", "e.jsonl.1", "e.jsonl.2"]
    for f in files:
        assert 0 < f.stat().st_size <= max_bytes
        # no room was left for the next line in a rotated file
    kept = [e.data["i"] for e in chain.from_iterable(read_jsonl(f) for f in files)]
    # the newest events, in order, none missing; the oldest ones were dropped
    assert kept == list(range(60 - len(kept), 60))
    assert 60 - len(kept) > 0
    for older, newer in zip(files, files[1:]):
        size = older.stat().st_size
        next_line = len(lines(newer)[0].encode()) + 1
        assert size + next_line > max_bytes


def test_rotation_continues_an_existing_file(tmp_path: Path) -> None:
    """The size counts what the file held when the handler opened it."""
    path = tmp_path / "e.jsonl"
    with JsonlEventHandler(path) as sink:
        for i in range(5):
            sink(numbered(i))
    size = path.stat().st_size
    with JsonlEventHandler(path, max_bytes=size + 10, backup_count=1) as sink:
        sink(numbered(5))
    assert [e.data["i"] for e in read_jsonl(f"{path}.1")] == [0, 1, 2, 3, 4]
    assert [e.data["i"] for e in read_jsonl(path)] == [5]


def test_rotation_line_longer_than_max_bytes_gets_a_file_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    ts = datetime(2020, 1, 1)
    with JsonlEventHandler(path, max_bytes=100, backup_count=3) as sink:
        sink(Event("a", ts, {}))
        sink(Event("long", ts, {"s": "y" * 500}))
        sink(Event("b", ts, {}))
    assert [e.name for e in read_jsonl(f"{path}.2")] == ["a"]
    assert [e.name for e in read_jsonl(f"{path}.1")] == ["long"]
    assert [e.name for e in read_jsonl(path)] == ["b"]


def test_rotation_with_no_backups_empties_the_file(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    with JsonlEventHandler(path, max_bytes=200, backup_count=0) as sink:
        for i in range(30):
            sink(numbered(i))
            assert path.stat().st_size <= 200
    assert [p.name for p in tmp_path.iterdir()] == ["e.jsonl"]
    kept = [e.data["i"] for e in read_jsonl(path)]
    assert kept == list(range(30 - len(kept), 30)) and len(kept) < 30


# --- threads ------------------------------------------------------------------


@pytest.mark.parametrize("max_bytes", [None, 4096])
def test_concurrent_threads_lose_nothing(tmp_path: Path, max_bytes: int | None) -> None:
    """Threads logging at once (through log_event and through their own Stats):
    every line parses, every event is there once, each thread's in order."""
    path = tmp_path / "e.jsonl"
    threads_n, per_thread = 6, 300
    barrier = threading.Barrier(threads_n)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            barrier.wait()
            for i in range(per_thread):
                torchmon.log_event(Event(f"thread{t}", datetime.now(), {"t": t, "i": i}))
            for i in range(50):
                # max_samples=1: the add closes the window at once
                Stat(f"s{t}", [Aggregation.SUM], timedelta(hours=1), max_samples=1).add(i)
        except BaseException as exc:
            errors.append(exc)

    with JsonlEventHandler(path, max_bytes=max_bytes, backup_count=1000) as sink:
        with registered(sink):
            workers = [threading.Thread(target=work, args=(t,)) for t in range(threads_n)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
    assert errors == []
    rotated = sorted(
        (p for p in tmp_path.iterdir() if p.name != "e.jsonl"),
        key=lambda p: -int(p.suffix[1:]),
    )
    files = [*rotated, path]
    if max_bytes is not None:
        assert len(files) > 5
        assert all(f.stat().st_size <= max_bytes for f in files)
    for f in files:
        for line in lines(f):
            strict_json(line)
    events = list(chain.from_iterable(read_jsonl(f) for f in files))
    assert len(events) == threads_n * (per_thread + 50)
    for t in range(threads_n):
        mine = [e.data["i"] for e in events if e.name == f"thread{t}"]
        assert mine == list(range(per_thread))
        sums = [e.data[f"s{t}.sum"] for e in events if f"s{t}.sum" in e.data]
        assert sums == [float(i) for i in range(50)]


# --- close ----------------------------------------------------------------------


def test_close(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    sink = JsonlEventHandler(path)
    assert not sink.closed and sink.path == str(path)
    sink(Event("a", datetime(2020, 1, 1), {}))
    sink.close()
    sink.close()  # idempotent
    assert sink.closed
    assert "closed" in repr(sink)
    with pytest.raises(ValueError, match="closed"):
        sink(Event("b", datetime(2020, 1, 1), {}))
    # a closed sink left registered makes log_event raise (after the other handlers ran)
    seen: list[Event] = []
    with registered(sink), registered(seen.append):
        with pytest.raises(ValueError, match="closed"):
            torchmon.log_event(Event("c", datetime(2020, 1, 1), {}))
    assert [e.name for e in seen] == ["c"]
    assert [e.name for e in read_jsonl(path)] == ["a"]


def test_context_manager_closes(tmp_path: Path) -> None:
    with JsonlEventHandler(tmp_path / "e.jsonl") as sink:
        assert not sink.closed
    assert sink.closed
    with pytest.raises(KeyError):
        with JsonlEventHandler(tmp_path / "f.jsonl") as sink2:
            raise KeyError("x")
    assert sink2.closed


# --- bad arguments and malformed input ------------------------------------------


def test_bad_arguments(tmp_path: Path) -> None:
    p = tmp_path / "e.jsonl"
    with pytest.raises(TypeError, match=r"JsonlEventHandler\(path\)"):
        JsonlEventHandler(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"JsonlEventHandler\(path\)"):
        JsonlEventHandler(b"e.jsonl")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"JsonlEventHandler\(path\)"):
        JsonlEventHandler("")
    with pytest.raises(TypeError, match=r"JsonlEventHandler\(max_bytes\)"):
        JsonlEventHandler(p, max_bytes=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"JsonlEventHandler\(max_bytes\)"):
        JsonlEventHandler(p, max_bytes=True)
    with pytest.raises(ValueError, match=r"JsonlEventHandler\(max_bytes\)"):
        JsonlEventHandler(p, max_bytes=0)
    with pytest.raises(TypeError, match=r"JsonlEventHandler\(backup_count\)"):
        JsonlEventHandler(p, max_bytes=10, backup_count="2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"JsonlEventHandler\(backup_count\)"):
        JsonlEventHandler(p, max_bytes=10, backup_count=-1)
    with pytest.raises(TypeError):
        JsonlEventHandler(p, 10)  # type: ignore[misc]  # keyword-only
    assert not p.exists()  # nothing was opened
    with pytest.raises(FileNotFoundError):
        JsonlEventHandler(tmp_path / "missing" / "e.jsonl")
    with pytest.raises(TypeError, match=r"read_jsonl\(path\)"):
        read_jsonl(None)  # type: ignore[arg-type]


GOOD = '{"name":"ok","timestamp":"2020-01-01T00:00:00","data":{}}'


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{", "not valid JSON"),
        ('{"name":"x","timestamp":"2020-01-01T00:00:00","data":{}}}', "not valid JSON"),
        ("[1, 2]", "must be a JSON object, not an array"),
        ('{"timestamp":"2020-01-01T00:00:00","data":{}}', "missing 'name'"),
        ('{"name":"x","data":{}}', "missing 'timestamp'"),
        ('{"name":"x","timestamp":"2020-01-01T00:00:00"}', "missing 'data'"),
        ('{"name":1,"timestamp":"2020-01-01T00:00:00","data":{}}', "name must be a JSON string"),
        ('{"name":"x","timestamp":"yesterday","data":{}}', "not an ISO-8601"),
        ('{"name":"x","timestamp":1577836800,"data":{}}', "timestamp must be a JSON string"),
        ('{"name":"x","timestamp":"2020-01-01T00:00:00","data":[]}', "data must be a JSON"),
        ('{"name":"x","timestamp":"2020-01-01T00:00:00","data":{"a":null}}', "not null"),
        ('{"name":"x","timestamp":"2020-01-01T00:00:00","data":{"a":[1]}}', "not an array"),
        ('{"name":"x","timestamp":"2020-01-01T00:00:00","data":{"a":{"b":1}}}', "not an object"),
        (
            '{"name":"x","timestamp":"2020-01-01T00:00:00","data":{"a":{"$float":"NaN"}}}',
            '"nan", "inf" or "-inf"',
        ),
        (
            '{"name":"x","timestamp":"2020-01-01T00:00:00","data":{"a":9223372036854775808}}',
            "not a valid event",
        ),
        ('{"name":"\\ud800","timestamp":"2020-01-01T00:00:00","data":{}}', "lone surrogate"),
        ('{"name":"x","timestamp":"2020-01-01T00:00:00","data":{"\\udc00":1}}', "surrogate"),
        ('{"name":"x","timestamp":"2020-01-01T00:00:00","fold":2,"data":{}}', "fold"),
        ('{"name":"x","timestamp":"2020-01-01T00:00:00","fold":true,"data":{}}', "fold"),
        # json's own limits: its recursion depth and sys.get_int_max_str_digits()
        ("[" * 100_000, "nested too deeply"),
        ('{"name":"x","timestamp":"2020-01-01T00:00:00","data":{"a":%s}}' % ("7" * 5000), "digits"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{GOOD}\n\n{line}\n{GOOD}\n", encoding="utf-8")
    events = read_jsonl(path)
    assert next(events).name == "ok"  # lazily: the good first line comes out first
    with pytest.raises(ValueError) as info:
        next(events)
    text = str(info.value)
    assert text.startswith(f"{path}:3: "), text
    assert message in text, text


def test_invalid_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(GOOD.encode() + b"\n" + b'{"name":"\xff"}\n')
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:2: not UTF-8"):
        list(read_jsonl(path))


def test_reader_leniencies(tmp_path: Path) -> None:
    """Blank lines, CRLF endings, unknown top-level keys, Python's NaN/Infinity
    literals and a last line without a newline are read."""
    path = tmp_path / "e.jsonl"
    path.write_bytes(
        b"\r\n"
        + b'{"name":"a","timestamp":"2020-01-01T00:00:00","data":{"x":NaN,"y":-Infinity},'
        + b'"host":"n1"}\r\n'
        + b"   \n"
        + GOOD.encode()
    )
    got = list(read_jsonl(path))
    assert [e.name for e in got] == ["a", "ok"]
    assert math.isnan(got[0].data["x"]) and got[0].data["y"] == -math.inf


def test_missing_file_raises_on_iteration(tmp_path: Path) -> None:
    events = read_jsonl(tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError):
        next(events)


# --- property: arbitrary events round-trip exactly ---------------------------------

data_values = st.one_of(
    st.text(),
    st.booleans(),
    st.integers(*INT64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 0.0, 5e-324, INT64[0], INT64[1]]),
)
offsets = st.timedeltas(
    min_value=-timedelta(hours=23, minutes=59, seconds=59, microseconds=999999),
    max_value=timedelta(hours=23, minutes=59, seconds=59, microseconds=999999),
)
naive = st.builds(lambda d, fold: d.replace(fold=fold), st.datetimes(), st.integers(0, 1))
aware = st.builds(lambda d, off: d.replace(tzinfo=timezone(off)), st.datetimes(), offsets)
event_strategy = st.builds(
    Event,
    st.text(),
    st.one_of(naive, aware),
    st.dictionaries(st.text(), data_values, max_size=8),
)


@pytest.mark.hypothesis_suite
@given(st.lists(event_strategy, max_size=5))
def test_round_trip_property(written: list[Event]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "e.jsonl")
        with JsonlEventHandler(path) as sink:
            for e in written:
                sink(e)
        for line in lines(Path(path)):
            strict_json(line)
        read = list(read_jsonl(path))
    assert [fingerprint(e) for e in read] == [fingerprint(e) for e in written]
