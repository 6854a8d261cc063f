"""Waiting for a tensorboardX writer's queue (for ``torchmon.flush()``).

tensorboardX's ``SummaryWriter.flush()`` (2.6) flushes the event file but
does not wait for the events still queued for its writer thread: a window
handed to it just before a SIGTERM would be lost. So a marker Event goes
through each file writer's queue behind everything queued so far; the writer
thread hands it to ``EventsWriter.write_event``, which is wrapped (once per
writer) to recognise the marker, drop it and report. After that every earlier
event is in the file's buffer, and ``flush()`` writes it out.

This relies on tensorboardX internals (``all_writers``, ``event_writer``,
``_event_queue``, ``_worker``, ``_ev_writer``); a writer without them is only
flushed.
"""

from __future__ import annotations

import importlib
import itertools
import threading
from queue import Full
from typing import Any

_MARKER_WALL_TIME = -1.0  # no real event has a negative wall time
_tokens = itertools.count(1)


def _wrap(events_writer: Any) -> dict[int, threading.Event]:
    markers: dict[int, threading.Event] | None = getattr(events_writer, "_torchmon_markers", None)
    if markers is not None:
        return markers
    markers = {}
    write_event = events_writer.write_event

    def write_event_or_marker(event: Any) -> Any:
        if getattr(event, "wall_time", None) == _MARKER_WALL_TIME:
            done = markers.pop(getattr(event, "step", 0), None)
            if done is not None:
                done.set()
                return None
        return write_event(event)

    events_writer.write_event = write_event_or_marker
    events_writer._torchmon_markers = markers
    return markers


def wait_for_queues(writer: object, timeout: float) -> None:
    """Waits until every tensorboardX file writer of ``writer`` handled what
    was queued before; returns at once for other writers."""
    if type(writer).__module__.split(".")[0] != "tensorboardX":
        return
    all_writers = getattr(writer, "all_writers", None)
    if not isinstance(all_writers, dict):
        return
    try:
        event_pb2: Any = importlib.import_module("tensorboardX.proto.event_pb2")
    except ImportError:
        return
    pending: list[threading.Event] = []
    for file_writer in list(all_writers.values()):
        event_writer = getattr(file_writer, "event_writer", None)
        queue = getattr(event_writer, "_event_queue", None)
        worker = getattr(event_writer, "_worker", None)
        events_writer = getattr(event_writer, "_ev_writer", None)
        if queue is None or worker is None or events_writer is None:
            continue
        if getattr(event_writer, "_closed", True) or not worker.is_alive():
            continue  # closed, or inherited through fork without its thread
        token = next(_tokens)
        done = threading.Event()
        markers = _wrap(events_writer)
        markers[token] = done
        try:
            queue.put(event_pb2.Event(wall_time=_MARKER_WALL_TIME, step=token), True, timeout)
        except Full:
            markers.pop(token, None)
            continue
        pending.append(done)
    for done in pending:
        done.wait(timeout)
