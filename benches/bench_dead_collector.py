"""What an unreachable OpenTelemetry collector costs a job: ``torchmon.flush()``
and the whole process (start to exit), with a JSON-lines sink beside it.

Run:  python benches/bench_dead_collector.py [--repeat 3] [--export-timeout S]

Each run is a fresh interpreter (a child process, 120 s timeout) with an
``OpenTelemetryEventHandler.otlp()`` handler and a ``JsonlEventHandler``
registered, one Stat window flushed with ``torchmon.flush()`` and one left
for the exit flush. Two collectors on 127.0.0.1: a port that refuses
connections, and a listening socket that accepts connections and never
answers. Prints the median and the maximum over ``--repeat`` runs of the
flush and of the process's wall time, the number of stderr lines, and
whether the JSON-lines file holds both windows (docs/sinks.md,
"Unreachable collector"; figures in docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHILD = """
import json, sys, time
from datetime import timedelta
import torchmon

endpoint, events, timeout = sys.argv[1], sys.argv[2], sys.argv[3]
kwargs = {} if timeout == "default" else {"export_timeout": float(timeout)}
torchmon.register_event_handler(torchmon.OpenTelemetryEventHandler.otlp(endpoint, **kwargs))
torchmon.register_event_handler(torchmon.JsonlEventHandler(events))
stat = torchmon.Stat("loss", [torchmon.Aggregation.MEAN], timedelta(hours=1))
stat.add(1.0)
start = time.monotonic()
torchmon.flush()
print(json.dumps({"flush_seconds": time.monotonic() - start}), flush=True)
stat.add(2.0)
"""


@contextmanager
def refused() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield f"http://127.0.0.1:{port}/v1/metrics"


@contextmanager
def silent() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield f"http://127.0.0.1:{s.getsockname()[1]}/v1/metrics"


def one_run(collector: object, timeout: str) -> tuple[float, float, int, bool]:
    with tempfile.TemporaryDirectory() as tmp, collector() as endpoint:  # type: ignore[operator]
        events = Path(tmp) / "events.jsonl"
        start = time.monotonic()
        child = subprocess.run(
            [sys.executable, "-c", CHILD, endpoint, str(events), timeout],
            capture_output=True,
            text=True,
            timeout=120,
        )
        total = time.monotonic() - start
        flush = json.loads(child.stdout)["flush_seconds"]
        lines = len(child.stderr.splitlines())
        complete = events.exists() and len(events.read_text().splitlines()) == 2
    return flush, total, lines, complete


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--export-timeout", default="default", help="seconds, or 'default' (the handler's)"
    )
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, export_timeout={args.export_timeout}")
    print(
        f"{'collector':<10} {'flush med/max (s)':>18} {'exit med/max (s)':>18}"
        f" {'stderr lines':>13} jsonl complete"
    )
    for name, collector in (("refused", refused), ("silent", silent)):
        runs = [one_run(collector, args.export_timeout) for _ in range(args.repeat)]
        flushes = [r[0] for r in runs]
        totals = [r[1] for r in runs]
        print(
            f"{name:<10} {statistics.median(flushes):>9.2f}/{max(flushes):<8.2f}"
            f" {statistics.median(totals):>9.2f}/{max(totals):<8.2f}"
            f" {max(r[2] for r in runs):>13} {all(r[3] for r in runs)}"
        )


if __name__ == "__main__":
    main()
