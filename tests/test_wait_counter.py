"""torchmon.WaitCounter: guarded durations go to a Stat (COUNT, SUM, MAX in µs).

Durations are real (``time.perf_counter_ns``), so the assertions on them are
lower bounds with generous slack; the windows are driven by ManualClock, so
which window a duration lands in is deterministic.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from datetime import timedelta

import pytest

import torchmon
from torchmon._wait_counter import WaitCounter, _discard_counter, _WaitCounter, _WaitCounterTracker
from torchmon.testing import ManualClock

SECOND = timedelta(seconds=1)
_ids = itertools.count()


def fresh_key(label: str) -> str:
    # Counters are process-wide and live until exit: every test takes new keys.
    return f"test_wait_counter.{label}.{next(_ids)}"


def close_window(clock: ManualClock, counter: WaitCounter) -> dict[str, float]:
    """Moves to the next window and records one more (empty) guard, which
    closes the window before; returns what the counter's Stat reports for it."""
    clock.advance(1000)
    with counter.guard():
        pass
    got = counter.stat.get()
    return {agg.name: value for agg, value in got.items()}


def test_context_manager_records_count_sum_max_in_microseconds(recorder):
    with ManualClock(0) as clock:
        counter = WaitCounter(fresh_key("cm"), SECOND)
        with counter.guard():
            time.sleep(0.030)
        with counter.guard():
            time.sleep(0.002)
        assert counter.stat.count == 2
        got = close_window(clock, counter)
    assert got["COUNT"] == 2.0
    assert got["MAX"] >= 30_000  # µs
    assert got["SUM"] >= 32_000
    assert got["MAX"] <= got["SUM"] < 10_000_000
    # The closed window reached the handlers as a Stat event keyed by the counter's key.
    stat_events = [d for d in recorder.stat_data if f"{counter.key}.count" in d]
    assert stat_events == [
        {
            f"{counter.key}.count": 2.0,
            f"{counter.key}.sum": got["SUM"],
            f"{counter.key}.max": got["MAX"],
        }
    ]


def test_longer_block_gives_the_max(recorder):
    with ManualClock(0) as clock:
        counter = WaitCounter(fresh_key("max"), SECOND)
        for pause in (0.001, 0.040, 0.001):
            with counter.guard():
                time.sleep(pause)
        got = close_window(clock, counter)
    assert got["COUNT"] == 3.0
    assert got["MAX"] >= 40_000
    # The two short blocks add at least 2 ms to the 40 ms one.
    assert got["SUM"] >= got["MAX"] + 2_000


def test_exception_inside_the_guard_is_recorded_and_propagates():
    with ManualClock(0) as clock:
        counter = WaitCounter(fresh_key("raises"), SECOND)
        with pytest.raises(KeyError, match="boom"), counter.guard():
            time.sleep(0.005)
            raise KeyError("boom")
        assert counter.stat.count == 1
        got = close_window(clock, counter)
    assert got["COUNT"] == 1.0
    assert got["MAX"] >= 5_000


def test_decorator_times_every_call_and_keeps_the_function():
    with ManualClock(0) as clock:
        counter = WaitCounter(fresh_key("decorator"), SECOND)

        @counter.guard()
        def work(x: int, *, pause: float) -> int:
            """Doubles x."""
            time.sleep(pause)
            return 2 * x

        assert work(3, pause=0.010) == 6
        assert work(4, pause=0.001) == 8
        assert work.__name__ == "work"
        assert work.__doc__ == "Doubles x."
        assert counter.stat.count == 2

        @counter.guard()
        def fails() -> None:
            raise ValueError("no")

        with pytest.raises(ValueError, match="no"):
            fails()
        assert counter.stat.count == 3
        got = close_window(clock, counter)
    assert got["COUNT"] == 3.0
    assert got["MAX"] >= 10_000


def test_decorated_recursion_times_each_call():
    with ManualClock(0):
        counter = WaitCounter(fresh_key("recursion"), SECOND)

        @counter.guard()
        def depth(n: int) -> int:
            return 0 if n == 0 else 1 + depth(n - 1)

        assert depth(4) == 4
        assert counter.stat.count == 5


def test_decorated_coroutine_function_times_the_awaited_body():
    with ManualClock(0) as clock:
        counter = WaitCounter(fresh_key("async"), SECOND)

        @counter.guard()
        async def fetch() -> str:
            await asyncio.sleep(0.020)
            return "done"

        assert asyncio.run(fetch()) == "done"
        got = close_window(clock, counter)
    assert got["COUNT"] == 1.0
    # The await is inside the timed span (not only the coroutine's creation).
    assert got["MAX"] >= 20_000


