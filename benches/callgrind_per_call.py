"""Instructions per call of the hot-path operations, counted by callgrind.

Run:  python benches/callgrind_per_call.py [--only TEXT] [--module torch.monitor]
      (needs valgrind; ``--module torch.monitor`` counts torch's instead)

Instruction counts do not depend on what else the machine is doing, so they
complement the timings of bench_hot_path.py on a noisy machine. Each case
runs a loop of N and of 2N calls in a fresh interpreter under callgrind; the
difference divided by N is the cost of one call plus the loop's own
bytecode (the same for every row, shown by the `pass` row).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

SETUP = """
import math
from datetime import datetime, timedelta
import MODULE as m
fabs = math.fabs
five = [m.Aggregation.MEAN, m.Aggregation.COUNT, m.Aggregation.SUM,
        m.Aggregation.MAX, m.Aggregation.MIN]
stat5 = m.Stat("s", five, timedelta(hours=1))
# The six torch aggregations, STDDEV and P50..P999, where they exist.
twelve = ["VALUE", "MEAN", "COUNT", "SUM", "MAX", "MIN",
          "STDDEV", "P50", "P90", "P95", "P99", "P999"]
stat12 = None
if all(hasattr(m.Aggregation, name) for name in twelve):
    stat12 = m.Stat("s12", [getattr(m.Aggregation, n) for n in twelve], timedelta(hours=1))
now = datetime.now()
fields = {"a": 1, "b": 2.5, "c": "x"}
event = m.Event("e", now, fields)
Event = m.Event
log_event = m.log_event
import array
floats10 = [1.5] * 10
array10 = array.array("d", floats10)
if HANDLERS:
    m.register_event_handler(lambda e: None)
# torchmon's Watchdog (no thread of torch.monitor's): a beat, a section's block.
wd = section = None
if hasattr(m, "Watchdog"):
    wd = m.Watchdog(min_timeout=3600.0, dump_dir=None, report_interval=3600.0)
    section = wd.section("x")
"""

CASES = [
    ("loop alone (`pass`)", "pass", 0),
    ("math.fabs(1.5)", "fabs(1.5)", 0),
    ("Stat.add(1.5), 5 aggregations", "stat5.add(1.5)", 0),
    ("Stat.add(1.5), 12 aggregations (with STDDEV, P50..P999)", "stat12.add(1.5)", 0),
    # Not an exact float: the ordinary path, where a tensor is recognised.
    ("Stat.add(1), an int, 5 aggregations", "stat5.add(1)", 0),
    ("Stat.add_many(array of 10 float64), 5 aggregations", "stat5.add_many(array10)", 0),
    ("Stat.add_many(list of 10 floats), 5 aggregations", "stat5.add_many(floats10)", 0),
    ("log_event, 0 handlers", "log_event(event)", 0),
    ("log_event, 1 handler (a lambda)", "log_event(event)", 1),
    ("Event(name, ts, prebuilt 3-field dict)", "Event('e', now, fields)", 0),
    ("Event(name, ts, 3-field dict literal)", "Event('e', now, {'a': 1, 'b': 2.5, 'c': 'x'})", 0),
    ("(reference) the 3-field dict literal alone", "{'a': 1, 'b': 2.5, 'c': 'x'}", 0),
    ("event.data, 3 fields", "event.data", 0),
    ("Watchdog.beat()", "wd.beat()", 0),
    ("Watchdog section's with block", "with section: pass", 0),
]


def instructions(stmt: str, handlers: int, n: int, workdir: Path, module: str) -> int:
    script = workdir / "case.py"
    body = SETUP.replace("HANDLERS", str(handlers)).replace("MODULE", module)
    # A function's loop, so the names are fast locals, not module globals.
    names = "fabs, stat5, stat12, now, fields, event, Event, log_event, floats10, array10"
    script.write_text(
        f"{body}\ndef run({names}):\n    for _ in range({n}):\n        {stmt}\nrun({names})\n"
    )
    out = workdir / "callgrind.out"
    result = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, script],
        capture_output=True,
        # The same hash seed for both runs: dict layouts, hence counts, repeat.
        env={**os.environ, "PYTHONHASHSEED": "0"},
        text=True,
        check=True,
    )
    match = re.search(r"refs:\s+([\d,]+)", result.stderr)
    if match is None:
        raise RuntimeError(result.stderr)
    return int(match.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=100_000)
    parser.add_argument(
        "--only", default="", help="run only the rows whose label contains this text"
    )
    parser.add_argument("--module", default="torchmon", help="torchmon or torch.monitor")
    args = parser.parse_args()
    version = sys.version.split()[0]
    print(
        f"{args.module}, Python {version}; instructions per call (callgrind, 2N - N, N = {args.n})"
    )
    print()
    print("| operation | instructions per call |")
    print("| --- | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for label, stmt, handlers in CASES:
            if args.only not in label:
                continue
            try:
                once = instructions(stmt, handlers, args.n, Path(tmp), args.module)
                twice = instructions(stmt, handlers, 2 * args.n, Path(tmp), args.module)
            except subprocess.CalledProcessError as error:
                # e.g. the 12-aggregation Stat of a module without the P members
                reason = (error.stderr or "").strip().splitlines()[-1:]
                print(f"| {label} | – ({''.join(reason)[:80]}) |", flush=True)
                continue
            print(f"| {label} | {(twice - once) / args.n:.0f} |", flush=True)


if __name__ == "__main__":
    main()
