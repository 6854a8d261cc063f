"""What the framework integrations share: the step timer, the windowed Stats
of logged values, the per-rank sinks of ``log_dir`` and the checks of their
arguments (docs/integrations.md)."""

from __future__ import annotations

import importlib
import os
import sys
import time
from datetime import timedelta
from types import ModuleType
from typing import Any

from .. import _core
from .._core import Aggregation, Event, Stat, _window_ms
from .._errors import arg_type_error

#: The documented default window of every Stat the integrations record: the
#: guide's training-loop window (docs/guide.md, "One Stat per metric").
DEFAULT_WINDOW = timedelta(seconds=60)

STEP_TIME_AGGREGATIONS = (
    Aggregation.COUNT,
    Aggregation.MEAN,
    Aggregation.P50,
    Aggregation.P99,
    Aggregation.MAX,
)
DATA_TIME_AGGREGATIONS = (
    Aggregation.COUNT,
    Aggregation.MEAN,
    Aggregation.P50,
    Aggregation.P99,
    Aggregation.MAX,
)
# Logged values arrive once per logging step: SUM and COUNT let a reader
# check a window against what the framework logged, VALUE is the last one.
LOGGED_AGGREGATIONS = (
    Aggregation.COUNT,
    Aggregation.SUM,
    Aggregation.MEAN,
    Aggregation.MIN,
    Aggregation.MAX,
    Aggregation.VALUE,
)
PEAK_MEMORY_AGGREGATIONS = (Aggregation.MAX, Aggregation.VALUE)

_clock = time.perf_counter


def import_framework(module: str, extra: str, owner: str, *, pip_names: str) -> ModuleType:
    """``module`` imported, or an ImportError naming the ``pip install`` that
    provides it: the packages of the extra, and the extra itself for a
    checkout (torchmon is on no package index, README.md "Installing", so
    ``pip install "torchmon[<extra>]"`` finds nothing)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{owner} needs {module}, which cannot be imported ({exc}): "
            f"pip install {pip_names} (in a torchmon checkout: pip install '.[{extra}]')"
        ) from exc


def check_window(window: object, where: str) -> timedelta:
    """``window`` by the one window rule (docs/api.md, "Window sizes")."""
    return timedelta(milliseconds=_window_ms(where, "window", window))


def check_name(value: object, argument: str, where: str) -> str:
    if not isinstance(value, str):
        raise arg_type_error(where, argument, "a str", value)
    return value


def check_log_dir(log_dir: object, where: str) -> str | None:
    if log_dir is None:
        return None
    if isinstance(log_dir, bytes) or not isinstance(log_dir, (str, os.PathLike)):
        raise arg_type_error(where, "log_dir", "a str, a path or None", log_dir)
    return os.fspath(log_dir)


def check_bool(value: object, argument: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise arg_type_error(where, argument, "a bool", value)
    return value


def is_number(value: object) -> bool:
    """Whether a logged value becomes a Stat sample: an int or float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class StepTimer:
    """``train.step_time`` (from a step's begin to its end) and
    ``train.data_time`` (from a step's end to the next step's begin: the
    batch fetch, and whatever else the loop does between steps), in seconds.

    Each hook is one clock read and at most one ``Stat.add``: they run once
    per training step (docs/performance.md, "Framework integrations")."""

    __slots__ = ("_begin", "_end", "data_time", "step_time")

    def __init__(self, prefix: str, window: timedelta) -> None:
        self.step_time = Stat(f"{prefix}.step_time", STEP_TIME_AGGREGATIONS, window)
        self.data_time = Stat(f"{prefix}.data_time", DATA_TIME_AGGREGATIONS, window)
        self._begin = 0.0
        self._end = 0.0  # 0.0: no step ended yet, so no data time to record

    def begin(self) -> None:
        now = _clock()
        if self._end:
            self.data_time.add(now - self._end)
        self._begin = now

    def end(self) -> float:
        """Records the step's time; returns the clock reading it ended at."""
        now = _clock()
        if self._begin:
            self.step_time.add(now - self._begin)
            self._begin = 0.0
        self._end = now
        return now


class LoggedStats:
    """One windowed Stat per logged name, made on the name's first value."""

    __slots__ = ("_aggregations", "_stats", "_window")

    def __init__(self, window: timedelta, aggregations: tuple[Aggregation, ...]) -> None:
        self._window = window
        self._aggregations = aggregations
        self._stats: dict[str, Stat] = {}

    def add(
        self, name: str, value: float, aggregations: tuple[Aggregation, ...] | None = None
    ) -> None:
        """Adds ``value`` to the Stat ``name``; ``aggregations`` (default: the
        constructor's) apply when this makes the Stat."""
        stat = self._stats.get(name)
        if stat is None:
            aggregations = self._aggregations if aggregations is None else aggregations
            stat = self._stats[name] = Stat(name, aggregations, self._window)
        stat.add(value)

    def flush(self) -> None:
        """Emits every open window: a Stat destroyed emits its open window
        (docs/internals.md, "Exit"), and the next value makes a new Stat."""
        self._stats.clear()


