"""Distributions: the cost of a quantile-capable add, against the peers, in one process.

Run:  python benches/bench_distributions.py [--repeat 7] [--number 200000] [--quick]
      [--json bench-results/distributions.json]

(from the repository root, with torchmon importable: ``PYTHONPATH=python``
for a development build; CI runs it once with ``--quick`` and only prints.)

What it prints (docs/performance.md, "Distributions", has a run):

1. Per-call cost of one sample, in ns (minimum and median of ``--repeat``
   runs of ``--number`` calls), as multiples of ``math.fabs(1.5)`` measured
   in the same run (min over min, and the median of the ratios of each run
   to the fabs run just before it): torchmon ``Stat.add`` with the twelve aggregations (the
   six torch ones, STDDEV and P50..P999; only when the installed torchmon has
   them) and with five torch-like ones, torch.monitor's five-aggregation
   ``add``, prometheus_client ``Histogram.observe`` (default buckets),
   ``ddsketch`` ``DDSketch.add``, ``hdrhistogram`` ``record_value`` and the
   OpenTelemetry SDK's ``Histogram.record`` (default aggregation, and the
   exponential-bucket aggregation through a View). A peer that is not
   importable is skipped with the reason printed.
2. The window close: the ``add`` that fills a window of ``max_samples``
   lognormal samples spanning six decades, so the close also turns the
   histogram into quantiles (and, with a P aggregation, an
   ``event.distribution`` for the one registered handler).
3. Memory per Stat, from the resident set (``/proc/self/statm``) of a fresh
   child process before and after filling many Stats with samples spanning
   six decades. tracemalloc sees only Python's allocator, not the Rust
   core's, so RSS deltas over many Stats (page granularity and allocator
   slack averaged out) are the sound measure here.
4. Relative error of p50/p99/p99.9 on the same lognormal data against the
   exact inverted-CDF quantile, for torchmon and each peer's default
   configuration.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import platform
import statistics
import subprocess
import sys
import timeit
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torchmon

HOUR = timedelta(hours=1)
TORCH_FIVE = ("MEAN", "COUNT", "SUM", "MAX", "MIN")
TWELVE = (
    "VALUE",
    "MEAN",
    "COUNT",
    "SUM",
    "MAX",
    "MIN",
    "STDDEV",
    "P50",
    "P90",
    "P95",
    "P99",
    "P999",
)
QUANTILES = ((0.5, "P50"), (0.99, "P99"), (0.999, "P999"))


def has_quantiles() -> bool:
    return all(hasattr(torchmon.Aggregation, name) for name in TWELVE)


def aggregations(module: Any, names: tuple[str, ...]) -> list[Any]:
    return [getattr(module.Aggregation, name) for name in names]


def lognormal(n: int, seed: int = 0) -> list[float]:
    """n latencies in seconds: median 10 ms, sigma 1.5 (10^5 of them span
    about six decades: 8.5 us to 4.6 s with seed 0)."""
    import random

    rng = random.Random(seed)
    return [rng.lognormvariate(math.log(0.01), 1.5) for _ in range(n)]


def exact_quantile(ordered: list[float], q: float) -> float:
    """The inverted-CDF quantile: the sample of rank ceil(q n)."""
    rank = max(1, math.ceil(q * len(ordered) - 1e-9))
    return ordered[rank - 1]


# --- per-call costs -----------------------------------------------------------


def per_call_costs(
    cases: list[tuple[str, str, dict[str, Any]]], number: int, repeat: int
) -> tuple[dict[str, tuple[float, float, float]], tuple[float, float]]:
    """Per case: (min ns, median ns, median of its ratios to fabs), and
    fabs's own (min, median) ns.

    Rounds, not one case after the other: in each of ``repeat`` rounds every
    case runs ``number`` calls right after ``math.fabs(1.5)`` does, and its
    ratio is taken to that fabs run, so a load that comes and goes on a
    shared machine moves both sides of each ratio alike.
    """
    fabs = timeit.Timer("fabs(1.5)", globals={"fabs": math.fabs})
    timers = {label: timeit.Timer(stmt, globals=env) for label, stmt, env in cases}
    runs: dict[str, list[float]] = {label: [] for label in timers}
    ratios: dict[str, list[float]] = {label: [] for label in timers}
    floor_runs: list[float] = []
    for _ in range(repeat):
        for label, timer in timers.items():
            floor = fabs.timeit(number)
            cost = timer.timeit(number)
            floor_runs.append(floor)
            runs[label].append(cost)
            ratios[label].append(cost / floor)
    scale = 1e9 / number
    costs = {
        label: (
            min(runs[label]) * scale,
            statistics.median(runs[label]) * scale,
            statistics.median(ratios[label]),
        )
        for label in timers
    }
    return costs, (min(floor_runs) * scale, statistics.median(floor_runs) * scale)


def otel_histogram(exponential: bool) -> tuple[Any, Any]:
    """An SDK Histogram instrument and its provider (kept alive by the caller)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View

    views = []
    if exponential:
        views = [
            View(instrument_name="latency", aggregation=ExponentialBucketHistogramAggregation())
        ]
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], views=views)
    histogram = provider.get_meter("bench").create_histogram("latency")
    return histogram, (provider, reader)


