"""TensorboardEventHandler against real tensorboardX files, read back with
TensorBoard's own reader: the default (Stat events only) and the opt-in for
other events (``other_events``, ``step_field``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

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


@contextmanager
def registered(handler: Any) -> Iterator[None]:
    handle = torchmon.register_event_handler(handler)
    try:
        yield
    finally:
        torchmon.unregister_event_handler(handle)


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
    # as torch: no global_step (TensorBoard shows step 0), wall time from the event
    assert steps(got) == {"lr.max": [0, 0], "lr.count": [0, 0]}


def test_default_walltime_is_the_event_timestamp(tmp_path: Path) -> None:
    ts = datetime(2021, 3, 4, 5, 6, 7, 250000, tzinfo=timezone(timedelta(hours=2)))
    with tensorboardX.SummaryWriter(logdir=str(tmp_path)) as w:
        TensorboardEventHandler(w)(Event(torchmon.STAT_EVENT, ts, {"x.sum": 3.0}))
    ((step, value, wall),) = read_back(tmp_path)["x.sum"]
    assert (step, value) == (0, 3.0)
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
    assert steps(got)["lr.max"] == [0, 0]
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
