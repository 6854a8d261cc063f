"""torchmon.flush(): every live Stat's open window now, AsyncEventHandler
queues drained, buffering sinks flushed; the Stats go on (docs/api.md,
docs/reliability.md "Flush on demand")."""

from __future__ import annotations

import datetime as dt
import gc
import threading
import time
from typing import Any

import pytest
from conftest import Recorder
from support import run_python

import torchmon

W60 = dt.timedelta(seconds=60)


def windows(rec: Recorder, name: str) -> list[dict[str, object]]:
    return [d for d in rec.stat_data if any(k.startswith(name + ".") for k in d)]


def test_flush_emits_every_open_window_now_and_the_stats_go_on(recorder: Recorder) -> None:
    a = torchmon.Stat("flush.a", [torchmon.COUNT, torchmon.SUM], W60)
    b = torchmon.Stat("flush.b", [torchmon.MAX], W60)
    for v in (1.0, 2.0, 3.0):
        a.add(v)
    b.add(7.0)
    assert windows(recorder, "flush.a") == []
    assert torchmon.flush() is True
    assert windows(recorder, "flush.a") == [{"flush.a.count": 3.0, "flush.a.sum": 6.0}]
    assert windows(recorder, "flush.b") == [{"flush.b.max": 7.0}]
    assert a.count == 0
    assert a.get() == {torchmon.COUNT: 3.0, torchmon.SUM: 6.0}
    # A new window: the next flush has only what came after.
    a.add(10.0)
    torchmon.flush()
    assert windows(recorder, "flush.a")[-1] == {"flush.a.count": 1.0, "flush.a.sum": 10.0}
    # Nothing open: nothing emitted.
    before = len(recorder.events)
    torchmon.flush()
    assert windows(recorder, "flush.a")[len(windows(recorder, "flush.a")) :] == []
    assert all(not any(k.startswith("flush.") for k in e.data) for e in recorder.events[before:])


def test_flush_emits_wait_counter_windows(recorder: Recorder) -> None:
    counter = torchmon.WaitCounter("flush.wait", window_size=W60)
    with counter.guard():
        pass
    with counter.guard():
        pass
    torchmon.flush()
    (window,) = windows(recorder, "flush.wait")
    assert window["flush.wait.count"] == 2.0


def test_flush_goes_to_the_handlers_registered_now() -> None:
    stat = torchmon.Stat("flush.now", [torchmon.COUNT], W60)
    stat.add(1.0)
    late = Recorder()
    handle = torchmon.register_event_handler(late)
    try:
        torchmon.flush()
    finally:
        torchmon.unregister_event_handler(handle)
    assert windows(late, "flush.now") == [{"flush.now.count": 1.0}]


def test_flush_waits_for_async_handlers_and_leaves_them_open() -> None:
    seen: list[dict[str, object]] = []

    def slow(event: torchmon.Event) -> None:
        time.sleep(0.05)
        seen.append(event.data)

    handler = torchmon.AsyncEventHandler(slow)
    handle = torchmon.register_event_handler(handler)
    try:
        stat = torchmon.Stat("flush.async", [torchmon.COUNT], W60)
        for _ in range(4):
            torchmon.log_event(torchmon.Event("flush.ev", dt.datetime(2020, 1, 1), {}))
        stat.add(1.0)
        assert torchmon.flush() is True
        # Everything queued before (four events and the window) was handled.
        assert handler.pending == 0
        assert {"flush.async.count": 1.0} in seen
        assert len(seen) >= 5
        assert not handler.closed
        stat.add(2.0)
        torchmon.flush()
        assert seen[-1] == {"flush.async.count": 1.0}
    finally:
        torchmon.unregister_event_handler(handle)
        handler.close()


