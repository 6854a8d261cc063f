"""torch's own test/test_monitor.py, ported to torchmon, plus torch-vs-torchmon diffs.

The ported tests keep the shape of torch's (same names, same imports, same
calls) to show the drop-in claim: only the import line changes. Where torch
sleeps to let a window pass, these drive the clock with ManualClock (and one
copy keeps torch's real sleep loop).

The differential tests run one program against the real ``torch.monitor``
(skipped when torch is not installed) and against torchmon and require equal
observations, except for the differences docs/compatibility.md documents, which are
asserted separately (torch's side and torchmon's side).
"""

from __future__ import annotations

import datetime as dt
import gc
import math
import tempfile
import time
from datetime import datetime, timedelta
from types import ModuleType
from typing import Any

import pytest

import torchmon as monitor
from torchmon import (
    Aggregation,
    Event,
    Stat,
    TensorboardEventHandler,
    _WaitCounter,
    log_event,
    register_event_handler,
    unregister_event_handler,
)
from torchmon.testing import ManualClock


def _torch_monitor() -> ModuleType:
    pytest.importorskip("torch", reason="torch is not installed: no reference to compare with")
    import torch.monitor

    return torch.monitor


# ---------------------------------------------------------------------------
# torch/test/test_monitor.py, class TestMonitor
# ---------------------------------------------------------------------------


class TestMonitor:
    def test_interval_stat(self) -> None:
        events = []

        def handler(event):
            events.append(event)

        handle = register_event_handler(handler)
        try:
            with ManualClock(0) as clock:
                s = Stat(
                    "asdf",
                    (Aggregation.SUM, Aggregation.COUNT),
                    timedelta(milliseconds=1),
                )
                assert s.name == "asdf"

                s.add(2)
                for _ in range(100):
                    clock.advance(1)  # torch: time.sleep(1 / 1000)
                    s.add(3)
                    if len(events) >= 1:
                        break
                assert len(events) >= 1
                # With the clock driven, the very first advance closes the window of 2.
                assert len(events) == 1
                assert events[0].name == "torch.monitor.Stat"
                assert events[0].data == {"asdf.sum": 2.0, "asdf.count": 1.0}
                del s
                gc.collect()
                assert [e.data for e in events[1:]] == [{"asdf.sum": 3.0, "asdf.count": 1.0}]
        finally:
            unregister_event_handler(handle)

    def test_interval_stat_real_clock(self) -> None:
        """torch's version verbatim, on the real monotonic clock."""
        events = []

        def handler(event):
            events.append(event)

        handle = register_event_handler(handler)
        try:
            s = Stat(
                "asdf",
                (Aggregation.SUM, Aggregation.COUNT),
                timedelta(milliseconds=1),
            )
            assert s.name == "asdf"

            s.add(2)
            for _ in range(100):
                # NOTE: different platforms sleep may be inaccurate so we loop
                # instead (i.e. win)
                time.sleep(1 / 1000)  # ms
                s.add(3)
                if len(events) >= 1:
                    break
            assert len(events) >= 1
            assert events[0].data["asdf.sum"] >= 2.0
        finally:
            unregister_event_handler(handle)

    def test_fixed_count_stat(self) -> None:
        s = Stat(
            "asdf",
            (Aggregation.SUM, Aggregation.COUNT),
            timedelta(hours=100),
            3,
        )
        s.add(1)
        s.add(2)
        name = s.name
        assert name == "asdf"
        assert s.count == 2
        s.add(3)
        assert s.count == 0
        assert s.get() == {Aggregation.SUM: 6.0, Aggregation.COUNT: 3}

    def test_log_event(self) -> None:
        e = Event(
            name="torch.monitor.TestEvent",
            timestamp=datetime.now(),
            data={
                "str": "a string",
                "float": 1234.0,
                "int": 1234,
            },
        )
        assert e.name == "torch.monitor.TestEvent"
        assert e.timestamp is not None
        assert e.data is not None
        log_event(e)
        assert e.data == {"str": "a string", "float": 1234.0, "int": 1234}

    def test_event_handler(self) -> None:
        events = []

        def handler(event: Event) -> None:
            events.append(event)

        handle = register_event_handler(handler)
        try:
            e = Event(
                name="torch.monitor.TestEvent",
                timestamp=datetime.now(),
                data={},
            )
            log_event(e)
            assert len(events) == 1
            assert events[0] == e
            log_event(e)
            assert len(events) == 2

            unregister_event_handler(handle)
            log_event(e)
            assert len(events) == 2
        finally:
            unregister_event_handler(handle)  # a second unregister is a no-op

    def test_wait_counter(self) -> None:
        wait_counter = _WaitCounter(
            "test_wait_counter",
        )
        with wait_counter.guard():
            pass


