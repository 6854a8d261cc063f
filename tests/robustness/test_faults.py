"""Handler faults (docs/reliability.md, "Handler faults") not already pinned elsewhere.

Already covered, not repeated here (paths under tests/):
- an exception in a handler during ``log_event``: api/test_handlers.py
  ``test_every_handler_runs_and_the_first_exception_is_raised``, conformance/test_divergences.py
  ``test_a_handler_raises_every_handler_still_runs_log_event``;
- during ``add`` (max_samples and time closes): conformance/test_divergences.py
  ``test_a_handler_raises_every_handler_still_runs_add_flush``,
  ``..._two_raisers_in_add_first_exception_wins``, api/test_handlers.py
  ``test_stat_close_runs_every_handler_and_raises_the_first``, api/test_stat.py
  ``test_handler_exception_on_*_close_*``;
- during ``del stat``: conformance/test_divergences.py
  ``test_a_handler_raises_while_a_stat_is_destroyed_*``;
- at interpreter exit (one Stat): robustness/test_exit_and_destruction.py
  ``test_handler_raising_at_exit_is_reported_and_exit_code_is_zero``;
- KeyboardInterrupt raised by the *last* handler wins over an earlier ordinary
  exception: api/test_handlers.py
  ``test_keyboard_interrupt_wins_over_an_earlier_ordinary_exception``;
- a handler unregistering itself during a ``log_event`` dispatch: api/test_handlers.py
  ``test_handler_can_unregister_itself``, ``..._then_inner_call_skips_it``.

Here: KeyboardInterrupt / SystemExit raised by an *early* handler (the later
handlers still run, from ``log_event`` and from ``add``), two of them in one
dispatch, both during destruction and at exit; several Stats flushed at exit
with a raising handler; self-unregistering and registering handlers during a
Stat event's dispatch; a handler that drops the last reference to the Stat
being dispatched; unbounded recursion through ``log_event``; a raising
``sys.unraisablehook``; a raising handler during garbage collection and on
another thread.
"""

from __future__ import annotations

import gc
import json
import sys
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any, Callable

import pytest
from support import run_python

import torchmon
from torchmon import COUNT, SUM, Event, EventHandlerHandle, Stat
from torchmon.testing import ManualClock

TS = datetime(2020, 1, 1)
W = timedelta(hours=100)
SECOND = timedelta(seconds=1)


class Boom(Exception):
    pass


class Handlers:
    """Registers handlers for one test; ``calls`` logs (tag, event name or data)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.handles: list[EventHandlerHandle] = []

    def add(self, callback: Callable[[Event], Any]) -> EventHandlerHandle:
        handle = torchmon.register_event_handler(callback)
        self.handles.append(handle)
        return handle

    def record(self, tag: str) -> EventHandlerHandle:
        def handler(e: Event) -> None:
            self.calls.append((tag, e.data if e.name == torchmon.STAT_EVENT else e.name))

        return self.add(handler)

    def raiser(self, tag: str, make: Callable[[], BaseException]) -> EventHandlerHandle:
        def handler(e: Event) -> None:
            self.calls.append((tag, e.data if e.name == torchmon.STAT_EVENT else e.name))
            raise make()

        return self.add(handler)

    def tags(self) -> list[str]:
        return [t for t, _ in self.calls]

    def close(self) -> None:
        for h in self.handles:
            torchmon.unregister_event_handler(h)


@pytest.fixture
def handlers() -> Iterator[Handlers]:
    hs = Handlers()
    try:
        yield hs
    finally:
        hs.close()


@pytest.fixture
def unraisable(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What reaches sys.unraisablehook, as (exception type, exception) pairs."""
    seen: list[Any] = []
    monkeypatch.setattr(
        sys, "unraisablehook", lambda args: seen.append((args.exc_type, args.exc_value))
    )
    return seen


BASE_EXCEPTIONS = {
    "KeyboardInterrupt": lambda: KeyboardInterrupt("interrupted in a handler"),
    "SystemExit": lambda: SystemExit(7),
}


# --- KeyboardInterrupt / SystemExit propagate after every handler ran ----------


