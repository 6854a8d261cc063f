"""The reference model's STDDEV, Pq and histogram (docs/api.md, "Aggregation"),
checked against hand-computed values and against definitions evaluated a
second way (Fraction powers, the statistics module), not against torchmon."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterator
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from . import model

TINY = 2.0**-1074  # the smallest subnormal
NAN, INF = math.nan, math.inf


def in_bucket(x: float, i: int) -> bool:
    """The definition of bucket i, by exact rational powers."""
    return Fraction(2) ** i < Fraction(abs(x)) ** 64 <= Fraction(2) ** (i + 1)


# -- the midpoint table ---------------------------------------------------------


@pytest.mark.parametrize("j", range(64))
def test_midpoint_is_2_to_the_j_plus_half_over_64_correctly_rounded(j: int) -> None:
    m = model.BUCKET_MIDPOINTS[j]
    half_ulp = Fraction(math.ulp(m)) / 2
    target = Fraction(2) ** (2 * j + 1)  # (2**((j + 0.5) / 64)) ** 128
    assert (Fraction(m) - half_ulp) ** 128 < target < (Fraction(m) + half_ulp) ** 128


def test_midpoint_table_has_64_increasing_entries() -> None:
    mids = model.BUCKET_MIDPOINTS
    assert len(mids) == 64
    assert all(a < b for a, b in zip(mids, mids[1:]))
    assert 1.0 < mids[0] and mids[-1] < 2.0


# -- the bucket index ---------------------------------------------------------


@pytest.mark.parametrize("k", [-1074, -1073, -1023, -1022, -1, 0, 1, 10, 1023])
def test_powers_of_two_are_the_upper_bound_of_their_bucket(k: int) -> None:
    x = 2.0**k
    assert model.bucket_index(x) == 64 * k - 1
    assert model.bucket_index(-x) == 64 * k - 1
    if k >= -1022:  # the next double is in the next bucket (subnormals are coarser)
        assert model.bucket_index(math.nextafter(x, INF)) == 64 * k


def test_hand_computed_indexes() -> None:
    assert model.bucket_index(1.0) == -1
    assert model.bucket_index(2.0) == 63
    assert model.bucket_index(3.0) == 101  # 64 * log2(3) = 101.44
    assert model.bucket_index(1e-300) == math.floor(64 * math.log2(1e-300))  # -63781.7
    assert model.bucket_index(math.nextafter(0.0, 1.0)) == -68737
    assert model.bucket_index(1.7976931348623157e308) == 65535


finite_nonzero = st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: x != 0.0)


@given(finite_nonzero)
def test_bucket_index_satisfies_the_definition(x: float) -> None:
    assert in_bucket(x, model.bucket_index(x))


@given(st.integers(min_value=1, max_value=2**52 - 1))
def test_subnormal_index_satisfies_the_definition(m: int) -> None:
    assert in_bucket(m * TINY, model.bucket_index(m * TINY))


# -- the representative and its error (docs/api.md: 0.55%, 1% for subnormals) ---


def test_subnormal_estimates_within_one_percent() -> None:
    for m in range(1, 1200):  # beyond, a bucket holds >= 12 doubles
        x = m * TINY
        i = model.bucket_index(x)
        rep = model.bucket_representative(i)
        assert in_bucket(rep, i), m
        assert abs(rep - x) <= 0.01 * x, m


def test_worst_subnormal_error_is_above_the_normal_bound() -> None:
    """102 * 2**-1074 shares its bucket with 103 * 2**-1074, the value
    reported: 0.98%, where normal values have at most 0.55%."""
    x = 102 * TINY
    assert model.bucket_representative(model.bucket_index(x)) == 103 * TINY


@given(st.floats(min_value=2.0**-1022, max_value=1.7976931348623157e308))
def test_normal_estimate_within_half_bucket(x: float) -> None:
    i = model.bucket_index(x)
    rep = model.bucket_representative(i)
    assert in_bucket(rep, i)
    assert abs(rep - x) <= 0.0055 * x


# -- STDDEV ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        ([], 0.0),
        ([5.0], 0.0),
        ([-0.0], 0.0),
        ([3.0, 3.0, 3.0], 0.0),
        ([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0], 2.0),
        ([1e9 - 1, 1e9 + 1], 1.0),
        ([1e16, 1e16 + 2, 1e16 + 4, 1e16 + 6], math.sqrt(5.0)),
        ([1.7976931348623157e308, -1.7976931348623157e308], 1.7976931348623157e308),
        ([0.0, 4 * TINY], 2 * TINY),
        ([0.0, TINY], 0.0),  # exactly 2**-1075: the tie rounds to even
        ([1.0, NAN], NAN),
        ([INF, 1.0], NAN),
        ([-INF, INF], NAN),
    ],
)
def test_stddev_hand_computed(samples: list[float], expected: float) -> None:
    got = model.exact_stddev(samples)
    if math.isnan(expected):
        assert math.isnan(got)
    else:
        assert got == expected


@given(st.lists(st.floats(min_value=-1e150, max_value=1e150), min_size=1, max_size=30))
def test_stddev_is_the_statistics_modules_population_stddev(samples: list[float]) -> None:
    expected = statistics.pstdev(samples)  # exact sums of Fractions, then one sqrt
    got = model.exact_stddev(samples)
    assert math.isclose(got, expected, rel_tol=4e-16, abs_tol=1e-300)


@given(st.integers(min_value=0, max_value=2**200), st.integers(min_value=1, max_value=2**100))
def test_sqrt_ratio_is_correctly_rounded(num: int, den: int) -> None:
    got = model._sqrt_ratio(num, den)
    value = Fraction(num, den)
    if got > 0:
        below = Fraction(math.nextafter(got, 0.0))
        above = Fraction(math.nextafter(got, INF))
        g = Fraction(got)
        # value lies within half an ulp of got on either side
        assert ((g + below) / 2) ** 2 <= value <= ((g + above) / 2) ** 2
    else:
        assert value == 0


# -- Pq -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("permille", "expected"), [(500, 50.0), (900, 90.0), (950, 95.0), (990, 99.0), (999, 100.0)]
)
def test_quantiles_of_1_to_100(permille: int, expected: float) -> None:
    samples = [float(v) for v in range(100, 0, -1)]
    assert model.exact_quantile(samples, permille) == expected


def test_quantile_rank_is_exact() -> None:
    assert model.quantile_rank(999, 1000) == 999
    assert model.quantile_rank(999, 1001) == 1000  # ceil(999.999)
    assert model.quantile_rank(500, 1) == 1
    assert model.quantile_rank(500, 3) == 2
    assert model.quantile_rank(990, 100) == 99
    assert model.quantile_rank(990, 101) == 100  # ceil(99.99)


def test_quantile_edge_cases() -> None:
    assert model.exact_quantile([], 500) == 0.0
    assert math.isnan(model.exact_quantile([NAN, NAN], 500))
    assert model.exact_quantile([NAN, 3.0, 1.0, 2.0], 500) == 2.0  # NaN left out: rank 2 of 3
    assert model.exact_quantile([-INF, 1.0, INF], 500) == 1.0
    assert model.exact_quantile([-INF, 1.0, INF], 999) == INF
    assert model.exact_quantile([-INF, -INF, 1.0], 500) == -INF
    assert model.exact_quantile([7.0], 999) == 7.0


# -- the model's Stat and its Distribution ----------------------------------------


@pytest.fixture
def events() -> Iterator[list[model.Event]]:
    got: list[model.Event] = []
    handle = model.register_event_handler(got.append)
    model.set_clock_ms(1000)
    yield got
    model.set_clock_ms(None)
    model.unregister_event_handler(handle)


def test_window_event_values_and_histogram(events: list[model.Event]) -> None:
    stat = model.Stat("s", [model.P50, model.STDDEV, model.P999], 60.0, max_samples=9)
    for v in [3.0, -3.0, 0.0, -0.0, NAN, INF, 2.0, 1.0, 3.0, 100.0]:  # 100.0: dropped
        stat.add(v)
    (event,) = events
    assert event.name == model.STAT_EVENT
    data = event.data
    assert list(data) == ["s.p50", "s.stddev", "s.p999"]
    assert data["s.p50"] == 1.0  # -3, 0, 0, 1, 2, 3, 3, inf: rank 4
    assert data["s.p999"] == INF
    assert math.isnan(data["s.stddev"])
    d = event.distribution
    assert (d.scale, d.count, d.nan_count, d.zero_count) == (6, 9, 1, 2)
    assert (d.positive_inf_count, d.negative_inf_count) == (1, 0)
    assert d.positive == ((-1, 1), (63, 1), (101, 2))
    assert d.negative == ((101, 1),)
    assert (d.min, d.max) == (-3.0, INF)
    assert math.isnan(d.sum)
    assert event._window_samples[:3] == (3.0, -3.0, 0.0)
    assert stat.get()[model.P50] == 1.0


def test_no_histogram_without_a_quantile(events: list[model.Event]) -> None:
    stat = model.Stat("s", [model.STDDEV, model.MEAN], 60.0, max_samples=2)
    stat.add(1.0)
    stat.add(3.0)
    (event,) = events
    assert event.distribution is None
    assert event.data == {"s.stddev": 1.0, "s.mean": 2.0}
    assert model.Event("x", event.timestamp, {}).distribution is None


def test_estimate_uses_exact_min_max_and_clamps() -> None:
    samples = [10.0, 20.0, 30.0]
    d = model.Distribution.of_samples(samples, 60.0, 10.0, 30.0)
    assert d.quantile(0.0) == 10.0  # rank 1: the exact min
    assert d.quantile(1.0) == 30.0  # rank n: the exact max
    mid = d.quantile(0.5)
    assert mid == model.bucket_representative(model.bucket_index(20.0))
    assert mid != 20.0 and abs(mid - 20.0) <= 0.0055 * 20.0
    one = model.Distribution.of_samples([5.0, 5.0, 5.0], 15.0, 5.0, 5.0)
    assert one.quantile(0.5) == 5.0  # clamped into [min, max]


def test_estimate_with_a_nan_first_sample_has_no_exact_ends() -> None:
    samples = [NAN, 10.0, 20.0]
    d = model.Distribution.of_samples(samples, NAN, NAN, NAN)
    rep10 = model.bucket_representative(model.bucket_index(10.0))
    assert d.quantile(0.0) == rep10 != 10.0
    assert d.count == 3 and d.nan_count == 1


@given(st.lists(st.floats(allow_nan=True), min_size=1, max_size=40), st.sampled_from([500, 999]))
def test_estimate_within_one_percent_of_the_exact_sample(samples: list[float], k: int) -> None:
    mn = mx = samples[0]
    for v in samples[1:]:
        mx = v if mx < v else mx
        mn = v if mn > v else mn
    d = model.Distribution.of_samples(samples, math.fsum([]), mn, mx)
    est, exact = d.quantile(k / 1000), model.exact_quantile(samples, k)
    if math.isnan(exact) or math.isinf(exact) or exact == 0.0:
        assert est == exact or (math.isnan(est) and math.isnan(exact))
    else:
        assert abs(est - exact) <= 0.01 * abs(exact)


def test_random_lognormal_estimates() -> None:
    rng = random.Random(7)
    samples = [rng.lognormvariate(0.0, 3.0) for _ in range(2000)]
    d = model.Distribution.of_samples(samples, sum(samples), min(samples), max(samples))
    for k in (500, 900, 950, 990, 999):
        exact = model.exact_quantile(samples, k)
        assert abs(d.quantile(k / 1000) - exact) <= 0.0055 * exact
