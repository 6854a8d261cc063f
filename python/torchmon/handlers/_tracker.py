"""What the experiment-tracker sinks share (``MLflowEventHandler``, and a W&B
one): the delivery of Stat windows to a remote tracker from one background
thread, never from the thread that closed the window (docs/sinks.md,
"Experiment trackers").

The contract of :class:`TrackerEventHandler` for a subclass
-----------------------------------------------------------

The base does the queueing, the thread, the retries, the outage report,
``flush()``, ``close()``, the exit and the fork; a subclass says how a batch
reaches its tracker. It sets the class attribute ``_OWNER`` (the class name,
for messages) and, in its ``__init__``, calls ``super().__init__(...)`` with
the shared arguments (below) and ``destination=`` (a short text naming where
the data goes, for the stderr lines). It overrides:

- ``_send(batch)`` (required), on the sender thread: delivers ``batch``, a
  list of :data:`Row` ``(key, value, step, timestamp_ms)``, at most
  ``batch_size`` rows, in the order the windows closed; the rows of one
  window are never split across two batches unless the window alone has
  more than ``batch_size`` values. Raises on failure: the same rows are
  offered again after ``retry_interval`` seconds (a tracker may then hold
  some of them twice: rows are idempotent for MLflow, whose metric
  history is keyed by key, step, timestamp and value).
- ``_start()`` (optional), on the sender thread, before the first
  ``_send``: connects, creates the run. Raising is an outage like a failed
  send; it is called again before the next attempt.
- ``_other(event)`` (optional), on the logging thread: what to queue for an
  Event that is not a Stat window (``None``, the default: nothing); it must
  be cheap. ``_send_others(items)`` (optional), on the sender thread,
  delivers a list of them (after the rows queued before them).
- ``_finish()`` (optional), on the closing thread, once, after the last
  delivery or the ``export_timeout`` that bounds it: ends what ``_start``
  began (an MLflow run the handler created).

The W&B subclass (``wandb.py``) is ``_start``: ``wandb.init`` (or the
active run); ``_send``: the rows grouped by step, one ``run.log(dict)`` per
step with the step in the dict (not ``step=``: W&B drops a lower one);
``_finish``: ``run.finish()`` if it started the run.

Shared arguments (keyword-only, checked here; errors name ``_OWNER``):
``step`` (``None``: each window's number per Stat, 1, 2, 3...; a callable:
its ``int`` result, called on the logging thread when the window closes),
``max_queue`` (windows and other events held while the tracker is slow or
down; beyond it the oldest are dropped and counted in ``dropped``),
``batch_size`` (rows per ``_send``), ``export_timeout`` (seconds that
``flush()`` and ``close()``, so the exit, wait at most), ``retry_interval``
(seconds between attempts during an outage).

State, fork and exit: the queue, the counters and the sender thread live in
the handler. A forked child's copy starts with an empty queue, zero counts
and no thread (a step of ``_lifecycle._after_fork_in_child``); its thread
starts with its first window, and it delivers the child's windows through a
``_start`` of its own, unless ``_fork_refused`` names why the tracker cannot
(W&B): the child's windows are then dropped, counted and said once. The
child's exit flush flushes it too (``_flushes_in_children``), so a
``multiprocessing`` child, which ends without atexit, delivers before it
ends. ``_start_early(seconds)`` (the MLflow constructor) starts the sender
at once and waits at most ``seconds`` for its ``_start``. At exit the handler
is closed after torchmon's exit flush and after the local sinks were flushed
(``_lifecycle.close_at_exit``); ``torchmon.flush()`` flushes it after the
local sinks (``_flushes_remotely``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections import deque
from itertools import islice
from typing import Any, Callable, Union

from .._core import STAT_EVENT, Event
from .._errors import arg_type_error, check_int, check_optional_seconds
from .._flush import _flush_local_sinks, _register_flushable
from .._forksafe import new_lock
from ._common import ClosesAtExit, set_numeric_values

__all__ = ["DEFAULT_EXPORT_TIMEOUT", "Row", "TrackerEventHandler"]

#: ``(key, value, step, timestamp_ms)``: one value of one window.
Row = tuple[str, float, int, int]
StepOption = Union[None, Callable[[], int]]

# As OpenTelemetryEventHandler's: a preempted job has about 30 s between
# SIGTERM and SIGKILL.
DEFAULT_EXPORT_TIMEOUT = 5.0
DEFAULT_MAX_QUEUE = 10_000
DEFAULT_BATCH_SIZE = 1_000
DEFAULT_RETRY_INTERVAL = 2.0

# The live handlers of this process, for the fork step.
_handlers: weakref.WeakSet[TrackerEventHandler] = weakref.WeakSet()


def _reset_in_child() -> None:
    """A step of ``_lifecycle._after_fork_in_child``: every handler forgets
    the parent's queue and thread (the parent delivers them)."""
    for handler in list(_handlers):
        handler._reset_after_fork()


