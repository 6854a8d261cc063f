"""`Stat.add_many(values)`: exactly a loop of `add()` at one instant.

Every test runs a batched Stat and a twin fed one value at a time, under the
same ManualClock, and compares what their handlers received and what they
report afterwards.
"""

from __future__ import annotations

import array
import math
from collections.abc import Iterator
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import torchmon
from torchmon.testing import ManualClock

ALL = [
    torchmon.VALUE,
    torchmon.MEAN,
    torchmon.COUNT,
    torchmon.SUM,
    torchmon.MAX,
    torchmon.MIN,
]


class Twins:
    """A Stat fed in batches and one fed value by value, with their events."""

    def __init__(self, aggregations: list[torchmon.Aggregation], window_s: float, max_samples: int):
        args: tuple[Any, ...] = (aggregations, window_s)
        if max_samples:
            args += (max_samples,)
        self.batched = torchmon.Stat("batched", *args)
        self.looped = torchmon.Stat("looped", *args)
        self.events: dict[str, list[dict[str, float]]] = {"batched": [], "looped": []}

    def __call__(self, event: torchmon.Event) -> None:
        data = event.data
        stat = next(iter(data)).partition(".")[0]
        self.events[stat].append({key.partition(".")[2]: v for key, v in data.items()})

    def feed(self, batch: Any, one_by_one: list[Any]) -> None:
        self.batched.add_many(batch)
        for value in one_by_one:
            self.looped.add(value)

    def assert_same(self) -> None:
        assert same(self.events["batched"], self.events["looped"])
        assert self.batched.count == self.looped.count
        batched_get = {a.name: v for a, v in self.batched.get().items()}
        looped_get = {a.name: v for a, v in self.looped.get().items()}
        assert same(batched_get, looped_get)


def same(a: Any, b: Any) -> bool:
    """Equality that treats NaN as equal to NaN and tells -0.0 from 0.0."""
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(type(a) is type(b) and a == b)


@pytest.fixture
def registered() -> Iterator[Callable[[Twins], Twins]]:
    handles = []

    def register(twins: Twins) -> Twins:
        handles.append(torchmon.register_event_handler(twins))
        return twins

    yield register
    for handle in handles:
        torchmon.unregister_event_handler(handle)


floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e308, -1e308, 5e-324, math.nan, math.inf, -math.inf]),
    st.integers(-1000, 1000).map(float),
)
int64s = st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-1000, 1000))
int32s = st.integers(-(2**31), 2**31 - 1)


@st.composite
def batches(draw: st.DrawFn) -> tuple[Any, list[Any]]:
    """A container of values, and the values the loop adds one by one."""
    kind = draw(
        st.sampled_from(
            [
                "list",
                "tuple",
                "generator",
                "f64",
                "f64 strided",
                "f32",
                "i64",
                "i32",
                "u8",
                "array d",
                "array q",
                "memoryview",
                "mixed list",
                "f16",
                "bool array",
                "big-endian f64",
            ]
        )
    )
    size = st.integers(0, 12)
    if kind in ("list", "tuple", "generator"):
        values = draw(st.lists(floats, max_size=12))
        container = {"list": list, "tuple": tuple, "generator": lambda v: (x for x in v)}[kind]
        return container(values), values
    if kind == "mixed list":
        values = draw(st.lists(st.one_of(floats, int64s, st.booleans(), int32s), max_size=12))
        return values, values
    if kind in ("f64", "f64 strided", "array d", "memoryview", "big-endian f64"):
        values = draw(st.lists(floats, max_size=12))
        if kind == "array d":
            return array.array("d", values), values
        if kind == "memoryview":
            return memoryview(array.array("d", values)), values
        if kind == "big-endian f64":
            return np.array(values, dtype=">f8"), values
        if kind == "f64 strided":
            doubled = np.repeat(np.array(values, dtype=np.float64), 2)
            return doubled[::2], values
        return np.array(values, dtype=np.float64), values
    if kind in ("f32", "f16"):
        dtype, width = (np.float32, 32) if kind == "f32" else (np.float16, 16)
        arr = np.array(draw(st.lists(st.floats(width=width), max_size=12)), dtype=dtype)
        # What the loop sees: each element as a Python float, exactly.
        return arr, [float(x) for x in arr]
    if kind in ("i64", "array q"):
        values = draw(st.lists(int64s, max_size=12))
        if kind == "array q":
            return array.array("q", values), values
        return np.array(values, dtype=np.int64), values
    if kind == "i32":
        values = draw(st.lists(int32s, max_size=12))
        return np.array(values, dtype=np.int32), values
    if kind == "u8":
        values = draw(st.lists(st.integers(0, 255), max_size=draw(size)))
        return bytes(values), values
    values = draw(st.lists(st.booleans(), max_size=12))
    return np.array(values, dtype=np.bool_), values


