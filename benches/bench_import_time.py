"""How much later than a bare interpreter ``import torchmon`` is done (docs/performance.md).

Runs ``python -c pass`` and ``python -c "import torchmon"`` N times each, in
turn, each in a new process with the same environment (PYTHONPATH pointing at
this tree's ``python/`` unless it is set), and prints the median wall time and
CPU time (user + system: less disturbed by other load on the machine) of each
and their difference: what ``import torchmon`` adds to a program's start.
Unix only (``resource``).

    python benches/bench_import_time.py [-n 40] [--python PATH]

``python -X importtime -c "import torchmon"`` shows where the time goes.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _run_once(python: str, code: str, env: dict[str, str]) -> tuple[float, float]:
    """The wall time and the CPU time (user + system) of one run, in seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([python, "-c", code], env=env, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("-n", type=int, default=40, help="runs of each (default: 40)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to time")
    args = parser.parse_args()
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", str(Path(__file__).resolve().parent.parent / "python"))
    # Fail now, not with a median of failures.
    _run_once(args.python, "import torchmon", env)
    runs: dict[str, list[tuple[float, float]]] = {"pass": [], "import torchmon": []}
    for _ in range(args.n):
        # Alternated, so that a burst of load on the machine hits both alike.
        for code, times in runs.items():
            times.append(_run_once(args.python, code, env))
    medians = {
        code: (
            statistics.median(wall for wall, _ in times) * 1e3,
            statistics.median(cpu for _, cpu in times) * 1e3,
        )
        for code, times in runs.items()
    }
    print(f"median of {args.n} runs each        wall ms   CPU ms")
    for code, (wall, cpu) in medians.items():
        print(f"  {'python -c ' + repr(code):30} {wall:7.1f}  {cpu:7.1f}")
    wall = medians["import torchmon"][0] - medians["pass"][0]
    cpu = medians["import torchmon"][1] - medians["pass"][1]
    print(f"  {'import torchmon adds':30} {wall:7.1f}  {cpu:7.1f}")


if __name__ == "__main__":
    main()
