"""What the ``torchmon`` subcommands share: exit codes, the one-line error
they report, reading a JSON-lines log, and the TensorBoard writer and handler
(docs/cli.md)."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import stat
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

from .._core import Event, _event_with_distribution

if TYPE_CHECKING:
    from pathlib import Path

    from .._core import _Summary, _TensorboardConversion
    from ..handlers.jsonl import JsonlReader

_EXIT_OK = 0
_EXIT_ERROR = 1
_EXIT_USAGE = 2  # bad arguments, unreadable or malformed input
_EXIT_INTERRUPTED = 130


class _CliError(Exception):
    """A failure to report as one line on stderr (no traceback), with an exit code."""

    def __init__(self, message: str, code: int = _EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


# --- printing what came from the input ------------------------------------

#: C0 controls, DEL and C1 controls: what a terminal may act on (ESC starts
#: an escape sequence, and so does CSI, U+009B, in an 8-bit terminal).
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _printable(text: str) -> str:
    """``text`` with its control characters written as ``repr`` writes them
    (``\\x1b``, ``\\n``), so that a Stat name, a key or a path from the input
    cannot move the cursor or clear the screen; every other character,
    non-ASCII ones included, as it is (docs/cli.md)."""
    if _CONTROLS.search(text) is None:
        return text
    return _CONTROLS.sub(
        lambda m: _CONTROL_ESCAPES.get(m.group(), f"\\x{ord(m.group()):02x}"), text
    )


# --- reading a JSON-lines log ---------------------------------------------

#: The longest line a log may hold, its newline included. JsonlEventHandler's
#: longest line is a Stat window with a stored distribution whose every one
#: of the 268,546 scale-6 buckets is filled: 7.9 MB with 20-digit counts
#: (typical lines are a few hundred bytes). Twice that refuses no log it
#: wrote, while a "line" without end (/dev/zero, a binary file) is refused
#: after 16 MiB instead of being read whole into memory (docs/cli.md).
_MAX_LINE_BYTES = 16 << 20
#: The first bytes of a log kept to tell a foreign file by (_check_not_foreign).
_HEAD_BYTES = 4096


class _FifoRaw(io.RawIOBase):
    """A FIFO's file descriptor, with the bytes read before it was known to
    have a writer put back in front."""

    def __init__(self, fd: int, prefix: bytes) -> None:
        super().__init__()
        self._fd = fd
        self._prefix = prefix

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def readinto(self, buffer: Any) -> int:
        if self._prefix:
            n = min(len(buffer), len(self._prefix))
            buffer[:n] = self._prefix[:n]
            self._prefix = self._prefix[n:]
            return n
        return os.readv(self._fd, [buffer])

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


class _LineFile:
    """The lines of an open log, each read with at most _MAX_LINE_BYTES in
    memory: a longer one ends the reading with a _CliError naming the file
    and the line. Keeps the first _HEAD_BYTES bytes read (``head``)."""

    def __init__(self, path: str, file: io.BufferedReader) -> None:
        self._path = path
        self._file = file
        self.head = b""

    def __enter__(self) -> _LineFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    def __iter__(self) -> Iterator[bytes]:
        readline = self._file.readline
        lineno = 0
        while raw := readline(_MAX_LINE_BYTES + 1):
            lineno += 1
            if len(raw) > _MAX_LINE_BYTES:
                raise self.too_long(lineno)
            self._keep_head(raw)
            yield raw

    def blocks(self) -> Iterator[bytes]:
        """The file's bytes, a MiB at a time, for a reader that splits the
        lines itself (``_core._Summary``, with the same limit)."""
        while block := self._file.read1(1 << 20):
            self._keep_head(block)
            yield block

    def _keep_head(self, raw: bytes) -> None:
        if len(self.head) < _HEAD_BYTES:
            self.head += raw[: _HEAD_BYTES - len(self.head)]

    def too_long(self, lineno: int) -> _CliError:
        return _CliError(
            f"{self._path}:{lineno}: a line longer than {_MAX_LINE_BYTES >> 20} MiB, the "
            "longest a JSON-lines log may hold: not a JSON-lines log"
        )


def _open_log(path: str) -> _LineFile:
    """``path`` opened for reading, or a _CliError: a directory is no log,
    and a FIFO that no program has open for writing is refused at once
    rather than waited on for ever (docs/cli.md, "Input")."""
    try:
        # O_NONBLOCK: opening a FIFO does not wait for a writer. It is
        # cleared again below, so reads wait for data as usual.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise _CliError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise _CliError(f"{path}: is a directory, not a JSON-lines file") from None
    except OSError as exc:
        raise _CliError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise _CliError(f"{path}: is a directory, not a JSON-lines file")
        if not stat.S_ISFIFO(mode):
            os.set_blocking(fd, True)
            return _LineFile(path, open(fd, "rb", closefd=True))
        prefix = _fifo_start(path, fd)
        os.set_blocking(fd, True)
        return _LineFile(path, io.BufferedReader(_FifoRaw(fd, prefix)))
    except BaseException:
        os.close(fd)
        raise


def _fifo_start(path: str, fd: int) -> bytes:
    """The first bytes of a FIFO opened without waiting, read without
    waiting: none while its writer has written nothing yet; a _CliError
    when it has no writer (a read gives end-of-file then)."""
    try:
        first = os.read(fd, 1 << 16)
    except BlockingIOError:  # a writer, nothing written yet
        return b""
    except OSError as exc:
        raise _CliError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if first or _is_anonymous_pipe(fd):
        # An anonymous pipe (`torchmon summarize <(zcat log.gz)`) gets no
        # writer later: end-of-file is its end, an empty log.
        return first
    raise _CliError(
        f"{path}: a FIFO that no program has open for writing: start its writer "
        "first, or give a program's output as <(program)"
    )


def _is_anonymous_pipe(fd: int) -> bool:
    """Whether ``fd`` is a pipe with no name in the file system (Linux's
    /proc says "pipe:[inode]"); False where that cannot be told."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
    except OSError:
        return False


