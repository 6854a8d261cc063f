"""TensorboardEventHandler against real tensorboardX files, read back with
TensorBoard's own reader: the default (Stat events only, a step per window),
the steps (``step``), the tags (``layout``) and the opt-in for other events
(``other_events``, ``step_field``). docs/sinks.md, "TensorBoard"."""

from __future__ import annotations

import gc
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from support import registered

import torchmon
from torchmon import Aggregation, Event, Stat, TensorboardEventHandler
from torchmon.testing import ManualClock

tensorboardX = pytest.importorskip("tensorboardX")
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def read_back(logdir: Path) -> dict[str, list[tuple[int, float, float]]]:
    """Every scalar tag of a log directory: [(step, value, wall_time)], read by
    TensorBoard's EventAccumulator."""
    acc = event_accumulator.EventAccumulator(str(logdir))
    acc.Reload()
    return {
        tag: [(ev.step, ev.value, ev.wall_time) for ev in acc.Scalars(tag)]
        for tag in acc.Tags()["scalars"]
    }


def values(scalars: dict[str, list[tuple[int, float, float]]]) -> dict[str, list[float]]:
    return {tag: [v for _, v, _ in evs] for tag, evs in scalars.items()}


def steps(scalars: dict[str, list[tuple[int, float, float]]]) -> dict[str, list[int]]:
    return {tag: [s for s, _, _ in evs] for tag, evs in scalars.items()}


def run_two_windows(clock: ManualClock) -> None:
    """A 1 s "lr" Stat: window 1 holds 0.5 and 0.25, window 2 holds 0.125
    (emitted when the Stat is dropped)."""
    s = Stat("lr", [Aggregation.MAX, Aggregation.COUNT], timedelta(seconds=1))
    s.add(0.5)
    s.add(0.25)
    clock.advance(1000)
    s.add(0.125)  # closes window 1
    del s  # the destruction flush emits window 2
    gc.collect()


def epoch_event(epoch: object, loss: float, **extra: Any) -> Event:
    return Event(
        "train.epoch_end",
        datetime(2024, 5, 6, 12, 0, int(loss * 10)),
        {"epoch": epoch, "loss": loss, **extra},
    )


def test_default_writes_stat_events_only(tmp_path: Path) -> None:
    with tensorboardX.SummaryWriter(logdir=str(tmp_path)) as w:
        with registered(TensorboardEventHandler(w)), ManualClock(0) as clock:
            torchmon.log_event(epoch_event(1, 0.5))  # ignored: not a Stat event
            run_two_windows(clock)
    got = read_back(tmp_path)
    assert values(got) == {"lr.max": [0.5, 0.125], "lr.count": [2.0, 1.0]}
    # each window its own step, counted per tag from 1
    assert steps(got) == {"lr.max": [1, 2], "lr.count": [1, 2]}


def test_default_walltime_is_the_event_timestamp(tmp_path: Path) -> None:
    ts = datetime(2021, 3, 4, 5, 6, 7, 250000, tzinfo=timezone(timedelta(hours=2)))
    with tensorboardX.SummaryWriter(logdir=str(tmp_path)) as w:
        TensorboardEventHandler(w)(Event(torchmon.STAT_EVENT, ts, {"x.sum": 3.0}))
    ((step, value, wall),) = read_back(tmp_path)["x.sum"]
    assert (step, value) == (1, 3.0)
    assert wall == pytest.approx(ts.timestamp(), abs=1e-6)


