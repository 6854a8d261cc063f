"""Seconds and peak memory of ``torchmon summarize`` and ``torchmon
to-tensorboard`` on large JSON-lines logs (docs/performance.md).

Generates logs of the given sizes in a temporary directory (deleted at the
end) from real Stat windows (20 Stats, every fifth with its distribution
stored, as ``JsonlEventHandler(distributions=True)`` writes them, and an
epoch event now and then), runs each command on each as a subprocess, and
prints its wall and CPU seconds (user + system: the wall time of a shared
machine depends on its load) and peak RSS (from ``os.wait4``, that child
alone), the medians of ``--repeats`` runs (the commands take turns, so that a
change of load hits each alike). In the same run, the floor: a bare Python
loop that only ``json.loads`` every line of the same file; each command's CPU
seconds over the floor's is its ratio (docs/performance.md: ``torchmon
summarize`` at most 1.0).

    .venv/bin/python benches/bench_summarize.py                 # 50 MB and 500 MB
    .venv/bin/python benches/bench_summarize.py --quick         # 5 MB, a few seconds
    .venv/bin/python benches/bench_summarize.py --sizes 50 --commands summarize
    # the code before: the same commands with another checkout's package first
    .venv/bin/python benches/bench_summarize.py --pythonpath /path/to/other/python
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

FLOOR = "import json, sys\nfor line in open(sys.argv[1], 'rb'):\n    json.loads(line)\n"


def template_lines(directory: Path) -> list[bytes]:
    """The lines of real Stat windows and events, written by the JSON-lines sink."""
    import random

    import torchmon
    from torchmon.handlers.jsonl import JsonlEventHandler
    from torchmon.testing import ManualClock

    path = directory / "template.jsonl"
    handler = JsonlEventHandler(path, distributions=True)
    handle = torchmon.register_event_handler(handler)
    rng = random.Random(0)
    try:
        with ManualClock() as clock:
            stats = []
            for i in range(20):
                aggregations = [torchmon.MEAN, torchmon.MIN, torchmon.MAX, torchmon.COUNT]
                if i % 5 == 0:
                    aggregations.append(torchmon.P99)
                stats.append(torchmon.Stat(f"train.metric{i}", aggregations, timedelta(seconds=1)))
            for window in range(10):
                for stat in stats:
                    stat.add_many([rng.lognormvariate(0.0, 1.0) for _ in range(64)])
                epoch = {"epoch": window, "loss": 0.5}
                torchmon.log_event(torchmon.Event("train.epoch_end", datetime.now(), epoch))
                clock.advance(1000)
            torchmon.flush()
        del stats
    finally:
        torchmon.unregister_event_handler(handle)
        handler.close()
    return path.read_bytes().splitlines(keepends=True)


def write_log(path: Path, lines: list[bytes], megabytes: int) -> int:
    """Repeats ``lines`` up to ``megabytes`` MB; returns the number of lines."""
    block = b"".join(lines)
    target = megabytes * 1_000_000
    written = count = 0
    with open(path, "wb") as file:
        while written < target:
            file.write(block)
            written += len(block)
            count += len(lines)
    return count


def run(argv: list[str], pythonpath: str | None) -> tuple[float, float, float, int]:
    """Wall seconds, CPU seconds (user + system), peak RSS in MB, and the
    exit code of one child."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    start = time.perf_counter()
    child = subprocess.Popen(
        argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert child.stderr is not None
    error = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        sys.stderr.write(error.decode(errors="replace"))
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, child.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="50,500", help="log sizes in MB (default 50,500)")
    parser.add_argument("--quick", action="store_true", help="one 5 MB log")
    parser.add_argument("--commands", default="floor,summarize,to-tensorboard")
    parser.add_argument("--pythonpath", help="PYTHONPATH for the torchmon commands (a baseline)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per command (default 5)")
    args = parser.parse_args()
    sizes = [5] if args.quick else [int(s) for s in args.sizes.split(",")]
    commands = args.commands.split(",")
    print(f"Python {sys.version.split()[0]}; {os.cpu_count()} CPUs; PYTHONPATH={args.pythonpath}")
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    print(
        "| log | lines | command | wall s | CPU s | MB per CPU s | peak RSS MB | RSS / log size "
        "| CPU / floor |"
    )
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory(prefix="bench-summarize-") as tmp:
        directory = Path(tmp)
        lines = template_lines(directory)
        for megabytes in sizes:
            log = directory / f"log-{megabytes}mb.jsonl"
            count = write_log(log, lines, megabytes)
            size_mb = log.stat().st_size / 1e6
            runs: dict[str, list[tuple[float, float, float, int]]] = {c: [] for c in commands}
            for _ in range(max(1, args.repeats)):
                for command in commands:
                    argv = argv_for(command, log, directory, megabytes)
                    path = None if command == "floor" else args.pythonpath
                    runs[command].append(run(argv, path))
            floor = statistics.median(r[1] for r in runs["floor"]) if "floor" in runs else None
            for command in commands:
                seconds = statistics.median(r[0] for r in runs[command])
                cpu = statistics.median(r[1] for r in runs[command])
                rss = max(r[2] for r in runs[command])
                codes = {r[3] for r in runs[command]} - {0}
                status = f" (exit {sorted(codes)})" if codes else ""
                ratio = f"{cpu / floor:.2f}" if floor else "-"
                print(
                    f"| {size_mb:.0f} MB | {count:,} | {command}{status} | {seconds:.2f} | "
                    f"{cpu:.2f} | {size_mb / cpu:.1f} | {rss:.0f} | {rss / size_mb:.2f} "
                    f"| {ratio} |",
                    flush=True,
                )
            log.unlink()


def argv_for(command: str, log: Path, directory: Path, megabytes: int) -> list[str]:
    torchmon_cmd = [sys.executable, "-m", "torchmon"]
    if command == "floor":
        return [sys.executable, "-c", FLOOR, str(log)]
    if command == "summarize":
        return [*torchmon_cmd, "summarize", str(log)]
    if command == "to-tensorboard":
        return [*torchmon_cmd, "to-tensorboard", str(log), str(directory / f"tb-{megabytes}")]
    raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main()
