"""TensorBoard sink: Stat events become scalars (and, on request, other events' numbers).

Two writers: a user's ``SummaryWriter`` (``TensorboardEventHandler(writer)``,
torch.monitor's API), or torchmon's own event-file writer
(``TensorboardEventHandler.logdir(path)``: crates/torchmon-core/src/
tensorboard/, one ``Event`` per window queued to a background thread, and
each window's distribution as a histogram; docs/sinks.md, "TensorBoard").
"""

from __future__ import annotations

import operator
import os
import weakref
from typing import TYPE_CHECKING, Any, Callable, Protocol, Union

from .._core import _AGGREGATION_KEY_SUFFIXES, STAT_EVENT, Event, _TensorboardWriter
from .._errors import arg_message, arg_type_error, arg_value_error
from .._flush import _register_flushable
from .._forksafe import new_lock
from . import _tbx_drain
from ._common import ClosesOnExit

if TYPE_CHECKING:
    from .._core import Distribution
# What the argument errors name (the one format: python/torchmon/_errors.py).
_OWNER = "TensorboardEventHandler"
_STEPS = "'window', None or a callable returning an int"

# How long flush() waits for a tensorboardX writer thread to reach its marker.
_DRAIN_TIMEOUT = 10.0
# How long the exit step waits for a native writer's queue to reach the file.
_EXIT_FLUSH_TIMEOUT = 10.0

# The native writers made in this process, flushed at exit (_lifecycle.py).
_native_writers: weakref.WeakSet[_TensorboardWriter] = weakref.WeakSet()

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


