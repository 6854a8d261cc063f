"""TensorBoard sink: Stat events become scalars (and, on request, other events' numbers)."""

from __future__ import annotations

import operator
from typing import Any, Callable, Protocol, Union

from .._core import _AGGREGATION_KEY_SUFFIXES, STAT_EVENT, Event
from .._errors import arg_message, arg_type_error, arg_value_error
from .._flush import _register_flushable
from .._forksafe import new_lock
from . import _tbx_drain

# What the argument errors name (the one format: python/torchmon/_errors.py).
_OWNER = "TensorboardEventHandler"
_STEPS = "'window', None or a callable returning an int"

# How long flush() waits for a tensorboardX writer thread to reach its marker.
_DRAIN_TIMEOUT = 10.0

__all__ = ["TensorboardEventHandler"]

#: What ``step=`` accepts: ``"window"``, ``None``, or a callable returning an int.
StepOption = Union[str, Callable[[], int], None]

_LAYOUTS = ("torch", "grouped")
# The suffixes a Stat event's keys end with ("<stat name>.<aggregation>").
_AGGREGATION_SUFFIXES = frozenset(_AGGREGATION_KEY_SUFFIXES)


class _ScalarWriter(Protocol):
    def add_scalar(self, tag: str, scalar_value: Any, *args: Any, **kwargs: Any) -> Any: ...


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _grouped_tag(key: str) -> str:
    """``"train.loss.mean"`` -> ``"train.loss/mean"``: TensorBoard puts the tags
    before the first ``/`` in one section. A key without an aggregation suffix
    (a hand-made Stat event) is kept as it is."""
    stat, dot, agg = key.rpartition(".")
    if dot and stat and agg in _AGGREGATION_SUFFIXES:
        return f"{stat}/{agg}"
    return key


