"""``TorchmonCallback``: torchmon's step timings and the Trainer's logged values
as windowed Stats, for the Hugging Face ``Trainer`` (docs/integrations.md).

``Trainer(..., callbacks=[TorchmonCallback(log_dir="torchmon")])``: needs
transformers and accelerate (``pip install ".[transformers]"`` in the
torchmon checkout).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from .._core import Event, log_event
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

_TrainerCallback: Any = import_framework(
    "transformers",
    "transformers",
    "torchmon.integrations.transformers",
    pip_names="transformers accelerate",
).TrainerCallback

__all__ = ["TorchmonCallback"]

# Only the figures Trainer.train logs once, at its end, carry these: one
# event, not Stat samples (with token counting, every log has train_runtime).
_SUMMARY_KEYS = frozenset(("train_samples_per_second", "train_steps_per_second", "train_loss"))


class TorchmonCallback(_TrainerCallback):  # type: ignore[misc]
    """Records, per rank, in windows of ``window`` (default 60 s):

    - ``<prefix>.step_time``: seconds from ``on_step_begin`` to ``on_step_end``
      (COUNT, MEAN, P50, P99, MAX); ``<prefix>.data_time``: seconds from a
      step's end to the next step's begin (the batch fetch).
    - every number the Trainer logs (``on_log``): ``loss`` as
      ``<prefix>.loss``, ``learning_rate``, ``grad_norm``, ``epoch``, ...;
      ``eval_<name>`` as ``eval.<name>`` (COUNT, SUM, MEAN, MIN, MAX, VALUE).
      The end-of-training figures (``train_steps_per_second`` ...) are one
      ``<prefix>.summary`` event.
    - ``<prefix>.tokens_per_second`` at each step's end when the Trainer counts
      input tokens (``TrainingArguments(include_num_input_tokens_seen=True)``:
      the tokens of all ranks, as the Trainer counts them).
    - ``<prefix>.peak_memory_bytes`` at each logging step when torch's CUDA
      allocator reports it.

    ``watchdog`` (True, or a ``torchmon.Watchdog`` to use): the watchdog's
    sections timed by the hooks, with no code of yours (docs/stragglers.md):
    ``compute`` from ``on_step_begin`` to ``on_pre_optimizer_step`` (forward
    and backward), ``optimizer`` from there to ``on_optimizer_step``,
    ``data`` from ``on_step_end`` to the next ``on_step_begin`` (the batch
    fetch, logging, evaluation, checkpoints); a beat at each ``on_step_end``.
    With True the watchdog is made at the start of training and closed at
    its end; DDP's compute/communication split is recorded when the model
    the Trainer passes to callbacks is a DistributedDataParallel (the Trainer
    passes the unwrapped model: usually not).

    A ``torchmon.run`` event at the start names the rank
    (``torchmon.rank_info()``). ``on_train_end`` emits every open window.
    ``log_dir``: also register, for the run, ``<log_dir>/events-rank{N}.jsonl``
    and (with tensorboardX, unless ``tensorboard=False``) TensorBoard files in
    ``<log_dir>/rank{N}``; without it, the events go to the handlers you
    registered.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] | None = None,
        *,
        window: timedelta | float = DEFAULT_WINDOW,
        prefix: str = "train",
        tensorboard: bool = True,
        watchdog: Any = None,
    ) -> None:
        where = "TorchmonCallback"
        self._watchdog = check_watchdog(watchdog, where)
        self._sections: TrainSections | None = None
        self._window = check_window(window, where)
        self._prefix = check_name(prefix, "prefix", where)
        log_dir = check_log_dir(log_dir, where)
        self._sinks = (
            None
            if log_dir is None
            else RankSinks(log_dir, check_bool(tensorboard, "tensorboard", where))
        )
        self._timer: StepTimer | None = None
        self._logged: LoggedStats | None = None
        self._tokens_per_second: Any = None
        self._tokens_seen = 0
        self._tokens_since = 0.0

    # The Trainer calls these with (args, state, control, **kwargs).

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._sinks is not None:
            self._sinks.open()
        log_run_event("transformers")
        self._timer = StepTimer(self._prefix, self._window)
        self._logged = LoggedStats(self._window, LOGGED_AGGREGATIONS)
        counts_tokens = getattr(args, "include_num_input_tokens_seen", "no") not in ("no", False)
        if counts_tokens:
            from .._core import Stat

            self._tokens_per_second = Stat(
                f"{self._prefix}.tokens_per_second", LOGGED_AGGREGATIONS[:-1], self._window
            )
            self._tokens_seen = int(state.num_input_tokens_seen)
        self._tokens_since = 0.0
        if self._watchdog is not None:
            self._sections = TrainSections(self._watchdog)
            self._sections.watch_ddp(kwargs.get("model"))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        timer = self._timer
        if timer is not None:
            timer.begin()
        if self._sections is not None:
            self._sections.enter("compute")

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._sections is not None:
            self._sections.enter("optimizer")

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._sections is not None:
            self._sections.leave()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        sections = self._sections
        if sections is not None:
            sections.leave()
            sections.beat()
            sections.enter("data")
        timer = self._timer
        if timer is None:
            return
        now = timer.end()
        if self._tokens_per_second is not None:
            # An int the Trainer already gathered and converted: no device sync here.
            seen = state.num_input_tokens_seen
            if self._tokens_since and now > self._tokens_since:
                self._tokens_per_second.add((seen - self._tokens_seen) / (now - self._tokens_since))
            self._tokens_seen = seen
            self._tokens_since = now

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if not logs or self._logged is None:
            return
        if _SUMMARY_KEYS.intersection(logs):
            from datetime import datetime

            data = {key: value for key, value in logs.items() if is_number(value)}
            data["global_step"] = int(state.global_step)
            log_event(Event(f"{self._prefix}.summary", datetime.now(), data))
            return
        for key, value in logs.items():
            if not is_number(value):
                continue
            if key.startswith("eval_"):
                name = f"eval.{key[5:]}"
            else:
                name = f"{self._prefix}.{key}"
            self._logged.add(name, value)
        peak = peak_memory_bytes()
        if peak is not None:
            # The peak of a window is what matters: MAX (and the last reading).
            self._logged.add(f"{self._prefix}.peak_memory_bytes", peak, PEAK_MEMORY_AGGREGATIONS)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Dropping the Stats emits their open windows before the sinks close.
        if self._sections is not None:
            self._sections.close()  # ends the data section open since the last step
            self._sections = None
        self._timer = None
        if self._logged is not None:
            self._logged.flush()
            self._logged = None
        self._tokens_per_second = None
        if self._sinks is not None:
            self._sinks.close()
