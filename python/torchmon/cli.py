"""The ``torchmon`` command (also ``python -m torchmon``).

    torchmon demo [--logdir DIR] [--epochs N] [--steps N] [--seed S]
    torchmon summarize FILE.jsonl [--strict]
    torchmon to-tensorboard FILE.jsonl LOGDIR [--step-field FIELD] [--layout L] [--append]
    torchmon --version

See docs/cli.md.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import os
import random
import shlex
import shutil
import sys
import time
from array import array
from collections.abc import Iterable, Sequence
from contextlib import ExitStack
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable, TextIO

from ._core import (
    _AGGREGATION_KEY_SUFFIXES,
    STAT_EVENT,
    Aggregation,
    Event,
    Stat,
    log_event,
    register_event_handler,
)
from ._core import unregister_event_handler as _unregister_event_handler
from ._wait_counter import WaitCounter, _discard_counter

__all__ = ["main"]

_AGGREGATION_NAMES = frozenset(_AGGREGATION_KEY_SUFFIXES)
_EXIT_OK = 0
_EXIT_ERROR = 1
_EXIT_USAGE = 2  # bad arguments, unreadable or malformed input
_EXIT_INTERRUPTED = 130


class _CliError(Exception):
    """A failure to report as one line on stderr (no traceback), with an exit code."""

    def __init__(self, message: str, code: int = _EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


# --- reading a JSON-lines log ---------------------------------------------


def _read_events(path: str) -> list[Event]:
    """Every event of a JSON-lines log, or a _CliError that says what is wrong
    (the first unreadable line included)."""
    return _read_log(path, "raise")[0]


def _read_log(path: str, errors: str) -> tuple[list[Event], int, str | None]:
    """The events of a JSON-lines log read with ``read_jsonl(path,
    errors=errors)``, how many unreadable lines were skipped, and the first
    one's message; or a _CliError that says what is wrong."""
    from .handlers.jsonl import read_jsonl

    file = Path(path)
    if not file.exists():
        raise _CliError(f"{path}: no such file")
    if file.is_dir():
        raise _CliError(f"{path}: is a directory, not a JSON-lines file")
    reader = read_jsonl(path, errors=errors)
    try:
        events = list(reader)
    except ValueError as exc:  # read_jsonl's messages start with "<path>:<line>:"
        detail = str(exc)
        raise _CliError(detail if detail.startswith(path) else f"{path}: {detail}") from None
    except OSError as exc:
        raise _CliError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return events, reader.skipped, reader.first_skipped


def _split_stat_key(key: str) -> tuple[str, str]:
    """``"train.loss.mean"`` -> ``("train.loss", "mean")``."""
    stat, dot, agg = key.rpartition(".")
    if dot and agg in _AGGREGATION_NAMES:
        return stat, agg
    return key, ""


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# --- summary tables -------------------------------------------------------