def test_decorated_function_from_several_threads():
    with ManualClock(0):
        counter = WaitCounter(fresh_key("threads"), SECOND)

        @counter.guard()
        def step() -> None:
            time.sleep(0.0005)

        def run() -> None:
            for _ in range(50):
                step()

        threads = [threading.Thread(target=run) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert counter.stat.count == 200


def test_nesting_one_tracker_records_both_blocks():
    with ManualClock(0) as clock:
        counter = WaitCounter(fresh_key("nested"), SECOND)
        guard = counter.guard()
        with guard:
            time.sleep(0.010)
            with guard:
                time.sleep(0.001)
        got = close_window(clock, counter)
    assert got["COUNT"] == 2.0
    assert got["MAX"] >= 11_000  # the outer block holds the inner one


def test_exit_without_enter_raises():
    tracker = WaitCounter(fresh_key("unentered")).guard()
    with pytest.raises(RuntimeError, match="without being entered"):
        tracker.__exit__(None, None, None)
    assert tracker._stat.count == 0


def test_decorating_a_non_callable_raises_type_error():
    with pytest.raises(TypeError, match="callable"):
        WaitCounter(fresh_key("noncallable")).guard()(42)  # type: ignore[type-var]


def test_same_key_shares_one_stat():
    key = fresh_key("shared")
    a = WaitCounter(key, SECOND)
    b = WaitCounter(key.encode(), timedelta(milliseconds=1000))
    assert a.stat is b.stat
    with b.guard():
        pass
    assert a.stat.count == 1
    # torch's _WaitCounter takes the existing counter whatever its window.
    legacy = _WaitCounter(key)
    assert legacy.stat is a.stat
    assert legacy.window_size == SECOND


def test_another_window_for_an_existing_key_is_a_value_error():
    key = fresh_key("conflict")
    WaitCounter(key, SECOND)
    with pytest.raises(ValueError, match=r"window_size.*already exists"):
        WaitCounter(key, timedelta(seconds=2))


def test_defaults_and_properties():
    key = fresh_key("defaults")
    counter = WaitCounter(key)
    assert counter.key == key
    assert counter.stat.name == key
    assert counter.window_size == timedelta(seconds=60)
    assert repr(counter) == f"torchmon.WaitCounter({key!r}, window_size={timedelta(seconds=60)!r})"
    assert isinstance(counter.guard(), _WaitCounterTracker)
    assert counter.guard() is not counter.guard()


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        (timedelta(milliseconds=1), timedelta(milliseconds=1)),
        (0.0015, timedelta(milliseconds=1)),  # truncated to whole ms
        (0.0019999, timedelta(milliseconds=1)),  # not rounded to 2000 µs first
        (4.35, timedelta(milliseconds=4350)),  # not 4349 from 4.35 * 1000
        (1.001, timedelta(milliseconds=1001)),  # not 1000 from 1.001 * 1000
        (2, timedelta(seconds=2)),  # an int number of seconds is fine here
        (timedelta(microseconds=2500), timedelta(milliseconds=2)),
    ],
)
def test_window_size_forms(window, expected):
    assert WaitCounter(fresh_key("window"), window).window_size == expected


@pytest.mark.parametrize(
    "seconds", [1.001, 4.35, 0.0019999, 0.0015, 1.0009, 2.675, 0.1 + 0.2, 3600.0005, 1e9 + 0.001]
)
def test_window_in_seconds_is_converted_as_stat_converts_it(seconds):
    """One conversion for both (docs/api.md): the same window in ms."""
    counter = WaitCounter(fresh_key("seconds"), seconds)
    assert f"window_size={counter.window_size!r}," in repr(torchmon.Stat("s", [], seconds))


@pytest.mark.parametrize(
    ("args", "error", "pattern"),
    [
        ((1,), TypeError, r"WaitCounter\(key\)"),
        ((None,), TypeError, r"WaitCounter\(key\)"),
        (("\ud800",), TypeError, r"WaitCounter\(key\).*surrogate"),
        ((b"\xff",), ValueError, r"WaitCounter\(key\).*UTF-8"),
        (("k", "1s"), TypeError, r"WaitCounter\(window_size\)"),
        (("k", True), TypeError, r"WaitCounter\(window_size\)"),
        (("k", None), TypeError, r"WaitCounter\(window_size\)"),
        (("k", 0), ValueError, r"WaitCounter\(window_size\).*1 millisecond"),
        (("k", 0.0009), ValueError, r"WaitCounter\(window_size\).*1 millisecond"),
        (("k", -1.0), ValueError, r"WaitCounter\(window_size\).*1 millisecond"),
        (("k", timedelta(seconds=-1)), ValueError, r"WaitCounter\(window_size\)"),
        (("k", float("nan")), ValueError, r"WaitCounter\(window_size\).*finite"),
        (("k", float("inf")), ValueError, r"WaitCounter\(window_size\).*finite"),
        (("k", 1e300), ValueError, r"WaitCounter\(window_size\).*too large"),
        (("k", 10**400), ValueError, r"WaitCounter\(window_size\).*too large"),
    ],
)
def test_bad_arguments(args, error, pattern):
    with pytest.raises(error, match=pattern):
        WaitCounter(*args)


def test_bad_key_is_checked_before_bad_window():
    with pytest.raises(TypeError, match=r"\(key\)"):
        WaitCounter(1, 0)  # type: ignore[arg-type]


def test_torch_style_wait_counter_records_too():
    key = fresh_key("legacy")
    legacy = _WaitCounter(key)
    with legacy.guard():
        pass
    assert legacy.stat.count == 1
    assert legacy.window_size == timedelta(seconds=60)
    assert repr(legacy) == f"torchmon._WaitCounter({key!r})"
    with pytest.raises(TypeError, match=r"_WaitCounter\(key\)"):
        _WaitCounter(5)  # type: ignore[arg-type]


def test_discarding_a_counter_emits_its_open_window(recorder):
    key = fresh_key("discard")
    counter = WaitCounter(key, timedelta(hours=1))
    with counter.guard():
        pass
    del counter
    assert not [d for d in recorder.stat_data if f"{key}.count" in d]
    _discard_counter(key)  # the last reference: the Stat is destroyed and flushes
    assert [d[f"{key}.count"] for d in recorder.stat_data if f"{key}.count" in d] == [1.0]
    # A new counter with the key starts afresh (another window is fine now).
    assert WaitCounter(key, SECOND).stat.count == 0


def test_public_name_is_exported():
    assert torchmon.WaitCounter is WaitCounter
    assert "WaitCounter" in torchmon.__all__
