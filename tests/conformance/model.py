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
import collections
import collections.abc
import datetime
import decimal
import enum
import fractions
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
    the values are the C++ enum's (torch's binding maps VALUE to 0).
    STDDEV and P50 ... P999 (7 to 12) are torchmon's extensions
    (docs/compatibility.md); torch has none of them."""

    VALUE = 1
    MEAN = 2
    COUNT = 3
    SUM = 4
    MAX = 5
    MIN = 6
    STDDEV = 7
    P50 = 8
    P90 = 9
    P95 = 10
    P99 = 11
    P999 = 12

    def __int__(self):
        return self.value


# the members, in definition order
VALUE, MEAN, COUNT, SUM, MAX, MIN, STDDEV, P50, P90, P95, P99, P999 = Aggregation

#: Each quantile member's q as the exact fraction k / 1000 (docs/api.md).
QUANTILE_PERMILLE = {P50: 500, P90: 900, P95: 950, P99: 990, P999: 999}


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
    """Structured record.  Equality and hashing stay by identity (as torch).

    ``distribution`` is the window's histogram on the events of a Stat with
    a P aggregation, else None.  ``_window_samples`` (the model's own, for
    tests) holds the samples of a Stat window event, else None."""

    _distribution = None
    _window_samples = None

    def __init__(self, name, timestamp, data):
        # The validating setters, in argument order: the first bad one decides.
        self.name = name
        self.timestamp = timestamp
        self.data = data

    @property
    def distribution(self):
        return self._distribution

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


# --- STDDEV and Pq, exactly (docs/api.md, "Aggregation") ------------------
#
# The model keeps every accepted sample of the open window and computes these
# from them exactly, in integer arithmetic; torchmon estimates them (a
# shifted-sums variance, a histogram's bucket), and the tests compare the two
# within the documented error.

_SUBNORMAL_EXP = 1074  # every finite double is an integer multiple of 2**-1074


def _as_units(x):
    """A finite double as the exact integer x * 2**1074."""
    num, den = x.as_integer_ratio()
    return num * ((1 << _SUBNORMAL_EXP) // den)


def _sqrt_ratio(num, den):
    """sqrt(num / den) correctly rounded to a double, for ints num >= 0, den > 0."""
    if num == 0:
        return 0.0
    # Scale so that the integer square root s has at least 69 bits: then the
    # true root lies in [s, s + 1), an interval that holds no double and no
    # midpoint between two doubles, so s + 1/2 rounds as the root does.
    shift = max(0, 140 - (num.bit_length() - den.bit_length()))
    shift += shift & 1
    q, r = divmod(num << shift, den)
    s = math.isqrt(q)
    twice = 2 * s if (r == 0 and s * s == q) else 2 * s + 1
    return float(fractions.Fraction(twice, 2 << (shift // 2)))


def exact_stddev(samples):
    """Population standard deviation (ddof=0), correctly rounded: 0.0 for no
    sample, NaN if any sample is NaN or infinite."""
    if not samples:
        return 0.0
    if not all(math.isfinite(x) for x in samples):
        return math.nan
    units = [_as_units(x) for x in samples]
    n = len(units)
    # var = (n * sum(a**2) - sum(a)**2) / n**2, in units of 2**-2148
    spread = n * sum(a * a for a in units) - sum(units) ** 2
    return _sqrt_ratio(spread, (n * n) << (2 * _SUBNORMAL_EXP))


def quantile_rank(permille, n):
    """The rank (1-based) of Pq among n >= 1 non-NaN samples, q = permille / 1000."""
    return max(1, -(-permille * n // 1000))


def exact_quantile(samples, permille):
    """The sample of rank max(1, ceil(q * n)) among the n non-NaN samples in
    ascending order: 0.0 for no sample, NaN when every sample is NaN."""
    if not samples:
        return 0.0
    ordered = sorted(x for x in samples if not math.isnan(x))
    if not ordered:
        return math.nan
    return ordered[quantile_rank(permille, len(ordered)) - 1]


# --- Distribution (docs/api.md, "Distribution") -----------------------------
#
# A base-2 exponential histogram of scale 6: bucket i holds the x with
# 2**(i/64) < |x| <= 2**((i+1)/64).  The model derives a window's buckets from
# its samples with the exact index below, and estimates a quantile from the
# buckets by the documented rule, so that tests can check torchmon's
# histogram and its estimate bucket by bucket and bit by bit.

SCALE = 6

#: 2 ** ((j + 0.5) / 64), each correctly rounded (docs/api.md).
BUCKET_MIDPOINTS = tuple(
    float.fromhex(h)
    for h in """
    0x1.0163da9fb3335p+0 0x1.04315e86e7f85p+0 0x1.0706b29ddf6dep+0 0x1.09e3ecac6f383p+0
    0x1.0cc922b7247f7p+0 0x1.0fb66affed31bp+0 0x1.12abdc06c31ccp+0 0x1.15a98c8a58e51p+0
    0x1.18af9388c8deap+0 0x1.1bbe084045cd4p+0 0x1.1ed5022fcd91dp+0 0x1.21f49917ddc96p+0
    0x1.251ce4fb2a63fp+0 0x1.284dfe1f56381p+0 0x1.2b87fd0dad990p+0 0x1.2ecafa93e2f56p+0
    0x1.32170fc4cd831p+0 0x1.356c55f929ff1p+0 0x1.38cae6d05d866p+0 0x1.3c32dc313a8e5p+0
    0x1.3fa4504ac801cp+0 0x1.431f5d950a897p+0 0x1.46a41ed1d0057p+0 0x1.4a32af0d7d3dep+0
    0x1.4dcb299fddd0dp+0 0x1.516daa2cf6642p+0 0x1.551a4ca5d920fp+0 0x1.58d12d497c7fdp+0
    0x1.5c9268a5946b7p+0 0x1.605e1b976dc09p+0 0x1.6434634ccc320p+0 0x1.68155d44ca973p+0
    0x1.6c012750bdabfp+0 0x1.6ff7df9519484p+0 0x1.73f9a48a58174p+0 0x1.780694fde5d3fp+0
    0x1.7c1ed0130c132p+0 0x1.80427543e1a12p+0 0x1.8471a4623c7adp+0 0x1.88ac7d98a6699p+0
    0x1.8cf3216b5448cp+0 0x1.9145b0b91ffc6p+0 0x1.95a44cbc8520fp+0 0x1.9a0f170ca07bap+0
    0x1.9e86319e32323p+0 0x1.a309bec4a2d33p+0 0x1.a799e1330b358p+0 0x1.ac36bbfd3f37ap+0
    0x1.b0e07298db666p+0 0x1.b59728de5593ap+0 0x1.ba5b030a1064ap+0 0x1.bf2c25bd71e09p+0
    0x1.c40ab5fffd07ap+0 0x1.c8f6d9406e7b5p+0 0x1.cdf0b555dc3fap+0 0x1.d2f87080d89f2p+0
    0x1.d80e316c98398p+0 0x1.dd321f301b460p+0 0x1.e264614f5a129p+0 0x1.e7a51fbc74c83p+0
    0x1.ecf482d8e67f1p+0 0x1.f252b376bba97p+0 0x1.f7bfdad9cbe14p+0 0x1.fd3c22b8f71f1p+0
    """.split()
)


def bucket_index(x):
    """The bucket of a finite x != 0 (of |x|), exactly: the i with
    2**i < |x|**64 <= 2**(i+1)."""
    num, den = abs(x).as_integer_ratio()
    zeros = (num & -num).bit_length() - 1
    m = num >> zeros  # odd: |x| == m / 2**s exactly
    s = (den.bit_length() - 1) - zeros
    i = (m**64).bit_length() - 1 - 64 * s  # floor(log2(|x|**64))
    return i - 1 if m == 1 else i  # |x|**64 == 2**i exactly: the upper bound of bucket i-1


def bucket_representative(i):
    """The value reported for a sample in positive bucket i: 2**((i + 0.5)/64)
    rounded once, moved one ulp into the bucket if rounding left it (which
    only a subnormal can)."""
    octave, j = divmod(i, 64)
    rep = float(fractions.Fraction(BUCKET_MIDPOINTS[j]) * fractions.Fraction(2) ** octave)
    if rep == 0.0 or bucket_index(rep) < i:
        rep = math.nextafter(rep, math.inf)
    elif bucket_index(rep) > i:
        rep = math.nextafter(rep, 0.0)
    return rep


class Distribution:
    """A window's histogram (docs/api.md): read-only attributes, built by a
    Stat with a P aggregation at window close."""

    __slots__ = (
        "count",
        "max",
        "min",
        "nan_count",
        "negative",
        "negative_inf_count",
        "positive",
        "positive_inf_count",
        "scale",
        "sum",
        "zero_count",
    )

    @classmethod
    def of_samples(cls, samples, total, smallest, largest):
        """The histogram of `samples`; sum, min and max are the window's."""
        d = object.__new__(cls)
        pos, neg = collections.Counter(), collections.Counter()
        for x in samples:
            if math.isfinite(x) and x != 0.0:
                (pos if x > 0 else neg)[bucket_index(x)] += 1
        d.scale = SCALE
        d.count = len(samples)
        d.sum, d.min, d.max = total, smallest, largest
        d.zero_count = sum(1 for x in samples if x == 0.0)
        d.nan_count = sum(1 for x in samples if math.isnan(x))
        d.positive_inf_count = sum(1 for x in samples if x == math.inf)
        d.negative_inf_count = sum(1 for x in samples if x == -math.inf)
        d.positive, d.negative = tuple(sorted(pos.items())), tuple(sorted(neg.items()))
        return d

    def value_at_rank(self, r):
        """The documented estimate of the sample of rank r (1-based) among
        the non-NaN samples."""
        n = self.count - self.nan_count
        exact_ends = not (math.isnan(self.min) or math.isnan(self.max))
        if exact_ends and r == 1:
            return self.min
        if exact_ends and r == n:
            return self.max
        # The samples in ascending order, one run per (count, value).
        runs = [(self.negative_inf_count, -math.inf)]
        runs += [(c, -bucket_representative(i)) for i, c in reversed(self.negative)]
        runs.append((self.zero_count, 0.0))
        runs += [(c, bucket_representative(i)) for i, c in self.positive]
        runs.append((self.positive_inf_count, math.inf))
        seen = 0
        for c, run_value in runs:
            seen += c
            if r <= seen:
                value = run_value
                break
        if exact_ends:
            value = min(max(value, self.min), self.max)
        return value

    def quantile(self, q):
        """Estimate of the q-quantile, q in [0, 1] as the decimal written."""
        if self.count == 0:
            return 0.0
        n = self.count - self.nan_count
        if n == 0:
            return math.nan
        rank = max(1, math.ceil(fractions.Fraction(repr(q)) * n))
        return self.value_at_rank(rank)


