"""torchmon: torch.monitor's Stat / Event / handler API, standalone and Rust-backed.

``import torchmon as monitor`` runs code written for ``torch.monitor``
unchanged; see docs/compatibility.md for the few deliberate differences.
"""

from __future__ import annotations

from . import _flush, _lifecycle, _tensors
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
    from .handlers.mlflow import MLflowEventHandler
    from .handlers.otel import OpenTelemetryEventHandler
    from .handlers.prometheus import PrometheusEventHandler
    from .handlers.tensorboard import TensorboardEventHandler
    from .handlers.wandb import WandbEventHandler

# System stats (docs/guide.md, "System stats"): imported on first use too.
if TYPE_CHECKING:
    from ._system import SystemStats
    from ._watchdog import Watchdog

_FROM_HANDLERS = frozenset(
    (
        "JsonlEventHandler",
        "MLflowEventHandler",
        "OpenTelemetryEventHandler",
        "PrometheusEventHandler",
        "TensorboardEventHandler",
        "WandbEventHandler",
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
    if name == "Watchdog":  # hang and straggler reports (docs/watchdog.md), on first use
        from ._watchdog import Watchdog

        return Watchdog
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
    "MLflowEventHandler",
    "OpenTelemetryEventHandler",
    "PrometheusEventHandler",
    "RankInfo",
    "SignalFlush",
    "Stat",
    "SystemStats",
    "TensorboardEventHandler",
    "WaitCounter",
    "WandbEventHandler",
    "Watchdog",
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


_lifecycle.install()  # what runs at exit and in a forked child, in order
# multiprocessing's fork and forkserver children end with os._exit(), without
# atexit: they flush from multiprocessing's own exit step (torchmon/_flush.py).
_flush._hook_multiprocessing()
# Stat.add/add_many of torch tensors, and inside torch.compile: installed when
# torch (and torch._dynamo) are imported, never importing them (docs/guide.md,
# "Recording tensors and torch.compile").
_tensors.install_when_imported()
