"""Nothing is lost at interpreter exit (docs/reliability.md, "Nothing lost at
exit"; docs/compatibility.md, "a Stat still alive at interpreter exit").

Each child creates many Stats, each with its own name and its own number of
samples (all 1.0, so COUNT == SUM == the number of adds), held in every way a
Stat can outlive the main module: module globals, unreachable reference cycles
with the garbage collector disabled (and enabled), a blocked daemon thread's
frame, non-daemon threads that are still adding when the main thread has
finished, and containers of those. A handler appends one JSON line per event to
a file and flushes it; the test reads the file after the child exited and
checks that every Stat's window is there exactly once: none missing, none twice.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support import run_child_writing

_PRELUDE = """
import datetime as dt, gc, json, os, sys, threading, time
import torchmon as m

OUT = {out!r}
W = dt.timedelta(hours=100)

def to_file(e):
    with open(OUT, "a", encoding="utf-8") as f:
        f.write(json.dumps({{"name": e.name, "data": e.data}}) + "\\n")
        f.flush()
        os.fsync(f.fileno())

HANDLE = m.register_event_handler(to_file)

def make(name, n):
    s = m.Stat(name, [m.COUNT, m.SUM], W)
    for _ in range(n):
        s.add(1.0)
    return s
"""


def run_child(tmp_path: Path, body: str, timeout: float = 60.0) -> tuple[Any, Counter[str]]:
    """Runs prelude + body; returns (process, Counter of 'name=count' per Stat event)."""
    proc, lines = run_child_writing(_PRELUDE, body, tmp_path / "events.jsonl", timeout)
    seen: Counter[str] = Counter()
    for line in lines:
        event = json.loads(line)
        assert event["name"] == "torch.monitor.Stat", event
        data = event["data"]
        (name,) = {k.rsplit(".", 1)[0] for k in data}
        count, total = data[f"{name}.count"], data[f"{name}.sum"]
        assert count == total, data  # every sample is 1.0
        seen[f"{name}={int(count)}"] += 1
    return proc, seen


def expected(prefix: str, counts: list[int]) -> Counter[str]:
    return Counter(f"{prefix}{i}={n}" for i, n in enumerate(counts))


def assert_exactly_once(seen: Counter[str], want: Counter[str]) -> None:
    missing = want - seen
    extra = seen - want
    assert not missing and not extra, f"missing {sorted(missing)}; extra/duplicates {sorted(extra)}"


COUNTS = [1, 2, 3, 5, 8, 13, 21, 34, 55, 89]


def test_module_globals_and_containers_are_emitted_once(tmp_path: Path) -> None:
    proc, seen = run_child(
        tmp_path,
        f"""
        COUNTS = {COUNTS!r}
        for i, n in enumerate(COUNTS):
            globals()["g%d" % i] = make("g%d" % i, n)
        in_list = [make("l%d" % i, n) for i, n in enumerate(COUNTS)]
        in_dict = {{i: make("d%d" % i, n) for i, n in enumerate(COUNTS)}}
        class Owner:
            pass
        Owner.attr = [make("c%d" % i, n) for i, n in enumerate(COUNTS)]  # class attribute
        print("main done", flush=True)
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout == "main done\n"
    want = Counter[str]()
    for prefix in "gldc":
        want += expected(prefix, COUNTS)
    assert_exactly_once(seen, want)


@pytest.mark.parametrize("gc_enabled", [False, True], ids=["gc-disabled", "gc-enabled"])
def test_stats_in_unreachable_reference_cycles_are_emitted_once(
    tmp_path: Path, gc_enabled: bool
) -> None:
    """With gc disabled the cycles are only torn down (if at all) during shutdown;
    with gc enabled the final collection may destroy them after the exit flush:
    either way, one event per Stat."""
    proc, seen = run_child(
        tmp_path,
        f"""
        COUNTS = {COUNTS!r}
        if not {gc_enabled!r}:
            gc.disable()
        gc.collect()

        class Node:
            pass

        for i, n in enumerate(COUNTS):
            a, b = Node(), Node()
            a.other, b.other = b, a           # a two-object cycle
            a.stat = make("cyc%d" % i, n)
            lst = [make("self%d" % i, n)]
            lst.append(lst)                   # a list containing itself
            del a, b, lst
        print(gc.isenabled(), flush=True)
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout == f"{gc_enabled}\n"
    assert_exactly_once(seen, expected("cyc", COUNTS) + expected("self", COUNTS))


def test_stats_in_blocked_daemon_threads_frames_are_emitted_once(tmp_path: Path) -> None:
    proc, seen = run_child(
        tmp_path,
        f"""
        COUNTS = {COUNTS!r}
        ready = threading.Semaphore(0)
        never = threading.Event()

        def worker(i, n):
            local = make("daemon%d" % i, n)       # only in this frame
            nested = {{"x": make("nested%d" % i, n)}}
            ready.release()
            never.wait()                          # blocked when the main thread exits

        for i, n in enumerate(COUNTS):
            threading.Thread(target=worker, args=(i, n), daemon=True).start()
        for _ in COUNTS:
            assert ready.acquire(timeout=30)
        print("main done", flush=True)
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout == "main done\n"
    assert_exactly_once(seen, expected("daemon", COUNTS) + expected("nested", COUNTS))


def test_stats_of_non_daemon_threads_finishing_at_exit_are_emitted_once(tmp_path: Path) -> None:
    """The threads keep adding after the main thread finished (Python joins them at
    shutdown): a Stat local to the thread is emitted when its frame ends, one left
    in a global by the thread by the exit flush. Their samples all count."""
    proc, seen = run_child(
        tmp_path,
        f"""
        COUNTS = {COUNTS!r}
        LEFT = []
        main = threading.main_thread()
        started = threading.Semaphore(0)

        def worker(i, n):
            local = make("local%d" % i, 0)
            left = make("left%d" % i, 0)
            LEFT.append(left)
            started.release()
            while main.is_alive():               # until the main thread has finished
                time.sleep(0.001)
            for _ in range(n):
                local.add(1.0)
                left.add(1.0)
                time.sleep(0)

        for i, n in enumerate(COUNTS):
            threading.Thread(target=worker, args=(i, n)).start()
        for _ in COUNTS:
            assert started.acquire(timeout=30)
        print("main done", flush=True)
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout == "main done\n"
    assert_exactly_once(seen, expected("local", COUNTS) + expected("left", COUNTS))


def test_everything_at_once_with_a_window_closed_before_exit(tmp_path: Path) -> None:
    """All of the above in one process, plus Stats whose earlier windows were closed
    by max_samples during the run (those are emitted then, the rest at exit)."""
    proc, seen = run_child(
        tmp_path,
        """
        gc.disable()
        g = make("all_global", 3)
        class Node:
            pass
        n = Node(); n.me = n; n.stat = make("all_cycle", 4); del n
        ready = threading.Event()
        def daemon():
            s = make("all_daemon", 5)
            ready.set()
            threading.Event().wait()
        threading.Thread(target=daemon, daemon=True).start()
        assert ready.wait(30)
        main = threading.main_thread()
        def late():
            s = make("all_late", 0)
            while main.is_alive():
                time.sleep(0.001)
            for _ in range(6):
                s.add(1.0)
        threading.Thread(target=late).start()
        capped = m.Stat("all_capped", [m.COUNT, m.SUM], W, 4)
        for _ in range(10):
            capped.add(1.0)  # 4 emitted now; the other 6 dropped (same window)
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert_exactly_once(
        seen,
        Counter(["all_global=3", "all_cycle=4", "all_daemon=5", "all_late=6", "all_capped=4"]),
    )
