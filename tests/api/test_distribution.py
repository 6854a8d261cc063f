"""torchmon.Distribution (docs/api.md, "Distribution"): bucket layout,
quantile rules, merge, round trips, bad input, import cost.

Expected values come from the samples themselves: sorted, ranked by hand,
bucketed with the exact integer oracle below (not the module's own).
"""

from __future__ import annotations

import json
import math
import pickle
from decimal import Decimal, getcontext
from fractions import Fraction

import pytest
from dist_samples import from_samples, oracle_index
from support import run_python

import torchmon
from torchmon import Distribution


def in_bucket_of(value: float, sample: float) -> bool:
    return (value > 0) == (sample > 0) and oracle_index(value) == oracle_index(sample)


# --- the bucket layout ----------------------------------------------------------


def test_midpoints_are_the_correctly_rounded_middles() -> None:
    from torchmon._distribution import BUCKET_MIDPOINTS

    getcontext().prec = 60
    ln2 = Decimal(2).ln()
    expected = [float((ln2 * (Decimal(j) + Decimal("0.5")) / 64).exp()) for j in range(64)]
    assert list(BUCKET_MIDPOINTS) == expected


@pytest.mark.parametrize(
    "index", [-68737, -68673, -64 * 1022 - 1, -65, -1, 0, 1, 37, 63, 64, 65535]
)
def test_bucket_bounds_hold_exactly_the_bucket(index: int) -> None:
    lower, upper = Distribution.bucket_bounds(index)
    assert oracle_index(upper) == index
    assert upper == 1.7976931348623157e308 or oracle_index(math.nextafter(upper, math.inf)) > index
    if lower > 0:
        assert oracle_index(lower) < index
        assert oracle_index(math.nextafter(lower, math.inf)) == index


def test_bucket_bounds_at_powers_of_two_are_exact() -> None:
    assert Distribution.bucket_bounds(63)[1] == 2.0
    assert Distribution.bucket_bounds(64)[0] == 2.0
    assert Distribution.bucket_bounds(64 * -3 - 1)[1] == 0.125
    assert Distribution.bucket_bounds(-1)[1] == 1.0
    assert Distribution.bucket_bounds(64 * -1074 - 1) == (0.0, 5e-324)


def test_bucket_bounds_bad_index() -> None:
    with pytest.raises(TypeError, match=r"bucket_bounds\(index\)"):
        Distribution.bucket_bounds(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"bucket_bounds\(index\)"):
        Distribution.bucket_bounds(65536)


# --- quantiles --------------------------------------------------------------------


def test_quantile_ranks_are_ceil_of_the_decimal_q_times_n() -> None:
    samples = [float(v) for v in range(1, 11)]
    d = from_samples(samples)
    # 0.7 * 10 is 7.000000000000001 in floats; the rank is 7 (sample 7.0), not 8.
    assert in_bucket_of(d.quantile(0.7), 7.0)
    assert not in_bucket_of(d.quantile(0.7), 8.0)
    # rank ceil(0.55 * 10) = 6; ceil(0.51 * 10) = 6; 0.5 * 10 = 5.
    assert in_bucket_of(d.quantile(0.55), 6.0)
    assert in_bucket_of(d.quantile(0.51), 6.0)
    assert in_bucket_of(d.quantile(0.5), 5.0)
    thirty = from_samples([float(v) for v in range(1, 31)])
    # 0.1 * 30 is 3.0000000000000004 in floats; the rank is 3.
    assert in_bucket_of(thirty.quantile(0.1), 3.0)


def test_quantile_first_and_last_rank_are_min_and_max_exactly() -> None:
    d = from_samples([0.5, 1.0, 3.0, 7.0, 10.3])
    assert d.quantile(0.0) == 0.5
    assert d.quantile(0.2) == 0.5  # rank 1
    assert d.quantile(1.0) == 10.3
    assert d.quantile(0.81) == 10.3  # rank ceil(4.05) = 5 = n
    middle = d.quantile(0.5)  # rank 3: the sample 3.0
    assert in_bucket_of(middle, 3.0) and abs(middle - 3.0) / 3.0 <= 0.0055


def test_quantile_is_clamped_into_min_max() -> None:
    # All three in bucket 0, (1, 2**(1/64)]; its representative 2**(0.5/64) ~ 1.0054
    # is above the largest sample, so the middle rank reports the max.
    d = from_samples([1.001, 1.002, 1.003])
    assert 2 ** (0.5 / 64) > 1.003
    assert d.quantile(0.5) == 1.003
    low = from_samples([1.009, 1.0099, 1.01])
    assert 2 ** (0.5 / 64) < 1.009
    assert low.quantile(0.5) == 1.009


