"""Forward torch.monitor's own events into torchmon's handlers.

In a process that uses both (torch's built-in Stats and WaitCounters, or
third-party code written against ``torch.monitor``), one set of sinks sees
everything::

    import torchmon.bridge

    with torchmon.bridge.forward_from_torch():
        ...  # every torch.monitor event is also logged with torchmon.log_event

The forwarding handler converts each ``torch.monitor.Event`` into a
``torchmon.Event`` (same name, timestamp and data; torch's Stat events keep
the name ``"torch.monitor.Stat"``, so ``TensorboardEventHandler`` writes them)
and hands it to ``torchmon.log_event``.

It never raises into torch: torch 2.13 skips its later handlers when one
raises, and aborts the process (``std::terminate``) when a handler raises
while a torch Stat is destroyed. Any exception (from the conversion or from
a torchmon handler) is reported through ``sys.unraisablehook``, the way
Python reports errors it cannot raise (``__del__``, callbacks), and the next
event is forwarded as usual. ``warnings`` would not be safe: under a
``-W error`` filter a warning is an exception.

The one exception: ``KeyboardInterrupt`` and ``SystemExit`` (Ctrl-C, a
handler calling ``sys.exit``) propagate, so they still stop the program;
torch raises them from its ``log_event``/``Stat.add`` call, or aborts if they
arrive while it destroys a Stat, as for any handler. Swallowing them would
lose the Ctrl-C, and Python code cannot re-deliver it after torch returns
(``_thread.interrupt_main`` fires at the next bytecode, inside the handler).

torch calls its handlers with an internal lock held, so torchmon handlers
reached through the bridge must not call ``torch.monitor`` themselves
(torch deadlocks). Closing the bridge from inside such a handler is safe: it
stops the forwarding at once and unregisters from torch at the next
``forward_from_torch()`` or ``close()`` made outside of torch's dispatch, or
at interpreter exit.

At exit every forwarder still in torch's registry (a bridge left open, or
closed from inside a handler) is unregistered by an ``atexit`` step: torch
destroys its registry after the interpreter finalized, and dropping a Python
handler then crashes the process (docs/reliability.md).
"""

from __future__ import annotations

import atexit
import importlib
import sys
import threading
import time
from types import TracebackType
from typing import Any

from ._core import Event, log_event
from ._errors import report_unraisable
from ._forksafe import new_lock

__all__ = ["TorchBridge", "forward_from_torch"]

_state = threading.local()  # .depth: how many forwarding calls this thread is inside
_pending_lock = new_lock()
_pending_unregister: list[Any] = []  # torch handles to unregister outside of dispatch
_open_bridges: dict[int, TorchBridge] = {}  # id -> bridge, until closed (under _pending_lock)
_exit_step_registered = False


def _torch_monitor() -> Any:
    # importlib: torch is optional, and its type information is not needed here.
    try:
        return importlib.import_module("torch.monitor")
    except ImportError as exc:
        raise ImportError(
            "torchmon.bridge.forward_from_torch() needs PyTorch (torch.monitor), "
            f"which cannot be imported: {exc}"
        ) from exc


def _inside_dispatch() -> bool:
    return getattr(_state, "depth", 0) > 0


def _report_unraisable(exc: BaseException, obj: object) -> None:
    """Hands ``exc`` to ``sys.unraisablehook``; never raises."""
    report_unraisable(
        exc, obj, "Exception ignored while forwarding a torch.monitor event to torchmon"
    )


def _drain_pending(monitor: Any) -> None:
    """Unregisters the handlers that were closed during a dispatch."""
    with _pending_lock:
        handles = list(_pending_unregister)
        _pending_unregister.clear()
    for handle in handles:
        monitor.unregister_event_handler(handle)


class _Forwarder:
    """The callable registered with torch.monitor."""

    __slots__ = ("active",)

    def __init__(self) -> None:
        self.active = True

    def __call__(self, torch_event: Any) -> None:
        if not self.active:
            return
        _state.depth = getattr(_state, "depth", 0) + 1
        try:
            log_event(Event(torch_event.name, torch_event.timestamp, torch_event.data))
        except (KeyboardInterrupt, SystemExit):
            raise  # requests to stop the program are not swallowed (see the module doc)
        except BaseException as exc:
            _report_unraisable(exc, self)
        finally:
            _state.depth -= 1

    def __repr__(self) -> str:
        return f"<torchmon.bridge forwarder, {'active' if self.active else 'closed'}>"


