"""The watchdog's straggler scores from the entries the ranks publish in the
store (docs/stragglers.md), one report tick driven by hand against an
in-memory store: the fastest rank's p50 of the same tick over this rank's;
an entry of an older tick (a rank whose reporter is late) is not compared,
and is read again until it is of this tick or the read ends. The real
torchrun run: tests/integrations/test_watchdog_stragglers.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import torchmon

PREFIX = "torchmon/watchdog/"
TICK = 5


class MemoryStore:
    """The part of a c10d store the watchdog uses."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.lock = threading.Lock()

    def set(self, key: str, value: str | bytes) -> None:
        with self.lock:
            self.data[key] = value.encode() if isinstance(value, str) else value

    def check(self, keys: list[str]) -> bool:
        with self.lock:
            return all(key in self.data for key in keys)

    def get(self, key: str) -> bytes:
        with self.lock:
            return self.data[key]

    def publish(self, rank: int, tick: int, p50: dict[str, float]) -> None:
        entry = {"rank": rank, "tick": tick, "time": 0.0, "beats": 1, "since_beat": 0.0,
                 "timeout": 60.0, "section": "", "p50": p50}  # fmt: skip
        self.set(f"{PREFIX}{rank}", json.dumps(entry))


@pytest.fixture
def recorded() -> Iterator[dict[str, list[float]]]:
    found: dict[str, list[float]] = {}

    def handler(event: torchmon.Event) -> None:
        for key, value in event.data.items():
            if key.startswith("straggler.") and isinstance(value, float):
                found.setdefault(key, []).append(value)

    handle = torchmon.register_event_handler(handler)
    yield found
    torchmon.unregister_event_handler(handle)


def watchdog(monkeypatch: pytest.MonkeyPatch, store: MemoryStore, world_size: int) -> Any:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    # An hour: the reporter thread's ticks fall on the wall clock's multiples
    # of the interval, and one falling during the test (every 5 s, as it
    # was) cut the section's window before the tick driven by hand.
    wd = torchmon.Watchdog(min_timeout=60.0, dump_dir=None, report_interval=3600.0, store=store)
    wd.section("compute").stat.add(0.02)
    return wd


def test_the_fastest_rank_of_the_same_tick_sets_the_score(
    monkeypatch: pytest.MonkeyPatch, recorded: dict[str, list[float]]
) -> None:
    store = MemoryStore()
    store.publish(1, TICK, {"compute": 0.01})
    store.publish(2, TICK - 1, {"compute": 0.001})  # late: not this tick's window
    with watchdog(monkeypatch, store, 3) as wd:
        wd._report_tick(TICK)
    assert recorded["straggler.compute.relative.value"] == [pytest.approx(0.5)]
    assert recorded["straggler.compute.individual.value"] == [1.0]
    assert json.loads(store.get(f"{PREFIX}0"))["p50"] == {"compute": pytest.approx(0.02)}


def test_a_rank_publishing_late_is_read_again(
    monkeypatch: pytest.MonkeyPatch, recorded: dict[str, list[float]]
) -> None:
    store = MemoryStore()
    store.publish(1, TICK - 1, {"compute": 0.001})
    # Rank 2 has not published yet; both arrive during the read (1 s here).
    threading.Timer(0.3, store.publish, (1, TICK, {"compute": 0.04})).start()
    threading.Timer(0.4, store.publish, (2, TICK, {"compute": 0.005})).start()
    with watchdog(monkeypatch, store, 3) as wd:
        wd._report_tick(TICK)
    assert recorded["straggler.compute.relative.value"] == [pytest.approx(0.25)]


def test_alone_a_rank_is_its_own_fastest(
    monkeypatch: pytest.MonkeyPatch, recorded: dict[str, list[float]]
) -> None:
    store = MemoryStore()
    with watchdog(monkeypatch, store, 2) as wd:  # rank 1 never publishes
        wd._report_tick(TICK)
    assert recorded["straggler.compute.relative.value"] == [1.0]


def test_rank_zero_names_the_stopped_rank_that_differs_from_the_others() -> None:
    """One rank stuck in its compute, the others blocked in the collective of
    the same step: all four are stopped, the one in another place is the
    suspect; with no majority there is none."""
    from torchmon._watchdog import _odd_ones_out

    def entry(rank: int, beats: int, section: str) -> dict[str, object]:
        return {"rank": rank, "beats": beats, "section": section}

    stuck = [entry(0, 40, "allreduce"), entry(1, 40, "allreduce"), entry(2, 40, "compute")]
    stuck.append(entry(3, 40, "allreduce"))
    assert _odd_ones_out(stuck, (0, 1, 2, 3)) == [2]
    # A rank one step behind, in the same section, differs too.
    behind = [entry(0, 40, "allreduce"), entry(1, 39, "allreduce"), entry(2, 40, "allreduce")]
    assert _odd_ones_out(behind, (0, 1, 2)) == [1]
    # Two ranks in two places: no majority, no suspect; a rank not stopped
    # is not counted.
    assert _odd_ones_out(stuck[:1] + stuck[2:3], (0, 2)) == []
    assert _odd_ones_out(stuck, (0, 1, 3)) == []
