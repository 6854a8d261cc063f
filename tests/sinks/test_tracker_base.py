"""The tracker sinks' shared delivery (torchmon/handlers/_tracker.py), with a
subclass whose ``_send`` records or fails on demand: batches, order, the
bounded queue and its drop count, one stderr line per outage and one at
recovery, a bounded flush, the exit, and a forked child's empty queue."""

from __future__ import annotations

import os
import threading
import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from support import emit_open_windows, registered, run_python
from tracker_fake import Fake

import torchmon
from torchmon import Aggregation, Event, Stat
from torchmon.testing import ManualClock

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def windows(name: str, values: list[float]) -> None:
    """One window of Stat ``name`` per value, closed by the next add (a
    manual clock): no torchmon.flush(), which would wait for the sink."""
    with ManualClock(0) as clock:
        stat = Stat(name, [Aggregation.MEAN], timedelta(seconds=1))
        for value in values:
            stat.add(value)
            clock.advance(1000)
        stat.add(-1.0)  # closes the last one: -1.0 is the window after them
    del stat  # emits that one


def test_rows_steps_and_order() -> None:
    sink = Fake()
    with registered(sink):
        stat = Stat("loss", [Aggregation.MEAN, Aggregation.COUNT], timedelta(hours=1))
        other = Stat("lr", [Aggregation.VALUE], timedelta(hours=1))
        for i in range(3):
            stat.add(float(i))
            other.add(0.5)
            emit_open_windows(stat, other)
        torchmon.log_event(Event("epoch_end", datetime.now(), {"epoch": 1}))
        assert sink.flush(5.0)
    sink.close()
    rows = sink.rows()
    by_key: dict[str, list[tuple[float, int]]] = {}
    for key, value, step, timestamp_ms in rows:
        by_key.setdefault(key, []).append((value, step))
        assert abs(timestamp_ms / 1000 - time.time()) < 60
    assert by_key["loss.mean"] == [(0.0, 1), (1.0, 2), (2.0, 3)]
    assert by_key["loss.count"] == [(1.0, 1), (1.0, 2), (1.0, 3)]
    assert by_key["lr.value"] == [(0.5, 1), (0.5, 2), (0.5, 3)]
    assert sink.others == [("epoch_end", {"epoch": 1})]
    assert sink.dropped == 0 and sink.pending == 0


def test_step_callable_and_batch_size() -> None:
    step = [100]
    sink = Fake(step=lambda: step[0], batch_size=4)
    with registered(sink):
        stat = Stat("a", [Aggregation.MEAN, Aggregation.MAX, Aggregation.MIN], timedelta(hours=1))
        for i in range(5):
            stat.add(float(i))
            step[0] += 10
            emit_open_windows(stat)
        assert sink.flush(5.0)
    sink.close()
    assert {row[2] for row in sink.rows()} == {110, 120, 130, 140, 150}
    # Whole windows per batch: 3 rows each, at most 4 rows.
    assert all(len(batch) == 3 for batch in sink.batches)


def test_outage_bounded_queue_one_line_each(capfd: pytest.CaptureFixture[str]) -> None:
    sink = Fake(max_queue=5, retry_interval=0.05, export_timeout=0.5)
    sink.down.set()
    with registered(sink):
        windows("x", [float(i) for i in range(20)])  # 21 windows
        start = time.monotonic()
        assert not sink.flush()
        assert time.monotonic() - start < 2.0
        # Nothing new since that flush timed out: no second wait.
        start = time.monotonic()
        assert not sink.flush()
        assert time.monotonic() - start < 0.2
        assert sink.dropped == 16 and sink.pending == 5
        sink.down.clear()
        assert sink.flush(5.0)
    sink.close()
    values = [row[1] for row in sink.rows()]
    assert values == [16.0, 17.0, 18.0, 19.0, -1.0]  # the newest kept, in order
    err = capfd.readouterr().err
    assert err.count("were not delivered to the fake: ConnectionRefusedError: refused") == 1
    assert err.count("delivering to the fake again; 16 windows were dropped meanwhile") == 1


def test_slow_tracker_does_not_slow_logging() -> None:
    sink = Fake(export_timeout=1.0)
    sink.slow = 0.2
    with registered(sink):
        with ManualClock(0) as clock:
            stat = Stat("y", [Aggregation.MEAN], timedelta(seconds=1))
            start = time.monotonic()
            for value in (1.0, 2.0, 3.0, 4.0):
                stat.add(value)  # closes the previous window: no wait for the tracker
                clock.advance(1000)
            assert time.monotonic() - start < 0.15
        assert sink.flush(5.0)
    sink.close()
    assert [row[1] for row in sink.rows()] == [1.0, 2.0, 3.0]


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match=r"^FakeTracker\(max_queue\): max_queue must be an int"):
        Fake(max_queue=1.5)
    with pytest.raises(ValueError, match=r"^FakeTracker\(batch_size\): batch_size must be >= 1"):
        Fake(batch_size=0)
    with pytest.raises(ValueError, match=r"^FakeTracker\(export_timeout\): export_timeout must"):
        Fake(export_timeout=0)
    with pytest.raises(TypeError, match=r"^FakeTracker\(step\): step must be None or a callable"):
        Fake(step=3)