@pytest.mark.parametrize("make", BASE_EXCEPTIONS.values(), ids=BASE_EXCEPTIONS.keys())
def test_base_exception_from_the_first_handler_propagates_from_log_event_after_the_others(
    handlers: Handlers, unraisable: list[Any], make: Callable[[], BaseException]
) -> None:
    handlers.raiser("a", make)
    handlers.record("b")
    handlers.record("c")
    expected = type(make())
    with pytest.raises(expected) as info:
        torchmon.log_event(Event("x", TS, {}))
    assert handlers.tags() == ["a", "b", "c"]
    if expected is SystemExit:
        assert info.value.code == 7
    assert unraisable == []
    # the registry is intact: the next dispatch runs everything again
    handlers.calls.clear()
    with pytest.raises(expected):
        torchmon.log_event(Event("y", TS, {}))
    assert handlers.tags() == ["a", "b", "c"]


@pytest.mark.parametrize("make", BASE_EXCEPTIONS.values(), ids=BASE_EXCEPTIONS.keys())
def test_base_exception_from_a_handler_propagates_from_add_with_the_window_committed(
    handlers: Handlers, unraisable: list[Any], make: Callable[[], BaseException]
) -> None:
    handlers.raiser("a", make)
    handlers.record("b")
    expected = type(make())
    with ManualClock(0) as clock:
        stat = Stat("s", [SUM, COUNT], SECOND, 2)
        stat.add(1.0)
        with pytest.raises(expected):
            stat.add(2.0)  # max_samples close
        window = {"s.sum": 3.0, "s.count": 2.0}
        assert handlers.calls == [("a", window), ("b", window)]
        assert stat.get() == {SUM: 3.0, COUNT: 2.0}
        assert stat.count == 0
        stat.add(50.0)  # dropped: that window is closed, no dispatch, no raise
        assert len(handlers.calls) == 2
        clock.advance(1000)
        stat.add(4.0)  # closes the empty remainder: no event
        clock.advance(1000)
        with pytest.raises(expected):
            stat.add(5.0)  # time close of the window holding 4.0
        window = {"s.sum": 4.0, "s.count": 1.0}
        assert handlers.calls[2:] == [("a", window), ("b", window)]
        assert stat.count == 1  # 5.0 is in the new window
        handlers.close()
        handlers.handles.clear()
        del stat
    assert unraisable == []


def test_first_base_exception_wins_over_a_later_one(
    handlers: Handlers, unraisable: list[Any]
) -> None:
    handlers.raiser("ki", lambda: KeyboardInterrupt("first"))
    handlers.raiser("exit", lambda: SystemExit(3))
    handlers.raiser("boom", lambda: Boom("ordinary"))
    handlers.record("last")
    with pytest.raises(KeyboardInterrupt, match="first"):
        torchmon.log_event(Event("x", TS, {}))
    assert handlers.tags() == ["ki", "exit", "boom", "last"]
    assert [t for t, _ in unraisable] == [SystemExit, Boom]


def test_system_exit_displaces_an_earlier_ordinary_exception(
    handlers: Handlers, unraisable: list[Any]
) -> None:
    handlers.raiser("boom", lambda: Boom("ordinary"))
    handlers.raiser("exit", lambda: SystemExit(4))
    handlers.record("last")
    with pytest.raises(SystemExit) as info:
        torchmon.log_event(Event("x", TS, {}))
    assert info.value.code == 4
    assert handlers.tags() == ["boom", "exit", "last"]
    assert [t for t, _ in unraisable] == [Boom]


@pytest.mark.parametrize("make", BASE_EXCEPTIONS.values(), ids=BASE_EXCEPTIONS.keys())
def test_base_exception_while_a_stat_is_destroyed_is_unraisable(
    handlers: Handlers, unraisable: list[Any], make: Callable[[], BaseException]
) -> None:
    handlers.raiser("a", make)
    handlers.record("b")
    stat = Stat("d", [SUM], W)
    stat.add(2.0)
    del stat  # must not raise here: there is no caller to raise to
    assert handlers.calls == [("a", {"d.sum": 2.0}), ("b", {"d.sum": 2.0})]
    assert [t for t, _ in unraisable] == [type(make())]


# --- faults at interpreter exit --------------------------------------------------

_EXIT_PRELUDE = """
import datetime as dt, json, sys
import torchmon as m

W = dt.timedelta(hours=100)
OUT = {out!r}

def to_file(e):
    with open(OUT, "a", encoding="utf-8") as f:
        f.write(json.dumps(e.data, sort_keys=True) + "\\n")
"""


