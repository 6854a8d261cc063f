"""``torchmon.flush()`` (docs/api.md, docs/reliability.md).

A flush emits the open window of every live Stat (WaitCounters' included) to
the handlers registered now, waits until every AsyncEventHandler handled what
was queued before, then flushes the sinks that buffer (a TensorBoard writer).
The Stats go on with a new window.
"""

from __future__ import annotations

import sys
import threading
import types
import weakref
from typing import Any, Protocol

from . import _core

__all__ = ["flush"]


class _Flushable(Protocol):
    def flush(self) -> None: ...


# Sinks that buffer what they were handed (TensorboardEventHandler): their
# ``flush()`` runs last, after the Stats' windows reached them.
_flushables: weakref.WeakSet[Any] = weakref.WeakSet()


def _register_flushable(sink: _Flushable) -> None:
    _flushables.add(sink)


def _timeout_arg(timeout: object, where: str) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(
            f"{where}(timeout): timeout must be a number of seconds or None, "
            f"not {type(timeout).__name__}"
        )
    seconds = float(timeout)
    if not seconds >= 0.0:  # also NaN
        raise ValueError(f"{where}(timeout): timeout must be >= 0 seconds, got {timeout!r}")
    return seconds


def _flush_here(timeout: float | None) -> bool:
    """The flush, on the calling thread. Every step runs even when a handler
    raises; the first error is raised at the end (``log_event``'s rule)."""
    deadline = None if timeout is None else _monotonic() + timeout
    error: BaseException | None = None
    try:
        _core._flush_stats_now()
    except BaseException as exc:
        error = exc
    remaining = None if deadline is None else max(0.0, deadline - _monotonic())
    drained = _core._drain_async_handlers(remaining)
    for sink in list(_flushables):
        try:
            sink.flush()
        except BaseException as exc:
            displaced: BaseException | None = exc
            if error is None or (isinstance(error, Exception) and not isinstance(exc, Exception)):
                # A KeyboardInterrupt/SystemExit is not displaced by an ordinary error.
                displaced, error = error, exc
            if displaced is not None:
                _report_unraisable(
                    displaced, sink, "Exception ignored while flushing a torchmon sink"
                )
    if error is not None:
        raise error
    return bool(drained)


def _monotonic() -> float:
    import time

    return time.monotonic()


def flush(timeout: float | None = None) -> bool:
    """Emits the open window of every live Stat and WaitCounter now, to the
    handlers registered now; waits until every AsyncEventHandler handled what
    was queued before the call; then flushes the sinks that buffer
    (``TensorboardEventHandler``'s writer). The Stats go on with a new window.

    Returns ``True`` when all of it was done, ``False`` when ``timeout``
    seconds passed first. Without a timeout everything runs on the calling
    thread, and a handler error is raised after every Stat was flushed (the
    first one; the others go to ``sys.unraisablehook``, as in
    ``log_event``). With a timeout the work runs on a helper thread and the
    call returns by the deadline even when a handler is stuck (one waiting
    for a lock that the interrupted thread holds, in a signal handler); the
    work goes on in the background, and its errors go to
    ``sys.unraisablehook`` if they come after the deadline.

    Safe from any thread. From a signal handler, pass a timeout (that is what
    :func:`flush_on_signals` does): see docs/reliability.md.
    """
    seconds = _timeout_arg(timeout, "flush")
    if seconds is None:
        return _flush_here(None)
    return _flush_with_deadline(seconds)


def _flush_with_deadline(seconds: float) -> bool:
    done = threading.Event()
    outcome: dict[str, Any] = {}
    lock = threading.Lock()

    def work() -> None:
        try:
            result: Any = _flush_here(seconds)
            key = "result"
        except BaseException as exc:
            result, key = exc, "error"
        with lock:
            if outcome.get("abandoned"):
                if key == "error":
                    _report_unraisable(result, flush, "Exception ignored in torchmon.flush()")
                return
            outcome[key] = result
        done.set()

    try:
        helper = threading.Thread(target=work, name="torchmon-flush", daemon=True)
        helper.start()
    except RuntimeError:
        # No thread can be started (interpreter shutdown): flush here.
        return _flush_here(seconds)
    finished = done.wait(seconds)
    with lock:
        if not finished and not done.is_set():
            outcome["abandoned"] = True
            return False
    if "error" in outcome:
        raise outcome["error"]
    return bool(outcome["result"])


def _report_unraisable(exc: BaseException, obj: object, message: str) -> None:
    """Hands ``exc`` to ``sys.unraisablehook``; never raises."""
    try:
        hook = sys.unraisablehook
        if hook is sys.__unraisablehook__:
            # The default hook takes only the interpreter's own argument type.
            import traceback

            print(f"{message}: {obj!r}", file=sys.stderr)
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        else:
            hook(
                types.SimpleNamespace(
                    exc_type=type(exc),
                    exc_value=exc,
                    exc_traceback=exc.__traceback__,
                    err_msg=message,
                    object=obj,
                )
            )
    except BaseException:
        pass