def test_quantile_order_negatives_zeros_infinities() -> None:
    samples = [math.inf, 2.0, -0.0, -5.0, math.nan, 0.0, -math.inf]
    d = from_samples(samples)
    assert (d.count, d.nan_count, d.zero_count) == (7, 1, 2)
    # n = 6 non-NaN, ascending: -inf, -5, -0.0, 0.0, 2, inf.
    assert d.quantile(0.1) == -math.inf  # rank 1 (min)
    minus_five = d.quantile(0.3)  # rank 2
    assert minus_five < 0 and in_bucket_of(minus_five, -5.0)
    assert d.quantile(0.5) == 0.0  # rank 3
    assert d.quantile(0.6) == 0.0  # rank 4
    two = d.quantile(0.8)  # rank 5
    assert in_bucket_of(two, 2.0) and abs(two - 2.0) / 2.0 <= 0.0055
    assert d.quantile(0.99) == math.inf  # rank 6


def test_quantile_with_nan_min_max_walks_the_buckets_unclamped() -> None:
    d = Distribution(
        count=4,
        sum=math.nan,
        min=math.nan,
        max=math.nan,
        nan_count=1,
        negative_inf_count=1,
        positive=[(0, 2)],
    )
    assert d.quantile(0.0) == -math.inf
    # ranks 2 and 3 fall in bucket 0: its representative, no clamp.
    assert d.quantile(1.0) == float.fromhex("0x1.0163da9fb3335p+0")


def test_quantile_of_an_empty_window_and_of_only_nan() -> None:
    assert Distribution(count=0, sum=0.0, min=0.0, max=0.0).quantile(0.5) == 0.0
    only_nan = Distribution(count=2, sum=math.nan, min=math.nan, max=math.nan, nan_count=2)
    assert math.isnan(only_nan.quantile(0.99))


def test_quantile_subnormals() -> None:
    samples = [5e-324, 1e-310, 2.5e-308, 1e-315, 3e-320]
    d = from_samples(samples)
    ordered = sorted(samples)
    for k, q in enumerate((0.2, 0.4, 0.6, 0.8, 1.0)):
        value = d.quantile(q)
        assert in_bucket_of(value, ordered[k]), (q, value, ordered[k])


def test_quantile_relative_error_on_a_spread_of_values() -> None:
    samples = [1.37**k * (-1) ** k for k in range(-300, 301)]
    d = from_samples(samples)
    ordered = sorted(samples)
    n = len(ordered)
    for k in range(1, 1000):
        q = k / 1000
        exact = ordered[max(1, math.ceil(Fraction(k, 1000) * n)) - 1]
        value = d.quantile(q)
        assert in_bucket_of(value, exact)
        assert abs(value - exact) <= 0.0055 * abs(exact)


def test_quantile_bad_q() -> None:
    d = from_samples([1.0])
    for bad in (-0.01, 1.01, math.nan, math.inf):
        with pytest.raises(ValueError, match=r"quantile\(q\): q must be in \[0, 1\]"):
            d.quantile(bad)
    for wrong in ("0.5", None, True):
        with pytest.raises(TypeError, match=r"quantile\(q\)"):
            d.quantile(wrong)  # type: ignore[arg-type]


# --- merge ------------------------------------------------------------------------


def test_merge_equals_the_distribution_of_all_samples() -> None:
    a = [0.001, 5.0, -3.0, 0.0, 7.5, 7.5, math.inf]
    b = [5.01, -3.0, -1e-300, 1e300, -math.inf, 0.0]
    merged = from_samples(a).merge(from_samples(b))
    assert merged == from_samples(a + b)
    assert merged.count == 13 and merged.zero_count == 2
    assert dict(merged.negative)[oracle_index(-3.0)] == 2


