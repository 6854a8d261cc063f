"""Pure-Python reference model of the torchmon behaviour contract.

Written from the documented contract (docs/api.md, docs/internals.md's
window algorithm, and torchmon's side of every row of docs/compatibility.md),
independently of the Rust code.  It is meant to be
read in one sitting and used as an oracle: replay.py can load it as MODULE,
and property tests can run it side by side with torchmon.

Standard library only.  numpy scalars are recognised by duck typing (they
carry a ``dtype`` and register with ``numbers``); numpy is never imported.

Time is read from ``clock_ms()``; tests call ``set_clock_ms(t)`` to drive
windows deterministically and ``set_clock_ms(None)`` to restore the real
monotonic clock.  The model is single-threaded: it has no locks.
"""

import atexit
import collections.abc
import datetime
import decimal
import enum
import math
import numbers
import operator
import sys
import time
import types
import weakref

STAT_EVENT = "torch.monitor.Stat"
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


# --- Clock (window algorithm: monotonic clock in whole milliseconds) ------

_fixed_clock_ms = None  # None: read the real monotonic clock


def clock_ms():
    """Current time in whole milliseconds, as every Stat reads it."""
    if _fixed_clock_ms is not None:
        return _fixed_clock_ms
    return time.monotonic_ns() // 1_000_000


def set_clock_ms(t):
    """Pin the clock to ``t`` ms (an int), or restore the real clock (None)."""
    global _fixed_clock_ms
    _fixed_clock_ms = None if t is None else operator.index(t)


# --- Aggregation (docs/api.md) -------------------------------------------


class Aggregation(enum.Enum):
    """A plain Enum, so members are not equal to ints (SUM != 4), as torch;
    the values are the C++ enum's (torch's binding maps VALUE to 0)."""

    VALUE = 1
    MEAN = 2
    COUNT = 3
    SUM = 4
    MAX = 5
    MIN = 6

    def __int__(self):
        return self.value


VALUE, MEAN, COUNT, SUM, MAX, MIN = Aggregation  # the members, in definition order


class data_value_t:
    """Marker type for ``str | float | int | bool``; not constructible."""

    def __init__(self, *args, **kwargs):
        raise TypeError("data_value_t cannot be constructed")


# --- Argument conversion (docs/api.md: strings, Stat, Event) ------------


def _as_text(x, what, surrogate_error=TypeError):
    """str kept exactly (as the base str type); bytes/bytearray decoded as
    UTF-8.  A lone surrogate cannot cross into Rust/C++ as UTF-8: torch
    raises RuntimeError for an Event data value and TypeError elsewhere."""
    if isinstance(x, str):
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:
            raise surrogate_error(f"{what}: lone surrogate in {x!r}") from None
        return str.__str__(x)  # an exact str even for a str subclass
    if isinstance(x, (bytes, bytearray)):
        try:
            return bytes(x).decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{what}: invalid UTF-8 in {bytes(x)!r}") from None
    raise TypeError(f"{what} must be str or bytes, not {type(x).__name__}")


def _is_numpy_scalar(v):
    return hasattr(v, "dtype") and not hasattr(v, "__len__")


def _as_data_value(v, key):
    """One Event data value -> bool | str | int | float (docs/api.md, "Event")."""
    if isinstance(v, bool):
        return v  # docs/compatibility.md: stays bool (torch turns it into 1.0/0.0)
    if hasattr(v, "dtype") and type(v).__name__ in ("bool_", "bool"):
        return bool(v)  # numpy.bool_ (named "bool" since numpy 2)
    if isinstance(v, (str, bytes, bytearray)):
        return _as_text(v, f"data[{key!r}]", surrogate_error=RuntimeError)
    if isinstance(v, int) or (isinstance(v, numbers.Integral) and _is_numpy_scalar(v)):
        n = operator.index(v)  # exact int, also for IntEnum members
        if not INT64_MIN <= n <= INT64_MAX:
            raise ValueError(f"data[{key!r}]: {n} does not fit in int64")
        return n
    if isinstance(v, float) or (isinstance(v, numbers.Real) and _is_numpy_scalar(v)):
        return float(v)
    raise TypeError(f"data[{key!r}]: unsupported value type {type(v).__name__}")


