"""PrometheusEventHandler's cumulative histogram of Stat distributions
(docs/sinks.md, "Prometheus"): the exposition scraped from the registry, its
bucket counts checked against counts taken from the samples, and PromQL's
histogram_quantile formula applied to it checked against the exact quantile."""

from __future__ import annotations

import math
import random
from datetime import datetime
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


MIXED_WINDOWS = [
    [0.25, 1.0, 2.0, 3.0, -1.0, -2.0, 0.0, -0.0, 1e-3, 7.5, math.inf],
    [-math.inf, -0.3, 1.0, 2.0000000000000004, 1.9999999999999998, 100.0, math.nan, -5e-324],
    [5e-324, 1.5, 1.5, -1.5],
]


def test_bucket_counts_are_exact_over_windows() -> None:
    registry = CollectorRegistry()
    with PrometheusEventHandler(registry=registry, histogram_buckets_per_octave=4) as sink:
        for samples in MIXED_WINDOWS:
            sink(window_event("lat", samples))
        scraped = histogram(registry, "lat_histogram")
    every = [x for samples in MIXED_WINDOWS for x in samples]
    numbers = [x for x in every if not math.isnan(x)]
    bounds = [float(le) for le, _ in scraped["buckets"]]
    assert bounds == sorted(bounds) and len(set(bounds)) == len(bounds)
    assert bounds[-1] == math.inf and 0.0 in bounds and -5e-324 in bounds
    for le, count in scraped["buckets"]:
        assert count == sum(1 for x in numbers if x <= float(le)), le
    # NaN is in no bucket and not counted; +inf only in +Inf.
    assert scraped["count"] == len(numbers) == len(every) - 1
    # _sum: the windows whose SUM is finite (the first has +inf, the second -inf and NaN).
    assert scraped["sum"] == sum(MIXED_WINDOWS[2])


def test_le_bounds_are_bucket_boundaries_per_octave() -> None:
    for per_octave in (1, 4, 16, 64):
        registry = CollectorRegistry()
        with PrometheusEventHandler(
            registry=registry, histogram_buckets_per_octave=per_octave
        ) as sink:
            sink(window_event("x", [1.0001, 3.99999, 0.50001, -0.6, -3.0]))
            bounds = [float(le) for le, _ in histogram(registry, "x_histogram")["buckets"]]
        step = 64 // per_octave
        positive = [b for b in bounds if 0 < b < math.inf]
        negative = [b for b in bounds if -5e-324 > b]
        for le in positive:
            # the largest double of a bucket that ends a group of `step` buckets
            assert oracle_index(le) % step == step - 1
            assert oracle_index(math.nextafter(le, math.inf)) == oracle_index(le) + 1
        for le in negative:
            # just below -(top of a group): x <= le is x < -top
            top = math.nextafter(-le, 0.0)
            assert oracle_index(top) % step == step - 1
            assert oracle_index(-le) == oracle_index(top) + 1
        # per_octave bounds in every octave from 0.5 to 4 (1, 2, 4 exact).
        assert 1.0 in positive and 2.0 in positive and 4.0 in positive
        assert sum(1 for b in positive if 1.0 < b <= 2.0) == per_octave
        assert sum(1 for b in positive if 0.5 < b <= 1.0) == per_octave
        up = math.nextafter
        assert sum(1 for b in negative if -up(2.0, 3.0) <= b < -up(1.0, 2.0)) == per_octave


@pytest.mark.parametrize("per_octave", [4, 8, 16, 64])
def test_histogram_quantile_lands_within_the_documented_bound(per_octave: int) -> None:
    rng = random.Random(per_octave)
    windows = [[rng.lognormvariate(-3.0, 2.0) for _ in range(500)] for _ in range(6)]
    windows.append([-rng.lognormvariate(0.0, 1.0) for _ in range(300)] + [0.0] * 50)
    registry = CollectorRegistry()
    with PrometheusEventHandler(registry=registry, histogram_buckets_per_octave=per_octave) as sink:
        for samples in windows:
            sink(window_event("step.time", samples))
        scraped = histogram(registry, "step_time_histogram")
    buckets = [(float(le), count) for le, count in scraped["buckets"]]
    every = [x for samples in windows for x in samples]
    bound = 2 ** (1 / per_octave) - 1  # docs/sinks.md: the relative error of histogram_quantile
    for q in (0.01, 0.05, 0.09, 0.1, 0.5, 0.9, 0.99, 0.999):
        estimate = promql_histogram_quantile(q, buckets)
        exact = exact_quantile(q, every)
        if exact == 0.0:
            assert abs(estimate) < 1e-300, (q, estimate)
        else:
            assert abs(estimate - exact) <= bound * abs(exact), (q, estimate, exact)


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
    [(3, ValueError), (0, ValueError), (128, ValueError), (4.0, TypeError), (True, TypeError)],
)
def test_bad_buckets_per_octave(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"PrometheusEventHandler\(histogram_buckets_per_octave\)"):
        PrometheusEventHandler(
            registry=CollectorRegistry(),
            histogram_buckets_per_octave=value,  # type: ignore[arg-type]
        )


def test_default_is_four_per_octave() -> None:
    registry = CollectorRegistry()
    with PrometheusEventHandler(registry=registry) as sink:
        sink(window_event("lat", [1.5]))
        bounds = [float(le) for le, _ in histogram(registry, "lat_histogram")["buckets"]]
    # 1.5 is in the group (2**(2/4), 2**(3/4)]: that bound and the one below.
    assert [b for b in bounds if 0 < b < math.inf] == [
        max(b for b in bounds if b < 1.5 and b > 0),
        min(b for b in bounds if b >= 1.5),
    ]
    assert abs(min(b for b in bounds if b >= 1.5) - 2**0.75) < 1e-15
    assert abs(max(b for b in bounds if 0 < b < 1.5) - 2**0.5) < 1e-15
    assert torchmon.Distribution is type(window_event("x", [1.0]).distribution)
