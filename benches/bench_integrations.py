"""The framework integrations' cost: steps per second of the tiny runs of
examples/hf_trainer.py and examples/lightning_trainer.py with and without
torchmon, in one process, and what the step hooks cost per step.

Run:  OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 \
      python benches/bench_integrations.py [--steps 100] [--repeat 5]

- Steps per second are counted over the training loop only (from the first
  step's begin to the last step's end, by a timing hook present in both
  variants), so the Trainer's setup does not dilute them. The variants
  alternate, ``--repeat`` times, each pair back to back with the order
  swapped every other pair; the figure is the median of the paired ratios
  (with / without).
- Lightning's run without torchmon logs through ``CSVLogger`` (Lightning's
  lightest built-in logger), with torchmon through ``TorchmonLogger``
  instead, plus ``TorchmonCallback``: both pay Lightning's logging pipeline.
- The hooks' own cost (``on_step_begin`` + ``on_step_end`` of the
  transformers callback, ``on_train_batch_start`` + ``on_train_batch_end``
  of the Lightning callback) is timed directly, minimum of repeats, in ns per
  step, beside ``math.fabs(1.5)`` measured in the same run, and set against
  the median step time of the run without torchmon.

Needs torch, transformers, accelerate and lightning; a framework that is
missing is skipped.

``--callgrind`` (needs valgrind) counts instead the instructions of what both
callbacks do per step, ``StepTimer.begin()`` + ``StepTimer.end()`` (two clock
reads, two ``Stat.add`` on the default step-time and data-time Stats), beside
``math.fabs(1.5)``: counts do not depend on the machine's load. The
frameworks are not imported there (under valgrind that alone takes minutes),
so the framework's call of the hook method is not counted.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
import warnings
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class LoopClock:
    """First step's begin and last step's end, as hook calls see them."""

    def __init__(self) -> None:
        self.first = 0.0
        self.last = 0.0
        self.steps = 0

    def begin(self) -> None:
        if not self.first:
            self.first = time.perf_counter()

    def end(self) -> None:
        self.last = time.perf_counter()
        self.steps += 1

    def steps_per_second(self) -> float:
        return (self.steps - 1) / (self.last - self.first) if self.steps > 1 else math.nan


def hf_run(steps: int, with_torchmon: bool, out: Path) -> float:
    from transformers import TrainerCallback

    from torchmon.integrations.transformers import TorchmonCallback

    clock = LoopClock()

    class Timing(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            clock.begin()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            clock.end()

    callbacks: list[Any] = [Timing()]
    if with_torchmon:
        callbacks.append(TorchmonCallback(out))
    trainer = load_example("hf_trainer").build_trainer(out, steps, callbacks)
    trainer.train()
    return clock.steps_per_second()


def lightning_run(steps: int, with_torchmon: bool, out: Path) -> float:
    import lightning.pytorch as pl

    from torchmon.integrations.lightning import TorchmonCallback, TorchmonLogger

    clock = LoopClock()

    class Timing(pl.Callback):  # type: ignore[misc]
        def on_train_batch_start(self, *args: Any) -> None:
            clock.begin()

        def on_train_batch_end(self, *args: Any) -> None:
            clock.end()

    from lightning.pytorch.loggers import CSVLogger

    callbacks: list[Any] = [Timing()]
    # Without torchmon, Lightning's lightest built-in logger: with no logger
    # at all Lightning skips its own logging work (converting the logged
    # tensors at each logging step), which is not torchmon's cost.
    logger: Any = CSVLogger(out)
    if with_torchmon:
        callbacks.append(TorchmonCallback())
        logger = TorchmonLogger(out)
    trainer, module, data = load_example("lightning_trainer").build_trainer(
        out, steps, logger, callbacks
    )
    trainer.fit(module, data)
    return clock.steps_per_second()


def hook_ns(framework: str, repeat: int, number: int = 100_000) -> float:
    """ns per step of the integration's two per-step hooks, called directly."""
    if framework == "transformers":
        from torchmon.integrations.transformers import TorchmonCallback

        hf = TorchmonCallback()

        class State:
            num_input_tokens_seen = 0

        class Args:
            include_num_input_tokens_seen = "no"

        hf.on_train_begin(Args(), State(), None)
        env = {"cb": hf, "a": Args(), "s": State()}
        stmt = "cb.on_step_begin(a, s, None); cb.on_step_end(a, s, None)"
    else:
        from torchmon.integrations.lightning import TorchmonCallback as LightningCallback

        pl_cb = LightningCallback()

        class Trainer:
            log_every_n_steps = 50

        pl_cb.on_train_start(Trainer(), None)
        env = {"cb": pl_cb}
        stmt = (
            "cb.on_train_batch_start(None, None, None, 1); "
            "cb.on_train_batch_end(None, None, None, None, 1)"
        )
    best = min(timeit.Timer(stmt, globals=env).repeat(repeat=repeat, number=number))
    return best / number * 1e9


