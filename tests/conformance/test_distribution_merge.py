"""Merging windows' histograms (docs/api.md, "Distribution"): the merge of k
windows' ``event.distribution`` is the histogram one window over all their
samples would have had, and gives the same quantiles; the buckets are also
checked against the reference model's exact ones. Plus bad input to the new
aggregations: a clear TypeError/ValueError, never a crash."""

from __future__ import annotations

import datetime as dt
import functools
import math
import sys
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import run_python

import torchmon
from torchmon.testing import ManualClock

from . import model
from .rules import floats, sample_batches

pytestmark = pytest.mark.hypothesis_suite

NAN = math.nan
QUANTILES = [0.0, 0.001, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0]


def histogram_fields(d: Any) -> tuple[Any, ...]:
    """Everything but sum, min and max."""
    return (
        d.scale,
        d.count,
        d.zero_count,
        d.nan_count,
        d.positive_inf_count,
        d.negative_inf_count,
        tuple(tuple(b) for b in d.positive),
        tuple(tuple(b) for b in d.negative),
    )


def same(a: float, b: float) -> bool:
    """Equal as numbers (0.0 == -0.0), or both NaN."""
    return a == b or (math.isnan(a) and math.isnan(b))


def sum_within_float_tolerance(got: float, samples: list[float]) -> bool:
    """A sum of the same samples in another order (the windows' sums added):
    each order's error is at most (n - 1) u sum(|x|)."""
    if any(math.isnan(x) for x in samples) or {math.inf, -math.inf} <= set(samples):
        return math.isnan(got)
    finite = [x for x in samples if math.isfinite(x)]
    magnitude = sum(Fraction(abs(x)) for x in finite)
    # partial sums may overflow in one order only (and then meet an inf)
    may_overflow = magnitude * 2 * len(samples) > Fraction(sys.float_info.max)
    if len(finite) < len(samples):
        infinity = math.inf if math.inf in samples else -math.inf
        return got == infinity or (may_overflow and not math.isfinite(got))
    if may_overflow:
        return True
    exact = sum(Fraction(x) for x in samples)
    return abs(Fraction(got) - exact) <= Fraction(2 * len(samples), 2**53) * magnitude


def window_distributions(chunks: list[list[float]]) -> tuple[list[Any], Any]:
    """One Stat whose windows hold the chunks (the test clock moves between
    them), and one Stat with a single window of every sample."""
    events: list[torchmon.Event] = []
    handle = torchmon.register_event_handler(events.append)
    try:
        with ManualClock(0) as clock:
            windowed = torchmon.Stat("w", [torchmon.P50], dt.timedelta(milliseconds=10))
            whole = torchmon.Stat("all", [torchmon.P99, torchmon.STDDEV], dt.timedelta(hours=1))
            for chunk in chunks:
                for v in chunk:
                    windowed.add(v)
                    whole.add(v)
                clock.advance(10)
            del windowed, whole  # each emits its open window
    finally:
        torchmon.unregister_event_handler(handle)
    parts = [e.distribution for e in events if "w.p50" in e.data]
    (single,) = [e.distribution for e in events if "all.p99" in e.data]
    return parts, single


chunk_lists = st.lists(
    st.one_of(
        sample_batches().map(lambda batch: batch[2][:300]),
        st.lists(floats, min_size=1, max_size=20),
    ),
    min_size=1,
    max_size=6,
)


@given(chunk_lists)
def test_merged_windows_equal_one_window_of_all_samples(chunks: list[list[float]]) -> None:
    parts, single = window_distributions(chunks)
    assert len(parts) == len(chunks)
    for part, chunk in zip(parts, chunks):
        assert part.count == len(chunk)
    merged = functools.reduce(lambda a, b: a.merge(b), parts)
    samples = [v for chunk in chunks for v in chunk]

    oracle = model.Distribution.of_samples(samples, 0.0, 0.0, 0.0)
    assert histogram_fields(merged) == histogram_fields(single) == histogram_fields(oracle)
    assert sum_within_float_tolerance(merged.sum, samples)
    assert sum_within_float_tolerance(single.sum, samples)
    if any(math.isnan(chunk[0]) for chunk in chunks):
        # A window whose first sample is NaN has NaN MIN and MAX (torch's
        # rule): the merged extremes are unknown and its quantiles unclamped
        # estimates (test_merge_with_a_window_that_starts_with_nan), still
        # within 1% of the exact order statistic (docs/api.md).
        ordered = sorted(v for v in samples if not math.isnan(v))
        for q in QUANTILES:
            got = merged.quantile(q)
            if not ordered:
                assert math.isnan(got)
                continue
            rank = max(1, math.ceil(Fraction(repr(q)) * len(ordered)))
            exact = ordered[rank - 1]
            if math.isinf(exact) or exact == 0.0:
                assert got == exact, (q, got, exact)
            else:
                assert abs(got - exact) <= 0.01 * abs(exact), (q, got, exact)
        return
    assert same(merged.min, single.min) and same(merged.max, single.max)
    for q in QUANTILES:
        assert same(merged.quantile(q), single.quantile(q)), q


def test_merge_with_a_window_that_starts_with_nan() -> None:
    parts, single = window_distributions([[5015.66], [NAN, 0.0]])
    merged = parts[0].merge(parts[1])
    assert single.quantile(0.5) == 0.0  # the one window over all samples is right
    assert merged.quantile(0.5) == 0.0
    # Its extremes are unknown, so the merged ones are too, and the quantiles
    # are the bucket estimates: 5015.66 within half a bucket, not clamped.
    assert math.isnan(merged.min) and math.isnan(merged.max)
    assert abs(merged.quantile(1.0) - 5015.66) <= 0.0055 * 5015.66
    assert merged.merge(parts[0]).quantile(0.3) == 0.0  # rank 1 of 0.0, 5015.66, 5015.66