class TensorboardEventHandler:
    """Writes every ``torch.monitor.Stat`` event's values as TensorBoard scalars.

    ``writer`` is a ``tensorboardX.SummaryWriter``, a
    ``torch.utils.tensorboard.SummaryWriter``, or anything with
    ``add_scalar(tag, value, global_step=..., walltime=...)``. The wall time of
    every scalar is the event's timestamp. Other events are ignored unless
    ``other_events=True``. Register it with
    ``register_event_handler(TensorboardEventHandler(writer))``.

    Keyword-only options (docs/sinks.md):

    ``step="window"`` (default)
        The step of a Stat event's scalars counts that tag's windows as this
        handler sees them: 1, 2, 3, ... for each tag. A Stat re-created under
        the same name goes on counting. TensorBoard's default loader keeps one
        point per step, so every window needs a step of its own to be shown.
    ``step=callable``
        Called with no arguments once per Stat event; the int it returns (your
        global training step, for example) is the step of that event's scalars.
    ``step=None``
        No step, as torch.monitor's handler writes them (TensorBoard reads step
        0 for each; its default loader then shows only one point per tag).
    ``layout="torch"`` (default) or ``layout="grouped"``
        The tag of a Stat key: the key itself (``train.loss.mean``, as torch),
        or ``train.loss/mean``, which puts a Stat's aggregations in one
        TensorBoard section.
    ``other_events=True``
        Also writes the numeric fields (``int``/``float``, not ``bool``) of every
        other event as scalars tagged ``<event.name>/<field>``. String and bool
        fields are skipped.
    ``step_field="name"``
        With ``other_events``: the field of that name is the ``global_step`` of
        the event's scalars (when it holds an ``int``) and is not written as a
        scalar itself. Without a usable step field an event's step is its
        ordinal among the events of its name seen by this handler (0, 1, 2, ...),
        as ``torchmon to-tensorboard`` numbers them.
    """

    __slots__ = (
        "__weakref__",
        "_grouped",
        "_lock",
        "_ordinals",
        "_other_events",
        "_step",
        "_step_field",
        "_windows",
        "_writer",
    )

    def __init__(
        self,
        writer: _ScalarWriter,
        *,
        step: StepOption = "window",
        layout: str = "torch",
        other_events: bool = False,
        step_field: str | None = None,
    ) -> None:
        if not callable(getattr(writer, "add_scalar", None)):
            raise arg_type_error(
                _OWNER, "writer", "an object with an add_scalar method (a SummaryWriter)", writer
            )
        if isinstance(step, str):
            if step != "window":
                raise arg_value_error(_OWNER, "step", f"must be {_STEPS}, not {step!r}")
        elif step is not None and not callable(step):
            raise arg_type_error(_OWNER, "step", _STEPS, step)
        if step is not None and not _takes_global_step(writer.add_scalar):
            raise TypeError(
                arg_message(
                    _OWNER,
                    "writer",
                    "has an add_scalar that takes no global_step; pass step=None to write "
                    "scalars without a step, as torch.monitor does",
                )
            )
        if not isinstance(layout, str):
            raise arg_type_error(_OWNER, "layout", "a str", layout)
        if layout not in _LAYOUTS:
            raise arg_value_error(_OWNER, "layout", f"must be 'torch' or 'grouped', not {layout!r}")
        if not isinstance(other_events, bool):
            raise arg_type_error(_OWNER, "other_events", "a bool", other_events)
        if step_field is not None and not isinstance(step_field, str):
            raise arg_type_error(_OWNER, "step_field", "a str or None", step_field)
        if step_field is not None and not other_events:
            raise arg_value_error(
                _OWNER, "step_field", "only applies to other events; pass other_events=True too"
            )
        self._writer = writer
        self._step = step
        self._grouped = layout == "grouped"
        self._other_events = other_events
        self._step_field = step_field
        self._windows: dict[str, int] = {}
        self._ordinals: dict[str, int] = {}
        # Held while a step is taken *and* its scalars are written: TensorBoard's
        # loader reads a step lower than the one before it in a tag as a restart
        # and drops the later points, so each tag's steps must reach the file in
        # increasing order even when several threads close windows at once.
        self._lock = new_lock()
        _register_flushable(self)

    def flush(self) -> None:
        """Writes out what this handler handed to the writer: waits for a
        tensorboardX writer's queue (its own ``flush()`` does not), then calls
        the writer's ``flush()`` if it has one. ``torchmon.flush()`` calls it
        after the Stats' windows reached this handler."""
        _tbx_drain.wait_for_queues(self._writer, _DRAIN_TIMEOUT)
        flush = getattr(self._writer, "flush", None)
        if callable(flush):
            flush()

    def __call__(self, event: Event) -> None:
        name = event.name
        if name == STAT_EVENT:
            self._write_stat_event(event)
        elif self._other_events:
            self._write_other_event(name, event)

    def _write_stat_event(self, event: Event) -> None:
        walltime = event.timestamp.timestamp()
        data = event.data
        grouped = self._grouped
        add_scalar = self._writer.add_scalar
        step = self._step
        if step is None:
            for key, value in data.items():
                add_scalar(_grouped_tag(key) if grouped else key, value, walltime=walltime)
            return
        if callable(step):
            global_step = _user_step(step)
            with self._lock:
                for key, value in data.items():
                    tag = _grouped_tag(key) if grouped else key
                    add_scalar(tag, value, global_step=global_step, walltime=walltime)
            return
        windows = self._windows
        with self._lock:
            for key, value in data.items():
                tag = _grouped_tag(key) if grouped else key
                window = windows.get(tag, 0) + 1
                windows[tag] = window
                add_scalar(tag, value, global_step=window, walltime=walltime)

    def _write_other_event(self, name: str, event: Event) -> None:
        data = event.data
        step_value = None
        if self._step_field is not None:
            step_value = data.pop(self._step_field, None)
        walltime = event.timestamp.timestamp()
        with self._lock:
            ordinal = self._ordinals.get(name, 0)
            self._ordinals[name] = ordinal + 1
            step = ordinal
            if isinstance(step_value, int) and not isinstance(step_value, bool):
                step = step_value
            for key, value in data.items():
                if _is_number(value):
                    self._writer.add_scalar(
                        f"{name}/{key}", value, global_step=step, walltime=walltime
                    )

    def __repr__(self) -> str:
        extra = ""
        if self._step != "window":
            extra += f", step={self._step!r}"
        if self._grouped:
            extra += ", layout='grouped'"
        if self._other_events:
            extra += f", other_events=True, step_field={self._step_field!r}"
        return f"TensorboardEventHandler({self._writer!r}{extra})"


def _takes_global_step(add_scalar: Callable[..., Any]) -> bool:
    """False only when ``add_scalar``'s signature shows it cannot take a
    ``global_step`` keyword (a writer made for torch.monitor's step-less calls)."""
    import inspect  # only here: `import torchmon` stays fast (docs/performance.md)

    try:
        parameters = inspect.signature(add_scalar).parameters
    except (TypeError, ValueError):  # no signature to read: assume a SummaryWriter
        return True
    if "global_step" in parameters:
        return parameters["global_step"].kind is not inspect.Parameter.POSITIONAL_ONLY
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def _user_step(step: Callable[[], int]) -> int:
    value = step()
    if isinstance(value, bool):
        raise TypeError(arg_message(_OWNER, "step", "returned a bool, not an int"))
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(
            arg_message(_OWNER, "step", f"must return an int, not {type(value).__name__}")
        ) from None
