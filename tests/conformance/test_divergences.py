"""docs/compatibility.md's differences from torch 2.13: one or more tests per row.

Each test is named after its row and its docstring says what torch 2.13 does.
Where torch crashes or hangs (SIGFPE, segfault, deadlock, abort), the scenario
runs in a fresh interpreter with a timeout, so a regression shows up as a
failed test instead of taking the test run down; the child prints its
observations as JSON on its last stdout line.

The second half replays every scenario of the shared divergence vectors
(``torch-2.13-divergence-vectors.jsonl``) against torchmon and against the
independent pure-Python reference model of the contract (tests/conformance/model.py):
the two must observe the same thing, and the named scenarios of
divergence-cases.md get explicit asserts of torchmon's documented behaviour.
"""

from __future__ import annotations

import copy
import datetime as dt
import gc
import importlib.util
import json
import math
import multiprocessing
import pickle
import subprocess
import sys
from typing import Any

import pytest
from support import CONFORMANCE, run_python

import torchmon
from torchmon import Aggregation, Event, Stat
from torchmon.testing import ManualClock

from . import model

W = dt.timedelta(hours=100)  # no window ever closes by time
TS = dt.datetime(2020, 6, 1, 12, 0, 0, 123456)


def run_json(code: str, timeout: float = 60.0) -> Any:
    """Runs `code` in a fresh interpreter; it must exit 0 and print JSON last."""
    try:
        proc = run_python(code, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child did not finish within {timeout}s (a hang or a deadlock)")
    assert proc.returncode == 0, (
        f"child exited with {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, f"the child printed nothing\nstderr:\n{proc.stderr}"
    return json.loads(lines[-1])


class Boom(Exception):
    """Raised by the test handlers."""


class Other(Exception):
    """A second handler exception class."""


# ---------------------------------------------------------------------------
# Aggregation.VALUE
# ---------------------------------------------------------------------------


def test_aggregation_value_reports_last_value(recorder):
    """torch 2.13: `Aggregation.VALUE` is bound to 0 ("no aggregation") and silently
    ignored: Stat("loss", [VALUE], W, 2) with adds 5.0, 7.0 logs an event with data {}
    and get() is {}. torchmon: VALUE is the last value added, key ".value"."""
    assert Aggregation.VALUE.value == 1
    assert Aggregation(1) is Aggregation.VALUE
    assert torchmon.VALUE is Aggregation.VALUE
    s = Stat("loss", [Aggregation.VALUE], W, 2)
    s.add(5.0)
    assert recorder.stat_data == []
    s.add(7.0)
    assert recorder.stat_data == [{"loss.value": 7.0}]
    assert s.get() == {Aggregation.VALUE: 7.0}
    assert s.count == 0
    s.add(9.0)  # the window was closed by max_samples: dropped
    assert s.get() == {Aggregation.VALUE: 7.0}
    del s
    gc.collect()
    assert recorder.stat_data == [{"loss.value": 7.0}]


def test_aggregation_value_with_other_aggregations(recorder):
    """torch 2.13: Stat("loss", [VALUE, SUM, COUNT], W, 2) with adds 5.0, 7.0 gives
    data {"loss.count": 2.0, "loss.sum": 12.0} with no "loss.value"."""
    s = Stat("loss", [Aggregation.VALUE, Aggregation.SUM, Aggregation.COUNT], W, 2)
    s.add(5.0)
    s.add(7.0)
    assert recorder.stat_data == [{"loss.value": 7.0, "loss.sum": 12.0, "loss.count": 2.0}]
    assert s.get() == {Aggregation.VALUE: 7.0, Aggregation.SUM: 12.0, Aggregation.COUNT: 2.0}
    del s


def test_aggregation_value_destruction_flush(recorder):
    """torch 2.13: destroying a VALUE-only Stat that holds samples logs data {}."""
    s = Stat("loss", [Aggregation.VALUE], W)
    s.add(5.0)
    s.add(-3.5)
    assert s.get() == {Aggregation.VALUE: 0.0}  # nothing closed yet
    del s
    gc.collect()
    assert recorder.stat_data == [{"loss.value": -3.5}]


def test_aggregation_value_over_time_windows(recorder):
    """torch 2.13: VALUE is ignored in time-based windows too (data {})."""
    with ManualClock(0) as clock:
        s = Stat("lr", [Aggregation.VALUE, Aggregation.MAX], dt.timedelta(seconds=1))
        s.add(3.0)
        s.add(1.0)
        clock.advance(1000)
        s.add(2.0)  # closes the window holding 3.0, 1.0
        assert recorder.stat_data == [{"lr.value": 1.0, "lr.max": 3.0}]
        assert s.get() == {Aggregation.VALUE: 1.0, Aggregation.MAX: 3.0}
        del s
        gc.collect()
    assert recorder.stat_data[-1] == {"lr.value": 2.0, "lr.max": 2.0}


# ---------------------------------------------------------------------------
# bool in Event.data
# ---------------------------------------------------------------------------


def _assert_bools(data: dict[str, object]) -> None:
    assert data == {"t": True, "f": False, "i": 1, "x": 1.0, "s": "True"}
    assert data["t"] is True
    assert data["f"] is False
    assert type(data["i"]) is int
    assert type(data["x"]) is float
    assert type(data["s"]) is str


def test_bool_in_event_data_stays_bool_log_event(recorder):
    """torch 2.13: log_event(Event("x", ts, {"t": True, "f": False, ...})) hands the
    handlers {"t": 1.0, "f": 0.0, ...}, and the Event reads back the same floats."""
    e = Event("x", TS, {"t": True, "f": False, "i": 1, "x": 1.0, "s": "True"})
    torchmon.log_event(e)
    assert len(recorder.events) == 1
    assert recorder.events[0] is e
    _assert_bools(recorder.events[0].data)
    _assert_bools(e.data)


def test_bool_in_event_data_stays_bool_event_data():
    """torch 2.13: Event("x", ts, {"t": True}).data is {"t": 1.0}."""
    e = Event("x", TS, {"t": True, "f": False, "i": 1, "x": 1.0, "s": "True"})
    _assert_bools(e.data)
    assert Event("x", TS, {"t": True}).data["t"] is True


def test_bool_in_event_data_stays_bool_after_setting_data():
    """torch 2.13: after `e.data = {"t": True}`, e.data is {"t": 1.0}."""
    e = Event("x", TS, {})
    e.data = {"t": True, "f": False, "i": 1, "x": 1.0, "s": "True"}
    _assert_bools(e.data)


def test_bool_in_event_data_numpy_bool_stays_bool():
    """torch 2.13: numpy.bool_ is stored as a float too (1.0 / 0.0)."""
    np = pytest.importorskip("numpy")
    e = Event("x", TS, {"t": np.bool_(True), "f": np.bool_(False)})
    assert e.data == {"t": True, "f": False}
    assert e.data["t"] is True
    assert e.data["f"] is False


# ---------------------------------------------------------------------------
# Timestamps
# ---------------------------------------------------------------------------


def _aware_zones() -> list[dt.tzinfo]:
    zones: list[dt.tzinfo] = [
        dt.timezone.utc,
        dt.timezone(dt.timedelta(hours=5, minutes=30)),
        dt.timezone(dt.timedelta(hours=-8), "PST"),
        dt.timezone(dt.timedelta(hours=13, minutes=45)),
    ]
    try:
        from zoneinfo import ZoneInfo

        zones.append(ZoneInfo("America/New_York"))
    except Exception:  # no tz database here: fixed offsets only
        pass
    return zones


@pytest.mark.parametrize("tz", _aware_zones(), ids=repr)
def test_tz_aware_timestamp_returned_unchanged(tz, recorder):
    """torch 2.13: the tzinfo of an aware Event.timestamp is dropped and the wall time
    kept, so the timestamp names another instant (12:00+05:30 comes back as naive 12:00)."""
    ts = dt.datetime(2020, 1, 15, 12, 0, 0, 250, tzinfo=tz)
    e = Event("x", ts, {})
    got = e.timestamp
    assert got.tzinfo is not None
    assert got.utcoffset() == ts.utcoffset()
    assert got == ts  # the same instant
    assert got.timestamp() == ts.timestamp()
    assert got.replace(tzinfo=None) == ts.replace(tzinfo=None)  # the same wall time

    e2 = Event("y", dt.datetime(2000, 1, 1), {})
    e2.timestamp = ts
    assert e2.timestamp.utcoffset() == ts.utcoffset()
    assert e2.timestamp == ts

    torchmon.log_event(e)
    seen = recorder.events[0].timestamp
    assert seen.utcoffset() == ts.utcoffset()
    assert seen.timestamp() == ts.timestamp()


_DST_GAP_CHILD = """
import os, time
os.environ["TZ"] = {tz!r}
time.tzset()
import datetime as dt, json
import torchmon

ts = dt.datetime(2021, 3, 28, 2, 30, 15, 123456, fold={fold})
# The gap is real here: the C library moves 02:30 to 03:30.
gap = time.localtime(time.mktime(ts.timetuple())).tm_hour == 3
e = torchmon.Event("x", ts, {{}})
seen = []
h = torchmon.register_event_handler(lambda ev: seen.append(ev.timestamp))
try:
    torchmon.log_event(e)
finally:
    torchmon.unregister_event_handler(h)
e2 = torchmon.Event("y", dt.datetime(2000, 1, 1), {{}})
e2.timestamp = ts

def fields(t):
    return [t.isoformat(), t.fold, t.tzinfo is None]

print(json.dumps({{
    "gap": gap,
    "input": fields(ts),
    "ctor": fields(e.timestamp),
    "handler": fields(seen[0]),
    "setter": fields(e2.timestamp),
}}))
"""


@pytest.mark.parametrize("fold", [0, 1])
@pytest.mark.parametrize("tz", ["Europe/Berlin", "CET-1CEST,M3.5.0,M10.5.0/3"])
def test_naive_timestamp_in_dst_gap_returned_unchanged(tz, fold):
    """torch 2.13: a naive timestamp that does not exist in local time (2021-03-28
    02:30 in Europe/Berlin, skipped by the spring-forward) comes back shifted by an
    hour (03:30)."""
    out = run_json(_DST_GAP_CHILD.format(tz=tz, fold=fold))
    if not out["gap"]:
        pytest.skip(f"TZ={tz} has no DST gap at 2021-03-28 02:30 here (no tz database?)")
    expected = ["2021-03-28T02:30:15.123456", fold, True]
    assert out["input"] == expected
    assert out["ctor"] == expected
    assert out["handler"] == expected
    assert out["setter"] == expected


@pytest.mark.parametrize(
    "ts",
    [
        dt.datetime.min,
        dt.datetime(1, 1, 1, 0, 0, 0, 1),
        dt.datetime(1000, 7, 4, 5, 6, 7),
        dt.datetime(1677, 9, 21, 0, 12, 43),
        dt.datetime(1676, 12, 31, 23, 59, 59, 999999),
        dt.datetime(2262, 4, 11, 23, 47, 17),
        dt.datetime(2262, 4, 12, 0, 0, 0),
        dt.datetime(4000, 2, 29, 12),
        dt.datetime(9999, 1, 1),
        dt.datetime.max,
    ],
    ids=lambda t: t.isoformat(),
)
def test_naive_timestamp_outside_1677_2262_returned_unchanged(ts, recorder):
    """torch 2.13: timestamps are stored as int64 nanoseconds since the epoch, so a year
    outside 1677-2262 (year 1, year 9999) wraps around to another year."""
    e = Event("x", ts, {"k": 1})
    assert e.timestamp == ts
    assert e.timestamp.tzinfo is None
    assert e.timestamp.isoformat() == ts.isoformat()
    e2 = Event("y", TS, {})
    e2.timestamp = ts
    assert e2.timestamp == ts
    torchmon.log_event(e)
    assert recorder.events[0].timestamp == ts
    assert pickle.loads(pickle.dumps(e)).timestamp == ts


# ---------------------------------------------------------------------------
# Aggregation(n) out of range, windows
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", [13, -1, 0, 14, 100, -(2**63)])
def test_aggregation_out_of_range_raises_value_error(value):
    """torch 2.13: Aggregation(7) and Aggregation(-1) are created (unnamed members), and
    a Stat using one raises IndexError. torchmon's 7 to 12 are its extension members
    (docs/compatibility.md)."""
    with pytest.raises(ValueError):
        Aggregation(value)


def test_aggregation_in_range_values_are_the_members():
    """torch 2.13 binds VALUE to 0, so Aggregation(1) is an unnamed member there."""
    assert [Aggregation(i) for i in range(1, 7)] == [
        Aggregation.VALUE,
        Aggregation.MEAN,
        Aggregation.COUNT,
        Aggregation.SUM,
        Aggregation.MAX,
        Aggregation.MIN,
    ]


_SMALL_WINDOW_CHILD = """
import datetime as dt, json
import torchmon

cases = {
    "timedelta(microseconds=999)": dt.timedelta(microseconds=999),
    "timedelta(microseconds=1)": dt.timedelta(microseconds=1),
    "timedelta(0)": dt.timedelta(0),
    "0.0": 0.0,
    "0.0009": 0.0009,
    "0.000999": 0.000999,
    "1e-9": 1e-9,
    "5e-324": 5e-324,
    "timedelta(milliseconds=1)": dt.timedelta(milliseconds=1),
    "timedelta(microseconds=1999)": dt.timedelta(microseconds=1999),
    "0.001": 0.001,
}
out = {}
for label, window in cases.items():
    try:
        s = torchmon.Stat("w", [torchmon.SUM], window)
        for _ in range(3):
            s.add(1.0)
        del s
        out[label] = "ok"
    except Exception as exc:
        out[label] = type(exc).__name__
    try:
        torchmon.Stat(name="w", aggregations=[torchmon.SUM], window_size=window, max_samples=2)
        out[label + " (keywords)"] = "ok"
    except Exception as exc:
        out[label + " (keywords)"] = type(exc).__name__
print(json.dumps(out))
"""


def test_window_under_1ms_raises_value_error():
    """torch 2.13: a window that truncates to 0 ms makes the Stat divide by zero
    (SIGFPE): the process dies."""
    out = run_json(_SMALL_WINDOW_CHILD)
    under = [
        "timedelta(microseconds=999)",
        "timedelta(microseconds=1)",
        "timedelta(0)",
        "0.0",
        "0.0009",
        "0.000999",
        "1e-9",
        "5e-324",
    ]
    for label in under:
        assert out[label] == "ValueError", label
        assert out[label + " (keywords)"] == "ValueError", label
    for label in ["timedelta(milliseconds=1)", "timedelta(microseconds=1999)", "0.001"]:
        assert out[label] == "ok", label
        assert out[label + " (keywords)"] == "ok", label


def test_window_under_1ms_one_ms_window_works(recorder):
    """torch 2.13 divides by the window in milliseconds; 1 ms is the smallest that works."""
    with ManualClock(10) as clock:
        s = Stat("w", [Aggregation.SUM, Aggregation.COUNT], dt.timedelta(microseconds=1999))
        s.add(1.0)
        s.add(2.0)
        clock.advance(1)
        s.add(4.0)
        assert recorder.stat_data == [{"w.sum": 3.0, "w.count": 2.0}]
        del s
        gc.collect()
    assert recorder.stat_data[-1] == {"w.sum": 4.0, "w.count": 1.0}


@pytest.mark.parametrize(
    "window",
    [
        dt.timedelta(seconds=-1),
        dt.timedelta(milliseconds=-1),
        dt.timedelta(microseconds=-1),
        dt.timedelta(days=-3650),
        -1.0,
        -0.0,
        -0.0005,
        -1e300,
    ],
    ids=repr,
)
def test_negative_window_raises_value_error(window):
    """torch 2.13: a negative window is accepted (undefined behaviour in the window
    arithmetic)."""
    with pytest.raises(ValueError):
        Stat("neg", [Aggregation.SUM], window)
    with pytest.raises(ValueError):
        Stat("neg", [Aggregation.SUM], window_size=window, max_samples=3)


# ---------------------------------------------------------------------------
# Unregistering
# ---------------------------------------------------------------------------


def test_unregistering_a_handle_twice_is_a_noop():
    """torch 2.13: unregister_event_handler(h) a second time on the same handle
    segfaults."""
    out = run_json(
        """
        import datetime as dt, json
        import torchmon as m

        calls = []
        ev = m.Event("x", dt.datetime(2020, 1, 1), {})
        h1 = m.register_event_handler(lambda e: calls.append("h1"))
        h2 = m.register_event_handler(lambda e: calls.append("h2"))
        rets = [m.unregister_event_handler(h1), m.unregister_event_handler(h1)]
        m.log_event(ev)
        h3 = m.register_event_handler(lambda e: calls.append("h3"))
        rets.append(m.unregister_event_handler(h1))
        m.log_event(ev)
        rets += [m.unregister_event_handler(h2), m.unregister_event_handler(h2)]
        m.log_event(ev)
        rets += [m.unregister_event_handler(h3), m.unregister_event_handler(h3)]
        m.log_event(ev)
        print(json.dumps({"rets": rets, "calls": calls, "left": m._core._handler_count()}))
        """
    )
    assert out == {
        "rets": [None] * 7,
        "calls": ["h2", "h2", "h3", "h3"],
        "left": 0,
    }


def test_unregister_event_handler_none_raises_type_error():
    """torch 2.13: unregister_event_handler(None) segfaults."""
    out = run_json(
        """
        import datetime as dt, json
        import torchmon as m

        calls = []
        def cb(e):
            calls.append(e.name)
        h = m.register_event_handler(cb)
        errors = []
        for bad in (None, cb):
            try:
                m.unregister_event_handler(bad)
                errors.append("no error")
            except Exception as exc:
                errors.append(type(exc).__name__)
        m.log_event(m.Event("still-registered", dt.datetime(2020, 1, 1), {}))
        m.unregister_event_handler(h)
        print(json.dumps({"errors": errors, "calls": calls, "left": m._core._handler_count()}))
        """
    )
    assert out == {"errors": ["TypeError", "TypeError"], "calls": ["still-registered"], "left": 0}


# ---------------------------------------------------------------------------
# Re-entrancy and threads
# ---------------------------------------------------------------------------


def test_log_event_and_register_from_inside_a_handler():
    """torch 2.13: log_event, register_event_handler or unregister_event_handler
    called from inside a handler deadlocks (the registry's mutex is held while the
    handlers run)."""
    log = run_json(
        """
        import datetime as dt, json
        import torchmon as m

        TS = dt.datetime(2020, 1, 1)
        log = []
        handles = {}

        def rec(tag):
            def handler(e):
                log.append([tag, e.name])
            return handler

        def a(e):
            log.append(["A", e.name])
            if e.name != "outer":
                return
            m.log_event(m.Event("inner1", TS, {}))
            handles["C"] = m.register_event_handler(rec("C"))
            m.log_event(m.Event("inner2", TS, {}))
            m.unregister_event_handler(handles["B"])
            m.log_event(m.Event("inner3", TS, {}))
            m.unregister_event_handler(handles["A"])  # itself, while it runs
            m.log_event(m.Event("inner4", TS, {}))

        handles["A"] = m.register_event_handler(a)
        handles["B"] = m.register_event_handler(rec("B"))
        m.log_event(m.Event("outer", TS, {}))
        m.log_event(m.Event("outer2", TS, {}))
        m.unregister_event_handler(handles["C"])
        print(json.dumps(log))
        """,
        timeout=60,
    )
    # Whether C (registered during the outer dispatch) also sees "outer" is not
    # specified; everything else is.
    assert [c for c in log if c != ["C", "outer"]] == [
        ["A", "outer"],
        ["A", "inner1"],
        ["B", "inner1"],
        ["A", "inner2"],
        ["B", "inner2"],
        ["C", "inner2"],
        ["A", "inner3"],
        ["C", "inner3"],
        ["C", "inner4"],
        # B was unregistered before the outer dispatch reached it: never started.
        ["C", "outer2"],
    ]


def test_log_event_and_register_from_inside_a_stat_event_handler():
    """torch 2.13: a handler that logs an event or (un)registers a handler while a Stat
    event is dispatched deadlocks."""
    log = run_json(
        """
        import datetime as dt, gc, json
        import torchmon as m

        W = dt.timedelta(hours=100)
        TS = dt.datetime(2020, 1, 1)
        log = []
        handles = []
        outer = m.Stat("outer", [m.SUM], W, 1)
        inner = m.Stat("inner", [m.SUM], W, 1)

        def h(e):
            log.append(["h", e.name, e.data])
            if e.data == {"outer.sum": 1.0}:
                inner.add(2.0)  # closes inner's window: a nested Stat event
                m.log_event(m.Event("from-handler", TS, {"k": 1}))
                handles.append(m.register_event_handler(
                    lambda e2: log.append(["late", e2.name, e2.data])))
                m.log_event(m.Event("after-register", TS, {}))
                m.unregister_event_handler(handles[-1])
                m.log_event(m.Event("after-unregister", TS, {}))

        handles.append(m.register_event_handler(h))
        outer.add(1.0)
        for handle in handles:
            m.unregister_event_handler(handle)
        del outer, inner
        gc.collect()
        print(json.dumps(log))
        """,
        timeout=60,
    )
    assert log == [
        ["h", "torch.monitor.Stat", {"outer.sum": 1.0}],
        ["h", "torch.monitor.Stat", {"inner.sum": 2.0}],
        ["h", "from-handler", {"k": 1}],
        ["h", "after-register", {}],
        ["late", "after-register", {}],
        ["h", "after-unregister", {}],
    ]


_THREAD_CHILD = """
import datetime as dt, gc, json, threading
import torchmon as m

W = dt.timedelta(hours=100)
started = threading.Event()
proceed = threading.Event()
seen = []

def slow(e):
    if e.name == "slow" or "slow.sum" in e.data:
        started.set()
        seen.append(["slow-done", proceed.wait(30)])
    else:
        seen.append(["slow-saw", e.name])

h = m.register_event_handler(slow)
slow_stat = m.Stat("slow", [m.SUM], W, 1)
if {trigger!r} == "log_event":
    target = lambda: m.log_event(m.Event("slow", dt.datetime(2020, 1, 1), {{}}))
else:
    target = lambda: slow_stat.add(1.0)
t = threading.Thread(target=target)
t.start()
assert started.wait(30), "thread B's handler never started"

# Thread A, while B's Python handler runs:
rec = []
h2 = m.register_event_handler(lambda e: rec.append([e.name, e.data]))
s = m.Stat("a", [m.SUM], W, 1)
s.add(5.0)
s2 = m.Stat("a2", [m.COUNT], dt.timedelta(hours=100))
s2.add(1.0)
m.log_event(m.Event("fromA", dt.datetime(2020, 1, 1), {{"n": 1}}))
m.unregister_event_handler(h2)
proceed.set()
t.join(30)
alive = t.is_alive()
m.unregister_event_handler(h)
del s, s2, slow_stat
gc.collect()
print(json.dumps({{"rec": rec, "seen": seen, "alive": alive}}))
"""


@pytest.mark.parametrize("trigger", ["log_event", "stat"])
def test_thread_registers_and_adds_while_another_threads_handler_runs(trigger):
    """torch 2.13: while thread B's Python handler runs (B holds the registry's C++
    mutex and waits for the GIL), thread A registering a handler or adding to a Stat
    blocks on that mutex while holding the GIL: deadlock."""
    out = run_json(_THREAD_CHILD.format(trigger=trigger), timeout=90)
    assert out["alive"] is False
    assert out["rec"] == [
        ["torch.monitor.Stat", {"a.sum": 5.0}],
        ["fromA", {"n": 1}],
    ]
    # B's handler is registered too, so it also sees A's events, on thread A.
    assert out["seen"] == [
        ["slow-saw", "torch.monitor.Stat"],
        ["slow-saw", "fromA"],
        ["slow-done", True],
    ]


# ---------------------------------------------------------------------------
# Raising handlers
# ---------------------------------------------------------------------------


class _Handlers:
    """Registers handlers; `calls` logs (tag, event); raisers raise fresh instances."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Event]] = []
        self.raised: list[BaseException] = []
        self.handles: list[torchmon.EventHandlerHandle] = []

    def record(self, tag: str) -> None:
        def handler(e: Event) -> None:
            self.calls.append((tag, e))

        self.handles.append(torchmon.register_event_handler(handler))

    def raiser(self, tag: str, exc_type: type[Exception]) -> None:
        def handler(e: Event) -> None:
            self.calls.append((tag, e))
            exc = exc_type(f"raised by {tag}")
            self.raised.append(exc)
            raise exc

        self.handles.append(torchmon.register_event_handler(handler))

    def tags(self) -> list[str]:
        return [t for t, _ in self.calls]

    def data(self, tag: str) -> list[dict[str, object]]:
        return [e.data for t, e in self.calls if t == tag]

    def close(self) -> None:
        for h in self.handles:
            torchmon.unregister_event_handler(h)


@pytest.fixture
def handlers():
    hs = _Handlers()
    try:
        yield hs
    finally:
        hs.close()


@pytest.fixture
def unraisable(monkeypatch):
    """Collects what reaches sys.unraisablehook (instead of failing the test run)."""
    seen: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    yield seen
    seen.clear()


def test_a_handler_raises_every_handler_still_runs_log_event(handlers, unraisable):
    """torch 2.13: the exception propagates out of log_event at once and the handlers
    registered after the raising one are skipped."""
    handlers.record("rec0")
    handlers.raiser("boom1", Boom)
    handlers.record("rec2")
    handlers.raiser("boom3", Other)
    handlers.record("rec4")
    e = Event("x", TS, {"a": 1.5})
    with pytest.raises(Boom) as info:
        torchmon.log_event(e)
    assert handlers.tags() == ["rec0", "boom1", "rec2", "boom3", "rec4"]
    assert all(got is e for _, got in handlers.calls)
    assert info.value is handlers.raised[0]  # the first exception, itself
    # The later exception is not raised; torchmon reports it, never the first.
    assert [u.exc_value for u in unraisable] == [handlers.raised[1]]

    # Nothing is left half-done: the next log_event dispatches normally.
    handlers.calls.clear()
    with pytest.raises(Boom):
        torchmon.log_event(Event("y", TS, {}))
    assert handlers.tags() == ["rec0", "boom1", "rec2", "boom3", "rec4"]


def test_a_handler_raises_every_handler_still_runs_add_flush(handlers, unraisable):
    """torch 2.13: a handler raising during a max_samples flush propagates out of add,
    later handlers are skipped and the window is not closed: further adds in that
    window are counted and flush (and raise) again (divergence-raising-handler-
    during-add)."""
    handlers.record("rec0")
    handlers.raiser("boom", Boom)
    handlers.record("rec2")
    with ManualClock(0) as clock:
        s = Stat("loss", [Aggregation.SUM, Aggregation.COUNT], dt.timedelta(seconds=1), 2)
        s.add(1.0)
        assert handlers.calls == []
        with pytest.raises(Boom) as info:
            s.add(2.0)
        assert info.value is handlers.raised[0]
        assert handlers.tags() == ["rec0", "boom", "rec2"]
        window = {"loss.sum": 3.0, "loss.count": 2.0}
        assert handlers.data("rec0") == [window]
        assert handlers.data("rec2") == [window]
        # The state was committed before the handlers ran.
        assert s.get() == {Aggregation.SUM: 3.0, Aggregation.COUNT: 2.0}
        assert s.count == 0
        # The window is closed: later adds in it are dropped (no flush, no raise).
        s.add(10.0)
        s.add(20.0)
        assert handlers.tags() == ["rec0", "boom", "rec2"]
        assert s.get() == {Aggregation.SUM: 3.0, Aggregation.COUNT: 2.0}
        assert s.count == 0
        # A later window closes its empty remainder of the full one (no event) ...
        clock.advance(1000)
        s.add(4.0)
        assert s.get() == {Aggregation.SUM: 0.0, Aggregation.COUNT: 0.0}
        assert s.count == 1
        # ... and a close by time raises the same way, the new sample kept.
        clock.advance(1000)
        with pytest.raises(Boom):
            s.add(5.0)
        assert handlers.data("rec2")[-1] == {"loss.sum": 4.0, "loss.count": 1.0}
        assert s.get() == {Aggregation.SUM: 4.0, Aggregation.COUNT: 1.0}
        assert s.count == 1
        handlers.close()
        handlers.handles.clear()
        del s
        gc.collect()
    assert unraisable == []


def test_a_handler_raises_two_raisers_in_add_first_exception_wins(handlers, unraisable):
    """torch 2.13: only the first raising handler ever runs."""
    handlers.raiser("boom0", Other)
    handlers.record("rec1")
    handlers.raiser("boom2", Boom)
    s = Stat("two", [Aggregation.MAX], W, 1)
    with pytest.raises(Other) as info:
        s.add(7.0)
    assert info.value is handlers.raised[0]
    assert handlers.tags() == ["boom0", "rec1", "boom2"]
    assert handlers.data("rec1") == [{"two.max": 7.0}]
    assert [u.exc_value for u in unraisable] == [handlers.raised[1]]
    assert s.get() == {Aggregation.MAX: 7.0}
    s.add(8.0)  # dropped: the window was closed by max_samples
    assert handlers.tags() == ["boom0", "rec1", "boom2"]
    handlers.close()
    handlers.handles.clear()
    del s


# ---------------------------------------------------------------------------
# Raising during destruction; Stat alive at exit
# ---------------------------------------------------------------------------


def test_a_handler_raises_while_a_stat_is_destroyed_in_process(handlers, unraisable):
    """torch 2.13: an exception from a handler while a Stat's destructor flushes its
    window escapes a C++ destructor: std::terminate, the process aborts."""
    handlers.record("rec0")
    handlers.raiser("boom", Boom)
    handlers.record("rec2")
    s = Stat("d", [Aggregation.SUM, Aggregation.COUNT], W)
    s.add(2.0)
    s.add(0.5)
    del s
    gc.collect()
    assert handlers.tags() == ["rec0", "boom", "rec2"]
    assert handlers.data("rec0") == [{"d.sum": 2.5, "d.count": 2.0}]
    assert handlers.data("rec2") == [{"d.sum": 2.5, "d.count": 2.0}]
    assert [u.exc_type for u in unraisable] == [Boom]
    assert unraisable[0].exc_value is handlers.raised[0]
    # The process (and the registry) carry on.
    handlers.calls.clear()
    s2 = Stat("d2", [Aggregation.SUM], W, 1)
    with pytest.raises(Boom):
        s2.add(1.0)
    assert handlers.tags() == ["rec0", "boom", "rec2"]
    handlers.close()
    handlers.handles.clear()
    del s2


def test_a_handler_raises_while_a_stat_is_destroyed_subprocess():
    """torch 2.13: std::terminate ("terminate called after throwing an instance of
    'pybind11::error_already_set'"), the process aborts with SIGABRT."""
    proc = run_python(
        """
        import datetime as dt, gc, json
        import torchmon as m

        class HandlerBoom(Exception):
            pass

        got = []
        def rec(e):
            got.append(e.data)
        def boom(e):
            raise HandlerBoom("raised while the Stat is destroyed")

        hs = [m.register_event_handler(rec), m.register_event_handler(boom),
              m.register_event_handler(rec)]
        s = m.Stat("d", [m.SUM], dt.timedelta(hours=100))
        s.add(4.0)
        del s
        gc.collect()
        print("continued", flush=True)
        for h in hs:
            m.unregister_event_handler(h)
        print(json.dumps(got))
        """,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Exception ignored" in proc.stderr
    assert "HandlerBoom" in proc.stderr
    assert "raised while the Stat is destroyed" in proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "continued"
    assert json.loads(lines[-1]) == [{"d.sum": 4.0}, {"d.sum": 4.0}]


def test_a_stat_alive_at_interpreter_exit_is_emitted():
    """torch 2.13: a Stat still alive at interpreter exit segfaults during shutdown and
    its last window is lost."""
    proc = run_python(
        """
        import datetime as dt, json, sys
        import torchmon as m

        def handler(e):
            sys.stdout.write(json.dumps({"name": e.name, "data": e.data}) + "\\n")
            sys.stdout.flush()

        m.register_event_handler(handler)
        s = m.Stat("exit", [m.SUM, m.COUNT, m.VALUE], dt.timedelta(hours=100))
        s.add(1.0)
        s.add(2.0)
        print("main done", flush=True)
        """,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "main done"
    assert [json.loads(line) for line in lines[1:]] == [
        {
            "name": "torch.monitor.Stat",
            "data": {"exit.sum": 3.0, "exit.count": 2.0, "exit.value": 2.0},
        }
    ]


# ---------------------------------------------------------------------------
# repr, pickling, equality
# ---------------------------------------------------------------------------


def test_repr_of_event_is_readable():
    """torch 2.13: the default repr, `<torch._C._monitor.Event object at 0x...>`."""
    e = Event("my.event", TS, {"step": 42, "loss": 0.5, "tag": "train", "ok": True})
    r = repr(e)
    assert "object at 0x" not in r
    assert "my.event" in r
    assert "2020" in r and "12" in r
    for piece in ("'step'", "42", "'loss'", "0.5", "'tag'", "'train'", "'ok'", "True"):
        assert piece in r, piece
    assert repr(Event("other", TS, {})) != repr(Event("my.event", TS, {}))


def test_repr_of_stat_is_readable():
    """torch 2.13: the default repr, `<torch._C._monitor.Stat object at 0x...>`."""
    s = Stat("train.loss", [Aggregation.SUM, Aggregation.MEAN], W, 7)
    r = repr(s)
    assert "object at 0x" not in r
    assert "train.loss" in r
    del s


def _event_fields(e: Event) -> tuple[object, ...]:
    data = e.data
    return (
        e.name,
        e.timestamp,
        e.timestamp.utcoffset(),
        data,
        {k: type(v) for k, v in data.items()},
    )


PICKLE_EVENTS = [
    Event("x", TS, {}),
    Event(
        "mixed",
        dt.datetime(2011, 5, 6, 12, 13, 14, 15),
        {"s": "a\x00b é 🙂", "i": -(2**63), "j": 2**63 - 1, "f": -0.0, "t": True, "n": False},
    ),
    Event("aware", dt.datetime(2021, 1, 1, 9, tzinfo=dt.timezone(dt.timedelta(hours=-3))), {}),
    Event("old", dt.datetime(1, 1, 1), {"nan": math.nan, "inf": math.inf}),
]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_event_pickles_round_trip(protocol):
    """torch 2.13: pickle.dumps(event) raises TypeError ("cannot pickle ... object")."""
    for e in PICKLE_EVENTS:
        back = pickle.loads(pickle.dumps(e, protocol=protocol))
        assert isinstance(back, Event)
        assert back is not e
        got, want = _event_fields(back), _event_fields(e)
        assert got[0] == want[0] and got[1:3] == want[1:3] and got[4] == want[4]
        # compare data with NaN-aware equality
        assert repr(got[3]) == repr(want[3])
        assert math.copysign(1.0, back.data.get("f", 1.0)) == math.copysign(
            1.0, e.data.get("f", 1.0)
        )


def test_event_pickled_copy_is_independent():
    """torch 2.13: not picklable at all."""
    e = Event("x", TS, {"a": 1})
    back = pickle.loads(pickle.dumps(e))
    back.name = "renamed"
    back.data = {"b": 2}
    assert e.name == "x"
    assert e.data == {"a": 1}
    assert copy.copy(e).data == {"a": 1}
    assert copy.deepcopy(e).name == "x"


def test_event_pickles_through_multiprocessing_queue():
    """torch 2.13: putting an Event in a multiprocessing.Queue fails in the queue's
    feeder thread (TypeError: cannot pickle)."""
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    try:
        for e in PICKLE_EVENTS[:3]:
            q.put(e)
        for e in PICKLE_EVENTS[:3]:
            back = q.get(timeout=30)
            assert back is not e
            assert back.name == e.name
            assert back.timestamp == e.timestamp
            assert back.timestamp.utcoffset() == e.timestamp.utcoffset()
            assert back.data == e.data
            assert {k: type(v) for k, v in back.data.items()} == {
                k: type(v) for k, v in e.data.items()
            }
    finally:
        q.close()
        q.join_thread()


def test_event_pickles_to_a_spawned_pool_child():
    """torch 2.13: sending an Event to a multiprocessing worker fails (TypeError:
    cannot pickle)."""
    ctx = multiprocessing.get_context("spawn")
    e = PICKLE_EVENTS[1]
    with ctx.Pool(1) as pool:
        # The child unpickles the Event, copies it and sends the copy back.
        back = pool.apply(copy.copy, (e,))
        child_repr = pool.apply(repr, (e,))
    assert isinstance(back, Event)
    assert back.name == e.name
    assert back.timestamp == e.timestamp
    assert back.data == e.data
    assert back.data["t"] is True
    assert child_repr == repr(e)


def test_equality_and_hashing_stay_by_identity():
    """torch 2.13: Event and Stat compare and hash by identity (no __eq__ / __hash__);
    torchmon keeps that even though Events now pickle."""
    e = Event("x", TS, {"a": 1})
    twin = Event("x", TS, {"a": 1})
    assert e == e
    assert (e == twin) is False
    assert e != twin
    assert hash(e) == hash(e)
    assert hash(e) != hash(twin)
    assert len({e, twin}) == 2
    assert {e: 1}[e] == 1
    back = pickle.loads(pickle.dumps(e))
    assert back != e
    assert len({e, back}) == 2

    s = Stat("s", [Aggregation.SUM], W)
    t = Stat("s", [Aggregation.SUM], W)
    assert s == s
    assert s != t
    assert len({s, t}) == 2
    del s, t


# ---------------------------------------------------------------------------
# The shared divergence vectors, against the reference model
# ---------------------------------------------------------------------------

_REPLAY = CONFORMANCE / "replay.py"
_DIVERGENCE = CONFORMANCE / "torch-2.13-divergence-vectors.jsonl"


def _load_replay() -> Any:
    spec = importlib.util.spec_from_file_location("torchmon_divergence_replay", _REPLAY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if _REPLAY.is_file() and _DIVERGENCE.is_file():
    replay: Any = _load_replay()
    with _DIVERGENCE.open(encoding="utf-8") as f:
        DIVERGENCE = [json.loads(line) for line in f if line.strip()]
else:  # the shared folder is absent: the tests below skip through shared_dir
    replay = None
    DIVERGENCE = []

BY_ID = {sc["id"]: sc for sc in DIVERGENCE}
NAMED = [
    "divergence-value-only-stat",
    "divergence-value-with-others",
    "divergence-value-destruction-flush",
    "divergence-bool-in-log-event",
    "divergence-bool-in-event",
    "divergence-bool-in-event-set-data",
    "divergence-raising-handler-stops-dispatch",
    "divergence-raising-handler-during-add",
    "divergence-aggregation-7-out-of-range",
    "divergence-aggregation-1-is-real-value",
]


@pytest.fixture
def replayer(shared_dir, unraisable):
    """replay.py, with the gc cheap (as replay's main() does) and the real clock."""
    assert replay is not None
    model.set_clock_ms(None)
    gc.collect()
    gc.freeze()
    try:
        yield replay
    finally:
        gc.unfreeze()
        model.set_clock_ms(None)


def _run(replayer: Any, mod: Any, sid: str) -> list[dict[str, Any]]:
    return replayer.run_scenario(mod, BY_ID[sid])


def test_divergence_vectors_present(shared_dir):
    assert len(DIVERGENCE) == 60
    assert set(NAMED) <= set(BY_ID)


@pytest.mark.parametrize("scenario", DIVERGENCE, ids=[sc["id"] for sc in DIVERGENCE])
def test_divergence_vector_matches_reference_model(scenario, replayer):
    got = replayer.run_scenario(torchmon, scenario)
    want = replayer.run_scenario(model, scenario)
    i = replayer.first_mismatch(want, got, strict_zero=True)
    if i is not None:
        op = scenario["ops"][i] if i < len(scenario["ops"]) else None
        pytest.fail(
            f"op #{i}: {replayer.dumps(op)}\n"
            f"model:    {replayer.dumps(want[i] if i < len(want) else None)}\n"
            f"torchmon: {replayer.dumps(got[i] if i < len(got) else None)}"
        )
    assert not model._registry


@pytest.mark.parametrize("sid", NAMED)
def test_named_divergence_differs_from_torch(sid, replayer):
    """torchmon deliberately departs from what torch 2.13 recorded for these."""
    sc = BY_ID[sid]
    got = replayer.run_scenario(torchmon, sc)
    assert replayer.first_mismatch(sc["expect"], got) is not None


def test_bool_add_to_stat_is_not_a_divergence(replayer):
    """torch 2.13: Stat.add(True) adds 1.0; torchmon does the same."""
    sc = BY_ID["divergence-bool-add-to-stat"]
    got = replayer.run_scenario(torchmon, sc)
    assert replayer.first_mismatch(sc["expect"], got, strict_zero=True) is None


def _calls(obs: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    return [(c["fn"], c["data"]) for c in obs["calls"]]


def F(x: float) -> list[object]:
    return ["float", x]


def test_divergence_value_only_stat(replayer):
    """torch 2.13: the second add logs data {}, get() is {}."""
    got = _run(replayer, torchmon, "divergence-value-only-stat")
    assert [o["exc"] for o in got] == [None] * 9
    assert _calls(got[2]) == []
    assert _calls(got[3]) == [(0, {"loss.value": F(7.0)})]
    assert got[3]["calls"][0]["name"] == ["str", "torch.monitor.Stat"]
    assert got[3]["calls"][0]["ts"] == "now"
    assert got[4]["ret"] == {"VALUE": F(7.0)}
    assert got[5]["ret"] == ["int", 0]
    assert _calls(got[6]) == []  # 9.0 dropped: the window was closed by max_samples
    assert _calls(got[7]) == []  # nothing left to flush


def test_divergence_value_with_others(replayer):
    """torch 2.13: data {"loss.count": 2.0, "loss.sum": 12.0}, no "loss.value"."""
    got = _run(replayer, torchmon, "divergence-value-with-others")
    assert _calls(got[3]) == [
        (0, {"loss.value": F(7.0), "loss.sum": F(12.0), "loss.count": F(2.0)})
    ]
    assert got[4]["ret"] == {"VALUE": F(7.0), "SUM": F(12.0), "COUNT": F(2.0)}
    assert _calls(got[5]) == []


def test_divergence_value_destruction_flush(replayer):
    """torch 2.13: destroying a VALUE-only Stat with samples logs data {}."""
    got = _run(replayer, torchmon, "divergence-value-destruction-flush")
    assert got[3]["ret"] == ["int", 1]
    assert got[4]["ret"] == {"VALUE": F(0.0)}
    assert _calls(got[5]) == [(0, {"loss.value": F(5.0)})]


def test_divergence_bool_in_log_event(replayer):
    """torch 2.13: handlers get {"t": 1.0, "f": 0.0, "i": 1, "s": "True"}."""
    got = _run(replayer, torchmon, "divergence-bool-in-log-event")
    want = {"t": ["bool", True], "f": ["bool", False], "i": ["int", 1], "s": ["str", "True"]}
    assert got[1]["exc"] is None
    assert _calls(got[1]) == [(0, want)]
    assert got[1]["calls"][0]["obj"] == "arg"
    assert got[1]["after"]["data"] == want


def test_divergence_bool_in_event(replayer):
    """torch 2.13: Event("x", ts, {"t": True, "f": False}).data is {"t": 1.0, "f": 0.0}."""
    got = _run(replayer, torchmon, "divergence-bool-in-event")
    assert got[0]["ret"]["data"] == {"t": ["bool", True], "f": ["bool", False]}


def test_divergence_bool_in_event_set_data(replayer):
    """torch 2.13: after e.data = {"t": True}, e.data is {"t": 1.0}."""
    got = _run(replayer, torchmon, "divergence-bool-in-event-set-data")
    assert got[0]["ret"]["data"] == {"t": ["bool", True]}


def test_divergence_raising_handler_stops_dispatch(replayer):
    """torch 2.13: handlers [rec0, raiser, rec2]: one log_event calls rec0 and the
    raiser only, and the KeyError comes out of log_event."""
    got = _run(replayer, torchmon, "divergence-raising-handler-stops-dispatch")
    assert got[3]["exc"] == "KeyError"
    assert [c["fn"] for c in got[3]["calls"]] == [0, 1, 2]
    assert all(c["obj"] == "arg" for c in got[3]["calls"])
    assert got[5]["exc"] is None
    assert [c["fn"] for c in got[5]["calls"]] == [0, 2]


def test_divergence_raising_handler_during_add(replayer):
    """torch 2.13: the raise during the max_samples flush leaves the window open:
    10.0 and 20.0 are counted, flush again (SUM 30.0) and raise again."""
    got = _run(replayer, torchmon, "divergence-raising-handler-during-add")
    window = {"loss.sum": F(3.0), "loss.count": F(2.0)}
    assert got[3]["exc"] is None and _calls(got[3]) == []
    assert got[4]["exc"] == "ValueError"
    assert _calls(got[4]) == [(0, window), (1, window)]
    assert got[5]["ret"] == {"SUM": F(3.0), "COUNT": F(2.0)}
    assert got[6]["ret"] == ["int", 0]
    # Every later add in that (closed) window is dropped, with or without the raiser.
    for i in (7, 8, 11, 12, 15):
        assert got[i]["exc"] is None, i
        assert _calls(got[i]) == [], i
    assert got[9]["ret"] == {"SUM": F(3.0), "COUNT": F(2.0)}
    assert got[13]["ret"] == {"SUM": F(3.0), "COUNT": F(2.0)}
    assert got[14]["ret"] == ["int", 0]
    assert _calls(got[16]) == []


def test_divergence_aggregation_7_out_of_range(replayer):
    """torch 2.13: Aggregation(7) / Aggregation(-1) exist; Stat(..., [A(7)]) raises
    IndexError. torchmon's Aggregation(7) is STDDEV (an extension), so that Stat
    is made; Aggregation(-1) raises ValueError."""
    got = _run(replayer, torchmon, "divergence-aggregation-7-out-of-range")
    assert [o["exc"] for o in got] == [None, "ValueError"]


def test_divergence_aggregation_1_is_real_value(replayer):
    """torch 2.13: the last-value aggregation is reachable only as the unnamed
    Aggregation(1) (name "???"); torchmon's Aggregation(1) is VALUE itself."""
    got = _run(replayer, torchmon, "divergence-aggregation-1-is-real-value")
    assert _calls(got[3]) == [(0, {"loss.value": F(7.0), "loss.sum": F(12.0)})]
    assert got[4]["ret"] == {"VALUE": F(7.0), "SUM": F(12.0)}
