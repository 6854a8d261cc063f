"""A tiny GPT-2 trained by the Hugging Face Trainer, recorded by torchmon.

Run:  python examples/hf_trainer.py [--log-dir DIR] [--steps N]
      torchrun --nproc-per-node=2 examples/hf_trainer.py --log-dir DIR   (2 ranks, gloo)

Needs transformers, accelerate (``pip install ".[transformers]"`` in the
torchmon checkout) and torch. In a venv without torch, install the CPU
torch first (``pip install torch --index-url
https://download.pytorch.org/whl/cpu``): accelerate requires torch, and pip
would otherwise pull the default CUDA build and its CUDA packages. The model is built
from a config in code and the data are random tokens, so nothing is
downloaded. The one torchmon line is ``callbacks=[TorchmonCallback(log_dir)]``:
step times, data times, tokens per second and every value the Trainer logs
go to ``DIR/events-rank{N}.jsonl`` and to TensorBoard files in ``DIR/rank{N}``
(docs/integrations.md). The Trainer's own record, ``trainer_state.json``, is
saved in DIR too. Takes a few seconds on a CPU.
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

VOCAB = 64
SEQUENCE = 16


def build_trainer(out: Path, steps: int, callbacks: list[Any], seed: int = 0) -> Any:
    """The Trainer of the tiny run: ``callbacks`` is where torchmon goes."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=SEQUENCE, n_embd=16, n_layer=1, n_head=2, n_inner=32
    )
    model = GPT2LMHeadModel(config)
    tokens = torch.randint(0, VOCAB, (256, SEQUENCE), generator=torch.Generator().manual_seed(seed))
    dataset = [{"input_ids": row, "labels": row} for row in tokens]
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        logging_steps=5,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        include_num_input_tokens_seen=True,  # gives train.tokens_per_second
        dataloader_num_workers=0,
        # Under torchrun on CPUs: gloo (set only there; alone it asks for a process group).
        ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None,
        seed=seed,
    )
    return Trainer(model=model, args=args, train_dataset=dataset, callbacks=callbacks)


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
        from torchmon.integrations.transformers import TorchmonCallback
    except ImportError as exc:
        sys.exit(f"this example needs transformers: {exc}")
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="torchmon-hf-"))

    trainer = build_trainer(
        log_dir,
        args.steps,
        callbacks=[TorchmonCallback(log_dir, window=args.window, watchdog=args.watchdog or None)],
    )
    trainer.train()
    trainer.save_state()  # the Trainer's own log, DIR/trainer_state.json

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
