"""One rank of tests/sinks/test_mlflow_torchrun.py under torchrun (gloo):
an MLflowEventHandler with no run given, so one run per rank, and a JSON
lines log per rank; a few windows of a Stat fed by an all_reduce."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import torchmon


def main() -> None:
    uri, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dist.barrier()  # both ranks find or create the experiment at once
    sink = torchmon.MLflowEventHandler(uri, experiment_name="ranks")
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
    (out / f"run-rank{rank}.txt").write_text(str(sink.run_id))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
