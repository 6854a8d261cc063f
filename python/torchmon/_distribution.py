"""The histogram a Stat window event carries (``event.distribution``), in pure Python.

Buckets are base-2 exponential at scale 6, as OpenTelemetry's
ExponentialHistogram and Prometheus's native-histogram schema 6: bucket ``i``
holds the values with ``2**(i/64) < |x| <= 2**((i+1)/64)``, positive and
negative values in separate index spaces, zeros, NaN and the infinities
counted apart. docs/api.md ("Distribution") states the quantile rules; they
are those of the native Stat's P aggregations, bit for bit.

Imported on first use of ``torchmon.Distribution`` (and by the native Stat at
the first window close that makes one), never by ``import torchmon``.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

from ._errors import arg_message, arg_type_error, arg_value_error

__all__ = ["Distribution"]

SCALE = 6
_PER_OCTAVE = 1 << SCALE

# 2 ** ((j + 0.5) / 64), the middle of each bucket of an octave in the log
# domain, as exact hex floats: the native core uses the same bits, so that a
# quantile computed here equals the window's P aggregation.
_MID_HEX = (
    "0x1.0163da9fb3335p+0 0x1.04315e86e7f85p+0 0x1.0706b29ddf6dep+0 0x1.09e3ecac6f383p+0 "
    "0x1.0cc922b7247f7p+0 0x1.0fb66affed31bp+0 0x1.12abdc06c31ccp+0 0x1.15a98c8a58e51p+0 "
    "0x1.18af9388c8deap+0 0x1.1bbe084045cd4p+0 0x1.1ed5022fcd91dp+0 0x1.21f49917ddc96p+0 "
    "0x1.251ce4fb2a63fp+0 0x1.284dfe1f56381p+0 0x1.2b87fd0dad990p+0 0x1.2ecafa93e2f56p+0 "
    "0x1.32170fc4cd831p+0 0x1.356c55f929ff1p+0 0x1.38cae6d05d866p+0 0x1.3c32dc313a8e5p+0 "
    "0x1.3fa4504ac801cp+0 0x1.431f5d950a897p+0 0x1.46a41ed1d0057p+0 0x1.4a32af0d7d3dep+0 "
    "0x1.4dcb299fddd0dp+0 0x1.516daa2cf6642p+0 0x1.551a4ca5d920fp+0 0x1.58d12d497c7fdp+0 "
    "0x1.5c9268a5946b7p+0 0x1.605e1b976dc09p+0 0x1.6434634ccc320p+0 0x1.68155d44ca973p+0 "
    "0x1.6c012750bdabfp+0 0x1.6ff7df9519484p+0 0x1.73f9a48a58174p+0 0x1.780694fde5d3fp+0 "
    "0x1.7c1ed0130c132p+0 0x1.80427543e1a12p+0 0x1.8471a4623c7adp+0 0x1.88ac7d98a6699p+0 "
    "0x1.8cf3216b5448cp+0 0x1.9145b0b91ffc6p+0 0x1.95a44cbc8520fp+0 0x1.9a0f170ca07bap+0 "
    "0x1.9e86319e32323p+0 0x1.a309bec4a2d33p+0 0x1.a799e1330b358p+0 0x1.ac36bbfd3f37ap+0 "
    "0x1.b0e07298db666p+0 0x1.b59728de5593ap+0 0x1.ba5b030a1064ap+0 0x1.bf2c25bd71e09p+0 "
    "0x1.c40ab5fffd07ap+0 0x1.c8f6d9406e7b5p+0 0x1.cdf0b555dc3fap+0 0x1.d2f87080d89f2p+0 "
    "0x1.d80e316c98398p+0 0x1.dd321f301b460p+0 0x1.e264614f5a129p+0 0x1.e7a51fbc74c83p+0 "
    "0x1.ecf482d8e67f1p+0 0x1.f252b376bba97p+0 0x1.f7bfdad9cbe14p+0 0x1.fd3c22b8f71f1p+0"
)
BUCKET_MIDPOINTS: tuple[float, ...] = tuple(float.fromhex(h) for h in _MID_HEX.split())

# The buckets that hold finite doubles: 2**-1074, the smallest, is the top of
# bucket 64 * -1074 - 1; the largest double is below 2**1024, the top of
# bucket 64 * 1024 - 1.
MIN_INDEX = _PER_OCTAVE * -1074 - 1
MAX_INDEX = _PER_OCTAVE * 1024 - 1


def bucket_index(value: float) -> int:
    """The scale-6 bucket of ``|value|`` (finite, non-zero), exactly.

    ``|value| = m / 2**s`` with an integer ``m``; ``|value|**64`` is then
    ``m**64 / 2**(64*s)``, whose binary logarithm's floor is
    ``bit_length(m**64) - 1 - 64*s``; the bucket's upper bound is inclusive,
    so a power of two (``m**64`` a power of two) belongs one bucket lower.
    """
    mantissa, exponent = math.frexp(abs(value))
    m = int(math.ldexp(mantissa, 53))
    s = 53 - exponent
    p = m**64
    index = p.bit_length() - 1 - 64 * s
    if m & (m - 1) == 0:
        index -= 1
    return index


def representative(index: int) -> float:
    """The value reported for a quantile that falls in positive bucket
    ``index``: ``2**((index + 0.5) / 64)``, one rounding, stepped one ulp
    into the bucket when rounding (of a subnormal) left it."""
    value = math.ldexp(BUCKET_MIDPOINTS[index % _PER_OCTAVE], index // _PER_OCTAVE)
    found = bucket_index(value)
    if found < index:
        value = math.nextafter(value, math.inf)
    elif found > index:
        value = math.nextafter(value, 0.0)
    return value


_UPPERS: dict[int, float] = {}


def _upper(index: int) -> float:
    """The largest double in bucket ``index`` or below (``2**((index+1)/64)``
    rounded down), 0.0 below the subnormals."""
    upper = _UPPERS.get(index)
    if upper is None:
        # Each Prometheus scrape asks for the same few bounds again.
        upper = _UPPERS[index] = _find_upper(index)
    return upper


def _find_upper(index: int) -> float:
    if index < MIN_INDEX:
        return 0.0
    if index >= MAX_INDEX:
        return math.ldexp(1.0 - 2.0**-53, 1024)
    guess = math.ldexp(2.0 ** (((index + 1) % _PER_OCTAVE) / _PER_OCTAVE), (index + 1) // 64)
    # pow() may be an ulp or two off; the exact index settles it.
    while guess > 0.0 and bucket_index(guess) > index:
        guess = math.nextafter(guess, 0.0)
    while True:
        up = math.nextafter(guess, math.inf)
        if bucket_index(up) > index:
            return guess
        guess = up


_INT_FIELDS = (
    "count",
    "zero_count",
    "nan_count",
    "positive_inf_count",
    "negative_inf_count",
)
_FLOAT_FIELDS = ("sum", "min", "max")
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_FLOAT_TAG = "$float"  # as the JSON-lines sink writes a non-finite data value


def _encode_float(value: float) -> object:
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return {_FLOAT_TAG: "nan"}
    return {_FLOAT_TAG: "inf" if value > 0 else "-inf"}


def _decode_float(value: object, name: str) -> float:
    if isinstance(value, Mapping) and len(value) == 1 and _FLOAT_TAG in value:
        text = value[_FLOAT_TAG]
        if isinstance(text, str) and text in _NON_FINITE:
            return _NON_FINITE[text]
        raise arg_value_error(
            "Distribution.from_dict",
            "d",
            f"holds {_short_repr(text)} at d[{name!r}], where "
            f'{{"{_FLOAT_TAG}": ...}} must be "nan", "inf" or "-inf"',
        )
    return value  # type: ignore[return-value]  # checked by the constructor


def _short_repr(value: object) -> str:
    """A repr cut short in depth and length: a value nested 100,000 deep
    (read from a JSON line) gets its error message, not a RecursionError."""
    return reprlib.repr(value)


def _check_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise arg_type_error("Distribution", name, "an int", value)
    if value < 0:
        raise arg_value_error("Distribution", name, f"must be >= 0, got {value}")
    return value


def _check_float(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise arg_type_error("Distribution", name, "a float", value)
    try:
        return float(value)
    except OverflowError:
        # An int past the float range: a JSON line's 400-digit "sum" is bad
        # input, not a crash (docs/api.md, Distribution).
        digits = len(str(abs(value))) if abs(value) < 10**4000 else "over 4000"
        raise arg_value_error(
            "Distribution", name, f"must be within the float range, got an int of {digits} digits"
        ) from None


def _check_buckets(buckets: object, name: str) -> tuple[tuple[int, int], ...]:
    if isinstance(buckets, (str, bytes)) or not isinstance(buckets, Iterable):
        raise arg_type_error("Distribution", name, "an iterable of (index, count) pairs", buckets)
    checked: list[tuple[int, int]] = []
    previous = MIN_INDEX - 1
    for pair in buckets:
        # The common case, a JSON line's [index, count] (or a tuple) of
        # plain ints in order, checked in a few comparisons: reading a log
        # checks every bucket of every window (torchmon summarize).
        if (type(pair) is list or type(pair) is tuple) and len(pair) == 2:
            index, count = pair
            if (
                type(index) is int
                and type(count) is int
                and previous < index <= MAX_INDEX
                and count > 0
            ):
                checked.append((index, count))
                previous = index
                continue
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Iterable):
            raise TypeError(
                arg_message(
                    "Distribution",
                    name,
                    f"must hold (index, count) pairs, not {type(pair).__name__}",
                )
            )
        items = tuple(pair)
        if len(items) != 2:
            raise arg_value_error(
                "Distribution", name, f"must hold (index, count) pairs, got {_short_repr(items)}"
            )
        index, count = items
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(
                arg_message(
                    "Distribution",
                    name,
                    f"must hold int bucket indices, not {type(index).__name__}",
                )
            )
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(
                arg_message(
                    "Distribution", name, f"must hold int bucket counts, not {type(count).__name__}"
                )
            )
        if not MIN_INDEX <= index <= MAX_INDEX:
            raise arg_value_error(
                "Distribution",
                name,
                f"has bucket index {index}, which holds no finite double at scale 6 "
                f"(must be in {MIN_INDEX}..{MAX_INDEX})",
            )
        if count <= 0:
            raise arg_value_error(
                "Distribution", name, f"must count > 0 samples in bucket {index}, got {count}"
            )
        if checked and index <= checked[-1][0]:
            raise arg_value_error(
                "Distribution",
                name,
                f"must have strictly ascending bucket indices ({checked[-1][0]} then {index})",
            )
        checked.append((index, count))
        previous = index
    return tuple(checked)


def _extreme_places(
    ints: dict[str, int],
    positive: tuple[tuple[int, int], ...],
    negative: tuple[tuple[int, int], ...],
) -> tuple[tuple[str, int], tuple[str, int]] | None:
    """Where the smallest and the largest non-NaN sample lie (as :func:`_place`
    names a place), or None without any; negative buckets go by ``|x|``."""
    places: list[tuple[str, int]] = []
    if ints["negative_inf_count"]:
        places.append(("-inf", 0))
    if negative:
        places += [("negative", negative[-1][0]), ("negative", negative[0][0])]
    if ints["zero_count"]:
        places.append(("zero", 0))
    if positive:
        places += [("positive", positive[0][0]), ("positive", positive[-1][0])]
    if ints["positive_inf_count"]:
        places.append(("inf", 0))
    return (places[0], places[-1]) if places else None


def _place(value: float) -> tuple[str, int]:
    """Which count or bucket holds ``value`` (not NaN)."""
    if value == -math.inf:
        return ("-inf", 0)
    if value == math.inf:
        return ("inf", 0)
    if value == 0.0:
        return ("zero", 0)
    return ("negative" if value < 0 else "positive", bucket_index(value))


def _place_text(place: tuple[str, int]) -> str:
    kind, index = place
    if kind in ("negative", "positive"):
        return f"{kind} bucket {index}"
    return {"-inf": "negative_inf_count", "inf": "positive_inf_count", "zero": "zero_count"}[kind]


def _check_extremes(
    low: float,
    high: float,
    ints: dict[str, int],
    positive: tuple[tuple[int, int], ...],
    negative: tuple[tuple[int, int], ...],
) -> None:
    """A min or max that is not NaN is a sample (torch's MIN/MAX keep the
    first one when it is NaN, docs/api.md): the smallest non-NaN one lies in
    the lowest non-empty bucket or count, the largest in the highest one,
    and min <= max. Checked so that quantiles clamped into [min, max] never
    come from extremes the buckets contradict."""
    if not math.isnan(low) and not math.isnan(high) and low > high:
        raise arg_value_error(
            "Distribution", "min", f"must be <= max, got min={low!r}, max={high!r}"
        )
    places = _extreme_places(ints, positive, negative)
    if places is None:  # no non-NaN sample: the extremes are whatever the window held
        return
    lowest, highest = places
    for name, value, place in (("min", low, lowest), ("max", high, highest)):
        if not math.isnan(value) and _place(value) != place:
            raise arg_value_error(
                "Distribution",
                name,
                f"{value!r} is not in {_place_text(place)}, where the "
                f"{'smallest' if name == 'min' else 'largest'} sample is counted",
            )


def _combine_extreme(a: float, a_known: int, b: float, b_known: int, pick: Any) -> float:
    """`pick` of two windows' extremes, where `a_known`/`b_known` count the
    windows' non-NaN samples. A side without any adds no extreme; a NaN one
    of a side with some (its first sample was NaN: torch's MIN/MAX rule)
    leaves the extreme unknown, NaN, so that the quantile rules do not
    trust the other side's as exact (docs/api.md, Distribution.merge)."""
    if not a_known and not b_known:
        # No non-NaN sample at all: NaN as a window of only NaNs, else empty.
        return math.nan if math.isnan(a) or math.isnan(b) else a
    if not a_known:
        return b
    if not b_known:
        return a
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return pick(a, b)  # type: ignore[no-any-return]


def _add_buckets(
    a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]
) -> tuple[tuple[int, int], ...]:
    if not a:
        return b
    if not b:
        return a
    counts = dict(a)
    for index, count in b:
        counts[index] = counts.get(index, 0) + count
    return tuple(sorted(counts.items()))