def test_after_close_ignored() -> None:
    sink = Fake()
    sink.close()
    sink(Event(torchmon.STAT_EVENT, datetime.now(), {"a.mean": 1.0}))
    assert sink.pending == 0
    sink.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_child_starts_empty() -> None:
    code = f"""
    import os, sys, threading, time
    sys.path.insert(0, {TESTS!r})
    from tracker_fake import Fake
    from datetime import timedelta
    import torchmon
    sink = Fake(retry_interval=0.05)
    sink.down.set()
    torchmon.register_event_handler(sink)
    stat = torchmon.Stat("x", [torchmon.Aggregation.MEAN], timedelta(hours=1))
    stat.add(1.0); torchmon.flush(0.1); stat.add(2.0); torchmon.flush(0.1)
    assert sink.pending == 2, sink.pending
    pid = os.fork()
    if pid == 0:
        ok = sink.pending == 0 and sink._thread is None and sink.dropped == 0
        sink.down.clear()
        stat.add(5.0); torchmon.flush()
        ok = ok and sink.flush(5.0) and [r[1] for r in sink.rows()] == [5.0]
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    sink.down.clear()
    assert sink.flush(5.0)
    assert [r[1] for r in sink.rows()] == [1.0, 2.0], sink.rows()
    print("ok")
    """
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_exit_delivers_after_local_sinks(tmp_path: Any) -> None:
    code = f"""
    import sys, time
    sys.path.insert(0, {TESTS!r})
    from tracker_fake import Fake
    from datetime import timedelta
    import torchmon
    sink = Fake(export_timeout=0.5, retry_interval=0.05)
    sink.down.set()   # down for ever: the exit waits export_timeout, no more
    torchmon.register_event_handler(sink)
    torchmon.register_event_handler(torchmon.JsonlEventHandler({str(tmp_path / "e.jsonl")!r}))
    stat = torchmon.Stat("x", [torchmon.Aggregation.MEAN], timedelta(hours=1))
    stat.add(1.0)
    """
    start = time.monotonic()
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - start < 15
    assert len((tmp_path / "e.jsonl").read_text().splitlines()) == 1
    assert result.stderr.count("were not delivered to the fake") == 1, result.stderr


def test_burst_beyond_max_queue_counted_said_once_and_flush_false(
    capfd: pytest.CaptureFixture[str],
) -> None:
    sink = Fake(max_queue=5)
    sink.slow = 0.05  # a healthy tracker, slower than the burst
    with registered(sink):
        windows("b", [float(i) for i in range(40)])  # 41 windows at once
        assert not sink.flush(10.0)  # every queued window went, but some were dropped
        assert sink.pending == 0 and sink.dropped > 0
        windows("c", [1.0])
        assert sink.flush(10.0)  # none dropped since the previous flush
    sink.close()
    delivered = len(sink.rows())
    assert delivered + sink.dropped == 41 + 2
    err = capfd.readouterr().err
    assert err.count("more than max_queue=5 windows wait for the fake") == 1, err
    assert err.count(f"{sink.dropped} were dropped in all (max_queue=5)") == 1, err


def test_exit_with_the_tracker_down_says_what_is_lost_and_dropped() -> None:
    code = f"""
    import sys
    sys.path.insert(0, {TESTS!r})
    from tracker_fake import Fake
    from datetime import timedelta
    import torchmon
    from torchmon.testing import ManualClock
    sink = Fake(export_timeout=0.5, retry_interval=0.05, max_queue=5)
    sink.down.set()
    torchmon.register_event_handler(sink)
    with ManualClock(0) as clock:
        stat = torchmon.Stat("x", [torchmon.Aggregation.MEAN], timedelta(seconds=1))
        for i in range(21):
            stat.add(float(i))
            clock.advance(1000)
    """
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    err = result.stderr
    assert "stay queued" not in err, err
    # 20 windows closed by the adds and the open one emitted at exit: 5
    # kept, 16 dropped.
    want = "5 windows still queued were not delivered and are lost; 16 were dropped in all"
    assert err.count(want) == 1, err


def test_flush_with_timeout_each_step_during_an_outage_one_helper(
    capfd: pytest.CaptureFixture[str],
) -> None:
    sink = Fake(retry_interval=0.5)
    sink.down.set()
    most = 0
    with registered(sink):
        stat = Stat("z", [Aggregation.MEAN], timedelta(hours=1))
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            stat.add(1.0)
            torchmon.flush(timeout=0)
            helpers = [t for t in threading.enumerate() if t.name == "torchmon-flush"]
            most = max(most, len(helpers))
            time.sleep(0.005)
        sink.down.clear()
        assert sink.flush(10.0) or sink.dropped
    sink.close()
    assert most <= 1
    lines = [line for line in capfd.readouterr().err.splitlines() if "FakeTracker" in line]
    # The outage's line and the recovery's (the one below could come too).
    assert len(lines) <= 3, lines


def test_torchmon_flush_false_when_a_tracker_flush_times_out() -> None:
    sink = Fake(export_timeout=0.2)
    sink.slow = 1.0
    with registered(sink):
        stat = Stat("w", [Aggregation.MEAN], timedelta(hours=1))
        stat.add(1.0)
        assert torchmon.flush() is False
        assert sink.flush(5.0)
        sink.slow = 0.0
        assert torchmon.flush() is True
    sink.close()