def _exit_child(tmp_path: Any, body: str) -> tuple[Any, list[Any]]:
    out = tmp_path / "events.jsonl"
    proc = run_python(_EXIT_PRELUDE.format(out=str(out)) + body, timeout=60)
    lines = out.read_text(encoding="utf-8").splitlines() if out.exists() else []
    return proc, [json.loads(x) for x in lines]


@pytest.mark.parametrize(
    "raise_stmt, shown",
    [
        ("raise KeyboardInterrupt('ki at exit')", "KeyboardInterrupt"),
        ("raise SystemExit(9)", "SystemExit"),
        ("raise ValueError('plain at exit')", "ValueError"),
    ],
    ids=["KeyboardInterrupt", "SystemExit", "ValueError"],
)
def test_every_live_stat_is_emitted_at_exit_despite_a_raising_handler(
    tmp_path: Any, raise_stmt: str, shown: str
) -> None:
    proc, events = _exit_child(
        tmp_path,
        f"""
def boom(e):
    {raise_stmt}

m.register_event_handler(boom)
m.register_event_handler(to_file)  # registered after the raiser
stats = [m.Stat("s%d" % i, [m.COUNT], W) for i in range(3)]
for i, s in enumerate(stats):
    for _ in range(i + 1):
        s.add(1.0)
print("main done", flush=True)
""",
    )
    # the exit status is the program's, not the handler's (SystemExit(9) included)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "main done\n"
    assert proc.stderr.count("Exception ignored") == 3, proc.stderr
    assert proc.stderr.count(shown) >= 3, proc.stderr
    assert sorted(events, key=json.dumps) == [
        {"s0.count": 1.0},
        {"s1.count": 2.0},
        {"s2.count": 3.0},
    ]


