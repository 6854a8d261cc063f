"""``TorchmonLogger`` and ``TorchmonCallback`` for Lightning: what
``self.log`` logs, and the step timings, as windowed Stats (docs/integrations.md).

``Trainer(logger=TorchmonLogger("torchmon"), callbacks=[TorchmonCallback()])``:
needs lightning (``pip install ".[lightning]"`` in the torchmon checkout).
"""

from __future__ import annotations

import os
from argparse import Namespace
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from .._core import Event, log_event
from .._errors import arg_type_error
from ._common import (
    DEFAULT_WINDOW,
    LOGGED_AGGREGATIONS,
    PEAK_MEMORY_AGGREGATIONS,
    LoggedStats,
    RankSinks,
    StepTimer,
    TrainSections,
    check_bool,
    check_log_dir,
    check_name,
    check_watchdog,
    check_window,
    import_framework,
    is_number,
    log_run_event,
    peak_memory_bytes,
)

_pytorch = import_framework(
    "lightning.pytorch", "lightning", "torchmon.integrations.lightning", pip_names="lightning"
)
_Logger: Any = _pytorch.loggers.Logger
_Callback: Any = _pytorch.Callback

__all__ = ["TorchmonCallback", "TorchmonLogger"]


def _flatten(
    params: Mapping[str, Any], prefix: str, out: dict[str, str | int | float | bool]
) -> None:
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Namespace):
            value = vars(value)
        if isinstance(value, Mapping):
            _flatten(value, f"{name}/", out)
        elif isinstance(value, (str, int, float, bool)):
            out[name] = value
        else:  # an Event carries str, int, float and bool only
            out[name] = repr(value)


