"""torch.monitor's ``_WaitCounter``: times guarded blocks into a Stat."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from types import TracebackType

from ._core import Aggregation, Stat

_WINDOW = timedelta(seconds=60)
_counters: dict[str, Stat] = {}
_counters_lock = threading.Lock()


def _stat_for(key: str) -> Stat:
    # One Stat per key for the whole process, as torch's counters are global.
    with _counters_lock:
        stat = _counters.get(key)
        if stat is None:
            stat = Stat(key, [Aggregation.COUNT, Aggregation.SUM, Aggregation.MAX], _WINDOW)
            _counters[key] = stat
        return stat


class _WaitCounterTracker:
    """Context manager returned by ``_WaitCounter.guard()``; records the time
    spent inside it, in microseconds, into the counter's Stat."""

    __slots__ = ("_start_ns", "_stat")

    def __init__(self, stat: Stat) -> None:
        self._stat = stat
        self._start_ns = 0

    def __enter__(self) -> _WaitCounterTracker:
        self._start_ns = time.perf_counter_ns()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stat.add((time.perf_counter_ns() - self._start_ns) / 1000.0)


class _WaitCounter:
    """``with _WaitCounter("my.key").guard(): ...`` records how long the block
    took into the Stat named ``key`` (COUNT, SUM and MAX, in microseconds,
    over 60-second windows)."""

    __slots__ = ("_key", "_stat")

    def __init__(self, key: str | bytes) -> None:
        if not isinstance(key, (str, bytes, bytearray)):
            raise TypeError(f"_WaitCounter(key): key must be a str, not {type(key).__name__}")
        self._stat = _stat_for(key if isinstance(key, str) else bytes(key).decode("utf-8"))
        self._key = self._stat.name

    def guard(self) -> _WaitCounterTracker:
        return _WaitCounterTracker(self._stat)

    def __repr__(self) -> str:
        return f"torchmon._WaitCounter({self._key!r})"