def add_cases() -> tuple[list[tuple[str, str, Callable[[], dict[str, Any]]]], list[str]]:
    """(label, statement, environment factory) per case, and the skipped ones."""
    cases: list[tuple[str, str, Callable[[], dict[str, Any]]]] = []
    skipped: list[str] = []
    if has_quantiles():
        cases.append(
            (
                "torchmon Stat.add, 12 aggregations (6 torch + STDDEV + P50..P999)",
                "stat.add(1.5)",
                lambda: {"stat": torchmon.Stat("b12", aggregations(torchmon, TWELVE), HOUR)},
            )
        )
    else:
        skipped.append(
            "torchmon Stat.add, 12 aggregations: this torchmon has no STDDEV/P50..P999 members"
        )
    cases.append(
        (
            "torchmon Stat.add, 5 aggregations (MEAN COUNT SUM MAX MIN)",
            "stat.add(1.5)",
            lambda: {"stat": torchmon.Stat("b5", aggregations(torchmon, TORCH_FIVE), HOUR)},
        )
    )
    try:
        import torch.monitor as torch_monitor

        cases.append(
            (
                "torch.monitor Stat.add, 5 aggregations",
                "stat.add(1.5)",
                lambda: {
                    "stat": torch_monitor.Stat("b5", aggregations(torch_monitor, TORCH_FIVE), HOUR)
                },
            )
        )
    except ImportError as error:
        skipped.append(f"torch.monitor: {error}")
    try:
        import prometheus_client

        def prometheus_env() -> dict[str, Any]:
            registry = prometheus_client.CollectorRegistry()
            return {"h": prometheus_client.Histogram("latency", "bench", registry=registry)}

        cases.append(
            (
                "prometheus_client Histogram.observe (default buckets)",
                "h.observe(1.5)",
                prometheus_env,
            )
        )
    except ImportError as error:
        skipped.append(f"prometheus_client: {error}")
    try:
        from ddsketch import DDSketch

        cases.append(
            ("ddsketch DDSketch.add (default, 1%)", "s.add(1.5)", lambda: {"s": DDSketch()})
        )
    except ImportError as error:
        skipped.append(f"ddsketch: {error}")
    try:
        from hdrh.histogram import HdrHistogram

        cases.append(
            (
                "hdrhistogram HdrHistogram.record_value (1..10^9, 2 digits)",
                "h.record_value(1500)",
                lambda: {"h": HdrHistogram(1, 10**9, 2)},
            )
        )
    except ImportError as error:
        skipped.append(f"hdrhistogram: {error}")
    try:
        import opentelemetry.sdk.metrics  # noqa: F401

        def otel_env(exponential: bool) -> dict[str, Any]:
            histogram, keep = otel_histogram(exponential)
            return {"h": histogram, "keep": keep}

        cases.append(
            (
                "OpenTelemetry SDK Histogram.record (default explicit buckets)",
                "h.record(1.5)",
                lambda: otel_env(False),
            )
        )
        cases.append(
            (
                "OpenTelemetry SDK Histogram.record (exponential buckets, View)",
                "h.record(1.5)",
                lambda: otel_env(True),
            )
        )
    except ImportError as error:
        skipped.append(f"opentelemetry-sdk: {error}")
    return cases, skipped


