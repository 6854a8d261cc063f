"""STDDEV and P50 ... P999 of a Stat, and the window event's distribution
(docs/api.md, "STDDEV and P50 … P999 (extensions)" and "Distribution")."""

from __future__ import annotations

import copy
import math
import pickle
import random
import statistics
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pytest
from conformance import model

import torchmon
from torchmon import (
    COUNT,
    MAX,
    MEAN,
    MIN,
    P50,
    P90,
    P95,
    P99,
    P999,
    STDDEV,
    SUM,
    VALUE,
    Aggregation,
    Stat,
)
from torchmon.testing import ManualClock

HOUR = timedelta(hours=1)
TS = datetime(2020, 1, 1)
QUANTILES = {P50: 500, P90: 900, P95: 950, P99: 990, P999: 999}
TWELVE = [VALUE, MEAN, COUNT, SUM, MAX, MIN, STDDEV, P50, P90, P95, P99, P999]


def one_window(
    samples: list[float], aggregations: list[Aggregation] = TWELVE, max_samples: int | None = None
) -> tuple[dict[Aggregation, float], list[torchmon.Event]]:
    """Adds ``samples`` in one window, closes it, returns get() and the events."""
    events: list[torchmon.Event] = []
    handle = torchmon.register_event_handler(events.append)
    try:
        with ManualClock(0) as clock:
            if max_samples is None:
                stat = Stat("s", aggregations, HOUR)
            else:
                stat = Stat("s", aggregations, HOUR, max_samples)
            for v in samples:
                stat.add(v)
            clock.advance(3_600_000)
            stat.add(0.0)
            got = stat.get()
    finally:
        torchmon.unregister_event_handler(handle)
    return got, [e for e in events if e.name == torchmon.STAT_EVENT]


