"""TensorBoard sink: Stat events become scalars (and, on request, other events' numbers)."""

from __future__ import annotations

from typing import Any, Protocol

from .._core import STAT_EVENT, Event
from .._flush import _register_flushable
from .._forksafe import new_lock
from . import _tbx_drain

# How long flush() waits for a tensorboardX writer thread to reach its marker.
_DRAIN_TIMEOUT = 10.0


class _ScalarWriter(Protocol):
    def add_scalar(self, tag: str, scalar_value: Any, *args: Any, **kwargs: Any) -> Any: ...


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class TensorboardEventHandler:
    """Writes every ``torch.monitor.Stat`` event's values as TensorBoard scalars.

    ``writer`` is a ``tensorboardX.SummaryWriter``, a
    ``torch.utils.tensorboard.SummaryWriter``, or anything with
    ``add_scalar(tag, value, walltime=...)``. Other events are ignored.
    Register it with ``register_event_handler(TensorboardEventHandler(writer))``.

    Opt-ins (keyword-only; torchmon extensions, the default is torch's behaviour):

    ``other_events=True``
        Also writes the numeric fields (``int``/``float``, not ``bool``) of every
        other event as scalars tagged ``<event.name>/<field>``, with the event's
        timestamp as wall time. String and bool fields are skipped.
    ``step_field="name"``
        With ``other_events``: the field of that name is the ``global_step`` of
        the event's scalars (when it holds an ``int``) and is not written as a
        scalar itself. Without a usable step field an event's step is its
        ordinal among the events of its name seen by this handler (0, 1, 2, ...),
        as ``torchmon to-tensorboard`` numbers them.
    """

    __slots__ = ("__weakref__", "_lock", "_ordinals", "_other_events", "_step_field", "_writer")

    def __init__(
        self,
        writer: _ScalarWriter,
        *,
        other_events: bool = False,
        step_field: str | None = None,
    ) -> None:
        if not callable(getattr(writer, "add_scalar", None)):
            raise TypeError(
                "TensorboardEventHandler(writer): writer must have an add_scalar method "
                f"(a SummaryWriter), not {type(writer).__name__}"
            )
        if not isinstance(other_events, bool):
            raise TypeError(
                "TensorboardEventHandler(other_events): must be a bool, "
                f"not {type(other_events).__name__}"
            )
        if step_field is not None and not isinstance(step_field, str):
            raise TypeError(
                "TensorboardEventHandler(step_field): must be a str or None, "
                f"not {type(step_field).__name__}"
            )
        if step_field is not None and not other_events:
            raise ValueError(
                "TensorboardEventHandler(step_field): only applies to other events; "
                "pass other_events=True too"
            )
        self._writer = writer
        self._other_events = other_events
        self._step_field = step_field
        self._ordinals: dict[str, int] = {}
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
            walltime = event.timestamp.timestamp()
            for key, value in event.data.items():
                self._writer.add_scalar(key, value, walltime=walltime)
            return
        if not self._other_events:
            return
        data = event.data
        with self._lock:
            ordinal = self._ordinals.get(name, 0)
            self._ordinals[name] = ordinal + 1
        step = ordinal
        step_field = self._step_field
        if step_field is not None:
            step_value = data.pop(step_field, None)
            if isinstance(step_value, int) and not isinstance(step_value, bool):
                step = step_value
        walltime = event.timestamp.timestamp()
        for key, value in data.items():
            if _is_number(value):
                self._writer.add_scalar(f"{name}/{key}", value, global_step=step, walltime=walltime)

    def __repr__(self) -> str:
        extra = ""
        if self._other_events:
            extra = f", other_events=True, step_field={self._step_field!r}"
        return f"TensorboardEventHandler({self._writer!r}{extra})"