def test_merge_min_max_unknown_when_a_window_with_samples_has_nan_ones() -> None:
    """A NaN min/max of a window with non-NaN samples (its first sample was
    NaN) is unknown, so the merged one is NaN; a window without non-NaN
    samples (all NaN, or empty) adds no extreme (docs/api.md)."""

    def d(low: float, high: float) -> Distribution:
        # Two samples, in the buckets of the extremes given (of 0.25 and 8.0
        # where an extreme is NaN, unknown), as the constructor requires.
        shape = from_samples([0.25 if math.isnan(low) else low, 8.0 if math.isnan(high) else high])
        return Distribution(count=2, sum=1.0, min=low, max=high, positive=shape.positive)

    all_nan = Distribution(count=2, sum=math.nan, min=math.nan, max=math.nan, nan_count=2)
    empty = Distribution(count=0, sum=0.0, min=0.0, max=0.0)
    merged = d(math.nan, math.nan).merge(d(1.0, 2.0))
    assert math.isnan(merged.min) and math.isnan(merged.max)
    merged = d(0.5, 3.0).merge(d(math.nan, 4.0))
    assert math.isnan(merged.min) and merged.max == 4.0
    for merged in (all_nan.merge(d(1.0, 2.0)), d(1.0, 2.0).merge(empty)):
        assert (merged.min, merged.max) == (1.0, 2.0)
    assert (d(0.5, 3.0).merge(d(1.0, 4.0)).min, d(0.5, 3.0).merge(d(1.0, 4.0)).max) == (0.5, 4.0)
    nothing = all_nan.merge(empty)
    assert math.isnan(nothing.min) and math.isnan(nothing.quantile(0.5))
    assert empty.merge(empty).min == 0.0


def test_merge_wrong_type() -> None:
    with pytest.raises(TypeError, match=r"merge\(other\)"):
        from_samples([1.0]).merge({"count": 1})  # type: ignore[arg-type]


# --- round trips, immutability ---------------------------------------------------------


def test_to_dict_is_json_and_round_trips_non_finite_fields() -> None:
    d = Distribution(
        count=5,
        sum=math.nan,
        min=-math.inf,
        max=math.inf,
        nan_count=1,
        positive_inf_count=1,
        negative_inf_count=1,
        zero_count=1,
        negative=[(-3, 1)],
    )
    text = json.dumps(d.to_dict(), allow_nan=False)
    assert '"sum": {"$float": "nan"}' in text and '"min": {"$float": "-inf"}' in text
    back = Distribution.from_dict(json.loads(text))
    assert back == d
    assert back.negative == ((-3, 1),)


def test_pickle_and_equality() -> None:
    d = from_samples([-0.0, 1.5, 2.5, -7.0])
    assert pickle.loads(pickle.dumps(d)) == d
    assert d != from_samples([-0.0, 1.5, 2.5, -7.5])
    # -0.0 and 0.0 are different mins.
    assert from_samples([-0.0]) != from_samples([0.0])


def test_immutable() -> None:
    d = from_samples([1.0])
    with pytest.raises(AttributeError):
        d.count = 5  # type: ignore[misc]
    with pytest.raises(AttributeError):
        d.anything = 1  # type: ignore[attr-defined]


# --- bad input -------------------------------------------------------------------------


def test_constructor_errors_name_the_argument() -> None:
    base = {"count": 1, "sum": 1.0, "min": 1.0, "max": 1.0, "positive": [(-1, 1)]}
    cases = [
        ({"count": 1.0}, TypeError, "Distribution(count)"),
        ({"count": 2}, ValueError, "Distribution(count)"),
        ({"sum": "1"}, TypeError, "Distribution(sum)"),
        ({"min": None}, TypeError, "Distribution(min)"),
        ({"scale": 5}, ValueError, "Distribution(scale)"),
        ({"zero_count": -1}, ValueError, "Distribution(zero_count)"),
        ({"positive": [(1, 1), (0, 1)], "count": 2}, ValueError, "Distribution(positive)"),
        ({"positive": [(0, 0)]}, ValueError, "Distribution(positive)"),
        ({"positive": [(70000, 1)]}, ValueError, "Distribution(positive)"),
        ({"negative": 5}, TypeError, "Distribution(negative)"),
        ({"negative": [(1.0, 1)]}, TypeError, "Distribution(negative)"),
    ]
    for change, error, text in cases:
        with pytest.raises(error, match=text.replace("(", r"\(").replace(")", r"\)")):
            Distribution(**{**base, **change})  # type: ignore[arg-type]


def test_from_dict_errors() -> None:
    good = from_samples([1.0]).to_dict()
    with pytest.raises(ValueError, match="unknown key 'extra'"):
        Distribution.from_dict({**good, "extra": 1})
    with pytest.raises(ValueError, match="missing the key 'sum'"):
        Distribution.from_dict({k: v for k, v in good.items() if k != "sum"})
    with pytest.raises(ValueError, match=r"d\['max'\]"):
        Distribution.from_dict({**good, "max": {"$float": "huge"}})
    with pytest.raises(TypeError, match=r"from_dict\(d\)"):
        Distribution.from_dict([])  # type: ignore[arg-type]


# --- import cost -----------------------------------------------------------------------