def exact_quantile(samples: list[float], k: int) -> float:
    """The sample of rank max(1, ceil(k*n/1000)) among the non-NaN ones."""
    ordered = sorted(x for x in samples if not math.isnan(x))
    rank = max(1, -(-k * len(ordered) // 1000))
    return ordered[rank - 1]


def assert_close(got: float, exact: float, bound: float = 0.01) -> None:
    if math.isinf(exact) or exact == 0.0:
        assert got == exact
    else:
        assert abs(got - exact) <= bound * abs(exact), (got, exact)


def test_members_values_aliases_and_keys() -> None:
    for name, value in [("STDDEV", 7), ("P50", 8), ("P90", 9), ("P95", 10), ("P99", 11)]:
        member = getattr(Aggregation, name)
        assert member.value == value
        assert getattr(torchmon, name) is member
    assert Aggregation.P999.value == 12
    _, (event,) = one_window([1.0, 2.0])
    assert list(event.data) == [
        "s.value", "s.mean", "s.count", "s.sum", "s.max", "s.min",
        "s.stddev", "s.p50", "s.p90", "s.p95", "s.p99", "s.p999",
    ]  # fmt: skip


def test_bucket_midpoints_are_the_documented_table() -> None:
    expected = model.BUCKET_MIDPOINTS  # the reference model's copy of docs/api.md's table
    assert torchmon._core._BUCKET_MIDPOINTS == expected
    assert all(type(m) is float for m in torchmon._core._BUCKET_MIDPOINTS)


def test_get_on_known_data() -> None:
    got, (event,) = one_window([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0])
    assert got[STDDEV] == 2.0
    assert got[COUNT] == 8.0 and got[MEAN] == 5.0
    # Rank 8 of 8 is MAX exactly; rank 4 is a 4.0, estimated.
    assert got[P999] == 9.0
    assert_close(got[P50], 4.0, 0.0055)
    assert all(type(got[a]) is float for a in TWELVE)
    assert event.data["s.stddev"] == got[STDDEV]
    assert event.data["s.p50"] == got[P50]


def test_stddev_of_a_large_offset_with_unit_noise_is_about_one() -> None:
    rng = random.Random(5)
    samples = [1e9 + rng.gauss(0.0, 1.0) for _ in range(20_000)]
    got, _ = one_window(samples, [STDDEV])
    exact = statistics.pstdev(samples)
    assert abs(got[STDDEV] - exact) <= 1e-6 * exact
    assert 0.95 < got[STDDEV] < 1.05


@pytest.mark.parametrize(
    "family",
    ["lognormal", "negative", "zeros", "subnormal", "infinities", "nan", "bimodal"],
)
def test_quantiles_are_within_one_percent_of_the_exact_ones(family: str) -> None:
    rng = random.Random(family)
    base = [rng.lognormvariate(0.0, 2.0) for _ in range(3000)]
    samples: list[float] = {
        "lognormal": base,
        "negative": [-x for x in base] + base[:500],
        "zeros": base[:1000] + [0.0] * 1000 + [-0.0] * 500 + [-x for x in base[:500]],
        "subnormal": [x * 5e-324 * 1e3 for x in base] + [5e-324] * 10,
        "infinities": base + [math.inf] * 40 + [-math.inf] * 40,
        "nan": base + [math.nan] * 300,
        "bimodal": base[:1500] + [1e6 + x for x in base[1500:]],
    }[family]
    rng.shuffle(samples)
    got, (event,) = one_window(samples)
    for aggregation, k in QUANTILES.items():
        assert_close(got[aggregation], exact_quantile(samples, k))
        # The event's Distribution computes the same value.
        assert event.distribution is not None
        assert event.distribution.quantile(k / 1000) == got[aggregation]


def test_edge_windows() -> None:
    all_nan, _ = one_window([math.nan, math.nan])
    assert all(math.isnan(all_nan[a]) for a in QUANTILES)
    assert math.isnan(all_nan[STDDEV])
    with_inf, _ = one_window([1.0, math.inf])
    assert math.isnan(with_inf[STDDEV])
    assert with_inf[P999] == math.inf
    single, _ = one_window([3.5])
    assert single[STDDEV] == 0.0
    assert all(single[a] == 3.5 for a in QUANTILES)
    # An empty window (nothing closed yet): zeros.
    stat = Stat("e", TWELVE, HOUR)
    assert stat.get() == dict.fromkeys(TWELVE, 0.0)


def test_max_samples_drops_apply_to_the_new_aggregations() -> None:
    samples = [float(v) for v in range(1, 201)]
    _, (event,) = one_window(samples, TWELVE, max_samples=100)
    # get() now shows the empty remainder of the full window (as torch): the
    # event carries the full one.
    got = {a: event.data[f"s.{a.name.lower()}"] for a in TWELVE}
    kept = samples[:100]
    assert got[COUNT] == 100.0
    assert got[STDDEV] == pytest.approx(statistics.pstdev(kept), rel=1e-12)
    for aggregation, k in QUANTILES.items():
        assert_close(got[aggregation], exact_quantile(kept, k))
    assert event.distribution is not None
    assert event.distribution.count == 100
    assert sum(c for _, c in event.distribution.positive) == 100


def window_of(add: Any, samples: list[float]) -> dict[Aggregation, float]:
    with ManualClock(0) as clock:
        stat = Stat("s", TWELVE, HOUR)
        add(stat, samples)
        clock.advance(3_600_000)
        stat.add(0.0)
        return stat.get()


def test_add_many_equals_adds() -> None:
    rng = random.Random(3)
    samples = [rng.lognormvariate(3.0, 1.5) * rng.choice([-1, 1]) for _ in range(5000)]
    samples += [0.0, math.inf, math.nan, 1e-310]
    looped = window_of(lambda s, xs: [s.add(x) for x in xs], samples)
    batched = window_of(lambda s, xs: s.add_many(np.array(xs)), samples)
    listed = window_of(lambda s, xs: s.add_many(xs), samples)
    for a in TWELVE:
        assert math.isnan(looped[a]) or looped[a] == batched[a] == listed[a], a
    assert math.isnan(looped[STDDEV]) and math.isnan(batched[STDDEV])
    finite = samples[:5000]
    a = window_of(lambda s, xs: [s.add(x) for x in xs], finite)
    b = window_of(lambda s, xs: s.add_many(np.array(xs)), finite)
    assert a == b


def test_distribution_is_present_exactly_when_a_p_aggregation_is_configured() -> None:
    _, (with_p,) = one_window([1.0, -2.0, 0.0, math.inf], [COUNT, P90])
    d = with_p.distribution
    assert d is not None
    assert (d.count, d.sum, d.min, d.max) == (4, math.inf, -2.0, math.inf)
    assert (d.zero_count, d.nan_count, d.positive_inf_count, d.negative_inf_count) == (1, 0, 1, 0)
    assert d.positive == ((-1, 1),) and d.negative == ((63, 1),)
    assert d.scale == 6
    assert "distribution" not in with_p.data and set(with_p.data) == {"s.count", "s.p90"}
    for aggregations in ([COUNT], [STDDEV, MEAN], [VALUE, MEAN, COUNT, SUM, MAX, MIN]):
        _, (event,) = one_window([1.0], aggregations)
        assert event.distribution is None
    user_made = torchmon.Event("e", with_p.timestamp, {"a": 1})
    assert user_made.distribution is None
    with pytest.raises(AttributeError):
        user_made.distribution = d  # type: ignore[misc]


def test_every_handler_sees_the_same_distribution() -> None:
    events: list[torchmon.Event] = []
    handles = [torchmon.register_event_handler(events.append) for _ in range(2)]
    try:
        with ManualClock(0) as clock:
            stat = Stat("s", [P50], HOUR)
            stat.add(1.0)
            clock.advance(3_600_000)
            stat.add(2.0)
    finally:
        for h in handles:
            torchmon.unregister_event_handler(h)
    first, second = events
    assert first is not second
    assert first.distribution is second.distribution


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_a_pickled_window_event_keeps_its_distribution(protocol: int) -> None:
    """docs/api.md, "Event": pickling a window event (a multiprocessing queue)
    keeps event.distribution, as AsyncEventHandler's copy does."""
    _, (event,) = one_window([1.0, 2.0, 1000.0, -3.0], [COUNT, P90])
    back = pickle.loads(pickle.dumps(event, protocol=protocol))
    assert type(back) is torchmon.Event
    assert (back.name, back.timestamp, back.data) == (event.name, event.timestamp, event.data)
    assert back.distribution is not None
    assert back.distribution == event.distribution
    assert back.distribution.count == 4 and back.distribution.max == 1000.0


def test_a_copied_window_event_keeps_its_distribution() -> None:
    _, (event,) = one_window([5.0, 7.0], [P50])
    for duplicate in (copy.copy(event), copy.deepcopy(event)):
        assert duplicate is not event
        assert duplicate.data == event.data
        assert duplicate.distribution == event.distribution


def test_a_pickle_naming_a_wrong_distribution_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"distribution must be a torchmon\.Distribution"):
        torchmon._core._event_with_distribution("e", TS, {}, {"count": 1})


def test_bad_input_is_unchanged() -> None:
    stat = Stat("s", TWELVE, HOUR)
    with pytest.raises(TypeError):
        stat.add("1.0")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        stat.add_many([1.0, "x"])  # type: ignore[list-item]
    assert stat.count == 0
    with pytest.raises(ValueError, match="valid values: 1 to 12"):
        Aggregation(13)
