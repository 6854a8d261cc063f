"""Test helpers for code that records with torchmon.

``ManualClock`` drives the clock that every Stat's windows read, so windows
close deterministically, without sleeping::

    with torchmon.testing.ManualClock() as clock:
        stat = torchmon.Stat("loss", [torchmon.SUM], timedelta(seconds=1))
        stat.add(1.0)
        clock.advance(1000)
        stat.add(2.0)  # the first window (holding 1.0) closes here
"""

from __future__ import annotations

import operator
from types import TracebackType

from . import _core
from ._errors import arg_type_error, arg_value_error

__all__ = ["ManualClock"]

#: The clock is a signed 64-bit count of milliseconds (292 million years).
_MAX_MS = 2**63 - 1


def _milliseconds(value: int, call: str, arg: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = operator.index(value)
        except TypeError:
            raise arg_type_error(call, arg, "an int number of milliseconds", value) from None
    return value


def _clock_time(ms: int, call: str, arg: str) -> int:
    """``ms`` if the clock can show it; ``call`` and ``arg`` name the argument
    that set it, in the one format of an argument error (``_errors.py``)."""
    if ms < 0:
        raise arg_value_error(call, arg, f"must be >= 0, got {ms}")
    if ms > _MAX_MS:
        # Not the value itself: a huge int may not even convert to a string.
        raise arg_value_error(call, arg, "cannot take the clock past 2**63 - 1 ms")
    return ms


class ManualClock:
    """A monotonic clock in whole milliseconds that replaces the real one
    while the ``with`` block runs (the previous clock is restored on exit).

    Windows never go back: setting the clock earlier than a Stat's open
    window counts later samples in that open window.
    """

    __slots__ = ("_active", "_now_ms", "_previous")

    def __init__(self, start_ms: int = 0) -> None:
        start_ms = _milliseconds(start_ms, "ManualClock", "start_ms")
        self._now_ms = _clock_time(start_ms, "ManualClock", "start_ms")
        self._previous: int | None = None
        self._active = False

    @property
    def now_ms(self) -> int:
        """The time, in milliseconds, that Stats read while this clock is active."""
        return self._now_ms

    def set(self, ms: int) -> None:
        """Jumps to ``ms`` milliseconds."""
        ms = _clock_time(_milliseconds(ms, "ManualClock.set", "ms"), "ManualClock.set", "ms")
        self._now_ms = ms
        if self._active:
            _core._set_clock_ms(ms)

    def advance(self, ms: int) -> None:
        """Moves the clock forward by ``ms`` milliseconds (0 is allowed)."""
        call = "ManualClock.advance"
        ms = _clock_time(_milliseconds(ms, call, "ms"), call, "ms")
        self.set(_clock_time(self._now_ms + ms, call, "ms"))

    def __enter__(self) -> ManualClock:
        if self._active:
            raise RuntimeError("this ManualClock is already active")
        self._previous = _core._set_clock_ms(self._now_ms)
        self._active = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        _core._set_clock_ms(self._previous)
        self._active = False

    def __repr__(self) -> str:
        state = "active" if self._active else "inactive"
        return f"ManualClock(now_ms={self._now_ms}, {state})"
