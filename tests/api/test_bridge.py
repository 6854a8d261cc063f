"""torchmon.bridge.forward_from_torch(): torch.monitor's events reach torchmon's handlers.

Runs against the real torch wheel; skips when torch is not installed (except
the ImportError test, which hides torch in a subprocess).
"""

from __future__ import annotations

import gc
import sys
import textwrap
import time
from datetime import datetime, timedelta

import pytest
from support import run_python

import torchmon
from torchmon.bridge import TorchBridge, forward_from_torch

SRC_TS = datetime(2024, 5, 6, 7, 8, 9, 123456)


@pytest.fixture
def tm():
    torch_monitor = pytest.importorskip("torch.monitor")
    return torch_monitor


def test_torch_log_event_arrives_in_a_torchmon_handler(tm, recorder):
    with forward_from_torch():
        tm.log_event(tm.Event("torch.side", SRC_TS, {"epoch": 3, "loss": 0.25, "tag": "x"}))
    assert len(recorder.events) == 1
    event = recorder.events[0]
    assert isinstance(event, torchmon.Event)
    assert event.name == "torch.side"
    assert event.timestamp == SRC_TS
    assert event.data == {"epoch": 3, "loss": 0.25, "tag": "x"}


def test_torch_stat_windows_arrive_as_torchmon_stat_events(tm, recorder):
    with forward_from_torch():
        stat = tm.Stat(
            "bridge.loss", [tm.Aggregation.SUM, tm.Aggregation.COUNT], timedelta(milliseconds=1)
        )
        stat.add(2.0)
        stat.add(3.0)
        time.sleep(0.005)
        stat.add(10.0)  # a new window: the one with 2 and 3 closes
        del stat
        gc.collect()  # destruction emits the open window (10.0)
    assert [e.name for e in recorder.events] == [torchmon.STAT_EVENT, torchmon.STAT_EVENT]
    assert recorder.stat_data == [
        {"bridge.loss.sum": 5.0, "bridge.loss.count": 2.0},
        {"bridge.loss.sum": 10.0, "bridge.loss.count": 1.0},
    ]


def test_close_stops_forwarding_and_is_idempotent(tm, recorder):
    bridge = forward_from_torch()
    assert isinstance(bridge, TorchBridge)
    assert not bridge.closed
    tm.log_event(tm.Event("before", SRC_TS, {}))
    bridge.close()
    assert bridge.closed
    tm.log_event(tm.Event("after", SRC_TS, {}))
    bridge.close()
    bridge.remove()
    assert [e.name for e in recorder.events] == ["before"]


def test_remove_and_context_manager(tm, recorder):
    bridge = forward_from_torch()
    bridge.remove()
    tm.log_event(tm.Event("removed", SRC_TS, {}))
    with forward_from_torch() as b:
        tm.log_event(tm.Event("inside", SRC_TS, {}))
    assert b.closed
    tm.log_event(tm.Event("outside", SRC_TS, {}))
    assert [e.name for e in recorder.events] == ["inside"]


def test_two_bridges_forward_twice(tm, recorder):
    with forward_from_torch(), forward_from_torch():
        tm.log_event(tm.Event("twice", SRC_TS, {}))
    assert [e.name for e in recorder.events] == ["twice", "twice"]


def test_raising_torchmon_handler_never_raises_into_torch(tm, recorder, monkeypatch):
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    torch_side = []
    # Registered with torch after the bridge: torch would skip it if the bridge raised.
    later = tm.register_event_handler(torch_side.append)

    def fails(event):
        raise ValueError(f"cannot take {event.name}")

    handle = torchmon.register_event_handler(fails)
    try:
        with forward_from_torch():
            tm.log_event(tm.Event("one", SRC_TS, {}))  # does not raise
            tm.log_event(tm.Event("two", SRC_TS, {}))
    finally:
        torchmon.unregister_event_handler(handle)
        tm.unregister_event_handler(later)
    # torchmon's other handlers still got both events, and so did torch's later handler.
    assert [e.name for e in recorder.events] == ["one", "two"]
    assert [e.name for e in torch_side] == ["one", "two"]
    assert [str(r.exc_value) for r in reported] == ["cannot take one", "cannot take two"]
    assert all(isinstance(r.exc_value, ValueError) for r in reported)
    assert all("forwarding a torch.monitor event" in r.err_msg for r in reported)


def test_close_from_inside_a_forwarded_handler(tm, recorder):
    bridge = forward_from_torch()

    def closer(event):
        bridge.close()  # torch holds its lock here: unregistering now would deadlock

    handle = torchmon.register_event_handler(closer)
    try:
        tm.log_event(tm.Event("first", SRC_TS, {}))
        assert bridge.closed
        tm.log_event(tm.Event("second", SRC_TS, {}))
    finally:
        torchmon.unregister_event_handler(handle)
    bridge.close()  # outside of dispatch: the deferred unregistration happens
    assert [e.name for e in recorder.events] == ["first"]
    from torchmon import bridge as bridge_module

    assert bridge_module._pending_unregister == []


def test_forward_from_inside_a_forwarded_handler_is_refused(tm, recorder):
    errors = []

    def nests(event):
        try:
            forward_from_torch()
        except RuntimeError as exc:
            errors.append(str(exc))

    handle = torchmon.register_event_handler(nests)
    try:
        with forward_from_torch():
            tm.log_event(tm.Event("x", SRC_TS, {}))
    finally:
        torchmon.unregister_event_handler(handle)
    assert len(errors) == 1
    assert "deadlock" in errors[0]


