"""torchmon after fork (docs/reliability.md, "fork").

A forked child must be able to add, log, register and unregister without
deadlocking, even when another parent thread was in the middle of registering,
unregistering, logging or closing a window at the instant of the fork (a lock
held by that thread would stay held forever in the child, where the thread does
not exist). The child also starts from the parent's state, as with torch:
the registered handlers are inherited, but not the open windows' samples: the
child's Stats start with empty windows (docs/reliability.md, "fork").

Every scenario runs in a fresh interpreter (the pytest process is not forked),
and every child is waited for with a timeout: a hung child is killed and
reported as a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest
from support import run_python

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

OUTER_TIMEOUT = 120.0

_PRELUDE = r"""
import datetime as dt, json, os, signal, sys, threading, time, warnings
import torchmon as m
from torchmon.testing import ManualClock

# Python 3.12+ warns about fork() in a multi-threaded process: that is the point here.
warnings.simplefilter("ignore", DeprecationWarning)
TS = dt.datetime(2020, 1, 1)
W = dt.timedelta(hours=100)
CHILD_TIMEOUT = 20.0

def wait_child(pid, timeout=CHILD_TIMEOUT):
    # (exit code or None if it hung and was killed)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.002)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None

def write_result(path, obj):
    # raw os calls: a buffered file's lock may have been held at fork time
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, json.dumps(obj).encode())
    os.close(fd)

stop = threading.Event()
hammered = [0]

def hammer():
    # register / unregister / log_event / window closes, in a tight loop
    stat = m.Stat("hammer", [m.SUM], W, 2)
    seen = []
    while not stop.is_set():
        h = m.register_event_handler(lambda e: seen.append(len(e.data)))
        m.log_event(m.Event("hammer", TS, {"i": hammered[0]}))
        stat.add(1.0)
        stat.add(1.0)  # max_samples=2: closes and dispatches
        m.unregister_event_handler(h)
        del seen[:]
        hammered[0] += 1

def child_work(inherited_count):
    # what every child does; returns a result dict
    got = []
    h = m.register_event_handler(lambda e: got.append(e.name))
    m.log_event(m.Event("child", TS, {"pid": os.getpid()}))
    s = m.Stat("child_stat", [m.COUNT], W, 3)
    for _ in range(7):
        s.add(1.0)            # closes at the 3rd add (one Stat event); the rest are dropped
    s2 = m.Stat("child_stat2", [m.COUNT], W)
    s2.add(1.0)
    del s2                    # a destruction flush
    m.unregister_event_handler(h)
    h2 = m.register_event_handler(lambda e: None)
    m.unregister_event_handler(h2)
    return {"got": got, "handlers_at_start": inherited_count,
            "handlers_at_end": m._core._handler_count()}
"""

# log_event, the max_samples close, the destruction flush
_EXPECTED_GOT = ["child", "torch.monitor.Stat", "torch.monitor.Stat"]


def run_parent(body: str) -> dict[str, Any]:
    try:
        proc = run_python(_PRELUDE + body, timeout=OUTER_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the parent did not finish within {OUTER_TIMEOUT}s (a deadlock?)")
    assert proc.returncode == 0, f"exit code {proc.returncode}\nstderr:\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_os_fork_while_another_thread_hammers_the_registry(tmp_path: Any) -> None:
    """50 forks while a parent thread registers, unregisters, logs and closes
    windows in a tight loop; each child must finish its own work."""
    out = run_parent(
        f"""
import sys
sys.setswitchinterval(1e-5)   # the hammer thread is interrupted anywhere
FORKS = 50
t = threading.Thread(target=hammer, daemon=True)
t.start()
while hammered[0] < 100:
    time.sleep(0.001)
results, hung, codes = [], 0, []
at_first_fork = hammered[0]
for k in range(FORKS):
    time.sleep(0.001 * (k % 5))
    path = os.path.join({str(tmp_path)!r}, "child%d.json" % k)
    pid = os.fork()
    if pid == 0:
        signal.alarm(int(CHILD_TIMEOUT) + 5)   # belt and braces: never outlive the test
        try:
            write_result(path, child_work(m._core._handler_count()))
            code = 0
        except BaseException as exc:
            write_result(path, {{"error": repr(exc)}})
            code = 3
        os._exit(code)
    code = wait_child(pid)
    if code is None:
        hung += 1
    codes.append(code)
    if os.path.exists(path):
        with open(path) as f:
            results.append(json.load(f))
stop.set()
t.join(30)
print(json.dumps({{"hung": hung, "codes": codes, "results": results,
                   "hammered_during_forks": hammered[0] - at_first_fork}}))
""",
    )
    assert out["hung"] == 0, f"{out['hung']} of 50 children deadlocked (killed after 20 s)"
    assert out["codes"] == [0] * 50
    assert len(out["results"]) == 50
    assert out["hammered_during_forks"] > 50  # the hammer really ran between the forks
    for r in out["results"]:
        assert r["got"] == _EXPECTED_GOT, r
        # the child's own handlers are gone again; what it inherited stays
        assert r["handlers_at_end"] == r["handlers_at_start"]
        # the hammer thread had 0 or 1 handler registered at the fork
        assert r["handlers_at_start"] in (0, 1)


def test_multiprocessing_fork_context_while_another_thread_hammers(tmp_path: Any) -> None:
    out = run_parent(
        f"""
