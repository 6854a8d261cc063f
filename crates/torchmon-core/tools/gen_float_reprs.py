"""Prints tests/data/python_float_reprs.txt: doubles (as their bits, hex) and
CPython's repr of each, the table `decimal::python_repr` is tested against
(run: python3 tools/gen_float_reprs.py > tests/data/python_float_reprs.txt)."""

import math
import random
import struct
import sys


def bits(value: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", value))[0]


values = [0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan, 5e-324, -5e-324,
          2.2250738585072014e-308, 1.7976931348623157e308, 0.1, 0.2, 0.1 + 0.2,
          1.0, 2.0, 10.0, 100.0, 123.456, 1 / 3, 2 / 3, 1000.0, 3.0, 1.5]
# Around the switches to exponent notation: below 1e-4 and from 1e16.
for e in range(-8, 0):
    values += [10.0**e, 1.5 * 10.0**e, 9.999 * 10.0**e, 123.0 * 10.0**e]
for e in range(13, 24):
    values += [10.0**e, 1.5 * 10.0**e, 9.999999999999998 * 10.0**e, 12345.0 * 10.0**e]
values += [9999999999999998.0, 1e16 - 2, 0.0001, 0.00009999999999999999, 1e-05, 1e22, 1e23, 1e100]
for e in (-1074, -1073, -1022, -1000, -100, -1, 0, 1, 52, 53, 63, 64, 100, 1023):
    values += [math.ldexp(1.0, e), math.nextafter(math.ldexp(1.0, e), math.inf)]
rng = random.Random(6)
for _ in range(400):
    value = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
    values.append(value if math.isfinite(value) else rng.uniform(-1e6, 1e6))
for _ in range(100):
    values.append(rng.uniform(-1.0, 1.0) * 10.0 ** rng.randint(-8, 20))
for value in values:
    sys.stdout.write(f"{bits(value):016x} {value!r}\n")