# --- the window close ---------------------------------------------------------


def window_close_us(
    names: tuple[str, ...], samples: list[float], repeat: int
) -> tuple[float, float]:
    """(min, median) microseconds of the add that fills, hence closes, a
    window of len(samples) samples, with one trivial handler registered."""
    handle = torchmon.register_event_handler(lambda event: None)
    times = []
    try:
        for _ in range(repeat):
            stat = torchmon.Stat("close", aggregations(torchmon, names), HOUR, len(samples))
            stat.add_many(samples[:-1])
            last = samples[-1]
            start = timeit.default_timer()
            stat.add(last)
            times.append(timeit.default_timer() - start)
            del stat
    finally:
        torchmon.unregister_event_handler(handle)
    return min(times) * 1e6, statistics.median(times) * 1e6


# --- memory -------------------------------------------------------------------

MEMORY_CHILD = "--memory-child"


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    import resource

    return pages * resource.getpagesize()


def memory_child(names: list[str], stats: int) -> None:
    """Prints, as JSON, bytes per Stat: made and empty, then after samples
    spanning six decades (1e-3 .. 1e3, every scale-6 bucket in between)."""
    aggs = [getattr(torchmon.Aggregation, name) for name in names]
    sweep = [10.0 ** (-3 + 6 * i / 2999) for i in range(3000)]
    gc.collect()
    gc.disable()
    base = resident_bytes()
    made = [torchmon.Stat(f"m{i}", aggs, HOUR) for i in range(stats)]
    empty = resident_bytes()
    for stat in made:
        stat.add_many(sweep)
    full = resident_bytes()
    print(json.dumps({"empty": (empty - base) / stats, "filled": (full - empty) / stats}))


def memory_per_stat(names: tuple[str, ...], stats: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, MEMORY_CHILD, ",".join(names), str(stats)],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float] = json.loads(out.stdout)
    return result


# --- quantile error -------------------------------------------------------------


def torchmon_quantiles(samples: list[float]) -> dict[float, float]:
    names = ("COUNT", *(name for _, name in QUANTILES))
    stat = torchmon.Stat("q", aggregations(torchmon, names), HOUR, len(samples))
    stat.add_many(samples)
    got = stat.get()
    return {q: got[getattr(torchmon.Aggregation, name)] for q, name in QUANTILES}


def prometheus_quantiles(samples: list[float]) -> dict[float, float]:
    """histogram_quantile() as Prometheus computes it from classic buckets:
    linear interpolation inside the bucket that holds rank q * count."""
    import prometheus_client

    registry = prometheus_client.CollectorRegistry()
    histogram = prometheus_client.Histogram("latency", "q", registry=registry)
    for x in samples:
        histogram.observe(x)
    buckets = []
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name.endswith("_bucket"):
                buckets.append((float(sample.labels["le"]), sample.value))
    buckets.sort()
    total = buckets[-1][1]
    result = {}
    for q, _ in QUANTILES:
        rank = q * total
        lower, below = 0.0, 0.0
        for upper, cumulative in buckets:
            if cumulative >= rank:
                if math.isinf(upper):
                    result[q] = lower  # Prometheus returns the last finite bound
                else:
                    result[q] = lower + (upper - lower) * (rank - below) / (cumulative - below)
                break
            lower, below = upper, cumulative
    return result


