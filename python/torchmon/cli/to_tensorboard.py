"""``torchmon to-tensorboard FILE.jsonl LOGDIR``: a JSON-lines log as TensorBoard
event files, the scalars a live TensorboardEventHandler writes (docs/cli.md)."""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path
from typing import Any, TextIO

from .._core import STAT_EVENT
from ._common import (
    _EXIT_OK,
    _CliError,
    _Log,
    _printable,
    _summary_writer,
    _tensorboard_handler,
    _tensorboardx,
)
from .demo import _Progress

#: Events queued for tensorboardX's writer thread at most.
_WRITER_QUEUE = 4096


def _event_files(directory: Path) -> list[Path]:
    """The TensorBoard event files directly in ``directory`` (one run)."""
    return sorted(p for p in directory.glob("*tfevents*") if p.is_file())


def _prepare_conversion_logdir(logdir: str, *, append: bool) -> tuple[Path, Path | None]:
    """LOGDIR, made if needed, and the outermost directory this made (None
    when LOGDIR existed): what to remove again if the log turns out bad."""
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
    made = None
    for parent in [path, *path.absolute().parents]:
        if parent.exists():
            break
        made = parent
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _CliError(f"{logdir}: cannot create it: {exc.strerror or exc}") from None
    return path, made


def _undo(logdir: Path, made: Path | None, before: set[Path]) -> None:
    """Removes the event files this run wrote and the directories it made,
    so that a log found bad halfway leaves LOGDIR as it was (docs/cli.md)."""
    for written in set(_event_files(logdir)) - before:
        written.unlink(missing_ok=True)
    if made is not None:
        for directory in [logdir, *logdir.absolute().parents]:
            try:
                directory.rmdir()
            except OSError:
                break
            if directory.absolute() == made.absolute():
                break


#: The logger and message tensorboardX's add_scalar warns with for every NaN
#: or infinite value (tensorboardX/x2num.py, check_nan): once per scalar,
#: thousands of lines for a log with NaN windows.
_NAN_LOGGER = "tensorboardX.x2num"
_NAN_MESSAGE = "NaN or Inf found in input tensor."


class _DropNanWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != _NAN_MESSAGE


class _CountingWriter:
    """Passes ``add_scalar`` calls on to a SummaryWriter, counting them and
    the NaN or infinite values among them."""

    def __init__(self, writer: Any) -> None:
        self._writer = writer
        self.scalars = 0
        self.non_finite = 0

    def add_scalar(self, tag: str, scalar_value: Any, *args: Any, **kwargs: Any) -> Any:
        self.scalars += 1
        try:
            if not math.isfinite(scalar_value):
                self.non_finite += 1
        except (TypeError, OverflowError):  # not a float: tensorboardX deals with it
            pass
        return self._writer.add_scalar(tag, scalar_value, *args, **kwargs)

    def close(self) -> None:
        self._writer.close()


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    # Imported before the input is opened: tensorboardX imports torch, whose
    # import a Ctrl-C can abort in C++ (the process dies of SIGABRT instead of
    # exiting 130); after this the wait for input is interruptible.
    _tensorboardx()
    log = _Log(args.file, "raise", distributions=False)
    logdir, made = _prepare_conversion_logdir(args.logdir, append=args.append)
    before = set(_event_files(logdir))
    progress = _Progress(log.size, err)
    from_stats = 0  # the handler writes every item of a Stat event
    with_step_field = 0
    # One line of ours below says how many values were NaN or infinite.
    nan_filter = _DropNanWarning()
    logging.getLogger(_NAN_LOGGER).addFilter(nan_filter)
    try:
        try:
            # tensorboardX's default queue of 10 events makes every add_scalar
            # wait for its writer thread: 3 of 4 seconds of a conversion were
            # spent waiting (docs/performance.md). A longer queue is still
            # bounded memory: events of a few hundred bytes.
            writer = _CountingWriter(_summary_writer(str(logdir), max_queue=_WRITER_QUEUE))
        except OSError as exc:
            raise _CliError(f"{logdir}: cannot write: {exc.strerror or exc}") from None
        try:
            handler = _tensorboard_handler(writer, step_field=args.step_field, layout=args.layout)
            for event in log:
                if event.name == STAT_EVENT:
                    from_stats += len(event.data)
                elif args.step_field is not None and args.step_field in event.data:
                    with_step_field += 1
                handler(event)
                progress.update(
                    log.bytes_read, f"{log.records:,} events  {writer.scalars:,} scalars"
                )
        except OSError as exc:
            raise _CliError(f"{logdir}: cannot write: {exc.strerror or exc}") from None
        finally:
            progress.clear()
            writer.close()
    except (_CliError, KeyboardInterrupt):
        # Interrupted too: a partial conversion left behind would make the
        # next run refuse LOGDIR ("already holds ... event file(s)").
        _undo(logdir, made, before)
        raise
    finally:
        logging.getLogger(_NAN_LOGGER).removeFilter(nan_filter)
    print(
        _printable(
            f"wrote {writer.scalars} scalars to {args.logdir} "
            f"({from_stats} from Stat events, {writer.scalars - from_stats} from other events)"
        ),
        file=out,
    )
    if writer.non_finite:
        values = "value was" if writer.non_finite == 1 else "values were"
        print(
            f"torchmon to-tensorboard: {writer.non_finite} {values} NaN or infinite; "
            "written as they are",
            file=err,
        )
    if args.step_field is not None and not with_step_field:
        print(
            f"torchmon to-tensorboard: warning: no event has the field {args.step_field!r} "
            "(--step-field), so other events' steps are their ordinals (0, 1, 2, ...)",
            file=err,
        )
    return _EXIT_OK


def add_parser(commands: Any) -> None:
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
    convert.set_defaults(run=run)