CALLGRIND_SETUP = """
import math
from torchmon.integrations._common import DEFAULT_WINDOW, StepTimer
timer = StepTimer("train", DEFAULT_WINDOW)
fabs = math.fabs
def run():
    for _ in range(LOOPS):
        STMT
run()
"""


VALGRIND = ("valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null")


def callgrind(n: int) -> None:
    def instructions(stmt: str, count: int) -> int:
        code = CALLGRIND_SETUP.replace("STMT", stmt).replace("LOOPS", str(count))
        result = subprocess.run(
            [*VALGRIND, sys.executable, "-c", code],
            capture_output=True,
            env={**os.environ, "PYTHONHASHSEED": "0"},
            text=True,
            check=True,
        )
        match = re.search(r"refs:\s+([\d,]+)", result.stderr)
        if match is None:
            raise RuntimeError(result.stderr)
        return int(match.group(1).replace(",", ""))

    print(f"instructions per iteration (callgrind, 2N - N, N = {n})")
    print("| operation | instructions |")
    print("| --- | ---: |")
    for label, stmt in (
        ("loop alone (`pass`)", "pass"),
        ("math.fabs(1.5)", "fabs(1.5)"),
        ("one step's hooks: timer.begin(); timer.end()", "timer.begin(); timer.end()"),
    ):
        per = (instructions(stmt, 2 * n) - instructions(stmt, n)) / n
        print(f"| {label} | {per:.0f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--callgrind", type=int, metavar="N", help="count instructions instead")
    args = parser.parse_args()
    if args.callgrind:
        callgrind(args.callgrind)
        return
    warnings.simplefilter("ignore")
    fabs = min(timeit.Timer("fabs(1.5)", globals={"fabs": math.fabs}).repeat(7, 1_000_000)) / 1e6
    print(f"python {sys.version.split()[0]}; math.fabs(1.5): {fabs * 1e9:.1f} ns")
    runs = [("transformers", hf_run), ("lightning", lightning_run)]
    for framework, run in runs:
        if importlib.util.find_spec(framework) is None:
            print(f"{framework}: not installed, skipped")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            run(10, True, Path(tmp) / "warmup")  # imports and first-call costs
            without, with_, ratios = [], [], []
            for i in range(args.repeat):
                # Which variant goes first alternates: the second run of a
                # pair found warmer caches (every pair favoured it).
                if i % 2:
                    instrumented = run(args.steps, True, Path(tmp) / f"with{i}")
                    base = run(args.steps, False, Path(tmp) / f"without{i}")
                else:
                    base = run(args.steps, False, Path(tmp) / f"without{i}")
                    instrumented = run(args.steps, True, Path(tmp) / f"with{i}")
                without.append(base)
                with_.append(instrumented)
                ratios.append(instrumented / base)
        hooks = hook_ns(framework, args.repeat)
        step_ns = 1e9 / statistics.median(without)
        print(
            f"{framework}: {args.steps} steps x {args.repeat} pairs; steps/s median "
            f"without {statistics.median(without):.1f}, with {statistics.median(with_):.1f}; "
            f"paired ratio median {statistics.median(ratios):.4f} "
            f"(min {min(ratios):.4f}, max {max(ratios):.4f})"
        )
        print(
            f"  hooks per step: {hooks:.0f} ns = {hooks / (fabs * 1e9):.1f} x fabs "
            f"= {hooks / step_ns:.5%} of a {step_ns / 1e6:.2f} ms step"
        )


if __name__ == "__main__":
    main()