def test_other_events_with_step_field(tmp_path: Path) -> None:
    """Numeric fields of other events become <name>/<field> scalars at the step
    field's value; the step field, str and bool fields are not written; Stat
    events are written as by default."""
    events = [
        epoch_event(1, 0.5, accuracy=0.75, note="warmup", best=True, samples=1024),
        epoch_event(2, 0.25, accuracy=0.875, note="", best=False, samples=2048),
    ]
    with tensorboardX.SummaryWriter(logdir=str(tmp_path)) as w:
        handler = TensorboardEventHandler(w, other_events=True, step_field="epoch")
        with registered(handler), ManualClock(0) as clock:
            for e in events:
                torchmon.log_event(e)
            run_two_windows(clock)
    got = read_back(tmp_path)
    assert values(got) == {
        "train.epoch_end/loss": [0.5, 0.25],
        "train.epoch_end/accuracy": [0.75, 0.875],
        "train.epoch_end/samples": [1024.0, 2048.0],
        "lr.max": [0.5, 0.125],
        "lr.count": [2.0, 1.0],
    }
    assert steps(got)["train.epoch_end/loss"] == [1, 2]
    assert steps(got)["train.epoch_end/samples"] == [1, 2]
    assert steps(got)["lr.max"] == [1, 2]
    walls = [wall for _, _, wall in got["train.epoch_end/loss"]]
    assert walls == pytest.approx([e.timestamp.timestamp() for e in events], abs=1e-6)


def test_other_events_default_step_is_the_ordinal_per_name(tmp_path: Path) -> None:
    now = datetime.now()
    with tensorboardX.SummaryWriter(logdir=str(tmp_path)) as w:
        handler = TensorboardEventHandler(w, other_events=True)
        with registered(handler):
            for i in range(3):
                torchmon.log_event(Event("eval", now, {"score": i * 0.5}))
                torchmon.log_event(Event("train", now, {"loss": -i * 1.0, "epoch": i + 10}))
    got = read_back(tmp_path)
    assert values(got) == {
        "eval/score": [0.0, 0.5, 1.0],
        "train/loss": [0.0, -1.0, -2.0],
        "train/epoch": [10.0, 11.0, 12.0],  # without step_field an int field is a value
    }
    assert steps(got) == {
        "eval/score": [0, 1, 2],
        "train/loss": [0, 1, 2],
        "train/epoch": [0, 1, 2],
    }


def test_step_field_not_an_int_falls_back_to_the_ordinal(tmp_path: Path) -> None:
    """A missing, float, bool or str step field: the ordinal is the step, and
    the field (whatever it holds) is never written as a scalar."""
    now = datetime.now()
    with tensorboardX.SummaryWriter(logdir=str(tmp_path)) as w:
        handler = TensorboardEventHandler(w, other_events=True, step_field="step")
        for step in (7, 2.5, True, "x", None, -3):
            data: dict[str, Any] = {"v": 1.5}
            if step is not None:
                data["step"] = step
            handler(Event("e", now, data))
    got = read_back(tmp_path)
    assert list(got) == ["e/v"]
    assert steps(got)["e/v"] == [7, 1, 2, 3, 4, -3]


def test_event_named_like_a_stat_event_is_written_by_default_path(tmp_path: Path) -> None:
    """An event logged with the name STAT_EVENT is a Stat event to the handler
    (every item, as torch), even with other_events on."""
    with tensorboardX.SummaryWriter(logdir=str(tmp_path)) as w:
        handler = TensorboardEventHandler(w, other_events=True, step_field="epoch")
        handler(Event(torchmon.STAT_EVENT, datetime.now(), {"epoch": 4, "a.sum": 1.0}))
    got = read_back(tmp_path)
    assert values(got) == {"epoch": [4.0], "a.sum": [1.0]}


def test_large_ints_and_nan(tmp_path: Path) -> None:
    now = datetime.now()
    with tensorboardX.SummaryWriter(logdir=str(tmp_path)) as w:
        handler = TensorboardEventHandler(w, other_events=True)
        handler(Event("e", now, {"big": 2**40, "nan": float("nan"), "inf": float("inf")}))
    got = values(read_back(tmp_path))
    assert got["e/big"] == [2.0**40]
    assert got["e/nan"][0] != got["e/nan"][0]
    assert got["e/inf"] == [float("inf")]


