"""torchmon.Stat: windows, aggregations and the Stat event (docs/api.md, "Stat";
docs/internals.md, "Window algorithm").

Every time-based test drives the clock with ManualClock; window id = t_ms // window_ms + 1.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pytest

import torchmon
from torchmon import COUNT, MAX, MEAN, MIN, SUM, VALUE, Aggregation, Stat
from torchmon.testing import ManualClock

ALL = [VALUE, MEAN, COUNT, SUM, MAX, MIN]
SECOND = timedelta(seconds=1)


def zeros(aggs: list[Aggregation] = ALL) -> dict[Aggregation, float]:
    return dict.fromkeys(aggs, 0.0)


def sign(x: float) -> float:
    return math.copysign(1.0, x)


class Collect:
    """A handler that keeps events; register it with `registered(...)`."""

    def __init__(self) -> None:
        self.events: list[torchmon.Event] = []

    def __call__(self, event: torchmon.Event) -> None:
        self.events.append(event)


class registered:
    """Registers callbacks for the duration of a `with` block, in order."""

    def __init__(self, *callbacks: Any) -> None:
        self.callbacks = callbacks
        self.handles: list[torchmon.EventHandlerHandle] = []

    def __enter__(self) -> registered:
        for cb in self.callbacks:
            self.handles.append(torchmon.register_event_handler(cb))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self.handles:
            torchmon.unregister_event_handler(h)


# --- max_samples ---------------------------------------------------------


def test_max_samples_three_closes_the_window_on_the_third_add(recorder) -> None:
    with ManualClock(0):
        stat = Stat("s", ALL, SECOND, 3)
        stat.add(1.0)
        stat.add(2.0)
        assert stat.count == 2
        assert recorder.stat_data == []
        stat.add(3.0)
        assert stat.count == 0
        assert stat.get() == {VALUE: 3.0, MEAN: 2.0, COUNT: 3.0, SUM: 6.0, MAX: 3.0, MIN: 1.0}
        assert recorder.stat_data == [
            {
                "s.value": 3.0,
                "s.mean": 2.0,
                "s.count": 3.0,
                "s.sum": 6.0,
                "s.max": 3.0,
                "s.min": 1.0,
            }
        ]


def test_adds_after_max_samples_in_the_same_window_are_dropped(recorder) -> None:
    with ManualClock(0) as clock:
        stat = Stat("s", [SUM, COUNT], SECOND, 3)
        for v in (1.0, 2.0, 3.0):
            stat.add(v)
        clock.advance(500)  # still window 1
        stat.add(100.0)
        stat.add(200.0)
        assert stat.count == 0
        assert stat.get() == {SUM: 6.0, COUNT: 3.0}
        assert recorder.stat_data == [{"s.sum": 6.0, "s.count": 3.0}]


def test_first_add_after_a_max_samples_close_reports_zeros(recorder) -> None:
    with ManualClock(0) as clock:
        stat = Stat("s", ALL, SECOND, 3)
        for v in (1.0, 2.0, 3.0):
            stat.add(v)
        clock.advance(1000)  # window 2
        stat.add(5.0)
        # The empty remainder of window 1 was closed: get() shows zeros, no event for it.
        assert stat.get() == zeros()
        assert stat.count == 1
        assert len(recorder.stat_data) == 1
        clock.advance(1000)  # window 3
        stat.add(6.0)
        assert stat.get() == {VALUE: 5.0, MEAN: 5.0, COUNT: 1.0, SUM: 5.0, MAX: 5.0, MIN: 5.0}
        assert [d["s.sum"] for d in recorder.stat_data] == [6.0, 5.0]


def test_max_samples_closes_again_in_a_later_window(recorder) -> None:
    with ManualClock(0) as clock:
        stat = Stat("s", [SUM, COUNT], SECOND, 2)
        stat.add(1.0)
        stat.add(2.0)
        clock.advance(1000)
        stat.add(3.0)
        assert stat.count == 1
        stat.add(4.0)
        assert stat.count == 0
        assert stat.get() == {SUM: 7.0, COUNT: 2.0}
        assert recorder.stat_data == [
            {"s.sum": 3.0, "s.count": 2.0},
            {"s.sum": 7.0, "s.count": 2.0},
        ]


@pytest.mark.parametrize("max_samples", [1, 0, -1, -5, -(2**63), True])
def test_max_samples_at_most_one_behaves_like_one(recorder, max_samples: int) -> None:
    with ManualClock(0) as clock:
        stat = Stat("s", [SUM, COUNT], SECOND, max_samples)
        stat.add(1.0)
        assert stat.count == 0
        assert stat.get() == {SUM: 1.0, COUNT: 1.0}
        stat.add(2.0)  # same window, already closed: dropped
        assert stat.count == 0
        assert stat.get() == {SUM: 1.0, COUNT: 1.0}
        clock.advance(1000)
        stat.add(3.0)  # closes window 1's empty remainder, then window 2 at once
        assert stat.count == 0
        assert stat.get() == {SUM: 3.0, COUNT: 1.0}
        assert recorder.stat_data == [
            {"s.sum": 1.0, "s.count": 1.0},
            {"s.sum": 3.0, "s.count": 1.0},
        ]


def test_default_max_samples_is_unbounded(recorder) -> None:
    with ManualClock(0) as clock:
        stat = Stat("s", [COUNT, SUM], SECOND)
        for _ in range(5000):
            stat.add(1.0)
        assert stat.count == 5000
        assert recorder.stat_data == []
        clock.advance(1000)
        stat.add(1.0)
        assert stat.get() == {COUNT: 5000.0, SUM: 5000.0}


# --- idle windows and lazy emission --------------------------------------


def test_idle_windows_are_never_closed(recorder) -> None:
    with ManualClock(0) as clock:
        stat = Stat("s", [SUM, COUNT], SECOND)
        stat.add(1.0)  # window 1
        clock.advance(2000)  # window 3; window 2 stays idle
        stat.add(2.0)
        assert stat.get() == {SUM: 1.0, COUNT: 1.0}
        clock.advance(2000)  # window 5; window 4 idle
        stat.add(4.0)
        # get() reports the window that held 2, not the idle window 4.
        assert stat.get() == {SUM: 2.0, COUNT: 1.0}
        assert recorder.stat_data == [
            {"s.sum": 1.0, "s.count": 1.0},
            {"s.sum": 2.0, "s.count": 1.0},
        ]


def test_no_event_until_the_next_add_after_the_boundary(recorder) -> None:
    with ManualClock(0) as clock:
        stat = Stat("s", [SUM], SECOND)
        stat.add(1.0)
        stat.add(2.0)
        clock.advance(10_000)
        assert recorder.stat_data == []
        assert stat.get() == {SUM: 0.0}
        assert stat.count == 2
        stat.add(5.0)
        assert recorder.stat_data == [{"s.sum": 3.0}]
        assert stat.get() == {SUM: 3.0}
        assert stat.count == 1


# --- time windows --------------------------------------------------------


def test_first_window_is_aligned_to_the_boundary_not_to_creation(recorder) -> None:
    with ManualClock(1500) as clock:  # window 2 = [1000, 2000)
        stat = Stat("s", [SUM, COUNT], SECOND)
        stat.add(1.0)
        clock.set(1999)
        stat.add(2.0)
        assert recorder.stat_data == []
        assert stat.count == 2
        clock.set(2000)
        stat.add(4.0)
        assert recorder.stat_data == [{"s.sum": 3.0, "s.count": 2.0}]
        assert stat.count == 1


def test_advancing_zero_ms_stays_in_the_window(recorder) -> None:
    with ManualClock(0) as clock:
        stat = Stat("s", [SUM], SECOND)
        stat.add(1.0)
        clock.advance(0)
        stat.add(2.0)
        assert stat.count == 2
        assert recorder.stat_data == []


def test_advancing_less_than_a_window_stays_in_the_window(recorder) -> None:
    with ManualClock(0) as clock:
        stat = Stat("s", [SUM], SECOND)
        stat.add(1.0)
        clock.advance(999)
        stat.add(2.0)
        assert stat.count == 2
        assert recorder.stat_data == []


def test_advancing_exactly_one_window_closes_it(recorder) -> None:
    with ManualClock(0) as clock:
        stat = Stat("s", [SUM], SECOND)
        stat.add(1.0)
        clock.advance(1000)
        stat.add(2.0)
        assert stat.count == 1
        assert recorder.stat_data == [{"s.sum": 1.0}]
        assert stat.get() == {SUM: 1.0}


def test_advancing_several_windows_emits_one_event(recorder) -> None:
    with ManualClock(0) as clock:
        stat = Stat("s", [SUM, COUNT], SECOND)
        stat.add(1.0)
        stat.add(2.0)
        clock.advance(7300)
        stat.add(3.0)
        assert recorder.stat_data == [{"s.sum": 3.0, "s.count": 2.0}]
        assert stat.count == 1


def test_a_window_starting_mid_way_is_partial(recorder) -> None:
    with ManualClock(999) as clock:  # the last ms of window 1
        stat = Stat("s", [SUM], SECOND)
        stat.add(1.0)
        clock.advance(1)  # t=1000, window 2
        stat.add(2.0)
        assert recorder.stat_data == [{"s.sum": 1.0}]


def test_stats_with_the_same_window_size_share_boundaries(recorder) -> None:
    with ManualClock(300) as clock:
        a = Stat("a", [SUM], SECOND)
        a.add(1.0)
        clock.set(700)
        b = Stat("b", [SUM], SECOND)
        b.add(10.0)
        clock.set(999)
        a.add(2.0)
        b.add(20.0)
        assert recorder.stat_data == []
        clock.set(1000)
        a.add(0.0)
        b.add(0.0)
        assert recorder.stat_data == [{"a.sum": 3.0}, {"b.sum": 30.0}]
        clock.set(1999)
        b.add(0.0)
        a.add(0.0)
        assert len(recorder.stat_data) == 2
        clock.set(2000)
        b.add(0.0)
        a.add(0.0)
        assert recorder.stat_data[2:] == [{"b.sum": 0.0}, {"a.sum": 0.0}]


def test_window_size_as_float_seconds(recorder) -> None:
    with ManualClock(0) as clock:
        stat = Stat("s", [SUM], 1.5)  # 1500 ms
        stat.add(1.0)
        clock.set(1499)
        stat.add(2.0)
        assert recorder.stat_data == []
        clock.set(1500)
        stat.add(4.0)
        assert recorder.stat_data == [{"s.sum": 3.0}]


@pytest.mark.parametrize(
    "window",
    [0.0015, 0.0019999, 0.001, timedelta(microseconds=1999), timedelta(milliseconds=1)],
)
def test_window_size_is_truncated_to_one_ms(recorder, window: object) -> None:
    with ManualClock(10) as clock:
        stat = Stat("s", [SUM], window)
        stat.add(1.0)
        stat.add(2.0)
        clock.advance(1)
        stat.add(4.0)
        clock.advance(1)
        stat.add(8.0)
        assert recorder.stat_data == [{"s.sum": 3.0}, {"s.sum": 4.0}]


@pytest.mark.parametrize(("window", "ms"), [(1.001, 1001), (2.01, 2010), (0.0105, 10)])
def test_float_seconds_are_the_decimal_repr_shows_truncated(recorder, window, ms) -> None:
    """1.001 s is 1001 ms, although 1.001 * 1000 is 1000.9999999999999 and
    2.01 * 1000 is 2009.9999999999998 (docs/api.md; torch truncates the
    product, docs/compatibility.md)."""
    with ManualClock(0) as clock:
        stat = Stat("s", [SUM], window)
        stat.add(1.0)
        clock.set(ms - 1)
        stat.add(2.0)
        assert recorder.stat_data == []
        clock.set(ms)
        stat.add(4.0)
        assert recorder.stat_data == [{"s.sum": 3.0}]


@pytest.mark.parametrize("window", [1.0009, timedelta(microseconds=1_000_999)])
def test_window_size_truncation_drops_sub_millisecond_part(recorder, window: object) -> None:
    with ManualClock(0) as clock:
        stat = Stat("s", [SUM], window)  # 1000 ms, not 1001
        stat.add(1.0)
        clock.set(1000)
        stat.add(2.0)
        assert recorder.stat_data == [{"s.sum": 1.0}]


def test_window_size_as_timedelta_of_minutes(recorder) -> None:
    with ManualClock(0) as clock:
        stat = Stat("s", [COUNT], timedelta(minutes=1))
        stat.add(1.0)
        clock.set(59_999)
        stat.add(1.0)
        assert recorder.stat_data == []
        clock.set(60_000)
        stat.add(1.0)
        assert recorder.stat_data == [{"s.count": 2.0}]


# --- aggregations and get() ----------------------------------------------


def test_get_before_anything_closed_is_zeros() -> None:
    with ManualClock(0):
        stat = Stat("s", ALL, SECOND)
        assert stat.get() == zeros()
        stat.add(5.0)
        stat.add(7.0)
        assert stat.get() == zeros()


def test_get_reports_every_aggregation_of_the_closed_window() -> None:
    with ManualClock(0) as clock:
        stat = Stat("s", ALL, SECOND)
        for v in (4.0, -2.0, 10.0, 0.5):
            stat.add(v)
        clock.advance(1000)
        stat.add(99.0)
        assert stat.get() == {
            VALUE: 0.5,
            MEAN: 12.5 / 4,
            COUNT: 4.0,
            SUM: 12.5,
            MAX: 10.0,
            MIN: -2.0,
        }


def test_value_is_the_last_value_added_not_the_max(recorder) -> None:
    with ManualClock(0) as clock:
        stat = Stat("s", [VALUE], SECOND)
        stat.add(3.0)
        stat.add(9.0)
        stat.add(2.0)
        clock.advance(1000)
        stat.add(0.0)
        assert stat.get() == {VALUE: 2.0}
        assert recorder.stat_data == [{"s.value": 2.0}]


def test_count_aggregation_is_a_float_and_count_property_an_int(recorder) -> None:
    with ManualClock(0):
        stat = Stat("s", [COUNT], SECOND, 3)
        stat.add(1.0)
        stat.add(1.0)
        assert stat.count == 2
        assert type(stat.count) is int
        stat.add(1.0)
        assert stat.count == 0
        assert type(stat.count) is int
        got = stat.get()[COUNT]
        assert got == 3.0
        assert type(got) is float
        data = recorder.stat_data[0]
        assert data == {"s.count": 3.0}
        assert type(data["s.count"]) is float


def test_get_values_are_floats_for_integer_samples() -> None:
    with ManualClock(0):
        stat = Stat("s", ALL, SECOND, 2)
        stat.add(2)
        stat.add(4)
        for agg, v in stat.get().items():
            assert type(v) is float, agg


def test_get_keys_are_exactly_the_configured_members() -> None:
    with ManualClock(0):
        stat = Stat("s", [MIN, SUM], SECOND, 1)
        stat.add(3.0)
        got = stat.get()
        assert set(got) == {MIN, SUM}
        assert all(type(k) is Aggregation for k in got)
        assert got == {MIN: 3.0, SUM: 3.0}


def test_duplicate_aggregations_are_harmless(recorder) -> None:
    with ManualClock(0):
        stat = Stat("s", [SUM, SUM, COUNT, SUM, COUNT], SECOND, 2)
        stat.add(1.5)
        stat.add(2.5)
        assert stat.get() == {SUM: 4.0, COUNT: 2.0}
        assert recorder.stat_data == [{"s.sum": 4.0, "s.count": 2.0}]


def aggs_as_generator() -> Iterator[Aggregation]:
    yield SUM
    yield MAX


@pytest.mark.parametrize(
    "aggregations",
    [[SUM, MAX], (SUM, MAX), {SUM, MAX}, frozenset({SUM, MAX})],
    ids=["list", "tuple", "set", "frozenset"],
)
def test_aggregations_as_any_collection(aggregations: object) -> None:
    with ManualClock(0):
        stat = Stat("s", aggregations, SECOND, 2)
        stat.add(1.0)
        stat.add(5.0)
        assert stat.get() == {SUM: 6.0, MAX: 5.0}


def test_aggregations_as_generator() -> None:
    with ManualClock(0):
        stat = Stat("s", aggs_as_generator(), SECOND, 2)
        stat.add(1.0)
        stat.add(5.0)
        assert stat.get() == {SUM: 6.0, MAX: 5.0}


def test_aggregations_as_dict_keys_view() -> None:
    with ManualClock(0):
        stat = Stat("s", {MIN: "a", MEAN: "b"}.keys(), SECOND, 2)
        stat.add(1.0)
        stat.add(5.0)
        assert stat.get() == {MIN: 1.0, MEAN: 3.0}


def test_no_aggregations_still_emits_empty_events(recorder) -> None:
    with ManualClock(0) as clock:
        stat = Stat("s", [], SECOND)
        assert stat.get() == {}
        stat.add(1.0)
        stat.add(2.0)
        clock.advance(1000)
        stat.add(3.0)
        assert stat.get() == {}
        assert len(recorder.events) == 1
        assert recorder.events[0].name == "torch.monitor.Stat"
        assert recorder.events[0].data == {}


def test_no_aggregations_with_max_samples_emits_per_close(recorder) -> None:
    with ManualClock(0) as clock:
        stat = Stat("s", (), SECOND, 1)
        stat.add(1.0)
        clock.advance(1000)
        stat.add(1.0)
        assert recorder.stat_data == [{}, {}]


# --- signed zeros, NaN and infinities -------------------------------------


def test_lone_negative_zero_sum_and_mean_are_positive_zero() -> None:
    with ManualClock(0):
        stat = Stat("s", ALL, SECOND, 1)
        stat.add(-0.0)
        got = stat.get()
        assert got == {VALUE: 0.0, MEAN: 0.0, COUNT: 1.0, SUM: 0.0, MAX: 0.0, MIN: 0.0}
        assert sign(got[SUM]) == 1.0
        assert sign(got[MEAN]) == 1.0
        assert sign(got[MIN]) == -1.0
        assert sign(got[MAX]) == -1.0
        assert sign(got[VALUE]) == -1.0


def test_lone_negative_zero_signs_in_the_event(recorder) -> None:
    with ManualClock(0):
        stat = Stat("z", [SUM, MIN, MAX], SECOND, 1)
        stat.add(-0.0)
        data = recorder.stat_data[0]
        assert sign(data["z.sum"]) == 1.0
        assert sign(data["z.min"]) == -1.0
        assert sign(data["z.max"]) == -1.0


def test_negative_zero_then_zero_keeps_negative_zero_in_min_and_max() -> None:
    with ManualClock(0):
        stat = Stat("s", [MIN, MAX, SUM, VALUE], SECOND, 2)
        stat.add(-0.0)
        stat.add(0.0)
        got = stat.get()
        assert sign(got[MIN]) == -1.0
        assert sign(got[MAX]) == -1.0
        assert sign(got[SUM]) == 1.0
        assert sign(got[VALUE]) == 1.0


def test_zero_then_negative_zero_keeps_positive_zero_in_min_and_max() -> None:
    with ManualClock(0):
        stat = Stat("s", [MIN, MAX, VALUE], SECOND, 2)
        stat.add(0.0)
        stat.add(-0.0)
        got = stat.get()
        assert sign(got[MIN]) == 1.0
        assert sign(got[MAX]) == 1.0
        assert sign(got[VALUE]) == -1.0


def test_two_negative_zeros_sum_to_positive_zero() -> None:
    # 0.0 + -0.0 + -0.0 == +0.0 (the sum starts from +0.0)
    with ManualClock(0):
        stat = Stat("s", [SUM, MEAN], SECOND, 2)
        stat.add(-0.0)
        stat.add(-0.0)
        got = stat.get()
        assert sign(got[SUM]) == 1.0
        assert sign(got[MEAN]) == 1.0


def test_nan_first_sample_sticks_in_min_and_max() -> None:
    with ManualClock(0):
        stat = Stat("s", ALL, SECOND, 3)
        stat.add(float("nan"))
        stat.add(1.0)
        stat.add(5.0)
        got = stat.get()
        assert math.isnan(got[MIN])
        assert math.isnan(got[MAX])
        assert math.isnan(got[SUM])
        assert math.isnan(got[MEAN])
        assert got[VALUE] == 5.0
        assert got[COUNT] == 3.0


def test_later_nan_is_ignored_by_min_max_but_poisons_sum() -> None:
    with ManualClock(0):
        stat = Stat("s", ALL, SECOND, 3)
        stat.add(2.0)
        stat.add(float("nan"))
        stat.add(-4.0)
        got = stat.get()
        assert got[MIN] == -4.0
        assert got[MAX] == 2.0
        assert math.isnan(got[SUM])
        assert math.isnan(got[MEAN])
        assert got[VALUE] == -4.0
        assert got[COUNT] == 3.0


def test_nan_as_last_value_is_the_value() -> None:
    with ManualClock(0):
        stat = Stat("s", [VALUE, MAX], SECOND, 2)
        stat.add(1.0)
        stat.add(float("nan"))
        got = stat.get()
        assert math.isnan(got[VALUE])
        assert got[MAX] == 1.0


def test_infinity_propagates_through_sum_and_mean() -> None:
    with ManualClock(0):
        stat = Stat("s", [SUM, MEAN, MAX, MIN], SECOND, 2)
        stat.add(math.inf)
        stat.add(1.0)
        assert stat.get() == {SUM: math.inf, MEAN: math.inf, MAX: math.inf, MIN: 1.0}


def test_opposite_infinities_sum_to_nan() -> None:
    with ManualClock(0):
        stat = Stat("s", [SUM, MEAN, MAX, MIN], SECOND, 2)
        stat.add(math.inf)
        stat.add(-math.inf)
        got = stat.get()
        assert math.isnan(got[SUM])
        assert math.isnan(got[MEAN])
        assert got[MAX] == math.inf
        assert got[MIN] == -math.inf


def test_sum_overflow_gives_infinity() -> None:
    with ManualClock(0):
        stat = Stat("s", [SUM, MEAN], SECOND, 2)
        stat.add(1e308)
        stat.add(1e308)
        assert stat.get() == {SUM: math.inf, MEAN: math.inf}


def test_nan_in_the_event_data(recorder) -> None:
    with ManualClock(0):
        stat = Stat("s", [SUM, MIN], SECOND, 2)
        stat.add(1.0)
        stat.add(float("nan"))
        data = recorder.stat_data[0]
        assert math.isnan(data["s.sum"])
        assert data["s.min"] == 1.0


# --- destruction ---------------------------------------------------------


def test_destroying_the_stat_emits_the_open_window(recorder) -> None:
    with ManualClock(0):
        stat = Stat("gone", [SUM, COUNT], SECOND)
        stat.add(1.0)
        stat.add(2.0)
        assert recorder.stat_data == []
        del stat
        gc.collect()
        assert recorder.stat_data == [{"gone.sum": 3.0, "gone.count": 2.0}]


def test_destroying_a_stat_without_samples_emits_nothing(recorder) -> None:
    with ManualClock(0):
        stat = Stat("gone", [SUM], SECOND)
        del stat
        gc.collect()
        assert recorder.events == []


def test_destroying_after_a_max_samples_close_emits_nothing_more(recorder) -> None:
    with ManualClock(0):
        stat = Stat("gone", [SUM], SECOND, 2)
        stat.add(1.0)
        stat.add(2.0)
        stat.add(3.0)  # dropped
        del stat
        gc.collect()
        assert recorder.stat_data == [{"gone.sum": 3.0}]


def test_destroying_after_a_time_close_emits_only_the_open_window(recorder) -> None:
    with ManualClock(0) as clock:
        stat = Stat("gone", [SUM], SECOND)
        stat.add(1.0)
        clock.advance(1000)
        stat.add(2.0)
        stat.add(4.0)
        del stat
        gc.collect()
        assert recorder.stat_data == [{"gone.sum": 1.0}, {"gone.sum": 6.0}]


# --- the Stat event ------------------------------------------------------


def test_stat_event_format(recorder) -> None:
    with ManualClock(0):
        stat = Stat("loss", ALL, SECOND, 3)
        before = datetime.now()
        stat.add(3.0)
        stat.add(1.0)
        stat.add(2.0)
        after = datetime.now()
    assert len(recorder.events) == 1
    event = recorder.events[0]
    assert type(event) is torchmon.Event
    assert event.name == "torch.monitor.Stat"
    assert event.name == torchmon.STAT_EVENT
    ts = event.timestamp
    assert isinstance(ts, datetime)
    assert ts.tzinfo is None
    assert before - timedelta(seconds=1) <= ts <= after + timedelta(seconds=1)
    assert event.data == {
        "loss.value": 2.0,
        "loss.mean": 2.0,
        "loss.count": 3.0,
        "loss.sum": 6.0,
        "loss.max": 3.0,
        "loss.min": 1.0,
    }
    assert all(type(v) is float for v in event.data.values())


def test_stat_event_timestamp_is_wall_clock_not_the_manual_clock(recorder) -> None:
    with ManualClock(5):
        stat = Stat("s", [SUM], SECOND, 1)
        stat.add(1.0)
    assert abs(recorder.events[0].timestamp - datetime.now()) < timedelta(seconds=30)


def test_stat_event_keys_are_lower_case(recorder) -> None:
    with ManualClock(0):
        stat = Stat("Mixed.Case", [MAX, VALUE], SECOND, 1)
        stat.add(1.0)
    assert set(recorder.stat_data[0]) == {"Mixed.Case.max", "Mixed.Case.value"}


def test_each_handler_receives_its_own_stat_event() -> None:
    seen_first: list[torchmon.Event] = []
    seen_second: list[tuple[torchmon.Event, str, dict[str, object]]] = []

    def renamer(event: torchmon.Event) -> None:
        seen_first.append(event)
        event.name = "renamed"
        event.data = {"x": 1}

    def observer(event: torchmon.Event) -> None:
        seen_second.append((event, event.name, event.data))

    with ManualClock(0), registered(renamer, observer):
        stat = Stat("s", [SUM], SECOND, 1)
        stat.add(4.0)
        del stat
    assert len(seen_first) == 1
    assert len(seen_second) == 1
    event, name, data = seen_second[0]
    assert name == "torch.monitor.Stat"
    assert data == {"s.sum": 4.0}
    assert event is not seen_first[0]
    assert seen_first[0].name == "renamed"


def test_stat_event_reaches_every_registered_handler_in_order() -> None:
    order: list[str] = []
    with ManualClock(0), registered(lambda e: order.append("a"), lambda e: order.append("b")):
        stat = Stat("s", [SUM], SECOND, 1)
        stat.add(1.0)
        del stat
    assert order == ["a", "b"]


# --- handler exceptions during a close ------------------------------------


def test_handler_exception_on_max_samples_close_is_raised_and_state_committed() -> None:
    calls: list[dict[str, object]] = []

    def boom(event: torchmon.Event) -> None:
        calls.append(event.data)
        raise ValueError("handler failed")

    with ManualClock(0), registered(boom):
        stat = Stat("s", [SUM, COUNT], SECOND, 2)
        stat.add(1.0)
        with pytest.raises(ValueError, match="handler failed"):
            stat.add(2.0)
        assert stat.count == 0
        assert stat.get() == {SUM: 3.0, COUNT: 2.0}
        stat.add(3.0)  # the window is closed: dropped, no new dispatch
        assert stat.count == 0
        assert calls == [{"s.sum": 3.0, "s.count": 2.0}]
        del stat  # nothing open: no dispatch, nothing unraisable
        gc.collect()
    assert len(calls) == 1


def test_handler_exception_on_time_close_is_raised_and_not_re_flushed() -> None:
    calls: list[dict[str, object]] = []

    def boom_once(event: torchmon.Event) -> None:
        calls.append(event.data)
        if len(calls) == 1:
            raise RuntimeError("first close fails")

    with ManualClock(0) as clock, registered(boom_once):
        stat = Stat("s", [SUM], SECOND)
        stat.add(1.0)
        clock.advance(1000)
        with pytest.raises(RuntimeError, match="first close fails"):
            stat.add(2.0)
        assert stat.get() == {SUM: 1.0}
        stat.add(3.0)  # same window: the closed window is not dispatched again
        assert calls == [{"s.sum": 1.0}]
        clock.advance(1000)
        stat.add(0.0)
        assert len(calls) == 2
        assert calls[1] != {"s.sum": 1.0}
        assert stat.get() != {SUM: 1.0}
        del stat


# --- add() argument types ------------------------------------------------


class HasFloat:
    def __init__(self, v: float) -> None:
        self.v = v

    def __float__(self) -> float:
        return self.v


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (2.5, 2.5),
        (3, 3.0),
        (-7, -7.0),
        (2**53 + 1, float(2**53)),
        (2**1000, float(2**1000)),
        (True, 1.0),
        (False, 0.0),
        (np.float32(0.5), 0.5),
        (np.float64(-1.25), -1.25),
        (np.int64(42), 42.0),
        (np.int32(-3), -3.0),
        (HasFloat(6.75), 6.75),
    ],
    ids=[
        "float",
        "int",
        "negative-int",
        "int-rounded",
        "huge-int",
        "True",
        "False",
        "np.float32",
        "np.float64",
        "np.int64",
        "np.int32",
        "__float__",
    ],
)
def test_add_accepts_real_numbers(value: object, expected: float) -> None:
    with ManualClock(0):
        stat = Stat("s", [VALUE, SUM], SECOND, 1)
        stat.add(value)
        got = stat.get()
        assert got == {VALUE: expected, SUM: expected}
        assert type(got[VALUE]) is float


def test_add_accepts_a_zero_dim_tensor() -> None:
    torch = pytest.importorskip("torch")
    with ManualClock(0):
        stat = Stat("s", [VALUE], SECOND, 1)
        stat.add(torch.tensor(1.5))
        assert stat.get() == {VALUE: 1.5}


def test_add_returns_none() -> None:
    with ManualClock(0):
        stat = Stat("s", [SUM], SECOND)
        assert stat.add(1.0) is None


# --- name and repr -------------------------------------------------------


def test_name_property() -> None:
    assert Stat("my.loss", [SUM], SECOND).name == "my.loss"


def test_keyword_arguments() -> None:
    with ManualClock(0):
        stat = Stat(name="kw", aggregations=[SUM], window_size=SECOND, max_samples=2)
        stat.add(1.0)
        stat.add(1.0)
        assert stat.name == "kw"
        assert stat.get() == {SUM: 2.0}


@pytest.mark.parametrize(
    "name",
    ["a\x00b", "\x00", "caf\u00e9", "\u2603 snow", "emoji \U0001f600", "tab\tnew\nline", ""],
)
def test_str_names_are_kept_exactly(recorder, name: str) -> None:
    with ManualClock(0):
        stat = Stat(name, [SUM], SECOND, 1)
        assert stat.name == name
        assert type(stat.name) is str
        stat.add(1.0)
    assert recorder.stat_data == [{f"{name}.sum": 1.0}]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"loss", "loss"),
        (b"caf\xc3\xa9", "caf\u00e9"),
        (b"a\x00b", "a\x00b"),
        (bytearray(b"\xe2\x98\x83"), "\u2603"),
    ],
)
def test_bytes_names_are_decoded_as_utf8(recorder, raw: bytes, expected: str) -> None:
    with ManualClock(0):
        stat = Stat(raw, [SUM], SECOND, 1)
        assert stat.name == expected
        assert type(stat.name) is str
        stat.add(2.0)
    assert recorder.stat_data == [{f"{expected}.sum": 2.0}]


@pytest.mark.parametrize("char", ["a", "\u00e9", "\U0001f600"])
def test_names_up_to_200_characters_are_taken(recorder, char: str) -> None:
    """The limit counts characters, not UTF-8 bytes (docs/api.md, "Stat")."""
    name = char * 200
    with ManualClock(0):
        stat = Stat(name, [SUM], SECOND, 1)
        stat.add(1.0)
    assert recorder.stat_data == [{f"{name}.sum": 1.0}]


@pytest.mark.parametrize("length", [201, 282, 1 << 20])
def test_longer_names_are_a_value_error(length: int) -> None:
    with pytest.raises(
        ValueError, match=rf"^Stat\(name\): name must be at most 200 characters .*got {length}$"
    ):
        Stat("x" * length, [SUM], SECOND)
    with pytest.raises(ValueError, match=r"^Stat\(name\): name must be at most 200"):
        Stat(b"x" * length, [SUM], SECOND)


def test_the_limit_is_public() -> None:
    assert torchmon.MAX_STAT_NAME_LENGTH == 200


def test_str_subclass_name_is_a_plain_str() -> None:
    class Name(str):
        pass

    stat = Stat(Name("sub"), [SUM], SECOND)
    assert stat.name == "sub"
    assert type(stat.name) is str


def test_repr_contains_the_name() -> None:
    text = repr(Stat("my_special_stat", [SUM], SECOND))
    assert "my_special_stat" in text
    assert "object at 0x" not in text


# --- many Stats ----------------------------------------------------------


def test_many_stats_alive_at_once(recorder) -> None:
    n = 500
    with ManualClock(0) as clock:
        stats = [Stat(f"s{i}", [SUM, COUNT], SECOND) for i in range(n)]
        for i, stat in enumerate(stats):
            stat.add(float(i))
            stat.add(1.0)
        assert recorder.stat_data == []
        clock.advance(1000)
        for stat in stats:
            stat.add(0.0)
        assert len(recorder.stat_data) == n
        merged: dict[str, object] = {}
        for data in recorder.stat_data:
            merged.update(data)
        for i in range(n):
            assert merged[f"s{i}.sum"] == float(i) + 1.0
            assert merged[f"s{i}.count"] == 2.0
        for i, stat in enumerate(stats):
            assert stat.get() == {SUM: float(i) + 1.0, COUNT: 2.0}
            assert stat.count == 1
        del stats, stat
        gc.collect()
    # Each Stat's open window (one 0.0 sample) was emitted on destruction.
    assert len(recorder.stat_data) == 2 * n
    closing = sorted(recorder.stat_data[n:], key=lambda d: int(next(iter(d)).split(".")[0][1:]))
    assert closing == [{f"s{i}.sum": 0.0, f"s{i}.count": 1.0} for i in range(n)]


def test_stats_with_different_windows_are_independent(recorder) -> None:
    with ManualClock(0) as clock:
        fast = Stat("fast", [SUM], timedelta(milliseconds=100))
        slow = Stat("slow", [SUM], SECOND)
        for _ in range(10):
            fast.add(1.0)
            slow.add(1.0)
            clock.advance(100)
        fast.add(0.0)
        slow.add(0.0)
        fast_events = [d for d in recorder.stat_data if "fast.sum" in d]
        slow_events = [d for d in recorder.stat_data if "slow.sum" in d]
        assert fast_events == [{"fast.sum": 1.0}] * 10
        assert slow_events == [{"slow.sum": 10.0}]


def test_repr_of_windows_longer_than_a_timedelta_holds() -> None:
    """The constructor takes windows up to 2**63 - 1 ms as float seconds,
    beyond timedelta.max (docs/api.md, repr)."""
    longest = timedelta.max // timedelta(milliseconds=1)
    as_timedelta = timedelta(milliseconds=longest)
    assert f"window_size={as_timedelta!r}," in repr(Stat("s", [SUM], timedelta.max))
    assert "window_size=1000000000000000.000," in repr(Stat("s", [SUM], 1e15))
    text = repr(Stat("s", [SUM], (longest + 1) / 1000))
    assert f"window_size={(longest + 1) // 1000}.{(longest + 1) % 1000:03}," in text


@pytest.mark.parametrize("window_ms", [1, 3])
def test_windows_close_at_the_last_milliseconds_of_the_manual_clock(recorder, window_ms) -> None:
    """ManualClock goes up to 2**63 - 1 ms (docs/api.md); windows close there too."""
    last = 2**63 - 1
    with ManualClock(last - 5) as clock:
        stat = Stat("s", [SUM], timedelta(milliseconds=window_ms))
        for t in range(last - 5, last + 1):
            clock.set(t)
            stat.add(float(t - (last - 5)))  # 0.0 to 5.0, one per millisecond
    sums: dict[int, float] = {}
    for t in range(last - 5, last + 1):
        sums[t // window_ms] = sums.get(t // window_ms, 0.0) + float(t - (last - 5))
    closed = list(sums.values())[:-1]  # the last window is still open
    assert recorder.stat_data == [{"s.sum": value} for value in closed]
    assert stat.count == sum(
        1 for t in range(last - 5, last + 1) if t // window_ms == last // window_ms
    )