def test_flush_flushes_a_tensorboard_writer() -> None:
    class Writer:
        def __init__(self) -> None:
            self.scalars: list[tuple[str, float]] = []
            self.flushed_with: list[list[tuple[str, float]]] = []

        def add_scalar(self, tag: str, value: float, **kwargs: Any) -> None:
            self.scalars.append((tag, value))

        def flush(self) -> None:
            self.flushed_with.append(list(self.scalars))

    writer = Writer()
    handle = torchmon.register_event_handler(torchmon.TensorboardEventHandler(writer))
    try:
        stat = torchmon.Stat("flush.tb", [torchmon.SUM], W60)
        stat.add(5.0)
        torchmon.flush()
    finally:
        torchmon.unregister_event_handler(handle)
    # The writer was flushed after the window reached it.
    assert writer.flushed_with and ("flush.tb.sum", 5.0) in writer.flushed_with[-1]


def test_flush_from_another_thread(recorder: Recorder) -> None:
    stat = torchmon.Stat("flush.thread", [torchmon.COUNT], W60)
    stat.add(1.0)
    results: list[bool] = []
    thread = threading.Thread(target=lambda: results.append(torchmon.flush()))
    thread.start()
    thread.join(30)
    assert results == [True]
    assert windows(recorder, "flush.thread") == [{"flush.thread.count": 1.0}]


def test_a_raising_handler_does_not_stop_the_flush_and_its_error_is_raised_after() -> None:
    seen: list[dict[str, object]] = []

    def picky(event: torchmon.Event) -> None:
        seen.append(event.data)
        if "flush.bad.count" in event.data:
            raise KeyError("bad")

    handle = torchmon.register_event_handler(picky)
    try:
        bad = torchmon.Stat("flush.bad", [torchmon.COUNT], W60)
        good = torchmon.Stat("flush.good", [torchmon.COUNT], W60)
        bad.add(1.0)
        good.add(1.0)
        with pytest.raises(KeyError):
            torchmon.flush()
    finally:
        torchmon.unregister_event_handler(handle)
    assert {"flush.good.count": 1.0} in seen
    assert {"flush.bad.count": 1.0} in seen
    assert bad.count == good.count == 0


def test_stats_destroyed_after_a_flush_still_emit_their_window(recorder: Recorder) -> None:
    """Unlike the exit flush, flush() does not switch off the destruction flush."""
    torchmon.flush()
    stat = torchmon.Stat("flush.later", [torchmon.COUNT], W60)
    stat.add(1.0)
    del stat
    assert windows(recorder, "flush.later") == [{"flush.later.count": 1.0}]


@pytest.mark.parametrize(
    ("timeout", "error"),
    [("1", TypeError), (True, TypeError), (-1, ValueError), (float("nan"), ValueError)],
)
def test_bad_timeout(timeout: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="flush\\(timeout\\)"):
        torchmon.flush(timeout=timeout)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("timeout", "error"), [("1", TypeError), (-1.0, ValueError), (float("nan"), ValueError)]
)
def test_the_native_drain_checks_its_timeout_as_flush_does(
    timeout: object, error: type[Exception]
) -> None:
    """flush()'s drain of the AsyncEventHandlers (src/py_async.rs) shares
    AsyncEventHandler.flush's check of a timeout, in the one format
    (docs/api.md, introduction)."""
    with pytest.raises(error, match=r"^flush\(timeout\): timeout (must|is)"):
        torchmon._core._drain_async_handlers(timeout)  # type: ignore[arg-type]


