"""What torchmon.SystemStats costs (docs/guide.md, "System stats"): one
sample, on each source, and Stat.add with and without a sampler running.

Run:  python benches/bench_system_stats.py [--repeat 7] [--number 200000] [--json out.json]

Every figure is the minimum over ``--repeat`` runs (these machines are noisy:
the minimum is the least disturbed run), with the median beside it. Ratios
are against ``math.fabs(1.5)``, the floor for any Python-to-native call,
measured in the same run. Stat.add is measured without a sampler and with
one sampling every 10 ms (a thousand times more often than the default),
alternating, so that both see the same machine.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import timeit
from datetime import timedelta
from typing import Any

import torchmon
from torchmon.testing import ManualClock

HOUR = timedelta(hours=1)


def runs(stmt: str, env: dict[str, Any], number: int, repeat: int) -> list[float]:
    """ns per operation of each run, sorted."""
    timer = timeit.Timer(stmt, globals=env)
    return sorted(t / number * 1e9 for t in timer.repeat(repeat=repeat, number=number))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=200_000)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    results: dict[str, dict[str, float]] = {}

    fabs = runs("fabs(1.5)", {"fabs": math.fabs}, args.number, args.repeat)
    results["math.fabs(1.5)"] = {"min_ns": fabs[0], "median_ns": fabs[len(fabs) // 2]}

    sources = ["proc"]
    try:
        import psutil  # noqa: F401
    except ImportError:
        print("psutil is not installed: its source is not measured", file=sys.stderr)
    else:
        sources.insert(0, "psutil")
    samples = max(50, args.number // 1000)
    for source in sources:
        for io in (False, True):
            sampler = torchmon.SystemStats(HOUR, HOUR, source=source, io=io)
            sampler.sample_now()  # the baselines, NVML's start
            try:
                got = runs("s()", {"s": sampler.sample_now}, samples, args.repeat)
            finally:
                sampler.close()
            label = f"SystemStats.sample_now(), source={source}, io={io}"
            results[label] = {"min_ns": got[0], "median_ns": got[len(got) // 2]}

    # Stat.add alone, with no window closing (a manual clock that stays put):
    # the hot path the sampler must not touch.
    with ManualClock():
        stat = torchmon.Stat("bench.add", [torchmon.MEAN, torchmon.MAX], HOUR)
        env = {"add": stat.add}
        without: list[float] = []
        with_sampler: list[float] = []
        # Short runs, many of them: a run that a sample interrupts (the
        # sampler holds the GIL while it reads) is slower by that sample,
        # which is the sample's cost, above; the minimum is a run between
        # two samples, the cost of Stat.add itself.
        number = max(1000, args.number // 20)
        for _ in range(args.repeat * 5):
            without += runs("add(1.5)", env, number, 1)
            with torchmon.SystemStats(0.01, HOUR, io=False):
                with_sampler += runs("add(1.5)", env, number, 1)
    for label, values in (
        ("Stat.add, no sampler", sorted(without)),
        ("Stat.add, a sampler running every 10 ms", sorted(with_sampler)),
    ):
        results[label] = {"min_ns": values[0], "median_ns": values[len(values) // 2]}

    floor = results["math.fabs(1.5)"]["min_ns"]
    version = torchmon.__version__
    print(f"Python {platform.python_version()}, {platform.machine()}, torchmon {version}")
    print(f"{'operation':58} {'min ns':>12} {'median ns':>12} {'x fabs':>10}")
    for label, figures in results.items():
        print(
            f"{label:58} {figures['min_ns']:12.1f} {figures['median_ns']:12.1f} "
            f"{figures['min_ns'] / floor:10.2f}"
        )
    base = results["Stat.add, no sampler"]
    loaded = results["Stat.add, a sampler running every 10 ms"]
    print(
        "\nStat.add with a sampler running / without: "
        f"min {loaded['min_ns'] / base['min_ns']:.3f}, "
        f"median {loaded['median_ns'] / base['median_ns']:.3f}"
    )
    for label, figures in results.items():
        if label.startswith("SystemStats.sample_now()"):
            share = figures["min_ns"] / 10e9
            print(f"{label}: {share:.4%} of one CPU at the default 10 s interval")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