# ---------------------------------------------------------------------------
# torch/test/test_monitor.py, class TestMonitorTensorboard
# ---------------------------------------------------------------------------


def _read_scalars(logdir: str) -> dict[str, list[float]]:
    """The scalars of a log directory, read by TensorBoard's own event reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(logdir)
    acc.Reload()
    return {tag: [ev.value for ev in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _run_asdf(w: Any) -> None:
    """The body of torch's TestMonitorTensorboard.test_event_handler."""
    handle = register_event_handler(TensorboardEventHandler(w))
    try:
        s = Stat(
            "asdf",
            (Aggregation.SUM, Aggregation.COUNT),
            timedelta(hours=1),
            5,
        )
        for i in range(10):
            s.add(i)
        assert s.count == 0
    finally:
        unregister_event_handler(handle)


class TestMonitorTensorboard:
    def test_event_handler_tensorboardx(self, tmp_path):
        tensorboardX = pytest.importorskip("tensorboardX")
        pytest.importorskip("tensorboard")
        before = time.time()
        with tensorboardX.SummaryWriter(logdir=str(tmp_path)) as w:
            _run_asdf(w)
            w.flush()
        scalars = _read_scalars(str(tmp_path))
        assert scalars == {"asdf.sum": [10], "asdf.count": [5]}

        # walltime is the Stat event's timestamp
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(tmp_path))
        acc.Reload()
        (ev,) = acc.Scalars("asdf.sum")
        assert before - 1 <= ev.wall_time <= time.time() + 1

    def test_event_handler_torch_summary_writer(self):
        """torch's test verbatim (torch.utils.tensorboard + the plugin multiplexer)."""
        pytest.importorskip("torch", reason="torch is not installed")
        pytest.importorskip("tensorboard")
        from tensorboard.backend.event_processing import (
            plugin_event_multiplexer as event_multiplexer,
        )
        from torch.utils.tensorboard import SummaryWriter

        temp_dirs = []

        def create_summary_writer():
            temp_dir = tempfile.TemporaryDirectory()
            temp_dirs.append(temp_dir)
            return SummaryWriter(temp_dir.name)

        try:
            with create_summary_writer() as w:
                _run_asdf(w)

            mul = event_multiplexer.EventMultiplexer()
            mul.AddRunsFromDirectory(temp_dirs[-1].name)
            mul.Reload()
            scalar_dict = mul.PluginRunToTagToContent("scalars")
            raw_result = {
                tag: mul.Tensors(run, tag)
                for run, run_dict in scalar_dict.items()
                for tag in run_dict
            }
            scalars = {
                tag: [e.tensor_proto.float_val[0] for e in events]
                for tag, events in raw_result.items()
            }
            assert scalars == {
                "asdf.sum": [10],
                "asdf.count": [5],
            }
            # and through the EventAccumulator too
            assert _read_scalars(temp_dirs[-1].name) == {"asdf.sum": [10], "asdf.count": [5]}
        finally:
            for temp_dir in temp_dirs:
                temp_dir.cleanup()

    def test_event_handler_ignores_other_events(self, tmp_path):
        tensorboardX = pytest.importorskip("tensorboardX")
        pytest.importorskip("tensorboard")
        with tensorboardX.SummaryWriter(logdir=str(tmp_path)) as w:
            handle = register_event_handler(TensorboardEventHandler(w))
            try:
                log_event(Event("not.a.stat", datetime.now(), {"x": 1.0}))
                with ManualClock(0) as clock:
                    s = Stat("lr", [Aggregation.MAX], timedelta(seconds=1))
                    s.add(0.5)
                    clock.advance(1000)
                    s.add(0.25)  # closes the first window
                    clock.advance(1000)
                    s.add(0.125)  # closes the second
                    del s  # and the destruction flush writes the third
                    gc.collect()
            finally:
                unregister_event_handler(handle)
            w.flush()
        assert _read_scalars(str(tmp_path)) == {"lr.max": [0.5, 0.25, 0.125]}


