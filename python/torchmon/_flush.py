"""``torchmon.flush()``, ``torchmon.flush_on_signals()`` and the flush of
``multiprocessing`` children (docs/api.md, docs/reliability.md).

A flush emits the open window of every live Stat (WaitCounters' included) to
the handlers registered now, waits until every AsyncEventHandler handled what
was queued before, then flushes the sinks that buffer (a TensorBoard writer).
The Stats go on with a new window.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections.abc import Iterable
from types import FrameType

from . import _core, _tensors
from ._errors import arg_message, arg_type_error, arg_value_error, check_optional_seconds
from ._errors import report_unraisable as _report_unraisable
from ._forksafe import new_lock

# typing costs about 9 ms of `import torchmon` (docs/performance.md): its
# names are for type checkers only here, as in the package's __init__.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
    from typing import Any, Callable, Protocol, Union

    class _Flushable(Protocol):
        def flush(self) -> None: ...

    _Handler = Union[Callable[[int, Union[FrameType, None]], Any], int, signal.Handlers, None]

# ``signal`` is imported where it is used: it costs about 1 ms, 2% of
# ``import torchmon``, for an opt-in feature.

__all__ = ["SignalFlush", "flush", "flush_on_signals"]


# Sinks that buffer what they were handed (TensorboardEventHandler): their
# ``flush()`` runs last, after the Stats' windows reached them. Each is
# flushed only in the process that made it: a forked child inherits the
# object but not its writer thread (tensorboardX's flush would wait for ever).
# Keyed by id(): a sink subclass may be unhashable (``__eq__`` without
# ``__hash__``).
_flushables: dict[int, tuple[weakref.ref[Any], int]] = {}


def _register_flushable(sink: _Flushable) -> None:
    key = id(sink)

    def forget(_ref: object) -> None:
        _flushables.pop(key, None)

    _flushables[key] = (weakref.ref(sink, forget), os.getpid())


def _timeout_arg(timeout: object, where: str) -> float | None:
    return check_optional_seconds(where, "timeout", timeout, zero=True)


class _FirstError:
    """``log_event``'s rule: the first exception is raised at the end, except
    that a KeyboardInterrupt/SystemExit is not displaced by an ordinary one;
    the others go to ``sys.unraisablehook``."""

    def __init__(self) -> None:
        self.error: BaseException | None = None

    def add(self, exc: BaseException, obj: object) -> None:
        displaced: BaseException | None = exc
        error = self.error
        if error is None or (isinstance(error, Exception) and not isinstance(exc, Exception)):
            displaced, self.error = error, exc
        if displaced is not None:
            _report_unraisable(displaced, obj, "Exception ignored in torchmon.flush()")

    def raise_it(self) -> None:
        if self.error is not None:
            raise self.error


def _flush_here(timeout: float | None) -> bool:
    """The flush, on the calling thread. Every step runs even when a handler
    raises; the first error is raised at the end (``log_event``'s rule)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    errors = _FirstError()
    try:
        # Device tensors not read yet go to their windows first.
        _tensors.read_pending()
    except BaseException as exc:
        errors.add(exc, flush)
    try:
        _core._flush_stats_now()
    except BaseException as exc:
        errors.add(exc, flush)
    remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
    drained = False
    try:
        drained = _core._drain_async_handlers(remaining)
    except BaseException as exc:  # a Ctrl-C while waiting
        errors.add(exc, flush)
    # The sinks that write locally first, then those that send over the
    # network (OpenTelemetry's exporter): a dead collector, waited for up to
    # its handler's export_timeout, delays no local file.
    for sink in sorted(_live_flushables(), key=_sends_remotely):
        try:
            # A tracker sink's False: a timeout, or windows dropped.
            if sink.flush() is False:
                drained = False
        except BaseException as exc:
            errors.add(exc, sink)
    errors.raise_it()
    return bool(drained)


def _sends_remotely(sink: object) -> bool:
    return bool(getattr(sink, "_flushes_remotely", False))


def _live_flushables() -> list[Any]:
    """The registered sinks made in this process, and those that flush in
    forked children too (the tracker sinks), still alive."""
    pid = os.getpid()
    sinks = []
    for ref, owner in list(_flushables.values()):
        sink = ref()
        if sink is not None and (owner == pid or getattr(sink, "_flushes_in_children", False)):
            sinks.append(sink)
    return sinks


def _flush_local_sinks() -> None:
    """Flushes the registered sinks that write locally (the exit of a
    network sink calls it before its own last export); errors go to
    ``sys.unraisablehook``."""
    for sink in _live_flushables():
        if _sends_remotely(sink):
            continue
        try:
            sink.flush()
        except Exception as exc:
            _report_unraisable(exc, sink, "Exception ignored in torchmon's exit flush")


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


# The helper of the last flush with a timeout: (pid, set when it ended). One
# at a time: a flush(timeout=0) every step while a sink is stuck must not
# pile up a thread per call.
_helper: tuple[int, threading.Event] | None = None
_helper_lock = new_lock()


def _flush_with_deadline(seconds: float) -> bool:
    global _helper
    deadline = time.monotonic() + seconds
    previous = _helper
    if previous is not None and previous[0] == os.getpid():
        if not previous[1].wait(seconds):
            return False  # still busy with an earlier flush: it goes on
    # Not blocking: a signal handler's flush may have interrupted the holder.
    if not _helper_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
        return False
    try:
        previous = _helper
        if previous is not None and previous[0] == os.getpid() and not previous[1].is_set():
            return False  # another thread started one meanwhile
        ended = threading.Event()
        _helper = (os.getpid(), ended)
    finally:
        _helper_lock.release()
    seconds = max(0.0, deadline - time.monotonic())
    done = threading.Event()
    outcome: dict[str, Any] = {}
    lock = threading.Lock()

    def work() -> None:
        try:
            result: Any = _flush_here(seconds)
            key = "result"
        except BaseException as exc:
            result, key = exc, "error"
        finally:
            ended.set()
        with lock:
            abandoned = outcome.get("abandoned", False)
            if not abandoned:
                outcome[key] = result
                done.set()  # under the lock: the caller decides on one state
        if abandoned and key == "error":
            _report_unraisable(result, flush, "Exception ignored in torchmon.flush()")

    try:
        helper = threading.Thread(target=work, name="torchmon-flush", daemon=True)
        helper.start()
    except RuntimeError:
        # No thread can be started (interpreter shutdown): flush here.
        ended.set()
        return _flush_here(seconds)
    done.wait(seconds)
    with lock:
        if not done.is_set():
            outcome["abandoned"] = True
            return False
    if "error" in outcome:
        raise outcome["error"]
    return bool(outcome["result"])


# --- flush_on_signals -------------------------------------------------------

# How long a signal's flush may take before the signal goes on regardless.
_SIGNAL_FLUSH_TIMEOUT = 10.0


class _OnSignal:
    """The handler ``flush_on_signals`` installs for one signal."""

    __slots__ = ("busy", "previous", "signum", "timeout")

    def __init__(self, signum: int, previous: _Handler, timeout: float) -> None:
        self.signum = signum
        self.previous = previous
        self.timeout = timeout
        self.busy = False

    def __call__(self, signum: int, frame: FrameType | None) -> Any:
        interrupt: BaseException | None = None
        if not self.busy:  # a second signal during the flush goes on at once
            self.busy = True
            try:
                flush(timeout=self.timeout)
            except (KeyboardInterrupt, SystemExit) as exc:
                interrupt = exc  # raised after the signal went on, if we survive it
            except BaseException as exc:
                _report_unraisable(exc, self, "Exception ignored in torchmon's signal flush")
            finally:
                self.busy = False
        result = self._go_on(signum, frame)
        if interrupt is not None:
            raise interrupt
        return result

    def _go_on(self, signum: int, frame: FrameType | None) -> Any:
        import signal

        previous = self.previous
        if callable(previous):
            return previous(signum, frame)
        # SIG_DFL: die of the signal as if no handler had been installed, so
        # that the parent sees -signum (128 + signum in a shell).
        signal.signal(signum, signal.SIG_DFL)
        try:
            signal.raise_signal(signum)
        finally:
            # Still alive (a signal whose default is to ignore or to stop):
            # keep flushing on the next one.
            if signal.getsignal(signum) == signal.SIG_DFL:
                signal.signal(signum, self)
        return None

    def __repr__(self) -> str:
        import signal

        return f"<torchmon flush on {signal.Signals(self.signum).name}>"


class SignalFlush:
    """Returned by :func:`flush_on_signals`: the signals it handles, and
    :meth:`restore` to put back the handlers that were there before."""

    __slots__ = ("_handlers", "signals")

    def __init__(self, handlers: dict[int, _OnSignal]) -> None:
        import signal

        self._handlers = handlers
        self.signals: tuple[signal.Signals, ...] = tuple(signal.Signals(s) for s in handlers)

    def restore(self) -> None:
        """Reinstalls each signal's previous handler where torchmon's is still
        installed (a handler installed since is left alone). Main thread only."""
        import signal

        _check_main_thread("SignalFlush.restore")
        for signum, handler in self._handlers.items():
            if signal.getsignal(signum) is handler:
                signal.signal(signum, handler.previous)

    def __enter__(self) -> SignalFlush:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.restore()

    def __repr__(self) -> str:
        names = ", ".join(s.name for s in self.signals)
        return f"<torchmon.SignalFlush ({names})>"


def _check_main_thread(where: str) -> None:
    if threading.current_thread() is not threading.main_thread():
        raise ValueError(
            f"torchmon.{where}() must be called from the main thread: Python runs "
            "signal handlers only there, and only the main thread may install them"
        )


def _signals_arg(signals: object) -> list[int]:
    import signal

    if isinstance(signals, int):
        signals = (signals,)
    try:
        items = list(signals)  # type: ignore[call-overload]
    except TypeError:
        raise arg_type_error(
            "flush_on_signals", "signals", "an iterable of signal numbers", signals
        ) from None
    result: list[int] = []
    uncatchable = {getattr(signal, n) for n in ("SIGKILL", "SIGSTOP") if hasattr(signal, n)}
    valid = signal.valid_signals()
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int):
            raise TypeError(
                arg_message(
                    "flush_on_signals",
                    "signals",
                    f"must hold ints or signal.Signals, not {type(item).__name__}",
                )
            )
        if item not in valid:
            raise arg_value_error(
                "flush_on_signals", "signals", f"must not hold {item}: not a valid signal number"
            )
        if item in uncatchable:
            name = signal.Signals(item).name
            raise arg_value_error(
                "flush_on_signals", "signals", f"must not hold {name}: {name} cannot be caught"
            )
        if int(item) not in result:
            result.append(int(item))
    return result


