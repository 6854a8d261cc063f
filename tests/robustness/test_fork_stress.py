"""Forks made while another thread is in the middle of torchmon's lazily
started work: the process's first window with a distribution, a Stat's first
window close, the async delivery, the exit steps (docs/reliability.md,
"fork", the audit of lazily initialised state). Every child must finish its
own recording and exit within a second; a hung one is killed by pid and
fails the test.

Each scenario runs in fresh interpreters; the pytest process never forks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

# A hung child never exits; a slow one (a loaded CI machine) may take a
# few hundred ms. docs/reliability.md gives the measured times.
CHILD_DEADLINE = 5.0

# One fresh interpreter: a thread makes the process's first Stat with a P99
# aggregation and closes its first window (building the first Distribution)
# while the main thread forks after `delay` seconds; the child does the same
# with its own Stat. Exit status 3: the child did not exit within a second.
_FIRST_DISPATCH = r"""
import os, sys, threading, time, warnings
from datetime import timedelta
import torchmon as monitor

warnings.simplefilter("ignore", DeprecationWarning)
monitor.register_event_handler(lambda event: None)

def first_windows():
    stat = monitor.Stat("x", [monitor.Aggregation.P99], timedelta(milliseconds=1))
    stat.add(1.0)
    time.sleep(0.002)
    stat.add(2.0)

thread = threading.Thread(target=first_windows)
thread.start()
time.sleep(float(sys.argv[1]))
pid = os.fork()
if pid == 0:
    first_windows()
    monitor.flush()
    os._exit(0)
thread.join()
deadline = time.monotonic() + CHILD_DEADLINE
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        sys.exit(0 if os.waitstatus_to_exitcode(status) == 0 else 4)
    time.sleep(0.005)
os.kill(pid, 9)
os.waitpid(pid, 0)
sys.exit(3)
"""


def test_no_child_hangs_when_forked_during_the_first_distribution_dispatch() -> None:
    # 100 processes, each forking once at a slightly different instant of
    # its first dispatch (1.5 to 3.3 ms after the thread started: the window
    # closes after 2 ms). Before the fix 30 of 37 such children hung.
    code = _FIRST_DISPATCH.replace("CHILD_DEADLINE", repr(CHILD_DEADLINE))
    outcomes: dict[int, int] = {}
    for attempt in range(100):
        delay = 0.0015 + 0.0002 * (attempt % 10)
        proc = subprocess.run(
            [sys.executable, "-c", code, str(delay)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        outcomes[proc.returncode] = outcomes.get(proc.returncode, 0) + 1
        assert proc.returncode in (0, 3), proc.stderr
    assert outcomes == {0: 100}, f"children hung (exit 3): {outcomes}"


# One interpreter: two threads keep closing first windows of new P99 Stats,
# their events going to a JSON lines sink and, through an AsyncEventHandler,
# to a slow sink (the delivery thread is busy most of the time), while the
# main thread forks 100 times. Each child records, logs and flushes, then
# exits; the parent times every child from fork to exit.
_DURING_CLOSE_AND_DELIVERY = r"""
import json, os, sys, threading, time, warnings
from datetime import datetime, timedelta
import torchmon as monitor

warnings.simplefilter("ignore", DeprecationWarning)
out = sys.argv[1]
monitor.register_event_handler(monitor.JsonlEventHandler(out))
monitor.register_event_handler(monitor.AsyncEventHandler(lambda event: time.sleep(0.0005)))
stop = threading.Event()

def first_closes(name):
    n = 0
    while not stop.is_set():
        stat = monitor.Stat(f"{name}.{n}", [monitor.Aggregation.P50, monitor.Aggregation.P99],
                            timedelta(milliseconds=1))
        stat.add(1.0)
        time.sleep(0.0011)
        stat.add(2.0)
        n += 1

threads = [threading.Thread(target=first_closes, args=(f"t{i}",)) for i in range(2)]
for thread in threads:
    thread.start()
results = []
for attempt in range(100):
    time.sleep(0.001 * (attempt % 4))
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        stat = monitor.Stat("child", [monitor.Aggregation.P99], timedelta(milliseconds=1))
        stat.add(1.0)
        time.sleep(0.002)
        stat.add(2.0)
        monitor.log_event(monitor.Event("child.event", datetime.now(), {"v": 1.0}))
        monitor.flush()
        os._exit(0)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        took = time.monotonic() - started
        if done:
            results.append([took, os.waitstatus_to_exitcode(status)])
            break
        if took > CHILD_DEADLINE:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            results.append([took, "hung"])
            break
        time.sleep(0.002)
stop.set()
for thread in threads:
    thread.join()
print(json.dumps(results))
"""


def _run(code: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_no_child_hangs_when_forked_during_first_closes_and_async_delivery(
    tmp_path: Path,
) -> None:
    code = _DURING_CLOSE_AND_DELIVERY.replace("CHILD_DEADLINE", repr(CHILD_DEADLINE))
    proc = _run(code, str(tmp_path / "events.jsonl"))
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.splitlines()[-1])
    assert len(results) == 100
    failed = [r for r in results if r[1] != 0]
    assert failed == [], f"{len(failed)} of 100 children hung or failed: {failed[:5]}"


# The main thread exits (its atexit steps, torchmon's exit flush among them,
# take a while: one step sleeps before and one after torchmon's), while a
# daemon thread forks in a loop. Each child records, flushes, writes one
# line and exits; the test reads the lines.
_DURING_EXIT = r"""
import atexit, os, sys, threading, time, warnings
from datetime import timedelta

warnings.simplefilter("ignore", DeprecationWarning)
out = sys.argv[1]
atexit.register(time.sleep, 0.5)  # runs after torchmon's exit steps
import torchmon as monitor
monitor.register_event_handler(monitor.JsonlEventHandler(out + ".events"))
atexit.register(time.sleep, 0.5)  # runs before them

def child():
    stat = monitor.Stat("child", [monitor.Aggregation.P99], timedelta(milliseconds=1))
    stat.add(1.0)
    time.sleep(0.002)
    stat.add(2.0)
    monitor.flush()
    with open(out, "a") as f:
        f.write(f"{os.getpid()} done\n")
    os._exit(0)

def fork_forever():
    while True:
        pid = os.fork()
        if pid == 0:
            child()
        with open(out, "a") as f:
            f.write(f"{pid} forked\n")
        time.sleep(0.005)

parent = monitor.Stat("parent", [monitor.Aggregation.P99], timedelta(hours=1))
for i in range(1000):
    parent.add(float(i))
threading.Thread(target=fork_forever, daemon=True).start()
time.sleep(0.05)
"""


def test_no_child_hangs_when_forked_while_the_parent_exits(tmp_path: Path) -> None:
    out = tmp_path / "children.txt"
    proc = _run(_DURING_EXIT, str(out), timeout=60)
    assert proc.returncode == 0, proc.stderr
    time.sleep(CHILD_DEADLINE)
    lines = out.read_text().split("\n") if out.exists() else []
    forked = {int(line.split()[0]) for line in lines if line.endswith(" forked")}
    done = {int(line.split()[0]) for line in lines if line.endswith(" done")}
    stranded = forked - done
    for pid in stranded:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # About 100 on an idle machine; a loaded one (CI's interpreters side by
    # side) managed 9.
    assert len(forked) >= 3, textwrap.shorten(out.read_text(), 500)
    assert stranded == set(), f"{len(stranded)} of {len(forked)} children never finished"