class RecordingWriter:
    """Every add_scalar call as (tag, value, keyword arguments)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float, dict[str, Any]]] = []

    def add_scalar(self, tag: str, value: float, **kwargs: Any) -> None:
        self.calls.append((tag, value, kwargs))


def stat_event(data: dict[str, float], second: int = 0) -> Event:
    return Event(torchmon.STAT_EVENT, datetime(2024, 5, 6, 12, 0, second), data)


def test_default_step_counts_windows_per_tag_across_re_created_stats(tmp_path: Path) -> None:
    """Each tag's windows are numbered 1, 2, 3, ...; a Stat created again under
    the same name goes on counting; another Stat has its own count."""
    with tensorboardX.SummaryWriter(logdir=str(tmp_path)) as w:
        with registered(TensorboardEventHandler(w)), ManualClock(0) as clock:
            run_two_windows(clock)  # lr: windows 1 and 2
            other = Stat("other", [Aggregation.SUM], timedelta(seconds=1))
            other.add(7.0)
            run_two_windows(clock)  # a new "lr" Stat: windows 3 and 4
            clock.advance(1000)
            other.add(8.0)  # closes other's window 1
            del other
            gc.collect()
    got = read_back(tmp_path)
    assert values(got) == {
        "lr.max": [0.5, 0.125, 0.5, 0.125],
        "lr.count": [2.0, 1.0, 2.0, 1.0],
        "other.sum": [7.0, 8.0],
    }
    assert steps(got) == {"lr.max": [1, 2, 3, 4], "lr.count": [1, 2, 3, 4], "other.sum": [1, 2]}


def test_step_none_writes_what_torch_monitor_writes() -> None:
    """step=None: no global_step, only the wall time, as torch.monitor's handler;
    compared call for call with torch's own handler when torch is installed."""
    events = [stat_event({"a.sum": 1.0, "a.count": 2.0}, s) for s in range(3)]
    ours = RecordingWriter()
    handler = TensorboardEventHandler(ours, step=None)
    for e in events:
        handler(e)
    assert ours.calls == [
        (key, value, {"walltime": e.timestamp.timestamp()})
        for e in events
        for key, value in e.data.items()
    ]
    torch_monitor = pytest.importorskip("torch.monitor")
    theirs = RecordingWriter()
    torch_handler = torch_monitor.TensorboardEventHandler(theirs)
    for e in events:
        torch_handler(torch_monitor.Event(e.name, e.timestamp, e.data))
    # torch's event data is unordered
    assert sorted(ours.calls, key=repr) == sorted(theirs.calls, key=repr)


def test_step_none_in_tensorboard_reads_step_0(tmp_path: Path) -> None:
    with tensorboardX.SummaryWriter(logdir=str(tmp_path)) as w:
        with registered(TensorboardEventHandler(w, step=None)), ManualClock(0) as clock:
            run_two_windows(clock)
    got = read_back(tmp_path)
    assert values(got) == {"lr.max": [0.5, 0.125], "lr.count": [2.0, 1.0]}
    assert steps(got) == {"lr.max": [0, 0], "lr.count": [0, 0]}


def test_step_callable_gives_the_step_of_each_window(tmp_path: Path) -> None:
    """The callable is asked once per Stat event; every scalar of the event gets
    its value. Other events keep their own steps (the ordinal or step_field)."""
    numpy = pytest.importorskip("numpy")
    global_step = [100]
    asked: list[int] = []

    def current() -> Any:
        asked.append(global_step[0])
        return numpy.int64(global_step[0])  # anything with __index__

    with tensorboardX.SummaryWriter(logdir=str(tmp_path)) as w:
        handler = TensorboardEventHandler(w, step=current, other_events=True)
        with registered(handler), ManualClock(0) as clock:
            s = Stat("lr", [Aggregation.MAX, Aggregation.COUNT], timedelta(seconds=1))
            s.add(0.5)
            global_step[0] = 250
            clock.advance(1000)
            s.add(0.25)  # closes window 1 at global step 250
            torchmon.log_event(epoch_event(1, 0.5))
            global_step[0] = 400
            del s
            gc.collect()
    got = read_back(tmp_path)
    assert asked == [250, 400]
    assert steps(got) == {
        "lr.max": [250, 400],
        "lr.count": [250, 400],
        "train.epoch_end/epoch": [0],
        "train.epoch_end/loss": [0],
    }
    assert values(got)["lr.max"] == [0.5, 0.25]


