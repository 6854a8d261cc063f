"""PrometheusEventHandler's cumulative histogram of Stat distributions
(docs/sinks.md, "Prometheus"): the exposition scraped from the registry, its
fixed le bounds computed independently with exact fractions, its bucket
counts checked against counts taken from the samples, and PromQL's
histogram_quantile formula applied to it (also summed by le over ranks)
checked against the exact quantile."""

from __future__ import annotations

import math
import random
from datetime import datetime
from fractions import Fraction
from types import SimpleNamespace
from typing import Any

import pytest
from dist_samples import from_samples, oracle_index

import torchmon
from torchmon import STAT_EVENT, Event, PrometheusEventHandler

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402


def window_event(stat: str, samples: list[float]) -> Any:
    """A Stat window event carrying the distribution of ``samples``: an
    event-like object, as a Python-made torchmon.Event has no distribution."""
    return SimpleNamespace(
        name=STAT_EVENT,
        timestamp=datetime(2026, 1, 1),
        data={f"{stat}.count": float(len(samples))},
        distribution=from_samples(samples),
    )


def histogram(registry: CollectorRegistry, name: str) -> dict[str, Any]:
    """The scraped histogram ``name``: its buckets [(le text, count)] in
    exposition order, _count, _sum and the labels of its samples."""
    text = generate_latest(registry).decode("utf-8")
    found: dict[str, Any] = {"buckets": [], "labels": []}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = dict(sample.labels)
            if sample.name == name + "_bucket":
                found["buckets"].append((labels.pop("le"), sample.value))
            elif sample.name == name + "_count":
                found["count"] = sample.value
            elif sample.name == name + "_sum":
                found["sum"] = sample.value
            else:
                continue
            found["labels"].append(labels)
    return found


def promql_histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus's bucketQuantile (promql/quantile.go) on (upper bound, count) pairs."""
    buckets = sorted(buckets)
    assert math.isinf(buckets[-1][0])
    observations = buckets[-1][1]
    rank = q * observations
    b = next(
        i for i in range(len(buckets) - 1 + 1) if i == len(buckets) - 1 or buckets[i][1] >= rank
    )
    if b == len(buckets) - 1:
        return buckets[-2][0]
    if b == 0 and buckets[0][0] <= 0:
        return buckets[0][0]
    start, end, count = 0.0, buckets[b][0], buckets[b][1]
    if b > 0:
        start = buckets[b - 1][0]
        count -= buckets[b - 1][1]
        rank -= buckets[b - 1][1]
    return start + (end - start) * (rank / count)


def exact_quantile(q: float, samples: list[float]) -> float:
    ordered = sorted(x for x in samples if not math.isnan(x))
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def power_bound(k: int, b: int) -> float:
    """The largest double at or below 2**(k/b), settled with exact fractions
    (x <= 2**(k/b) iff x**b <= 2**k)."""
    x = 2.0 ** (k / b)
    while Fraction(x) ** b > Fraction(2) ** k:
        x = math.nextafter(x, 0.0)
    while Fraction(math.nextafter(x, math.inf)) ** b <= Fraction(2) ** k:
        x = math.nextafter(x, math.inf)
    return x


def expected_bounds(b: int, lo: float, hi: float) -> list[float]:
    """docs/sinks.md: 0, then 2**(k/b) (rounded down) from the largest at or
    below lo to the smallest at or above hi, then +Inf."""
    k_low = math.floor(b * math.log2(lo)) + 2
    while Fraction(2) ** k_low > Fraction(lo) ** b:
        k_low -= 1
    k_high = math.ceil(b * math.log2(hi)) - 2
    while Fraction(2) ** k_high < Fraction(hi) ** b:
        k_high += 1
    return [0.0] + [power_bound(k, b) for k in range(k_low, k_high + 1)] + [math.inf]


def scraped_bounds(scraped: dict[str, Any]) -> list[float]:
    return [float(le) for le, _ in scraped["buckets"]]


MIXED_WINDOWS = [
    [0.25, 1.0, 2.0, 3.0, -1.0, -2.0, 0.0, -0.0, 1e-3, 7.5, math.inf],
    [-math.inf, -0.3, 1.0, 2.0000000000000004, 1.9999999999999998, 100.0, math.nan, -5e-324],
    [5e-324, 1.5, 1.5, -1.5, 1e-9, 2.0**-20, 2.0**20, 1e7, 1e300],
]