# ---------------------------------------------------------------------------
# The same program against torch.monitor and torchmon
# ---------------------------------------------------------------------------

W = timedelta(hours=100)


def tagged(v: object) -> tuple[str, str]:
    """Type and repr: keeps int vs float, -0.0 vs 0.0, NaN == NaN."""
    return (type(v).__name__, repr(v))


def tagged_data(d: dict[str, object]) -> dict[str, tuple[str, str]]:
    return {k: tagged(v) for k, v in d.items()}


def ts_kind(t: object) -> object:
    if isinstance(t, datetime) and t.tzinfo is None:
        if abs((t - datetime.now()).total_seconds()) < 3600:
            return "now"
        return t.isoformat()
    return ("not a naive datetime", repr(t))


def getd(s: Any) -> dict[str, tuple[str, str]]:
    return {agg.name: tagged(v) for agg, v in s.get().items()}


def exc_name(fn: Any) -> str | None:
    try:
        fn()
    except Exception as exc:
        return type(exc).__name__
    return None


class FakeWriter:
    def __init__(self) -> None:
        self.scalars: list[tuple[str, tuple[str, str], bool]] = []

    def add_scalar(
        self,
        tag: str,
        value: float,
        global_step: int | None = None,
        walltime: float | None = None,
    ) -> None:
        # The step is torchmon's addition (docs/compatibility.md, TensorBoard
        # steps) and not compared here.
        near_now = walltime is not None and abs(walltime - time.time()) < 3600
        self.scalars.append((tag, tagged(value), near_now))


SEQUENCES: list[list[Any]] = [
    [1, 2.5, -0.0],
    [math.nan, 1.0, 2.0],  # a NaN first sample sticks in MIN and MAX
    [1.0, math.nan, -1.0],  # a later NaN only poisons the sum
    [True, False, 4],
    [1e308, 1e308, -math.inf],
    [math.inf, -math.inf],
    [0.1, 0.2, 0.3],
    [-0.0],  # SUM and MEAN 0.0, MIN and MAX -0.0
    [-0.0, 0.0],
    [5e-324, -5e-324],
    [2**53 + 1, -(2**60)],
]


