"""One rank of tests/sinks/test_wandb_torchrun.py under torchrun (gloo): a
WandbEventHandler with no run given and no ``wandb.run``, so the handler
starts one run per rank, and a JSON lines log per rank; a few windows of a
Stat fed by an all_reduce. W&B is offline: the test passes the env."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import wandb

import torchmon


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    assert wandb.run is None
    sink = torchmon.WandbEventHandler()
    assert sink.run is not None and wandb.run is sink.run
    log = torchmon.JsonlEventHandler(out / f"events-rank{rank}.jsonl")
    torchmon.register_event_handler(log)
    torchmon.register_event_handler(sink)
    loss = torchmon.Stat("train.loss", [torchmon.Aggregation.MEAN], timedelta(hours=1))
    for window in range(5):
        for step in range(4):
            value = torch.tensor([float(rank * 100 + window * 4 + step)])
            dist.all_reduce(value)
            loss.add(float(value) + rank)
        torchmon.flush()
    assert sink.flush(30.0)
    sink.close()  # finishes the run it started
    assert wandb.run is None
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