@pytest.mark.parametrize("returned", [1.5, "3", None, True])
def test_step_callable_returning_a_non_int_raises_type_error(returned: object) -> None:
    writer = RecordingWriter()
    handler = TensorboardEventHandler(writer, step=lambda: returned)
    with pytest.raises(TypeError, match=r"TensorboardEventHandler\(step\)"):
        handler(stat_event({"a.sum": 1.0}))
    assert writer.calls == []


def test_grouped_layout_puts_a_stats_aggregations_in_one_section(tmp_path: Path) -> None:
    """layout="grouped": "<stat>/<aggregation>" (TensorBoard's section is the
    part before the first "/"); a key that does not end in an aggregation name
    is kept; other events are unchanged."""
    with tensorboardX.SummaryWriter(logdir=str(tmp_path)) as w:
        handler = TensorboardEventHandler(w, layout="grouped", other_events=True)
        with registered(handler), ManualClock(0) as clock:
            run_two_windows(clock)
            torchmon.log_event(stat_event({"odd": 1.0, "x.total": 2.0, "y.value": 3.0}))
            torchmon.log_event(epoch_event(1, 0.5))
    got = read_back(tmp_path)
    assert values(got) == {
        "lr/max": [0.5, 0.125],
        "lr/count": [2.0, 1.0],
        "odd": [1.0],
        "x.total": [2.0],
        "y/value": [3.0],
        "train.epoch_end/epoch": [1.0],
        "train.epoch_end/loss": [0.5],
    }
    assert steps(got)["lr/max"] == [1, 2]


def test_each_tags_steps_reach_the_writer_in_increasing_order() -> None:
    """Windows closed by several threads at once: TensorBoard's loader takes a
    step lower than the previous one for a restart and drops the points after
    it, so each tag's steps must reach the writer in order."""

    class SlowWriter(RecordingWriter):
        def add_scalar(self, tag: str, value: float, **kwargs: Any) -> None:
            time.sleep(0)  # lets another thread run between taking a step and writing it
            super().add_scalar(tag, value, **kwargs)

    writer = SlowWriter()
    handler = TensorboardEventHandler(writer, other_events=True)

    def close_windows() -> None:
        for _ in range(300):
            handler(stat_event({"a.sum": 1.0, "a.count": 1.0}))
            handler(Event("e", datetime.now(), {"v": 1.0}))

    threads = [threading.Thread(target=close_windows) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for tag, expected in (("a.sum", range(1, 1201)), ("a.count", range(1, 1201))):
        assert [kw["global_step"] for t, _, kw in writer.calls if t == tag] == list(expected)
    assert [kw["global_step"] for t, _, kw in writer.calls if t == "e/v"] == list(range(1200))


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match=r"TensorboardEventHandler\(writer\)"):
        TensorboardEventHandler(object())  # type: ignore[arg-type]

    class Writer:
        def add_scalar(self, *args: Any, **kwargs: Any) -> None:
            pass

    with pytest.raises(TypeError, match=r"TensorboardEventHandler\(other_events\)"):
        TensorboardEventHandler(Writer(), other_events=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"TensorboardEventHandler\(step_field\)"):
        TensorboardEventHandler(Writer(), other_events=True, step_field=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"TensorboardEventHandler\(step_field\)"):
        TensorboardEventHandler(Writer(), step_field="epoch")
    with pytest.raises(TypeError):
        TensorboardEventHandler(Writer(), True)  # type: ignore[misc]  # keyword-only
    with pytest.raises(ValueError, match=r"TensorboardEventHandler\(step\): .*'windows'"):
        TensorboardEventHandler(Writer(), step="windows")
    with pytest.raises(TypeError, match=r"TensorboardEventHandler\(step\): .*int"):
        TensorboardEventHandler(Writer(), step=3)  # type: ignore[arg-type]

    class StepLessWriter:  # written for torch.monitor's calls
        def add_scalar(self, tag: str, value: float, walltime: float | None = None) -> None:
            pass

    with pytest.raises(TypeError, match=r"TensorboardEventHandler\(writer\): .*step=None"):
        TensorboardEventHandler(StepLessWriter())
    TensorboardEventHandler(StepLessWriter(), step=None)(stat_event({"a.sum": 1.0}))
    with pytest.raises(ValueError, match=r"TensorboardEventHandler\(layout\): .*'flat'"):
        TensorboardEventHandler(Writer(), layout="flat")
    with pytest.raises(TypeError, match=r"TensorboardEventHandler\(layout\)"):
        TensorboardEventHandler(Writer(), layout=None)  # type: ignore[arg-type]


