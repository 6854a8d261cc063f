"""Hot-path benchmark: torchmon against torch.monitor and a bare native call, in one process.

Run:  python benches/bench_hot_path.py [--repeat 7] [--number 200000] [--json out.json]

Every figure is the minimum over ``--repeat`` runs of ``--number`` calls
(these machines are noisy: the minimum is the least disturbed run), in
nanoseconds per operation. Ratios are taken against ``math.fabs(1.5)``, the
floor for any Python-to-native call, and against torch.monitor measured in
the same run (when torch is importable).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import timeit
from datetime import datetime, timedelta
from typing import Any

import torchmon
from torchmon.testing import ManualClock

try:
    import torch.monitor as torch_monitor
except ImportError:  # the comparison column stays empty
    torch_monitor = None

HOUR = timedelta(hours=1)


def ns_per_op(stmt: str, env: dict[str, Any], number: int, repeat: int) -> float:
    timer = timeit.Timer(stmt, globals=env)
    return min(timer.repeat(repeat=repeat, number=number)) / number * 1e9


def ns_per_op_min_median(
    stmt: str, env: dict[str, Any], number: int, repeat: int
) -> tuple[float, float]:
    runs = sorted(timeit.Timer(stmt, globals=env).repeat(repeat=repeat, number=number))
    return runs[0] / number * 1e9, runs[len(runs) // 2] / number * 1e9


def measure_async(args: argparse.Namespace) -> dict[str, tuple[float, float, int]]:
    """Caller-side cost of log_event with one AsyncEventHandler, against the
    same trivial handler called directly: (min, median) ns per call, and the
    events the handler dropped (0 unless the worker fell 4M events behind).

    The worker thread drains the queue meanwhile (its GIL hand-offs are part
    of what the caller pays); each handler is closed after its measurement.
    """
    env = environment(torchmon)
    results = {}
    for label, on_full in (
        ("log_event, 1 handler called directly", None),
        ("log_event, 1 AsyncEventHandler (drop, maxsize 2**22)", "drop"),
        ("log_event, 1 AsyncEventHandler (block, maxsize 2**22)", "block"),
    ):

        def trivial(e: Any) -> None:
            pass

        wrapper = None
        if on_full is not None:
            wrapper = torchmon.AsyncEventHandler(trivial, maxsize=1 << 22, on_full=on_full)
        handle = torchmon.register_event_handler(wrapper or trivial)
        try:
            low, median = ns_per_op_min_median("m.log_event(event)", env, args.number, args.repeat)
        finally:
            torchmon.unregister_event_handler(handle)
            if wrapper is not None:
                wrapper.close()
        results[label] = (low, median, wrapper.dropped if wrapper is not None else 0)
    return results


def environment(module: Any) -> dict[str, Any]:
    """The objects each statement uses, built from one implementation."""
    agg = module.Aggregation
    five = [agg.MEAN, agg.COUNT, agg.SUM, agg.MAX, agg.MIN]
    now = datetime.now()
    event = module.Event("bench", now, {"a": 1, "b": 2.5, "c": "x"})
    stat5 = module.Stat("bench.five", five, HOUR)
    return {
        "m": module,
        "now": now,
        "fields": {"a": 1, "b": 2.5, "c": "x"},
        "event": event,
        "stat1": module.Stat("bench.one", [agg.SUM], HOUR),
        "stat5": stat5,
        "bound_add": stat5.add,
        "Stat": module.Stat,
        "SUM": [agg.SUM],
        "HOUR": HOUR,
    }


CASES = [
    ("Stat.add, 1 aggregation", "stat1.add(1.5)", 0),
    ("Stat.add, 5 aggregations", "stat5.add(1.5)", 0),
    ("Stat.add via a bound method", "bound_add(1.5)", 0),
    ("Event(name, ts, 3 fields)", "m.Event('bench', now, {'a': 1, 'b': 2.5, 'c': 'x'})", 0),
    # The same without building the dict literal, which both pay alike.
    ("Event(name, ts, a prebuilt 3-field dict)", "m.Event('bench', now, fields)", 0),
    ("(reference) the 3-field dict literal alone", "{'a': 1, 'b': 2.5, 'c': 'x'}", 0),
    ("log_event, 0 handlers", "m.log_event(event)", 0),
    ("log_event, 1 handler", "m.log_event(event)", 1),
    ("log_event, 8 handlers", "m.log_event(event)", 8),
    ("event.data, 3 fields", "event.data", 0),
    # max_samples=1: the add closes its window and emits one event. A Stat
    # is made for each, so creating one is measured alone and subtracted.
    ("window close emitting to 1 handler", "Stat('c', SUM, HOUR, 1).add(1.5)", 1),
]
BASELINES = {"window close emitting to 1 handler": "Stat('c', SUM, HOUR, 1)"}


def measure(module: Any, args: argparse.Namespace) -> dict[str, float]:
    results = {}
    env = environment(module)
    for label, stmt, handlers in CASES:
        handles = [module.register_event_handler(lambda e: None) for _ in range(handlers)]
        try:
            results[label] = ns_per_op(stmt, env, args.number, args.repeat)
            if label in BASELINES:
                results[label] -= ns_per_op(BASELINES[label], env, args.number, args.repeat)
        finally:
            for handle in handles:
                module.unregister_event_handler(handle)
    return results


def measure_add_many(repeat: int, n: int = 1_000_000) -> tuple[float, dict[str, float]]:
    """ns per value of ``add_many`` on 1M float64, and of the loops it replaces."""
    import numpy as np

    values = np.random.default_rng(0).random(n)
    as_list = values.tolist()
    env = environment(torchmon)
    env.update(values=values)
    ours = ns_per_op("stat5.add_many(values)", env, 20, repeat) / n
    loops = {}
    for label, module in (("torchmon", torchmon), ("torch.monitor", torch_monitor)):
        if module is None:
            continue
        loop_env = environment(module)
        loop_env.update(as_list=as_list)
        loops[f"{label}: `for v in values: stat.add(v)`"] = (
            ns_per_op("for v in as_list: stat5.add(v)", loop_env, 1, max(3, repeat // 2)) / n
        )
    return ours, loops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=200_000)
    parser.add_argument("--json", default="bench-results/hot_path.json")
    args = parser.parse_args()

    floor = ns_per_op("fabs(1.5)", {"fabs": math.fabs}, args.number, args.repeat)
    ours = measure(torchmon, args)
    theirs = measure(torch_monitor, args) if torch_monitor is not None else {}

    # The test clock's cost: the same add while a ManualClock is active.
    # The Stats are made under the test clock, so that the adds stay in their
    # window (a clock set before a window's start counts in the open window,
    # through the locked path).
    with ManualClock(0):
        env = environment(torchmon)
        ours["Stat.add, 5 aggregations, ManualClock active"] = ns_per_op(
            "stat5.add(1.5)", env, args.number, args.repeat
        )

    ours_async = measure_async(args)
    ours_many, theirs_many = measure_add_many(args.repeat)
    print(
        f"Python {platform.python_version()}, {platform.machine()}; "
        f"min of {args.repeat} x {args.number} calls; math.fabs(1.5) = {floor:.1f} ns\n"
    )
    print("| operation | torchmon ns | × fabs | torch.monitor ns | torch / torchmon |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for label, value in ours.items():
        torch_ns = theirs.get(label)
        torch_cells = (
            f"{torch_ns:.0f} | {torch_ns / value:.1f} ×" if torch_ns is not None else "– | –"
        )
        print(f"| {label} | {value:.1f} | {value / floor:.2f} | {torch_cells} |")

    print("\n| handler on a worker thread (caller side) | min ns | median ns | dropped |")
    print("| --- | ---: | ---: | ---: |")
    for label, (low, median, dropped) in ours_async.items():
        print(f"| {label} | {low:.1f} | {median:.1f} | {dropped} |")

    print("\n| batch of 1M contiguous float64 (5 aggregations) | M values/s | ns/value |")
    print("| --- | ---: | ---: |")
    print(f"| torchmon `Stat.add_many(array)` | {1e3 / ours_many:.0f} | {ours_many:.2f} |")
    for label, value in theirs_many.items():
        print(f"| {label} | {1e3 / value:.1f} | {value:.1f} |")

    report = {
        "python": sys.version,
        "repeat": args.repeat,
        "number": args.number,
        "fabs_ns": floor,
        "torchmon_ns": ours,
        "torch_monitor_ns": theirs,
        "async_handler_min_median_dropped": ours_async,
        "add_many_ns_per_value": ours_many,
        "loops_ns_per_value": theirs_many,
    }
    if args.json:
        import pathlib

        path = pathlib.Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2))
        print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
