"""AsyncEventHandler: a handler run on a background thread fed by a bounded queue.

Every wait is bounded: threads are joined with a timeout, `flush` gets one,
and the exit and fork scenarios run in a subprocess with a hard timeout.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support import run_python

import torchmon
from torchmon import AsyncEventHandler, Event
from torchmon.testing import ManualClock

LONG = 30.0  # seconds: only reached when something is broken
HOUR = timedelta(hours=1)


def event(i: int, **extra: Any) -> Event:
    return Event("async.test", datetime(2024, 1, 1), {"i": i, **extra})


@pytest.fixture
def make() -> Iterator[Any]:
    """Builds AsyncEventHandlers and closes them (and their threads) after the test."""
    made: list[AsyncEventHandler] = []
    handles: list[torchmon.EventHandlerHandle] = []

    def build(handler: Any, *, register: bool = False, **kwargs: Any) -> AsyncEventHandler:
        wrapper = AsyncEventHandler(handler, **kwargs)
        made.append(wrapper)
        if register:
            handles.append(torchmon.register_event_handler(wrapper))
        return wrapper

    yield build
    for handle in handles:
        torchmon.unregister_event_handler(handle)
    for wrapper in made:
        wrapper.close()


class Gate:
    """A handler that records events and holds on `release` for marked ones."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, e: Event) -> None:
        data = e.data
        if data.get("hold"):
            self.started.set()
            assert self.release.wait(LONG)
        self.seen.append(data)

    def ids(self) -> list[int]:
        return [d["i"] for d in self.seen]


def in_thread(target: Any) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_order_is_kept_across_thousands_of_events(make):
    seen: list[int] = []
    wrapper = make(lambda e: seen.append(e.data["i"]), register=True, maxsize=16, on_full="block")
    for i in range(5000):
        torchmon.log_event(event(i))
    assert wrapper.flush(LONG)
    assert seen == list(range(5000))
    assert wrapper.dropped == 0
    assert wrapper.pending == 0


def test_a_blocked_handler_does_not_block_the_caller_and_drops_count(make):
    gate = Gate()
    wrapper = make(gate, register=True, maxsize=8)
    torchmon.log_event(event(0, hold=True))
    assert gate.started.wait(LONG)

    def log_the_rest() -> None:
        for i in range(1, 8 + 5):
            torchmon.log_event(event(i))

    caller = in_thread(log_the_rest)
    caller.join(LONG)
    assert not caller.is_alive(), "the caller blocked on a full queue in drop mode"
    assert wrapper.pending == 8  # event 0 (in the handler) and 1..7
    assert wrapper.dropped == 5
    assert not wrapper.flush(timeout=0.05)  # still held
    gate.release.set()
    assert wrapper.flush(LONG)
    assert gate.ids() == list(range(8))
    assert wrapper.dropped == 5
    assert wrapper.pending == 0


def test_block_mode_waits_for_room_and_loses_nothing(make):
    gate = Gate()
    wrapper = make(gate, register=True, maxsize=4, on_full="block")
    torchmon.log_event(event(0, hold=True))
    assert gate.started.wait(LONG)
    logged = threading.Event()

    def log_the_rest() -> None:
        for i in range(1, 20):
            torchmon.log_event(event(i))
        logged.set()

    caller = in_thread(log_the_rest)
    deadline = time.monotonic() + LONG
    while wrapper.pending < 4 and time.monotonic() < deadline:
        time.sleep(0.005)
    # 4 events fit; the caller cannot finish while the handler holds.
    assert wrapper.pending == 4
    assert not logged.wait(0.1)
    assert wrapper.pending == 4
    gate.release.set()
    caller.join(LONG)
    assert not caller.is_alive()
    assert wrapper.flush(LONG)
    assert gate.ids() == list(range(20))
    assert wrapper.dropped == 0


def test_flush_times_out_then_succeeds(make):
    gate = Gate()
    wrapper = make(gate, maxsize=4)
    wrapper(event(0, hold=True))
    wrapper(event(1))
    assert gate.started.wait(LONG)
    assert wrapper.flush(0) is False
    assert wrapper.flush(timeout=0.02) is False
    gate.release.set()
    assert wrapper.flush(LONG) is True
    assert wrapper.flush() is True  # nothing pending
    assert gate.ids() == [0, 1]