class _Window:
    """A Stat window as queued by the logging thread: converted to rows on
    the sender thread."""

    __slots__ = ("data", "step", "timestamp")

    def __init__(self, data: Any, step: int, timestamp: Any) -> None:
        self.data = data
        self.step = step
        self.timestamp = timestamp


class TrackerEventHandler(ClosesAtExit):
    """The base of the tracker sinks (module docstring: the subclass contract)."""

    # torchmon.flush() and the exit flush it after the sinks that write locally.
    _flushes_remotely = True
    # It forgets the parent's queue at a fork: a child's flush is its own.
    _flushes_in_children = True
    _OWNER = "TrackerEventHandler"
    #: Why a forked child cannot deliver (W&B); "" when it can.
    _fork_refused = ""

    __slots__ = (
        "__weakref__",
        "_batch_size",
        "_delivered",
        "_destination",
        "_dropped",
        "_drops_said",
        "_enqueued",
        "_failed_at",
        "_failing",
        "_failures",
        "_flushed_drops",
        "_idle",
        "_in_flight_popped",
        "_last_ok",
        "_lock",
        "_maker_pid",
        "_max_queue",
        "_outage_dropped",
        "_owner_pid",
        "_queue",
        "_renamed",
        "_reported_rename",
        "_retry_interval",
        "_sending_end",
        "_sleeping",
        "_slow_said",
        "_started",
        "_step",
        "_stop",
        "_thread",
        "_timeout",
        "_wake",
        "_windows",
    )

    def __init__(
        self,
        *,
        destination: str,
        step: StepOption = None,
        max_queue: int = DEFAULT_MAX_QUEUE,
        batch_size: int = DEFAULT_BATCH_SIZE,
        export_timeout: float | None = None,
        retry_interval: float | None = None,
        max_batch_size: int | None = None,
    ) -> None:
        owner = self._OWNER
        if step is not None and not callable(step):
            raise arg_type_error(owner, "step", "None or a callable returning an int", step)
        self._step = step
        self._max_queue = check_int(owner, "max_queue", max_queue, low=1)
        self._batch_size = check_int(owner, "batch_size", batch_size, low=1, high=max_batch_size)
        timeout = check_optional_seconds(owner, "export_timeout", export_timeout, finite=True)
        self._timeout = DEFAULT_EXPORT_TIMEOUT if timeout is None else timeout
        retry = check_optional_seconds(owner, "retry_interval", retry_interval, finite=True)
        self._retry_interval = DEFAULT_RETRY_INTERVAL if retry is None else retry
        self._destination = destination
        self._renamed: dict[str, str] = {}  # Stat key -> the tracker's name of it
        self._reported_rename = False
        self._lock = new_lock()
        self._closed = False
        self._at_exit = None
        self._maker_pid = os.getpid()
        self._reset_after_fork()
        _handlers.add(self)
        _register_flushable(self)  # type: ignore[arg-type]  # its flush returns a bool
        self._close_at_exit()

    def _reset_after_fork(self) -> None:
        self._owner_pid = os.getpid()
        self._queue: deque[Any] = deque()
        self._windows: dict[str, int] = {}  # Stat name -> windows seen (the default step)
        self._dropped = 0
        self._outage_dropped = 0
        self._sending_end = 0  # the sequence number after the batch being sent
        self._in_flight_popped = 0  # items of that batch popped by a full queue
        self._flushed_drops = 0  # _dropped when a flush last returned
        self._drops_said = False
        self._slow_said = False
        self._enqueued = 0  # items queued so far
        # Items delivered or dropped so far: the sequence number of the
        # queue's head.
        self._delivered = 0
        self._failing = False
        self._failures = 0  # failed attempts: a flush in an outage waits for one
        self._failed_at = 0.0  # time.monotonic() of the last one
        self._started = False
        self._last_ok = time.time()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._idle = threading.Condition(new_lock())
        self._stop = False
        self._sleeping = False

    # --- the logging thread ---------------------------------------------

    @property
    def dropped(self) -> int:
        """Windows (and other events) dropped because the queue was full."""
        return self._dropped

    @property
    def pending(self) -> int:
        """Windows (and other events) queued and not yet delivered."""
        return len(self._queue)

    def __call__(self, event: Event) -> None:
        if self._closed:
            return
        if event.name == STAT_EVENT:
            data = event.data
            step = self._step
            if step is None:
                stat = next(iter(data), "").rpartition(".")[0]
                windows = self._windows
                number = windows.get(stat, 0) + 1
                windows[stat] = number
            else:
                number = step()
                if isinstance(number, bool) or not hasattr(number, "__index__"):
                    raise arg_type_error(self._OWNER, "step", "a callable returning an int", number)
                number = int(number)
            item: Any = _Window(data, number, event.timestamp)
        else:
            item = self._other(event)
            if item is None:
                return
        self._put(item)

    def _put(self, item: Any) -> None:
        if self._fork_refused and self._maker_pid != self._owner_pid:
            self._dropped += 1
            if not self._drops_said:
                self._drops_said = True
                self._report_line(
                    f"this forked child's windows are not sent to {self._destination} "
                    f"({self._fork_refused}); they are dropped, counted in .dropped"
                )
            return
        with self._lock:
            queue = self._queue
            full = len(queue) >= self._max_queue
            if full:
                queue.popleft()
                if self._delivered < self._sending_end:
                    self._in_flight_popped += 1  # dropped only if its send fails
                else:
                    self._dropped += 1
                    self._outage_dropped += 1
                self._delivered += 1
            queue.append(item)
            self._enqueued += 1
            thread = self._thread
        # During an outage its first line said that the oldest are dropped.
        if full and not self._drops_said and not self._failing:
            self._drops_said = True
            self._report_line(
                f"more than max_queue={self._max_queue} windows wait for {self._destination}: "
                "the oldest are dropped, counted in .dropped (the total is said at close)"
            )
        if thread is None:
            self._start_thread()
        # The sender is woken only when it waits for work: not while it
        # sends (it takes what came meanwhile next), nor during an outage
        # (it retries every retry_interval, or when flush() asks).
        if self._sleeping and not self._failing:
            self._wake.set()

    def _start_early(self, seconds: float) -> None:
        """Starts the sender, which calls ``_start`` at once, and waits at most
        ``seconds`` for that first attempt."""
        self._start_thread()
        deadline = time.monotonic() + seconds
        with self._idle:
            while not (self._started or self._failures) and self._thread is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._idle.wait(min(left, 0.05))

    def _start_thread(self) -> None:
        with self._lock:
            if self._thread is not None or self._stop:
                return
            thread = threading.Thread(target=self._run, name=f"torchmon-{self._OWNER}", daemon=True)
            self._thread = thread
        try:
            thread.start()
        except RuntimeError:  # interpreter shutdown: close() delivers on its thread
            with self._lock:
                self._thread = None

    # --- the sender thread ------------------------------------------------

    def _take(self) -> tuple[list[Row], list[Any], int]:
        """Up to batch_size rows (whole windows) and the other events before
        the next window, from the head of the queue, left there until
        delivered; and the sequence number of the item after them."""
        rows: list[Row] = []
        others: list[Any] = []
        with self._lock:
            items = list(islice(self._queue, self._batch_size))
            first = self._delivered
        taken = 0
        for item in items:
            if isinstance(item, _Window):
                if others:
                    break
                converted = _rows(item)
                if rows and len(rows) + len(converted) > self._batch_size:
                    break
                rows.extend(converted)
            else:
                if rows:
                    break
                others.append(item)
            taken += 1
        self._sending_end = first + taken
        return rows, others, first + taken

    def _deliver_once(self) -> bool:
        """Delivers the head of the queue; False on failure (reported)."""
        with self._lock:
            if not self._queue:
                return True
        rows, others, end = self._take()
        try:
            self._start_once()
            batch_size = self._batch_size
            for i in range(0, len(rows), batch_size):
                self._send(rows[i : i + batch_size])
            if others:
                self._send_others(others)
        except Exception as exc:
            with self._lock:
                self._dropped += self._in_flight_popped
                self._outage_dropped += self._in_flight_popped
                self._in_flight_popped = 0
                self._sending_end = 0
            self._report_failure(exc)
            return False
        with self._lock:
            self._in_flight_popped = 0
            # _delivered is the sequence number of the queue's head (the
            # oldest items dropped meanwhile count too).
            queue = self._queue
            while self._delivered < end and queue:
                queue.popleft()
                self._delivered += 1
        if self._failing:
            self._report_recovery()
        self._last_ok = time.time()
        return True

    def _start_once(self) -> None:
        if not self._started:
            self._start()
            self._started = True

    def _run(self) -> None:
        try:
            self._start_once()
        except Exception as exc:
            self._report_failure(exc)
        with self._idle:
            self._idle.notify_all()
        while True:
            # Flagged before the queue is looked at: a window queued
            # meanwhile either is seen here or sees the flag and wakes us.
            self._sleeping = True
            if not self._queue or self._failing:
                self._wake.wait(self._retry_interval if self._failing else None)
            self._sleeping = False
            self._wake.clear()
            while self._queue:
                if not self._deliver_once():
                    break
            with self._idle:
                self._idle.notify_all()
            if self._stop and not self._queue:
                return
            if self._stop and self._failing:
                return

    # --- flush and close --------------------------------------------------

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until every window queued before the call was delivered, at
        most ``timeout`` seconds (``None``: ``export_timeout``). Returns
        whether they were and none was dropped since the previous flush.
        During an outage a flush without ``timeout`` (``torchmon.flush()``'s)
        waits for one attempt, and for none when the last one failed less
        than ``retry_interval`` ago (the sender retries on its own)."""
        if self._owner_pid != os.getpid():
            self._reset_after_fork()
        dropped = self._dropped != self._flushed_drops
        self._flushed_drops = self._dropped
        delivered = self._wait(timeout)
        if delivered:
            self._slow_said = False
        elif not self._failing and not self._slow_said:
            self._slow_said = True  # the outage line, or this one, said it
            self._report_line(
                f"{len(self._queue)} windows not delivered to {self._destination} within "
                f"{self._timeout if timeout is None else timeout:g} s; they stay queued "
                "(said once until a flush delivers)"
            )
        return delivered and not dropped

    def _wait(self, timeout: float | None) -> bool:
        target = self._enqueued
        if self._delivered >= target:
            return not self._failing
        one_attempt = timeout is None and self._failing
        if one_attempt and time.monotonic() - self._failed_at < self._retry_interval:
            return False
        if self._thread is None:
            self._start_thread()
            if self._thread is None:
                # No thread can be started (interpreter shutdown): here.
                while self._queue and self._deliver_once():
                    pass
                return self._delivered >= target
        failures = self._failures
        self._wake.set()  # during an outage: try now
        deadline = time.monotonic() + (self._timeout if timeout is None else timeout)
        with self._idle:
            while self._delivered < target and self._thread is not None:
                left = deadline - time.monotonic()
                if left <= 0 or (one_attempt and self._failures != failures):
                    break
                self._idle.wait(min(left, 0.05))
        return self._delivered >= target

    def close(self) -> None:
        """Delivers what is queued (waiting at most ``export_timeout``),
        stops the sender thread and ends what the handler started (an MLflow
        run it created). Later events are ignored. Idempotent."""
        self._close(at_exit=False)

    def _close(self, *, at_exit: bool) -> None:
        if not self._begin_close():
            return
        if at_exit:
            # The local sinks first: a dead tracker must not keep them waiting.
            _flush_local_sinks()
        if self._owner_pid != os.getpid():
            self._reset_after_fork()
        start = time.monotonic()
        if self._queue:
            self._wait(self._timeout)
        with self._lock:
            self._stop = True
        self._wake.set()
        lost = len(self._queue)
        said = [f"{lost} windows still queued were not delivered and are lost"] if lost else []
        if self._dropped:
            said.append(f"{self._dropped} were dropped in all (max_queue={self._max_queue})")
        if said:
            self._report_line(f"at close, to {self._destination}: " + "; ".join(said))
        if self._failing:
            return  # ending a run needs the tracker too
        left = max(0.0, self._timeout - (time.monotonic() - start))
        done = threading.Event()

        def finish() -> None:
            try:
                self._finish()
            except Exception as exc:
                self._report_line(f"closing failed: {_reason(exc)}")
            finally:
                done.set()

        try:
            threading.Thread(target=finish, name="torchmon-tracker-close", daemon=True).start()
        except RuntimeError:  # interpreter shutdown
            finish()
        if not done.wait(left):
            self._report_line(f"closing did not finish within export_timeout={self._timeout:g} s")

    def _key(self, key: str) -> str:
        """Sender thread: the tracker's name of ``key`` (``_tracker_key``);
        the first renamed key is reported, once."""
        name = self._renamed.get(key)
        if name is None:
            name = self._tracker_key(key)
            if name != key and not self._reported_rename:
                self._reported_rename = True
                self._report_line(
                    f"key {key!r} sent as {name!r} ({self._renames_because}); "
                    "later renamed keys are not reported"
                )
            self._renamed[key] = name
        return name

    # --- subclass hooks ---------------------------------------------------

    #: Why ``_tracker_key`` renames a key, for the report of the first one.
    _renames_because = ""

    @staticmethod
    def _tracker_key(key: str) -> str:
        """The tracker's name of a Stat key (a pure function of it)."""
        return key

    def _start(self) -> None:
        """Sender thread, before the first send (and again after a failed one)."""

    def _send(self, batch: list[Row]) -> None:
        raise NotImplementedError

    def _other(self, event: Event) -> Any:
        """Logging thread: what to queue for an Event that is not a Stat window."""
        return None

    def _send_others(self, items: list[Any]) -> None:
        """Sender thread: delivers what ``_other`` returned."""

    def _finish(self) -> None:
        """Closing thread, once: ends what ``_start`` began."""

    # --- reports ------------------------------------------------------------

    def _report_failure(self, exc: BaseException) -> None:
        self._failures += 1
        self._failed_at = time.monotonic()
        if self._failing:
            return
        self._failing = True
        since = time.strftime("%H:%M:%S", time.localtime(self._last_ok))
        self._report_line(
            f"the windows since {since} were not delivered to {self._destination}: "
            f"{_reason(exc)}; retrying every {self._retry_interval:g} s, keeping the "
            f"newest {self._max_queue} windows"
        )

    def _report_recovery(self) -> None:
        self._failing = False
        dropped = self._outage_dropped
        self._outage_dropped = 0
        self._report_line(
            f"delivering to {self._destination} again"
            + (f"; {dropped} windows were dropped meanwhile" if dropped else "")
        )

    def _report_line(self, text: str) -> None:
        try:
            sys.stderr.write(f"torchmon: {self._OWNER}: {text}\n")
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            pass  # no stderr (closed, or None under pythonw)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first[:300]}" if first else type(exc).__name__


def _rows(window: _Window) -> list[Row]:
    """A window's numeric values as rows (``bool`` and ``str`` values are
    skipped, as by the gauge sinks)."""
    timestamp_ms = int(window.timestamp.timestamp() * 1000)
    step = window.step
    rows: list[Row] = []
    append = rows.append

    def add(key: str, value: float) -> None:
        append((key, float(value), step, timestamp_ms))

    set_numeric_values(window.data, _same, add)
    return rows


def _same(key: str) -> str:
    return key
