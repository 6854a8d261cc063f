"""A simulated training loop recorded with torchmon, written against torch.monitor's API.

Run:  python examples/quickstart.py [--logdir DIR]

Records a per-step loss and step time into windowed Stats, logs one Event per
epoch, writes the Stat windows to TensorBoard (via tensorboardX, when
installed; each run in a new directory, ``runs/torchmon-quickstart-<timestamp>``
by default) and prints a summary. Replace ``import torchmon as monitor`` with
``import torch.monitor as monitor`` and the recording code runs unchanged.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shlex
import shutil
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import torchmon as monitor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--logdir",
        type=Path,
        help="a new or empty directory (default: runs/torchmon-quickstart-<timestamp>)",
    )
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()
    # A directory per run: TensorBoard shows two runs written into one
    # directory as one run, their points mixed.
    logdir = args.logdir or fresh_logdir()
    if logdir.is_dir() and any(logdir.iterdir()):
        parser.error(f"--logdir {logdir} is not empty")

    windows: list[dict[str, float]] = []
    epochs: list[dict[str, object]] = []

    def keep(event: monitor.Event) -> None:
        if event.name == monitor.STAT_EVENT:
            windows.append(event.data)  # type: ignore[arg-type]
        else:
            epochs.append(event.data)

    handles = [monitor.register_event_handler(keep)]
    writer = None
    try:
        from tensorboardX import SummaryWriter

        writer = SummaryWriter(logdir=str(logdir))
        handles.append(monitor.register_event_handler(monitor.TensorboardEventHandler(writer)))
        print(f"writing TensorBoard files to {logdir}")
    except ImportError:
        print("tensorboardX is not installed: skipping TensorBoard output")

    window = timedelta(milliseconds=100)
    loss = monitor.Stat(
        "train.loss",
        [monitor.Aggregation.MEAN, monitor.Aggregation.MIN, monitor.Aggregation.MAX],
        window,
    )
    step_time = monitor.Stat(
        "train.step_us", [monitor.Aggregation.MEAN, monitor.Aggregation.COUNT], window
    )
    rng = random.Random(0)
    step = 0
    for epoch in range(args.epochs):
        epoch_start = time.perf_counter()
        for _ in range(args.steps):
            t0 = time.perf_counter_ns()
            value = 2.0 * math.exp(-step / 3000) + rng.random() * 0.1  # a "loss"
            time.sleep(0.0002)  # a stand-in for the work of one step
            loss.add(value)
            step_time.add((time.perf_counter_ns() - t0) / 1000)
            step += 1
        monitor.log_event(
            monitor.Event(
                "train.epoch_end",
                datetime.now(),
                {"epoch": epoch, "loss": value, "seconds": time.perf_counter() - epoch_start},
            )
        )
    del loss, step_time  # destruction flushes the open windows

    for handle in handles:
        monitor.unregister_event_handler(handle)
    if writer is not None:
        writer.close()

    print(f"{step} steps, {len(windows)} Stat windows, {len(epochs)} epoch events\n")
    print(f"{'epoch':>5} {'loss':>8} {'seconds':>8}")
    for data in epochs:
        print(f"{data['epoch']:>5} {data['loss']:>8.4f} {data['seconds']:>8.3f}")
    loss_windows = [w for w in windows if "train.loss.mean" in w]
    if loss_windows:
        first, last = loss_windows[0], loss_windows[-1]
        print(
            f"\nloss mean: first window {first['train.loss.mean']:.4f}, "
            f"last window {last['train.loss.mean']:.4f}"
        )
    if writer is not None:
        print(f"\nLook at it:  {tensorboard_command(logdir)}")


def fresh_logdir() -> Path:
    """``runs/torchmon-quickstart-<timestamp>``, numbered when it exists."""
    base = Path("runs") / f"torchmon-quickstart-{datetime.now():%Y%m%d-%H%M%S}"
    candidate, n = base, 1
    while candidate.exists():
        candidate = base.with_name(f"{base.name}-{n}")
        n += 1
    return candidate


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