class _Summary:
    """Per-stat series of every aggregation across the Stat events' windows,
    and a count (with the last data) of every other event name."""

    def __init__(self, events: Iterable[Event]) -> None:
        # stat -> aggregation -> values, in window order; dicts keep first-seen order.
        self.stats: dict[str, dict[str, list[float]]] = {}
        self.windows: dict[str, int] = {}
        self.others: dict[str, int] = {}
        self.last_other: dict[str, dict[str, Any]] = {}
        for event in events:
            data = event.data
            if event.name == STAT_EVENT:
                seen: set[str] = set()
                for key, value in data.items():
                    if not _is_number(value):
                        continue
                    stat, agg = _split_stat_key(key)
                    self.stats.setdefault(stat, {}).setdefault(agg, []).append(float(value))
                    seen.add(stat)
                for stat in seen:
                    self.windows[stat] = self.windows.get(stat, 0) + 1
            else:
                self.others[event.name] = self.others.get(event.name, 0) + 1
                self.last_other[event.name] = data

    def stat_rows(self) -> list[list[str]]:
        rows = [["stat", "aggregation", "windows", "last", "mean", "min", "max"]]
        for stat in sorted(self.stats):
            for agg, values in self.stats[stat].items():
                numbers = [v for v in values if not math.isnan(v)]
                rows.append(
                    [
                        stat,
                        agg or "-",
                        str(self.windows[stat]),
                        _number(values[-1]),
                        _number(_mean(numbers)) if numbers else "nan",
                        _number(min(numbers)) if numbers else "nan",
                        _number(max(numbers)) if numbers else "nan",
                    ]
                )
        return rows

    def other_rows(self) -> list[list[str]]:
        rows = [["event", "count", "last data"]]
        for name in sorted(self.others):
            data = self.last_other[name]
            shown = " ".join(f"{k}={_value_text(v)}" for k, v in data.items())
            rows.append([name, str(self.others[name]), shown])
        return rows

    def write(self, out: TextIO) -> None:
        if self.stats:
            _write_table(self.stat_rows(), out, numeric_from=2)
        else:
            print("no Stat events", file=out)
        if self.others:
            print(file=out)
            _write_table(self.other_rows(), out, numeric_from=1, numeric_to=2)


def _mean(values: list[float]) -> float:
    """The mean of non-NaN ``values``, as IEEE arithmetic has it where
    ``math.fsum`` raises: inf and -inf give NaN, and a sum beyond the float
    range (two values near 1e308) is no reason for the mean to be."""
    if math.inf in values:
        return math.nan if -math.inf in values else math.inf
    if -math.inf in values:
        return -math.inf
    try:
        return math.fsum(values) / len(values)
    except OverflowError:
        return math.fsum(v / len(values) for v in values)


def _number(value: float) -> str:
    return f"{value:.6g}"


def _value_text(value: object) -> str:
    return _number(value) if isinstance(value, float) else repr(value)


def _write_table(
    rows: list[list[str]], out: TextIO, numeric_from: int, numeric_to: int | None = None
) -> None:
    """Aligned columns: text left-aligned, numbers right-aligned; the last
    column is not padded."""
    numeric_to = len(rows[0]) if numeric_to is None else numeric_to
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            last = i == len(row) - 1
            if numeric_from <= i < numeric_to:
                cells.append(cell.rjust(widths[i]))
            else:
                cells.append(cell if last else cell.ljust(widths[i]))
        print("  ".join(cells).rstrip(), file=out)


# --- TensorBoard ------------------------------------------------------------


def _summary_writer(logdir: str) -> Any:
    try:
        module = importlib.import_module("tensorboardX")
    except ImportError:
        raise _CliError(
            "writing TensorBoard files needs tensorboardX: pip install tensorboardX tensorboard "
            "(in a torchmon checkout: pip install '.[tensorboard]')"
        ) from None
    return module.SummaryWriter(logdir=logdir)


def _tensorboard_handler(writer: Any, *, step_field: str | None, layout: str = "torch") -> Any:
    """The handler that both the demo (live) and ``to-tensorboard`` (from a log)
    write with, so that a converted log and a live one are the same scalars at
    the same steps (docs/cli.md)."""
    from .handlers.tensorboard import TensorboardEventHandler

    return TensorboardEventHandler(writer, other_events=True, step_field=step_field, layout=layout)


def _event_files(directory: Path) -> list[Path]:
    """The TensorBoard event files directly in ``directory`` (one run)."""
    return sorted(p for p in directory.glob("*tfevents*") if p.is_file())


def _prepare_conversion_logdir(logdir: str, *, append: bool) -> Path:
    path = Path(logdir)
    if path.exists() and not path.is_dir():
        raise _CliError(f"{logdir}: exists and is not a directory")
    if path.is_dir() and not append:
        existing = _event_files(path)
        if existing:
            raise _CliError(
                f"{logdir}: already holds {len(existing)} TensorBoard event file(s), "
                "whose points would be shown twice; give a new directory, or --append"
            )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _CliError(f"{logdir}: cannot create it: {exc.strerror or exc}") from None
    return path