def test_forwarded_torch_stats_reach_tensorboard(tm, tmp_path):
    pytest.importorskip("tensorboardX")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(logdir=str(tmp_path))
    handle = torchmon.register_event_handler(torchmon.TensorboardEventHandler(writer))
    try:
        with forward_from_torch():
            stat = tm.Stat(
                "asdf", [tm.Aggregation.SUM, tm.Aggregation.COUNT], timedelta(hours=1), 5
            )
            for i in range(10):
                stat.add(i)
            del stat
            gc.collect()
    finally:
        torchmon.unregister_event_handler(handle)
        writer.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    scalars = {tag: [s.value for s in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    # torch's own TestMonitorTensorboard numbers: max_samples 5 over adds 0..9
    # (the window closes at 5 samples; the later adds in it are dropped).
    assert scalars == {"asdf.sum": [10.0], "asdf.count": [5.0]}


def test_error_while_a_torch_stat_is_destroyed_does_not_abort():
    pytest.importorskip("torch.monitor")
    # torch aborts (std::terminate) when a handler raises here; the bridge must not raise.
    result = run_python(
        """
        import gc
        from datetime import timedelta
        import torch.monitor as tm
        import torchmon
        from torchmon.bridge import forward_from_torch

        def fails(event):
            raise RuntimeError("handler failed in destructor")

        handle = torchmon.register_event_handler(fails)
        bridge = forward_from_torch()
        stat = tm.Stat("doomed", [tm.Aggregation.SUM], timedelta(hours=1))
        stat.add(1.0)
        del stat
        gc.collect()
        bridge.close()
        torchmon.unregister_event_handler(handle)
        print("survived")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "survived"
    assert "handler failed in destructor" in result.stderr
    assert "forwarding a torch.monitor event" in result.stderr


def test_keyboard_interrupt_still_stops_the_program(tm, recorder):
    # Ctrl-C in a torchmon handler is not swallowed: it leaves torch.monitor.log_event.
    def interrupted(event):
        raise KeyboardInterrupt

    handle = torchmon.register_event_handler(interrupted)
    try:
        with forward_from_torch(), pytest.raises(KeyboardInterrupt):
            tm.log_event(tm.Event("x", SRC_TS, {}))
    finally:
        torchmon.unregister_event_handler(handle)
    # torchmon's handlers registered before the interrupting one got the event.
    assert [e.name for e in recorder.events] == ["x"]


def test_import_error_without_torch():
    result = run_python(
        """
        import sys
        sys.modules["torch"] = None  # makes `import torch` fail
        from torchmon.bridge import forward_from_torch
        try:
            forward_from_torch()
        except ImportError as exc:
            print("ImportError:", exc)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        "ImportError: torchmon.bridge.forward_from_torch() needs PyTorch"
    )


_EXIT_SCENARIOS = {
    "left-open": """
        bridge = forward_from_torch()
        tm.log_event(tm.Event("x", datetime(2020, 1, 1), {"a": 1}))
        """,
    # docs/wait_counter_and_bridge.md's own pattern: the sink goes, the bridge stays.
    "sink-unregistered-in-finally": """
        sink = torchmon.JsonlEventHandler(OUT)
        h = torchmon.register_event_handler(sink)
        try:
            bridge = forward_from_torch()
            tm.log_event(tm.Event("x", datetime(2020, 1, 1), {"a": 1}))
        finally:
            torchmon.unregister_event_handler(h)
            sink.close()
        """,
    "closed-inside-a-forwarded-handler": """
        bridge = forward_from_torch()
        def closer(event):
            bridge.close()
        h = torchmon.register_event_handler(closer)
        tm.log_event(tm.Event("x", datetime(2020, 1, 1), {"a": 1}))
        torchmon.unregister_event_handler(h)
        assert bridge.closed
        """,
}


@pytest.mark.parametrize("scenario", sorted(_EXIT_SCENARIOS))
def test_a_forwarder_still_in_torchs_registry_at_exit_does_not_crash(
    scenario: str, tmp_path
) -> None:
    """torch destroys its handler registry after the interpreter finalized;
    a Python handler still in it crashed the exit (rc 139) every run. The
    bridge's exit step takes every forwarder out first (docs/reliability.md)."""
    pytest.importorskip("torch.monitor")
    for _ in range(2):
        prelude = f"""
            from datetime import datetime
            import torch.monitor as tm
            import torchmon
            from torchmon.bridge import forward_from_torch
            OUT = {str(tmp_path / "sink.jsonl")!r}
            """
        code = textwrap.dedent(prelude) + textwrap.dedent(_EXIT_SCENARIOS[scenario])
        result = run_python(code + "print('done')\n", timeout=120)
        assert result.returncode == 0, (result.returncode, result.stderr)
        assert result.stdout.strip() == "done"


def test_the_exit_step_does_not_deadlock_with_a_thread_inside_torchs_dispatch() -> None:
    """torch's unregister_event_handler waits for torch's handler lock with
    the GIL held; a daemon thread inside torch's dispatch (in a slow torchmon
    handler reached through the bridge) holds that lock and waits for the
    GIL. The exit step waits until no thread is inside a forwarding call
    before it unregisters (docs/wait_counter_and_bridge.md)."""
    pytest.importorskip("torch.monitor")
    for _ in range(3):
        result = run_python(
            """
            import threading, time, datetime as dt
            import torch.monitor as tm
            import torchmon
            from torchmon.bridge import forward_from_torch

            bridge = forward_from_torch()
            torchmon.register_event_handler(lambda event: time.sleep(0.05))
            event = tm.Event("x", dt.datetime(2020, 1, 1), {})

            def loop():
                while True:
                    tm.log_event(event)

            threading.Thread(target=loop, daemon=True).start()
            time.sleep(0.3)
            print("done")
            """,
            timeout=60,
        )
        assert result.returncode == 0, (result.returncode, result.stderr)
        assert result.stdout.strip() == "done"
