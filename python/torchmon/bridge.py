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
closed from inside a handler) is unregistered by an exit step
(torchmon/_lifecycle.py): torch
destroys its registry after the interpreter finalized, and dropping a Python
handler then crashes the process (docs/reliability.md).

``record_wait_counters()`` records PyTorch's own wait counters (the latencies
libc10 measures: compile phases, c10d collectives and store calls, ...) as
torchmon Stats named ``torch.wait_counter.<key>``, through the dynamic
backend libc10 looks up by name (docs/wait_counter_and_bridge.md).
"""

from __future__ import annotations

import ctypes
import importlib
import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

from . import _core
from ._core import Event, log_event
from ._errors import arg_value_error, report_unraisable
from ._forksafe import new_lock
from ._wait_counter import _window_ms

__all__ = ["TorchBridge", "forward_from_torch", "record_wait_counters"]

_state = threading.local()  # .depth: how many forwarding calls this thread is inside
_pending_lock = new_lock()
_pending_unregister: list[Any] = []  # torch handles to unregister outside of dispatch
_open_bridges: dict[int, TorchBridge] = {}  # id -> bridge, until closed (under _pending_lock)


def _torch_monitor(caller: str = "forward_from_torch") -> Any:
    # importlib: torch is optional, and its type information is not needed here.
    try:
        return importlib.import_module("torch.monitor")
    except ImportError as exc:
        raise ImportError(
            f"torchmon.bridge.{caller}() needs PyTorch (torch.monitor), "
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
    forwarder = _Forwarder()
    handle = monitor.register_event_handler(forwarder)
    bridge = TorchBridge(monitor, forwarder, handle)
    with _pending_lock:
        _open_bridges[id(bridge)] = bridge
    return bridge


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


# The wait counter backend ABI torchmon implements: the name libc10 looks up
# (c10/util/WaitCounterDynamicBackend.h; a new version means a new name).
_BACKEND_SYMBOL = b"c10_monitor_wait_counter_dynamic_backend_init_v1"
_BACKEND_SYMBOL_STEM = b"c10_monitor_wait_counter_dynamic_backend_init_v"
_wait_counter_lock = new_lock()
_wait_counter_window_ms: int | None = None  # set once recording works


def record_wait_counters(window_size: timedelta | float = timedelta(seconds=60)) -> None:
    """Records every wait counter PyTorch creates from now on (torch.compile's
    phases, c10d's collectives and store calls, ...) into a torchmon Stat
    named ``torch.wait_counter.<key>`` (a key's ``pytorch.wait_counter.``
    prefix dropped), with COUNT, SUM, MAX, P50 and P99 of each duration in
    seconds, in windows of ``window_size`` (a ``timedelta`` or seconds).

    Call it before torch creates its first wait counter: libc10 looks for the
    backend once, at its first counter. Imports torch if it is not imported
    yet. Calling it again with the same window does nothing. Raises
    ``RuntimeError`` when torch created a counter before (nothing could be
    recorded) or when this torch uses another backend ABI, ``ImportError``
    without torch, ``ValueError`` for a window other than the one already in
    use, and ``TypeError``/``ValueError`` for a bad ``window_size``.
    """
    global _wait_counter_window_ms
    window_ms = _window_ms(window_size, "record_wait_counters")
    with _wait_counter_lock:
        if _wait_counter_window_ms is not None:
            if _wait_counter_window_ms != window_ms:
                raise arg_value_error(
                    "record_wait_counters",
                    "window_size",
                    f"must match the window wait counters are already recorded with "
                    f"({timedelta(milliseconds=_wait_counter_window_ms)}), not "
                    f"{timedelta(milliseconds=window_ms)}",
                )
            return
        # Global before torch can look the symbol up (importing torch below).
        _make_backend_symbol_global()
        _core._enable_torch_wait_counters(window_ms)
        try:
            monitor = _torch_monitor("record_wait_counters")
            _check_backend_abi(_libc10_files(), _torch_version())
            # The probe: a counter key libc10 has not seen makes it call the
            # backend's init function, if it found ours.
            monitor._WaitCounter(_core._TORCH_WAIT_COUNTER_PROBE_KEY)
            if not _core._torch_wait_counter_probe_seen():
                raise RuntimeError(
                    "torchmon.bridge.record_wait_counters() was called too late: "
                    "torch created a wait counter before it (libc10 looks for a "
                    "wait counter backend once, when it creates its first counter), "
                    "or another library already provides the backend, so no wait "
                    "counter would be recorded. Call it before the first "
                    "torch.compile, torch.distributed or torch.monitor._WaitCounter "
                    "use, e.g. right after `import torch`"
                )
        except BaseException:
            _core._disable_torch_wait_counters()
            raise
        _wait_counter_window_ms = window_ms


def _make_backend_symbol_global() -> None:
    """Python loads extension modules with RTLD_LOCAL, where libc10's
    ``dlsym(RTLD_DEFAULT, ...)`` cannot see them: re-opening the loaded
    module with RTLD_NOLOAD | RTLD_GLOBAL adds its symbols to the global
    scope (the handle is kept: the module is never unloaded anyway)."""
    noload = getattr(os, "RTLD_NOLOAD", None)
    if noload is None or sys.platform == "win32":
        raise RuntimeError(
            "torchmon.bridge.record_wait_counters() needs dlopen's RTLD_NOLOAD "
            "(Linux or macOS); this platform has none"
        )
    ctypes.CDLL(_core.__file__, mode=noload | os.RTLD_GLOBAL)


def _torch_version() -> str:
    torch = sys.modules.get("torch")
    return str(getattr(torch, "__version__", "unknown"))


def _libc10_files() -> list[Path]:
    torch = sys.modules.get("torch")
    torch_file = getattr(torch, "__file__", None)
    if torch_file is None:
        return []
    return sorted((Path(torch_file).parent / "lib").glob("libc10.*"))


def _check_backend_abi(libc10_files: list[Path], torch_version: str) -> None:
    """Refuses a torch whose libc10 looks up another version of the backend
    init function (its name is a string in the library). No library found
    (an unusual layout): the probe still tells whether recording works."""
    for path in libc10_files:
        try:
            content = path.read_bytes()
        except OSError:
            continue
        if _BACKEND_SYMBOL in content:
            return
        start = content.find(_BACKEND_SYMBOL_STEM)
        if start >= 0:
            end = start + len(_BACKEND_SYMBOL_STEM)
            while end < len(content) and content[end : end + 1].isdigit():
                end += 1
            found = content[start:end].decode("ascii", "replace")
            raise RuntimeError(
                f"torchmon.bridge.record_wait_counters(): torch {torch_version} "
                f"looks up the wait counter backend {found!r} ({path}), but this "
                f"torchmon implements {_BACKEND_SYMBOL.decode()!r}; upgrade "
                "torchmon or use a torch with that ABI"
            )
        raise RuntimeError(
            f"torchmon.bridge.record_wait_counters(): torch {torch_version} has no "
            f"wait counter backend hook ({path} does not look up "
            f"{_BACKEND_SYMBOL.decode()!r}); it needs a torch that does (2.13 does)"
        )