class TorchmonLogger(_Logger):  # type: ignore[misc]
    """A Lightning logger: each metric ``self.log`` logs becomes a Stat of that
    name (COUNT, SUM, MEAN, MIN, MAX, VALUE) in windows of ``window`` (default
    60 s), per rank; ``log_hyperparams`` logs one ``<name>.hyperparams`` event
    (nested keys joined with ``/``, values other than str, int, float and
    bool as their ``repr``); ``finalize`` emits every open window.

    ``log_dir``: also register, from the first value logged (from the start
    of training when a ``TorchmonCallback`` is in the same Trainer) until
    ``finalize``, ``<log_dir>/events-rank{N}.jsonl`` and (with tensorboardX,
    unless ``tensorboard=False``) TensorBoard files in ``<log_dir>/rank{N}``.
    Unlike Lightning's built-in loggers it records on every rank, not only
    rank 0. Picklable (Lightning pickles its loggers): the copy makes its own
    Stats and opens its own sinks when it is first used.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] | None = None,
        *,
        name: str = "lightning",
        version: str | int = 0,
        window: timedelta | float = DEFAULT_WINDOW,
        tensorboard: bool = True,
    ) -> None:
        super().__init__()
        where = "TorchmonLogger"
        self._log_dir = check_log_dir(log_dir, where)
        self._name = check_name(name, "name", where)
        if isinstance(version, bool) or not isinstance(version, (str, int)):
            raise arg_type_error(where, "version", "a str or int", version)
        self._version = version
        self._window = check_window(window, where)
        self._tensorboard = check_bool(tensorboard, "tensorboard", where)
        self._logged: LoggedStats | None = None
        self._sinks: RankSinks | None = None

    @property
    def name(self) -> str:
        return self._name

    @property
    def version(self) -> str | int:
        return self._version

    @property
    def root_dir(self) -> str | None:
        return self._log_dir

    @property
    def log_dir(self) -> str | None:
        return self._log_dir

    @property
    def save_dir(self) -> str | None:
        return self._log_dir

    def _started(self) -> LoggedStats:
        if self._logged is None:
            if self._log_dir is not None:
                self._sinks = RankSinks(self._log_dir, self._tensorboard)
                self._sinks.open()
            log_run_event("lightning")
            self._logged = LoggedStats(self._window, LOGGED_AGGREGATIONS)
        return self._logged

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        logged = self._started()
        for key, value in metrics.items():
            if is_number(value):
                logged.add(key, value)
            elif hasattr(value, "item"):  # a 0-d tensor: Lightning converts them before this
                logged.add(key, float(value.item()))

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        self._started()
        if isinstance(params, Namespace):
            params = vars(params)
        data: dict[str, str | int | float | bool] = {}
        if isinstance(params, Mapping):
            _flatten(params, "", data)
        log_event(Event(f"{self._name}.hyperparams", datetime.now(), data))

    def finalize(self, status: str) -> None:
        # Dropping the Stats emits their open windows, before the sinks close.
        if self._logged is not None:
            self._logged.flush()
            self._logged = None
        if self._sinks is not None:
            self._sinks.close()
            self._sinks = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_logged"] = None  # Stats and open files stay with the original
        state["_sinks"] = None
        return state


class TorchmonCallback(_Callback):  # type: ignore[misc]
    """A Lightning callback recording, per rank, ``<prefix>.step_time`` (seconds
    from ``on_train_batch_start`` to ``on_train_batch_end``: COUNT, MEAN, P50,
    P99, MAX), ``<prefix>.data_time`` (from a batch's end to the next batch's
    start: the fetch) and, every ``Trainer(log_every_n_steps)`` batches,
    ``<prefix>.peak_memory_bytes`` when torch's CUDA allocator reports it; in
    windows of ``window`` (default 60 s), all emitted at ``on_train_end``. Its
    events go to the registered handlers, a ``TorchmonLogger(log_dir)``'s
    among them.

    ``watchdog`` (True, or a ``torchmon.Watchdog`` to use): the watchdog's
    sections timed by the hooks, with no code of yours (docs/stragglers.md):
    ``forward`` from ``on_train_batch_start`` to ``on_before_backward``,
    ``backward`` from there to ``on_after_backward``, ``optimizer`` from
    ``on_before_optimizer_step`` to ``on_train_batch_end``, ``data`` from a
    batch's end to the next batch's start; a beat at each batch's end. With
    True the watchdog is made at the start of training and closed at its
    end. Under DDP (``trainer.strategy.model`` a DistributedDataParallel),
    DDP's own compute/communication split is recorded every report interval
    as ``ddp.forward_compute``, ``ddp.backward_compute``,
    ``ddp.backward_comm`` and ``ddp.backward_compute_comm_overlap`` (seconds,
    VALUE)."""

    def __init__(
        self,
        *,
        window: timedelta | float = DEFAULT_WINDOW,
        prefix: str = "train",
        watchdog: Any = None,
    ) -> None:
        super().__init__()
        where = "TorchmonCallback"
        self._watchdog = check_watchdog(watchdog, where)
        self._sections: TrainSections | None = None
        self._window = check_window(window, where)
        self._prefix = check_name(prefix, "prefix", where)
        self._timer: StepTimer | None = None
        self._peak: LoggedStats | None = None
        self._peak_every = 50

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # A TorchmonLogger opens its log_dir sinks at its first logged value,
        # which Lightning sends only every log_every_n_steps: opened now, they
        # also get the step-time windows that close before it.
        for logger in getattr(trainer, "loggers", None) or ():
            if isinstance(logger, TorchmonLogger):
                logger._started()
        self._timer = StepTimer(self._prefix, self._window)
        self._peak = LoggedStats(self._window, PEAK_MEMORY_AGGREGATIONS)
        self._peak_every = max(1, int(getattr(trainer, "log_every_n_steps", 50) or 1))
        if self._watchdog is not None:
            self._sections = TrainSections(self._watchdog)
            self._sections.watch_ddp(getattr(getattr(trainer, "strategy", None), "model", None))

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        timer = self._timer
        if timer is not None:
            timer.begin()
        if self._sections is not None:
            self._sections.enter("forward")

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self._sections is not None:
            self._sections.enter("backward")

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        if self._sections is not None:
            self._sections.leave()

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self._sections is not None:
            self._sections.enter("optimizer")

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        sections = self._sections
        if sections is not None:
            sections.leave()
            sections.beat()
            sections.enter("data")
        timer = self._timer
        if timer is None:
            return
        timer.end()
        if batch_idx % self._peak_every == 0 and self._peak is not None:
            peak = peak_memory_bytes()
            if peak is not None:
                self._peak.add(f"{self._prefix}.peak_memory_bytes", peak)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self._sections is not None:
            self._sections.close()  # ends the data section open since the last batch
            self._sections = None
        self._timer = None
        if self._peak is not None:
            self._peak.flush()
            self._peak = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_timer"] = None
        state["_peak"] = None
        state["_sections"] = None
        if state["_watchdog"] is not None:
            state["_watchdog"] = True  # a copy makes its own watchdog
        return state
