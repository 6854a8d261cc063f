"""The comparisons of tolerance.py: they accept the documented computations
(the shifted-sums STDDEV evaluated in doubles, the histogram estimate of
Pq) on any data, and reject values off by more than the documented error."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from . import model
from .rules import SAMPLE_FAMILIES, sample_batches
from .tolerance import Expected, Reported, expected, quantile_within_error, stddev_within_error

NAN, INF = math.nan, math.inf


def shifted_sums_stddev(samples: list[float]) -> float:
    """docs/api.md's method, in doubles, written out step by step."""
    n = len(samples)
    if n == 0:
        return 0.0
    k = samples[0]
    s1 = s2 = 0.0
    for x in samples:
        d = x - k
        s1 += d
        s2 += d * d
    var = (s2 - s1 * (s1 / n)) / n
    if var < 0.0:  # NaN (inf - inf, when the sums overflow) stays NaN
        var = 0.0
    return math.sqrt(var)


def test_stddev_exact_cases() -> None:
    assert stddev_within_error(0.0, ())
    assert not stddev_within_error(1e-300, ())
    assert stddev_within_error(0.0, (5.0,))
    assert not stddev_within_error(5e-324, (5.0,))
    assert stddev_within_error(0.0, (1e9, 1e9, 1e9))
    assert stddev_within_error(NAN, (1.0, NAN))
    assert not stddev_within_error(0.0, (1.0, NAN))
    assert stddev_within_error(NAN, (1.0, INF))
    assert not stddev_within_error(INF, (1.0, INF))


def test_stddev_near_1e9_is_tight() -> None:
    samples = (1e9 - 1, 1e9 + 1)
    assert stddev_within_error(1.0, samples)
    assert stddev_within_error(math.nextafter(1.0, INF), samples)
    assert not stddev_within_error(1.0 + 1e-12, samples)
    assert not stddev_within_error(0.0, samples)


def test_stddev_far_first_sample_allows_the_methods_cancellation() -> None:
    """A first sample far from the rest loses the shift's benefit: the
    bound grows with mean((x - first)**2), as the rounding does."""
    samples = [0.0] + [1e9 + v for v in (-1.0, 1.0, 0.5, -0.5)]
    got = shifted_sums_stddev(samples)
    assert stddev_within_error(got, tuple(samples))
    assert not stddev_within_error(0.0, tuple(samples))  # the true value is 4e8


def test_stddev_overflowing_sums_may_be_nan_or_inf() -> None:
    samples = (1.7976931348623157e308, -1.7976931348623157e308)
    assert stddev_within_error(1.7976931348623157e308, samples)
    assert stddev_within_error(NAN, samples)
    assert stddev_within_error(INF, samples)
    assert not stddev_within_error(0.0, samples)
    assert not stddev_within_error(NAN, (1.0, 2.0))


@given(sample_batches(), st.randoms())
def test_documented_stddev_method_is_accepted(batch: tuple[str, int, list[float]], rnd) -> None:
    _, _, samples = batch
    rnd.shuffle(samples)  # any sample may come first
    assert stddev_within_error(shifted_sums_stddev(samples), tuple(samples))


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=30))
def test_documented_stddev_method_is_accepted_on_any_doubles(samples: list[float]) -> None:
    assert stddev_within_error(shifted_sums_stddev(samples), tuple(samples))


@given(st.lists(st.floats(min_value=-1e100, max_value=1e100), min_size=2, max_size=30))
def test_exact_stddev_off_by_a_millionth_is_rejected(samples: list[float]) -> None:
    exact = model.exact_stddev(samples)
    # above 1e-150 the squares are normal doubles: no underflow allowance
    if exact > 1e-150 and max(abs(x - samples[0]) for x in samples) < 10 * exact:
        assert stddev_within_error(exact, tuple(samples))
        assert not stddev_within_error(exact * (1 + 1e-6), tuple(samples))


def test_quantile_error_bound() -> None:
    assert quantile_within_error(101.0, 100.0)
    assert quantile_within_error(99.0, 100.0)
    assert not quantile_within_error(101.00000000000001, 100.0)
    assert quantile_within_error(-99.5, -100.0)
    assert not quantile_within_error(99.5, -100.0)
    assert quantile_within_error(0.0, -0.0)
    assert not quantile_within_error(5e-324, 0.0)
    assert quantile_within_error(INF, INF)
    assert not quantile_within_error(1.7976931348623157e308, INF)
    assert quantile_within_error(NAN, NAN)
    assert not quantile_within_error(0.0, NAN)
    assert not quantile_within_error(NAN, 1.0)


@given(sample_batches(), st.sampled_from([500, 900, 950, 990, 999]))
def test_documented_estimate_is_accepted(batch: tuple[str, int, list[float]], k: int) -> None:
    _, _, samples = batch
    window = model._Window()
    for x in samples:
        window.fold(x)
    histogram = window.distribution()
    estimate = histogram.quantile(k / 1000)
    exact = model.exact_quantile(samples, k)
    suffix = f"p{k // 10}" if k != 999 else "p999"
    assert expected(suffix, exact, tuple(samples), histogram) == Reported(suffix, estimate)


def test_expected_rejects_a_value_within_one_percent_but_not_the_estimate() -> None:
    samples = (10.0, 20.0, 30.0)
    window = model._Window()
    for x in samples:
        window.fold(x)
    want = expected("p50", 20.0, samples, window.distribution())
    assert want != Reported("p50", 20.0)  # exact, but the documented value is the bucket's
    assert want == Reported("p50", window.distribution().quantile(0.5))
    assert want != Reported("p90", window.distribution().quantile(0.5))
    assert want != Reported("p50", 20)  # an int is not a float
    assert Expected("p50", 20.0, samples, None) == Reported("p50", 20.1)


def test_every_family_generates_floats() -> None:
    import random

    for name, family in SAMPLE_FAMILIES.items():
        assert isinstance(family(random.Random(1)), float), name
