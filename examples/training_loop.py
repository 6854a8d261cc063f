"""A simulated training loop recorded with torchmon to TensorBoard and JSON lines.

Run:  python examples/training_loop.py [--logdir DIR] [--epochs N] [--steps N]

Each step records its batch loss with ``Stat.add``, the batch's per-sample
losses with ``Stat.add_many`` and its duration; every closed window goes to
``DIR/events.jsonl`` (``JsonlEventHandler``) and to a TensorBoard event file
in ``DIR`` (``TensorboardEventHandler.logdir``, torchmon's own writer). One ``train.epoch_end``
event per epoch carries the epoch's numbers. DIR defaults to a new temporary
directory; it must be new or empty. Takes about a second with the defaults.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shlex
import shutil
import sys
import tempfile
import time
from array import array
from datetime import datetime, timedelta
from pathlib import Path

import torchmon
from torchmon import Aggregation


def train(epochs: int, steps: int, window: timedelta, seed: int = 0) -> None:
    """The training loop: only recording, no handlers (they are the caller's business)."""
    rng = random.Random(seed)
    batch = 16
    loss = torchmon.Stat(
        "train.loss",
        [Aggregation.MEAN, Aggregation.MIN, Aggregation.MAX, Aggregation.COUNT],
        window,
    )
    sample_loss = torchmon.Stat(
        "train.sample_loss", [Aggregation.MEAN, Aggregation.MAX, Aggregation.COUNT], window
    )
    step_time = torchmon.Stat("train.step_time_us", [Aggregation.MEAN, Aggregation.MAX], window)
    total = epochs * steps
    step = 0
    for epoch in range(1, epochs + 1):
        epoch_start = time.perf_counter()
        epoch_loss = 0.0
        for _ in range(steps):
            t0 = time.perf_counter_ns()
            level = 0.1 + 2.0 * math.exp(-3.0 * step / total)
            losses = array("d", (abs(rng.gauss(level, 0.2 * level)) for _ in range(batch)))
            time.sleep(0.001)  # stands in for the forward and backward pass
            batch_loss = math.fsum(losses) / batch
            loss.add(batch_loss)
            sample_loss.add_many(losses)  # one call for the whole batch, read in place
            step_time.add((time.perf_counter_ns() - t0) / 1000)
            epoch_loss += batch_loss
            step += 1
        torchmon.log_event(
            torchmon.Event(
                "train.epoch_end",
                datetime.now(),
                {
                    "epoch": epoch,
                    "loss": epoch_loss / steps,
                    "steps": steps,
                    "seconds": time.perf_counter() - epoch_start,
                },
            )
        )
    # Destroying a Stat emits its open, partial window: no sample is lost.
    del loss, sample_loss, step_time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", type=Path, help="a new or empty directory")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--window-ms", type=int, default=250, help="Stat window (default 250)")
    args = parser.parse_args()
    if args.logdir is None:
        logdir = Path(tempfile.mkdtemp(prefix="torchmon-example-"))
    else:
        logdir = args.logdir
        if logdir.exists() and any(logdir.iterdir()):
            parser.error(f"--logdir {logdir} is not empty")
        logdir.mkdir(parents=True, exist_ok=True)
    jsonl_path = logdir / "events.jsonl"

    jsonl = torchmon.JsonlEventHandler(jsonl_path)
    handles = [torchmon.register_event_handler(jsonl)]
    # torchmon's own TensorBoard writer (no tensorboardX needed): Stat windows
    # as scalars, epoch events as train.epoch_end/<field> at step <epoch>.
    tensorboard = torchmon.TensorboardEventHandler.logdir(
        logdir, other_events=True, step_field="epoch"
    )
    handles.append(torchmon.register_event_handler(tensorboard))
    try:
        train(args.epochs, args.steps, timedelta(milliseconds=args.window_ms))
    finally:
        # Unregister first, then close: a closed sink raises on the next event.
        for handle in handles:
            torchmon.unregister_event_handler(handle)
        jsonl.close()
        tensorboard.close()

    events = list(torchmon.read_jsonl(jsonl_path))
    windows = [e.data for e in events if e.name == torchmon.STAT_EVENT]
    samples = sum(w.get("train.loss.count", 0.0) for w in windows)
    print(f"wrote {len(events)} events to {jsonl_path}: {len(windows)} Stat windows")
    print(f"train.loss samples over all windows: {samples:.0f}")
    for e in events:
        if e.name == "train.epoch_end":
            d = e.data
            print(f"epoch {d['epoch']}: loss {d['loss']:.4f}, {d['seconds']:.2f} s")
    print(f"Look at it:  {tensorboard_command(logdir)}")


def tensorboard_command(logdir: str | Path) -> str:
    """The command that shows ``logdir`` in TensorBoard, runnable as printed
    from the current directory: this Python's ``tensorboard`` script by its
    path (``.venv/bin/tensorboard``: a venv that is not activated is not on
    PATH), or the bare name when PATH finds that very script."""
    where = shlex.quote(str(logdir))
    python = shlex.quote(sys.executable)
    script = Path(sys.executable).parent / "tensorboard"
    if not script.is_file():
        return (
            f"{python} -m pip install tensorboard && {python} -m tensorboard.main --logdir {where}"
        )
    found = shutil.which("tensorboard")
    if found is not None and Path(found).resolve() == script.resolve():
        return f"tensorboard --logdir {where}"
    relative = os.path.relpath(script)
    shown = str(script) if relative.startswith("..") else relative
    return f"{shlex.quote(shown)} --logdir {where}"


if __name__ == "__main__":
    main()
