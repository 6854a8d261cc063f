"""``torchmon to-tensorboard FILE.jsonl LOGDIR``: a JSON-lines log as TensorBoard
event files, the scalars (and, for stored distributions, the histograms) a
live ``TensorboardEventHandler.logdir`` writes, with torchmon's own writer:
no tensorboardX needed (docs/cli.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, TextIO

from .._core import STAT_EVENT, _event_with_distribution, _TensorboardConversion
from ._common import (
    _EXIT_OK,
    _MAX_LINE_BYTES,
    _CliError,
    _Log,
    _printable,
    _tensorboard_handler,
)
from .demo import _Progress

#: Whether the Stat lines the core is sure of are read and written by the
#: core (crates/torchmon-core/src/tensorboard/convert.rs); False reads every
#: line in Python, the reference the tests compare the core's files with.
_NATIVE_READER = True


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


def _convert_natively(
    args: argparse.Namespace, log: _Log, handler: Any, progress: _Progress
) -> tuple[int, int]:
    """The log through the core's reader: a Stat line it is sure of becomes
    the handler's scalars and histogram without a Python object; any other
    line is read by ``log``'s reader (its messages), a Stat event then handed
    back to the core, whose per-tag step counters it shares, and another
    event written by the handler. Returns (scalars from Stat events, events
    with the step field)."""
    from ..handlers.jsonl import _encode_event

    reader = log._reader
    step_field = args.step_field
    with_step_field = 0

    def relay(raw: bytes, lineno: int) -> tuple[bytes, float] | bool | None:
        nonlocal with_step_field
        record = reader._line(raw, lineno)
        if record is None:
            return None
        event, distribution = record
        if event.name == STAT_EVENT:
            if distribution is not None:
                event = _event_with_distribution(
                    event.name, event.timestamp, event.data, distribution
                )
            return _encode_event(event, distributions=True), event.timestamp.timestamp()
        if step_field is not None and step_field in event.data:
            with_step_field += 1
        handler(event)
        return True

    native = handler._native
    conversion = _TensorboardConversion(native, args.layout == "grouped", _MAX_LINE_BYTES, relay)

    def read(done: int) -> None:
        if progress.active:
            events = conversion.counts[0]
            progress.update(done, f"{events:,} events  {native.counts[0]:,} scalars")

    log.convert(conversion, read)
    return conversion.counts[1], with_step_field


def _convert_in_python(
    args: argparse.Namespace, log: _Log, handler: Any, progress: _Progress
) -> tuple[int, int]:
    """Every line through ``log``'s Python reader and the handler."""
    native = handler._native
    from_stats = 0  # the handler writes every number of a Stat event
    with_step_field = 0
    for event, distribution in log:
        if distribution is not None:
            event = _event_with_distribution(event.name, event.timestamp, event.data, distribution)
        name = event.name
        if name == STAT_EVENT:
            # The handler's own path (what handler(event) runs), with
            # the number of scalars it wrote.
            from_stats += handler._write_stat_natively(native, event)
        else:
            if args.step_field is not None and args.step_field in event.data:
                with_step_field += 1
            handler(event)
        if progress.active:
            progress.update(log.bytes_read, f"{log.records:,} events  {native.counts[0]:,} scalars")
    return from_stats, with_step_field


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    # With the stored distributions: each becomes a histogram, as live.
    log = _Log(args.file, "raise", distributions=True)
    logdir, made = _prepare_conversion_logdir(args.logdir, append=args.append)
    before = set(_event_files(logdir))
    progress = _Progress(log.size, err)
    from_stats = with_step_field = 0
    counts = (0, 0)
    try:
        try:
            handler = _tensorboard_handler(logdir, step_field=args.step_field, layout=args.layout)
        except OSError as exc:
            raise _CliError(f"{logdir}: cannot write: {exc.strerror or exc}") from None
        native = handler._native
        assert native is not None
        try:
            if _NATIVE_READER:
                from_stats, with_step_field = _convert_natively(args, log, handler, progress)
            else:
                from_stats, with_step_field = _convert_in_python(args, log, handler, progress)
        finally:
            progress.clear()
            # Writes what is queued; a write that failed said so on stderr.
            handler.close()
            counts = native.counts
    except (_CliError, KeyboardInterrupt):
        # Interrupted too: a partial conversion left behind would make the
        # next run refuse LOGDIR ("already holds ... event file(s)").
        _undo(logdir, made, before)
        raise
    scalars, non_finite = counts
    print(
        _printable(
            f"wrote {scalars} scalars to {args.logdir} "
            f"({from_stats} from Stat events, {scalars - from_stats} from other events)"
        ),
        file=out,
    )
    if non_finite:
        values = "value was" if non_finite == 1 else "values were"
        print(
            f"torchmon to-tensorboard: {non_finite} {values} NaN or infinite; written as they are",
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
            "Writes a JSON-lines log as TensorBoard scalars, as TensorboardEventHandler."
            "logdir(LOGDIR, other_events=True) does live: Stat events one scalar per key "
            "at the step of the window (1, 2, 3, ... per tag), a stored distribution as "
            "a histogram, other events' numeric fields as <name>/<field>; wall times "
            "from the events."
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
