"""A tiny LightningModule trained by Lightning's Trainer, recorded by torchmon.

Run:  python examples/lightning_trainer.py [--log-dir DIR] [--steps N]
      torchrun --nproc-per-node=2 examples/lightning_trainer.py --log-dir DIR   (2 ranks, gloo)

Needs lightning (``pip install ".[lightning]"`` in the torchmon checkout)
and torch. The torchmon lines are ``logger=TorchmonLogger(DIR)`` (what
``self.log`` logs, as windowed Stats) and ``callbacks=[TorchmonCallback()]``
(step and data times): their events go
to ``DIR/events-rank{N}.jsonl`` and to TensorBoard files in ``DIR/rank{N}``
(docs/integrations.md). Lightning's own CSVLogger writes ``DIR/csv`` beside
them, for comparison. The data are random, nothing is downloaded; a few
seconds on a CPU.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any


def build_trainer(out: Path, steps: int, logger: Any, callbacks: list[Any]) -> tuple[Any, Any, Any]:
    """(trainer, module, dataloader) of the tiny run."""
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class TinyRegression(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Sequential(
                torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
            )

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss)  # the Stat train_loss
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    pl.seed_everything(0, verbose=False)
    x = torch.randn(512, 8)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(512, 1)
    data = DataLoader(TensorDataset(x, y), batch_size=16)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    trainer = pl.Trainer(
        default_root_dir=str(out),
        max_steps=steps,
        accelerator="cpu",
        # Under torchrun: one process per rank, gloo on CPUs.
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=int(os.environ.get("WORLD_SIZE", "1"))
        // int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        strategy="ddp" if distributed else "auto",
        logger=logger,
        callbacks=callbacks,
        log_every_n_steps=5,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    return trainer, TinyRegression(), data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--log-dir", type=Path, help="where the events go (default: a new temp dir)"
    )
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--window", type=float, default=60.0, help="Stat window, seconds")
    parser.add_argument(
        "--watchdog",
        action="store_true",
        help="time the step's sections with a torchmon.Watchdog (docs/stragglers.md)",
    )
    args = parser.parse_args()
    try:
        # First: its ImportError names the extra that installs the framework.
        from torchmon.integrations.lightning import TorchmonCallback, TorchmonLogger
    except ImportError as exc:
        sys.exit(f"this example needs lightning: {exc}")
    from lightning.pytorch.loggers import CSVLogger

    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="torchmon-lightning-"))

    loggers = [
        TorchmonLogger(log_dir, window=args.window),
        CSVLogger(log_dir, name="csv", version=0),
    ]
    trainer, module, data = build_trainer(
        log_dir,
        args.steps,
        loggers,
        [TorchmonCallback(window=args.window, watchdog=args.watchdog or None)],
    )
    trainer.fit(module, data)

    import torchmon

    if torchmon.rank_info().rank == 0:
        print(f"trained {args.steps} steps; torchmon's events are in {log_dir}")
        for command in next_steps(log_dir):
            print(f"  {command}")


def next_steps(log_dir: Path) -> list[str]:
    """The commands that look at the run, each runnable as printed from the
    current directory (as the other examples and ``torchmon demo`` print
    theirs)."""
    where = shlex.quote(str(log_dir))
    return [
        f"{torchmon_command()} summarize {where}/events-rank*.jsonl",
        tensorboard_command(log_dir),
    ]


def torchmon_command() -> str:
    """This Python's ``torchmon`` script: the bare name when PATH finds that
    very script, else its path (``.venv/bin/torchmon``: a venv that is not
    activated is not on PATH), else ``python -m torchmon``."""
    script = Path(sys.executable).parent / "torchmon"
    if not script.is_file():
        return f"{shlex.quote(sys.executable)} -m torchmon"
    return _script_as_typed(script)


def tensorboard_command(logdir: str | Path) -> str:
    """The command that shows ``logdir`` in TensorBoard, runnable as printed
    from the current directory: this Python's ``tensorboard`` script by its
    path, or the bare name when PATH finds that very script."""
    where = shlex.quote(str(logdir))
    python = shlex.quote(sys.executable)
    script = Path(sys.executable).parent / "tensorboard"
    if not script.is_file():
        return (
            f"{python} -m pip install tensorboard && {python} -m tensorboard.main --logdir {where}"
        )
    return f"{_script_as_typed(script)} --logdir {where}"


def _script_as_typed(script: Path) -> str:
    found = shutil.which(script.name)
    if found is not None and Path(found).resolve() == script.resolve():
        return script.name
    relative = os.path.relpath(script)
    shown = str(script) if relative.startswith("..") else relative
    # A word without a slash is looked up on PATH.
    return shlex.quote(shown if os.sep in shown else os.path.join(".", shown))


if __name__ == "__main__":
    main()
