"""torchmon: torch.monitor's Stat / Event / handler API, standalone and Rust-backed.

``import torchmon as monitor`` runs code written for ``torch.monitor``
unchanged; see docs/compatibility.md for the few deliberate differences.
"""

from __future__ import annotations

import atexit
import os
import threading

from . import _core, _flush, _tensors
from ._core import (
    MAX_STAT_NAME_LENGTH,
    STAT_EVENT,
    Aggregation,
    AsyncEventHandler,
    Distribution,
    Event,
    EventHandlerHandle,
    Stat,
    data_value_t,
    log_event,
    register_event_handler,
    unregister_event_handler,
)

# The version lives in Cargo.toml only; the native module carries it (no
# importlib.metadata lookup at import, and a source checkout has no metadata).
from ._core import __version__ as __version__
from ._flush import SignalFlush, flush, flush_on_signals
from ._wait_counter import WaitCounter, _WaitCounter, _WaitCounterTracker

# The sinks are imported on first use (PEP 562): with json and re, which they
# need, they would more than double what `import torchmon` costs
# (docs/performance.md). Type checkers see them as plain imports.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from . import handlers as handlers
    from ._rank import RankInfo, rank_info
    from .handlers.jsonl import JsonlEventHandler, read_jsonl
    from .handlers.otel import OpenTelemetryEventHandler
    from .handlers.prometheus import PrometheusEventHandler
    from .handlers.tensorboard import TensorboardEventHandler

# System stats (docs/guide.md, "System stats"): imported on first use too.
if TYPE_CHECKING:
    from ._system import SystemStats

_FROM_HANDLERS = frozenset(
    (
        "JsonlEventHandler",
        "OpenTelemetryEventHandler",
        "PrometheusEventHandler",
        "TensorboardEventHandler",
        "read_jsonl",
    )
)


# Multi-node helpers (docs/api.md, "`rank_info` and the per-rank sinks"), also loaded on first use.
_FROM_RANK = frozenset(("RankInfo", "rank_info"))


def __getattr__(name: str) -> object:
    if name == "handlers" or name in _FROM_HANDLERS:
        # Not `from . import handlers`: that looks the attribute up first, here.
        import importlib

        handlers = importlib.import_module(".handlers", __name__)
        return handlers if name == "handlers" else getattr(handlers, name)
    if name in _FROM_RANK:
        from . import _rank

        return getattr(_rank, name)
    if name == "SystemStats":  # system stats: logging and a sampler thread, on first use
        from ._system import SystemStats

        return SystemStats
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Public besides __all__: the version and the sinks' package.
_PUBLIC_EXTRA = ("__version__", "handlers")


def __dir__() -> list[str]:
    # The public API only, not what this module imports for itself (os,
    # atexit, threading, _core...): a name added to __all__ shows here.
    return sorted({*__all__, *_PUBLIC_EXTRA})


# torch.monitor exports the members at module level too. They come from the
# native table of aggregations (src/aggregation.rs); type checkers see the
# list below, which tests/api/test_aggregation.py checks names every member.
if TYPE_CHECKING:
    VALUE = Aggregation.VALUE
    MEAN = Aggregation.MEAN
    COUNT = Aggregation.COUNT
    SUM = Aggregation.SUM
    MAX = Aggregation.MAX
    MIN = Aggregation.MIN
    STDDEV = Aggregation.STDDEV
    P50 = Aggregation.P50
    P90 = Aggregation.P90
    P95 = Aggregation.P95
    P99 = Aggregation.P99
    P999 = Aggregation.P999
else:
    globals().update(Aggregation.__members__)

__all__ = [
    "COUNT",
    "MAX",
    "MAX_STAT_NAME_LENGTH",
    "MEAN",
    "MIN",
    "P50",
    "P90",
    "P95",
    "P99",
    "P999",
    "STAT_EVENT",
    "STDDEV",
    "SUM",
    "VALUE",
    "Aggregation",
    "AsyncEventHandler",
    "Distribution",
    "Event",
    "EventHandlerHandle",
    "JsonlEventHandler",
    "OpenTelemetryEventHandler",
    "PrometheusEventHandler",
    "RankInfo",
    "SignalFlush",
    "Stat",
    "SystemStats",
    "TensorboardEventHandler",
    "WaitCounter",
    "_WaitCounter",
    "_WaitCounterTracker",
    "data_value_t",
    "flush",
    "flush_on_signals",
    "log_event",
    "rank_info",
    "read_jsonl",
    "register_event_handler",
    "unregister_event_handler",
]


def _install_exit_flush() -> None:
    """Emit every live Stat's open window, then drain every AsyncEventHandler,
    before the interpreter shuts down.

    The flush must run before sinks close themselves at exit (tensorboardX
    registers an ``atexit`` cleanup per writer, after torchmon was imported),
    and the drain after the flush (the windows it emits may go to an
    AsyncEventHandler) and before those sinks close too. ``atexit`` runs
    handlers last-registered-first, so both are registered, drain first, from
    a threading-shutdown hook, which runs after non-daemon threads were asked
    to finish and before any ``atexit`` handler. Plain ``atexit``
    registrations, in the same order, stay as a fallback; a second flush or
    drain finds nothing to do.
    """

    def register_in_order() -> None:
        atexit.register(_core._close_async_handlers_at_exit)
        atexit.register(_core._flush_all_stats)

    register_in_order()
    register_threading_atexit = getattr(threading, "_register_atexit", None)
    if register_threading_atexit is not None:
        register_threading_atexit(register_in_order)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_prepare_fork)
        # The open windows a forked child inherits hold the parent's samples,
        # which the parent emits: the child starts with empty ones
        # (docs/reliability.md, "fork").
        os.register_at_fork(after_in_child=_core._reset_stats_after_fork)
        # A forked child has no worker threads: give each handler new ones.
        os.register_at_fork(after_in_child=_core._restart_async_handlers_after_fork)


def _prepare_fork() -> None:
    """Imports, on the forking thread, what a handler error's report imports
    on first use on torchmon's other threads (``traceback``). A fork while
    another thread was inside that import left its import lock held for
    ever in the child, whose first use of it hung (docs/reliability.md,
    "fork")."""
    import traceback  # noqa: F401  (torchmon._errors.report_unraisable)


# Registered before the exit flush and drain, so that it runs after them and
# after every atexit handler registered later: the last step before the
# interpreter finalizes. From then on only the exiting thread starts
# handlers, and it waits for other threads to leave theirs, because CPython
# 3.11-3.13 end those threads in a way that aborts the process when Rust
# frames are on their stack (see crates/torchmon-core/src/exit_gate.rs, docs/internals.md "Exit").
atexit.register(_core._close_exit_gate)
_install_exit_flush()
# multiprocessing's fork and forkserver children end with os._exit(), without
# atexit: they flush from multiprocessing's own exit step (torchmon/_flush.py).
_flush._install()
# Stat.add/add_many of torch tensors, and inside torch.compile: installed when
# torch (and torch._dynamo) are imported, never importing them (docs/guide.md,
# "Recording tensors and torch.compile").
_tensors.install_when_imported()
