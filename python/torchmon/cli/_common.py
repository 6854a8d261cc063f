"""What the ``torchmon`` subcommands share: exit codes, the one-line error
they report, reading a JSON-lines log, and the TensorBoard writer and handler
(docs/cli.md)."""

from __future__ import annotations

import importlib
import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._core import Event

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
    return list(_Log(path, "raise", distributions=False))


class _Log:
    """The records of one JSON-lines log, read as they are iterated (one line
    in memory at a time): ``read_jsonl(path, errors=errors,
    distributions=distributions)`` with its failures as _CliErrors, and a
    file with content but no event refused as no JSON-lines log at all
    (docs/cli.md: a malformed file exits with code 2)."""

    def __init__(self, path: str, errors: str, *, distributions: bool) -> None:
        from ..handlers.jsonl import read_jsonl

        file = Path(path)
        if not file.exists():
            raise _CliError(f"{path}: no such file")
        if file.is_dir():
            raise _CliError(f"{path}: is a directory, not a JSON-lines file")
        self.path = path
        try:
            self.size = file.stat().st_size
        except OSError as exc:
            raise _CliError(f"{path}: cannot read: {exc.strerror or exc}") from None
        self.records = 0
        self._reader = read_jsonl(path, errors=errors, distributions=distributions)

    @property
    def skipped(self) -> int:
        return self._reader.skipped

    @property
    def first_skipped(self) -> str | None:
        return self._reader.first_skipped

    @property
    def bytes_read(self) -> int:
        return self._reader._bytes_read

    def __iter__(self) -> Iterator[Any]:
        path = self.path
        try:
            for record in self._reader:
                self.records += 1
                yield record
        except ValueError as exc:  # read_jsonl's messages start with "<path>:<line>:"
            detail = str(exc)
            raise _CliError(detail if detail.startswith(path) else f"{path}: {detail}") from None
        except OSError as exc:
            raise _CliError(f"{path}: cannot read: {exc.strerror or exc}") from None
        if not self.records:
            self._check_not_foreign()

    def _check_not_foreign(self) -> None:
        """An empty log (or one whose only line is still being written) is
        a log without events yet; a file whose every line is unreadable,
        or whose first bytes are no JSON object at all (a CSV file, a
        TensorBoard event file: no newline, so read_jsonl takes it for one
        unfinished line), is not a JSON-lines log."""
        if self.skipped:
            lines = "line is" if self.skipped == 1 else f"{self.skipped} lines are"
            raise _CliError(
                f"{self.path}: not a JSON-lines log: no line holds an event "
                f"(the {lines} unreadable; the first: {self.first_skipped})"
            )
        try:
            with open(self.path, "rb") as file:
                head = file.read(4096).lstrip(b" \t\r\n")
        except OSError as exc:
            raise _CliError(f"{self.path}: cannot read: {exc.strerror or exc}") from None
        if head and not head.startswith(b"{"):
            raise _CliError(
                f"{self.path}: not a JSON-lines log: it does not start with a JSON object "
                f"(its first bytes: {head[:16]!r})"
            )


_writer_ids = itertools.count()


def _summary_writer(logdir: str, *, max_queue: int = 10) -> Any:
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
    return module.SummaryWriter(logdir=logdir, filename_suffix=suffix, max_queue=max_queue)


def _tensorboard_handler(writer: Any, *, step_field: str | None, layout: str = "torch") -> Any:
    """The handler that both the demo (live) and ``to-tensorboard`` (from a log)
    write with, so that a converted log and a live one are the same scalars at
    the same steps (docs/cli.md)."""
    from ..handlers.tensorboard import TensorboardEventHandler

    return TensorboardEventHandler(writer, other_events=True, step_field=step_field, layout=layout)
