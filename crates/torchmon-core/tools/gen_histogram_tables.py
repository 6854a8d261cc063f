"""Prints the constant tables of crates/torchmon-core/src/histogram/mod.rs.

Exact integer arithmetic only (no floating-point logarithm or power), so the
output does not depend on the platform's libm:

- BOUNDARIES[j] = floor((2**(j/64) - 1) * 2**52) for j in 1..63: the 52-bit
  mantissa above which a value of an octave lies past the j-th sub-boundary.
  2**(52 + j/64) is irrational, so its floor N is the largest integer with
  N**64 < 2**(52*64 + j).
- MIDPOINTS[j] = 2**((j + 0.5)/64) rounded to the nearest double, as bits: the
  value a quantile reports for a sample of bucket j of octave 0.

Run: python3 crates/torchmon-core/tools/gen_histogram_tables.py
(the cargo tests in histogram/tests.rs prove both tables from scratch).
"""


def iroot(n: int, k: int) -> int:
    """The largest integer r with r**k <= n."""
    lo, hi = 0, 1 << (n.bit_length() // k + 1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if mid**k <= n:
            lo = mid
        else:
            hi = mid - 1
    return lo


def boundary(j: int) -> int:
    return iroot(1 << (52 * 64 + j), 64) - (1 << 52)


def midpoint_bits(j: int) -> int:
    # The nearest double to 2**((2j+1)/128) in [1, 2): mantissa M/2**52 with
    # M the integer nearest to 2**52 * 2**((2j+1)/128). Round half: compare
    # (2M+1)**128 with 2**(53*128 + 2j+1) (never equal: irrational).
    m = iroot(1 << (52 * 128 + 2 * j + 1), 128)
    if (2 * m + 1) ** 128 < 1 << (53 * 128 + 2 * j + 1):
        m += 1
    return (0x3FF << 52) | (m - (1 << 52))


if __name__ == "__main__":
    print("const BOUNDARIES: [u64; 64] = [")
    print("    0,")
    for j in range(1, 64):
        print(f"    0x{boundary(j):013x},")
    print("];")
    print("const MIDPOINT_BITS: [u64; 64] = [")
    for j in range(64):
        print(f"    0x{midpoint_bits(j):016x},")
    print("];")