def ddsketch_quantiles(samples: list[float]) -> dict[float, float]:
    from ddsketch import DDSketch

    sketch = DDSketch()
    for x in samples:
        sketch.add(x)
    return {q: float(sketch.get_quantile_value(q)) for q, _ in QUANTILES}


def hdr_quantiles(samples: list[float]) -> dict[float, float]:
    from hdrh.histogram import HdrHistogram

    histogram = HdrHistogram(1, 10**9, 2)
    for x in samples:  # in microseconds: hdrhistogram records integers
        histogram.record_value(max(1, round(x * 1e6)))
    return {q: histogram.get_value_at_percentile(q * 100) / 1e6 for q, _ in QUANTILES}


def otel_exponential_quantiles(samples: list[float]) -> dict[float, float]:
    """From the SDK's default exponential aggregation (160 buckets, scale
    lowered until the data fit): the rank-ceil(q n) bucket's log midpoint."""
    histogram, (_, reader) = otel_histogram(exponential=True)
    for x in samples:
        histogram.record(x)
    data = reader.get_metrics_data()
    point = data.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points[0]
    base = 2.0 ** (2.0**-point.scale)
    counts = list(point.positive.bucket_counts)
    result: dict[float, float] = {}
    for q, _ in QUANTILES:
        rank = max(1, math.ceil(q * point.count - 1e-9)) - point.zero_count
        seen = 0
        for offset, count in enumerate(counts):
            seen += count
            if seen >= rank:
                index = point.positive.offset + offset
                result[q] = base ** (index + 0.5)
                break
    # The scale the SDK ended at, under a key no quantile uses.
    result[-1.0] = point.scale
    return result


def quantile_errors(samples: list[float]) -> tuple[dict[str, dict[float, float]], list[str]]:
    ordered = sorted(samples)
    exact = {q: exact_quantile(ordered, q) for q, _ in QUANTILES}
    methods: list[tuple[str, Callable[[list[float]], dict[float, float]]]] = []
    skipped = []
    if has_quantiles():
        methods.append(("torchmon P50/P99/P999 (scale 6)", torchmon_quantiles))
    else:
        skipped.append("torchmon: this torchmon has no P aggregations")
    peers: tuple[tuple[str, str, Callable[[list[float]], dict[float, float]]], ...] = (
        (
            "prometheus_client, default buckets (histogram_quantile)",
            "prometheus_client",
            prometheus_quantiles,
        ),
        ("ddsketch, default (1%)", "ddsketch", ddsketch_quantiles),
        ("hdrhistogram, 2 digits, us", "hdrh", hdr_quantiles),
        (
            "OpenTelemetry exponential, default (160 buckets)",
            "opentelemetry.sdk.metrics",
            otel_exponential_quantiles,
        ),
    )
    for label, module, method in peers:
        try:
            __import__(module)
        except ImportError as error:
            skipped.append(f"{label}: {error}")
            continue
        methods.append((label, method))
    errors = {}
    for label, quantiles in methods:
        got = quantiles(samples)
        row = {q: abs(got[q] - exact[q]) / exact[q] for q, _ in QUANTILES}
        if -1.0 in got:
            label = f"{label}, ended at scale {int(got[-1.0])}"
        errors[label] = row
    return errors, skipped


