"""A tracker sink whose ``_send`` records batches or fails on demand
(tests/sinks/test_tracker_base.py; imported by its child processes too)."""

from __future__ import annotations

import threading
import time
from typing import Any

from torchmon import Event
from torchmon.handlers._tracker import Row, TrackerEventHandler


class Fake(TrackerEventHandler):
    _OWNER = "FakeTracker"
    __slots__ = ("batches", "down", "others", "slow")

    def __init__(self, **kwargs: Any) -> None:
        self.batches: list[list[Row]] = []
        self.others: list[Any] = []
        self.down = threading.Event()
        self.slow = 0.0
        super().__init__(destination="the fake", **kwargs)

    def _send(self, batch: list[Row]) -> None:
        if self.slow:
            time.sleep(self.slow)
        if self.down.is_set():
            raise ConnectionRefusedError("refused")
        self.batches.append(batch)

    def _other(self, event: Event) -> Any:
        return (event.name, event.data)

    def _send_others(self, items: list[Any]) -> None:
        if self.down.is_set():
            raise ConnectionRefusedError("refused")
        self.others.extend(items)

    def rows(self) -> list[Row]:
        return [row for batch in self.batches for row in batch]
