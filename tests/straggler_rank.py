"""One rank of the straggler scenario (tests/integrations/test_watchdog_stragglers.py,
benches/bench_stragglers.py), started by torchrun with gloo on CPU.

Each step: ``with wd.section("compute"): time.sleep(COMPUTE)`` (the rank
``--slow-rank`` sleeps ``--slow-factor`` times as long), then
``with wd.section("allreduce"): dist.all_reduce(t)``, then ``wd.beat()``;
the whole step is also timed into the Stat ``train.step_time`` (P50, one
window per report interval), the whole-step timing a training loop records.
The all-reduced tensor carries the stop flag (MIN of "before my deadline"),
so every rank makes the same number of steps and leaves together. Each rank
writes ``events-rank<rank>.jsonl`` into ``--log-dir``.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import datetime, timedelta

import torch
import torch.distributed as dist

import torchmon

COMPUTE = 0.01


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--slow-rank", type=int, default=2)
    parser.add_argument("--slow-factor", type=float, default=4.0)
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    os.makedirs(args.log_dir, exist_ok=True)
    handler = torchmon.JsonlEventHandler.for_rank(args.log_dir)
    handle = torchmon.register_event_handler(handler)
    step_time = torchmon.Stat(
        "train.step_time",
        [torchmon.Aggregation.COUNT, torchmon.Aggregation.P50],
        timedelta(seconds=args.interval),
    )
    compute = COMPUTE * (args.slow_factor if rank == args.slow_rank else 1.0)
    wd = torchmon.Watchdog(min_timeout=60.0, dump_dir=None, report_interval=args.interval)
    # Everyone starts stepping together (the first tick then sees every rank).
    dist.barrier()
    deadline = time.monotonic() + args.seconds
    steps = 0
    while True:
        start = time.perf_counter()
        with wd.section("compute"):
            time.sleep(compute)
        flag = torch.tensor([1.0 if time.monotonic() < deadline else 0.0])
        with wd.section("allreduce"):
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        wd.beat()
        step_time.add(time.perf_counter() - start)
        steps += 1
        if flag.item() == 0.0:
            break
    wd.close()
    step_time._flush_window()
    dist.barrier()
    torchmon.log_event(
        torchmon.Event("straggler.done", datetime.now(), {"rank": rank, "steps": steps})
    )
    torchmon.unregister_event_handler(handle)
    handler.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
