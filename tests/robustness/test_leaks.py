"""Leaks (docs/reliability.md): memory stays flat over a million operations, reference counts
are unchanged by dispatch, handlers are freed after unregistering.

The memory tests run in a fresh interpreter so that RSS measures torchmon alone.
RSS (``/proc/self/statm``) sees Rust allocations, which tracemalloc does not;
tracemalloc sees leaked Python objects exactly, but slows every allocation
about tenfold, so it runs over a tenth of the operations.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import weakref
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

import torchmon
from torchmon import SUM, Event, Stat
from torchmon.testing import ManualClock

TS = datetime(2020, 1, 1)
W = timedelta(hours=100)

_CHILD = r"""
import collections, datetime as dt, gc, json, os, sys, time, tracemalloc
import torchmon as m

MODE, SCALE = sys.argv[1], int(sys.argv[2])
TS = dt.datetime(2020, 1, 1)
W = dt.timedelta(hours=100)
PAGE = os.sysconf("SC_PAGE_SIZE")

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE

class Boom(Exception):
    pass

kept = collections.deque(maxlen=100)
def keep(e):
    kept.append(e.name)
def raise_on_capped(e):
    if "capped.count" in e.data:
        raise Boom("capped window")

handles = [m.register_event_handler(keep), m.register_event_handler(raise_on_capped)]
reused = m.Event("reused", TS, {"a": 1, "b": 2.5, "c": "x", "d": True})
windowed = m.Stat("windowed", [m.SUM, m.COUNT, m.MEAN, m.MIN, m.MAX, m.VALUE], W, 10)
capped = m.Stat("capped", [m.COUNT], W, 5)