def peak_memory_bytes() -> float | None:
    """The accelerator's peak allocated memory as torch's CUDA allocator
    reports it, or None when torch was not imported or CUDA was not
    initialised (a CPU run): never imports torch nor initialises CUDA."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return None
    return float(cuda.max_memory_allocated())


def log_run_event(framework: str) -> None:
    """``torchmon.run``: which rank recorded what follows (``torchmon.rank_info()``)."""
    from .._rank import rank_info

    info = rank_info()
    data: dict[str, Any] = {"framework": framework, **info.labels()}
    data["world_size"] = info.world_size
    data["host"] = info.host
    from datetime import datetime

    _core.log_event(Event("torchmon.run", datetime.now(), data))


class RankSinks:
    """``log_dir``'s sinks for this rank: ``events-rank{N}.jsonl`` (with the
    distributions, for ``torchmon summarize`` across ranks) and, when
    tensorboardX is installed and ``tensorboard`` is true, TensorBoard files
    in ``rank{N}/``. Registered by ``open()``, flushed and closed by
    ``close()``."""

    __slots__ = (
        "_handles",
        "_jsonl",
        "_log_dir",
        "_tensorboard",
        "_tensorboard_handler",
        "_writer",
    )

    def __init__(self, log_dir: str, tensorboard: bool) -> None:
        self._log_dir = log_dir
        self._tensorboard = tensorboard
        self._handles: list[Any] = []
        self._jsonl: Any = None
        self._writer: Any = None
        self._tensorboard_handler: Any = None

    @property
    def is_open(self) -> bool:
        return bool(self._handles)

    def open(self) -> None:
        if self._handles:
            return
        from .._rank import rank_info
        from ..handlers.jsonl import JsonlEventHandler

        os.makedirs(self._log_dir, exist_ok=True)
        self._jsonl = JsonlEventHandler.for_rank(self._log_dir, distributions=True)
        self._handles.append(_core.register_event_handler(self._jsonl))
        if self._tensorboard:
            try:
                from tensorboardX import SummaryWriter  # type: ignore[import-untyped, unused-ignore]
            except ImportError:
                return
            from ..handlers.tensorboard import TensorboardEventHandler

            folder = os.path.join(self._log_dir, rank_info().format("rank{rank}"))
            self._writer = SummaryWriter(logdir=folder)
            self._tensorboard_handler = TensorboardEventHandler(self._writer, other_events=True)
            self._handles.append(_core.register_event_handler(self._tensorboard_handler))

    def close(self) -> None:
        """Unregisters, then closes (a closed sink raises on the next event)."""
        for handle in self._handles:
            _core.unregister_event_handler(handle)
        self._handles.clear()
        if self._tensorboard_handler is not None:
            self._tensorboard_handler.flush()
            self._writer.close()
            self._tensorboard_handler = self._writer = None
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None


def check_watchdog(value: object, where: str) -> Any:
    """``watchdog``: None or False (none), True (the callback makes a
    ``torchmon.Watchdog()`` at the start of training and closes it at the
    end) or a ``torchmon.Watchdog`` (used, left open)."""
    from .._watchdog import Watchdog

    if value is None or isinstance(value, (bool, Watchdog)):
        return None if value is False else value
    raise arg_type_error(where, "watchdog", "None, a bool or a torchmon.Watchdog", value)


#: DDP's own timings (``DistributedDataParallel._get_ddp_logging_data()``,
#: nanoseconds, averaged by DDP over its sampled iterations) and the Stats
#: they become, in seconds.
DDP_TIMINGS = (
    ("avg_forward_compute_time", "ddp.forward_compute"),
    ("avg_backward_compute_time", "ddp.backward_compute"),
    ("avg_backward_comm_time", "ddp.backward_comm"),
    ("avg_backward_compute_comm_overlap_time", "ddp.backward_compute_comm_overlap"),
)


class TrainSections:
    """The framework hooks' sections of a ``torchmon.Watchdog``
    (docs/stragglers.md): ``enter(name)`` leaves the open section and enters
    ``name``; ``beat()`` marks a step done. Sections are entered and left
    through the section object's ``__enter__`` and ``__exit__``. Every
    ``report_interval``, at a beat, DDP's compute/communication split is
    recorded when a DistributedDataParallel model was given."""

    __slots__ = ("_ddp", "_ddp_next", "_ddp_stats", "_open", "_owned", "watchdog")

    def __init__(self, watchdog: Any) -> None:
        from .._watchdog import Watchdog

        self._owned = watchdog is True
        self.watchdog: Any = Watchdog() if watchdog is True else watchdog
        self._open: Any = None
        self._ddp: Any = None
        self._ddp_next = 0.0
        self._ddp_stats: dict[str, Stat] = {}

    def enter(self, name: str) -> None:
        self.leave()
        section = self.watchdog.section(name)
        section.__enter__()
        self._open = section

    def leave(self) -> None:
        section, self._open = self._open, None
        if section is not None:
            section.__exit__(None, None, None)

    def beat(self) -> None:
        self.watchdog.beat()
        if self._ddp is not None and (now := _clock()) >= self._ddp_next:
            self._ddp_next = now + self.watchdog._report_interval
            self.record_ddp()

    def watch_ddp(self, model: Any) -> None:
        """Records DDP's timings from ``model`` if it is a
        DistributedDataParallel (whose logging data has them); else nothing."""
        if self._ddp is None and callable(getattr(model, "_get_ddp_logging_data", None)):
            self._ddp = model
            self._ddp_next = _clock() + self.watchdog._report_interval

    def record_ddp(self) -> None:
        try:
            data = self._ddp._get_ddp_logging_data()
        except Exception:  # a torch without it, or a model not set up yet
            return
        for key, name in DDP_TIMINGS:
            value = data.get(key)
            if not is_number(value) or value <= 0:
                continue  # DDP has not sampled an iteration yet
            stat = self._ddp_stats.get(name)
            if stat is None:
                window = timedelta(seconds=max(self.watchdog._report_interval, 0.001))
                stat = self._ddp_stats[name] = Stat(name, [Aggregation.VALUE], window)
            stat.add(value / 1e9)
            stat._flush_window()

    def close(self) -> None:
        self.leave()
        self._ddp = None
        if self._owned:
            self.watchdog.close()