class TorchBridge:
    """Returned by ``forward_from_torch()``: undoes it with ``close()`` (alias
    ``remove()``, idempotent) or at the end of a ``with`` block."""

    __slots__ = ("_forwarder", "_handle", "_lock", "_monitor")

    def __init__(self, monitor: Any, forwarder: _Forwarder, handle: Any) -> None:
        self._monitor = monitor
        self._forwarder = forwarder
        self._handle: Any = handle
        self._lock = new_lock()

    @property
    def closed(self) -> bool:
        return self._handle is None

    def close(self) -> None:
        """Stops forwarding and unregisters the handler from torch.monitor."""
        with self._lock:
            handle, self._handle = self._handle, None
        self._forwarder.active = False
        with _pending_lock:
            _open_bridges.pop(id(self), None)
        if _inside_dispatch():
            # torch holds its handler lock: unregistering now would deadlock.
            if handle is not None:
                with _pending_lock:
                    _pending_unregister.append(handle)
            return
        _drain_pending(self._monitor)
        if handle is not None:
            self._monitor.unregister_event_handler(handle)

    remove = close

    def __enter__(self) -> TorchBridge:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<torchmon.bridge.TorchBridge {'closed' if self.closed else 'forwarding'}>"


def forward_from_torch() -> TorchBridge:
    """Registers a torch.monitor handler that re-logs every torch.monitor
    event into torchmon (``torchmon.log_event``) until the returned bridge is
    closed. Each call registers one more forwarder (two open bridges forward
    every event twice). Raises ``ImportError`` when torch is not importable,
    and ``RuntimeError`` when called from inside a forwarded event's handler
    (torch would deadlock).
    """
    monitor = _torch_monitor()
    if _inside_dispatch():
        raise RuntimeError(
            "forward_from_torch() cannot be called from a handler of a forwarded "
            "torch.monitor event: torch holds its handler lock (it would deadlock)"
        )
    _drain_pending(monitor)
    _register_exit_step()
    forwarder = _Forwarder()
    handle = monitor.register_event_handler(forwarder)
    bridge = TorchBridge(monitor, forwarder, handle)
    with _pending_lock:
        _open_bridges[id(bridge)] = bridge
    return bridge


def _register_exit_step() -> None:
    global _exit_step_registered
    with _pending_lock:
        if _exit_step_registered:
            return
        _exit_step_registered = True
    atexit.register(_unregister_all_at_exit)


# How long the exit step waits for other threads to leave a forwarding call.
_EXIT_WAIT = 2.0


def _no_other_thread_forwarding(timeout: float) -> bool:
    """Waits until no other thread is inside a forwarding call; ``False`` if
    one still was after ``timeout`` seconds.

    torch calls its handlers with its handler lock held, and its
    ``unregister_event_handler`` waits for that lock without releasing the
    GIL: called while another thread is inside torch's dispatch, it would
    deadlock. A thread holding torch's lock without the GIL is inside a
    Python handler, that is, inside ``_Forwarder.__call__`` (its frame is
    pushed before it can give up the GIL); while this thread then holds the
    GIL without a break, no thread can enter torch's dispatch. So: look at
    every thread's frames with the GIL held, and let the others run (sleep)
    while one is inside.
    """
    deadline = time.monotonic() + timeout
    while _another_thread_forwards():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.001)
    return True


def _another_thread_forwards() -> bool:
    me = threading.get_ident()
    code = _Forwarder.__call__.__code__
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        current: Any = frame
        while current is not None:
            if current.f_code is code:
                return True
            current = current.f_back
    return False


def _unregister_all_at_exit() -> None:
    """Takes every forwarder out of torch's registry before the interpreter
    finalizes: torch destroys its handler registry (a C++ static) after that,
    and releasing a Python handler then re-takes the GIL of a finalized
    interpreter (exit status 139). Covers bridges left open and those closed
    from inside a forwarded handler (whose unregistration was deferred).
    Never raises."""
    with _pending_lock:
        bridges = list(_open_bridges.values())
    for bridge in bridges:
        bridge._forwarder.active = False  # from now on a forwarding call returns at once
    if not _no_other_thread_forwarding(_EXIT_WAIT):
        # Unregistering would wait for torch's lock, held by a thread that
        # waits for the GIL we hold: leave torch's registry as it is.
        return
    for bridge in bridges:
        try:
            bridge.close()
        except BaseException as exc:
            _report_unraisable(exc, bridge)
    monitor = sys.modules.get("torch.monitor")
    if monitor is not None and not _inside_dispatch():
        try:
            _drain_pending(monitor)
        except BaseException as exc:
            _report_unraisable(exc, _unregister_all_at_exit)
