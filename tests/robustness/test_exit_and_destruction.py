"""What happens to a Stat's open window at interpreter exit (docs/internals.md,
"Exit"; docs/compatibility.md).

torch 2.13 segfaults when a Stat is still alive at exit and loses its last
window; torchmon emits the open window to the handlers before shutdown, once.
Every scenario runs in a fresh interpreter. The handlers append one JSON line
per event to a file, which the test reads after the child has exited, so what
the child prints (or fails to print) during shutdown cannot hide anything.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import run_child_writing

STAT_EVENT = "torch.monitor.Stat"

# Prepended to every child: a handler that appends each event to OUT.
_PRELUDE = """
import datetime as dt, gc, json, sys, threading
import torchmon as m

OUT = {out!r}
W = dt.timedelta(hours=100)

def to_file(e):
    with open(OUT, "a", encoding="utf-8") as f:
        f.write(json.dumps({{"name": e.name, "data": e.data}}) + "\\n")

HANDLE = m.register_event_handler(to_file)
"""


def run_child(tmp_path: Path, body: str, timeout: float = 60.0) -> tuple[Any, list[Any]]:
    """Runs the prelude + body; returns (CompletedProcess, events written to the file)."""
    proc, lines = run_child_writing(_PRELUDE, body, tmp_path / "events.jsonl", timeout)
    return proc, [json.loads(line) for line in lines]


def stat_event(data: dict[str, float]) -> dict[str, Any]:
    return {"name": STAT_EVENT, "data": data}


def assert_clean_exit(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"exit code {proc.returncode}\nstderr:\n{proc.stderr}"
    assert proc.stderr == "", proc.stderr


def test_module_global_stat_is_emitted_at_exit(tmp_path):
    proc, events = run_child(
        tmp_path,
        """
        loss = m.Stat("loss", [m.SUM, m.COUNT, m.MAX], W)
        loss.add(1.0)
        loss.add(2.0)
        print("main done")
        """,
    )
    assert_clean_exit(proc)
    assert proc.stdout == "main done\n"
    assert events == [stat_event({"loss.sum": 3.0, "loss.count": 2.0, "loss.max": 2.0})]


def test_several_live_stats_are_each_emitted_once_at_exit(tmp_path):
    proc, events = run_child(
        tmp_path,
        """
        a = m.Stat("a", [m.SUM], W)
        b = m.Stat("b", [m.MEAN], W, 10)
        empty = m.Stat("empty", [m.SUM], W)  # no samples: nothing to emit
        noaggs = m.Stat("noaggs", [], W)
        a.add(1.5)
        b.add(2.0)
        b.add(4.0)
        noaggs.add(9.0)
        """,
    )
    assert_clean_exit(proc)
    assert sorted(events, key=json.dumps) == sorted(
        [
            stat_event({"a.sum": 1.5}),
            stat_event({"b.mean": 3.0}),
            stat_event({}),
        ],
        key=json.dumps,
    )


def test_stat_in_a_reference_cycle_is_emitted_at_exit(tmp_path):
    proc, events = run_child(
        tmp_path,
        """
        gc.disable()  # the cycle stays uncollected until shutdown

        class Holder:
            pass

        h = Holder()
        h.me = h
        h.stat = m.Stat("cyc", [m.SUM, m.COUNT], W)
        h.stat.add(5.0)
        h.stat.add(6.0)
        del h  # unreachable now, but alive
        """,
    )
    assert_clean_exit(proc)
    assert events == [stat_event({"cyc.sum": 11.0, "cyc.count": 2.0})]


def test_stat_in_a_daemon_threads_frame_is_emitted_at_exit(tmp_path):
    proc, events = run_child(
        tmp_path,
        """
        ready = threading.Event()
        never = threading.Event()

        def worker():
            s = m.Stat("daemon", [m.SUM, m.MIN], W)
            s.add(7.0)
            s.add(-1.0)
            ready.set()
            never.wait()  # blocked when the main thread exits

        threading.Thread(target=worker, daemon=True).start()
        assert ready.wait(30)
        print("main done")
        """,
    )
    assert_clean_exit(proc)
    assert proc.stdout == "main done\n"
    assert events == [stat_event({"daemon.sum": 6.0, "daemon.min": -1.0})]


@pytest.mark.skipif(
    (3, 12) <= sys.version_info[:3] < (3, 12, 3),
    reason="CPython 3.12.0-3.12.2 start no thread at exit, and tensorboardX's writer "
    "starts one at its first write (docs/compatibility.md)",
)
def test_tensorboardx_writer_created_after_import_gets_the_exit_flush(tmp_path):
    """tensorboardX closes its writers from atexit; the exit flush must come first."""
    pytest.importorskip("tensorboardX")
    pytest.importorskip("tensorboard")
    logdir = tmp_path / "tb"
    proc, events = run_child(
        tmp_path,
        f"""
        from tensorboardX import SummaryWriter

        writer = SummaryWriter(logdir={str(logdir)!r})
        m.register_event_handler(m.TensorboardEventHandler(writer))
        s = m.Stat("exit", [m.SUM, m.COUNT], W)
        for i in range(4):
            s.add(i)
        # no flush, no close: the process simply ends
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert events == [stat_event({"exit.sum": 6.0, "exit.count": 4.0})]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    scalars = {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert scalars == {"exit.sum": [6.0], "exit.count": [4.0]}


def test_handler_raising_at_exit_is_reported_and_exit_code_is_zero(tmp_path):
    proc, events = run_child(
        tmp_path,
        """
        class ExitBoom(Exception):
            pass

        def boom(e):
            raise ExitBoom("raised by a handler at exit")

        m.register_event_handler(boom)
        m.register_event_handler(to_file)  # registered after the raiser: still runs
        s = m.Stat("x", [m.SUM], W)
        s.add(1.0)
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Exception ignored" in proc.stderr
    assert "ExitBoom" in proc.stderr
    assert "raised by a handler at exit" in proc.stderr
    # to_file is registered twice (before and after the raiser): both calls happen.
    assert events == [stat_event({"x.sum": 1.0})] * 2


def test_no_double_emission_exit_flush_then_destruction(tmp_path):
    """The exit flush emits the window; the Stat's destruction later in shutdown
    (module globals are cleared) finds it empty and emits nothing."""
    proc, events = run_child(
        tmp_path,
        """
        g = m.Stat("g", [m.SUM, m.COUNT], W)
        g.add(2.0)
        g.add(3.0)
        holder = {"s": m.Stat("h", [m.MAX], W)}
        holder["s"].add(4.0)
        """,
    )
    assert_clean_exit(proc)
    assert sorted(events, key=json.dumps) == sorted(
        [stat_event({"g.sum": 5.0, "g.count": 2.0}), stat_event({"h.max": 4.0})],
        key=json.dumps,
    )


def test_no_double_emission_after_max_samples_flush_or_explicit_delete(tmp_path):
    """A window closed by max_samples, or a Stat deleted before exit, is not
    emitted again at exit; later adds to a full window stay dropped."""
    proc, events = run_child(
        tmp_path,
        """
        full = m.Stat("full", [m.SUM], W, 2)
        full.add(1.0)
        full.add(2.0)  # emitted here
        full.add(100.0)  # dropped: the window is closed
        gone = m.Stat("gone", [m.SUM], W)
        gone.add(5.0)
        del gone  # emitted here
        gc.collect()
        with open(OUT, "a", encoding="utf-8") as f:
            f.write(json.dumps({"name": "marker", "data": {}}) + "\\n")
        """,
    )
    assert_clean_exit(proc)
    assert events == [
        stat_event({"full.sum": 3.0}),
        stat_event({"gone.sum": 5.0}),
        {"name": "marker", "data": {}},
    ]


def test_stat_alive_at_exit_via_sys_exit_and_uncaught_exception(tmp_path):
    """The exit flush also runs when the program ends by sys.exit or an exception."""
    proc, events = run_child(
        tmp_path,
        """
        s = m.Stat("exit", [m.COUNT], W)
        s.add(1.0)
        sys.exit(3)
        """,
    )
    assert proc.returncode == 3, proc.stderr
    assert events == [stat_event({"exit.count": 1.0})]

    (tmp_path / "events.jsonl").unlink()
    proc, events = run_child(
        tmp_path,
        """
        s = m.Stat("exit", [m.COUNT], W)
        s.add(1.0)
        s.add(1.0)
        raise RuntimeError("the program failed")
        """,
    )
    assert proc.returncode == 1
    assert "RuntimeError: the program failed" in proc.stderr
    assert events == [stat_event({"exit.count": 2.0})]


def test_handler_unregistered_before_exit_sees_nothing(tmp_path):
    proc, events = run_child(
        tmp_path,
        """
        s = m.Stat("quiet", [m.SUM], W)
        s.add(1.0)
        m.unregister_event_handler(HANDLE)
        """,
    )
    assert_clean_exit(proc)
    assert events == []


def test_exit_flush_with_handlers_that_use_the_api(tmp_path):
    """A handler running in the exit flush can still log events."""
    proc, events = run_child(
        tmp_path,
        """
        def chain(e):
            if e.name == m.STAT_EVENT and "first.sum" in e.data:
                m.log_event(m.Event("chained", dt.datetime(2020, 1, 1), {"n": 1}))

        m.register_event_handler(chain)
        first = m.Stat("first", [m.SUM], W)
        first.add(8.0)
        """,
    )
    assert_clean_exit(proc)
    assert events == [stat_event({"first.sum": 8.0}), {"name": "chained", "data": {"n": 1}}]


def test_destruction_flush_in_process_order(tmp_path):
    """Deleting the last reference emits at once, on the deleting thread."""
    proc, events = run_child(
        tmp_path,
        """
        order = []
        m.register_event_handler(lambda e: order.append(threading.current_thread().name))
        s = m.Stat("d", [m.SUM], W)
        s.add(1.0)
        order.append("before del")
        del s
        order.append("after del")
        print(json.dumps(order))
        """,
    )
    assert_clean_exit(proc)
    assert json.loads(proc.stdout) == ["before del", "MainThread", "after del"]
    assert events == [stat_event({"d.sum": 1.0})]
