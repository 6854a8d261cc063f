"""One rule for a window size (docs/api.md, "Window sizes"): every API that
takes one gets the same values, and raises the same exception type with the
same message format, `<call>(<arg>): <arg> <problem>`. `Stat` keeps
torch.monitor's contract (no int, up to int64 ms); the others also take an
int, up to `datetime.timedelta.max`."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

import torchmon
from torchmon.bridge import record_wait_counters
from torchmon.integrations._common import check_window

_ids = itertools.count()


def _stat(value: Any) -> timedelta | None:
    torchmon.Stat(f"test_window_rule.{next(_ids)}", [], value)
    return None  # Stat shows its window only in its repr


def _wait_counter(value: Any) -> timedelta | None:
    return torchmon.WaitCounter(f"test_window_rule.{next(_ids)}", value).window_size


def _record_wait_counters(value: Any) -> timedelta | None:
    # Given only bad values: a good one would turn recording on for the process.
    record_wait_counters(window_size=value)
    raise AssertionError("record_wait_counters took a bad window")


def _system_stats(value: Any) -> timedelta | None:
    return torchmon.SystemStats(window_size=value, source="proc")._window_size


def _integration(value: Any) -> timedelta | None:
    # What TorchmonCallback/TorchmonLogger call (tests/integrations/test_arguments.py
    # checks the classes themselves, in a fresh interpreter).
    return check_window(value, "TorchmonCallback")


# name -> (make, call, argument, takes an int)
APIS: dict[str, tuple[Callable[[Any], timedelta | None], str, str, bool]] = {
    "Stat": (_stat, "Stat", "window_size", False),
    "WaitCounter": (_wait_counter, "WaitCounter", "window_size", True),
    "record_wait_counters": (_record_wait_counters, "record_wait_counters", "window_size", True),
    "SystemStats": (_system_stats, "SystemStats", "window_size", True),
    "integrations": (_integration, "TorchmonCallback", "window", True),
}

UNDER_1_MS = "must be at least 1 millisecond (got {ms} ms after truncation to whole milliseconds)"

# (value, error, problem: the message after "<call>(<arg>): <arg> "; "{types}"
# is the accepted types, which name int where it is accepted)
BAD: list[tuple[object, type[Exception], str]] = [
    ("1", TypeError, "must be {types}, not str"),
    (None, TypeError, "must be {types}, not NoneType"),
    (True, TypeError, "must be {types}, not bool"),
    (b"1", TypeError, "must be {types}, not bytes"),
    (math.nan, ValueError, "must be finite, not NaN"),
    (math.inf, ValueError, "must be finite, not inf"),
    (-math.inf, ValueError, "must be finite, not -inf"),
    (0.0, ValueError, UNDER_1_MS.format(ms=0)),
    (0.0009, ValueError, UNDER_1_MS.format(ms=0)),
    (-1.0, ValueError, UNDER_1_MS.format(ms=-1000)),
    (timedelta(microseconds=999), ValueError, UNDER_1_MS.format(ms=0)),
    (timedelta(seconds=-1), ValueError, UNDER_1_MS.format(ms=-1000)),
    (1e300, ValueError, "is too large (at most {bound} milliseconds, {bound_name})"),
]
# An int: the same as its float where an int is accepted, else a TypeError.
BAD_INTS: list[tuple[int, str]] = [
    (0, UNDER_1_MS.format(ms=0)),
    (-1, UNDER_1_MS.format(ms=-1000)),
    (10**400, "is too large (at most {bound} milliseconds, {bound_name})"),
    (-(10**400), "must be at least 1 millisecond (got an int below -2**127 seconds)"),
]
GOOD: list[tuple[object, timedelta]] = [
    (timedelta(milliseconds=1), timedelta(milliseconds=1)),
    (timedelta(microseconds=2500), timedelta(milliseconds=2)),
    (0.0015, timedelta(milliseconds=1)),
    (1.001, timedelta(milliseconds=1001)),  # the decimal repr shows, not 1.001 * 1000
    (60.0, timedelta(seconds=60)),
    (timedelta.max, timedelta.max - timedelta(microseconds=999)),
]


def _expected(api: str, problem: str) -> str:
    _, call, arg, ints = APIS[api]
    types = (
        "a datetime.timedelta or an int or float number of seconds"
        if ints
        else "a datetime.timedelta or a float number of seconds"
    )
    bound, bound_name = (
        (timedelta.max // timedelta(milliseconds=1), "datetime.timedelta.max")
        if ints
        else (2**63 - 1, "int64")
    )
    return f"{call}({arg}): {arg} " + problem.format(
        types=types, bound=bound, bound_name=bound_name
    )


@pytest.mark.parametrize("api", sorted(APIS))
@pytest.mark.parametrize(("value", "error", "problem"), BAD, ids=repr)
def test_bad_window_is_the_same_error_everywhere(
    api: str, value: object, error: type[Exception], problem: str
) -> None:
    make = APIS[api][0]
    message = _expected(api, problem)
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        make(value)


@pytest.mark.parametrize("api", sorted(APIS))
@pytest.mark.parametrize(("value", "problem"), BAD_INTS, ids=repr)
def test_bad_int_window_is_the_same_error_everywhere(api: str, value: int, problem: str) -> None:
    make, _, _, ints = APIS[api]
    error, problem = (ValueError, problem) if ints else (TypeError, "must be {types}, not int")
    message = _expected(api, problem)
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        make(value)


@pytest.mark.parametrize("api", sorted(set(APIS) - {"record_wait_counters"}))
@pytest.mark.parametrize(("value", "expected"), GOOD, ids=repr)
def test_good_window_is_taken_everywhere(api: str, value: object, expected: timedelta) -> None:
    window = APIS[api][0](value)
    assert window is None or window == expected


@pytest.mark.parametrize("api", sorted(set(APIS) - {"record_wait_counters"}))
def test_int_seconds_is_taken_everywhere_but_in_stat(api: str) -> None:
    make, _, _, ints = APIS[api]
    if ints:
        assert make(2) in (None, timedelta(seconds=2))
    else:
        # torch.monitor's Stat refuses an int (tests/conformance pins it).
        message = _expected(api, "must be {types}, not int")
        with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
            make(2)


def test_stat_takes_windows_beyond_timedelta_max_up_to_int64_ms() -> None:
    # docs/api.md, "Window sizes": int64 milliseconds is Stat's bound; 1e15 s is
    # 1e18 ms, beyond timedelta.max, which bounds the APIs holding a timedelta.
    torchmon.Stat("test_window_rule.huge", [], 1e15)
    too_large = "is too large (at most {bound} milliseconds, {bound_name})"
    message = _expected("WaitCounter", too_large)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        _wait_counter(1e15)
