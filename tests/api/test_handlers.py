"""Handler registry and dispatch: register/unregister/log_event (docs/api.md,
"Handlers (registry)")."""

from __future__ import annotations

import faulthandler
import functools
import gc
import sys
import weakref
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any, Callable

import pytest
from support import run_python

import torchmon
from torchmon import Event, EventHandlerHandle, Stat
from torchmon.testing import ManualClock

TS = datetime(2020, 1, 1, 12, 0, 0)


def make_event(name: str = "e", **data: Any) -> Event:
    return Event(name, TS, data)


class Registry:
    """Registers handlers for one test and unregisters them all afterwards."""

    def __init__(self) -> None:
        self.handles: list[EventHandlerHandle] = []

    def add(self, callback: Callable[[Event], Any]) -> EventHandlerHandle:
        handle = torchmon.register_event_handler(callback)
        self.handles.append(handle)
        return handle

    def close(self) -> None:
        for h in self.handles:
            torchmon.unregister_event_handler(h)  # a no-op for handles already removed


@pytest.fixture
def registry() -> Iterator[Registry]:
    reg = Registry()
    try:
        yield reg
    finally:
        reg.close()


@pytest.fixture
def watchdog() -> Iterator[None]:
    """Kills the run (with tracebacks) instead of hanging forever on a deadlock."""
    faulthandler.dump_traceback_later(60, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture
def unraisable(monkeypatch: pytest.MonkeyPatch) -> list[BaseException | None]:
    caught: list[BaseException | None] = []

    def hook(args: Any) -> None:
        caught.append(args.exc_value)

    monkeypatch.setattr(sys, "unraisablehook", hook)
    return caught


# --- registration and order ------------------------------------------------


def test_handlers_are_called_in_registration_order(registry: Registry) -> None:
    order: list[str] = []
    for tag in "abcde":
        registry.add(lambda e, tag=tag: order.append(tag))
    torchmon.log_event(make_event())
    assert order == list("abcde")


def test_same_callable_registered_twice_is_called_twice(registry: Registry) -> None:
    seen: list[Event] = []
    registry.add(seen.append)
    registry.add(seen.append)
    e = make_event()
    torchmon.log_event(e)
    assert seen == [e, e]


def test_each_register_returns_a_new_handle(registry: Registry) -> None:
    def cb(e: Event) -> None:
        pass

    h1 = registry.add(cb)
    h2 = registry.add(cb)
    assert isinstance(h1, EventHandlerHandle)
    assert isinstance(h2, EventHandlerHandle)
    assert h1 is not h2


def test_unregister_removes_the_handler(registry: Registry) -> None:
    seen: list[str] = []
    h = registry.add(lambda e: seen.append(e.name))
    torchmon.log_event(make_event("one"))
    assert torchmon.unregister_event_handler(h) is None
    torchmon.log_event(make_event("two"))
    assert seen == ["one"]


def test_unregister_removes_only_that_registration(registry: Registry) -> None:
    seen: list[str] = []

    def cb(e: Event) -> None:
        seen.append(e.name)

    h1 = registry.add(cb)
    registry.add(cb)
    torchmon.unregister_event_handler(h1)
    torchmon.log_event(make_event("x"))
    assert seen == ["x"]


def test_unregister_keeps_the_order_of_the_others(registry: Registry) -> None:
    order: list[str] = []
    registry.add(lambda e: order.append("a"))
    hb = registry.add(lambda e: order.append("b"))
    registry.add(lambda e: order.append("c"))
    torchmon.unregister_event_handler(hb)
    registry.add(lambda e: order.append("d"))
    torchmon.log_event(make_event())
    assert order == ["a", "c", "d"]


def test_double_unregister_is_a_no_op(registry: Registry) -> None:
    seen: list[Event] = []
    keep = registry.add(seen.append)
    h = registry.add(lambda e: seen.append(e))
    torchmon.unregister_event_handler(h)
    assert torchmon.unregister_event_handler(h) is None
    assert torchmon.unregister_event_handler(h) is None
    e = make_event()
    torchmon.log_event(e)
    assert seen == [e]
    torchmon.unregister_event_handler(keep)
    torchmon.log_event(make_event())
    assert seen == [e]


def test_log_event_without_handlers_does_nothing() -> None:
    assert torchmon.log_event(make_event()) is None


@pytest.mark.parametrize(
    "not_an_event",
    [None, "torch.monitor.Stat", 1, {"name": "e", "timestamp": TS, "data": {}}, Event],
    ids=["None", "str", "int", "dict", "the-class"],
)
def test_log_event_with_a_non_event_is_type_error_and_calls_nothing(
    recorder, not_an_event: object
) -> None:
    with pytest.raises(TypeError, match="event"):
        torchmon.log_event(not_an_event)  # type: ignore[arg-type]
    assert recorder.events == []


def test_handler_receives_the_very_object_logged(recorder) -> None:
    e = make_event(a=1)
    torchmon.log_event(e)
    assert len(recorder.events) == 1
    assert recorder.events[0] is e


def test_every_handler_receives_the_same_logged_object(registry: Registry) -> None:
    seen: list[Event] = []

    def renamer(e: Event) -> None:
        seen.append(e)
        e.name = "renamed"

    registry.add(renamer)
    registry.add(seen.append)
    e = make_event("orig")
    torchmon.log_event(e)
    assert seen[0] is e
    assert seen[1] is e
    assert e.name == "renamed"


def test_handler_return_value_is_ignored(registry: Registry) -> None:
    registry.add(lambda e: "ignored")
    assert torchmon.log_event(make_event()) is None


def test_dispatch_is_on_the_calling_thread(registry: Registry) -> None:
    import threading

    threads: list[int] = []
    registry.add(lambda e: threads.append(threading.get_ident()))
    torchmon.log_event(make_event())
    assert threads == [threading.get_ident()]


# --- any callable ------------------------------------------------------------


class CallableObject:
    def __init__(self) -> None:
        self.seen: list[Event] = []

    def __call__(self, e: Event) -> None:
        self.seen.append(e)


class Owner:
    def __init__(self) -> None:
        self.seen: list[Event] = []

    def method(self, e: Event) -> None:
        self.seen.append(e)


def test_any_callable_works(registry: Registry) -> None:
    from_function: list[Event] = []
    from_lambda: list[Event] = []
    from_partial: list[tuple[str, Event]] = []
    from_builtin: list[Event] = []

    def function(e: Event) -> None:
        from_function.append(e)

    def tagged(tag: str, e: Event) -> None:
        from_partial.append((tag, e))

    obj = CallableObject()
    owner = Owner()
    registry.add(function)
    registry.add(lambda e: from_lambda.append(e))
    registry.add(owner.method)
    registry.add(obj)
    registry.add(functools.partial(tagged, "p"))
    registry.add(from_builtin.append)
    e = make_event()
    torchmon.log_event(e)
    assert from_function == [e]
    assert from_lambda == [e]
    assert owner.seen == [e]
    assert obj.seen == [e]
    assert from_partial == [("p", e)]
    assert from_builtin == [e]


def test_a_class_is_a_callable_handler(registry: Registry) -> None:
    created: list[Any] = []

    class Sink:
        def __init__(self, e: Event) -> None:
            created.append(e)

    registry.add(Sink)
    e = make_event()
    torchmon.log_event(e)
    assert created == [e]


@pytest.mark.parametrize("not_callable", [None, 1, "x", [], {}], ids=repr)
def test_register_requires_a_callable(not_callable: object) -> None:
    with pytest.raises(TypeError, match="callback"):
        torchmon.register_event_handler(not_callable)  # type: ignore[arg-type]


def test_event_handler_handle_cannot_be_constructed() -> None:
    with pytest.raises(TypeError):
        EventHandlerHandle()


def test_data_value_t_cannot_be_constructed() -> None:
    with pytest.raises(TypeError):
        torchmon.data_value_t()


# --- reentrancy ----------------------------------------------------------------


@pytest.mark.usefixtures("watchdog")
def test_handler_can_log_an_event(registry: Registry) -> None:
    seen: list[str] = []
    depth = [0]

    def relog(e: Event) -> None:
        seen.append(e.name)
        if depth[0] == 0:
            depth[0] += 1
            try:
                torchmon.log_event(make_event("inner"))
            finally:
                depth[0] -= 1

    registry.add(relog)
    torchmon.log_event(make_event("outer"))
    assert seen == ["outer", "inner"]


@pytest.mark.usefixtures("watchdog")
def test_inner_log_event_reaches_later_handlers_too(registry: Registry) -> None:
    order: list[str] = []
    nested = [False]

    def first(e: Event) -> None:
        order.append(f"first:{e.name}")
        if not nested[0]:
            nested[0] = True
            torchmon.log_event(make_event("inner"))

    registry.add(first)
    registry.add(lambda e: order.append(f"second:{e.name}"))
    torchmon.log_event(make_event("outer"))
    assert order == ["first:outer", "first:inner", "second:inner", "second:outer"]


@pytest.mark.usefixtures("watchdog")
def test_handler_can_register_a_handler_seen_by_an_inner_call(registry: Registry) -> None:
    late_seen: list[str] = []
    done = [False]

    def registrar(e: Event) -> None:
        if not done[0]:
            done[0] = True
            registry.add(lambda ev: late_seen.append(ev.name))
            torchmon.log_event(make_event("inner"))

    registry.add(registrar)
    torchmon.log_event(make_event("outer"))
    assert "inner" in late_seen
    late_seen.clear()
    torchmon.log_event(make_event("later"))
    assert late_seen == ["later"]


@pytest.mark.usefixtures("watchdog")
def test_handler_can_unregister_itself(registry: Registry) -> None:
    seen: list[str] = []
    after: list[str] = []
    handle: list[EventHandlerHandle] = []

    def once(e: Event) -> None:
        seen.append(e.name)
        torchmon.unregister_event_handler(handle[0])

    handle.append(registry.add(once))
    registry.add(lambda e: after.append(e.name))
    torchmon.log_event(make_event("first"))
    torchmon.log_event(make_event("second"))
    assert seen == ["first"]
    assert after == ["first", "second"]


@pytest.mark.usefixtures("watchdog")
def test_handler_unregistering_itself_then_inner_call_skips_it(registry: Registry) -> None:
    seen: list[str] = []
    handle: list[EventHandlerHandle] = []

    def once(e: Event) -> None:
        seen.append(e.name)
        if e.name == "outer":
            torchmon.unregister_event_handler(handle[0])
            torchmon.log_event(make_event("inner"))

    handle.append(registry.add(once))
    torchmon.log_event(make_event("outer"))
    assert seen == ["outer"]


@pytest.mark.usefixtures("watchdog")
def test_handler_unregistered_by_an_earlier_one_is_not_started(registry: Registry) -> None:
    victim_seen: list[str] = []
    victim: list[EventHandlerHandle] = []

    def killer(e: Event) -> None:
        torchmon.unregister_event_handler(victim[0])

    registry.add(killer)
    victim.append(registry.add(lambda e: victim_seen.append(e.name)))
    torchmon.log_event(make_event("now"))
    torchmon.log_event(make_event("later"))
    assert victim_seen == []


@pytest.mark.usefixtures("watchdog")
def test_handler_unregistered_by_an_earlier_one_is_not_started_by_inner_call(
    registry: Registry,
) -> None:
    victim_seen: list[str] = []
    victim: list[EventHandlerHandle] = []
    survivor_seen: list[str] = []

    def killer(e: Event) -> None:
        if e.name == "outer":
            torchmon.unregister_event_handler(victim[0])
            torchmon.log_event(make_event("inner"))

    registry.add(killer)
    victim.append(registry.add(lambda e: victim_seen.append(e.name)))
    registry.add(lambda e: survivor_seen.append(e.name))
    torchmon.log_event(make_event("outer"))
    assert victim_seen == []
    assert survivor_seen == ["inner", "outer"]


@pytest.mark.usefixtures("watchdog")
def test_handler_can_add_to_a_stat_that_emits(registry: Registry) -> None:
    seen: list[str] = []
    stats: list[Stat] = []

    def adder(e: Event) -> None:
        seen.append(e.name)
        if e.name == "outer":
            stats[0].add(2.0)  # max_samples=1: emits a Stat event from inside a handler

    with ManualClock(0):
        stats.append(Stat("inner_stat", [torchmon.SUM], timedelta(seconds=1), 1))
        registry.add(adder)
        torchmon.log_event(make_event("outer"))
        assert seen == ["outer", torchmon.STAT_EVENT]
        assert stats[0].get() == {torchmon.SUM: 2.0}
        stats.clear()


# --- exceptions from handlers ----------------------------------------------


def test_every_handler_runs_and_the_first_exception_is_raised(
    registry: Registry, unraisable: list[BaseException | None]
) -> None:
    ran: list[str] = []

    def raise_first(e: Event) -> None:
        ran.append("a")
        raise ValueError("first failure")

    def raise_second(e: Event) -> None:
        ran.append("c")
        raise RuntimeError("second failure")

    def raise_third(e: Event) -> None:
        ran.append("e")
        raise KeyError("third failure")

    registry.add(raise_first)
    registry.add(lambda e: ran.append("b"))
    registry.add(raise_second)
    registry.add(lambda e: ran.append("d"))
    registry.add(raise_third)
    with pytest.raises(ValueError, match=r"^first failure$"):
        torchmon.log_event(make_event())
    assert ran == ["a", "b", "c", "d", "e"]
    assert [type(x) for x in unraisable] == [RuntimeError, KeyError]
    assert str(unraisable[0]) == "second failure"


def test_exception_raised_is_the_handlers_own_object(registry: Registry) -> None:
    class Custom(Exception):
        pass

    raised: list[BaseException] = []

    def boom(e: Event) -> None:
        exc = Custom("custom message", 42)
        raised.append(exc)
        raise exc

    registry.add(boom)
    with pytest.raises(Custom) as info:
        torchmon.log_event(make_event())
    assert info.value is raised[0]
    assert info.value.args == ("custom message", 42)


def test_single_failing_handler_reports_nothing_unraisable(
    registry: Registry, unraisable: list[BaseException | None]
) -> None:
    def boom(e: Event) -> None:
        raise ZeroDivisionError("only one")

    registry.add(boom)
    with pytest.raises(ZeroDivisionError, match="only one"):
        torchmon.log_event(make_event())
    assert unraisable == []


def test_keyboard_interrupt_wins_over_an_earlier_ordinary_exception(
    registry: Registry, unraisable: list[BaseException | None]
) -> None:
    def ordinary(e: Event) -> None:
        raise ValueError("ordinary")

    def interrupt(e: Event) -> None:
        raise KeyboardInterrupt

    registry.add(ordinary)
    registry.add(interrupt)
    with pytest.raises(KeyboardInterrupt):
        torchmon.log_event(make_event())
    assert len(unraisable) == 1
    assert type(unraisable[0]) is ValueError
    assert str(unraisable[0]) == "ordinary"


def test_dispatch_continues_after_exceptions_on_the_next_event(
    registry: Registry, unraisable: list[BaseException | None]
) -> None:
    count = [0]

    def boom(e: Event) -> None:
        raise OSError("always")

    def counter(e: Event) -> None:
        count[0] += 1

    registry.add(boom)
    registry.add(counter)
    for _ in range(3):
        with pytest.raises(OSError, match="always"):
            torchmon.log_event(make_event())
    assert count[0] == 3
    assert unraisable == []


def test_stat_close_runs_every_handler_and_raises_the_first(
    registry: Registry, unraisable: list[BaseException | None]
) -> None:
    got: list[dict[str, object]] = []

    def first(e: Event) -> None:
        raise ValueError("stat handler one")

    def second(e: Event) -> None:
        raise TypeError("stat handler two")

    registry.add(first)
    registry.add(second)
    registry.add(lambda e: got.append(e.data))
    with ManualClock(0):
        stat = Stat("s", [torchmon.SUM], timedelta(seconds=1), 1)
        with pytest.raises(ValueError, match="stat handler one"):
            stat.add(1.5)
        del stat
    assert got == [{"s.sum": 1.5}]
    assert [type(x) for x in unraisable] == [TypeError]


def test_keyboard_interrupt_wins_across_the_windows_of_one_add_many(
    registry: Registry, unraisable: list[BaseException | None]
) -> None:
    """One `add_many` closing two windows: the first into a handler raising
    ValueError, the second into one raising KeyboardInterrupt. Ctrl-C must
    reach the caller, as from a single dispatch (docs/reliability.md); the
    ValueError goes to sys.unraisablehook."""
    raised: list[type[BaseException]] = [ValueError, KeyboardInterrupt]

    def handler(e: Event) -> None:
        exception = raised.pop(0)
        raise exception(f"window {2 - len(raised)}")

    registry.add(handler)
    with ManualClock(0) as clock:
        stat = Stat("s", [torchmon.COUNT], timedelta(seconds=1), 2)
        stat.add(1.0)
        clock.advance(1000)
        # The first value closes the open window; the second fills
        # max_samples=2 and closes the next one.
        with pytest.raises(KeyboardInterrupt, match="window 2"):
            stat.add_many([2.0, 3.0])
        assert raised == []
        del stat
    assert [type(x) for x in unraisable] == [ValueError]


# --- many handlers ------------------------------------------------------------


def test_many_registrations_and_unregistrations_keep_order_and_free_handlers(
    registry: Registry,
) -> None:
    """Churn that moves the registry's buffer both ways (it grows with
    registrations and is compacted after unregistrations): dispatch still
    calls exactly the registered handlers in registration order, and an
    unregistered handler is freed at once, even while many others stay
    registered (docs/reliability.md)."""
    called: list[int] = []

    class Handler:
        def __init__(self, key: int) -> None:
            self.key = key

        def __call__(self, event: Event) -> None:
            called.append(self.key)

    live: dict[int, EventHandlerHandle] = {}
    next_key = 0
    for round_ in range(6):
        for _ in range(300 if round_ % 2 == 0 else 40):
            live[next_key] = registry.add(Handler(next_key))
            next_key += 1
        # Unregister every handler whose key is not a multiple of 3 or 7.
        for key in [k for k in live if k % 3 and k % 7]:
            torchmon.unregister_event_handler(live.pop(key))
        called.clear()
        torchmon.log_event(make_event())
        assert called == sorted(live), f"round {round_}"


def test_an_unregistered_handler_is_freed_while_others_stay_registered(
    registry: Registry,
) -> None:
    def noop(event: Event) -> None:
        pass

    class Sink:
        def __call__(self, event: Event) -> None:
            pass

    for _ in range(10):
        registry.add(noop)
    sink = Sink()
    ref = weakref.ref(sink)
    handle = registry.add(sink)
    for _ in range(10):
        registry.add(noop)
    del sink
    gc.disable()
    try:
        assert ref() is not None
        torchmon.unregister_event_handler(handle)
        assert ref() is None  # by reference counting alone
    finally:
        gc.enable()


def test_registering_and_unregistering_allocates_no_python_object_per_handler() -> None:
    """A change must not allocate a Python object per registered handler:
    thousands of handlers made every registration allocate thousands, and
    the garbage collections they set off made registering and unregistering
    N handlers worse than quadratic (docs/performance.md). Counted as
    collections, which a fixed number of allocations per change (the handle,
    the published list) keeps to a few."""
    n = 3000
    handlers = [(lambda event: None) for _ in range(n)]
    collections: list[int] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    threshold = gc.get_threshold()
    gc.set_threshold(700, 10, 10)  # CPython's default
    gc.collect()
    gc.callbacks.append(on_gc)
    try:
        handles = [torchmon.register_event_handler(h) for h in handlers]
        for handle in handles:
            torchmon.unregister_event_handler(handle)
    finally:
        gc.callbacks.remove(on_gc)
        gc.set_threshold(*threshold)
    assert torchmon._core._handler_count() == 0
    # 2 * n changes; one collection per 700 net allocations of tracked objects.
    assert len(collections) < 2 * n // 100, f"{len(collections)} collections"


# --- threads -----------------------------------------------------------------


THREAD_TIMEOUT = 60.0


def run_no_deadlock(code: str) -> str:
    result = run_python(code, timeout=THREAD_TIMEOUT)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_register_from_another_thread_while_a_handler_runs() -> None:
    out = run_no_deadlock(
        """
        import datetime, threading
        import torchmon

        started = threading.Event()
        registered = threading.Event()
        other_seen = []
        waited = []

        def slow(e):
            if e.name == "first":
                started.set()
                waited.append(registered.wait(10))

        def other(e):
            other_seen.append(e.name)

        def worker():
            started.wait(10)
            torchmon.register_event_handler(other)
            registered.set()

        torchmon.register_event_handler(slow)
        t = threading.Thread(target=worker)
        t.start()
        torchmon.log_event(torchmon.Event("first", datetime.datetime.now(), {}))
        t.join(10)
        torchmon.log_event(torchmon.Event("second", datetime.datetime.now(), {}))
        print(waited, t.is_alive(), other_seen[-1])
        """
    )
    assert out == "[True] False second"


def test_other_thread_logs_unregisters_and_adds_while_a_handler_runs() -> None:
    out = run_no_deadlock(
        """
        import datetime, threading
        import torchmon

        started = threading.Event()
        finished = threading.Event()
        main_ident = threading.get_ident()
        waited = []
        seen = []

        def slow(e):
            if threading.get_ident() == main_ident and e.name == "block":
                started.set()
                waited.append(finished.wait(10))

        def record(e):
            seen.append((threading.get_ident() == main_ident, e.name))

        def worker():
            started.wait(10)
            torchmon.log_event(torchmon.Event("from_worker", datetime.datetime.now(), {}))
            stat = torchmon.Stat("w", [torchmon.SUM], datetime.timedelta(seconds=60), 1)
            stat.add(1.0)
            torchmon.unregister_event_handler(h_record)
            finished.set()

        torchmon.register_event_handler(slow)
        h_record = torchmon.register_event_handler(record)
        t = threading.Thread(target=worker)
        t.start()
        torchmon.log_event(torchmon.Event("block", datetime.datetime.now(), {}))
        t.join(10)
        names = sorted(name for is_main, name in seen if not is_main)
        print(waited, t.is_alive(), names)
        """
    )
    assert out == "[True] False ['from_worker', 'torch.monitor.Stat']"