def program(mon: Any) -> list[object]:
    """A safe program (huge windows, no VALUE, no bool data, no tz, no raising
    handler) observed op by op. Stats live only in `st`, so none outlives it."""
    obs: list[object] = []
    events: list[object] = []
    st: dict[str, Any] = {}
    A = mon.Aggregation
    aggs = [A.SUM, A.COUNT, A.MEAN, A.MIN, A.MAX]

    def handler(e: Any) -> None:
        events.append((e.name, tagged_data(e.data), ts_kind(e.timestamp)))

    writer = FakeWriter()
    # A Stat an earlier test left in a reference cycle would flush its window
    # into these handlers at the program's gc.collect(): it goes first.
    gc.collect()
    handles = [
        mon.register_event_handler(handler),
        mon.register_event_handler(mon.TensorboardEventHandler(writer)),
    ]
    try:
        obs.append(("STAT_EVENT", mon.STAT_EVENT))
        obs.append(("names", [a.name for a in aggs], [int(a.value) for a in aggs]))
        obs.append(("SUM == 4", A.SUM == 4, A.SUM == A.SUM, A.SUM != A.MEAN))

        # One Stat per sequence (in a 100-hour window a Stat closes by max_samples
        # at most once): the flush, then a dropped add.
        for i, seq in enumerate(SEQUENCES):
            key = f"s{i}"
            st[key] = mon.Stat(f"seq{i}", aggs, W, len(seq))
            obs.append((key, st[key].name, getd(st[key]), st[key].count))
            for v in seq:
                st[key].add(v)
                obs.append(("add", key, tagged(v), st[key].count, len(events)))
            obs.append(("get", key, getd(st[key]), st[key].count))
            st[key].add(1.0)  # dropped: this window was closed by max_samples
            obs.append(("dropped", key, getd(st[key]), st[key].count, len(events)))

        st["t"] = mon.Stat("big", aggs, timedelta(days=3650))  # default max_samples
        for i in range(5):
            st["t"].add(i * 0.5)
        obs.append(("t", st["t"].count, getd(st["t"]), len(events)))
        del st["t"]
        gc.collect()
        obs.append(("after del t", len(events)))

        st["u"] = mon.Stat("noaggs", [], 360000.0, 1)
        st["u"].add(1)
        st["u"].add(2)
        obs.append(("u", st["u"].get(), st["u"].count, len(events)))

        st["m0"] = mon.Stat("m0", [A.SUM, A.MIN], W, 0)  # <= 0 behaves like 1
        st["m0"].add(3)
        st["m0"].add(4)
        obs.append(("m0", getd(st["m0"]), st["m0"].count, len(events)))

        st["neg"] = mon.Stat("neg", [A.SUM, A.MIN, A.MAX, A.MEAN], W, 2)
        st["neg"].add(-0.0)
        st["neg"].add(-0.0)
        obs.append(("neg", getd(st["neg"])))

        st["z"] = mon.Stat("never", [A.SUM], W)
        del st["z"]  # no samples: nothing emitted
        gc.collect()
        obs.append(("after del z", len(events)))

        st["k"] = mon.Stat(
            name="kw", aggregations=(a for a in [A.MAX, A.MAX]), window_size=W, max_samples=2
        )
        st["k"].add(-1)
        st["k"].add(-2)
        obs.append(("kw", getd(st["k"])))

        ts = datetime(2011, 5, 6, 12, 13, 14, 15)
        data = {"s": "a string", "i": 1234, "lo": -(2**63), "hi": 2**63 - 1, "f": 1234.0}
        e = mon.Event("my.event", ts, data)
        data["s"] = "changed"
        mon.log_event(e)
        obs.append(("event", e.name, e.timestamp.isoformat(), tagged_data(e.data), len(events)))
        e.data["poked"] = 1
        obs.append(("poked", tagged_data(e.data)))
        e.name = "renamed"
        e.timestamp = datetime(2000, 1, 2)
        e.data = {"x": 1, "y": -2.5, "z": ""}
        obs.append(("set", e.name, e.timestamp.isoformat(), tagged_data(e.data)))
        e2 = mon.Event(name="kw", timestamp=ts, data={})
        obs.append(("kw event", e2.name, e2.data))
        mon.log_event(e2)

        obs.append(("int window", exc_name(lambda: mon.Stat("x", [A.SUM], 5))))
        obs.append(("log_event(5)", exc_name(lambda: mon.log_event(5))))
        obs.append(("add(str)", exc_name(lambda: st["s0"].add("1"))))
        obs.append(("add(None)", exc_name(lambda: st["s0"].add(None))))
        obs.append(("data None", exc_name(lambda: mon.Event("x", ts, {"a": None}))))
        obs.append(("data int key", exc_name(lambda: mon.Event("x", ts, {1: 1}))))
        obs.append(("ts float", exc_name(lambda: mon.Event("x", 1.5, {}))))
        obs.append(("register(1)", exc_name(lambda: mon.register_event_handler(1))))
        obs.append(("unregister(1)", exc_name(lambda: mon.unregister_event_handler(1))))
        obs.append(("max_samples 1.5", exc_name(lambda: mon.Stat("x", [A.SUM], W, 1.5))))
        obs.append(("aggregation 4", exc_name(lambda: mon.Stat("x", [4], W))))

        with mon._WaitCounter("differential.wait").guard():
            pass
    finally:
        for h in handles:
            mon.unregister_event_handler(h)
        st.clear()
        gc.collect()
    obs.append(("events", events))
    # Dict order is not part of the contract (torch's follows a C++ unordered_map).
    obs.append(("scalars", sorted(writer.scalars)))
    return obs


