"""TensorBoard sink: Stat events become scalars."""

from __future__ import annotations

from typing import Any, Protocol

from .._core import STAT_EVENT, Event


class _ScalarWriter(Protocol):
    def add_scalar(self, tag: str, scalar_value: Any, *args: Any, **kwargs: Any) -> Any: ...


class TensorboardEventHandler:
    """Writes every ``torch.monitor.Stat`` event's values as TensorBoard scalars.

    ``writer`` is a ``tensorboardX.SummaryWriter``, a
    ``torch.utils.tensorboard.SummaryWriter``, or anything with
    ``add_scalar(tag, value, walltime=...)``. Other events are ignored.
    Register it with ``register_event_handler(TensorboardEventHandler(writer))``.
    """

    __slots__ = ("_writer",)

    def __init__(self, writer: _ScalarWriter) -> None:
        if not callable(getattr(writer, "add_scalar", None)):
            raise TypeError(
                "TensorboardEventHandler(writer): writer must have an add_scalar method "
                f"(a SummaryWriter), not {type(writer).__name__}"
            )
        self._writer = writer

    def __call__(self, event: Event) -> None:
        if event.name != STAT_EVENT:
            return
        walltime = event.timestamp.timestamp()
        for key, value in event.data.items():
            self._writer.add_scalar(key, value, walltime=walltime)

    def __repr__(self) -> str:
        return f"TensorboardEventHandler({self._writer!r})"