def test_close_delivers_everything_then_drops_and_counts(make):
    seen: list[int] = []

    def slow(e: Event) -> None:
        time.sleep(0.001)
        seen.append(e.data["i"])

    wrapper = make(slow, maxsize=100)
    for i in range(50):
        wrapper(event(i))
    wrapper.close()
    assert seen == list(range(50))
    assert wrapper.closed
    assert wrapper.pending == 0
    wrapper.close()  # idempotent
    wrapper(event(99))
    assert wrapper.dropped == 1
    assert wrapper.flush(LONG)
    assert seen == list(range(50))


def test_context_manager_closes(make):
    seen: list[int] = []
    with AsyncEventHandler(lambda e: seen.append(e.data["i"])) as wrapper:
        assert isinstance(wrapper, AsyncEventHandler)
        for i in range(10):
            wrapper(event(i))
    assert wrapper.closed
    assert seen == list(range(10))


def test_events_are_snapshots(make):
    gate = Gate()
    wrapper = make(gate, maxsize=4)
    wrapper(event(0, hold=True))
    assert gate.started.wait(LONG)
    reused = event(1)
    wrapper(reused)
    reused.data = {"i": 2}
    reused.name = "renamed"
    wrapper(reused)
    gate.release.set()
    assert wrapper.flush(LONG)
    assert gate.ids() == [0, 1, 2]


@pytest.fixture
def unraisable(monkeypatch):
    seen: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    return seen


def test_handler_exceptions_are_unraisable_and_the_worker_goes_on(make, unraisable):
    seen: list[int] = []
    errors: list[BaseException] = []

    def flaky(e: Event) -> None:
        i = e.data["i"]
        if i % 3 == 1:
            err: BaseException = ValueError(i)
            errors.append(err)
            raise err
        if i == 5:
            err = KeyboardInterrupt()
            errors.append(err)
            raise err
        seen.append(i)

    wrapper = make(flaky)
    for i in range(9):
        wrapper(event(i))
    assert wrapper.flush(LONG)
    assert seen == [0, 2, 3, 6, 8]
    assert [u.exc_value for u in unraisable] == errors
    assert all(u.object is flaky for u in unraisable)
    assert wrapper.dropped == 0


def test_flush_and_close_from_the_own_handler_raise(make, unraisable):
    outcomes: list[str] = []
    holder: list[AsyncEventHandler] = []

    def reentrant(e: Event) -> None:
        for method in (holder[0].flush, holder[0].close):
            try:
                method()
            except RuntimeError as err:
                outcomes.append(str(err))

    holder.append(make(reentrant))
    holder[0](event(0))
    assert holder[0].flush(LONG)
    assert len(outcomes) == 2
    assert all("its own handler" in text for text in outcomes)
    assert not holder[0].closed
    assert unraisable == []


def test_stat_window_events_go_through(make):
    sums: list[float] = []
    wrapper = make(lambda e: sums.append(e.data["w.sum"]), register=True)
    with ManualClock(0) as clock:
        stat = torchmon.Stat("w", [torchmon.SUM], timedelta(milliseconds=10))
        for i in range(51):
            stat.add(float(i))  # one sample per window: adding closes the last
            clock.advance(10)
    assert wrapper.flush(LONG)
    assert sums == [float(i) for i in range(50)]


