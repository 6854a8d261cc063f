"""A tiny DDP training loop whose ranks each serve their torchmon Stats to Prometheus.

Run:  torchrun --nproc-per-node 4 examples/torchrun_prometheus.py [--steps N] [--linger S]

Every rank (gloo backend, CPU) records its step time, loss and samples into
torchmon Stats, serves them on port ``--port-base + LOCAL_RANK``
(``PrometheusEventHandler.serve``, with ``rank``, ``local_rank``, ``node`` and
``job`` labels) and writes them to its own ``events-rank<RANK>.jsonl``
(``JsonlEventHandler.for_rank``) in ``--out-dir`` (default: a folder named
after the job in the temporary directory, printed at the start, never the
current one). After training it says so, emits the open windows, writes
what it recorded exactly to ``--ground-truth DIR`` when asked (for tests)
and keeps serving for ``--linger`` seconds so that Prometheus scrapes the
last windows, saying how long. docs/guide.md ("Multi-node setups") has the scrape
configuration and the queries.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

try:
    import torch
    import torch.distributed as dist
    from torch import nn
except ImportError:
    # A clear line instead of a traceback (README.md, "Tests and examples that need torch").
    sys.exit(
        "examples/torchrun_prometheus.py needs PyTorch, which is not installed: "
        "pip install torch (or the CPU wheel: pip install "
        "--index-url https://download.pytorch.org/whl/cpu torch)"
    )

import torchmon
from torchmon import Aggregation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    parser.add_argument(
        "--step-ms", type=float, default=20.0, help="simulated extra work per step (default 20)"
    )
    parser.add_argument("--window-ms", type=int, default=1000, help="Stat window (default 1000)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--port-base", type=int, default=9400, help="rank serves port-base + LOCAL_RANK"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address served (default 127.0.0.1)")
    parser.add_argument(
        "--out-dir",
        type=Path,
        help="where events-rank<R>.jsonl go (default: <temporary directory>/torchmon-<job id>)",
    )
    parser.add_argument("--ground-truth", type=Path, help="write ground-truth-rank<R>.json here")
    parser.add_argument(
        "--linger", type=float, default=0.0, help="seconds to keep serving after training"
    )
    args = parser.parse_args()

    info = torchmon.rank_info()
    dist.init_process_group("gloo")
    torch.manual_seed(1234 + info.rank)  # each rank its own data; DDP syncs the weights

    sink = torchmon.PrometheusEventHandler.serve(
        port_base=args.port_base, host=args.host, prefix="trainer_"
    )
    if args.out_dir is None:
        # Shared by the ranks of one job (torchrun gives them one run id).
        args.out_dir = Path(tempfile.gettempdir()) / f"torchmon-{info.run_id or 'local'}"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    # With the windows' histograms, for `torchmon summarize events-rank*.jsonl`.
    jsonl = torchmon.JsonlEventHandler.for_rank(args.out_dir, distributions=True)
    handles = [torchmon.register_event_handler(sink), torchmon.register_event_handler(jsonl)]
    url = f"http://{args.host}:{sink.port}/metrics"
    print(f"rank {info.rank} (pid {os.getpid()}): {url}", flush=True)
    if info.rank == 0:
        print(f"events go to {args.out_dir}/events-rank<R>.jsonl", flush=True)

    window = timedelta(milliseconds=args.window_ms)
    # A Stat with a P aggregation is also exported as the cumulative histogram
    # trainer_train_step_time_seconds_histogram, which sums across ranks.
    step_time = torchmon.Stat(
        "train.step_time_seconds",
        [Aggregation.MEAN, Aggregation.MAX, Aggregation.COUNT, Aggregation.P50, Aggregation.P99],
        window,
    )
    loss_stat = torchmon.Stat("train.loss", [Aggregation.MEAN, Aggregation.MAX], window)
    # SUM per window is the throughput; the running total (MAX of a counter
    # that only grows) is exact at any moment: sum over ranks = the job's total.
    samples = torchmon.Stat("train.samples", [Aggregation.SUM], window)
    samples_seen = torchmon.Stat("train.samples_seen", [Aggregation.MAX], window)

    model = nn.parallel.DistributedDataParallel(nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    truth_weights = torch.arange(16, dtype=torch.float32) / 16
    recorded_step_times: list[float] = []
    total = 0
    started = time.monotonic()
    try:
        for _ in range(args.steps):
            start = time.perf_counter()
            x = torch.randn(args.batch_size, 16)
            y = (x @ truth_weights).unsqueeze(1) + 0.1 * torch.randn(args.batch_size, 1)
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()  # all-reduces the gradients across ranks
            optimizer.step()
            if args.step_ms > 0:
                time.sleep(args.step_ms / 1000)
            elapsed = time.perf_counter() - start

            step_time.add(elapsed)
            loss_stat.add(loss.item())
            samples.add(args.batch_size)
            total += args.batch_size
            samples_seen.add(total)
            recorded_step_times.append(elapsed)

        # The open windows go out now, before the ground truth is written, so
        # that a scrape after the file appeared sees every sample.
        torchmon.flush()
        done = (
            f"rank {info.rank}: training done, {args.steps} steps in "
            f"{time.monotonic() - started:.1f} s"
        )
        if args.linger > 0:
            print(f"{done}; serving {url} for {args.linger:g} s more (--linger)", flush=True)
        else:
            print(f"{done}; not serving any more (--linger 0)", flush=True)
        if args.ground_truth is not None:
            write_ground_truth(args.ground_truth, info, recorded_step_times, total)
        if args.linger > 0:
            time.sleep(args.linger)
            print(f"rank {info.rank}: stopped serving", flush=True)
    finally:
        for handle in handles:
            torchmon.unregister_event_handler(handle)
        sink.close()
        jsonl.close()
        dist.destroy_process_group()


def write_ground_truth(
    directory: Path, info: torchmon.RankInfo, step_times: list[float], samples_seen: int
) -> None:
    """What this rank recorded, exactly: every step time (``repr`` round-trips
    floats through JSON) and the samples total. Written to a temporary name
    and renamed, so that a reader never sees half a file."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"ground-truth-rank{info.rank}.json"
    partial = path.with_suffix(".json.partial")
    record = {
        "rank": info.rank,
        "local_rank": info.local_rank,
        "world_size": info.world_size,
        "job": info.run_id,
        "steps": len(step_times),
        "step_times": step_times,
        "samples_seen": samples_seen,
    }
    partial.write_text(json.dumps(record), encoding="utf-8")
    os.replace(partial, path)


if __name__ == "__main__":
    main()