def test_raising_unraisablehook_does_not_stop_dispatch(tmp_path: Any) -> None:
    """The second exception of a dispatch goes to sys.unraisablehook; if the hook
    itself raises, Python reports that and dispatch goes on."""
    proc, events = _exit_child(
        tmp_path,
        """
def bad_hook(args):
    raise RuntimeError("the hook itself fails")
sys.unraisablehook = bad_hook

def boom1(e):
    raise ValueError("first")
def boom2(e):
    raise KeyError("second")

hs = [m.register_event_handler(boom1), m.register_event_handler(boom2),
      m.register_event_handler(to_file)]
try:
    m.log_event(m.Event("x", dt.datetime(2020, 1, 1), {"n": 1}))
except ValueError as exc:
    print("caught", exc, flush=True)
s = m.Stat("d", [m.SUM], W)
s.add(3.0)
del s  # both exceptions unraisable, the hook fails twice
print("continued", flush=True)
for h in hs:
    m.unregister_event_handler(h)
""",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "caught first\ncontinued\n"
    assert "the hook itself fails" in proc.stderr
    assert events == [{"n": 1}, {"d.sum": 3.0}]


# --- registration changes during a Stat event's dispatch ------------------------


def test_handler_unregistering_itself_during_a_stat_event_then_raising(
    handlers: Handlers, unraisable: list[Any]
) -> None:
    box: list[EventHandlerHandle] = []

    def once(e: Event) -> None:
        handlers.calls.append(("once", e.data))
        torchmon.unregister_event_handler(box[0])
        raise Boom("after unregistering itself")

    handlers.record("before")
    box.append(handlers.add(once))
    handlers.record("after")
    with ManualClock(0):
        stat = Stat("u", [SUM], SECOND, 1)
        with pytest.raises(Boom):
            stat.add(1.0)
        assert handlers.tags() == ["before", "once", "after"]
        handlers.calls.clear()
        stat2 = Stat("v", [SUM], SECOND, 1)
        stat2.add(2.0)  # once is gone: no raise
        assert handlers.calls == [("before", {"v.sum": 2.0}), ("after", {"v.sum": 2.0})]
        del stat, stat2
    assert unraisable == []


@pytest.mark.parametrize("trigger", ["log_event", "stat"])
def test_handler_registered_during_a_dispatch_sees_the_next_event_not_the_current(
    handlers: Handlers, trigger: str
) -> None:
    """Not written down in docs/compatibility.md (test_divergences leaves it open);
    this pins the implementation's snapshot semantics
    (crates/torchmon-core/src/registry.rs: a dispatch runs the handlers registered
    when it started): a handler registered while an event is dispatched is not
    called for that event, only for later ones."""
    late: list[Any] = []

    def registrar(e: Event) -> None:
        handlers.calls.append(("registrar", e.name))
        if not late and len(handlers.calls) == 1:
            handlers.add(lambda ev: late.append(ev.name))

    handlers.add(registrar)
    handlers.record("after")
    with ManualClock(0):
        stat = Stat("r", [SUM], SECOND, 1)
        if trigger == "log_event":
            torchmon.log_event(Event("current", TS, {}))
            current = "current"
        else:
            stat.add(1.0)
            current = torchmon.STAT_EVENT
        assert late == []
        assert handlers.tags() == ["registrar", "after"]  # the rest of the dispatch ran
        torchmon.log_event(Event("next", TS, {}))
        assert late == ["next"]
        assert handlers.calls[0] == ("registrar", current)
        del stat


# --- a handler drops the last reference to the Stat it is called for ------------


def test_handler_dropping_the_last_reference_to_the_dispatching_stat(
    handlers: Handlers, unraisable: list[Any]
) -> None:
    holder: dict[str, Stat] = {}

    def dropper(e: Event) -> None:
        handlers.calls.append(("dropper", e.data))
        holder.clear()  # the Stat is kept alive by the running add() only

    handlers.add(dropper)
    with ManualClock(0) as clock:
        holder["s"] = Stat("z", [SUM, COUNT], SECOND)
        holder["s"].add(1.0)
        holder["s"].add(2.0)
        clock.advance(1000)
        holder["s"].add(5.0)  # closes window 1; the handler drops the Stat; then destroyed
    assert holder == {}
    gc.collect()
    # window 1 from the add, then the open window (holding 5.0) from the destruction
    assert handlers.calls == [
        ("dropper", {"z.sum": 3.0, "z.count": 2.0}),
        ("dropper", {"z.sum": 5.0, "z.count": 1.0}),
    ]
    assert unraisable == []


# --- unbounded recursion through log_event --------------------------------------


def test_unbounded_recursion_through_log_event_is_a_recursion_error() -> None:
    proc = run_python(
        """
        import datetime as dt, json, sys
        import torchmon as m

        depth = [0]
        def recurse(e):
            depth[0] += 1
            m.log_event(e)

        h = m.register_event_handler(recurse)
        unraisable = []
        sys.unraisablehook = lambda a: unraisable.append(a.exc_type.__name__)
        try:
            m.log_event(m.Event("r", dt.datetime(2020, 1, 1), {}))
        except RecursionError:
            result = "RecursionError"
        m.unregister_event_handler(h)
        seen = []
        h2 = m.register_event_handler(seen.append)
        m.log_event(m.Event("after", dt.datetime(2020, 1, 1), {}))
        m.unregister_event_handler(h2)
        print(json.dumps([result, depth[0] > 50, unraisable, len(seen)]))
        """,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["RecursionError", True, [], 1]


# --- raising handlers during garbage collection and on another thread -----------


def test_raising_handler_while_gc_collects_a_stat_in_a_cycle(
    handlers: Handlers, unraisable: list[Any]
) -> None:
    handlers.raiser("boom", lambda: Boom("in gc"))
    handlers.record("rec")

    class Holder:
        stat: Stat
        me: Holder

    gc.disable()
    try:
        for i in range(3):
            h = Holder()
            h.me = h
            h.stat = Stat(f"c{i}", [COUNT], W)
            h.stat.add(1.0)
            del h
        gc.collect()  # three Stats destroyed by the collector, each raising
    finally:
        gc.enable()
    assert sorted((d for t, d in handlers.calls if t == "rec"), key=json.dumps) == sorted(
        [{"c0.count": 1.0}, {"c1.count": 1.0}, {"c2.count": 1.0}], key=json.dumps
    )
    assert [t for t, _ in unraisable] == [Boom, Boom, Boom]


def test_raising_handler_while_a_stat_is_destroyed_on_another_thread(
    handlers: Handlers, unraisable: list[Any]
) -> None:
    handlers.raiser("boom", lambda: Boom("on a thread"))
    handlers.record("rec")
    after: list[str] = []

    def worker() -> None:
        s = Stat("t", [SUM], W)
        s.add(6.0)
        del s
        after.append("thread went on")

    t = threading.Thread(target=worker)
    t.start()
    t.join(30)
    assert not t.is_alive()
    assert after == ["thread went on"]
    assert [d for tag, d in handlers.calls if tag == "rec"] == [{"t.sum": 6.0}]
    assert [t for t, _ in unraisable] == [Boom]
