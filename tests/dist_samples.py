"""Distributions built from samples for the tests (docs/api.md, "Distribution"):
the scale-6 bucket of a value computed with exact integers, independently
of torchmon's own code."""

from __future__ import annotations

import math
from fractions import Fraction

from torchmon import Distribution


def oracle_index(x: float) -> int:
    """The scale-6 bucket of |x| (finite, non-zero): 2**(i/64) < |x| <= 2**((i+1)/64),
    from |x| = m / 2**s exactly."""
    num, den = Fraction(abs(x)).as_integer_ratio()
    if den > 1:
        m, s = num, den.bit_length() - 1
    else:
        t = (num & -num).bit_length() - 1
        m, s = num >> t, -t
    p = m**64
    i = (p.bit_length() - 1) - 64 * s
    if m & (m - 1) == 0:
        i -= 1
    return i


def from_samples(samples: list[float]) -> Distribution:
    """The Distribution of a window of ``samples`` (no NaN min/max handling:
    callers with NaN pass min/max themselves)."""
    pos: dict[int, int] = {}
    neg: dict[int, int] = {}
    counts = {"zero_count": 0, "nan_count": 0, "positive_inf_count": 0, "negative_inf_count": 0}
    for x in samples:
        if math.isnan(x):
            counts["nan_count"] += 1
        elif x == math.inf:
            counts["positive_inf_count"] += 1
        elif x == -math.inf:
            counts["negative_inf_count"] += 1
        elif x == 0:
            counts["zero_count"] += 1
        elif x > 0:
            pos[oracle_index(x)] = pos.get(oracle_index(x), 0) + 1
        else:
            neg[oracle_index(x)] = neg.get(oracle_index(x), 0) + 1
    finite = [x for x in samples if not math.isnan(x)]
    return Distribution(
        count=len(samples),
        sum=float(sum(samples)),
        min=min(finite) if finite else math.nan,
        max=max(finite) if finite else math.nan,
        positive=sorted(pos.items()),
        negative=sorted(neg.items()),
        **counts,
    )