class _CountingWriter:
    """Passes ``add_scalar`` calls on to a SummaryWriter, counting them."""

    def __init__(self, writer: Any) -> None:
        self._writer = writer
        self.scalars = 0

    def add_scalar(self, tag: str, scalar_value: Any, *args: Any, **kwargs: Any) -> Any:
        self.scalars += 1
        return self._writer.add_scalar(tag, scalar_value, *args, **kwargs)

    def close(self) -> None:
        self._writer.close()


# --- the demo -----------------------------------------------------------------


class _Progress:
    """A one-line text progress bar on a terminal; silent otherwise."""

    WIDTH = 30

    def __init__(self, total: int, stream: TextIO) -> None:
        self._total = max(total, 1)
        self._stream = stream
        self._enabled = _isatty(stream)
        self._last = 0.0
        self._shown = 0

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
_DEMO_STEP_FIELD = "epoch"


def _unregister_all(handles: list[Any]) -> None:
    for handle in handles:
        _unregister_event_handler(handle)


def _demo(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .handlers.jsonl import JsonlEventHandler

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
        jsonl = JsonlEventHandler(str(jsonl_path))
        cleanup.callback(jsonl.close)
        handles = [register_event_handler(jsonl)]
        writer = None
        try:
            writer = _summary_writer(str(logdir))
        except _CliError as exc:
            print(f"torchmon demo: no TensorBoard output ({exc})", file=err)
        if writer is not None:
            cleanup.callback(writer.close)
            # The epoch events too, as train.epoch_end/<field> at step <epoch>.
            tensorboard = _tensorboard_handler(writer, step_field=_DEMO_STEP_FIELD)
            handles.append(register_event_handler(tensorboard))
        # Unregistered first (the stack runs backwards), then the sinks close.
        cleanup.callback(_unregister_all, handles)
        try:
            _training_loop(args, out, err)
        except KeyboardInterrupt:
            interrupted = True

    if interrupted:
        print(f"\ninterrupted; the partial logs are in {logdir}", file=err)
        return _EXIT_INTERRUPTED
    events = _read_events(str(jsonl_path))
    stat_events = sum(1 for e in events if e.name == STAT_EVENT)
    print(
        f"\n{len(events)} events in {jsonl_path} "
        f"({stat_events} Stat windows, {len(events) - stat_events} others):\n",
        file=out,
    )
    _Summary(events).write(out)
    _print_next_steps(logdir, jsonl_path, tensorboard_files=writer is not None, out=out)
    return _EXIT_OK


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
                "\nTo look at it in TensorBoard, install TensorBoard (tensorboardX only "
                f"writes the files):\n  {python} -m pip install tensorboard\n"
                f"then:\n  {python} -m tensorboard.main --logdir {_shown_path(logdir)}",
                file=out,
            )
    torchmon = _script("torchmon") or f"{python} -m torchmon"
    print(
        f"Summarize the log again:\n  {torchmon} summarize {_shown_path(jsonl_path)}",
        file=out,
    )


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
        del loss, sample_loss, grad_norm, throughput, step_timer
        _discard_counter(_STEP_TIMER)


# --- the commands -----------------------------------------------------------