def _as_data(data):
    """Copy of an Event's data.  Items are checked in iteration order, key
    before value, and the first bad one decides (as torch's converter)."""
    if not isinstance(data, collections.abc.Mapping):
        raise TypeError(f"data must be a dict, not {type(data).__name__}")
    out = {}
    for key, value in data.items():
        key = _as_text(key, "data key")
        out[key] = _as_data_value(value, key)
    return out


def _as_timestamp(ts):
    """datetime kept unchanged, tz-aware included (docs/compatibility.md); a date means
    midnight and a time means that time on 1970-01-01 (as pybind11)."""
    if isinstance(ts, datetime.datetime):
        return ts
    if isinstance(ts, datetime.date):
        return datetime.datetime(ts.year, ts.month, ts.day)
    if isinstance(ts, datetime.time):
        return datetime.datetime.combine(datetime.date(1970, 1, 1), ts)
    raise TypeError(f"timestamp must be a datetime, not {type(ts).__name__}")


def _as_sample(v):
    """Stat.add's argument -> float, accepting what pybind11's double caster
    accepts (anything with __float__ or __index__, but not str/bytes)."""
    if not (hasattr(type(v), "__float__") or hasattr(type(v), "__index__")):
        raise TypeError(f"cannot add a {type(v).__name__} to a Stat")
    try:
        return float(v)
    except Exception as exc:  # e.g. OverflowError for 2**1024
        raise TypeError(f"cannot convert {v!r} to float") from exc


def _as_aggregations(aggregations):
    try:
        items = list(aggregations)
    except TypeError:
        raise TypeError("aggregations must be an iterable of Aggregation") from None
    for a in items:
        if not isinstance(a, Aggregation):
            raise TypeError(f"not an Aggregation: {a!r}")
    return list(dict.fromkeys(items))  # duplicates are harmless


def _window_ms(w):
    """Window length in whole ms, truncated toward zero like C++ duration_cast;
    float seconds as the decimal repr() shows (docs/api.md: torch truncates
    w * 1000.0 instead, so 1.001 s is 1000 ms there)."""
    if isinstance(w, datetime.timedelta):
        us = (w.days * 86_400 + w.seconds) * 1_000_000 + w.microseconds
        ms = abs(us) // 1000 * (1 if us >= 0 else -1)
    else:
        if not math.isfinite(w):
            raise ValueError(f"window_size must be finite, got {w!r}")
        ms = int(decimal.Decimal(repr(w)) * 1000)
    if ms < 1:  # torch: SIGFPE below 1 ms, undefined behaviour when negative
        raise ValueError(f"window_size must be at least 1 ms, got {w!r}")
    if ms > INT64_MAX:
        raise ValueError(f"window_size {w!r} does not fit in int64 milliseconds")
    return ms


def _as_max_samples(m):
    """int in int64 (True counts as 1), or anything with __index__ or
    __int__ (Decimal, Fraction: as torch's pybind11 caster); float, None,
    str and out of range: TypeError."""
    if m is None or isinstance(m, (float, str, bytes, bytearray)):
        raise TypeError(f"max_samples must be an int, not {type(m).__name__}")
    try:
        n = operator.index(m)
    except TypeError:
        if not hasattr(type(m), "__int__"):
            raise TypeError(f"max_samples must be an int, not {type(m).__name__}") from None
        n = int(m)
    if not INT64_MIN <= n <= INT64_MAX:
        raise TypeError(f"max_samples {n} does not fit in int64")
    return max(n, 1)  # <= 0 behaves like 1, as in torch


# --- Event (docs/api.md) -------------------------------------------------


class Event:
    """Structured record.  Equality and hashing stay by identity (as torch)."""

    def __init__(self, name, timestamp, data):
        # The validating setters, in argument order: the first bad one decides.
        self.name = name
        self.timestamp = timestamp
        self.data = data

    @property
    def name(self):
        return self._name

    @name.setter
    def name(self, value):
        self._name = _as_text(value, "Event name")

    @property
    def timestamp(self):
        return self._timestamp

    @timestamp.setter
    def timestamp(self, value):
        self._timestamp = _as_timestamp(value)

    @property
    def data(self):
        return dict(self._data)  # a fresh dict: mutating it changes nothing

    @data.setter
    def data(self, value):
        self._data = _as_data(value)  # our own copy

    def __repr__(self):
        return f"Event(name={self._name!r}, timestamp={self._timestamp!r}, data={self._data!r})"

    def __reduce__(self):  # docs/compatibility.md: Events pickle
        return (Event, (self._name, self._timestamp, self._data))


