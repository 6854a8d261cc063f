"""JSON-lines sink: one JSON object per event per line, and its reader.

Each line is one event::

    {"name":"torch.monitor.Stat","timestamp":"2024-05-06T12:13:14.000015","data":{"loss.mean":0.5}}

- ``name``: the event name (a JSON string).
- ``timestamp``: ``datetime.isoformat()`` of the event's timestamp: with its
  UTC offset (``+05:30``) when the datetime is tz-aware, without one when it is
  naive (torchmon's Stat events carry naive local time, as ``datetime.now()``).
  A naive timestamp in the repeated hour at the end of daylight saving time
  has ``"fold":1`` beside it (``datetime.fold``); the key is absent otherwise.
- ``data``: the event data. ``str``, ``bool`` and ``int`` values are JSON
  strings, ``true``/``false`` and integers; a finite ``float`` is a JSON number
  that always has a fraction or an exponent (``1.0``, ``1e+300``, ``-0.0``),
  so it reads back as a float, never as an int. NaN and the infinities, which
  JSON cannot express, are the objects ``{"$float":"nan"}``,
  ``{"$float":"inf"}`` and ``{"$float":"-inf"}`` (a data value is never an
  object otherwise, so the encoding is unambiguous). Every line is valid JSON
  (RFC 8259).
- ``distribution`` (only with ``JsonlEventHandler(..., distributions=True)``,
  and only for an event that carries one: a Stat window event of a Stat with
  a P aggregation): ``Distribution.to_dict()``, the window's histogram
  (docs/api.md, "Distribution"). ``read_jsonl(path, distributions=True)``
  restores it.

The file is UTF-8, lines end with ``"\\n"``. Non-ASCII characters are
written as is, except that control characters and U+0085, U+2028 and U+2029
are ``\\uXXXX`` escapes, so that no line holds anything that a line reader
(``str.splitlines()`` included) takes for a line break.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
from collections.abc import Generator, Iterable, Iterator
from contextlib import AbstractContextManager
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, BinaryIO, Generic, Literal, TypeVar, overload

from .._core import _FLOAT_TAG, Event
from .._errors import arg_type_error, arg_value_error, check_int
from .._forksafe import new_lock
from ._common import ClosesOnExit

if TYPE_CHECKING:
    from .._distribution import Distribution

_T = TypeVar("_T")

__all__ = ["FLOAT_TAG", "JsonlEventHandler", "JsonlReader", "read_jsonl"]

#: The key of the object that encodes a non-finite float (``{"$float": "nan"}``).
FLOAT_TAG = _FLOAT_TAG

# What str.splitlines() breaks at besides the control characters json escapes.
_SPLITLINES_BREAKS = re.compile("[\x85\u2028\u2029]")

# The UTC offset at the end of an isoformat() string: +HH:MM[:SS[.ffffff]].
_ISO_OFFSET = re.compile(r"([+-])(\d\d):(\d\d)(?::(\d\d)(?:\.(\d{6}))?)?\Z")

_NON_FINITE_TEXT = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}

# open(path, "ab")'s flags, and O_NOFOLLOW: a symbolic link planted at the
# file's name in a shared directory is refused, never appended through
# (docs/sinks.md, "Symbolic links"). Not on Windows, which has no such flag.
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_APPEND_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | _NOFOLLOW


def _path_arg(path: object, call: str, arg: str) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise arg_type_error(call, arg, "a str or os.PathLike path", path)
    text = os.fspath(path)
    if not isinstance(text, str):
        raise arg_type_error(call, arg, "a str path", text)
    if not text:
        raise arg_value_error(call, arg, "must not be empty")
    return text


def _encode_value(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        if math.isnan(value):
            return {FLOAT_TAG: "nan"}
        return {FLOAT_TAG: "inf" if value > 0 else "-inf"}
    return value


def _encode_event(event: Event, distributions: bool = False) -> bytes:
    """One event as its JSON line (UTF-8, ending in ``b"\\n"``), with its
    distribution when ``distributions`` and it has one."""
    timestamp = event.timestamp
    # datetime's own isoformat, not a subclass's (pandas.Timestamp adds nanoseconds).
    stamp = datetime.isoformat(timestamp)
    record: dict[str, Any] = {"name": event.name, "timestamp": stamp}
    if timestamp.fold and timestamp.utcoffset() is None:
        record["fold"] = 1
    record["data"] = {key: _encode_value(value) for key, value in event.data.items()}
    if distributions:
        # getattr: an event-like object need not have the attribute.
        distribution = getattr(event, "distribution", None)
        if distribution is not None:
            record["distribution"] = distribution.to_dict()
    line = json.dumps(record, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    # Outside strings JSON has none of these, so escaping them is exact.
    if _SPLITLINES_BREAKS.search(line):
        line = _SPLITLINES_BREAKS.sub(lambda m: f"\\u{ord(m.group()):04x}", line)
    # No lone surrogates to worry about: torchmon's strings never hold one.
    return line.encode("utf-8") + b"\n"


def _ends_in_newline(path: str, size: int) -> bool:
    """Whether the ``size``-byte file at ``path`` ends in a newline (``False``
    when it cannot be read: a blank line is the worst that can come of it)."""
    try:
        with open(path, "rb", buffering=0) as file:
            file.seek(size - 1)
            return file.read(1) == b"\n"
    except OSError:
        return False


class JsonlEventHandler(ClosesOnExit):
    """An event handler appending each event as one JSON line to ``path``.

    ``register_event_handler(JsonlEventHandler("events.jsonl"))``; see this
    module's documentation (or docs/sinks.md) for the line format, and
    :func:`read_jsonl` to read the file back.

    - The file is opened in append mode when the handler is created (its
      directory must exist), so earlier lines are kept. A symbolic link at
      ``path`` itself is not followed: ``OSError`` (``ELOOP``) naming it
      (links among the directories above it are followed as usual).
    - Every event is written with one ``write`` call on an unbuffered file:
      it reaches the OS before the handler returns (it is not
      ``fsync``-ed). :func:`read_jsonl` in another process sees whole
      events only: it leaves out an unfinished last line.
    - ``max_bytes``: when set, no file grows beyond that many bytes (unless a
      single line is longer, which then gets a file of its own): before a
      line that would not fit, the file is rotated like
      ``logging.handlers.RotatingFileHandler`` does, ``path`` -> ``path.1``
      -> ``path.2`` ... up to ``path.<backup_count>``, the oldest dropped.
      With ``backup_count=0`` the file is emptied instead. The size is counted
      by this handler, so rotation assumes it is the only writer of ``path``.
      When ``path`` cannot be opened again while rotating (its directory was
      removed), that event raises the ``OSError``, and each later event tries
      again; the handler is not closed.
    - Thread-safe: concurrent events are written whole, one line each.
    - A write that fails (a full disk) raises, and the part of the line
      already written is cut off again, so the file keeps ending in a whole
      line; a file that does not end in a newline when opened (its writer
      was killed mid-line) gets a newline before the first line.
    - ``distributions``: when true, a Stat window event that carries a
      distribution (``event.distribution``, a Stat with a P aggregation) is
      written with it (the line's ``"distribution"`` key), for
      ``read_jsonl(path, distributions=True)`` and ``torchmon summarize``
      to merge; off by default, so lines stay as torch-style readers expect.
    - ``close()`` (or leaving a ``with`` block) closes the file; an event
      handed to a closed handler raises ``ValueError``. Unregister the
      handler before closing it.
    """

    __slots__ = (
        "_backup_count",
        "_closed",
        "_distributions",
        "_file",
        "_lock",
        "_max_bytes",
        "_new_line_first",
        "_path",
        "_size",
    )

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_bytes: int | None = None,
        backup_count: int = 5,
        distributions: bool = False,
    ) -> None:
        self._path = _path_arg(path, "JsonlEventHandler", "path")
        if not isinstance(distributions, bool):
            raise arg_type_error("JsonlEventHandler", "distributions", "a bool", distributions)
        self._distributions = distributions
        if max_bytes is not None:
            check_int("JsonlEventHandler", "max_bytes", max_bytes, low=1, expected="an int or None")
        check_int("JsonlEventHandler", "backup_count", backup_count, low=0)
        self._max_bytes = max_bytes
        self._backup_count = backup_count
        self._lock = new_lock()
        self._size = 0
        self._new_line_first = False
        self._closed = False
        # None while closed, or after reopening the file failed (rotation).
        self._file: BinaryIO | None = self._open()

    @classmethod
    def for_rank(
        cls,
        directory: str | os.PathLike[str] = ".",
        name: str = "events-rank{rank}.jsonl",
        **handler_options: Any,
    ) -> JsonlEventHandler:
        """A handler writing to this rank's own file: ``directory`` joined with
        ``torchmon.rank_info().format(name)`` (``events-rank3.jsonl`` for
        ``RANK=3``; ``name`` may use every field of ``RankInfo`` and
        ``node``). The file's directory is made (with its parents) if
        missing: docs/guide.md, "Multi-node setups", calls
        ``for_rank("logs")`` in a fresh working directory.
        ``handler_options`` are the constructor's."""
        from .._rank import rank_info

        folder = _path_arg(directory, "JsonlEventHandler.for_rank", "directory")
        if not isinstance(name, str):
            raise arg_type_error("JsonlEventHandler.for_rank", "name", "a str", name)
        path = os.path.join(folder, rank_info().format(name))
        # The file's own directory: a name may hold a subdirectory ("{node}/r{rank}.jsonl").
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        return cls(path, **handler_options)

    @property
    def path(self) -> str:
        """The path of the file being written."""
        return self._path

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def _open(self) -> BinaryIO:
        """Opens ``path`` for appending; sets ``_size`` and whether the next
        line must begin with a newline (the file ends in part of a line)."""
        try:
            fd = os.open(self._path, _APPEND_FLAGS, 0o666)
        except OSError as exc:
            # ELOOP (EMLINK on FreeBSD) is also a loop among the directories.
            refused = exc.errno in (errno.ELOOP, errno.EMLINK)
            if _NOFOLLOW and refused and os.path.islink(self._path):
                raise OSError(
                    exc.errno,
                    "JsonlEventHandler: the path is a symbolic link, which is not followed "
                    "(another user may have planted it); give the file's own path",
                    self._path,
                ) from None
            raise
        try:
            file = os.fdopen(fd, "ab", buffering=0)
        except BaseException:
            os.close(fd)
            raise
        try:
            size = os.fstat(file.fileno()).st_size
        except BaseException:
            file.close()
            raise
        self._size = size
        self._new_line_first = size > 0 and not _ends_in_newline(self._path, size)
        return file

    def __call__(self, event: Event) -> None:
        line = _encode_event(event, self._distributions)
        with self._lock:
            if self._closed:
                raise ValueError(f"JsonlEventHandler({self._path!r}) is closed")
            file = self._file
            if file is None:  # reopening it failed when rotating: try again
                file = self._reopen()
            if (
                self._max_bytes is not None
                and self._size > 0
                and self._size + len(line) > self._max_bytes
            ):
                file = self._rotate(file)
            if self._new_line_first:
                line = b"\n" + line
            self._write(file, line)

    def _write(self, file: BinaryIO, line: bytes) -> None:
        """Writes ``line`` whole, or leaves the file ending where it did
        (docs/sinks.md, "Faults"). Called with the lock held."""
        written = 0
        try:
            written = file.write(line)
            while written < len(line):  # a short write (a full disk): finish it, or fail
                written += file.write(memoryview(line)[written:])
        except BaseException:
            # ENOSPC, EFBIG, EIO, or KeyboardInterrupt between two writes.
            if written:
                self._take_back(file, written)
            raise
        self._size += written
        self._new_line_first = False

    def _take_back(self, file: BinaryIO, written: int) -> None:
        """Removes the ``written`` bytes of a line that failed, so that the
        file ends in a whole line again; when that is not possible, the next
        line begins with a newline instead, and the part stays as one
        unreadable line (``read_jsonl(errors="skip")`` skips it)."""
        try:
            end = file.tell()  # append mode: just after our bytes
            # Not when another process appended since: that would cut its lines.
            if os.fstat(file.fileno()).st_size == end:
                file.truncate(end - written)
                self._size = end - written
                return
        except OSError:
            pass
        self._size += written
        self._new_line_first = True

    def _rotate(self, file: BinaryIO) -> BinaryIO:
        """Called with the lock held; returns the new (empty) file."""
        if self._backup_count == 0:
            file.truncate(0)
            self._size = 0
            self._new_line_first = False
            return file
        file.close()
        self._file = None
        try:
            for i in range(self._backup_count - 1, 0, -1):
                source = f"{self._path}.{i}"
                if os.path.exists(source):
                    os.replace(source, f"{self._path}.{i + 1}")
            if os.path.exists(self._path):
                os.replace(self._path, f"{self._path}.1")
        finally:
            # Even when a rename failed, keep writing (to the file still at path).
            file = self._reopen()
        return file

    def _reopen(self) -> BinaryIO:
        """Opens ``path`` again after a rotation; an error names its cause.
        Called with the lock held."""
        try:
            file = self._open()
        except OSError as exc:
            # Not "closed": the next event tries again, and writes once the
            # path can be opened (docs/sinks.md, "Rotation").
            raise OSError(
                exc.errno,
                "JsonlEventHandler: cannot reopen the file after rotating it "
                f"({exc.strerror}); the event was not written, the next one tries again",
                self._path,
            ) from exc
        self._file = file
        return file

    def close(self) -> None:
        """Closes the file (a second call does nothing)."""
        with self._lock:
            file, self._file = self._file, None
            self._closed = True
        if file is not None:
            file.close()

    def __repr__(self) -> str:
        extra = ""
        if self._max_bytes is not None:
            extra = f", max_bytes={self._max_bytes}, backup_count={self._backup_count}"
        if self._distributions:
            extra += ", distributions=True"
        if self._closed:
            state = ", closed"
        elif self._file is None:
            state = ", not open: reopening after a rotation failed"
        else:
            state = ""
        return f"JsonlEventHandler({self._path!r}{extra}){state}"


# --- reading ------------------------------------------------------------------


class _LineError(ValueError):
    pass


def _check_str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise _LineError(f"{what} must be a JSON string, not {_json_kind(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _LineError(f"{what} holds a lone surrogate ({value!r})") from None
    return value


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _decode_value(key: str, value: object) -> str | int | float | bool:
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return _check_str(value, f"data[{key!r}]")
    if isinstance(value, dict) and len(value) == 1 and FLOAT_TAG in value:
        text = value[FLOAT_TAG]
        if isinstance(text, str) and text in _NON_FINITE_TEXT:
            return _NON_FINITE_TEXT[text]
        raise _LineError(
            f'data[{key!r}]: {{"{FLOAT_TAG}": ...}} must be "nan", "inf" or "-inf", not {text!r}'
        )
    raise _LineError(
        f"data[{key!r}] must be a string, number, boolean or "
        f'{{"{FLOAT_TAG}": ...}}, not {_json_kind(value)}'
    )


def _exact_offset(timestamp: datetime, stamp: str) -> datetime:
    """CPython's fromisoformat (3.11 at least) reads an offset of under a
    second, ``+00:00:00.000001``, as UTC; this reads the offset itself."""
    match = _ISO_OFFSET.search(stamp)
    if match is None:
        return timestamp
    sign, hours, minutes, seconds, micros = match.groups()
    offset = timedelta(
        hours=int(hours),
        minutes=int(minutes),
        seconds=int(seconds or 0),
        microseconds=int(micros or 0),
    )
    if sign == "-":
        offset = -offset
    if offset == timestamp.utcoffset() or not -timedelta(days=1) < offset < timedelta(days=1):
        return timestamp
    return timestamp.replace(tzinfo=timezone(offset))


def _decode_line(line: str) -> Event:
    """The event of one JSON line (``ValueError`` saying what is wrong)."""
    return _decode_record(line, False)[0]


def _decode_record(line: str, distributions: bool) -> tuple[Event, Distribution | None]:
    """The event of one JSON line, and its distribution when ``distributions``
    (``None`` when the line has none)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise _LineError(f"not valid JSON: {exc}") from None
    except RecursionError:
        raise _LineError("not readable: JSON nested too deeply") from None
    except ValueError as exc:  # an integer beyond sys.get_int_max_str_digits()
        raise _LineError(f"not readable: {exc}") from None
    if not isinstance(record, dict):
        raise _LineError(f"must be a JSON object, not {_json_kind(record)}")
    for field in ("name", "timestamp", "data"):
        if field not in record:
            raise _LineError(f"missing {field!r}")
    name = _check_str(record["name"], "name")
    stamp = _check_str(record["timestamp"], "timestamp")
    try:
        timestamp = datetime.fromisoformat(stamp)
    except ValueError:
        raise _LineError(f"timestamp {stamp!r} is not an ISO-8601 date and time") from None
    if timestamp.tzinfo is not None:
        timestamp = _exact_offset(timestamp, stamp)
    fold = record.get("fold", 0)
    if fold not in (0, 1) or isinstance(fold, (bool, float)):
        raise _LineError(f"fold must be 0 or 1, not {fold!r}")
    if fold:
        timestamp = timestamp.replace(fold=1)
    raw = record["data"]
    if not isinstance(raw, dict):
        raise _LineError(f"data must be a JSON object, not {_json_kind(raw)}")
    data: dict[str, str | int | float | bool | bytes | bytearray] = {
        _check_str(key, "a data key"): _decode_value(key, value) for key, value in raw.items()
    }
    try:
        event = Event(name, timestamp, data)
    except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
        raise _LineError(f"not a valid event: {exc}") from None
    if not distributions or record.get("distribution") is None:
        return event, None
    from .._distribution import Distribution

    try:
        return event, Distribution.from_dict(record["distribution"])
    except (TypeError, ValueError) as exc:
        raise _LineError(f"not a valid distribution: {exc}") from None


_ERRORS = ("raise", "skip")


@overload
def read_jsonl(
    path: str | os.PathLike[str], *, errors: str = ..., distributions: Literal[False] = ...
) -> JsonlReader[Event]: ...
@overload
def read_jsonl(
    path: str | os.PathLike[str], *, errors: str = ..., distributions: Literal[True]
) -> JsonlReader[tuple[Event, Distribution | None]]: ...
@overload
def read_jsonl(
    path: str | os.PathLike[str], *, errors: str = ..., distributions: bool
) -> JsonlReader[Any]: ...
def read_jsonl(
    path: str | os.PathLike[str], *, errors: str = "raise", distributions: bool = False
) -> JsonlReader[Any]:
    """Yields the events of a file written by :class:`JsonlEventHandler`, in order.

    Each event equals the one written: same name, an equal timestamp (with
    the same UTC offset when it had one; a tz-aware timestamp comes back with
    a fixed-offset ``datetime.timezone``), and the same data, value types
    included. Blank lines are skipped. The non-standard ``NaN``/``Infinity``
    literals of Python's ``json`` module are read as floats too.

    A last line without its ``"\\n"`` that is not a whole event is a line
    still being written (or cut short by a crash): it is left out, and is
    not an error. Every other line that is not a valid event is unreadable:

    - ``errors="raise"`` (the default): ``ValueError`` naming the file and
      the line number (``"events.jsonl:3: ..."``);
    - ``errors="skip"``: the line is skipped and counted in the returned
      reader's ``skipped`` (``first_skipped`` holds the first one's message).

    ``distributions=True`` yields ``(event, distribution)`` pairs instead:
    the :class:`~torchmon.Distribution` stored with the event
    (``JsonlEventHandler(..., distributions=True)``), or ``None`` for a line
    without one. (A ``torchmon.Event`` made in Python cannot carry a
    distribution, so it comes beside the event.) A stored distribution that
    is not valid makes the line unreadable; without ``distributions`` it is
    not looked at.

    Returns a :class:`JsonlReader`, an iterator that opens the file when
    first iterated. To read a rotated set oldest first, chain the files:
    ``itertools.chain(read_jsonl("e.jsonl.2"), read_jsonl("e.jsonl.1"), read_jsonl("e.jsonl"))``.
    """
    text = _path_arg(path, "read_jsonl", "path")
    if not isinstance(errors, str):
        raise arg_type_error("read_jsonl", "errors", "a str", errors)
    if errors not in _ERRORS:
        raise arg_value_error("read_jsonl", "errors", f"must be 'raise' or 'skip', got {errors!r}")
    if not isinstance(distributions, bool):
        raise arg_type_error("read_jsonl", "distributions", "a bool", distributions)
    return JsonlReader(text, errors, distributions)


class JsonlReader(Iterator[_T], Generic[_T]):
    """The iterator :func:`read_jsonl` returns: the events of one file (or
    ``(event, distribution)`` pairs, with ``distributions=True``).

    - ``path``: the file; ``errors``: ``"raise"`` or ``"skip"``;
      ``distributions``: whether it yields pairs.
    - ``skipped``: how many unreadable lines were skipped so far
      (``errors="skip"``; always 0 with ``"raise"``).
    - ``first_skipped``: the message of the first skipped line
      (``"events.jsonl:3: not valid JSON: ..."``), or ``None``.
    - ``close()`` closes the file before the end (also done when the reader
      is garbage-collected).
    """

    __slots__ = (
        "_bytes_read",
        "_events",
        "distributions",
        "errors",
        "first_skipped",
        "path",
        "skipped",
    )

    def __init__(self, path: str, errors: str, distributions: bool = False) -> None:
        self.path = path
        self.errors = errors
        self.distributions = distributions
        self.skipped = 0
        self.first_skipped: str | None = None
        # How far into the file the lines read so far reach: the CLI's
        # progress bar (docs/cli.md), at no cost per line worth measuring.
        self._bytes_read = 0
        self._events = self._read()

    def __iter__(self) -> JsonlReader[_T]:
        return self

    def __next__(self) -> _T:
        return next(self._events)

    def close(self) -> None:
        """Closes the file; the iterator is then exhausted."""
        self._events.close()

    def _unreadable(self, message: str) -> None:
        if self.errors == "raise":
            raise ValueError(message)
        self.skipped += 1
        if self.first_skipped is None:
            self.first_skipped = message

    def _read(self) -> Generator[_T, None, None]:
        with self._open() as file:
            for lineno, raw in enumerate(file, 1):
                self._bytes_read += len(raw)
                record = self._line(raw, lineno)
                if record is not None:
                    yield self._result(record)
                if not raw.endswith(b"\n"):
                    # Nothing after a last line without its newline is read,
                    # even if the file grew since.
                    return

    def _line(self, raw: bytes, lineno: int) -> tuple[Event, Distribution | None] | None:
        """The record of line ``lineno``, or None: a blank line, an unreadable
        one (counted, or raised), or a line without its newline (the last one
        read: a writer is still writing it, or was killed halfway,
        docs/sinks.md, "Reading") that is not a whole event. Also the reader
        of the lines ``torchmon summarize``'s native reader leaves to Python."""
        whole = raw.endswith(b"\n")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            if whole:
                self._unreadable(f"{self.path}:{lineno}: not UTF-8: {exc}")
            return None
        if not line.strip(" \t\r\n"):
            return None
        try:
            return _decode_record(line, self.distributions)
        except _LineError as exc:
            if whole:
                self._unreadable(f"{self.path}:{lineno}: {exc}")
            return None

    def _open(self) -> AbstractContextManager[Iterable[bytes]]:
        # A method so that the torchmon command can read its logs through a
        # file it opened and checked itself (a FIFO without a writer, a line
        # without end: docs/cli.md, "Input").
        return open(self.path, "rb")

    def _result(self, record: tuple[Event, Distribution | None]) -> _T:
        return record if self.distributions else record[0]  # type: ignore[return-value]

    def __repr__(self) -> str:
        extra = ", distributions=True" if self.distributions else ""
        return f"JsonlReader({self.path!r}, errors={self.errors!r}{extra}, skipped={self.skipped})"
