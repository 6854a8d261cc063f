"""W&B sink: each closed Stat window becomes values of a W&B run's history,
logged with ``run.log`` from a background thread (needs ``pip install
'wandb>=0.31,<0.32'``, the ``wandb`` extra). See docs/sinks.md, "W&B".

``wandb`` is imported when a handler is created, never by ``import
torchmon``. The queue, the thread, the retries, ``flush()``, the exit and the
fork are :class:`torchmon.handlers._tracker.TrackerEventHandler`'s.

The step. W&B keeps one history row per step and drops a ``run.log`` whose
``step=`` is lower than the run's current step (checked with wandb 0.31:
the values are lost, with a warning). With the default step, the window's
number per Stat, a Stat closing a window every second reaches step 60 while
one closing every minute logs step 1: its windows would all be dropped. So
the handler logs *without* ``step=`` (each call is a new row of the run)
and puts the window's step in the row as ``torchmon/step``, declared the
x-axis of every key it logs (``run.define_metric(key,
step_metric="torchmon/step")``): no window is dropped, whatever the rates.
"""

from __future__ import annotations

import os
from typing import Any

from .._core import Event
from .._errors import arg_type_error, arg_value_error
from ._common import require, shortened
from ._tracker import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_QUEUE,
    Row,
    StepOption,
    TrackerEventHandler,
)

__all__ = ["STEP_METRIC", "WandbEventHandler", "wandb_key"]

_OWNER = "WandbEventHandler"

#: The key of each row holding the window's step: the x-axis of the keys
#: the handler logs. A Stat key always has a ``.``, so none is this one.
STEP_METRIC = "torchmon/step"


def wandb_key(key: str) -> str:
    """The W&B key of a Stat key: ``"train.loss.mean"`` stays as is.

    ``run.log`` keeps any non-empty key, but ``run.define_metric`` (which
    makes ``torchmon/step`` the key's x-axis) refuses a ``*`` that is not
    the last character and reads a final ``*`` as a glob and ``\\`` as an
    escape: both become ``_``, and the key gets ``-`` and 8 hex digits of
    its SHA-256 before its last ``.<suffix>``, so that ``a*b`` and ``a_b``
    stay two keys.
    """
    name = key.replace("*", "_").replace("\\", "_")
    return name if name == key else shortened(name, key, len(name) + 9, tagged=True)


def _metric_name(key: str) -> str:
    # define_metric reads "." as a path into nested dicts: escaped.
    return key.replace(".", "\\.")


def _summary_value(value: object) -> Any:
    if isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


