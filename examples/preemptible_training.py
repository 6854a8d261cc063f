"""A small PyTorch training job whose metrics survive preemption.

Run:  python examples/preemptible_training.py [--out DIR] [--steps N] [--wait-for-signal]

Without ``--out`` the files go to a new directory under the temporary
directory (``torchmon-preemptible-...``), not into the current one; the
last line printed names it.

A tiny linear model is trained on the CPU from a ``DataLoader`` with two
``fork`` workers. The main process records each step's loss and batch size
(Stats with 60-second windows, and a WaitCounter around each step); each
worker records the index of every item it loads. Every process writes its own
JSON lines file (``DIR/main.jsonl``, ``DIR/worker-<pid>.jsonl``); the main
process also writes TensorBoard files to ``DIR/tb`` (with tensorboardX, when
installed).

Nothing is lost when the job ends:

- ``torchmon.flush_on_signals()``: a SIGTERM (what a scheduler sends to
  preempt a job) or SIGHUP first delivers the open windows, then kills the
  process as it would have (exit status -15, 143 in a shell);
- the workers flush at their end, whether the ``DataLoader`` shuts them down or
  they notice that the main process is gone;
- at a normal end, the exit flush.

Each process also appends what it added to ``DIR/truth-<pid>.jsonl`` with
plain writes, so a reader can check that every sample is in the windows.
Without ``--wait-for-signal`` the job runs one epoch (``--steps`` batches) and
ends; with it, it trains ``--steps`` batches of a longer epoch, prints
``ready`` and waits up to 60 s for a signal, its windows open.
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
from typing import Any

try:
    import torch
    from torch.utils.data import DataLoader, Dataset
except ImportError:
    # A clear line instead of a traceback (README.md, "Tests and examples that need torch").
    sys.exit(
        "examples/preemptible_training.py needs PyTorch, which is not installed: "
        "pip install torch (or the CPU wheel: pip install "
        "--index-url https://download.pytorch.org/whl/cpu torch)"
    )

import torchmon

BATCH = 8
WINDOW = timedelta(seconds=60)

# Created at import, before the workers are forked: each worker records into
# its inherited copy (empty at the fork: the main process never adds to it).
items_loaded = torchmon.Stat("data.items", [torchmon.COUNT, torchmon.SUM], WINDOW)

OUT = Path(".")
MAIN_HANDLES: list[torchmon.EventHandlerHandle] = []


def record_truth(**fields: Any) -> None:
    """One line of ground truth, written with a single append."""
    line = json.dumps({"pid": os.getpid(), **fields}) + "\n"
    fd = os.open(OUT / f"truth-{os.getpid()}.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


class Points(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """y = 3x + 1 with a little noise."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        items_loaded.add(float(index))
        record_truth(item=index)
        x = torch.tensor([index / self.size])
        return x, 3 * x + 1 + 0.01 * torch.randn(1)


def worker_init(worker_id: int) -> None:
    # A worker inherits the main process's handlers: it gets its own file
    # instead (the main's TensorBoard writer has no writer thread here).
    for handle in MAIN_HANDLES:
        torchmon.unregister_event_handler(handle)
    torchmon.register_event_handler(torchmon.JsonlEventHandler(OUT / f"worker-{os.getpid()}.jsonl"))


def open_sinks() -> None:
    MAIN_HANDLES.append(
        torchmon.register_event_handler(torchmon.JsonlEventHandler(OUT / "main.jsonl"))
    )
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        return
    writer = SummaryWriter(str(OUT / "tb"))
    MAIN_HANDLES.append(torchmon.register_event_handler(torchmon.TensorboardEventHandler(writer)))


def train(steps: int, wait_for_signal: bool) -> None:
    torch.manual_seed(0)
    loss_stat = torchmon.Stat("train.loss", [torchmon.COUNT, torchmon.MEAN], WINDOW)
    samples = torchmon.Stat("train.samples", [torchmon.SUM], WINDOW)
    step_time = torchmon.WaitCounter("train.step", window_size=WINDOW)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # A preemptible run has a long epoch; it is stopped after `steps` batches.
    size = BATCH * steps * (100 if wait_for_signal else 1)
    loader = DataLoader(
        Points(size),
        batch_size=BATCH,
        num_workers=2,
        multiprocessing_context="fork",
        worker_init_fn=worker_init,
    )
    batches = iter(loader)  # kept: the workers live as long as it does
    for step, (x, y) in enumerate(batches):
        with step_time.guard():
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        loss_stat.add(loss.item())
        samples.add(len(x))
        record_truth(loss=loss.item(), samples=len(x))
        if step + 1 == steps:
            break
    if wait_for_signal:
        print("ready", flush=True)
        time.sleep(60)  # a SIGTERM now lands in the middle of the open windows,
        # with the workers alive
    del batches  # shuts the workers down; they flush as they end
    print(f"trained {steps} steps, loss {loss.item():.4f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    global OUT
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        help="directory for the files (default: a new torchmon-preemptible-* directory "
        "under the temporary directory)",
    )
    parser.add_argument("--steps", type=int, default=20, help="batches to train")
    parser.add_argument("--wait-for-signal", action="store_true", help="wait for a SIGTERM")
    args = parser.parse_args(argv)
    if args.out is None:
        # A fresh directory per run: a second run must not append to the
        # first one's files, nor write into the checkout it is run from.
        args.out = Path(tempfile.mkdtemp(prefix="torchmon-preemptible-"))
    OUT = args.out
    OUT.mkdir(parents=True, exist_ok=True)
    torchmon.flush_on_signals()
    open_sinks()
    train(args.steps, args.wait_for_signal)
    print(f"files in {OUT}: main.jsonl, worker-<pid>.jsonl, truth-<pid>.jsonl", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
