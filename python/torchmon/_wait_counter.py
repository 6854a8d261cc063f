"""Wait counters: time guarded blocks into a Stat.

``WaitCounter(key, window_size)`` is torchmon's public counter;
``_WaitCounter(key)`` is torch.monitor's (a 60-second window), built on it.
Both record each guarded duration, in microseconds, into the process-wide
Stat named ``key`` (aggregations COUNT, SUM and MAX), so every closed window
reaches the registered handlers as a ``torch.monitor.Stat`` event with the
keys ``<key>.count``, ``<key>.sum`` and ``<key>.max``.
"""

from __future__ import annotations

import functools
import time
import types
from collections.abc import Callable
from datetime import timedelta
from types import TracebackType

from ._core import MAX_STAT_NAME_LENGTH, Aggregation, Stat
from ._core import _window_ms as _core_window_ms
from ._errors import arg_message, arg_type_error, arg_value_error, report_unraisable
from ._forksafe import new_lock

__all__ = ["WaitCounter", "_WaitCounter", "_WaitCounterTracker"]

_DEFAULT_WINDOW = timedelta(seconds=60)
_AGGREGATIONS = (Aggregation.COUNT, Aggregation.SUM, Aggregation.MAX)
_MS = timedelta(milliseconds=1)

# One Stat per key for the whole process, as torch's counters are global:
# key -> (window in ms, Stat). Kept (only _discard_counter removes one), so a
# counter's windows outlive its WaitCounter objects (the open one is emitted
# at interpreter exit).
_counters: dict[str, tuple[int, Stat]] = {}
_counters_lock = new_lock()

# typing.TYPE_CHECKING without importing typing, which with the re module it
# imports would be a third of what `import torchmon` costs (docs/performance.md).
# Type checkers take any name TYPE_CHECKING to be true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypeVar, Union, cast

    _F = TypeVar("_F", bound=Callable[..., Any])
    _Text = Union[str, bytes, bytearray]
else:

    def cast(_type: object, value: object) -> object:
        """``typing.cast``: the value, unchanged."""
        return value


def _key_text(key: object, owner: str) -> str:
    if isinstance(key, (bytes, bytearray)):
        try:
            text = bytes(key).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise arg_value_error(owner, "key", f"is not valid UTF-8: {exc}") from None
        _check_key_length(text, owner)
        return text
    if not isinstance(key, str):
        raise arg_type_error(owner, "key", "a str", key)
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise TypeError(arg_message(owner, "key", "contains a lone surrogate")) from None
    _check_key_length(key, owner)
    return key


def _check_key_length(key: str, owner: str) -> None:
    """The key names the counter's Stat: Stat names' limit (docs/api.md)."""
    if len(key) > MAX_STAT_NAME_LENGTH:
        raise arg_value_error(
            owner,
            "key",
            f"must be at most {MAX_STAT_NAME_LENGTH} characters (it names the counter's Stat), "
            f"got {len(key)}",
        )


def _window_ms(window_size: object, owner: str) -> int:
    """``window_size`` in whole milliseconds, by the one window rule
    (docs/api.md, "Window sizes"), which lives in the binding."""
    return _core_window_ms(owner, "window_size", window_size)


def _stat_for(key: str, window_ms: int | None, owner: str) -> tuple[int, Stat]:
    """The process-wide Stat of ``key`` and its window, created on first use.

    ``window_ms=None`` (torch's ``_WaitCounter``) takes the existing Stat
    whatever its window, or creates one with a 60-second window.
    """
    with _counters_lock:
        entry = _counters.get(key)
        if entry is None:
            ms = _DEFAULT_WINDOW // _MS if window_ms is None else window_ms
            entry = (ms, Stat(key, list(_AGGREGATIONS), timedelta(milliseconds=ms)))
            _counters[key] = entry
            return entry
    existing_ms = entry[0]
    if window_ms is not None and existing_ms != window_ms:
        raise arg_value_error(
            owner,
            "window_size",
            f"must match the counter {key!r}, which already exists with a window of "
            f"{timedelta(milliseconds=existing_ms)}, not {timedelta(milliseconds=window_ms)} "
            "(a key names one process-wide Stat)",
        )
    return entry


def _discard_counter(key: str) -> None:
    """Forgets the process-wide Stat of ``key`` (for owners of a key, such as
    ``torchmon demo``): once no WaitCounter or guard refers to it any more,
    the Stat is destroyed, which emits its open window; a later counter with
    this key starts a new Stat."""
    with _counters_lock:
        entry = _counters.pop(key, None)
    del entry  # dropped outside the lock: the destruction runs handlers


def _report_unraisable(err: BaseException, stat: Stat) -> None:
    """Hands a handler's ``err`` to ``sys.unraisablehook``; never raises."""
    report_unraisable(
        err,
        stat,
        "Exception ignored in a handler of the wait counter "
        f"{stat.name!r} while another exception was propagating",
    )