def test_bucket_counts_are_exact_over_windows() -> None:
    registry = CollectorRegistry()
    with PrometheusEventHandler(registry=registry, histogram_buckets_per_octave=4) as sink:
        for samples in MIXED_WINDOWS:
            sink(window_event("lat", samples))
        scraped = histogram(registry, "lat_histogram")
    every = [x for samples in MIXED_WINDOWS for x in samples]
    numbers = [x for x in every if not math.isnan(x)]
    assert scraped_bounds(scraped) == expected_bounds(4, 2.0**-20, 2.0**20)
    # Every bucket, in range or not, counts the samples x <= le: zeros,
    # negatives and -inf from le="0.0" on, those below 2**-20 from the first
    # positive bound, those above 2**20 (and +inf) only in +Inf.
    for le, count in scraped["buckets"]:
        assert count == sum(1 for x in numbers if x <= float(le)), le
    assert dict(scraped["buckets"])["0.0"] == 8
    assert dict(scraped["buckets"])["9.5367431640625e-07"] == 8 + 3
    assert dict(scraped["buckets"])["+Inf"] - dict(scraped["buckets"])["1.048576e+06"] == 3
    # NaN is in no bucket and not counted.
    assert scraped["count"] == len(numbers) == len(every) - 1
    # _sum: the windows whose SUM is finite (the first has +inf, the second -inf and NaN).
    assert scraped["sum"] == sum(MIXED_WINDOWS[2])


@pytest.mark.parametrize("per_octave", [1, 4, 16, 64])
@pytest.mark.parametrize("span", [(2.0**-20, 2.0**20), (1e-3, 10.0), (0.7, 3.1), (5e-324, 1e-300)])
def test_le_bounds_are_the_fixed_layout(per_octave: int, span: tuple[float, float]) -> None:
    registry = CollectorRegistry()
    with PrometheusEventHandler(
        registry=registry, histogram_buckets_per_octave=per_octave, histogram_range=span
    ) as sink:
        sink(window_event("x", [1.0001, 3.99999, 0.50001, -0.6, -3.0]))
        bounds = scraped_bounds(histogram(registry, "x_histogram"))
    expected = expected_bounds(per_octave, *span)
    if expected[1] == 0.0:  # 2**(k/b) below the smallest double: no such bound
        expected = [0.0, *expected[2:]]
    assert bounds == expected
    positive = bounds[1:-1]
    assert positive[0] <= span[0] and positive[-1] >= span[1]
    step = 64 // per_octave
    for le in positive:
        # the largest double of a group of `step` buckets (among the
        # subnormals, the largest one of the groups up to it)
        above = oracle_index(math.nextafter(le, math.inf)) // step
        assert above > oracle_index(le) // step
        if le >= 2.0**-1022:
            assert oracle_index(le) % step == step - 1


def test_the_bounds_do_not_depend_on_the_data() -> None:
    """What lets ranks be summed by le (docs/sinks.md): each exposes the same
    le texts from its first window on, whichever octaves its samples reach."""
    rng = random.Random(7)
    ranks = [
        [0.0],
        [-3.0, -math.inf],
        [1e-12, 5e-324],
        [1e12, math.inf],
        [rng.lognormvariate(-3.0, 2.0) for _ in range(1000)],
        [math.nan],
    ]
    layouts = set()
    for samples in ranks:
        registry = CollectorRegistry()
        with PrometheusEventHandler(registry=registry) as sink:
            sink(window_event("step", samples))
            layouts.add(tuple(le for le, _ in histogram(registry, "step_histogram")["buckets"]))
    assert len(layouts) == 1
    (layout,) = layouts
    assert [float(le) for le in layout] == expected_bounds(4, 2.0**-20, 2.0**20)
    assert len(layout) == 163  # 0, 161 bounds, +Inf


