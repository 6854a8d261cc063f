"""What the ``torchmon`` subcommands share: exit codes, the one-line error
they report, reading a JSON-lines log, and the TensorBoard writer and handler
(docs/cli.md)."""

from __future__ import annotations

import importlib
import itertools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._core import Event

if TYPE_CHECKING:
    from .._distribution import Distribution

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
    return _read(path, errors, distributions=False)


def _read_records(
    path: str, errors: str
) -> tuple[list[tuple[Event, Distribution | None]], int, str | None]:
    """As :func:`_read_log`, with each event's stored distribution (or None)."""
    return _read(path, errors, distributions=True)


def _read(path: str, errors: str, *, distributions: bool) -> tuple[list[Any], int, str | None]:
    from ..handlers.jsonl import read_jsonl

    file = Path(path)
    if not file.exists():
        raise _CliError(f"{path}: no such file")
    if file.is_dir():
        raise _CliError(f"{path}: is a directory, not a JSON-lines file")
    reader = read_jsonl(path, errors=errors, distributions=distributions)
    try:
        events = list(reader)
    except ValueError as exc:  # read_jsonl's messages start with "<path>:<line>:"
        detail = str(exc)
        raise _CliError(detail if detail.startswith(path) else f"{path}: {detail}") from None
    except OSError as exc:
        raise _CliError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return events, reader.skipped, reader.first_skipped


_writer_ids = itertools.count()


def _summary_writer(logdir: str) -> Any:
    try:
        module = importlib.import_module("tensorboardX")
    except ImportError:
        raise _CliError(
            "writing TensorBoard files needs tensorboardX: pip install tensorboardX tensorboard "
            "(in a torchmon checkout: pip install '.[tensorboard]')"
        ) from None
    # tensorboardX names the file after the second and the host only, and
    # opens it with "wb": a second writer into LOGDIR in the same second
    # (to-tensorboard --append) would replace the first's file. The pid and a
    # per-process count make the name unique, as torch's SummaryWriter does.
    suffix = f".{os.getpid()}.{next(_writer_ids)}"
    return module.SummaryWriter(logdir=logdir, filename_suffix=suffix)


def _tensorboard_handler(writer: Any, *, step_field: str | None, layout: str = "torch") -> Any:
    """The handler that both the demo (live) and ``to-tensorboard`` (from a log)
    write with, so that a converted log and a live one are the same scalars at
    the same steps (docs/cli.md)."""
    from ..handlers.tensorboard import TensorboardEventHandler

    return TensorboardEventHandler(writer, other_events=True, step_field=step_field, layout=layout)
