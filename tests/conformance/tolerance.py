"""How torchmon's estimated aggregations are compared with the reference
model's exact ones (docs/api.md, "Aggregation": STDDEV and P50 ... P999).

The model reports each window's exact value; torchmon estimates it. A view of
torchmon's value (``Reported``) equals a view of the model's (``Expected``,
which also holds the window's samples) when the estimate is within the
documented error:

- Pq: NaN exactly when the model's is NaN; +-inf and 0.0 exactly (the sign of
  zero aside); otherwise within 1% of the exact sample (docs/api.md promises
  0.55% for normal values, 0.98% at worst for subnormals). Where the model
  also has the window's histogram, the value must be the documented estimate
  from it, bit for bit.
- STDDEV: see ``stddev_within_error``.
"""

from __future__ import annotations

import math
import sys
from fractions import Fraction
from typing import Any

from . import model

#: Event key suffix -> q in thousandths; None for STDDEV.
ESTIMATED: dict[str, int | None] = {
    "stddev": None,
    "p50": 500,
    "p90": 900,
    "p95": 950,
    "p99": 990,
    "p999": 999,
}

_U = Fraction(1, 2**53)  # the unit roundoff of a double
_UNIT = Fraction(1, 2**1074)  # the smallest subnormal
_DBL_MAX = Fraction(sys.float_info.max)


def quantile_within_error(got: float, exact: float) -> bool:
    if math.isnan(exact):
        return math.isnan(got)
    if math.isinf(exact) or exact == 0.0:
        return got == exact
    if not math.isfinite(got):
        return False
    return abs(Fraction(got) - Fraction(exact)) <= Fraction(1, 100) * abs(Fraction(exact))


def stddev_within_error(got: float, samples: tuple[float, ...]) -> bool:
    """Whether `got` is the STDDEV of `samples` as docs/api.md computes it.

    Exact cases: 0.0 for fewer than two samples and for equal ones (every
    shifted sample is then 0), NaN for a NaN or infinite sample.

    Otherwise torchmon computes, with K the window's first sample,
    d = x - K, S1 = sum(d), S2 = sum(d*d), var = max(0, (S2 - S1*(S1/n))/n)
    and sqrt. Rounding analysis of those steps (|d_i| rounded once, the
    sums recursively, S1**2 <= n*S2 by Cauchy-Schwarz) bounds the error of
    got**2 against the exact variance V by (3n + 9) u M2, u = 2**-53, where
    M2 = mean((x - K)**2) >= V; underflow adds at most (n + 4) * 2**-1074.
    The check allows (4n + 32) u M2 + (n + 4) 2**-1074: tight (about 1e-14
    of M2 for 20 samples) wherever the first sample is near the others, as
    the shift is meant to make it, and still valid for any other summation
    order of the same sums. V and M2 are exact rationals.

    Where sum(d**2) exceeds the double range S2 overflows in IEEE
    arithmetic; docs/api.md says the result is then inf or NaN, which is
    accepted, as is a value within the bound. (S1*(S1/n) <= S2 overflows
    only with S2.)
    """
    n = len(samples)
    if n == 0:
        return got == 0.0
    if not all(math.isfinite(x) for x in samples):
        return math.isnan(got)
    # Integers in units of 2**-1074 (squares in units of 2**-2148): exact
    # and much faster than Fractions of samples with far apart exponents.
    units = [model._as_units(x) for x in samples]
    k = units[0]
    shifted_squares = sum((a - k) ** 2 for a in units)  # n * M2
    spread = n * sum(a * a for a in units) - sum(units) ** 2  # n**2 * V
    # sum(d**2) bounds S2 and S1*(S1/n); the margin covers their rounding.
    overflows = shifted_squares * _UNIT**2 * (1 + Fraction(1, 2**30)) >= _DBL_MAX
    if math.isnan(got) or math.isinf(got):
        return overflows and not got < 0
    if got < 0:
        return False
    if shifted_squares == 0:
        return got == 0.0
    m2 = shifted_squares * _UNIT**2 / n
    v = spread * _UNIT**2 / (n * n)
    bound = (4 * n + 32) * _U * m2 + (n + 4) * _UNIT
    return abs(Fraction(got) ** 2 - v) <= bound


class Reported:
    """torchmon's value of an estimated aggregation; equal to an Expected
    within the error. Compared only with Expected (else never equal)."""

    __slots__ = ("suffix", "value")

    def __init__(self, suffix: str, value: Any) -> None:
        self.suffix, self.value = suffix, value

    def __eq__(self, other: object) -> bool:
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Reported({self.suffix}: {self.value!r})"


class Expected:
    """The model's exact value of an estimated aggregation, the window's
    samples, and (for Pq, when the window has a histogram) the documented
    estimate from it."""

    __slots__ = ("estimate", "samples", "suffix", "value")

    def __init__(
        self, suffix: str, value: float, samples: tuple[float, ...], estimate: float | None
    ) -> None:
        self.suffix, self.value, self.samples, self.estimate = suffix, value, samples, estimate

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Reported) or other.suffix != self.suffix:
            return False
        got = other.value
        if type(got) is not float:
            return False
        if ESTIMATED[self.suffix] is None:
            return stddev_within_error(got, self.samples)
        if not quantile_within_error(got, self.value):
            return False
        if self.estimate is None:
            return True
        return got == self.estimate or (math.isnan(got) and math.isnan(self.estimate))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        shown = self.samples if len(self.samples) <= 12 else f"{len(self.samples)} samples"
        estimate = "" if self.estimate is None else f", estimate {self.estimate!r}"
        return f"Expected({self.suffix}: exact {self.value!r}{estimate}, of {shown})"


def suffix_of(key: Any) -> str | None:
    """The estimated aggregation a window event key names, if any."""
    if not isinstance(key, str):
        return None
    suffix = key.rpartition(".")[2]
    return suffix if suffix in ESTIMATED else None


def expected(
    suffix: str, value: float, samples: tuple[float, ...], histogram: model.Distribution | None
) -> Expected:
    permille = ESTIMATED[suffix]
    estimate = None
    if permille is not None and histogram is not None:
        estimate = histogram.quantile(permille / 1000)
    return Expected(suffix, value, samples, estimate)
