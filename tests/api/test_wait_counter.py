"""torchmon.WaitCounter: guarded durations go to a Stat (COUNT, SUM, MAX in µs).

Durations are real (``time.perf_counter_ns``), so the assertions on them are
lower bounds with generous slack; the windows are driven by ManualClock, so
which window a duration lands in is deterministic.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import itertools
import sys
import threading
import time
import types
from collections.abc import Iterator
from datetime import timedelta

import pytest

import torchmon
from torchmon import _wait_counter
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


class FakeTime:
    """Stands in for the ``time`` module of torchmon._wait_counter: durations
    move only when a test advances them, so what a guard counts is exact."""

    def __init__(self) -> None:
        self.now_ns = 0

    def perf_counter_ns(self) -> int:
        return self.now_ns

    def spend_us(self, us: int) -> None:
        self.now_ns += us * 1000


@pytest.fixture
def fake_time(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    fake = FakeTime()
    monkeypatch.setattr(_wait_counter, "time", fake)
    return fake


def test_decorated_generator_times_its_own_running_not_the_consumer(fake_time):
    with ManualClock(0) as clock:
        counter = WaitCounter(fresh_key("generator"), SECOND)

        @counter.guard()
        def produce(n: int) -> Iterator[int]:
            fake_time.spend_us(5)  # before the first item
            for i in range(n):
                fake_time.spend_us(10)
                yield i
            fake_time.spend_us(7)  # after the last one

        items = produce(3)
        assert counter.stat.count == 0  # creating the generator ran none of it
        got = []
        for item in items:
            fake_time.spend_us(1000)  # the consumer's time is not the generator's
            got.append(item)
        assert got == [0, 1, 2]
        assert counter.stat.count == 1  # one duration per generator, at its end
        assert close_window(clock, counter) == {"COUNT": 1.0, "SUM": 42.0, "MAX": 42.0}


def test_decorated_generator_forwards_send_throw_and_close_and_times_them(fake_time):
    with ManualClock(0) as clock:
        counter = WaitCounter(fresh_key("generator.protocol"), SECOND)
        cleaned_up = []

        @counter.guard()
        def accumulate() -> Iterator[int]:
            total = 0
            try:
                while True:
                    try:
                        value = yield total
                    except KeyError:
                        value = 100
                    fake_time.spend_us(1)
                    total += value
            finally:
                fake_time.spend_us(50)  # cleanup on close() is the generator's time too
                cleaned_up.append(total)

        gen = accumulate()
        assert next(gen) == 0
        assert gen.send(2) == 2
        assert gen.throw(KeyError("handled inside")) == 102
        fake_time.spend_us(1000)
        assert counter.stat.count == 0
        gen.close()
        assert cleaned_up == [102]
        assert counter.stat.count == 1
        gen.close()  # closing again records nothing more
        assert counter.stat.count == 1
        # send 1 µs + throw 1 µs + the cleanup in close() 50 µs
        assert close_window(clock, counter) == {"COUNT": 1.0, "SUM": 52.0, "MAX": 52.0}


def test_decorated_generator_keeps_its_return_value_and_kind():
    counter = WaitCounter(fresh_key("generator.return"))

    @counter.guard()
    def inner() -> Iterator[int]:
        """Yields one."""
        yield 1
        return "result"

    def outer() -> Iterator[int]:
        returned = yield from inner()
        assert returned == "result"
        yield 2

    assert list(outer()) == [1, 2]
    assert counter.stat.count == 1
    assert inspect.isgeneratorfunction(inner)  # pytest fixtures, contextlib, ... still see one
    assert inner.__name__ == "inner"
    assert inner.__doc__ == "Yields one."


def test_decorated_generator_that_raises_records_and_propagates(fake_time):
    with ManualClock(0):
        counter = WaitCounter(fresh_key("generator.raises"), SECOND)

        @counter.guard()
        def broken() -> Iterator[int]:
            yield 1
            fake_time.spend_us(30)
            raise KeyError("boom")

        gen = broken()
        assert next(gen) == 1
        with pytest.raises(KeyError, match="boom"):
            next(gen)
        assert counter.stat.count == 1


def test_decorated_generator_never_started_records_nothing():
    counter = WaitCounter(fresh_key("generator.unstarted"))

    @counter.guard()
    def produce() -> Iterator[int]:
        yield 1

    gen = produce()
    del gen
    gc.collect()
    assert counter.stat.count == 0


def test_abandoned_decorated_generator_records_when_collected(fake_time):
    with ManualClock(0):
        counter = WaitCounter(fresh_key("generator.abandoned"), SECOND)

        @counter.guard()
        def produce() -> Iterator[int]:
            fake_time.spend_us(3)
            yield 1
            yield 2

        gen = produce()
        next(gen)
        assert counter.stat.count == 0
        del gen  # Python closes a started generator when it is collected
        gc.collect()
        assert counter.stat.count == 1


def test_decorated_generator_raises_an_argument_error_at_the_first_next():
    # Its body runs only when first resumed (docs/wait_counter_and_bridge.md).
    counter = WaitCounter(fresh_key("generator.arguments"))

    @counter.guard()
    def produce(n: int) -> Iterator[int]:
        yield n

    gen = produce()  # type: ignore[call-arg]
    assert counter.stat.count == 0
    with pytest.raises(TypeError, match="missing 1 required positional argument"):
        next(gen)
    assert counter.stat.count == 1


def test_context_manager_generator_times_its_setup_and_teardown(fake_time):
    # The decorator times the generator's own running; to time a with block,
    # the guard itself is the context manager (docs/wait_counter_and_bridge.md).
    with ManualClock(0) as clock:
        counter = WaitCounter(fresh_key("generator.contextmanager"), SECOND)

        @contextlib.contextmanager
        @counter.guard()
        def section() -> Iterator[None]:
            fake_time.spend_us(4)
            yield
            fake_time.spend_us(6)

        with section():
            fake_time.spend_us(1000)
        assert close_window(clock, counter)["SUM"] == 10.0


def test_decorated_async_generator_times_its_awaits_not_the_consumer(fake_time):
    with ManualClock(0) as clock:
        counter = WaitCounter(fresh_key("async.generator"), SECOND)

        @counter.guard()
        async def produce(n: int):  # type: ignore[no-untyped-def]
            for i in range(n):
                await asyncio.sleep(0)
                fake_time.spend_us(10)
                yield i

        async def consume() -> list[int]:
            got = []
            async for item in produce(3):
                fake_time.spend_us(1000)
                got.append(item)
            return got

        assert inspect.isasyncgenfunction(produce)
        assert asyncio.run(consume()) == [0, 1, 2]
        assert counter.stat.count == 1
        assert close_window(clock, counter) == {"COUNT": 1.0, "SUM": 30.0, "MAX": 30.0}


def test_decorated_async_generator_counts_awaited_time_inside_it():
    with ManualClock(0) as clock:
        counter = WaitCounter(fresh_key("async.generator.sleep"), SECOND)

        @counter.guard()
        async def produce():  # type: ignore[no-untyped-def]
            await asyncio.sleep(0.020)
            yield "slow"

        async def consume() -> list[str]:
            return [item async for item in produce()]

        assert asyncio.run(consume()) == ["slow"]
        got = close_window(clock, counter)
    assert got["COUNT"] == 1.0
    assert got["MAX"] >= 20_000  # the awaited sleep is waited for by the consumer


def test_decorated_async_generator_aclose_and_athrow(fake_time):
    with ManualClock(0):
        counter = WaitCounter(fresh_key("async.generator.close"), SECOND)
        closed = []

        @counter.guard()
        async def produce():  # type: ignore[no-untyped-def]
            try:
                while True:
                    try:
                        yield "item"
                    except KeyError:
                        yield "caught"
            finally:
                await asyncio.sleep(0)
                closed.append(True)

        async def drive() -> None:
            agen = produce()
            assert await agen.__anext__() == "item"
            assert await agen.athrow(KeyError("x")) == "caught"
            assert counter.stat.count == 0
            await agen.aclose()

        asyncio.run(drive())
        assert closed == [True]
        assert counter.stat.count == 1


def test_async_generator_left_open_records_when_the_event_loop_closes_it(fake_time):
    with ManualClock(0):
        counter = WaitCounter(fresh_key("async.generator.abandoned"), SECOND)

        @counter.guard()
        async def produce():  # type: ignore[no-untyped-def]
            fake_time.spend_us(2)
            yield 1
            yield 2

        async def take_one() -> int:
            agen = produce()
            first = await agen.__anext__()
            assert counter.stat.count == 0
            return first  # left open: asyncio.run's shutdown closes it

        assert asyncio.run(take_one()) == 1
        assert counter.stat.count == 1


def test_callable_objects_are_timed_by_what_their_call_runs(fake_time):
    with ManualClock(0) as clock:
        counter = WaitCounter(fresh_key("callable.objects"), SECOND)

        class Batches:
            def __call__(self) -> Iterator[int]:
                fake_time.spend_us(8)
                yield 1

        class Fetch:
            async def __call__(self) -> str:
                await asyncio.sleep(0)
                fake_time.spend_us(9)
                return "done"

        batches = counter.guard()(Batches())
        assert counter.stat.count == 0
        assert list(batches()) == [1]
        fetch = counter.guard()(Fetch())
        assert asyncio.run(fetch()) == "done"
        assert close_window(clock, counter) == {"COUNT": 2.0, "SUM": 17.0, "MAX": 9.0}


def test_generator_based_coroutine_is_refused_at_decoration():
    @types.coroutine
    def legacy():  # type: ignore[no-untyped-def]
        yield

    with pytest.raises(TypeError, match="generator-based coroutine"):
        WaitCounter(fresh_key("legacy.coroutine")).guard()(legacy)


@pytest.fixture
def unraisable(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    reports: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", reports.append)
    return reports


@contextlib.contextmanager
def raising_handler(key: str, error: BaseException) -> Iterator[None]:
    """Registers a handler that raises ``error`` on every window of ``key``."""

    def handler(event: torchmon.Event) -> None:
        if f"{key}.count" in event.data:
            raise error

    handle = torchmon.register_event_handler(handler)
    try:
        yield
    finally:
        torchmon.unregister_event_handler(handle)


def counter_with_a_sample_in_a_past_window(clock: ManualClock, label: str) -> WaitCounter:
    """A counter whose next guard closes a window (and so runs the handlers)."""
    counter = WaitCounter(fresh_key(label), SECOND)
    with counter.guard():
        pass
    clock.advance(1000)
    return counter


def test_handler_error_does_not_replace_the_exception_of_the_block(unraisable):
    with ManualClock(0) as clock:
        counter = counter_with_a_sample_in_a_past_window(clock, "precedence.with")
        with raising_handler(counter.key, ValueError("from the handler")):
            with pytest.raises(KeyError, match="from the block"), counter.guard():
                raise KeyError("from the block")
    assert [type(r.exc_value) for r in unraisable] == [ValueError]  # type: ignore[attr-defined]
    report = unraisable[0]
    assert str(report.exc_value) == "from the handler"  # type: ignore[attr-defined]
    assert report.object is counter.stat  # type: ignore[attr-defined]
    assert counter.key in report.err_msg  # type: ignore[attr-defined]


def test_handler_error_does_not_replace_the_exception_of_a_decorated_function(unraisable):
    with ManualClock(0) as clock:
        counter = counter_with_a_sample_in_a_past_window(clock, "precedence.decorated")

        @counter.guard()
        def lookup() -> None:
            raise KeyError("missing")

        with raising_handler(counter.key, ValueError("from the handler")):
            with pytest.raises(KeyError, match="missing"):
                lookup()
    assert [type(r.exc_value) for r in unraisable] == [ValueError]  # type: ignore[attr-defined]


def test_handler_error_does_not_replace_the_exception_of_a_decorated_generator(unraisable):
    with ManualClock(0) as clock:
        counter = counter_with_a_sample_in_a_past_window(clock, "precedence.generator")

        @counter.guard()
        def produce() -> Iterator[int]:
            yield 1
            raise KeyError("missing")

        with raising_handler(counter.key, ValueError("from the handler")):
            gen = produce()
            next(gen)
            with pytest.raises(KeyError, match="missing"):
                next(gen)
            # close() of a suspended generator: GeneratorExit is propagating,
            # so the handler's error is unraisable and close() returns.
            clock.advance(1000)
            gen = produce()
            next(gen)
            gen.close()
    assert [type(r.exc_value) for r in unraisable] == [ValueError, ValueError]  # type: ignore[attr-defined]


def test_handler_error_without_an_exception_of_the_block_is_raised(unraisable):
    # As from Stat.add: nothing else is propagating, so the handler's error is.
    with ManualClock(0) as clock:
        counter = counter_with_a_sample_in_a_past_window(clock, "precedence.plain")
        with raising_handler(counter.key, ValueError("from the handler")):
            with pytest.raises(ValueError, match="from the handler"), counter.guard():
                pass
            clock.advance(1000)

            @counter.guard()
            def produce() -> Iterator[int]:
                yield 1

            with pytest.raises(ValueError, match="from the handler"):
                list(produce())
    assert unraisable == []


def test_keyboard_interrupt_from_a_handler_displaces_an_ordinary_exception(unraisable):
    # The precedence rule of Stat.add and log_event (docs/reliability.md).
    with ManualClock(0) as clock:
        counter = counter_with_a_sample_in_a_past_window(clock, "precedence.interrupt")
        with raising_handler(counter.key, KeyboardInterrupt()):
            with pytest.raises(KeyboardInterrupt) as caught, counter.guard():
                raise KeyError("from the block")
    assert isinstance(caught.value.__context__, KeyError)
    assert unraisable == []


def test_handler_error_with_the_default_unraisablehook_is_printed(monkeypatch, capsys):
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
    with ManualClock(0) as clock:
        counter = counter_with_a_sample_in_a_past_window(clock, "precedence.printed")
        with raising_handler(counter.key, ValueError("from the handler")):
            with pytest.raises(KeyError), counter.guard():
                raise KeyError("from the block")
    err = capsys.readouterr().err
    assert f"Exception ignored in a handler of the wait counter {counter.key!r}" in err
    assert "ValueError: from the handler" in err


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
        (("k" * 201,), ValueError, r"^WaitCounter\(key\): key must be at most 200 characters"),
        ((b"k" * 201,), ValueError, r"^WaitCounter\(key\): key must be at most 200 characters"),
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