def _checked_reader(file: _LineFile, errors: str, distributions: bool) -> JsonlReader[Any]:
    """read_jsonl's reader, over a file _open_log opened and checked."""
    return cast("JsonlReader[Any]", _checked_reader_class()(file, errors, distributions))


@functools.cache
def _checked_reader_class() -> Any:
    # Made on first use: importing the JSON-lines handler at import time
    # would add 20 ms to every command, `torchmon --version` included.
    from ..handlers.jsonl import JsonlReader

    class _CheckedReader(JsonlReader[Any]):
        __slots__ = ("_file",)

        def __init__(self, file: _LineFile, errors: str, distributions: bool) -> None:
            self._file = file
            super().__init__(file._path, errors, distributions)

        def _open(self) -> _LineFile:
            return self._file

    return _CheckedReader


def _new_summary(ranks: bool) -> _Summary:
    """``torchmon summarize``'s native reader, with the line limit above;
    ``ranks``: keep the tables across files."""
    from .._core import _Summary

    return _Summary(_MAX_LINE_BYTES, ranks)


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
        self._file = _open_log(path)
        self.path = path
        try:
            self.size = os.fstat(self._file._file.fileno()).st_size
        except OSError as exc:
            self._file.close()
            raise _CliError(f"{path}: cannot read: {exc.strerror or exc}") from None
        self.records = 0
        self._reader = _checked_reader(self._file, errors, distributions)

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
        with self._errors():
            for record in self._reader:
                self.records += 1
                yield record
        if not self.records:
            self._check_not_foreign()

    def feed(self, summary: _Summary, label: str) -> None:
        """Reads the whole log into ``summary`` (``torchmon summarize``), which
        splits and reads the lines itself (crates/torchmon-core/src/summary/)."""
        summary.start_file(label, self._relay)
        with self._errors(), self._file:
            for block in self._file.blocks():
                if too_long := summary.feed(block):
                    raise self._file.too_long(too_long)
            self.records = summary.feed(b"")
        if not self.records:
            self._check_not_foreign()

    def convert(self, conversion: _TensorboardConversion, read: Callable[[int], None]) -> None:
        """Reads the whole log into ``conversion`` (``torchmon to-tensorboard``),
        which splits and reads the lines itself (crates/torchmon-core/src/
        tensorboard/convert.rs); ``read`` is told the bytes read so far."""
        done = 0
        with self._errors(), self._file:
            for block in self._file.blocks():
                # The first line alone, told at once: a progress bar shows
                # the first event before the first MiB is through.
                cut = block.find(b"\n") + 1 if not done else 0
                for part in (block[:cut], block[cut:]) if 0 < cut < len(block) else (block,):
                    if too_long := conversion.feed(part):
                        raise self._file.too_long(too_long)
                    done += len(part)
                    read(done)
            self.records = conversion.feed(b"")
        if not self.records:
            self._check_not_foreign()

    def _relay(self, raw: bytes, lineno: int) -> bytes | None:
        """A line ``feed``'s summary leaves to Python, read by this log's
        reader: its event written again as the sink writes it (which the
        summary reads as it is), or None."""
        from ..handlers.jsonl import _encode_event

        record = self._reader._line(raw, lineno)
        if record is None:
            return None
        event, distribution = record
        if distribution is not None:
            event = _event_with_distribution(event.name, event.timestamp, event.data, distribution)
        return _encode_event(event, distributions=True)

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """The reader's failures as _CliErrors."""
        path = self.path
        try:
            yield
        except ValueError as exc:  # read_jsonl's messages start with "<path>:<line>:"
            detail = str(exc)
            raise _CliError(detail if detail.startswith(path) else f"{path}: {detail}") from None
        except OSError as exc:
            raise _CliError(f"{path}: cannot read: {exc.strerror or exc}") from None

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
        # The bytes already read: a FIFO cannot be read again.
        head = self._file.head.lstrip(b" \t\r\n")
        if head and not head.startswith(b"{"):
            raise _CliError(
                f"{self.path}: not a JSON-lines log: it does not start with a JSON object "
                f"(its first bytes: {head[:16]!r})"
            )


def _tensorboard_handler(logdir: Path, *, step_field: str | None, layout: str = "torch") -> Any:
    """The handler that both the demo (live) and ``to-tensorboard`` (from a log)
    write with, so that a converted log and a live one are the same scalars at
    the same steps (docs/cli.md): torchmon's native writer, one event file in
    ``logdir``."""
    from ..handlers.tensorboard import TensorboardEventHandler

    return TensorboardEventHandler.logdir(
        logdir, other_events=True, step_field=step_field, layout=layout
    )