class Distribution:
    """A Stat window's samples, bucketed: see docs/api.md ("Distribution").

    Immutable, hashable by identity only (it defines ``==``), picklable.
    ``Distribution(*, count, sum, min, max, ...)`` checks its arguments;
    the native Stat builds one with :meth:`_from_core`.
    """

    __slots__ = (
        "_count",
        "_max",
        "_min",
        "_nan_count",
        "_negative",
        "_negative_inf_count",
        "_positive",
        "_positive_inf_count",
        "_scale",
        "_sum",
        "_zero_count",
    )

    _scale: int
    _count: int
    _sum: float
    _min: float
    _max: float
    _zero_count: int
    _nan_count: int
    _positive_inf_count: int
    _negative_inf_count: int
    _positive: tuple[tuple[int, int], ...]
    _negative: tuple[tuple[int, int], ...]

    __hash__ = None  # type: ignore[assignment]  # equal by value, yet not a dict key

    def __init__(
        self,
        *,
        scale: int = SCALE,
        count: int,
        sum: float,
        min: float,
        max: float,
        zero_count: int = 0,
        nan_count: int = 0,
        positive_inf_count: int = 0,
        negative_inf_count: int = 0,
        positive: Iterable[tuple[int, int]] = (),
        negative: Iterable[tuple[int, int]] = (),
    ) -> None:
        if isinstance(scale, bool) or not isinstance(scale, int):
            raise arg_type_error("Distribution", "scale", "an int", scale)
        if scale != SCALE:
            raise arg_value_error(
                "Distribution", "scale", f"must be 6 (the only one supported), got {scale}"
            )
        ints = {
            "count": _check_int(count, "count"),
            "zero_count": _check_int(zero_count, "zero_count"),
            "nan_count": _check_int(nan_count, "nan_count"),
            "positive_inf_count": _check_int(positive_inf_count, "positive_inf_count"),
            "negative_inf_count": _check_int(negative_inf_count, "negative_inf_count"),
        }
        total_sum = _check_float(sum, "sum")
        low = _check_float(min, "min")
        high = _check_float(max, "max")
        pos = _check_buckets(positive, "positive")
        neg = _check_buckets(negative, "negative")
        counted = (
            ints["zero_count"]
            + ints["nan_count"]
            + ints["positive_inf_count"]
            + ints["negative_inf_count"]
            + _bucket_total(pos)
            + _bucket_total(neg)
        )
        if counted != ints["count"]:
            raise arg_value_error(
                "Distribution",
                "count",
                "must equal the samples counted in the buckets, zeros, NaNs and infinities "
                f"({counted}), got {ints['count']}",
            )
        _check_extremes(low, high, ints, pos, neg)
        _set(self, SCALE, ints["count"], total_sum, low, high, ints["zero_count"],
             ints["nan_count"], ints["positive_inf_count"], ints["negative_inf_count"],
             pos, neg)  # fmt: skip

    @classmethod
    def _from_core(
        cls,
        count: int,
        sum: float,
        min: float,
        max: float,
        zero_count: int,
        nan_count: int,
        positive_inf_count: int,
        negative_inf_count: int,
        positive: tuple[tuple[int, int], ...],
        negative: tuple[tuple[int, int], ...],
    ) -> Distribution:
        """The native Stat's constructor: positional, trusted, unchecked."""
        self = object.__new__(cls)
        _set(self, SCALE, count, sum, min, max, zero_count, nan_count,
             positive_inf_count, negative_inf_count, positive, negative)  # fmt: skip
        return self

    # --- attributes -------------------------------------------------------

    @property
    def scale(self) -> int:
        """The bucket scale: 6 (64 buckets per power of two)."""
        return self._scale

    @property
    def count(self) -> int:
        """Every sample the window accepted, NaN included (the window's COUNT)."""
        return self._count

    @property
    def sum(self) -> float:
        """The window's SUM."""
        return self._sum

    @property
    def min(self) -> float:
        """The window's MIN."""
        return self._min

    @property
    def max(self) -> float:
        """The window's MAX."""
        return self._max

    @property
    def zero_count(self) -> int:
        """Samples equal to zero (``+0.0`` and ``-0.0``)."""
        return self._zero_count

    @property
    def nan_count(self) -> int:
        """NaN samples."""
        return self._nan_count

    @property
    def positive_inf_count(self) -> int:
        """``+inf`` samples."""
        return self._positive_inf_count

    @property
    def negative_inf_count(self) -> int:
        """``-inf`` samples."""
        return self._negative_inf_count

    @property
    def positive(self) -> tuple[tuple[int, int], ...]:
        """``(bucket index, count)`` of the finite positive samples, ascending index."""
        return self._positive

    @property
    def negative(self) -> tuple[tuple[int, int], ...]:
        """``(bucket index of |x|, count)`` of the finite negative samples, ascending index."""
        return self._negative

    # --- methods ----------------------------------------------------------

    @staticmethod
    def bucket_bounds(index: int) -> tuple[float, float]:
        """``(lower, upper)`` of bucket ``index`` at scale 6 as doubles: the
        bucket holds exactly the doubles ``x`` with ``lower < |x| <= upper``
        (``upper`` is ``2**((index+1)/64)`` rounded down, ``lower`` the upper
        of the bucket below; ``lower == upper`` for the subnormal buckets
        that hold no double)."""
        if isinstance(index, bool) or not isinstance(index, int):
            raise arg_type_error("Distribution.bucket_bounds", "index", "an int", index)
        if not MIN_INDEX <= index <= MAX_INDEX:
            raise arg_value_error(
                "Distribution.bucket_bounds",
                "index",
                f"must be in {MIN_INDEX}..{MAX_INDEX} (bucket {index} holds no finite double)",
            )
        return _upper(index - 1), _upper(index)

    def quantile(self, q: float) -> float:
        """The sample of rank ``max(1, ceil(q * n))`` among the ``n`` non-NaN
        samples, as its bucket's representative (docs/api.md, "Distribution"):
        0.0 when the window had no sample, NaN when every sample was NaN."""
        if isinstance(q, bool) or not isinstance(q, (int, float)):
            raise arg_type_error("Distribution.quantile", "q", "a float", q)
        if not 0.0 <= q <= 1.0:
            raise arg_value_error("Distribution.quantile", "q", f"must be in [0, 1], got {q!r}")
        if self._count == 0:
            return 0.0
        n = self._count - self._nan_count
        if n <= 0:
            return math.nan
        # q as the decimal written (0.99 is 99/100, not the double below it).
        rank = builtin_max(1, math.ceil(Fraction(repr(float(q))) * n))
        low, high = self._min, self._max
        exact_ends = not (math.isnan(low) or math.isnan(high))
        if exact_ends:
            if rank == 1:
                return low
            if rank == n:
                return high
        value = self._value_at(rank)
        if exact_ends:
            if value < low:
                value = low
            if value > high:
                value = high
        return value

    def _value_at(self, rank: int) -> float:
        """The representative of the sample of 1-based ``rank`` (ascending)."""
        rank -= self._negative_inf_count
        if rank <= 0:
            return -math.inf
        for index, count in reversed(self._negative):
            rank -= count
            if rank <= 0:
                return -representative(index)
        rank -= self._zero_count
        if rank <= 0:
            return 0.0
        for index, count in self._positive:
            rank -= count
            if rank <= 0:
                return representative(index)
        rank -= self._positive_inf_count
        if rank <= 0:
            return math.inf
        # Counts that do not add up to `count` (never made by a Stat, refused
        # by the constructor): as the native quantile does.
        return math.nan

    def merge(self, other: Distribution) -> Distribution:
        """The distribution of both windows' samples: counts added bucket by
        bucket, ``count`` and ``sum`` added, ``min``/``max`` combined: a window
        without non-NaN samples adds none, and a NaN one of a window with
        some (its first sample was NaN) makes the merged one NaN, unknown, so
        that quantiles are estimated unclamped. Both must have the same scale
        (every Distribution is scale 6 today; no downscaling is done)."""
        if not isinstance(other, Distribution):
            raise arg_type_error("Distribution.merge", "other", "a Distribution", other)
        if other._scale != self._scale:
            raise arg_value_error(
                "Distribution.merge",
                "other",
                f"has scale {other._scale}, this one {self._scale}",
            )
        known = self._count - self._nan_count
        other_known = other._count - other._nan_count
        result = object.__new__(Distribution)
        _set(
            result,
            self._scale,
            self._count + other._count,
            self._sum + other._sum,
            _combine_extreme(self._min, known, other._min, other_known, builtin_min),
            _combine_extreme(self._max, known, other._max, other_known, builtin_max),
            self._zero_count + other._zero_count,
            self._nan_count + other._nan_count,
            self._positive_inf_count + other._positive_inf_count,
            self._negative_inf_count + other._negative_inf_count,
            _add_buckets(self._positive, other._positive),
            _add_buckets(self._negative, other._negative),
        )
        return result

    # --- conversions ------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: ints, finite floats, ``{"$float": "nan"}`` (or
        ``"inf"``, ``"-inf"``) for a non-finite sum/min/max as the JSON-lines
        sink writes data values, and the buckets as ``[[index, count], ...]``."""
        return {
            "scale": self._scale,
            "count": self._count,
            "sum": _encode_float(self._sum),
            "min": _encode_float(self._min),
            "max": _encode_float(self._max),
            "zero_count": self._zero_count,
            "nan_count": self._nan_count,
            "positive_inf_count": self._positive_inf_count,
            "negative_inf_count": self._negative_inf_count,
            "positive": [[index, count] for index, count in self._positive],
            "negative": [[index, count] for index, count in self._negative],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Distribution:
        """The Distribution of a :meth:`to_dict` result (checked as the
        constructor checks its arguments; an unknown or missing key is a
        ValueError naming it)."""
        if not isinstance(d, Mapping):
            raise arg_type_error("Distribution.from_dict", "d", "a mapping", d)
        known = {"scale", "positive", "negative", *_INT_FIELDS, *_FLOAT_FIELDS}
        for key in d:
            if key not in known:
                raise arg_value_error("Distribution.from_dict", "d", f"has an unknown key {key!r}")
        for key in ("count", *_FLOAT_FIELDS):
            if key not in d:
                raise arg_value_error("Distribution.from_dict", "d", f"is missing the key {key!r}")
        kwargs = dict(d)
        for key in _FLOAT_FIELDS:
            kwargs[key] = _decode_float(kwargs[key], key)
        return cls(**kwargs)

    def _fields(self) -> tuple[object, ...]:
        return (
            self._scale,
            self._count,
            self._sum,
            self._min,
            self._max,
            self._zero_count,
            self._nan_count,
            self._positive_inf_count,
            self._negative_inf_count,
            self._positive,
            self._negative,
        )

    def __eq__(self, other: object) -> bool:
        """Equal when every field is; NaN sum/min/max equal NaN (and -0.0 only -0.0),
        so that a distribution equals its round trip."""
        if not isinstance(other, Distribution):
            return NotImplemented
        for a, b in zip(self._fields(), other._fields()):
            if isinstance(a, float) and isinstance(b, float):
                if math.isnan(a) and math.isnan(b):
                    continue
                if a != b or math.copysign(1.0, a) != math.copysign(1.0, b):
                    return False
            elif a != b:
                return False
        return True

    def __reduce__(self) -> tuple[Any, tuple[object, ...]]:
        return (_restore, self._fields())

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Distribution is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Distribution is immutable: cannot delete {name!r}")

    def __repr__(self) -> str:
        special = [
            f"{name}={value}"
            for name, value in (
                ("zero_count", self._zero_count),
                ("nan_count", self._nan_count),
                ("positive_inf_count", self._positive_inf_count),
                ("negative_inf_count", self._negative_inf_count),
            )
            if value
        ]
        parts = [
            f"count={self._count}",
            f"sum={self._sum!r}",
            f"min={self._min!r}",
            f"max={self._max!r}",
            *special,
            f"positive={len(self._positive)} buckets",
            f"negative={len(self._negative)} buckets",
        ]
        return f"Distribution({', '.join(parts)})"


# The methods shadow min/max/sum as parameter names.
builtin_min = min
builtin_max = max


def _bucket_total(buckets: tuple[tuple[int, int], ...]) -> int:
    return sum(count for _, count in buckets)


_SETTERS = tuple(
    Distribution.__dict__[slot].__set__
    for slot in (
        "_scale",
        "_count",
        "_sum",
        "_min",
        "_max",
        "_zero_count",
        "_nan_count",
        "_positive_inf_count",
        "_negative_inf_count",
        "_positive",
        "_negative",
    )
)


def _set(target: Distribution, *values: object) -> None:
    # Past the __setattr__ that makes a Distribution immutable.
    for setter, value in zip(_SETTERS, values):
        setter(target, value)


def _restore(*fields: object) -> Distribution:
    result = object.__new__(Distribution)
    _set(result, *fields)
    return result