def _record(stat: Stat, duration_ns: int, propagating: type[BaseException] | None) -> None:
    """Adds one duration (in µs) to ``stat``.

    With no exception propagating, an error of a handler reached by the
    window this closes is raised, as from ``Stat.add``. While one propagates
    (the guarded code raised), the program's own exception must reach its
    ``except`` clauses unchanged: the handler's error goes to
    ``sys.unraisablehook``, except that a ``KeyboardInterrupt``/``SystemExit``
    from a handler displaces an ordinary exception, the precedence rule of
    ``Stat.add`` and ``log_event`` (docs/reliability.md).
    """
    if propagating is None:
        stat.add(duration_ns / 1000.0)
        return
    try:
        stat.add(duration_ns / 1000.0)
    except BaseException as err:
        if issubclass(propagating, Exception) and not isinstance(err, Exception):
            raise
        _report_unraisable(err, stat)


def _code_flags(func: object) -> int:
    """The code flags of the function behind methods and partials (0 if none)."""
    import inspect

    while True:
        if inspect.ismethod(func):
            func = func.__func__
        elif isinstance(func, functools.partial):
            func = func.func
        else:
            break
    code = getattr(func, "__code__", None)
    return code.co_flags if isinstance(code, types.CodeType) else 0


def _call_target(func: Callable[..., Any]) -> Callable[..., Any]:
    """What a call of ``func`` runs, for telling its kind: an instance with a
    ``__call__`` method (not a function, method, partial or class) runs that."""
    import inspect

    if (
        inspect.isroutine(func)
        or isinstance(func, (type, functools.partial))
        or inspect.isgeneratorfunction(func)
        or inspect.iscoroutinefunction(func)
        or inspect.isasyncgenfunction(func)
    ):
        return func
    # Callable, so its type has a __call__ slot.
    return type(func).__call__


class _WaitCounterTracker:
    """Returned by ``guard()``: records the time spent inside it, in
    microseconds, into the counter's Stat, also when the block raises.

    Use it as a context manager (``with counter.guard(): ...``; nesting the
    same tracker works) or as a decorator (``@counter.guard()``: every call of
    the decorated function is timed on its own, so recursion, threads and
    ``async def`` functions are fine; what is timed for generator and
    coroutine functions is in docs/wait_counter_and_bridge.md). As a context
    manager, one tracker object should not be shared between threads: call
    ``guard()`` in each.
    """

    __slots__ = ("_starts", "_stat")

    def __init__(self, stat: Stat) -> None:
        self._stat = stat
        self._starts: list[int] = []

    def __enter__(self) -> _WaitCounterTracker:
        self._starts.append(time.perf_counter_ns())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        end = time.perf_counter_ns()
        if not self._starts:
            raise RuntimeError("a wait counter guard was exited without being entered")
        duration = end - self._starts.pop()
        if exc_type is None:
            self._stat.add(duration / 1000.0)
        else:
            _record(self._stat, duration, exc_type)

    def __call__(self, func: _F) -> _F:
        if not callable(func):
            raise arg_type_error("guard", "func", "a callable", func)
        # inspect costs `import torchmon` about as much as the rest of it
        # together: imported when a function is decorated (docs/performance.md).
        import inspect

        stat = self._stat
        target = _call_target(func)
        if inspect.isasyncgenfunction(target):
            return cast("_F", _timed_async_generator_function(func, stat))
        if inspect.isgeneratorfunction(target):
            if _code_flags(target) & inspect.CO_ITERABLE_COROUTINE:
                # Awaited, not iterated: its suspensions are the event loop's,
                # and a generator wrapper could not be awaited any more.
                raise TypeError(
                    arg_message(
                        "guard",
                        "func",
                        f"cannot be {func!r}: a generator-based coroutine "
                        "(types.coroutine), which guard() cannot time; make it an async "
                        "def, or time the code that awaits it with `with counter.guard():`",
                    )
                )
            return cast("_F", _timed_generator_function(func, stat))
        if inspect.iscoroutinefunction(target):

            @functools.wraps(func)
            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                with _WaitCounterTracker(stat):
                    return await func(*args, **kwargs)

            return cast("_F", timed_async)

        @functools.wraps(func)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with _WaitCounterTracker(stat):
                return func(*args, **kwargs)

        return cast("_F", timed)