def test_log_event_from_several_threads_accounts_for_every_event(make):
    seen: list[tuple[int, int]] = []

    def record(e: Event) -> None:
        d = e.data
        seen.append((d["t"], d["i"]))

    wrapper = make(record, register=True, maxsize=64)
    per_thread = 2000

    def log(t: int) -> None:
        for i in range(per_thread):
            torchmon.log_event(Event("mt", datetime(2024, 1, 1), {"t": t, "i": i}))

    threads = [threading.Thread(target=log, args=(t,), daemon=True) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(LONG)
        assert not thread.is_alive()
    assert wrapper.flush(LONG)
    assert len(seen) == 4 * per_thread - wrapper.dropped
    for t in range(4):
        mine = [i for (tt, i) in seen if tt == t]
        assert mine == sorted(mine)


def test_properties_and_repr(make):
    def sink(e: Event) -> None:
        pass

    wrapper = make(sink, maxsize=7, on_full="block")
    assert wrapper.handler is sink
    assert wrapper.maxsize == 7
    assert wrapper.on_full == "block"
    assert (wrapper.dropped, wrapper.pending, wrapper.closed) == (0, 0, False)
    assert "maxsize=7" in repr(wrapper)
    assert AsyncEventHandler(sink).maxsize == 1024
    assert torchmon.handlers.AsyncEventHandler is AsyncEventHandler
    assert "AsyncEventHandler" in torchmon.__all__


@pytest.mark.parametrize(
    ("kwargs", "error", "names"),
    [
        ({"handler": None}, TypeError, "handler"),
        ({"handler": 3}, TypeError, "handler"),
        ({"maxsize": 0}, ValueError, "maxsize"),
        ({"maxsize": -5}, ValueError, "maxsize"),
        ({"maxsize": 10**30}, ValueError, "maxsize"),
        ({"maxsize": "8"}, TypeError, "maxsize"),
        ({"maxsize": 8.0}, TypeError, "maxsize"),
        ({"maxsize": True}, TypeError, "maxsize"),
        ({"on_full": "wait"}, ValueError, "on_full"),
        ({"on_full": None}, TypeError, "on_full"),
    ],
)
def test_bad_arguments(kwargs, error, names):
    args = {"handler": print, **kwargs}
    with pytest.raises(error, match=names):
        AsyncEventHandler(**args)


def test_bad_call_and_flush_arguments(make):
    wrapper = make(print)
    with pytest.raises(TypeError, match="event"):
        wrapper({"i": 1})
    with pytest.raises(ValueError, match="timeout"):
        wrapper.flush(-1)
    with pytest.raises(ValueError, match="timeout"):
        wrapper.flush(float("nan"))
    with pytest.raises(TypeError, match="timeout"):
        wrapper.flush("1")
    assert wrapper.pending == 0


# --- interpreter exit and fork, each in a fresh interpreter -----------------

_WRITER = """
import json, os, time
OUT = {out!r}

def write(record):
    with open(OUT, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\\n")

def slow_sink(e):
    time.sleep(0.002)
    write({{"pid": os.getpid(), "name": e.name, "data": e.data}})
"""


def run_child(tmp_path: Path, body: str, timeout: float = 60.0) -> tuple[Any, list[Any]]:
    out = tmp_path / "events.jsonl"
    code = _WRITER.format(out=str(out)) + body
    try:
        proc = run_python(code, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child did not exit within {timeout}s")
    lines = out.read_text(encoding="utf-8").splitlines() if out.exists() else []
    return proc, [json.loads(line) for line in lines]


def test_queued_events_and_last_stat_windows_are_delivered_at_exit(tmp_path):
    proc, records = run_child(
        tmp_path,
        """
import atexit

def late():
    # Registered before torchmon's hooks: runs after the drain.
    torchmon.log_event(torchmon.Event("late", datetime.datetime.now(), {}))

atexit.register(late)

import datetime
import torchmon

class ClosingSink:
    # Closes itself at exit, like tensorboardX's writers.
    def __init__(self):
        self.closed = False
        atexit.register(self.close)
    def close(self):
        self.closed = True
    def __call__(self, e):
        slow_sink(e)
        write({"name": e.name, "sink closed": self.closed})

ah = torchmon.AsyncEventHandler(ClosingSink(), maxsize=1000)
torchmon.register_event_handler(ah)
stat = torchmon.Stat("s", [torchmon.SUM], datetime.timedelta(hours=1))
stat.add(2.0)
for i in range(200):
    torchmon.log_event(torchmon.Event("e", datetime.datetime.now(), {"i": i}))
print("main done", ah.pending > 0)
""",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.startswith("main done")
    events = [r for r in records if "data" in r]
    states = [(r["name"], r["sink closed"]) for r in records if "sink closed" in r]
    assert [r["data"]["i"] for r in events[:200]] == list(range(200))
    assert [r["name"] for r in events[200:]] == ["torch.monitor.Stat", "late"]
    assert events[200]["data"] == {"s.sum": 2.0}
    # The queue and the Stat's window were delivered before the sink's own
    # exit hook closed it; "late" was logged after that, and delivered
    # synchronously.
    assert states == [("e", False)] * 200 + [("torch.monitor.Stat", False), ("late", True)]


def test_a_dropped_handler_still_drains_before_exit(tmp_path):
    proc, records = run_child(
        tmp_path,
        """
import datetime, gc
import torchmon
ah = torchmon.AsyncEventHandler(slow_sink)
for i in range(100):
    ah(torchmon.Event("e", datetime.datetime.now(), {"i": i}))
del ah
gc.collect()
""",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert [r["data"]["i"] for r in records] == list(range(100))


def test_dropped_handlers_release_their_threads():
    """Thousands of handlers dropped without close(): each ended thread is
    joined, not kept until exit with its stack mapped (tens of thousands of
    those left the process unable to start a thread; docs/reliability.md).
    A dropped handler whose queue still drains is waited for at exit as
    before: its events all arrive."""
    code = """
import datetime, sys, time
import torchmon

def maps():
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)

def threads():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))

got = []
def slow(event):
    time.sleep(0.001)
    got.append(event.data["i"])

draining = torchmon.AsyncEventHandler(slow)
for i in range(300):
    draining(torchmon.Event("e", datetime.datetime.now(), {"i": i}))
del draining  # still draining while the others come and go

base = maps()
for i in range(3000):
    handler = torchmon.AsyncEventHandler(lambda event: None)
    del handler
    if i % 100 == 99:
        time.sleep(0.01)  # lets the ending threads release their handler
time.sleep(0.3)
handler = torchmon.AsyncEventHandler(lambda event: None)
del handler  # joins those that ended
print(maps() - base, threads(), flush=True)

import atexit
atexit.register(lambda: print(got == list(range(300)), flush=True))
"""
    proc = run_python(code, timeout=120)
    assert proc.returncode == 0, proc.stderr
    grown, threads, delivered = proc.stdout.split()
    # Before: two mappings (stack and guard page) per handler, 6,000 here.
    assert int(grown) < 600, proc.stdout
    assert int(threads) < 100, proc.stdout
    assert delivered == "True"


def test_fork_child_gets_its_own_worker(tmp_path):
    proc, records = run_child(
        tmp_path,
        """
import datetime, os, threading, time, warnings
import torchmon

# Python >= 3.12 warns at fork() in a process with threads (the worker is one).
warnings.simplefilter("ignore", DeprecationWarning)
release = threading.Event()

def sink(e):
    if e.data.get("hold"):
        assert release.wait(30)
    slow_sink(e)

def ev(tag, **extra):
    return torchmon.Event(tag, datetime.datetime.now(), extra)

ah = torchmon.AsyncEventHandler(sink, maxsize=16)
torchmon.register_event_handler(ah)
torchmon.log_event(ev("parent-held", hold=True))
torchmon.log_event(ev("parent-queued"))
pid = os.fork()
if pid == 0:
    ok = ah.pending == 0
    torchmon.log_event(ev("child"))
    ok = ah.flush(20) and ok
    ah.close()
    os._exit(0 if ok else 3)
release.set()
deadline = time.monotonic() + 30
while True:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    if time.monotonic() > deadline:
        os.kill(pid, 9)
        raise SystemExit("child hung")
    time.sleep(0.01)
torchmon.log_event(ev("parent-after"))
ah.close()
print(os.waitstatus_to_exitcode(status), os.getpid(), pid)
""",
    )
    assert proc.returncode == 0, proc.stderr
    code, parent, child = (int(x) for x in proc.stdout.split())
    assert code == 0
    by_pid: dict[int, list[str]] = {}
    for record in records:
        by_pid.setdefault(record["pid"], []).append(record["name"])
    assert by_pid == {
        parent: ["parent-held", "parent-queued", "parent-after"],
        child: ["child"],
    }


def test_block_mode_handler_logging_to_its_own_full_queue_drops_instead_of_hanging():
    # In a subprocess: were it to wait for itself, only the timeout would end it.
    code = """
import datetime, torchmon
holder = []
def reentrant(e):
    if e.data["i"] == 0:
        for i in (1, 2):
            holder[0](torchmon.Event("again", datetime.datetime.now(), {"i": i}))
ah = torchmon.AsyncEventHandler(reentrant, maxsize=1, on_full="block")
holder.append(ah)
ah(torchmon.Event("first", datetime.datetime.now(), {"i": 0}))
print(ah.flush(20), ah.dropped)
ah.close()
"""
    try:
        proc = run_python(code, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the handler waited for itself")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "2"]
