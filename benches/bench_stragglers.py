"""The watchdog's straggler scores over time, on 4 torchrun ranks (gloo, CPU).

Run (after ``maturin develop --release``):

    .venv/bin/python benches/bench_stragglers.py [--seconds 20] [--interval 2] [--slow-factor 4]

Each rank (tests/straggler_rank.py) steps ``compute`` (a 10 ms sleep; rank
2's ``--slow-factor`` times as long), an all-reduce, and a beat. Printed:
per report tick and rank, ``straggler.compute.relative`` and
``straggler.allreduce.relative``; then each rank's whole-step score (the
fastest rank's mean window p50 of ``train.step_time`` over its own, as
``torchmon summarize`` computes it), which in synchronous training cannot
see the slow rank. docs/stragglers.md has the figures.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torchmon

TESTS = Path(__file__).resolve().parents[1] / "tests"
RANK_SCRIPT = TESTS / "straggler_rank.py"
RANKS = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--slow-rank", type=int, default=2)
    parser.add_argument("--slow-factor", type=float, default=4.0)
    parser.add_argument("--port", type=int, default=29517)
    args = parser.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="torchmon-stragglers-"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={RANKS}",
         "--master-addr=127.0.0.1", f"--master-port={args.port}", str(RANK_SCRIPT),
         f"--log-dir={log_dir}", f"--seconds={args.seconds}", f"--interval={args.interval}",
         f"--slow-rank={args.slow_rank}", f"--slow-factor={args.slow_factor}"],
        env=env, check=True, stdin=subprocess.DEVNULL, timeout=args.seconds + 180,
    )  # fmt: skip

    scores: dict[tuple[str, int], dict[int, float]] = {}
    step_p50: dict[int, list[float]] = {}
    for rank in range(RANKS):
        for event in torchmon.read_jsonl(log_dir / f"events-rank{rank}.jsonl"):
            if event.name != torchmon.STAT_EVENT:
                continue
            tick = math.floor(event.timestamp.timestamp() / args.interval)
            for section in ("compute", "allreduce"):
                value = event.data.get(f"straggler.{section}.relative.value")
                if isinstance(value, float):
                    scores.setdefault((section, tick), {})[rank] = value
            p50 = event.data.get("train.step_time.p50")
            if isinstance(p50, float):
                step_p50.setdefault(rank, []).append(p50)

    ticks = sorted({tick for _, tick in scores})
    print(f"logs: {log_dir}")
    print("straggler.<section>.relative per report tick (t: seconds since the first tick)")
    print("t      section    " + "  ".join(f"rank{r}" for r in range(RANKS)))
    for tick in ticks:
        for section in ("compute", "allreduce"):
            row = scores.get((section, tick), {})
            cells = "  ".join(f"{row[r]:5.3f}" if r in row else "    -" for r in range(RANKS))
            print(f"{(tick - ticks[0]) * args.interval:5.0f}  {section:9}  {cells}")
    means = {r: math.fsum(v) / len(v) for r, v in step_p50.items()}
    fastest = min(means.values())
    print("whole step (train.step_time, mean of window p50s), score = fastest / own:")
    for rank, mean in sorted(means.items()):
        print(f"  rank{rank}: p50 {mean * 1000:.2f} ms  score {fastest / mean:.3f}")


if __name__ == "__main__":
    main()