def ops(n):
    # n operations: 40% log_event(reused), 10% log_event(new Event),
    # 40% add (a window closes every 10th), 10% add closing with a raising handler
    # (every 5th), caught here
    log_event, add, Event = m.log_event, windowed.add, m.Event
    for _ in range(n * 4 // 10):
        log_event(reused)
    for i in range(n // 10):
        log_event(Event("fresh", TS, {"i": i, "s": "text"}))
    for i in range(n * 4 // 10):
        add(float(i & 7))
    caught = 0
    for i in range(n // 10):
        # a fresh window each time: capped closes every 5th add and the handler raises
        if i % 5 == 0:
            capped_stat = m.Stat("capped", [m.COUNT], W, 5)
        try:
            capped_stat.add(1.0)
        except Boom:
            caught += 1
    return caught

def stats(n):
    # n Stats created and destroyed: half empty, half emitting on destruction
    Stat = m.Stat
    for i in range(n // 2):
        s = Stat("empty", [m.SUM], W)
        del s
    for i in range(n // 2):
        s = Stat("full", [m.SUM, m.COUNT], W)
        s.add(1.0)
        s.add(2.0)
        del s

work = {"ops": ops, "stats": stats}[MODE]
trace = os.environ.get("TRACE") == "1"
work(SCALE // 10)           # warm-up: caches, free lists, arenas
work(SCALE // 10)
gc.collect()
if trace:
    tracemalloc.start()
before_rss = rss()
before_traced = tracemalloc.get_traced_memory()[0] if trace else 0
t0 = time.perf_counter()
result = work(SCALE)
seconds = time.perf_counter() - t0
kept.clear()
gc.collect()
after_traced = tracemalloc.get_traced_memory()[0] if trace else 0
after_rss = rss()
top = []
if trace:
    snap = tracemalloc.take_snapshot()
    top = [str(s) for s in snap.statistics("lineno")[:5]]
for h in handles:
    m.unregister_event_handler(h)
del windowed, capped, reused
gc.collect()
print(json.dumps({
    "ops": SCALE, "seconds": seconds, "result": result,
    "rss_delta": after_rss - before_rss, "traced_delta": after_traced - before_traced,
    "top": top, "live_stats": m._core._live_stat_count(), "handlers": m._core._handler_count(),
}))
"""

RSS_BOUND = 2 * 1024 * 1024  # bytes; a leak of 8 bytes per op over 1e6 ops is 8 MB
TRACED_BOUND = 32 * 1024  # bytes; one leaked Event per op over 1e5 ops is > 5 MB


def run_child(mode: str, scale: int, trace: bool) -> dict[str, Any]:
    import os

    env = dict(os.environ, TRACE="1" if trace else "0")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, mode, str(scale)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the leak child did not finish within 120 s")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    out: dict[str, Any] = json.loads(proc.stdout)
    assert out["live_stats"] == 0
    assert out["handlers"] == 0
    return out


@pytest.mark.slow
def test_a_million_log_event_and_add_calls_keep_rss_flat() -> None:
    out = run_child("ops", 1_000_000, trace=False)
    assert out["result"] == 20_000  # the raising handler's exceptions reached the caller
    assert out["rss_delta"] < RSS_BOUND, out


@pytest.mark.slow
def test_log_event_and_add_leak_no_python_objects() -> None:
    out = run_child("ops", 100_000, trace=True)
    assert out["result"] == 2_000
    assert out["traced_delta"] < TRACED_BOUND, out


@pytest.mark.slow
def test_a_million_stats_created_and_destroyed_keep_rss_flat() -> None:
    out = run_child("stats", 1_000_000, trace=False)
    assert out["rss_delta"] < RSS_BOUND, out


@pytest.mark.slow
def test_stats_created_and_destroyed_leak_no_python_objects() -> None:
    out = run_child("stats", 20_000, trace=True)
    assert out["traced_delta"] < TRACED_BOUND, out


# --- reference counts and handler lifetime (in process) -------------------------


class Boom(Exception):
    pass


@pytest.fixture
def no_unraisable(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    seen: list[Any] = []
    # keep only the type: holding the exception would keep its traceback's frames alive
    monkeypatch.setattr(sys, "unraisablehook", lambda args: seen.append(args.exc_type))
    yield seen


def test_event_refcount_unchanged_after_dispatch(no_unraisable: list[Any]) -> None:
    def quiet(e: Event) -> None:
        e.data  # noqa: B018

    def boom(e: Event) -> None:
        raise Boom

    e = Event("rc", TS, {"a": 1})
    before = sys.getrefcount(e)
    handles = [torchmon.register_event_handler(h) for h in (quiet, boom, quiet, boom)]
    try:
        for _ in range(1000):
            with pytest.raises(Boom):
                torchmon.log_event(e)
        assert sys.getrefcount(e) == before
    finally:
        for h in handles:
            torchmon.unregister_event_handler(h)
    torchmon.log_event(e)
    assert sys.getrefcount(e) == before
    assert no_unraisable == [Boom] * 1000


def test_handler_refcount_restored_after_dispatch_and_unregister() -> None:
    def handler(e: Event) -> None:
        pass

    before = sys.getrefcount(handler)
    h = torchmon.register_event_handler(handler)
    registered = sys.getrefcount(handler)
    assert registered > before  # the registry holds it
    e = Event("rc", TS, {})
    calls: list[Event] = []
    h2 = torchmon.register_event_handler(calls.append)
    with ManualClock(0) as clock:
        stat = Stat("rc", [SUM], timedelta(seconds=1), 1)
        for _ in range(1000):
            torchmon.log_event(e)
            stat.add(1.0)  # max_samples=1: every add closes a window and dispatches
            clock.advance(1000)
        del stat
    torchmon.unregister_event_handler(h2)
    assert len(calls) == 2000
    assert sys.getrefcount(handler) == registered
    torchmon.unregister_event_handler(h)
    assert sys.getrefcount(handler) == before
    torchmon.unregister_event_handler(h)  # a no-op twice: must not drop a reference
    assert sys.getrefcount(handler) == before


class Sink:
    def __init__(self, raises: bool = False) -> None:
        self.raises = raises
        self.n = 0

    def __call__(self, e: Event) -> None:
        self.n += 1
        if self.raises:
            raise Boom

    def method(self, e: Event) -> None:
        self.__call__(e)


@pytest.mark.parametrize(
    "kind", ["callable-object", "bound-method", "raising-object", "raising-bound-method"]
)
def test_handler_is_freed_after_unregister(kind: str, no_unraisable: list[Any]) -> None:
    """No reference cycle either: freed by reference counting alone, gc disabled."""
    sink = Sink(raises=kind.startswith("raising"))
    ref = weakref.ref(sink)
    callback = sink.method if kind.endswith("bound-method") else sink
    gc.disable()
    h = torchmon.register_event_handler(callback)
    try:
        e = Event("life", TS, {"x": 1.5})
        with ManualClock(0) as clock:
            stat = Stat("life", [SUM], timedelta(seconds=1), 1)
            for _ in range(10):
                try:
                    torchmon.log_event(e)
                except Boom:
                    pass
                try:
                    stat.add(1.0)  # max_samples=1: closes a window, dispatches
                except Boom:
                    pass
                clock.advance(1000)
            del stat
        assert sink.n == 20
        del sink, callback
        assert ref() is not None  # the registry keeps it alive while registered
        torchmon.unregister_event_handler(h)
        assert ref() is None
    finally:
        torchmon.unregister_event_handler(h)  # no-op when the test got that far
        gc.enable()
    assert no_unraisable == []


def test_handler_registered_during_a_dispatch_is_freed_after_unregister() -> None:
    inner: list[Any] = []

    def outer(e: Event) -> None:
        if not inner:
            s = Sink()
            inner.append(weakref.ref(s))
            inner.append(torchmon.register_event_handler(s))

    h = torchmon.register_event_handler(outer)
    try:
        torchmon.log_event(Event("a", TS, {}))
        torchmon.log_event(Event("b", TS, {}))
        ref, handle = inner
        obj = ref()
        assert obj is not None and obj.n == 1  # saw "b" only
        del obj
        torchmon.unregister_event_handler(handle)
        assert ref() is None
    finally:
        torchmon.unregister_event_handler(h)