class WandbEventHandler(TrackerEventHandler):
    """Logs each closed Stat window to a W&B run, off the logging thread.

    ``WandbEventHandler(run=None, *, project=None, group=None, name=None,
    step=None, other_events=True, max_queue=10000, batch_size=1000,
    export_timeout=5.0, retry_interval=2.0)``

    - ``run``: the W&B run (``wandb.init(...)``'s); ``None``: ``wandb.run``
      when there is one, else the handler starts a run with ``wandb.init``
      (``project``; ``group``, ``None``: the torchrun job id under torchrun;
      ``name``, ``None``: ``rank<rank>``; ``config``: the rank labels of
      ``torchmon.rank_info()`` and ``host``; ``tags``: ``rank<rank>``,
      ``node<node>``) and finishes it at :meth:`close` and at exit.
      ``project``, ``group`` and ``name`` only with ``run=None``.
    - ``step``: ``None``: the window's number per Stat (1, 2, 3...); or a
      callable returning the step (``lambda: global_step``), called when
      the window closes. Logged as ``torchmon/step``, the x-axis of the
      handler's keys (module docstring: not ``run.log``'s ``step=``).
    - ``other_events``: Events other than Stat windows go to the run's
      summary as ``<event name>.<field>`` (the last value wins); ``False``
      ignores them.
    - ``max_queue``, ``batch_size``, ``export_timeout``, ``retry_interval``:
      the queue and the delivery (docs/sinks.md, "Experiment trackers").
    """

    _OWNER = _OWNER
    _renames_because = "W&B's define_metric refuses it as it is"
    # wandb's run lives in the process that started it (its service
    # connection and locks are not the child's: logging there fails or
    # hangs); docs/sinks.md, "Fork and exit".
    _fork_refused = "W&B cannot log to a run from a forked process"
    _tracker_key = staticmethod(wandb_key)

    __slots__ = (
        "_created",
        "_defined",
        "_group",
        "_name",
        "_other_events",
        "_project",
        "_wb_run",
    )

    def __init__(
        self,
        run: Any = None,
        *,
        project: str | None = None,
        group: str | None = None,
        name: str | None = None,
        step: StepOption = None,
        other_events: bool = True,
        max_queue: int = DEFAULT_MAX_QUEUE,
        batch_size: int = DEFAULT_BATCH_SIZE,
        export_timeout: float | None = None,
        retry_interval: float | None = None,
    ) -> None:
        require(_OWNER, "wandb", library="W&B", pip_name="'wandb>=0.31,<0.32'", extra="wandb")
        import wandb

        if run is not None and not (
            callable(getattr(run, "log", None)) and callable(getattr(run, "define_metric", None))
        ):
            raise arg_type_error(_OWNER, "run", "a wandb Run or None", run)
        for arg, value in (("project", project), ("group", group), ("name", name)):
            if value is not None and not isinstance(value, str):
                raise arg_type_error(_OWNER, arg, "a str or None", value)
            if value == "":
                raise arg_value_error(_OWNER, arg, "must not be empty")
            if value is not None and run is not None:
                raise arg_value_error(
                    _OWNER, arg, "is for the run the handler starts: not with run="
                )
        if not isinstance(other_events, bool):
            raise arg_type_error(_OWNER, "other_events", "a bool", other_events)
        self._project = project
        self._group = group
        self._name = name
        self._other_events = other_events
        self._defined: set[str] = set()
        self._created = 0  # the pid of the process that started the run
        if run is None and project is None and group is None and name is None:
            run = wandb.run
        self._wb_run = run
        super().__init__(
            destination="W&B",
            step=step,
            max_queue=max_queue,
            batch_size=batch_size,
            export_timeout=export_timeout,
            retry_interval=retry_interval,
        )
        if run is None:
            try:
                self._start()
            except Exception as exc:
                self._report_line(
                    f"cannot start a W&B run now ({type(exc).__name__}: {exc}): "
                    "retried from the sender thread"
                )
        # wandb finishes its runs in an atexit hook registered by wandb.init:
        # the handler's exit close is registered again now, to run first.
        if self._at_exit is not None:
            self._close_at_exit()

    @property
    def run(self) -> Any:
        """The W&B run the windows go to; ``None`` until the handler could start it."""
        return self._wb_run

    # --- TrackerEventHandler's hooks ----------------------------------------

    def _start(self) -> None:
        if self._wb_run is not None:
            return
        import wandb

        from .._rank import rank_info

        info = rank_info()
        group = self._group
        if group is None and info.run_id is not None:
            group = info.run_id
        self._wb_run = wandb.init(
            project=self._project,
            group=group,
            name=self._name if self._name is not None else f"rank{info.rank}",
            config={**info.labels(), "host": info.host},
            tags=[f"rank{info.rank}", f"node{info.node}"],
        )
        self._created = os.getpid()

    def _send(self, batch: list[Row]) -> None:
        run = self._wb_run
        assert run is not None  # _start ran
        # One run.log per step: the rows of every window with that step, in
        # the order their steps first came (a key seen twice at one step,
        # two windows of a Stat, starts a second row).
        groups: list[tuple[int, dict[str, float]]] = []
        by_step: dict[int, dict[str, float]] = {}
        key = self._key
        defined = self._defined
        for name, value, step, _ in batch:
            k = key(name)
            if k not in defined:
                if not defined:
                    run.define_metric(STEP_METRIC, hidden=True)
                run.define_metric(_metric_name(k), step_metric=STEP_METRIC)
                defined.add(k)
            values = by_step.get(step)
            if values is None or k in values:
                values = {}
                by_step[step] = values
                groups.append((step, values))
            values[k] = value
        for step, values in groups:
            values[STEP_METRIC] = step
            run.log(values)

    def _other(self, event: Event) -> Any:
        if not self._other_events:
            return None
        return (event.name, event.data)

    def _send_others(self, items: list[Any]) -> None:
        run = self._wb_run
        assert run is not None
        latest: dict[str, Any] = {}
        for name, data in items:
            for field, value in data.items():
                latest[self._key(f"{name}.{field}")] = _summary_value(value)
        run.summary.update(latest)

    def _finish(self) -> None:
        if self._created == os.getpid() and self._wb_run is not None:
            self._wb_run.finish()

    def __repr__(self) -> str:
        run = self._wb_run
        run_id = getattr(run, "id", None) if run is not None else None
        return f"WandbEventHandler(run={run_id!r})"
