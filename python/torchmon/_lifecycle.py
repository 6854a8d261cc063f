"""What torchmon runs at interpreter exit and in a forked child, in order.

This is the one list (docs/internals.md, "Exit, fork and signals"): the
modules that own some state give a function for each step, and only this
module registers steps with ``atexit``, threading's exit hooks and
``os.register_at_fork``. A step of a module that was never imported (a sink,
SystemStats, the bridge) is skipped: it has nothing to do. The core's own
steps (the live Stats' reset, the torch wait counters' delivery queue) run
inside ``_core._reset_stats_after_fork`` and ``_core._flush_all_stats``.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from types import ModuleType

from . import _core, _flush, _forksafe, _tensors

# typing.TYPE_CHECKING without importing typing (docs/performance.md, import cost).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable


def _imported(name: str) -> ModuleType | None:
    return sys.modules.get(f"{__package__}.{name}")


# --- exit ----------------------------------------------------------------


def _before_threads_join() -> None:
    """threading's exit hook: runs before the non-daemon threads are joined
    and before any ``atexit`` handler."""
    # 1. Tensor values staged by compiled graphs, or not read yet from a
    #    device, become samples of their Stats.
    _tensors.read_pending()
    watchdog = _imported("_watchdog")
    if watchdog is not None:
        # Running watchdogs stop: no hang report starts while the
        # interpreter ends (their sections' open windows go with step 3).
        watchdog._close_all()
    system = _imported("_system")
    if system is not None:
        # 2. SystemStats samplers stop, with a last sample in their windows.
        system._close_all_at_exit()
    # 3, 4. Registered with atexit now, so that they run once the non-daemon
    # threads have ended (and added their last samples), and before every
    # atexit handler registered after `import torchmon` (tensorboardX's
    # writer cleanup among them).
    _register_emit_steps()


def _register_emit_steps() -> None:
    # atexit runs the last registered first.
    atexit.register(_core._close_async_handlers_at_exit)  # 4. AsyncEventHandlers drain
    atexit.register(_core._flush_all_stats)  # 3. every live Stat's open window is emitted


# 5. Each OpenTelemetryEventHandler's and tracker sink's (MLflow) close (its
#    last export or delivery), registered when the handler is made: so it
#    runs before the OpenTelemetry SDK's own shutdown hook, which the SDK
#    registered earlier.
def close_at_exit(close: Callable[[], None]) -> Callable[[], None]:
    atexit.register(close)
    return close


def cancel_at_exit(close: Callable[[], None]) -> None:
    atexit.unregister(close)


def _last_steps() -> None:
    """One ``atexit`` handler registered at ``import torchmon``, right after
    the exit gate's: it runs after every handler registered later."""
    # 6, 7. Again, for what the atexit handlers that ran since then added (a
    #    second flush or drain finds nothing left otherwise).
    _core._flush_all_stats()
    _core._close_async_handlers_at_exit()
    tensorboard = _imported("handlers.tensorboard")
    if tensorboard is not None:
        # 7b. The native TensorBoard writers write their queues out (their
        #     threads would end with the process, the windows unwritten).
        tensorboard._flush_native_at_exit()
    bridge = _imported("bridge")
    if bridge is not None:
        # 8. Forwarders leave torch.monitor's registry before torch destroys it.
        bridge._unregister_all_at_exit()
    prometheus = _imported("handlers.prometheus")
    if prometheus is not None:
        # 9. The scrape servers stop.
        prometheus._stop_servers_at_exit()


# --- fork ----------------------------------------------------------------


def _before_fork() -> None:
    """On the forking thread: imports now what torchmon's other threads would
    import on first use (a handler error's report imports ``traceback``). A
    fork while another thread was inside such an import left that module's
    import lock held for ever in the child, whose first use of it hung
    (docs/reliability.md, "fork")."""
    import traceback  # noqa: F401  (torchmon._errors.report_unraisable)


def _after_fork_in_child() -> None:
    # 1. The sinks' locks first: the steps below may take them.
    _forksafe._release_in_child()
    # 2. Every live Stat's open window emptied (the parent emits its
    #    samples), then the core's own hooks (docs/internals.md, "Fork").
    _core._reset_stats_after_fork()
    # 3. Each AsyncEventHandler gets a new queue and thread: the events
    #    queued in the parent are the parent's to deliver.
    _core._restart_async_handlers_after_fork()
    prometheus = _imported("handlers.prometheus")
    if prometheus is not None:
        # 4. Each PrometheusEventHandler starts empty, its server forgotten.
        prometheus._reset_expositions_in_child()
    system = _imported("_system")
    if system is not None:
        # 5. SystemStats samplers are stopped (their thread is the parent's).
        system._after_fork_in_child()
    tracker = _imported("handlers._tracker")
    if tracker is not None:
        # 6. Each tracker sink (MLflow) gets an empty queue and no sender
        #    thread: the parent delivers what it queued.
        tracker._reset_in_child()
    # 7. multiprocessing, if imported by now, will flush this child at its
    #    exit (it ends with os._exit(), without atexit: torchmon/_flush.py).
    _flush._hook_multiprocessing()


def install() -> None:
    """Called once, by ``import torchmon``."""
    # The exit gate's step, registered first so that it runs last: from then
    # on only the exiting thread starts handlers, and it waits for other
    # threads to leave theirs, because CPython 3.11-3.13 end those threads
    # in a way that aborts the process when Rust frames are on their stack
    # (crates/torchmon-core/src/exit_gate.rs, docs/internals.md "Exit").
    atexit.register(_core._close_exit_gate)
    atexit.register(_last_steps)
    register_threading_atexit = getattr(threading, "_register_atexit", None)
    try:
        if register_threading_atexit is None:
            raise RuntimeError
        register_threading_atexit(_before_threads_join)
    except RuntimeError:  # imported while the interpreter shuts down
        atexit.register(_before_threads_join)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
