"""Fixed cases of STDDEV and P50 ... P999 (docs/api.md, "STDDEV and P50 ...
P999"): torchmon's window values against the reference model's exact ones,
within the documented error (tolerance.py), for the data the state machine
draws at random, plus the edge cases the documentation names."""

from __future__ import annotations

import datetime as dt
import math
import random

import pytest

import torchmon
from torchmon.testing import ManualClock

from . import model
from .tolerance import Reported, expected

NAN, INF = math.nan, math.inf
TINY = 2.0**-1074
ESTIMATED = ["STDDEV", "P50", "P90", "P95", "P99", "P999"]


def window_values(samples: list[float], max_samples: int | None = None) -> dict[str, float]:
    """The data of the first window event of a Stat of every estimated
    aggregation, given `samples` (all in one window)."""
    events: list[torchmon.Event] = []
    handle = torchmon.register_event_handler(events.append)
    try:
        with ManualClock(0):
            args: list[object] = [
                "s",
                [getattr(torchmon, name) for name in ESTIMATED],
                dt.timedelta(hours=1),
            ]
            if max_samples is not None:
                args.append(max_samples)
            stat = torchmon.Stat(*args)
            if len(samples) > 50:
                stat.add_many(samples)  # the batch path, for the long windows
            else:
                for v in samples:
                    stat.add(v)
            del stat
    finally:
        torchmon.unregister_event_handler(handle)
    return events[0].data


def check_against_model(samples: list[float], max_samples: int | None = None) -> None:
    got = window_values(samples, max_samples)
    accepted = samples[:max_samples] if max_samples is not None else samples
    window = model._Window()
    for x in accepted:
        window.fold(x)
    histogram = window.distribution()
    for name in ESTIMATED:
        suffix = name.lower()
        want = expected(suffix, window.value(getattr(model, name)), tuple(accepted), histogram)
        assert want == Reported(suffix, got[f"s.{suffix}"]), (name, want, got[f"s.{suffix}"])


def rng_samples(seed: int, n: int, draw: str) -> list[float]:
    rng = random.Random(seed)
    families = {
        "lognormal": lambda: rng.lognormvariate(0.0, 3.0),
        "bimodal": lambda: rng.gauss(10.0, 1.0) if rng.random() < 0.9 else rng.gauss(1e4, 10.0),
        "negative": lambda: -rng.expovariate(0.01),
        "near_1e9": lambda: 1e9 + rng.gauss(0.0, 1.0),
        "subnormal": lambda: rng.randint(1, 3000) * TINY,
        "signed": lambda: rng.choice((-1.0, 1.0)) * rng.lognormvariate(0.0, 10.0),
    }
    return [families[draw]() for _ in range(n)]


@pytest.mark.parametrize(
    "draw", ["lognormal", "bimodal", "negative", "near_1e9", "subnormal", "signed"]
)
@pytest.mark.parametrize("n", [1, 2, 3, 99, 1001, 20_000])
def test_families_match_the_model(draw: str, n: int) -> None:
    check_against_model(rng_samples(n, n, draw))


def test_1e9_plus_unit_noise_has_stddev_about_1() -> None:
    samples = rng_samples(3, 10_000, "near_1e9")
    got = window_values(samples)["s.stddev"]
    assert abs(got - model.exact_stddev(samples)) < 1e-6
    assert 0.95 < got < 1.05


@pytest.mark.parametrize(
    "samples",
    [
        [5.0],
        [3.0, 3.0, 3.0, 3.0],
        [-0.0, 0.0, -0.0],
        [NAN],
        [NAN, NAN, 1.0],
        [1.0, NAN, 2.0, 3.0],
        [NAN, 1.0, 2.0, 3.0],  # MIN and MAX NaN: ranks 1 and n are estimated too
        [INF, -INF, 1.0],
        [-INF] * 5 + [1.0],
        [INF] * 1000 + [2.0],
        [102 * TINY, 103 * TINY, 102 * TINY],  # the subnormal bucket with 0.98% error
        [1.7976931348623157e308, -1.7976931348623157e308],
        [5e-324, -5e-324, 0.0],
        [float(v) for v in range(1, 1001)],
        [float(v) for v in range(2000, 0, -1)],
    ],
)
def test_edge_cases_match_the_model(samples: list[float]) -> None:
    check_against_model(samples)


def test_dropped_samples_count_in_no_aggregation() -> None:
    samples = [1.0, 2.0, 3.0, 1000.0, -1000.0]
    check_against_model(samples, max_samples=3)
    assert window_values(samples, max_samples=3)["s.p999"] == 3.0


def test_empty_window_get_is_zero() -> None:
    stat = torchmon.Stat("s", [getattr(torchmon, name) for name in ESTIMATED], 60.0)
    values = stat.get()
    assert [values[getattr(torchmon, name)] for name in ESTIMATED] == [0.0] * 6
    assert all(type(v) is float for v in values.values())


def test_stddev_whose_s1_squared_overflows_is_not_zero() -> None:
    """S1 * S1 would overflow here while S2 does not: the result must still
    be the standard deviation (3.77e153), not the 0.0 of max(0, -inf)."""
    samples = [0.0, 8e153, 8e153]
    got = window_values(samples)["s.stddev"]
    assert got != 0.0
    check_against_model(samples)


def test_stddev_whose_squared_deviations_overflow_is_inf_or_nan() -> None:
    samples = [1.7976931348623157e308, -1.7976931348623157e308, 1.0]
    got = window_values(samples)["s.stddev"]
    assert math.isnan(got) or got == INF