def _summarize(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    events, skipped, first_skipped = _read_log(args.file, "raise" if args.strict else "skip")
    if skipped:
        # A torn line (a writer killed mid-line, a full disk) must not hide
        # the rest of the log; the count says what was left out.
        lines = "line" if skipped == 1 else "lines"
        print(
            f"torchmon summarize: skipped {skipped} unreadable {lines} "
            f"(the first: {first_skipped}); --strict stops at it instead",
            file=err,
        )
    if not events:
        print(f"{args.file}: no events", file=out)
        return _EXIT_OK
    _Summary(events).write(out)
    return _EXIT_OK


def _to_tensorboard(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    events = _read_events(args.file)
    logdir = _prepare_conversion_logdir(args.logdir, append=args.append)
    try:
        writer = _CountingWriter(_summary_writer(str(logdir)))
        try:
            handler = _tensorboard_handler(writer, step_field=args.step_field, layout=args.layout)
            for event in events:
                handler(event)
        finally:
            writer.close()
    except OSError as exc:
        raise _CliError(f"{logdir}: cannot write: {exc.strerror or exc}") from None
    # The handler writes every item of a Stat event; the rest came from other events.
    from_stats = sum(len(e.data) for e in events if e.name == STAT_EVENT)
    print(
        f"wrote {writer.scalars} scalars to {args.logdir} "
        f"({from_stats} from Stat events, {writer.scalars - from_stats} from other events)",
        file=out,
    )
    return _EXIT_OK


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="torchmon",
        description="torchmon: torch.monitor's Stat/Event API, standalone. Tools for its logs.",
    )
    parser.add_argument("--version", action="version", version=f"torchmon {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="run a simulated training loop recorded to TensorBoard and JSON lines",
        description=(
            "Runs a simulated training loop (no torch needed) that records Stats "
            "(1-second windows) and one event per epoch to TensorBoard (when "
            "tensorboardX is installed) and to DIR/events.jsonl, then prints a summary."
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
    demo.set_defaults(run=_demo)

    summarize = commands.add_parser(
        "summarize",
        help="print a per-stat table of a JSON-lines log",
        description=(
            "For every Stat in a JSON-lines log: the number of windows and the last, "
            "mean, min and max of each aggregation across them; then a count of the "
            "other events."
        ),
    )
    summarize.add_argument("file", metavar="FILE.jsonl")
    summarize.add_argument(
        "--strict",
        action="store_true",
        help=(
            "stop at the first unreadable line (exit code 2) instead of skipping "
            "unreadable lines and saying how many"
        ),
    )
    summarize.set_defaults(run=_summarize)

    convert = commands.add_parser(
        "to-tensorboard",
        help="convert a JSON-lines log to TensorBoard event files",
        description=(
            "Writes a JSON-lines log as TensorBoard scalars, as TensorboardEventHandler("
            "writer, other_events=True) does live: Stat events one scalar per key at "
            "the step of the window (1, 2, 3, ... per tag), other events' numeric "
            "fields as <name>/<field>; wall times from the events."
        ),
    )
    convert.add_argument("file", metavar="FILE.jsonl")
    convert.add_argument("logdir", metavar="LOGDIR")
    convert.add_argument(
        "--append",
        action="store_true",
        help=(
            "write even if LOGDIR already holds event files (by default that is "
            "refused: a second conversion would show every point twice)"
        ),
    )
    convert.add_argument(
        "--layout",
        choices=("torch", "grouped"),
        default="torch",
        help=(
            "tags of Stat scalars: train.loss.mean (torch, the default) or "
            "train.loss/mean (grouped: one TensorBoard section per Stat)"
        ),
    )
    convert.add_argument(
        "--step-field",
        metavar="FIELD",
        help=(
            "take the step of other events' scalars from this integer field, which "
            "is then not written itself (default: the event's ordinal among the "
            "events of its name)"
        ),
    )
    convert.set_defaults(run=_to_tensorboard)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``torchmon`` command line; returns the exit code."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else _EXIT_USAGE
    out, err = sys.stdout, sys.stderr
    run: Callable[[argparse.Namespace, TextIO, TextIO], int] | None = getattr(args, "run", None)
    if run is None:
        parser.print_help(err)
        return _EXIT_USAGE
    try:
        return run(args, out, err)
    except _CliError as exc:
        print(f"torchmon {args.command}: {exc}", file=err)
        return exc.code
    except BrokenPipeError:  # `torchmon summarize x.jsonl | head`
        # Python would report the pipe again when it flushes stdout at exit.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return _EXIT_ERROR