# --- Handlers and dispatch (docs/api.md) --------------------------------


class EventHandlerHandle:
    """Opaque handle returned by register_event_handler."""

    __slots__ = ("_callback", "_registered")

    def __init__(self, *args, **kwargs):
        raise TypeError("EventHandlerHandle cannot be constructed directly")


_registry = []  # handles, in registration order


def register_event_handler(callback):
    if not callable(callback):
        raise TypeError(f"callback must be callable, not {type(callback).__name__}")
    handle = object.__new__(EventHandlerHandle)
    handle._callback = callback
    handle._registered = True
    _registry.append(handle)
    return handle


def unregister_event_handler(handle):
    if not isinstance(handle, EventHandlerHandle):
        raise TypeError(f"expected an EventHandlerHandle, not {type(handle).__name__}")
    if handle._registered:  # a second unregister is a no-op (torch: segfault)
        handle._registered = False
        _registry.remove(handle)


def _report_unraisable(exc, message, obj):
    sys.unraisablehook(
        types.SimpleNamespace(
            exc_type=type(exc),
            exc_value=exc,
            exc_traceback=exc.__traceback__,
            err_msg=message,
            object=obj,
        )
    )


def _dispatch(make_event):
    """Call every handler registered when dispatch starts, in order.

    Iterating over a snapshot lets handlers log events and (un)register
    handlers (torch deadlocks); a handler unregistered meanwhile is skipped.
    Every handler runs even if an earlier one raised (torch stops at the
    first). The first exception is re-raised at the end, except that a
    KeyboardInterrupt-like one (not an Exception) displaces an ordinary
    one; every exception not raised goes to sys.unraisablehook.
    """
    first_error = None
    for handle in list(_registry):
        if not handle._registered:
            continue
        try:
            handle._callback(make_event())
        except BaseException as exc:
            if first_error is None:
                first_error = exc
            elif isinstance(first_error, Exception) and not isinstance(exc, Exception):
                _report_unraisable(first_error, "Exception ignored in handler", handle._callback)
                first_error = exc
            else:
                _report_unraisable(exc, "Exception ignored in handler", handle._callback)
    if first_error is not None:
        try:
            raise first_error
        finally:
            # A local holding the exception whose traceback holds this frame
            # is a cycle that would keep a Stat alive until the next gc run.
            del first_error


def log_event(event):
    if not isinstance(event, Event):
        raise TypeError(f"log_event expects an Event, not {type(event).__name__}")
    _dispatch(lambda: event)  # every handler gets the very object passed


# --- Stat (docs/api.md, docs/internals.md) -------------------------------


class _Window:
    """Accumulators of one window; empty means count 0 and +0.0 elsewhere."""

    __slots__ = ("count", "last", "max", "min", "sum")

    def __init__(self):
        self.count, self.sum, self.min, self.max, self.last = 0, 0.0, 0.0, 0.0, 0.0

    def fold(self, v):
        self.last = v
        self.sum += v
        if self.count == 0:  # the first sample sets both (a NaN sticks)
            self.min = self.max = v
        else:  # plain IEEE comparisons: a later NaN leaves them alone
            if self.max < v:
                self.max = v
            if self.min > v:
                self.min = v
        self.count += 1

    def value(self, agg):
        if agg is Aggregation.MEAN:
            return self.sum / self.count if self.count else 0.0
        if agg is Aggregation.COUNT:
            return float(self.count)
        return {
            Aggregation.VALUE: self.last,
            Aggregation.SUM: self.sum,
            Aggregation.MAX: self.max,
            Aggregation.MIN: self.min,
        }[agg]


_live_stats = weakref.WeakSet()  # flushed at interpreter exit (docs/compatibility.md)


