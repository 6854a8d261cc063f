"""``torchmon demo``: a simulated training loop recorded to TensorBoard and
JSON lines, then summarized (docs/cli.md)."""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import random
import shlex
import shutil
import sys
import time
from array import array
from contextlib import ExitStack
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

from .._core import (
    STAT_EVENT,
    Aggregation,
    Event,
    Stat,
    log_event,
    register_event_handler,
)
from .._core import unregister_event_handler as _unregister_event_handler
from .._wait_counter import WaitCounter, _discard_counter
from ._common import (
    _EXIT_INTERRUPTED,
    _EXIT_OK,
    _CliError,
    _Log,
    _new_summary,
    _tensorboard_handler,
)
from .summarize import _readable_bytes, write_summary


class _Progress:
    """A one-line text progress bar on a terminal; silent otherwise."""

    WIDTH = 30

    def __init__(self, total: int, stream: TextIO) -> None:
        self._total = max(total, 1)
        self._stream = stream
        self._enabled = _isatty(stream)
        self._last = 0.0
        self._shown = 0

    @property
    def active(self) -> bool:
        """Whether it draws (its stream is a terminal): a caller may skip
        making the text otherwise."""
        return self._enabled

    def update(self, done: int, text: str) -> None:
        if not self._enabled:
            return
        now = time.monotonic()
        if self._last and now - self._last < 0.05:  # at most 20 redraws a second
            return
        self._last = now
        fraction = min(done / self._total, 1.0)
        filled = round(fraction * self.WIDTH)
        line = f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {fraction:4.0%}  {text}"
        self._stream.write("\r" + line.ljust(self._shown))
        self._stream.flush()
        self._shown = len(line)

    def clear(self) -> None:
        """Erases the bar (before a line is printed); the next update draws it again."""
        if self._enabled and self._shown:
            self._stream.write("\r" + " " * self._shown + "\r")
            self._stream.flush()
            self._shown = 0
        self._last = 0.0


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _fresh_logdir() -> Path:
    base = Path.cwd() / f"torchmon-demo-{datetime.now():%Y%m%d-%H%M%S}"
    candidate, n = base, 1
    while candidate.exists():
        candidate = base.with_name(f"{base.name}-{n}")
        n += 1
    return candidate