def test_repr() -> None:
    class Writer:
        def add_scalar(self, *args: Any, **kwargs: Any) -> None:
            pass

        def __repr__(self) -> str:
            return "W"

    assert repr(TensorboardEventHandler(Writer())) == "TensorboardEventHandler(W)"
    assert (
        repr(TensorboardEventHandler(Writer(), other_events=True, step_field="epoch"))
        == "TensorboardEventHandler(W, other_events=True, step_field='epoch')"
    )
    assert (
        repr(TensorboardEventHandler(Writer(), step=None, layout="grouped"))
        == "TensorboardEventHandler(W, step=None, layout='grouped')"
    )


def _event_summaries(logdir: Path) -> list[int]:
    """The number of values of each summary Event in a log directory's files."""
    from tensorboard.backend.event_processing import event_file_loader

    counts = []
    for path in sorted(logdir.glob("*tfevents*")):
        for event in event_file_loader.EventFileLoader(str(path)).Load():
            if event.HasField("summary"):
                counts.append(len(event.summary.value))
    return counts


def _windows_through(writer: Any, **options: Any) -> None:
    with registered(TensorboardEventHandler(writer, **options)), ManualClock(0) as clock:
        s = Stat("sw", [Aggregation.MEAN, Aggregation.MAX, Aggregation.COUNT], timedelta(seconds=1))
        for values in ([1.0, 2.0], [float("nan")], [0.1, 1e40]):
            for v in values:
                s.add(v)
            clock.advance(1000)
        s._flush_window()
        del s
        gc.collect()


@pytest.mark.parametrize("step", ["window", None, "callable"])
@pytest.mark.parametrize("library", ["tensorboardX", "torch"])
def test_a_summary_writer_gets_one_summary_per_window_with_the_same_points(
    tmp_path: Path, library: str, step: Any
) -> None:
    """A library SummaryWriter gets each window as one Summary (its file
    writer's add_summary) instead of one add_scalar call per item; what
    TensorBoard reads back is what add_scalar per item writes, which a
    subclass overriding add_scalar still gets."""
    if library == "torch":
        writer_class = pytest.importorskip("torch.utils.tensorboard").SummaryWriter
    else:
        writer_class = tensorboardX.SummaryWriter

    class PerScalar(writer_class):  # type: ignore[misc, valid-type]
        def add_scalar(self, *args: Any, **kwargs: Any) -> Any:
            return super().add_scalar(*args, **kwargs)

    options: dict[str, Any] = {"step": step}
    if step == "callable":
        options["step"] = lambda: 7
    for name, cls in (("batched", writer_class), ("per-scalar", PerScalar)):
        writer = cls(str(tmp_path / name))
        _windows_through(writer, **options)
        writer.flush()
        writer.close()
    batched, per_scalar = read_back(tmp_path / "batched"), read_back(tmp_path / "per-scalar")
    assert sorted(batched) == ["sw.count", "sw.max", "sw.mean"]
    for tag, points in per_scalar.items():
        got = batched[tag]
        # (the wall times are the events' own, of two runs: not compared)
        assert [s for s, _, _ in got] == [s for s, _, _ in points], tag
        assert [str(v) for _, v, _ in got] == [str(v) for _, v, _ in points], tag
    # every tag of a window has that window's wall time
    assert len({tuple(w for _, _, w in points) for points in batched.values()}) == 1
    assert _event_summaries(tmp_path / "batched") == [3, 3, 3]
    assert _event_summaries(tmp_path / "per-scalar") == [1] * 9