def test_flush_with_a_timeout_returns_when_a_handler_waits_for_a_lock_the_caller_holds() -> None:
    """What a signal handler meets when it interrupted a handler holding a
    non-reentrant lock: flush(timeout) gives up at the deadline instead of
    waiting for ever; the window reaches the handler once the lock is free."""
    proc = run_python(
        """
        import datetime as dt, threading
        import torchmon as m
        lock = threading.Lock()
        seen = []
        def locked_sink(event):
            with lock:
                seen.append(event.data)
        h = m.register_event_handler(locked_sink)
        s = m.Stat("x", [m.COUNT], dt.timedelta(seconds=60))
        s.add(1.0)
        with lock:  # as if interrupted inside locked_sink
            print("result", m.flush(timeout=0.5))
        for _ in range(200):
            if seen:
                break
            threading.Event().wait(0.05)
        print("seen", seen)
        """,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "result False" in proc.stdout
    assert "seen [{'x.count': 1.0}]" in proc.stdout


def test_a_tensorboardx_writer_has_the_window_on_disk_when_flush_returns(tmp_path: Any) -> None:
    """tensorboardX's own flush() does not wait for its writer thread's queue;
    torchmon.flush() does, so a SIGKILL right after it loses nothing."""
    pytest.importorskip("tensorboardX")
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    logdir = tmp_path / "tb"
    proc = run_python(
        f"""
        import datetime as dt, os, signal
        from tensorboardX import SummaryWriter
        import torchmon as m
        writer = SummaryWriter({str(logdir)!r})
        m.register_event_handler(m.TensorboardEventHandler(writer))
        stat = m.Stat("tb.window", [m.COUNT, m.SUM], dt.timedelta(seconds=60))
        writer.add_scalar("warm", 1.0)
        for v in range(5):
            stat.add(float(v))
        m.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        """,
        timeout=60,
    )
    assert proc.returncode == -9, proc.stderr
    events = accumulator.EventAccumulator(str(logdir))
    events.Reload()
    assert [s.value for s in events.Scalars("tb.window.count")] == [5.0]
    assert [s.value for s in events.Scalars("tb.window.sum")] == [10.0]


def test_an_unhashable_tensorboard_handler_subclass_is_flushed_too() -> None:
    class Writer:
        flushed = 0

        def add_scalar(self, tag: str, value: float, **kwargs: Any) -> None:
            pass

        def flush(self) -> None:
            Writer.flushed += 1

    class Unhashable(torchmon.TensorboardEventHandler):
        __slots__ = ()

        def __eq__(self, other: object) -> bool:
            return self is other

    assert Unhashable.__hash__ is None
    handler = Unhashable(Writer())
    torchmon.flush()
    assert Writer.flushed == 1
    del handler
    torchmon.flush()
    assert Writer.flushed == 1


def test_a_failing_writer_flush_is_raised_after_every_other_sink_was_flushed() -> None:
    flushed: list[str] = []

    class Writer:
        def __init__(self, name: str, fails: bool) -> None:
            self.name, self.fails = name, fails

        def add_scalar(self, tag: str, value: float, **kwargs: Any) -> None:
            pass

        def flush(self) -> None:
            flushed.append(self.name)
            if self.fails:
                raise OSError(f"{self.name} cannot flush")

    sinks = [
        torchmon.TensorboardEventHandler(Writer("a", fails=True)),
        torchmon.TensorboardEventHandler(Writer("b", fails=False)),
    ]
    with pytest.raises(OSError, match="a cannot flush"):
        torchmon.flush()
    assert flushed == ["a", "b"]
    del sinks


def test_sinks_that_send_over_the_network_are_flushed_after_the_local_ones() -> None:
    """A dead collector, waited for up to the OpenTelemetry handler's
    export_timeout, must not delay a local file (docs/sinks.md, "Unreachable
    collector"): the sinks marked ``_flushes_remotely`` go last, whatever the
    order they were made in."""
    from torchmon._flush import _register_flushable

    # Sinks an earlier test left in reference cycles (a raised exception's
    # traceback) are unregistered when collected: collect them now.
    gc.collect()
    order: list[str] = []

    class Sink:
        def __init__(self, name: str, remote: bool) -> None:
            self.name = name
            self._flushes_remotely = remote

        def flush(self) -> None:
            order.append(self.name)

    sinks = [Sink("collector", True), Sink("file", False), Sink("second collector", True)]
    for sink in sinks:
        _register_flushable(sink)
    torchmon.flush()
    assert order == ["file", "collector", "second collector"]
    del sinks  # unregistered when collected