# --- Stat (docs/api.md, docs/internals.md) -------------------------------


class _Window:
    """Accumulators of one window; empty means count 0 and +0.0 elsewhere.
    The accepted samples are kept too, for the exact STDDEV and Pq."""

    __slots__ = ("count", "last", "max", "min", "samples", "sum")

    def __init__(self):
        self.count, self.sum, self.min, self.max, self.last = 0, 0.0, 0.0, 0.0, 0.0
        self.samples = []

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
        self.samples.append(v)

    def value(self, agg):
        if agg is Aggregation.MEAN:
            return self.sum / self.count if self.count else 0.0
        if agg is Aggregation.COUNT:
            return float(self.count)
        if agg is Aggregation.STDDEV:
            return exact_stddev(self.samples)
        if agg in QUANTILE_PERMILLE:
            return exact_quantile(self.samples, QUANTILE_PERMILLE[agg])
        return {
            Aggregation.VALUE: self.last,
            Aggregation.SUM: self.sum,
            Aggregation.MAX: self.max,
            Aggregation.MIN: self.min,
        }[agg]

    def distribution(self):
        return Distribution.of_samples(self.samples, self.sum, self.min, self.max)


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

    def _last_window(self):
        """The model's own, for tests: the window behind get()'s values."""
        return self._prev

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
        wants_histogram = any(agg in QUANTILE_PERMILLE for agg in self._aggregations)
        distribution = window.distribution() if wants_histogram else None
        samples = tuple(window.samples)

        def make_event():
            # Each handler gets its own Event: one that renames it cannot
            # affect the next.
            event = Event(STAT_EVENT, timestamp, data)
            event._distribution = distribution
            event._window_samples = samples
            return event

        _dispatch(make_event)


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