def flush_on_signals(
    signals: Iterable[int] | None = None,
    *,
    timeout: float = _SIGNAL_FLUSH_TIMEOUT,
) -> SignalFlush:
    """Flushes (:func:`flush`) when one of ``signals`` (by default
    ``(signal.SIGTERM, signal.SIGHUP)``) arrives, then lets the
    signal do what it would have done: the previous Python handler is called
    if there was one; otherwise the default disposition is restored and the
    signal raised again, so the process still ends killed by it (exit status
    -15 for SIGTERM as seen by the parent, 143 in a shell).

    Opt-in: call it once, from the main thread, early in the program. A
    signal that was ignored (``SIG_IGN``, as under ``nohup``, which ignores
    SIGHUP before Python starts) stays ignored and is not flushed on, as
    CPython leaves an ignored SIGINT ignored. Calling it again keeps the handlers already
    installed (it never chains to itself). ``timeout`` bounds the flush (10 s
    by default); the signal goes on after it either way. Returns a
    :class:`SignalFlush` whose ``restore()`` puts the previous handlers back.
    """
    import signal

    _check_main_thread("flush_on_signals")
    if signals is None:
        # SIGHUP does not exist on Windows.
        signals = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))
    seconds = _timeout_arg(timeout, "flush_on_signals")
    if seconds is None:
        raise arg_type_error("flush_on_signals", "timeout", "a number of seconds", timeout)
    wanted = _signals_arg(signals)
    previous = {signum: signal.getsignal(signum) for signum in wanted}
    for signum, handler in previous.items():
        if handler is None:
            name = signal.Signals(signum).name
            raise arg_value_error(
                "flush_on_signals",
                "signals",
                f"must not hold {name}: {name} has a handler that was not installed from "
                "Python; torchmon cannot call it after the flush",
            )
    installed: dict[int, _OnSignal] = {}
    for signum, handler in previous.items():
        if isinstance(handler, _OnSignal):
            installed[signum] = handler  # already ours: no second layer
            continue
        if handler == signal.SIG_IGN:
            continue
        ours = _OnSignal(signum, handler, seconds)
        signal.signal(signum, ours)
        installed[signum] = ours
    return SignalFlush(installed)