import multiprocessing as mp
sys.setswitchinterval(1e-5)
ctx = mp.get_context("fork")

def target(path):
    write_result(path, child_work(m._core._handler_count()))

def pool_task(i):
    r = child_work(m._core._handler_count())
    return r["got"]

if __name__ == "__main__":
    t = threading.Thread(target=hammer, daemon=True)
    t.start()
    while hammered[0] < 100:
        time.sleep(0.001)
    hung, codes, results = 0, [], []
    for k in range(10):
        path = os.path.join({str(tmp_path)!r}, "proc%d.json" % k)
        p = ctx.Process(target=target, args=(path,))
        p.start()
        p.join(CHILD_TIMEOUT)
        if p.is_alive():
            hung += 1
            p.kill()
            p.join()
        codes.append(p.exitcode)
        if os.path.exists(path):
            with open(path) as f:
                results.append(json.load(f))
    pool_ok = None
    with ctx.Pool(2) as pool:
        try:
            pool_ok = pool.map_async(pool_task, range(8)).get(CHILD_TIMEOUT * 2)
        except mp.TimeoutError:
            hung += 1
            pool.terminate()
    stop.set()
    t.join(30)
    print(json.dumps({{"hung": hung, "codes": codes, "results": results, "pool": pool_ok}}))
""",
    )
    assert out["hung"] == 0
    assert out["codes"] == [0] * 10
    assert [r["got"] for r in out["results"]] == [_EXPECTED_GOT] * 10
    assert out["pool"] == [_EXPECTED_GOT] * 8


def test_child_inherits_the_handlers_but_starts_with_empty_windows(tmp_path: Any) -> None:
    """The child's Stat starts with an empty window (the window the child closes holds
    the child's samples only; the parent's are the parent's to log), and the
    parent's handlers are registered in the child (the registry is process
    memory). Nothing the child does reaches the parent."""
    out = run_parent(
        f"""
parent_seen = []
child_path = os.path.join({str(tmp_path)!r}, "child.json")

def recorder(e):
    parent_seen.append([os.getpid(), e.name, e.data])

handle = m.register_event_handler(recorder)
clock = ManualClock(0).__enter__()
s = m.Stat("inh", [m.COUNT, m.SUM], dt.timedelta(seconds=1))
for v in (1.0, 2.0, 3.0):
    s.add(v)
capped = m.Stat("cap", [m.COUNT, m.SUM], W, 5)
capped.add(100.0)
capped.add(100.0)
pid = os.fork()
if pid == 0:
    signal.alarm(20)
    try:
        s.add(10.0)
        s.add(20.0)
        clock.advance(1000)
        s.add(100.0)              # closes the window: the child's 2 samples only
        for _ in range(5):
            capped.add(1.0)       # the child's 5: max_samples reached
        m.log_event(m.Event("from-child", TS, {{}}))
        mine = [x for x in parent_seen if x[0] == os.getpid()]
        write_result(child_path, {{"events": [x[1:] for x in mine],
                                   "handlers": m._core._handler_count(),
                                   "open": s.count, "get": s.get()[m.COUNT]}})
    finally:
        os._exit(0)
code = wait_child(pid)
with open(child_path) as f:
    child = json.load(f)
print(json.dumps({{"code": code, "child": child, "parent_seen": parent_seen,
                   "parent_open": s.count, "parent_get": s.get()[m.COUNT],
                   "parent_handlers": m._core._handler_count()}}))
clock.__exit__(None, None, None)
m.unregister_event_handler(handle)
""",
    )
    assert out["code"] == 0
    child = out["child"]
    # the parent's handler ran in the child, for the child's events
    assert child["events"] == [
        ["torch.monitor.Stat", {"inh.count": 2.0, "inh.sum": 30.0}],
        ["torch.monitor.Stat", {"cap.count": 5.0, "cap.sum": 5.0}],
        ["from-child", {}],
    ]
    assert child["handlers"] == 1
    assert child["open"] == 1  # the 100.0 in the child's new window
    assert child["get"] == 2.0
    # the parent is untouched: its window still holds its own 3 samples
    assert out["parent_seen"] == []
    assert out["parent_open"] == 3
    assert out["parent_get"] == 0.0
    assert out["parent_handlers"] == 1


def test_child_can_use_an_inherited_jsonl_handler_whose_lock_a_parent_thread_held(
    tmp_path: Any,
) -> None:
    """A parent thread logs through a JsonlEventHandler in a tight loop; the
    handler holds its lock across ``write`` (which releases the GIL), so most
    forks happen while it is held. Before torchmon._forksafe, 19 of 20 children
    hung on that lock in their first log_event."""
    out = run_parent(
        f"""
path = os.path.join({str(tmp_path)!r}, "events.jsonl")
sink = m.JsonlEventHandler(path)
handle = m.register_event_handler(sink)
spinning = threading.Event()