def _prepare_logdir(logdir: str | None) -> Path:
    path = _fresh_logdir() if logdir is None else Path(logdir)
    if path.exists() and not path.is_dir():
        raise _CliError(f"--logdir {path}: exists and is not a directory")
    if path.is_dir() and any(path.iterdir()):
        raise _CliError(f"--logdir {path}: not empty; give a new or empty directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _CliError(f"--logdir {path}: cannot create it: {exc.strerror or exc}") from None
    return path


_STEP_TIMER = "train.step_time_us"
_STEP_TIME = "train.step_time_ms"
_DEMO_STEP_FIELD = "epoch"


def _unregister_all(handles: list[Any]) -> None:
    for handle in handles:
        _unregister_event_handler(handle)


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..handlers.jsonl import JsonlEventHandler

    if args.epochs < 1:
        raise _CliError("--epochs must be at least 1")
    if args.steps < 1:
        raise _CliError("--steps must be at least 1")
    logdir = _prepare_logdir(args.logdir)
    jsonl_path = logdir / "events.jsonl"
    print(f"torchmon demo: writing to {logdir}", file=out)
    out.flush()

    interrupted = False
    with ExitStack() as cleanup:
        # With the windows' histograms: the step-time percentiles below merge them.
        jsonl = JsonlEventHandler(str(jsonl_path), distributions=True)
        cleanup.callback(jsonl.close)
        handles = [register_event_handler(jsonl)]
        writer = None
        try:
            # torchmon's own event-file writer: no tensorboardX needed. The
            # epoch events too, as train.epoch_end/<field> at step <epoch>.
            writer = _tensorboard_handler(logdir, step_field=_DEMO_STEP_FIELD)
        except OSError as exc:
            print(f"torchmon demo: no TensorBoard output ({exc})", file=err)
        if writer is not None:
            cleanup.callback(writer.close)
            handles.append(register_event_handler(writer))
        # Unregistered first (the stack runs backwards), then the sinks close.
        cleanup.callback(_unregister_all, handles)
        try:
            with _system_stats():
                _training_loop(args, out, err)
        except KeyboardInterrupt:
            interrupted = True

    if interrupted:
        print(f"\ninterrupted; the partial logs are in {logdir}", file=err)
        return _EXIT_INTERRUPTED
    records = list(_Log(str(jsonl_path), "raise", distributions=True))
    events = [event for event, _ in records]
    stat_events = sum(1 for e in events if e.name == STAT_EVENT)
    print(
        f"\n{len(events)} events in {jsonl_path} "
        f"({stat_events} Stat windows, {len(events) - stat_events} others):\n",
        file=out,
    )
    # Without the quantile table: the highlights below say what the demo's
    # distributions show.
    summary = _new_summary(False)
    _Log(str(jsonl_path), "raise", distributions=True).feed(summary, "")
    write_summary(summary, out, quantiles=False)
    _print_highlights(records, out)
    _print_next_steps(logdir, jsonl_path, tensorboard_files=writer is not None, out=out)
    return _EXIT_OK


def _print_highlights(records: list[Any], out: TextIO) -> None:
    """What torchmon adds to torch.monitor's windows, in units read at a
    glance: the step time's P50 and P99 over the whole run (the windows'
    histograms merged, docs/api.md "Distribution") and the memory
    SystemStats sampled (docs/guide.md, "System stats")."""
    merged = None
    largest: dict[str, float] = {}
    for event, distribution in records:
        if event.name != STAT_EVENT:
            continue
        if distribution is not None and f"{_STEP_TIME}.p50" in event.data:
            merged = distribution if merged is None else merged.merge(distribution)
        for key in ("process.memory.usage.max", "system.memory.usage.max"):
            value = event.data.get(key)
            if isinstance(value, float):
                largest[key] = max(value, largest.get(key, value))
    lines = []
    if merged is not None and merged.count:
        lines.append(
            f"  step time        P50 {merged.quantile(0.5):.2f} ms   "
            f"P99 {merged.quantile(0.99):.2f} ms   over {merged.count} steps"
        )
    if "process.memory.usage.max" in largest:
        memory = (
            f"  memory           process {_readable_bytes(largest['process.memory.usage.max'])}"
        )
        if "system.memory.usage.max" in largest:
            memory += f", host {_readable_bytes(largest['system.memory.usage.max'])} in use"
        lines.append(memory + " (at most)")
    if lines:
        print("\nBeyond torch.monitor (percentiles, system stats):", file=out)
        for line in lines:
            print(line, file=out)


def _shown_path(path: Path) -> str:
    """``path`` as the user can type it where they stand: relative to the
    current directory when it is inside it, shell-quoted."""
    try:
        shown = str(Path(os.path.abspath(path)).relative_to(Path.cwd()))
    except ValueError:
        shown = str(path)
    return shlex.quote(shown)


def _script(name: str) -> str | None:
    """How to run the console script ``name`` of this interpreter's
    environment from the current directory: the bare name when that is what
    PATH finds (an activated venv), else its path (``.venv/bin/tensorboard``:
    a venv that is not activated is not on PATH); None if it is not there."""
    scripts = Path(sys.executable).parent
    candidates = [scripts / name, scripts / f"{name}.exe"]
    script = next((c for c in candidates if c.is_file()), None)
    if script is None:
        return None
    found = shutil.which(name)
    if found is not None:
        try:
            if Path(found).samefile(script):
                return name
        except OSError:
            pass
    shown = _shown_path(script)
    # A shell looks a word without a slash up on PATH: a script in the current
    # directory itself needs "./".
    return shown if os.sep in shown or "/" in shown else f"./{shown}"


def _print_next_steps(
    logdir: Path, jsonl_path: Path, *, tensorboard_files: bool, out: TextIO
) -> None:
    """The commands to look at the demo's output, each runnable as printed
    from the current directory (docs/cli.md)."""
    python = _shown_path(Path(sys.executable))
    if tensorboard_files:
        tensorboard = _script("tensorboard")
        if tensorboard is None and importlib.util.find_spec("tensorboard") is not None:
            tensorboard = f"{python} -m tensorboard.main"
        if tensorboard is not None:
            print(
                f"\nLook at it in TensorBoard (then open the address it prints):\n"
                f"  {tensorboard} --logdir {_shown_path(logdir)}",
                file=out,
            )
        else:
            print(
                "\nTo look at it in TensorBoard, install TensorBoard (torchmon only "
                f"writes the files):\n  {python} -m pip install tensorboard\n"
                f"then:\n  {python} -m tensorboard.main --logdir {_shown_path(logdir)}",
                file=out,
            )
    torchmon = _script("torchmon") or f"{python} -m torchmon"
    print(
        f"Summarize the log again:\n  {torchmon} summarize {_shown_path(jsonl_path)}",
        file=out,
    )


def _system_stats() -> Any:
    """The process's and the host's CPU and memory beside the training
    metrics, in the same 1-second windows, sampled 4 times a second
    (docs/guide.md, "System stats"); closed, its last windows emitted,
    before the sinks are unregistered."""
    from .._system import SystemStats

    return SystemStats(interval=0.25, window_size=timedelta(seconds=1), io=False)


def _training_loop(args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    """A simulated training loop: a decaying, noisy loss, ~0.8 ms of "work" per
    step (with an occasional stall), recorded into 1-second Stat windows."""
    window = timedelta(seconds=1)
    agg = Aggregation
    rng = random.Random(args.seed)
    batch, layers = 32, 8
    total = args.epochs * args.steps
    progress = _Progress(total, err)

    loss = Stat("train.loss", [agg.MEAN, agg.MIN, agg.MAX, agg.COUNT], window)
    sample_loss = Stat("train.sample_loss", [agg.MEAN, agg.MAX], window)
    grad_norm = Stat("train.grad_norm", [agg.MEAN, agg.MAX], window)
    throughput = Stat("train.throughput", [agg.MEAN, agg.MIN, agg.MAX], window)
    # The percentiles torch.monitor cannot give: a stall shows in P99, not P50.
    step_time = Stat(_STEP_TIME, [agg.P50, agg.P99], window)
    step_timer = WaitCounter(_STEP_TIMER, window)
    try:
        step = 0
        for epoch in range(1, args.epochs + 1):
            epoch_start = time.perf_counter()
            epoch_loss = 0.0
            for _ in range(args.steps):
                t0 = time.perf_counter()
                with step_timer.guard():
                    level = 0.1 + 2.2 * math.exp(-4.0 * step / total)
                    losses = [abs(rng.gauss(level, 0.2 * level)) for _ in range(batch)]
                    norms = array("d", (abs(rng.gauss(level, 0.3)) for _ in range(layers)))
                    stall = rng.random() < 0.005
                    time.sleep(0.0058 if stall else 0.0008)  # the "forward/backward pass"
                seconds = time.perf_counter() - t0
                step_time.add(seconds * 1000.0)
                batch_loss = math.fsum(losses) / batch
                loss.add(batch_loss)
                sample_loss.add_many(losses)  # an iterable of floats
                grad_norm.add_many(norms)  # a buffer, read in place
                throughput.add(batch / seconds)
                epoch_loss += batch_loss
                step += 1
                progress.update(
                    step, f"epoch {epoch}/{args.epochs}  step {step}/{total}  loss {batch_loss:.4f}"
                )
            mean_loss = epoch_loss / args.steps
            accuracy = min(max(1.0 - mean_loss / 2.5 + rng.gauss(0.0, 0.01), 0.0), 1.0)
            elapsed = time.perf_counter() - epoch_start
            log_event(
                Event(
                    "train.epoch_end",
                    datetime.now(),
                    {
                        "epoch": epoch,
                        "loss": mean_loss,
                        "accuracy": accuracy,
                        "steps": args.steps,
                        "seconds": elapsed,
                    },
                )
            )
            progress.clear()
            print(
                f"epoch {epoch}/{args.epochs}  loss {mean_loss:.4f}  "
                f"accuracy {accuracy:.1%}  {elapsed:.2f} s",
                file=out,
            )
            out.flush()
    finally:
        progress.clear()
        # Dropping the Stats emits their open windows to the sinks, which are
        # still registered; the step timer's process-wide Stat is released so
        # that its last window is emitted too.
        del loss, sample_loss, grad_norm, throughput, step_time, step_timer
        _discard_counter(_STEP_TIMER)


def add_parser(commands: Any) -> None:
    demo = commands.add_parser(
        "demo",
        help="run a simulated training loop recorded to TensorBoard and JSON lines",
        description=(
            "Runs a simulated training loop (no torch needed) that records Stats "
            "(1-second windows) and one event per epoch to TensorBoard event files "
            "(torchmon's own writer) and to DIR/events.jsonl, then prints a summary."
        ),
    )
    demo.add_argument(
        "--logdir",
        metavar="DIR",
        help="a new or empty directory (default: ./torchmon-demo-<timestamp>)",
    )
    demo.add_argument("--epochs", type=int, default=3, metavar="N", help="default: 3")
    demo.add_argument(
        "--steps",
        type=int,
        default=800,
        metavar="N",
        help="steps per epoch, about 1 ms each (default: 800)",
    )
    demo.add_argument("--seed", type=int, default=0, metavar="S", help="default: 0")
    demo.set_defaults(run=run)