# --- multiprocessing children -------------------------------------------------

# multiprocessing ends its fork and forkserver children with os._exit() right
# after its own exit function (util._exit_function, which runs the
# util.Finalize callbacks), so atexit never runs there. Each such child gets a
# Finalize that flushes. It is registered from multiprocessing's after-fork
# hooks (run in the child by process._bootstrap, after the finalizers
# inherited from the parent were cleared). multiprocessing is not imported
# for it: it costs more than importing torchmon.

_FINALIZE_PRIORITY = 100  # before multiprocessing's queues (10) and pools (15) close
_finalizer: tuple[int, Any] | None = None  # (pid, util.Finalize) registered last
_after_forker_registered = False


class _Hook:
    """The object multiprocessing's after-fork registry refers to (weakly)."""

    __slots__ = ("__weakref__",)


_HOOK = _Hook()


def _flush_at_child_exit() -> None:
    try:
        _flush_here(None)
    except BaseException as exc:
        _report_unraisable(exc, _flush_at_child_exit, "Exception ignored in torchmon's exit flush")


def _register_child_finalizer(_hook: object = None) -> None:
    global _finalizer
    pid = os.getpid()
    # still_active(): process._bootstrap clears the registry after a fork.
    if _finalizer is not None and _finalizer[0] == pid and _finalizer[1].still_active():
        return
    from multiprocessing import util

    _finalizer = (pid, util.Finalize(None, _flush_at_child_exit, exitpriority=_FINALIZE_PRIORITY))


def _hook_multiprocessing() -> None:
    """Registers with multiprocessing, if it is imported, so that its children
    flush; called at import and in every forked child (torchmon/_lifecycle.py:
    multiprocessing imported after torchmon is hooked at the fork that makes
    the child, before process._bootstrap runs the after-fork hooks)."""
    global _after_forker_registered
    mp = sys.modules.get("multiprocessing")
    util = sys.modules.get("multiprocessing.util")
    if mp is None or util is None:
        return
    if not _after_forker_registered:
        util.register_after_fork(_HOOK, _register_child_finalizer)
        _after_forker_registered = True
    if mp.parent_process() is not None:
        # torchmon imported inside a child's run(): after the after-fork hooks.
        _register_child_finalizer()