def _timed_generator_function(func: Callable[..., Any], stat: Stat) -> Callable[..., Any]:
    """A generator function like ``func`` whose generators add, when they
    finish (exhausted, raising or closed), the time spent running ``func``'s
    generator: the sum of its resumptions (``next``, ``send``, ``throw``,
    ``close``), not the time the consumer holds it between items.

    It is itself a generator function (so ``inspect.isgeneratorfunction``,
    pytest fixtures and contextlib still see one), which delegates as
    ``yield from`` would but times each resumption.
    """

    @functools.wraps(func)
    def timed_generator(*args: Any, **kwargs: Any) -> Any:
        spent = 0
        failure: type[BaseException] | None = None
        start = time.perf_counter_ns()
        try:
            try:
                gen = func(*args, **kwargs)
            finally:
                spent += time.perf_counter_ns() - start
            resume: Callable[[Any], Any] = gen.send
            arg: Any = None
            while True:
                start = time.perf_counter_ns()
                try:
                    item = resume(arg)
                except StopIteration as stop:
                    return stop.value
                finally:
                    spent += time.perf_counter_ns() - start
                arg = None  # a thrown exception would keep this frame in a cycle
                try:
                    arg = yield item
                except GeneratorExit:
                    start = time.perf_counter_ns()
                    try:
                        gen.close()
                    finally:
                        spent += time.perf_counter_ns() - start
                    raise
                except BaseException as exc:
                    resume, arg = gen.throw, exc
                else:
                    resume = gen.send
        except BaseException as exc:
            failure = type(exc)
            raise
        finally:
            _record(stat, spent, failure)

    return timed_generator


def _timed_async_generator_function(func: Callable[..., Any], stat: Stat) -> Callable[..., Any]:
    """``_timed_generator_function`` for async generators: the time spent in
    the awaits of ``__anext__``, ``asend``, ``athrow`` and ``aclose`` (what
    the async generator awaits inside them included), summed."""

    @functools.wraps(func)
    async def timed_async_generator(*args: Any, **kwargs: Any) -> Any:
        spent = 0
        failure: type[BaseException] | None = None
        start = time.perf_counter_ns()
        try:
            try:
                agen = func(*args, **kwargs)
            finally:
                spent += time.perf_counter_ns() - start
            resume: Callable[[Any], Any] = agen.asend
            arg: Any = None
            while True:
                start = time.perf_counter_ns()
                try:
                    item = await resume(arg)
                except StopAsyncIteration:
                    return
                finally:
                    spent += time.perf_counter_ns() - start
                arg = None  # a thrown exception would keep this frame in a cycle
                try:
                    arg = yield item
                except GeneratorExit:
                    start = time.perf_counter_ns()
                    try:
                        await agen.aclose()
                    finally:
                        spent += time.perf_counter_ns() - start
                    raise
                except BaseException as exc:
                    resume, arg = agen.athrow, exc
                else:
                    resume = agen.asend
        except BaseException as exc:
            failure = type(exc)
            raise
        finally:
            _record(stat, spent, failure)

    return timed_async_generator


class WaitCounter:
    """A named duration counter.

    ``WaitCounter("data.load").guard()`` times a block (``with``) or every
    call of a function (as a decorator) into the Stat named ``key``, with
    COUNT, SUM and MAX in microseconds over windows of ``window_size`` (a
    ``timedelta`` or a number of seconds, at least 1 ms). All counters with
    the same key share one process-wide Stat; creating one with another
    window than the existing one raises ``ValueError``.
    """

    __slots__ = ("_key", "_stat", "_window_ms")

    def __init__(self, key: _Text, window_size: timedelta | float = _DEFAULT_WINDOW) -> None:
        # Arguments are checked in order: the first bad one decides the error.
        text = _key_text(key, "WaitCounter")
        self._bind(text, _window_ms(window_size, "WaitCounter"), "WaitCounter")

    def _bind(self, key: str, window_ms: int | None, owner: str) -> None:
        self._window_ms, self._stat = _stat_for(key, window_ms, owner)
        self._key = key

    @property
    def key(self) -> str:
        """The counter's key, also the name of its Stat."""
        return self._key

    @property
    def window_size(self) -> timedelta:
        """The length of the Stat's windows, in whole milliseconds."""
        return timedelta(milliseconds=self._window_ms)

    @property
    def stat(self) -> Stat:
        """The Stat the durations go to (``stat.get()``: the last closed window)."""
        return self._stat

    def guard(self) -> _WaitCounterTracker:
        """A guard that times one unit of work (a ``with`` block or a decorated call)."""
        return _WaitCounterTracker(self._stat)

    def __repr__(self) -> str:
        return f"torchmon.WaitCounter({self._key!r}, window_size={self.window_size!r})"


class _WaitCounter(WaitCounter):
    """torch.monitor's ``_WaitCounter(key)``: ``with _WaitCounter("my.key").guard(): ...``
    records how long the block took into the Stat named ``key`` (COUNT, SUM
    and MAX, in microseconds, over 60-second windows)."""

    __slots__ = ()

    def __init__(self, key: _Text) -> None:
        # No window argument: any existing counter of this key is taken as is.
        self._bind(_key_text(key, "_WaitCounter"), None, "_WaitCounter")

    def __repr__(self) -> str:
        return f"torchmon._WaitCounter({self._key!r})"