def test_distribution_is_imported_on_first_use() -> None:
    result = run_python(
        """
        import sys
        import torchmon
        assert "torchmon._distribution" not in sys.modules
        assert "fractions" not in sys.modules
        assert "Distribution" in dir(torchmon)
        from torchmon import Distribution
        from torchmon._distribution import Distribution as direct
        assert Distribution is direct is torchmon.Distribution
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
    assert torchmon.Distribution is Distribution


def test_the_native_midpoints_are_this_table() -> None:
    from torchmon import _core
    from torchmon._distribution import BUCKET_MIDPOINTS

    assert tuple(_core._BUCKET_MIDPOINTS) == BUCKET_MIDPOINTS


def test_a_stat_window_quantile_equals_the_distributions() -> None:
    import random

    from torchmon.testing import ManualClock

    seen: list[torchmon.Event] = []
    rng = random.Random(2)
    samples = [rng.lognormvariate(0.0, 3.0) * rng.choice((-1, 1)) for _ in range(2000)]
    samples += [0.0, -0.0, math.inf, math.nan, 5e-324]
    handle = torchmon.register_event_handler(seen.append)
    try:
        with ManualClock(0) as clock:
            aggregations = [torchmon.P50, torchmon.P90, torchmon.P95, torchmon.P99, torchmon.P999]
            stat = torchmon.Stat("dist.exact", aggregations, 1.0)
            for x in samples:
                stat.add(x)
            clock.advance(1000)
            torchmon.flush()
    finally:
        torchmon.unregister_event_handler(handle)
    (event,) = [e for e in seen if "dist.exact.p50" in e.data]
    d = event.distribution
    assert d is not None and d.count == len(samples)
    for suffix, q in (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999)):
        assert d.quantile(q) == event.data[f"dist.exact.{suffix}"]
    expected = from_samples(samples)
    assert (d.positive, d.negative) == (expected.positive, expected.negative)
    assert (d.zero_count, d.nan_count, d.positive_inf_count) == (2, 1, 1)


def test_from_dict_bad_input_is_a_value_or_type_error_never_a_crash() -> None:
    """A JSON line can hold any int and any nesting: from_dict answers with a
    ValueError/TypeError naming the field, not OverflowError/RecursionError
    (docs/api.md, Distribution)."""
    good = from_samples([1.5, 3.0]).to_dict()
    for field in ("sum", "min", "max"):
        with pytest.raises(ValueError, match=rf"Distribution\({field}\): .*float range"):
            Distribution.from_dict({**good, field: 10**400})
    deep: object = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ValueError, match=r"Distribution\(positive\)"):
        Distribution.from_dict({**good, "positive": deep})
    tagged: dict[str, object] = {}
    innermost = tagged
    for _ in range(100_000):
        innermost["$float"] = innermost = {}
    with pytest.raises(ValueError, match=r"d\['sum'\]"):
        Distribution.from_dict({**good, "sum": tagged})


def test_extremes_must_agree_with_the_buckets() -> None:
    """min/max, when not NaN, are samples: min <= max, and each lies in the
    lowest/highest non-empty bucket or count (docs/api.md, Distribution)."""
    good = from_samples([1.5, 3.0]).to_dict()
    with pytest.raises(ValueError, match=r"Distribution\(min\): min must be <= max"):
        Distribution.from_dict({**good, "min": 3.0, "max": 1.5})
    with pytest.raises(ValueError, match=r"Distribution\(min\): min 1000.0 is not in positive"):
        Distribution.from_dict({**good, "min": 1000.0, "max": 1000.0})
    with pytest.raises(ValueError, match=r"Distribution\(max\): max 2.0 is not in positive"):
        Distribution.from_dict({**good, "max": 2.0})
    with pytest.raises(ValueError, match=r"Distribution\(max\): max 3.0 is not in positive_inf"):
        Distribution(count=2, sum=math.inf, min=1.5, max=3.0, positive_inf_count=1,
                     positive=good["positive"][:1])  # fmt: skip
    # Still accepted: NaN extremes (unknown), any extremes without a non-NaN
    # sample, and the extremes of real samples of every kind.
    Distribution.from_dict({**good, "min": {"$float": "nan"}, "max": {"$float": "nan"}})
    Distribution(count=1, sum=math.nan, min=math.nan, max=math.nan, nan_count=1)
    Distribution(count=0, sum=0.0, min=0.0, max=0.0)
    for samples in ([-math.inf, -2.0, -0.0, 5e-324, 7.0, math.inf], [-3.0, -1e-300], [0.0]):
        shaped = from_samples(samples)
        assert Distribution.from_dict(shaped.to_dict()) == shaped