class Stat:
    """Windowed aggregator; a window's event is emitted lazily by add()."""

    _closed = True  # until __init__ completes, so __del__ of a failed init is a no-op

    def __init__(self, name, aggregations, window_size, max_samples=INT64_MAX):
        # Type errors first, in argument order: the conversions torch's
        # binding performs before the constructor body runs ...
        if not isinstance(name, (bytes, bytearray)):
            _as_text(name, "Stat name")  # non-str or lone surrogate: TypeError
        aggs = _as_aggregations(aggregations)
        if not isinstance(window_size, (datetime.timedelta, float)):  # no int, as torch
            raise TypeError(f"window_size must be a timedelta or float, not {window_size!r}")
        max_samples = _as_max_samples(max_samples)
        # ... then value errors, in argument order (torch has no such checks).
        self._name = _as_text(name, "Stat name")
        self._window_ms = _window_ms(window_size)
        self._aggregations = aggs
        self._max_samples = max_samples
        self._acc = _Window()  # the open window
        self._prev = _Window()  # the last closed window: what get() reports
        self._cur_id = 0  # id of the window the accumulators belong to
        self._closed_id = 0  # id of the last window that was closed
        self._closed = False
        _live_stats.add(self)

    @property
    def name(self):
        return self._name

    @property
    def count(self):
        return self._acc.count

    def get(self):
        return {agg: self._prev.value(agg) for agg in self._aggregations}

    def add(self, v):
        x = _as_sample(v)
        if self._closed:
            raise RuntimeError("Stat is closed")
        # Windows never go backwards: a clock earlier than the current window
        # counts the value in the current window.
        w = max(clock_ms() // self._window_ms + 1, self._cur_id)
        pending = []  # closed windows to emit once all state is committed
        self._step(w, pending)  # 1. leave a finished window
        if self._closed_id != w:  # 2. else: window full, value dropped
            self._acc.fold(x)  # 3.
            self._step(w, pending)  # 4. reaching max_samples closes now
        self._emit_all(pending)  # a handler exception changes nothing here

    def close(self):
        """Close the open window and emit it if it has samples: what
        destruction does.  Later calls are no-ops; add() then raises."""
        if self._closed:
            return
        self._closed = True
        _live_stats.discard(self)
        pending = []
        self._close_window(pending)
        self._emit_all(pending)

    def __del__(self):
        # An exception escaping __del__ is reported by Python through
        # sys.unraisablehook, and the program continues (torch aborts).
        self.close()

    def __repr__(self):
        aggs = ", ".join(a.name for a in self._aggregations)
        return (
            f"Stat(name={self._name!r}, aggregations=[{aggs}], "
            f"window_ms={self._window_ms}, max_samples={self._max_samples}, "
            f"count={self.count})"
        )

    def _step(self, w, pending):
        """Steps 1 and 4 of docs/internals.md's window algorithm."""
        full = self._acc.count >= self._max_samples
        if (self._cur_id != w or full) and self._closed_id != w:
            self._close_window(pending)
            self._closed_id, self._cur_id = self._cur_id, w

    def _close_window(self, pending):
        self._prev, self._acc = self._acc, _Window()
        if self._prev.count > 0:  # windows without samples are never emitted
            pending.append(self._prev)

    def _emit_all(self, windows):
        """Emit every window even if a handler raised for an earlier one;
        the first exception is re-raised, the others are unraisable."""
        first_error = None
        for window in windows:
            try:
                self._emit(window)
            except BaseException as exc:
                if first_error is None:
                    first_error = exc
                else:
                    _report_unraisable(exc, "Exception ignored emitting a Stat window", self)
        if first_error is not None:
            try:
                raise first_error
            finally:
                del first_error  # no frame <-> exception cycle (see _dispatch)

    def _emit(self, window):
        timestamp = datetime.datetime.now()  # naive local time, as torch
        data = {f"{self._name}.{agg.name.lower()}": window.value(agg) for agg in self._aggregations}
        # Each handler gets its own Event: one that renames it cannot
        # affect the next.
        _dispatch(lambda: Event(STAT_EVENT, timestamp, data))


@atexit.register
def _flush_live_stats():
    """docs/compatibility.md: a Stat alive at exit still emits its open window."""
    for stat in list(_live_stats):
        try:
            stat.close()
        except Exception as exc:
            _report_unraisable(exc, "Exception ignored while flushing a Stat at exit", stat)


# --- TensorboardEventHandler and _WaitCounter (docs/api.md) --------------


class TensorboardEventHandler:
    """Writes every item of a Stat event as a scalar; ignores other events."""

    def __init__(self, writer):
        self._writer = writer

    def __call__(self, event):
        if event.name == STAT_EVENT:
            walltime = event.timestamp.timestamp()
            for key, value in event.data.items():
                self._writer.add_scalar(key, value, walltime=walltime)


class _WaitCounterTracker:
    """Context manager returned by _WaitCounter.guard(); nothing observable."""

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False


class _WaitCounter:
    def __init__(self, key):
        self._key = _as_text(key, "_WaitCounter key")

    def guard(self):
        return _WaitCounterTracker()
