"""Watchdog benchmark: the cost of ``beat()`` and of a section's ``with``
block against the floors a user compares them with, and how long after the
last beat a hang is reported, in one process.

Run:  python benches/bench_watchdog.py [--repeat 9] [--number 200000] [--hangs 20] [--json out.json]

Per call: the minimum and the median over ``--repeat`` runs of ``--number``
calls, in nanoseconds. ``wd.beat()`` is compared with ``stat.add(1.0)`` and
``math.fabs(1.5)`` (the floor of any Python-to-native call); ``with
wd.section("x"): pass`` (the section looked up inside the loop, as a
training loop writes it) with ``with lock: pass`` (a ``threading.Lock``).

Detection: ``--hangs`` injected hangs, alternately ``time.sleep`` and a C
call holding the GIL (``ctypes.PyDLL(None).sleep``), each after a few
steps; per hang the time from the last beat to the stall the watchdog
reported (``stalled_s``, measured on its own thread without the GIL) and to
the ``torchmon.hang`` Event's arrival (which waits for the GIL), against the
timeout.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import platform
import statistics
import sys
import tempfile
import threading
import time
import timeit
from datetime import timedelta
from typing import Any

import torchmon


def min_median(stmt: str, env: dict[str, Any], number: int, repeat: int) -> tuple[float, float]:
    runs = sorted(timeit.Timer(stmt, globals=env).repeat(repeat=repeat, number=number))
    return runs[0] / number * 1e9, runs[len(runs) // 2] / number * 1e9


def per_call(args: argparse.Namespace, dump_dir: str) -> dict[str, tuple[float, float]]:
    wd = torchmon.Watchdog(min_timeout=3600.0, dump_dir=dump_dir, report_interval=3600.0)
    stat = torchmon.Stat("bench.value", [torchmon.Aggregation.MEAN], timedelta(hours=1))
    env = {"wd": wd, "stat": stat, "math": math, "lock": threading.Lock()}
    statements = {
        "math.fabs(1.5)": "math.fabs(1.5)",
        "stat.add(1.0)": "stat.add(1.0)",
        "wd.beat()": "wd.beat()",
        "with lock: pass": "with lock: pass",
        'with wd.section("x"): pass': 'with wd.section("x"): pass',
    }
    try:
        return {
            label: min_median(stmt, env, args.number, args.repeat)
            for label, stmt in statements.items()
        }
    finally:
        wd.close()


def detection(args: argparse.Namespace, dump_dir: str) -> list[dict[str, Any]]:
    arrivals: list[tuple[float, dict[str, Any]]] = []

    def on_event(event: torchmon.Event) -> None:
        if event.name == "torchmon.hang":
            arrivals.append((time.monotonic(), dict(event.data)))

    handle = torchmon.register_event_handler(on_event)
    wd = torchmon.Watchdog(
        min_timeout=0.5,
        factor=5.0,
        # The hangs' own intervals would raise factor x p99 over so few steps.
        max_timeout=0.5,
        first_timeout=0.5,
        warmup_beats=0,
        dump_dir=dump_dir,
    )
    libc = ctypes.PyDLL(None)
    results = []
    try:
        for i in range(args.hangs):
            for _ in range(5):
                time.sleep(0.01)
                wd.beat()
            timeout = wd.timeout
            held = i % 2 == 1
            seen = len(arrivals)
            last_beat = time.monotonic()
            if held:
                libc.sleep(2)  # whole seconds; the Event waits for the GIL
            else:
                while len(arrivals) == seen and time.monotonic() - last_beat < 5:
                    time.sleep(0.005)
            wd.beat()
            deadline = time.monotonic() + 5
            while len(arrivals) == seen and time.monotonic() < deadline:
                time.sleep(0.005)
            at, data = arrivals[seen]
            results.append(
                {
                    "gil_held": held,
                    "timeout_s": timeout,
                    "stalled_s": data["stalled_s"],
                    "event_after_s": at - last_beat,
                }
            )
    finally:
        wd.close()
        torchmon.unregister_event_handler(handle)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--number", type=int, default=200_000)
    parser.add_argument("--hangs", type=int, default=20)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    print(f"torchmon {torchmon.__version__}, Python {sys.version.split()[0]}, {platform.machine()}")
    with tempfile.TemporaryDirectory() as dump_dir:
        calls = per_call(args, dump_dir)
        hangs = detection(args, dump_dir)
    print(f"\nper call, ns ({args.repeat} runs of {args.number}):   min    median")
    for label, (low, median) in calls.items():
        print(f"  {label:<28} {low:7.1f} {median:7.1f}")
    fabs = calls["math.fabs(1.5)"]
    ratios = {
        "beat / math.fabs": calls["wd.beat()"][0] / fabs[0],
        "beat / stat.add": calls["wd.beat()"][0] / calls["stat.add(1.0)"][0],
        "section / lock": calls['with wd.section("x"): pass'][0] / calls["with lock: pass"][0],
    }
    print("ratios of the minima (goals: beat/fabs <= 1.5, section/lock <= 1.5):")
    for label, ratio in ratios.items():
        print(f"  {label:<28} {ratio:5.2f}")
    print(f"\ndetection over {len(hangs)} hangs (seconds after the last beat):")
    for held in (False, True):
        rows = [h for h in hangs if h["gil_held"] is held]
        if not rows:
            continue
        over = [h["stalled_s"] - h["timeout_s"] for h in rows]
        events = [h["event_after_s"] for h in rows]
        print(
            f"  {'GIL held' if held else 'sleeping'}: timeout {rows[0]['timeout_s']:.2f}, "
            f"reported stall median {statistics.median(h['stalled_s'] for h in rows):.2f} "
            f"(over the timeout by {min(over):.2f}..{max(over):.2f}), "
            f"Event arrived after median {statistics.median(events):.2f} "
            f"(max {max(events):.2f})"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"per_call_ns": calls, "ratios": ratios, "hangs": hangs}, f, indent=1)


if __name__ == "__main__":
    main()