def test_differential_program_torch_vs_torchmon():
    """One safe program, both implementations: the same observations."""
    torch_monitor = _torch_monitor()
    want = program(torch_monitor)
    got = program(monitor)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"observation #{i} differs"


def test_differential_program_is_not_vacuous():
    """The program really exercises flushes, destruction and the TensorBoard sink:
    one event per sequence, the destruction flush of "big", the aggregation-less
    Stat, "m0" (max_samples 0 acts as 1), "neg", "kw" and the two logged events."""
    obs = program(monitor)
    events = next(o[1] for o in obs if isinstance(o, tuple) and o[0] == "events")
    scalars = next(o[1] for o in obs if isinstance(o, tuple) and o[0] == "scalars")
    assert len(events) == len(SEQUENCES) + 7
    assert ("torch.monitor.Stat", {}, "now") in events
    big = {
        "big.sum": ("float", "5.0"),
        "big.count": ("float", "5.0"),
        "big.mean": ("float", "1.0"),
        "big.min": ("float", "0.0"),
        "big.max": ("float", "2.0"),
    }
    assert ("torch.monitor.Stat", big, "now") in events
    nan_first = events[1][1]
    assert nan_first["seq1.min"] == ("float", "nan")
    assert nan_first["seq1.max"] == ("float", "nan")
    assert nan_first["seq1.sum"] == ("float", "nan")
    assert [name for name, _, _ in events[-2:]] == ["my.event", "kw"]
    # every Stat event item became a scalar: 5 per sequence and for big, 2 for m0,
    # 4 for neg, 1 for kw
    assert len(scalars) == 5 * len(SEQUENCES) + 5 + 2 + 4 + 1
    assert all(near_now for _, _, near_now in scalars)


# ---------------------------------------------------------------------------
# The documented differences, both sides
# ---------------------------------------------------------------------------


def _collect(mon: Any, body: Any) -> list[Any]:
    events: list[Any] = []
    h = mon.register_event_handler(events.append)
    try:
        body()
    finally:
        mon.unregister_event_handler(h)
        gc.collect()
    return events


def _value_stat(mon: Any) -> tuple[list[dict[str, object]], dict[str, float]]:
    st: dict[str, Any] = {}
    got: dict[str, float] = {}

    def body() -> None:
        st["s"] = mon.Stat("loss", [mon.Aggregation.VALUE, mon.Aggregation.SUM], W, 2)
        st["s"].add(5.0)
        st["s"].add(7.0)
        got.update({a.name: v for a, v in st["s"].get().items()})
        st.clear()

    events = _collect(mon, body)
    return [e.data for e in events], got


def test_difference_aggregation_value():
    """torch ignores VALUE (bound to 0); torchmon reports the last value."""
    tm = _torch_monitor()
    assert tm.Aggregation.VALUE.value == 0
    assert _value_stat(tm) == ([{"loss.sum": 12.0}], {"SUM": 12.0})
    assert monitor.Aggregation.VALUE.value == 1
    assert _value_stat(monitor) == (
        [{"loss.value": 7.0, "loss.sum": 12.0}],
        {"VALUE": 7.0, "SUM": 12.0},
    )