def spam():
    e = m.Event("parent", TS, {{"a": 1}})
    while not stop.is_set():
        m.log_event(e)
        spinning.set()

t = threading.Thread(target=spam, daemon=True)
t.start()
assert spinning.wait(30)
hung, codes = 0, []
for k in range(20):
    pid = os.fork()
    if pid == 0:
        signal.alarm(int(CHILD_TIMEOUT) + 5)
        m.log_event(m.Event("child%d" % k, TS, {{}}))
        os._exit(0)
    code = wait_child(pid, timeout=5)
    hung += code is None
    codes.append(code)
stop.set()
t.join(30)
m.unregister_event_handler(handle)
sink.close()
names = {{e.name for e in m.read_jsonl(path)}}
print(json.dumps({{"hung": hung, "codes": codes,
                   "child_lines": sorted(n for n in names if n.startswith("child"))}}))
""",
    )
    assert out["hung"] == 0
    assert out["codes"] == [0] * 20
    # every child wrote its line through the inherited handler
    assert out["child_lines"] == sorted(f"child{k}" for k in range(20))


def test_no_lazy_lookup_after_import_a_fork_cannot_strand_one(tmp_path: Any) -> None:
    """torchmon fills every lazily initialised cell when it is imported. A cell
    that one thread is initialising when another forks stays "being initialised"
    in the child for ever (its first use there hung). Here a thread is held
    inside what was the lazy lookup of ``collections.abc.Mapping`` (the first
    Event built from a non-dict mapping) while the main thread forks; and
    every module the bindings look things up in is replaced by one that fails,
    after import, to show that no lookup is left for later."""
    out = run_parent(
        """
import collections.abc, types
real = {name: sys.modules[name] for name in ("collections.abc", "datetime")}
entered, release = threading.Event(), threading.Event()

class Held(types.ModuleType):
    def __getattr__(self, name):
        entered.set()
        release.wait(5)
        return getattr(real[self.__name__], name)

class Mapping(collections.abc.Mapping):
    def __getitem__(self, key):
        return {"a": 1}[key]
    def __iter__(self):
        return iter(["a"])
    def __len__(self):
        return 1

class Hostile(types.ModuleType):
    def __getattr__(self, name):
        raise AssertionError("torchmon looked up %s.%s after import" % (self.__name__, name))

m.Event("warm-up", TS, {})  # PyO3's datetime C-API pointer: an atomic, set on first use
sys.modules["collections.abc"] = Held("collections.abc")
t = threading.Thread(target=lambda: m.Event("e", TS, Mapping()))
t.start()
held = entered.wait(0.5)
pid = os.fork()
if pid == 0:
    signal.alarm(int(CHILD_TIMEOUT) + 5)
    for name in real:
        sys.modules[name] = Hostile(name)
    try:
        got = []
        h = m.register_event_handler(got.append)
        m.log_event(m.Event("child", TS, Mapping()))
        s = m.Stat("s", [m.COUNT], dt.timedelta(seconds=1), 1)
        s.add(1.0)          # a Stat event: its timestamp is datetime.now()
        repr(s)             # shows the window as a timedelta
        m.unregister_event_handler(h)
        code = 0 if [e.name for e in got] == ["child", m.STAT_EVENT] else 4
    except BaseException:
        code = 3
    os._exit(code)
release.set()
t.join(30)
sys.modules.update(real)
print(json.dumps({"held": held, "code": wait_child(pid, timeout=10)}))
""",
    )
    assert out["held"] is False, "the Mapping lookup happened after import"
    assert out["code"] == 0


def test_a_lock_a_parent_thread_took_while_waiting_for_the_gil_is_usable_in_the_child() -> None:
    """A thread that has taken a sink lock inside ``acquire()`` and waits for
    the GIL to return from it has not yet flagged the lock as held: the
    child's lock said ``locked()`` False but could not be taken (the JSON
    lines handler's first window hung, about 1 child in 1,500 forks under
    load). Here the forking thread keeps the GIL (a 10 s switch interval and
    a busy loop) from the moment it releases the lock to the fork, so the
    waiting thread is caught in exactly that state."""
    code = r"""
import os, sys, threading, time
import torchmon
from torchmon._forksafe import new_lock

torchmon._lifecycle._before_fork()  # the fork's own imports, done now: they would let go of the GIL
sys.setswitchinterval(10)
lock = new_lock()
lock.acquire()
started = threading.Event()

def take():
    started.set()
    lock.acquire()
    lock.release()

threading.Thread(target=take, daemon=True).start()
started.wait()
time.sleep(0.2)  # the thread is now blocked inside acquire()
lock.release()
deadline = time.perf_counter() + 0.01
while time.perf_counter() < deadline:
    pass  # keeps the GIL: the thread takes the lock, then waits for the GIL
pid = os.fork()
if pid == 0:
    os._exit(0 if lock.acquire(timeout=2) else 1)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""
    result = run_python(code, timeout=OUTER_TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0"], "the child could not take the lock"