@pytest.mark.hypothesis_suite
@given(
    aggregations=st.lists(st.sampled_from(ALL), min_size=1, max_size=6, unique=True),
    window_ms=st.sampled_from([1, 10, 1000, 3_600_000]),
    max_samples=st.sampled_from([0, 1, 2, 3, 5, 17]),
    program=st.lists(st.tuples(st.sampled_from([0, 0, 1, 5, 10, 1000]), batches()), max_size=8),
)
def test_add_many_is_a_loop_of_add_at_one_instant(
    aggregations: list[torchmon.Aggregation],
    window_ms: int,
    max_samples: int,
    program: list[tuple[int, tuple[Any, list[Any]]]],
) -> None:
    with ManualClock(1_000_000) as clock:
        twins = Twins(aggregations, window_ms / 1000, max_samples)
        handle = torchmon.register_event_handler(twins)
        try:
            for advance_ms, (batch, one_by_one) in program:
                clock.advance(advance_ms)
                twins.feed(batch, one_by_one)
                twins.assert_same()
            del twins.batched, twins.looped  # the destruction flush, too
            assert same(twins.events["batched"], twins.events["looped"])
        finally:
            torchmon.unregister_event_handler(handle)


def test_max_samples_closes_once_and_drops_the_rest(
    registered: Callable[[Twins], Twins],
) -> None:
    with ManualClock(0):
        twins = registered(Twins([torchmon.COUNT, torchmon.SUM], 60.0, 3))
        twins.feed(np.arange(10.0), list(np.arange(10.0)))
        assert twins.events["batched"] == [{"count": 3, "sum": 3.0}]
        twins.assert_same()
        assert twins.batched.count == 0  # the rest of the window is dropped


def test_first_value_closes_the_previous_window(registered: Callable[[Twins], Twins]) -> None:
    with ManualClock(0) as clock:
        twins = registered(Twins([torchmon.COUNT, torchmon.MAX], 1.0, 0))
        twins.feed([1.0, 7.0], [1.0, 7.0])
        clock.advance(1000)
        twins.feed(np.array([2.0, 3.0]), [2.0, 3.0])
        assert twins.events["batched"] == [{"count": 2, "max": 7.0}]
        twins.assert_same()
        assert twins.batched.count == 2


def test_a_bad_value_adds_nothing_and_is_named() -> None:
    stat = torchmon.Stat("s", [torchmon.COUNT], 60.0)
    with pytest.raises(TypeError, match=r"values\[2\] must be a real number.*str"):
        stat.add_many([1.0, 2.0, "3", 4.0])
    assert stat.count == 0


@pytest.mark.parametrize(
    "values, error, message",
    [
        (5, TypeError, r"values must be a buffer or an iterable of real numbers, not int"),
        (None, TypeError, r"not NoneType"),
        (np.zeros((2, 2)), ValueError, r"one-dimensional, not a 2-dimensional buffer"),
        (np.float64(3.0), TypeError, r"values must be a buffer or an iterable"),
        ("abc", TypeError, r"values\[0\] must be a real number"),
        ([[1.0]], TypeError, r"values\[0\] must be a real number.*list"),
    ],
)
def test_bad_arguments(values: Any, error: type[Exception], message: str) -> None:
    stat = torchmon.Stat("s", [torchmon.COUNT], 60.0)
    with pytest.raises(error, match=message):
        stat.add_many(values)
    assert stat.count == 0


def test_an_iterator_that_raises_adds_nothing() -> None:
    def values() -> Iterator[float]:
        yield 1.0
        raise RuntimeError("source failed")

    stat = torchmon.Stat("s", [torchmon.COUNT], 60.0)
    with pytest.raises(RuntimeError, match="source failed"):
        stat.add_many(values())
    assert stat.count == 0


def test_large_contiguous_array_counts_every_value() -> None:
    stat = torchmon.Stat("s", [torchmon.COUNT, torchmon.SUM, torchmon.MIN], 3600.0)
    values = np.arange(1_000_000, dtype=np.float64)
    stat.add_many(values)
    assert stat.count == 1_000_000
    stat.add_many(values[::-1])  # negative strides: read through a copy
    assert stat.count == 2_000_000


def test_handler_errors_are_raised_after_every_value_was_added() -> None:
    def failing(event: torchmon.Event) -> None:
        raise ValueError("sink down")

    handle = torchmon.register_event_handler(failing)
    try:
        with ManualClock(0):
            stat = torchmon.Stat("s", [torchmon.COUNT], 60.0, 2)
            with pytest.raises(ValueError, match="sink down"):
                stat.add_many([1.0, 2.0, 3.0])
            assert {a.name: v for a, v in stat.get().items()} == {"COUNT": 2}
            del stat
    finally:
        torchmon.unregister_event_handler(handle)
