"""What W&B costs the thread that calls it, offline (``WANDB_MODE=offline``):
``run.log({10 keys}, step=i)`` per call, ``wandb.init`` and ``run.finish``,
beside ``math.fabs(1.5)`` measured in the same run: the budget of the W&B
sink's background thread (``WandbEventHandler``).

Run:  python benches/bench_wandb_log.py [--calls 2000] [--repeat 5] [--inits 5]

- ``run.log``: ``--repeat`` batches of ``--calls`` calls each in one run,
  each call a fresh dict of 10 float values with ``step=i`` (what the sink
  logs per window); per call = batch time / calls; median and min over the
  batches. The first batch also pays any warm-up.
- ``wandb.init`` / ``run.finish``: ``--inits`` runs in this process, each
  timed whole (``finish`` after ``--calls`` logged steps); median and min.
  The process's first ``wandb.init`` also starts wandb-core (the service
  that writes the files), so it is timed apart, in ``--inits`` fresh
  processes (the import of wandb not counted). ``run.finish`` returning does
  not mean the .wandb file is whole (tests/wandb_offline.py waits for it).
- ``math.fabs(1.5)``: ``timeit``, min and median of 7 repeats, ns per call.

Offline and quiet; every file goes to a temporary directory (nothing leaves
the machine, nothing is written under the home directory). Needs wandb.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from typing import Any

KEYS = [f"metric/{k}" for k in range(10)]


def offline_env(root: str) -> None:
    for name in ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_RUN_ID", "WANDB_RESUME"):
        os.environ.pop(name, None)
    os.environ.update(
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_ERROR_REPORTING="false",
        WANDB_DISABLE_GIT="true",
        WANDB_DISABLE_CODE="true",
        WANDB_CONSOLE="off",
        WANDB_DIR=root,
        WANDB_CONFIG_DIR=os.path.join(root, "config"),
        WANDB_CACHE_DIR=os.path.join(root, "cache"),
        WANDB_DATA_DIR=os.path.join(root, "data"),
        WANDB_ARTIFACT_DIR=os.path.join(root, "artifacts"),
    )


def log_batches(wandb: Any, root: str, calls: int, repeat: int) -> list[float]:
    """Seconds per run.log call, one figure per batch."""
    run = wandb.init(mode="offline", dir=root, project="bench")
    per_call = []
    step = 0
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            run.log({key: step * 0.5 + k for k, key in enumerate(KEYS)}, step=step)
            step += 1
        per_call.append((time.perf_counter() - start) / calls)
    run.finish()
    return per_call


def init_finish(wandb: Any, root: str, inits: int, calls: int) -> tuple[list[float], list[float]]:
    """Seconds of wandb.init and of run.finish (after `calls` steps), per run."""
    init_s, finish_s = [], []
    for _ in range(inits):
        start = time.perf_counter()
        run = wandb.init(mode="offline", dir=root, project="bench")
        init_s.append(time.perf_counter() - start)
        for step in range(calls):
            run.log({key: step * 0.5 + k for k, key in enumerate(KEYS)}, step=step)
        start = time.perf_counter()
        run.finish()
        finish_s.append(time.perf_counter() - start)
    return init_s, finish_s


FIRST_INIT = """
import time, wandb
start = time.perf_counter()
run = wandb.init(mode="offline", project="bench")
print(time.perf_counter() - start)
run.finish()
"""


def first_inits(inits: int) -> list[float]:
    """Seconds of a process's first wandb.init, one fresh process each."""
    return [
        float(
            subprocess.run(
                [sys.executable, "-c", FIRST_INIT], capture_output=True, text=True, check=True
            ).stdout.split()[-1]
        )
        for _ in range(inits)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=2000, help="run.log calls per batch")
    parser.add_argument("--repeat", type=int, default=5, help="batches of run.log calls")
    parser.add_argument("--inits", type=int, default=5, help="wandb.init/run.finish runs")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-wandb-") as root:
        offline_env(root)
        import wandb

        print(f"wandb {wandb.__version__}, offline; {len(KEYS)} keys per run.log")
        fabs = math.fabs
        fabs_ns = [
            t / 1_000_000 * 1e9
            for t in timeit.Timer("fabs(1.5)", globals={"fabs": fabs}).repeat(7, 1_000_000)
        ]
        logs = log_batches(wandb, root, args.calls, args.repeat)
        init_s, finish_s = init_finish(wandb, root, args.inits, args.calls)
        first_s = first_inits(args.inits)

    print("| operation | median | min |")
    print("| --- | --- | --- |")
    print(f"| math.fabs(1.5) | {statistics.median(fabs_ns):.1f} ns | {min(fabs_ns):.1f} ns |")
    print(
        f"| run.log({len(KEYS)} keys, step=i), {args.repeat} x {args.calls} calls"
        f" | {statistics.median(logs) * 1e3:.3f} ms | {min(logs) * 1e3:.3f} ms |"
    )
    print(
        f"| wandb.init, first in a process (starts wandb-core), {args.inits} processes"
        f" | {statistics.median(first_s):.3f} s | {min(first_s):.3f} s |"
    )
    print(
        f"| wandb.init, later in the process, {args.inits} runs"
        f" | {statistics.median(init_s):.3f} s | {min(init_s):.3f} s |"
    )
    print(
        f"| run.finish after {args.calls} steps, {args.inits} runs"
        f" | {statistics.median(finish_s):.3f} s | {min(finish_s):.3f} s |"
    )
    ratio = statistics.median(logs) * 1e9 / statistics.median(fabs_ns)
    print(f"run.log per call = {ratio:,.0f} x math.fabs(1.5) (medians)")


if __name__ == "__main__":
    main()