@given(chunk_lists, st.randoms())
def test_merge_is_order_independent(chunks: list[list[float]], rnd: Any) -> None:
    parts, _ = window_distributions(chunks)
    forward = functools.reduce(lambda a, b: a.merge(b), parts)
    rnd.shuffle(parts)
    shuffled = functools.reduce(lambda a, b: a.merge(b), parts)
    assert histogram_fields(forward) == histogram_fields(shuffled)
    assert same(forward.min, shuffled.min) and same(forward.max, shuffled.max)
    for q in QUANTILES:
        assert same(forward.quantile(q), shuffled.quantile(q))


@given(
    sample_batches(),
    st.lists(st.floats(min_value=0.0, max_value=1.0), max_size=5),
)
def test_quantile_is_the_models_documented_estimate(
    batch: tuple[str, int, list[float]], qs: list[float]
) -> None:
    """torchmon.Distribution built from the model's exact buckets estimates
    every quantile as the model does, bit for bit (ranks from the decimal q)."""
    samples = batch[2]
    window = model._Window()
    for x in samples:
        window.fold(x)
    want = window.distribution()
    d = torchmon.Distribution(
        count=want.count,
        sum=want.sum,
        min=want.min,
        max=want.max,
        zero_count=want.zero_count,
        nan_count=want.nan_count,
        positive_inf_count=want.positive_inf_count,
        negative_inf_count=want.negative_inf_count,
        positive=want.positive,
        negative=want.negative,
    )
    for q in [*QUANTILES, *qs]:
        assert same(d.quantile(q), want.quantile(q)), q


def test_window_quantile_method_gives_the_events_values() -> None:
    events: list[torchmon.Event] = []
    handle = torchmon.register_event_handler(events.append)
    try:
        stat = torchmon.Stat("s", [torchmon.P90, torchmon.P999, torchmon.P50], 3600.0)
        for v in range(1, 2001):
            stat.add(v * 0.37)
        del stat
    finally:
        torchmon.unregister_event_handler(handle)
    (event,) = events
    d = event.distribution
    assert d.count == 2000
    assert d.quantile(0.9) == event.data["s.p90"]
    assert d.quantile(0.999) == event.data["s.p999"]
    assert d.quantile(0.5) == event.data["s.p50"]
    assert "distribution" not in event.data


# -- bad input ------------------------------------------------------------------

_BAD_INPUT_CHILD = """
import datetime as dt, math
import torchmon
from torchmon import Aggregation, Stat

def outcome(call):
    try:
        call()
    except (TypeError, ValueError) as exc:
        return type(exc).__name__ + ": " + str(exc)
    except BaseException as exc:
        return "UNEXPECTED " + type(exc).__name__ + ": " + str(exc)
    return "ok"

W = dt.timedelta(seconds=1)
cases = {
    "Aggregation(13)": lambda: Aggregation(13),
    "Aggregation(0)": lambda: Aggregation(0),
    "Aggregation(-1)": lambda: Aggregation(-1),
    "Aggregation(2**70)": lambda: Aggregation(2**70),
    "Aggregation('P50')": lambda: Aggregation("P50"),
    "Aggregation(8.0)": lambda: Aggregation(8.0),
    "Stat int": lambda: Stat("x", [13], W),
    "Stat str": lambda: Stat("x", ["P99"], W),
    "Stat None": lambda: Stat("x", [torchmon.P99, None], W),
    "Stat object": lambda: Stat("x", [object()], W),
    "merge None": lambda: Stat("x", [torchmon.P50], W) and torchmon.Distribution(
        count=0, sum=0.0, min=0.0, max=0.0).merge(None),
    "quantile 1.5": lambda: torchmon.Distribution(count=0, sum=0.0, min=0.0, max=0.0).quantile(1.5),
    "quantile nan": lambda: torchmon.Distribution(count=0, sum=0.0, min=0.0, max=0.0).quantile(
        math.nan),
    "quantile str": lambda: torchmon.Distribution(count=0, sum=0.0, min=0.0, max=0.0).quantile(
        "0.5"),
}
for name, call in cases.items():
    print(name, "->", outcome(call))
assert Aggregation(12) is torchmon.P999 and Aggregation(7) is torchmon.STDDEV
s = Stat("ok", [torchmon.STDDEV, torchmon.P999], W)
for v in (1.0, float("nan"), float("inf"), -0.0, 5e-324, 1e308, -1e308):
    s.add(v)
print("get ->", sorted((k.name, type(v).__name__) for k, v in s.get().items()))
print("done")
"""


def test_bad_input_to_the_new_members_raises_clear_errors_in_a_child() -> None:
    proc = run_python(_BAD_INPUT_CHILD, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" -> ", 1) for line in proc.stdout.splitlines() if " -> " in line)
    assert proc.stdout.splitlines()[-1] == "done"
    for name in ("Aggregation(13)", "Aggregation(0)", "Aggregation(-1)", "Aggregation(2**70)"):
        assert lines[name].startswith("ValueError: "), (name, lines[name])
        assert "1 to 12" in lines[name], lines[name]
    for name in ("Aggregation('P50')", "Aggregation(8.0)", "Stat int", "Stat str", "Stat None"):
        assert lines[name].startswith("TypeError: "), (name, lines[name])
    assert lines["Stat object"].startswith("TypeError: ")
    assert lines["merge None"].startswith("TypeError: ")
    for name in ("quantile 1.5", "quantile nan"):
        assert lines[name].startswith("ValueError: ") and "q" in lines[name], lines[name]
    assert lines["quantile str"].startswith("TypeError: ")
    assert lines["get"] == "[('P999', 'float'), ('STDDEV', 'float')]"
