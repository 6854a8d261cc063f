"""Threads still logging while the interpreter exits (docs/reliability.md, the
section of that name; crates/torchmon-core/src/exit_gate.rs).

CPython 3.11-3.13 end a thread that asks for the GIL back after finalization
began with ``pthread_exit``; when that thread is inside a handler that released
the GIL, the forced unwind reaches torchmon's Rust frames and the process
aborted ("FATAL: exception not rethrown", 10 runs of 10 before the gate). The
exit gate, torchmon's last ``atexit`` step, keeps other threads out of handlers
from then on and waits (bounded) for those inside one to leave. Each test runs
a child interpreter and checks its exit status, its output and a file its
handlers wrote.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support import run_child_writing

_PRELUDE = """
import atexit, datetime as dt, json, os, sys, threading, time
OUT = {out!r}

def record(line):
    with open(OUT, "a", encoding="utf-8") as f:
        f.write(line + "\\n")
"""


def run_child(
    tmp_path: Path, body: str, timeout: float = 60.0
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    return run_child_writing(_PRELUDE, body, tmp_path / "out.txt", timeout)


@pytest.mark.parametrize("run", range(5))
def test_daemon_threads_logging_through_gil_releasing_handlers_at_exit(
    tmp_path: Path, run: int
) -> None:
    proc, _ = run_child(
        tmp_path,
        """
        import torchmon as m
        def releases_the_gil(e):
            time.sleep(0)
        m.register_event_handler(releases_the_gil)
        def spam():
            e = m.Event("x", dt.datetime(2020, 1, 1), {"a": 1})
            while True:
                m.log_event(e)
        for _ in range(2):
            threading.Thread(target=spam, daemon=True).start()
        time.sleep(0.05)
        print("main done", flush=True)
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "main done\n"
    assert proc.stderr == ""


@pytest.mark.parametrize("run", range(3))
def test_daemon_threads_closing_windows_into_a_writing_handler_at_exit(
    tmp_path: Path, run: int
) -> None:
    """The same through ``Stat.add``: 1 ms windows close on the daemon threads
    and each window is written to a file (the write releases the GIL)."""
    proc, lines = run_child(
        tmp_path,
        """
        import torchmon as m
        def write(e):
            record(json.dumps(e.data))
        m.register_event_handler(write)
        def add_forever(i):
            s = m.Stat("s%d" % i, [m.COUNT], dt.timedelta(milliseconds=1))
            while True:
                s.add(1.0)
        for i in range(3):
            threading.Thread(target=add_forever, args=(i,), daemon=True).start()
        time.sleep(0.1)
        print("main done", flush=True)
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "main done\n"
    assert proc.stderr == ""
    assert lines, "the daemon threads' windows were written while main ran"
    for line in lines:
        (count,) = json.loads(line).values()
        assert count >= 1


def test_a_handler_inside_a_gil_releasing_call_at_exit_finishes(tmp_path: Path) -> None:
    """A daemon thread is inside a handler, sleeping with the GIL released, when
    the main thread ends: the exit waits for it, so the handler's last line is
    written and the process exits cleanly (without the wait the thread is ended
    by pthread_exit when the sleep returns, and the process aborts)."""
    proc, lines = run_child(
        tmp_path,
        """
        import torchmon as m
        inside = threading.Event()
        def slow(e):
            inside.set()
            time.sleep(0.3)
            record("handler finished")
        m.register_event_handler(slow)
        threading.Thread(
            target=m.log_event, args=(m.Event("x", dt.datetime(2020, 1, 1), {}),), daemon=True
        ).start()
        inside.wait()
        print("main done", flush=True)
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "main done\n"
    assert proc.stderr == ""
    assert lines == ["handler finished"]


def test_the_exiting_thread_still_delivers_after_the_gate(tmp_path: Path) -> None:
    """An atexit handler registered before torchmon was imported runs after the
    gate closed: events it logs reach the handlers; a daemon thread's do not."""
    proc, lines = run_child(
        tmp_path,
        """
        def late():
            time.sleep(0.05)  # the daemon thread keeps logging meanwhile
            state = m._core._exit_gate_state()
            m.log_event(m.Event("from the exiting thread", dt.datetime(2020, 1, 1), {}))
            record("state %s" % json.dumps(state))
        atexit.register(late)  # before the import: runs after torchmon's atexit steps
        import torchmon as m
        def write(e):
            record(e.name)
        m.register_event_handler(write)
        def spam():
            e = m.Event("from a daemon thread", dt.datetime(2020, 1, 1), {})
            while True:
                m.log_event(e)
                time.sleep(0.001)
        threading.Thread(target=spam, daemon=True).start()
        time.sleep(0.05)
        record("main done")
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    main_done = lines.index("main done")
    assert "from a daemon thread" in lines[:main_done]
    after = lines[main_done + 1 :]
    assert after[-2] == "from the exiting thread", lines
    closed, running, skipped = json.loads(after[-1].removeprefix("state "))
    assert (closed, running) == (True, 0)
    # The daemon thread kept logging while the exit waited and ran `late`.
    assert skipped >= 1


def test_a_thread_holding_a_lock_around_log_event_does_not_hang_the_exit(
    tmp_path: Path,
) -> None:
    """Late threads skip handlers rather than wait at the gate: a daemon thread
    calling log_event with a lock held keeps releasing it, so an atexit handler
    that needs the lock after the gate closed still gets it."""
    proc, lines = run_child(
        tmp_path,
        """
        lock = threading.Lock()
        def needs_the_lock():
            with lock:
                record("atexit got the lock")
        atexit.register(needs_the_lock)  # runs after the gate closed
        import torchmon as m
        m.register_event_handler(lambda e: time.sleep(0))
        def spam():
            e = m.Event("x", dt.datetime(2020, 1, 1), {})
            while True:
                with lock:
                    m.log_event(e)
        for _ in range(2):
            threading.Thread(target=spam, daemon=True).start()
        time.sleep(0.05)
        """,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert lines == ["atexit got the lock"]


def test_a_handler_blocked_forever_delays_the_exit_only_by_the_bound(tmp_path: Path) -> None:
    """A daemon thread's handler that never returns (waiting with the GIL
    released) cannot be waited for: the gate gives up after its bound and the
    exit goes on (the blocked thread never asks for the GIL again)."""
    proc, lines = run_child(
        tmp_path,
        """
        def late():
            record("state %s" % json.dumps(m._core._exit_gate_state()))
        atexit.register(late)
        import torchmon as m
        inside = threading.Event()
        def blocks(e):
            inside.set()
            threading.Event().wait()
        m.register_event_handler(blocks)
        threading.Thread(
            target=m.log_event, args=(m.Event("x", dt.datetime(2020, 1, 1), {}),), daemon=True
        ).start()
        inside.wait()
        print("main done", flush=True)
        """,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "main done\n"
    assert proc.stderr == ""
    (state,) = lines
    closed, running, _ = json.loads(state.removeprefix("state "))
    assert (closed, running) == (True, 1)  # still inside when the wait gave up
