"""The native Distribution (src/py_distribution.rs over the core's
histogram): what only its conversion can get wrong. docs/api.md,
"Distribution", has the rules; tests/api/test_distribution.py the rest."""

from __future__ import annotations

import math
import pickle
import random
import struct
from fractions import Fraction

import pytest
from conformance.model import bucket_representative
from dist_samples import from_samples, oracle_index

from torchmon import Distribution


def one_per_bucket(n: int) -> Distribution:
    """n samples, one in each of the positive buckets 0..n-1, each at its
    bucket's representative: quantile(q) tells the rank it chose."""
    rep = bucket_representative
    return Distribution(
        count=n, sum=1.0, min=rep(0), max=rep(n - 1), positive=[(i, 1) for i in range(n)]
    )


def written_rank(q: float, n: int) -> int:
    """docs/api.md's rank, with q as the decimal repr(q) writes."""
    return max(1, math.ceil(Fraction(repr(q)) * n))


def test_quantile_reads_q_as_the_decimal_python_writes() -> None:
    d = one_per_bucket(10)
    rank_of = {bucket_representative(i): i + 1 for i in range(10)}
    # The double 0.1 is a little above 1/10: read exactly it would be rank 2.
    assert Fraction(0.1) * 10 > 1
    assert rank_of[d.quantile(0.1)] == 1
    assert rank_of[d.quantile(0.7)] == 7


@pytest.mark.parametrize("n", [3, 7, 1000, 12345])
def test_quantile_rank_is_the_written_decimals_for_any_double(n: int) -> None:
    """Rust's shortest round-trip digits (`{:e}`) are Python's repr's."""
    d = one_per_bucket(n)
    rank_of = {bucket_representative(i): i + 1 for i in range(n)}
    rng = random.Random(n)
    qs = [rng.random() for _ in range(2000)]
    qs += [round(rng.random(), rng.randrange(1, 6)) for _ in range(2000)]
    qs += [k / n for k in range(n + 1)][:3000]
    # Any double in [0, 1], subnormals included.
    bits = [rng.getrandbits(62) for _ in range(2000)]
    qs += [x for x in (struct.unpack("<d", struct.pack("<Q", b))[0] for b in bits) if x <= 1.0]
    qs += [5e-324, 1e-300, 0.0, 1.0, 1 - 2**-53]
    for q in qs:
        assert rank_of[d.quantile(q)] == written_rank(q, n), q


def test_window_distributions_are_native_and_equal_their_round_trips() -> None:
    d = from_samples([-0.0, 1.5, 2.5, -7.0, math.inf])
    assert type(d) is Distribution and Distribution.__module__ == "torchmon"
    assert Distribution.from_dict(d.to_dict()) == d
    assert pickle.loads(pickle.dumps(d)) == d
    assert not (d != Distribution.from_dict(d.to_dict()))
    assert (d == 1) is False and d != "x"
    assert Distribution.__hash__ is None


def test_a_pickle_of_the_python_class_still_loads() -> None:
    # What pickle.dumps(d) wrote while Distribution was a Python class.
    old = (
        b"\x80\x04\x95\\\x00\x00\x00\x00\x00\x00\x00\x8c\x16torchmon._distribution"
        b"\x94\x8c\x08_restore\x94\x93\x94(K\x06K\x02G?\xf8\x00\x00\x00\x00\x00\x00G"
        b"\x00\x00\x00\x00\x00\x00\x00\x00G?\xf8\x00\x00\x00\x00\x00\x00K\x01K\x00K\x00K"
        b"\x00K%K\x01\x86\x94\x85\x94)t\x94R\x94."
    )
    assert pickle.loads(old) == from_samples([0.0, 1.5])


def test_the_count_type_rules_name_the_argument_and_keep_their_order() -> None:
    base = {"count": 2, "sum": 1.0, "min": 1.0, "max": 1.0}
    # The first bad pair is reported, whatever comes after it.
    with pytest.raises(ValueError, match=r"bucket index 70000"):
        Distribution(**base, positive=[(70000, 1), ("x", 1)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"int bucket indices, not str"):
        Distribution(**base, positive=[("x", 1), (70000, 1)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"must be >= 0, got -1"):
        Distribution(**{**base, "count": -1, "sum": "x"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Distribution\(count\): count must be below 2\*\*64"):
        Distribution(**{**base, "count": 2**64})
    with pytest.raises(
        TypeError, match=r"Distribution\(scale\): scale must be an int, not NoneType"
    ):
        Distribution(**base, scale=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"missing 1 required keyword-only argument: 'max'"):
        Distribution(count=0, sum=0.0, min=0.0)  # type: ignore[call-arg]


def test_exponential_downscales_until_each_sign_fits() -> None:
    d = from_samples([1.5, 3.0, 1000.0, -0.001, 0.0])
    scale, p_offset, p_counts, n_offset, n_counts = d._exponential(3)
    # 1.5 .. 1000 spans octaves 0 to 9: 3 buckets of 4 octaves at scale -2.
    assert (scale, p_offset, p_counts) == (-2, 0, [2, 0, 1])
    assert (n_offset, n_counts) == (-3, [1])
    assert d._exponential(10**30)[0] == 6


def test_repr_writes_floats_as_python_does_and_only_nonzero_special_counts() -> None:
    """The repr is the core's (`histogram::Distribution`'s Display), its floats
    written by the core as Python's repr writes them."""
    low = oracle_index(1e-05)
    d = Distribution(
        count=3,
        sum=math.inf,
        min=1e-05,
        max=math.inf,
        positive_inf_count=1,
        positive=[(low, 1), (0, 1)],
    )
    assert repr(d) == (
        "Distribution(count=3, sum=inf, min=1e-05, max=inf, positive_inf_count=1, "
        "positive=2 buckets, negative=0 buckets)"
    )
    empty = Distribution(count=0, sum=-0.0, min=0.0, max=1e16)
    assert repr(empty) == (
        "Distribution(count=0, sum=-0.0, min=0.0, max=1e+16, "
        "positive=0 buckets, negative=0 buckets)"
    )