class TensorboardEventHandler(ClosesOnExit):
    """Writes every ``torch.monitor.Stat`` event's values as TensorBoard scalars.

    ``writer`` is a ``tensorboardX.SummaryWriter``, a
    ``torch.utils.tensorboard.SummaryWriter``, or anything with
    ``add_scalar(tag, value, global_step=..., walltime=...)``. The wall time of
    every scalar is the event's timestamp. Other events are ignored unless
    ``other_events=True``. Register it with
    ``register_event_handler(TensorboardEventHandler(writer))``.

    ``TensorboardEventHandler.logdir(path)`` writes with torchmon's own
    event-file writer instead (no tensorboardX needed): each window one
    event, its distribution a histogram. See :meth:`logdir`.

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
        "_histograms",
        "_lock",
        "_native",
        "_ordinals",
        "_other_events",
        "_step",
        "_step_field",
        "_summary",
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
        _check_step(step)
        if step is not None and not _takes_global_step(writer.add_scalar):
            raise TypeError(
                arg_message(
                    _OWNER,
                    "writer",
                    "has an add_scalar that takes no global_step; pass step=None to write "
                    "scalars without a step, as torch.monitor does",
                )
            )
        _check_options(layout, other_events, step_field)
        self._writer: _ScalarWriter | None = writer
        self._native: _TensorboardWriter | None = None
        self._histograms = False
        self._summary = _summary_class(writer)
        self._configure(step, layout, other_events, step_field)

    @classmethod
    def logdir(
        cls,
        path: str | os.PathLike[str],
        *,
        filename_suffix: str = "",
        histograms: bool = True,
        step: StepOption = "window",
        layout: str = "torch",
        other_events: bool = False,
        step_field: str | None = None,
    ) -> TensorboardEventHandler:
        """A handler writing an event file of its own in the directory
        ``path`` (made if missing), named as TensorBoard expects
        (``events.out.tfevents.<secs>.<host>.<pid>.<n><filename_suffix>``),
        with torchmon's native writer: neither tensorboardX nor torch needed.

        - Each window is one TensorBoard ``Event``: its scalars in one
          ``Summary`` (float32, as TensorBoard stores scalars, NaN and the
          infinities included), the event's timestamp as its wall time.
        - ``histograms=True`` (default): a window that carries a
          distribution (a Stat with a P aggregation) also writes it as a
          histogram tagged ``<stat>.histogram`` (``<stat>/histogram`` with
          ``layout="grouped"``), from its scale-6 buckets.
        - The calling thread only queues the window; a background thread
          encodes it and appends it to the file, one whole record per write.
          ``torchmon.flush()``, ``flush_on_signals`` and the interpreter's
          exit wait until the queue reached the file.
        - A directory that cannot be made or written raises ``OSError``
          naming the path. A write that fails later (a full disk) prints one
          line to stderr and drops windows until a write succeeds, then one
          more line says how many were lost; the file holds only whole records.
        - A file or directory removed while running (``rm -rf`` of the log
          directory, a log rotation): within a second one line on stderr,
          and a new file (the directory made again) takes the later windows;
          ``path`` then names it. Event files are created with ``O_EXCL``
          and ``O_NOFOLLOW``: a name planted in the directory is never
          written through.
        - In a forked child the handler writes nothing (the file is the
          parent's); make a handler in the child for a file of its own.
        - ``close()`` (or leaving a ``with`` block) writes what is queued and
          closes the file; later windows are dropped.

        ``step``, ``layout``, ``other_events`` and ``step_field`` are the
        constructor's (docs/sinks.md, "TensorBoard").
        """
        call = f"{_OWNER}.logdir"
        if not isinstance(path, (str, os.PathLike)):
            raise arg_type_error(call, "path", "a str or os.PathLike path", path)
        folder = os.fspath(path)
        if not isinstance(folder, str):
            raise arg_type_error(call, "path", "a str path", folder)
        if not folder:
            raise arg_value_error(call, "path", "must not be empty")
        if not isinstance(filename_suffix, str):
            raise arg_type_error(call, "filename_suffix", "a str", filename_suffix)
        if "/" in filename_suffix or os.sep in filename_suffix or "\0" in filename_suffix:
            raise arg_value_error(
                call, "filename_suffix", "must not hold a path separator or a NUL"
            )
        if not isinstance(histograms, bool):
            raise arg_type_error(call, "histograms", "a bool", histograms)
        _check_step(step)
        _check_options(layout, other_events, step_field)
        try:
            native = _TensorboardWriter(folder, filename_suffix)
        except OSError as exc:
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            failed = exc.filename if exc.filename is not None else folder
            raise OSError(
                exc.errno,
                f"{call}: cannot write a TensorBoard event file in {folder!r} ({reason})",
                os.fspath(failed),
            ) from None
        _native_writers.add(native)
        self = cls.__new__(cls)
        self._writer = None
        self._summary = None
        self._native = native
        self._histograms = histograms
        self._configure(step, layout, other_events, step_field)
        return self

    def _configure(
        self, step: StepOption, layout: str, other_events: bool, step_field: str | None
    ) -> None:
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

    @property
    def path(self) -> str | None:
        """The event file of a handler made by :meth:`logdir`; ``None`` for
        one over a ``SummaryWriter``."""
        native = self._native
        return None if native is None else os.fspath(native.path)

    def close(self) -> None:
        """Closes the event file of a handler made by :meth:`logdir` once
        what is queued is written; a handler over a ``SummaryWriter`` leaves
        the writer to its owner (nothing happens). A second call does nothing."""
        native = self._native
        if native is not None:
            native.close(None)

    def flush(self) -> None:
        """Writes out what this handler handed to the writer: for
        :meth:`logdir`, waits until its queue reached the file; otherwise
        waits for a tensorboardX writer's queue (its own ``flush()`` does
        not), then calls the writer's ``flush()`` if it has one.
        ``torchmon.flush()`` calls it after the Stats' windows reached this
        handler."""
        native = self._native
        if native is not None:
            native.flush(None)
            return
        _tbx_drain.wait_for_queues(self._writer, _DRAIN_TIMEOUT)
        flush = getattr(self._writer, "flush", None)
        if callable(flush):
            flush()

    def __call__(self, event: Event) -> None:
        name = event.name
        if name == STAT_EVENT:
            if self._native is not None:
                self._write_stat_natively(self._native, event)
            else:
                self._write_stat_event(event)
        elif self._other_events:
            self._write_other_event(name, event)

    def _write_stat_natively(self, native: _TensorboardWriter, event: Event) -> int:
        """One Event per step: per window, unless a tag's window count
        drifted from its Stat's other tags'. Queued under the lock, so that
        each tag's steps reach the file in order. Returns the number of
        scalars (``torchmon to-tensorboard`` counts them)."""
        walltime = event.timestamp.timestamp()
        grouped = self._grouped
        tags: list[str] = []
        values: list[float] = []
        for key, value in event.data.items():
            kind = value.__class__
            # The exact types first: a Stat's values are floats and ints.
            if kind is float or kind is int or _is_number(value):
                tags.append(_grouped_tag(key) if grouped else key)
                values.append(value)  # type: ignore[arg-type]  # a number: checked above
        histogram: tuple[str, Distribution] | None = None
        if self._histograms:
            distribution = getattr(event, "distribution", None)
            if distribution is not None and tags:
                histogram = (_histogram_tag(tags[0], grouped), distribution)
        step = self._step
        if step is None:
            native.write(walltime, 0, tags, values, histogram)
            return len(tags)
        if callable(step):
            global_step = _user_step(step)
            with self._lock:
                native.write(walltime, global_step, tags, values, histogram)
            return len(tags)
        windows = self._windows
        get = windows.get
        with self._lock:
            steps = [get(tag, 0) + 1 for tag in tags]
            if histogram is not None:
                steps.append(get(histogram[0], 0) + 1)
            windows.update(zip(tags, steps))
            if histogram is not None:
                windows[histogram[0]] = steps[-1]
            if not steps:
                return 0
            first = steps[0]
            if steps.count(first) == len(steps):
                native.write(walltime, first, tags, values, histogram)
                return len(tags)
            # The tags' window counts differ (a Stat re-created with other
            # aggregations): one Event per step.
            by_step: dict[int, tuple[list[str], list[float]]] = {}
            for tag, value, window in zip(tags, values, steps):
                group = by_step.setdefault(window, ([], []))
                group[0].append(tag)
                group[1].append(value)
            for window, (group_tags, group_values) in by_step.items():
                native.write(walltime, window, group_tags, group_values)
            if histogram is not None:
                native.write(walltime, steps[-1], [], [], histogram)
        return len(tags)

    def _write_stat_summary(self, summary_class: Any, event: Event) -> None:
        """What ``add_scalar`` per item writes, as one ``Summary`` per step
        (per window) handed to the writer's file writer: the same tags,
        values (float32 ``simple_value``), steps and wall time in the file,
        at a fraction of the cost (docs/performance.md, "TensorBoard")."""
        walltime = event.timestamp.timestamp()
        grouped = self._grouped
        items = [
            (_grouped_tag(key) if grouped else key, float(value))
            for key, value in event.data.items()
        ]
        value_class = summary_class.Value
        writer: Any = self._writer
        step = self._step
        if step is None:
            summary = summary_class(value=[value_class(tag=t, simple_value=v) for t, v in items])
            writer._get_file_writer().add_summary(summary, None, walltime)
            return
        if callable(step):
            global_step = _user_step(step)
            summary = summary_class(value=[value_class(tag=t, simple_value=v) for t, v in items])
            with self._lock:
                writer._get_file_writer().add_summary(summary, global_step, walltime)
            return
        windows = self._windows
        with self._lock:
            by_step: dict[int, list[Any]] = {}
            for tag, value in items:
                window = windows.get(tag, 0) + 1
                windows[tag] = window
                by_step.setdefault(window, []).append(value_class(tag=tag, simple_value=value))
            file_writer = writer._get_file_writer()
            for window, values in by_step.items():
                file_writer.add_summary(summary_class(value=values), window, walltime)

    def _write_stat_event(self, event: Event) -> None:
        if self._summary is not None:
            self._write_stat_summary(self._summary, event)
            return
        walltime = event.timestamp.timestamp()
        data = event.data
        grouped = self._grouped
        assert self._writer is not None
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
            if self._native is not None:
                tags: list[str] = []
                values: list[float] = []
                for key, value in data.items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        tags.append(f"{name}/{key}")
                        values.append(value)
                if tags:
                    self._native.write(walltime, step, tags, values)
                return
            assert self._writer is not None
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
        if self._native is not None:
            if not self._histograms:
                extra += ", histograms=False"
            return f"TensorboardEventHandler.logdir({self.path!r}{extra})"
        return f"TensorboardEventHandler({self._writer!r}{extra})"


def _histogram_tag(first_tag: str, grouped: bool) -> str:
    """``<stat>.histogram`` (``<stat>/histogram`` grouped), the Stat's name
    read from its first key (``<stat>.<aggregation>``)."""
    stat = first_tag.rpartition("/" if grouped else ".")[0] or first_tag
    return f"{stat}/histogram" if grouped else f"{stat}.histogram"


def _check_step(step: StepOption) -> None:
    if isinstance(step, str):
        if step != "window":
            raise arg_value_error(_OWNER, "step", f"must be {_STEPS}, not {step!r}")
    elif step is not None and not callable(step):
        raise arg_type_error(_OWNER, "step", _STEPS, step)


def _check_options(layout: str, other_events: bool, step_field: str | None) -> None:
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


def _flush_native_at_exit() -> None:
    """The exit step (torchmon/_lifecycle.py): every native writer of this
    process writes its queue out, each waited for up to 10 s."""
    for native in list(_native_writers):
        native.flush(_EXIT_FLUSH_TIMEOUT)


def _summary_class(writer: object) -> Any:
    """The ``Summary`` protobuf class of ``writer``'s library when the
    handler may hand it one summary per window instead of calling
    ``add_scalar`` per item: a tensorboardX or torch ``SummaryWriter`` whose
    ``add_scalar`` is the library's own (a subclass that overrides it gets
    its calls) and, for tensorboardX, with Comet logging off (its
    ``add_scalar`` also logs each scalar to Comet). ``None`` otherwise."""
    import importlib  # only here: `import torchmon` stays fast (docs/performance.md)

    library = type(writer).__module__.split(".")[0]
    if library == "tensorboardX":
        writer_module, proto = "tensorboardX", "tensorboardX.proto.summary_pb2"
        comet = getattr(writer, "_comet_config", None)
        if not isinstance(comet, dict) or comet.get("disabled") is not True:
            return None
    elif type(writer).__module__.startswith("torch.utils.tensorboard"):
        writer_module, proto = "torch.utils.tensorboard", "tensorboard.compat.proto.summary_pb2"
    else:
        return None
    try:
        own = importlib.import_module(writer_module).SummaryWriter
        summary_pb2: Any = importlib.import_module(proto)
    except (ImportError, AttributeError):
        return None
    if not isinstance(writer, own) or type(writer).add_scalar is not own.add_scalar:
        return None
    if not callable(getattr(writer, "_get_file_writer", None)):
        return None
    return summary_pb2.Summary


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