# --- main -----------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=200_000)
    parser.add_argument("--samples", type=int, default=100_000, help="lognormal samples")
    parser.add_argument("--stats", type=int, default=2000, help="Stats for the memory figure")
    parser.add_argument(
        "--quick", action="store_true", help="small counts (CI: prints, asserts nothing)"
    )
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    if args.quick:
        args.repeat, args.number, args.samples, args.stats = 3, 20_000, 20_000, 200

    cases, skipped = add_cases()
    costs, floor = per_call_costs(
        [(label, stmt, make_env()) for label, stmt, make_env in cases], args.number, args.repeat
    )

    samples = lognormal(args.samples)
    close_rows = {}
    close_sets: list[tuple[str, tuple[str, ...]]] = [("5 aggregations (no histogram)", TORCH_FIVE)]
    if has_quantiles():
        close_sets.append(("12 aggregations", TWELVE))
        close_sets.append(("P99 only", ("P99",)))
    for label, names in close_sets:
        close_rows[label] = window_close_us(names, samples, max(3, args.repeat))

    memory = {}
    memory_sets: list[tuple[str, tuple[str, ...]]] = [("5 aggregations", TORCH_FIVE)]
    if has_quantiles():
        memory_sets.append(("12 aggregations", TWELVE))
    for label, names in memory_sets:
        memory[label] = memory_per_stat(names, args.stats)

    errors, error_skips = quantile_errors(samples)

    print(
        f"Python {platform.python_version()}, {platform.machine()}; "
        f"{args.repeat} rounds x {args.number} calls; math.fabs(1.5) = {floor[0]:.1f} ns (min), "
        f"{floor[1]:.1f} ns (median)\n"
    )
    for reason in skipped + error_skips:
        print(f"skipped: {reason}")
    print(
        "\n| one sample | min ns | median ns | × fabs (min / min) "
        "| × fabs (median of paired ratios) |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    for label, (low, median, ratio) in costs.items():
        print(f"| {label} | {low:.1f} | {median:.1f} | {low / floor[0]:.2f} | {ratio:.2f} |")
    print(f"| math.fabs(1.5) | {floor[0]:.1f} | {floor[1]:.1f} | 1.00 | 1.00 |")
    twelve = next((v for k, v in costs.items() if "12 aggregations" in k), None)
    prom = next((v for k, v in costs.items() if k.startswith("prometheus")), None)
    if twelve is not None and prom is not None:
        print(
            f"\nprometheus_client observe / torchmon 12-aggregation add: "
            f"{prom[0] / twelve[0]:.1f} × (min / min), "
            f"{prom[2] / twelve[2]:.1f} × (ratio of the median ratios)"
        )

    print(
        f"\n| window close: the add that fills a window of {len(samples):,} lognormal "
        "samples (1 handler) | min µs | median µs |"
    )
    print("| --- | ---: | ---: |")
    for label, (low, median) in close_rows.items():
        print(f"| {label} | {low:.1f} | {median:.1f} |")

    print(
        f"\n| memory per Stat (RSS delta over {args.stats} Stats, fresh process) "
        "| made, empty (bytes) | + samples over six decades (bytes) |"
    )
    print("| --- | ---: | ---: |")
    for label, row in memory.items():
        print(f"| {label} | {row['empty']:.0f} | {row['filled']:.0f} |")

    print(
        f"\n| relative error against the exact quantile ({len(samples):,} lognormal samples, "
        "median 10 ms, sigma 1.5) | p50 | p99 | p99.9 |"
    )
    print("| --- | ---: | ---: | ---: |")
    for label, error_row in errors.items():
        cells = " | ".join(f"{error_row[q]:.2%}" for q, _ in QUANTILES)
        print(f"| {label} | {cells} |")

    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            json.dumps(
                {
                    "python": sys.version,
                    "repeat": args.repeat,
                    "number": args.number,
                    "fabs_ns_min_median": floor,
                    "add_ns_min_median_ratio": costs,
                    "window_close_us_min_median": close_rows,
                    "memory_bytes_per_stat": memory,
                    "relative_error": {
                        k: {str(q): e for q, e in v.items()} for k, v in errors.items()
                    },
                    "skipped": skipped + error_skips,
                },
                indent=2,
            )
        )
        print(f"\nwritten to {path}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == MEMORY_CHILD:
        memory_child(sys.argv[2].split(","), int(sys.argv[3]))
    else:
        main()