def sum_by_le(scrapes: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """PromQL's ``sum by (le)``: adds the series that have the same le text."""
    summed: dict[str, float] = {}
    for scraped in scrapes:
        for le, count in scraped["buckets"]:
            summed[le] = summed.get(le, 0.0) + count
    return [(float(le), count) for le, count in summed.items()]


def test_ranks_reaching_different_octaves_sum_by_le() -> None:
    rng = random.Random(1)
    fast = [rng.uniform(0.020, 0.030) for _ in range(990)]
    slow = [rng.uniform(0.020, 0.030) for _ in range(975)] + [0.05] * 20 + [0.2] * 5
    scrapes = []
    for samples in (fast, slow):
        registry = CollectorRegistry()
        with PrometheusEventHandler(registry=registry, labels={"rank": str(len(scrapes))}) as sink:
            sink(window_event("step", samples))
            scrapes.append(histogram(registry, "step_histogram"))
    summed = sorted(sum_by_le(scrapes))
    every = fast + slow
    for le, count in summed:
        assert count == sum(1 for x in every if x <= le), le
    exact = exact_quantile(0.99, every)
    estimate = promql_histogram_quantile(0.99, summed)
    assert exact == 0.05
    assert abs(estimate - exact) <= (2 ** (1 / 4) - 1) * exact, (estimate, exact)


@pytest.mark.parametrize("per_octave", [4, 8, 16, 64])
def test_histogram_quantile_lands_within_the_documented_bound(per_octave: int) -> None:
    rng = random.Random(per_octave)
    # Inside the default range 2**-20 .. 2**20 (lognormal(-3, 2) reaches
    # about 1e-5 .. 100 in 3,000 samples), plus zeros.
    windows = [[rng.lognormvariate(-3.0, 2.0) for _ in range(500)] for _ in range(6)]
    windows.append([0.0] * 50)
    registry = CollectorRegistry()
    with PrometheusEventHandler(registry=registry, histogram_buckets_per_octave=per_octave) as sink:
        for samples in windows:
            sink(window_event("step.time", samples))
        scraped = histogram(registry, "step_time_histogram")
    buckets = [(float(le), count) for le, count in scraped["buckets"]]
    every = [x for samples in windows for x in samples]
    assert 2.0**-20 < min(x for x in every if x > 0) and max(every) < 2.0**20
    bound = 2 ** (1 / per_octave) - 1  # docs/sinks.md: the relative error of histogram_quantile
    for q in (0.01, 0.0166, 0.05, 0.09, 0.1, 0.5, 0.9, 0.99, 0.999):
        estimate = promql_histogram_quantile(q, buckets)
        exact = exact_quantile(q, every)
        if exact == 0.0:
            assert estimate == 0.0, (q, estimate)
        else:
            assert abs(estimate - exact) <= bound * abs(exact), (q, estimate, exact)


def test_quantiles_outside_the_range() -> None:
    """docs/sinks.md: at or below 0 histogram_quantile gives 0, between 0
    and the first bound a value in that interval, above the last bound the
    last bound."""
    registry = CollectorRegistry()
    with PrometheusEventHandler(registry=registry, histogram_range=(1.0, 8.0)) as sink:
        samples = [-5.0] * 10 + [0.0] * 10 + [0.25] * 10 + [3.0] * 10 + [100.0] * 9 + [math.inf]
        sink(window_event("x", samples))
        buckets = [(float(le), n) for le, n in histogram(registry, "x_histogram")["buckets"]]
    assert [le for le, _ in buckets] == expected_bounds(4, 1.0, 8.0)
    assert promql_histogram_quantile(0.1, buckets) == 0.0  # on the negatives
    assert promql_histogram_quantile(0.4, buckets) == 0.0  # on the zeros
    assert 0.0 < promql_histogram_quantile(0.5, buckets) <= 1.0  # 0.25, below the range
    assert abs(promql_histogram_quantile(0.7, buckets) - 3.0) <= (2**0.25 - 1) * 3.0
    assert promql_histogram_quantile(0.9, buckets) == 8.0  # 100: the last bound
    assert promql_histogram_quantile(1.0, buckets) == 8.0  # +inf too


def test_a_sum_past_the_largest_double_is_inf_for_good_as_in_prometheus_client() -> None:
    """docs/sinks.md ("Special values"): the cumulative _sum adds finite
    window SUMs as floats, so two windows of 1e308 make it +Inf, and it
    stays so (prometheus_client's Histogram.observe and client_golang add
    the same way); the counts are unaffected. The text rendered in Rust
    says the same."""
    registry = CollectorRegistry()
    with PrometheusEventHandler(registry=registry) as sink:
        sink(window_event("big", [1e308]))
        assert histogram(registry, "big_histogram")["sum"] == 1e308
        sink(window_event("big", [1e308]))
        sink(window_event("big", [-1e308, 1.0]))
        scraped = histogram(registry, "big_histogram")
        core_text = sink._native.render(protobuf=False)
    assert scraped["sum"] == math.inf and scraped["count"] == 4
    assert core_text is not None and b"big_histogram_sum +Inf\n" in core_text
    reference = CollectorRegistry()
    observed = prometheus_client.Histogram("reference", "h", registry=reference)
    for value in (1e308, 1e308, -1e308, 1.0):
        observed.observe(value)
    assert reference.get_sample_value("reference_sum") == math.inf


def test_labels_and_prefix_apply_to_the_histogram() -> None:
    registry = CollectorRegistry()
    with PrometheusEventHandler(registry=registry, prefix="job_", labels={"rank": "3"}) as sink:
        sink(window_event("io.read", [1.0, 2.0]))
        scraped = histogram(registry, "job_io_read_histogram")
    assert scraped["labels"] and all(labels == {"rank": "3"} for labels in scraped["labels"])
    assert scraped["count"] == 2


def test_none_exports_no_histogram_and_gauges_still_work() -> None:
    registry = CollectorRegistry()
    with PrometheusEventHandler(registry=registry, histogram_buckets_per_octave=None) as sink:
        sink(window_event("lat", [1.0, 2.0]))
        text = generate_latest(registry).decode()
    assert "lat_histogram" not in text and "lat_count 2.0" in text


def test_events_without_distribution_export_no_histogram() -> None:
    registry = CollectorRegistry()
    with PrometheusEventHandler(registry=registry) as sink:
        sink(Event(STAT_EVENT, datetime(2026, 1, 1), {"lat.mean": 1.5}))
        text = generate_latest(registry).decode()
    assert "_bucket" not in text and "lat_mean 1.5" in text


def test_close_unregisters_and_a_second_handler_may_take_the_name() -> None:
    registry = CollectorRegistry()
    first = PrometheusEventHandler(registry=registry)
    first(window_event("lat", [1.0]))
    second = PrometheusEventHandler(registry=registry)
    with pytest.raises(ValueError, match="lat_histogram"):
        second(window_event("lat", [2.0]))
    first.close()
    assert "lat_histogram" not in generate_latest(registry).decode()
    second(window_event("lat", [2.0]))
    assert histogram(registry, "lat_histogram")["count"] == 1
    second.close()


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ((0.0, 1.0), ValueError),
        ((-1.0, 1.0), ValueError),
        ((2.0, 1.0), ValueError),
        ((1.0, 1.0), ValueError),
        ((1e-6, math.inf), ValueError),
        ((math.nan, 1.0), ValueError),
        ((1, 10**400), ValueError),
        ((1e-6,), TypeError),
        ((1e-6, 1.0, 2.0), TypeError),
        (1.0, TypeError),
        (None, TypeError),
        (("1e-6", 1.0), TypeError),
        ((True, 2.0), TypeError),
    ],
)
def test_bad_histogram_range(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"PrometheusEventHandler\(histogram_range\)"):
        PrometheusEventHandler(
            registry=CollectorRegistry(),
            histogram_range=value,  # type: ignore[arg-type]
        )


