"""A real Stat with P aggregations, windows closed by the test clock, feeding
each sink that uses ``event.distribution`` (docs/sinks.md): Prometheus's
histogram, JSON lines with stored distributions, and ``torchmon summarize``
over the files. Expected values come from the samples."""

from __future__ import annotations

import math
import random
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from dist_samples import from_samples
from support import registered

import torchmon
from torchmon import Aggregation, Distribution, JsonlEventHandler, Stat, read_jsonl
from torchmon.cli import main
from torchmon.testing import ManualClock

P_AGGREGATIONS = [Aggregation.P50, Aggregation.P90, Aggregation.P99, Aggregation.P999]


def run_windows(stat: Stat, clock: ManualClock, windows: list[list[float]]) -> None:
    """Adds each window's samples, then moves the clock past it; the last
    window is closed by flushing."""
    for samples in windows:
        for x in samples:
            stat.add(x)
        clock.advance(1000)
    torchmon.flush()


def exact_quantile(q: str, samples: list[float]) -> float:
    ordered = sorted(x for x in samples if not math.isnan(x))
    return ordered[max(1, math.ceil(Fraction(q) * len(ordered))) - 1]


def lognormal_windows(seed: int, count: int = 4, size: int = 300) -> list[list[float]]:
    rng = random.Random(seed)
    return [[rng.lognormvariate(-4.0, 1.0) for _ in range(size)] for _ in range(count)]


def test_window_events_carry_the_distribution_of_their_samples() -> None:
    seen: list[Any] = []
    windows = [[0.5, -2.0, 0.0, 3.0, math.inf], [1e-310, 7.0, math.nan]]
    with ManualClock(0) as clock, registered(seen.append):
        stat = Stat("e2e.carry", [Aggregation.P99, Aggregation.COUNT], 1.0)
        run_windows(stat, clock, windows)
    events = [e for e in seen if "e2e.carry.p99" in e.data]
    assert len(events) == 2
    # No NaN in the first window: its MIN/MAX are plain, the whole of it equal.
    assert events[0].distribution == from_samples(windows[0])
    for event, samples in zip(events, windows):
        d = event.distribution
        assert isinstance(d, Distribution)
        expected = from_samples(samples)
        assert (d.count, d.zero_count, d.nan_count, d.positive_inf_count) == (
            expected.count,
            expected.zero_count,
            expected.nan_count,
            expected.positive_inf_count,
        )
        assert (d.positive, d.negative) == (expected.positive, expected.negative)
        # The window's p99 is the distribution's quantile, exactly.
        assert d.quantile(0.99) == event.data["e2e.carry.p99"] or (
            math.isnan(d.quantile(0.99)) and math.isnan(event.data["e2e.carry.p99"])
        )


def test_prometheus_histogram_from_a_real_stat() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    windows = lognormal_windows(1)
    registry = prometheus_client.CollectorRegistry()
    sink = torchmon.PrometheusEventHandler(registry=registry)
    with sink, ManualClock(0) as clock, registered(sink):
        stat = Stat("e2e.prom", P_AGGREGATIONS, 1.0)
        run_windows(stat, clock, windows)
        text = prometheus_client.generate_latest(registry).decode()
    every = [x for samples in windows for x in samples]
    buckets = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "e2e_prom_histogram_bucket":
                buckets.append((float(sample.labels["le"]), sample.value))
            elif sample.name == "e2e_prom_histogram_count":
                assert sample.value == len(every)
    assert buckets and buckets[-1] == (math.inf, len(every))
    for le, count in buckets:
        assert count == sum(1 for x in every if x <= le)


def test_jsonl_and_summarize_merge_real_windows_of_two_ranks(tmp_path: Path, capsys: Any) -> None:
    every: list[float] = []
    paths = []
    for rank in range(2):
        windows = lognormal_windows(10 + rank)
        every += [x for samples in windows for x in samples]
        path = tmp_path / f"events-rank{rank}.jsonl"
        paths.append(path)
        with JsonlEventHandler(path, distributions=True) as sink:
            with ManualClock(0) as clock, registered(sink):
                stat = Stat("e2e.step", P_AGGREGATIONS, 1.0)
                run_windows(stat, clock, windows)
                del stat
        pairs = [
            (e, d) for e, d in read_jsonl(path, distributions=True) if "e2e.step.p99" in e.data
        ]
        assert len(pairs) == len(windows)
        for (event, distribution), samples in zip(pairs, windows):
            assert distribution is not None
            assert distribution.count == len(samples)
            assert distribution.positive == from_samples(samples).positive
            assert distribution.quantile(0.99) == event.data["e2e.step.p99"]
    assert main(["summarize", *map(str, paths)]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(
        line.split() for line in lines if line.split()[:3] == ["e2e.step", "8", str(len(every))]
    )
    for q, shown in zip(("0.5", "0.9", "0.99", "0.999"), row[3:]):
        exact = exact_quantile(q, every)
        # the bucket's representative (0.55%), printed with 6 digits
        assert abs(float(shown) - exact) <= (0.0055 + 1e-5) * exact


def test_through_an_async_handler_the_distribution_reaches_the_file(tmp_path: Path) -> None:
    windows = lognormal_windows(3, count=2, size=50)
    path = tmp_path / "events.jsonl"
    with JsonlEventHandler(path, distributions=True) as sink:
        with torchmon.AsyncEventHandler(sink) as queued:
            with ManualClock(0) as clock, registered(queued):
                stat = Stat("e2e.async", [Aggregation.P50], 1.0)
                run_windows(stat, clock, windows)
            assert queued.flush(timeout=30)
    stored = [d for e, d in read_jsonl(path, distributions=True) if "e2e.async.p50" in e.data]
    assert [d.positive for d in stored if d is not None] == [
        from_samples(samples).positive for samples in windows
    ]