def test_difference_bool_in_event_data():
    """torch stores bools as 1.0 / 0.0; torchmon keeps bools."""
    tm = _torch_monitor()
    ts = datetime(2020, 1, 1)
    got_torch = tm.Event("x", ts, {"t": True, "f": False}).data
    assert got_torch == {"t": 1.0, "f": 0.0}
    assert type(got_torch["t"]) is float
    got = monitor.Event("x", ts, {"t": True, "f": False}).data
    assert got["t"] is True and got["f"] is False


def test_difference_tz_aware_timestamp():
    """torch drops the tzinfo and keeps the wall time; torchmon keeps the datetime."""
    tm = _torch_monitor()
    ts = datetime(2020, 1, 1, 12, tzinfo=dt.timezone(timedelta(hours=5, minutes=30)))
    back = tm.Event("x", ts, {}).timestamp
    assert back.tzinfo is None and back.replace(tzinfo=None) == ts.replace(tzinfo=None)
    got = monitor.Event("x", ts, {}).timestamp
    assert got == ts and got.utcoffset() == ts.utcoffset()


def test_difference_timestamp_outside_1677_2262():
    """torch wraps a year outside 1677-2262 to another year; torchmon keeps it."""
    tm = _torch_monitor()
    for ts in (datetime(1, 1, 1), datetime(9999, 12, 31)):
        assert tm.Event("x", ts, {}).timestamp.year != ts.year
        assert monitor.Event("x", ts, {}).timestamp == ts


def test_difference_aggregation_out_of_range():
    """torch creates Aggregation(7) (a Stat using it raises IndexError); torchmon's
    values run 1 to 12 (7 is its STDDEV extension, docs/compatibility.md) and
    raises ValueError past them."""
    tm = _torch_monitor()
    a7 = tm.Aggregation(7)
    with pytest.raises(IndexError):
        tm.Stat("x", [a7], W)
    gc.collect()
    assert monitor.Aggregation(7) is monitor.Aggregation.STDDEV
    with pytest.raises(ValueError):
        monitor.Aggregation(13)


def test_difference_raising_handler():
    """torch stops at the first raising handler; torchmon runs every handler and
    re-raises the first exception."""
    tm = _torch_monitor()

    def run(mon: Any) -> tuple[list[str], str | None]:
        calls: list[str] = []

        def boom(e: Any) -> None:
            calls.append("boom")
            raise KeyError("k")

        hs = [
            mon.register_event_handler(lambda e: calls.append("a")),
            mon.register_event_handler(boom),
            mon.register_event_handler(lambda e: calls.append("c")),
        ]
        try:
            err = exc_name(lambda: mon.log_event(mon.Event("x", datetime(2020, 1, 1), {})))
        finally:
            for h in hs:
                mon.unregister_event_handler(h)
        return calls, err

    assert run(tm) == (["a", "boom"], "KeyError")
    assert run(monitor) == (["a", "boom", "c"], "KeyError")


def test_difference_repr_and_pickle():
    """torch: default repr, Event not picklable; torchmon: readable repr, pickles."""
    import pickle

    tm = _torch_monitor()
    ts = datetime(2020, 1, 1)
    te = tm.Event("x", ts, {"a": 1})
    assert "object at 0x" in repr(te)
    with pytest.raises(TypeError):
        pickle.dumps(te)
    e = monitor.Event("x", ts, {"a": 1})
    assert "object at 0x" not in repr(e)
    assert pickle.loads(pickle.dumps(e)).data == {"a": 1}
    # equality by identity in both
    assert (te == tm.Event("x", ts, {"a": 1})) is False
    assert (e == monitor.Event("x", ts, {"a": 1})) is False