def test_a_range_in_whole_numbers_and_a_list() -> None:
    registry = CollectorRegistry()
    with PrometheusEventHandler(registry=registry, histogram_range=[1, 1024]) as sink:
        sink(window_event("bytes", [3.0, 700.0]))
        bounds = scraped_bounds(histogram(registry, "bytes_histogram"))
    assert bounds == expected_bounds(4, 1.0, 1024.0) and len(bounds) == 2 + 41


@pytest.mark.parametrize(
    ("value", "error"),
    [(3, ValueError), (0, ValueError), (128, ValueError), (4.0, TypeError), (True, TypeError)],
)
def test_bad_buckets_per_octave(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"PrometheusEventHandler\(histogram_buckets_per_octave\)"):
        PrometheusEventHandler(
            registry=CollectorRegistry(),
            histogram_buckets_per_octave=value,  # type: ignore[arg-type]
        )


def test_default_is_four_per_octave_from_2_to_the_minus_20_to_2_to_the_20() -> None:
    registry = CollectorRegistry()
    with PrometheusEventHandler(registry=registry) as sink:
        sink(window_event("lat", [1.5]))
        buckets = histogram(registry, "lat_histogram")["buckets"]
    les = [le for le, _ in buckets]
    assert les[:3] == ["0.0", "9.5367431640625e-07", repr(power_bound(-79, 4))]
    assert les[-2:] == ["1.048576e+06", "+Inf"] and len(les) == 163
    # 1.5 is in the group (2**(2/4), 2**(3/4)]: counted from that bound on.
    counts = {float(le): n for le, n in buckets}
    assert counts[power_bound(2, 4)] == 0 and counts[power_bound(3, 4)] == 1
    assert torchmon.Distribution is type(window_event("x", [1.0]).distribution)
