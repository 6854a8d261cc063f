"""Pickling of every class `torchmon` exports (docs/api.md): a value
(`Aggregation`, `Distribution`, `Event`, `RankInfo`) comes back equal, and
through the binding's own functions; a live resource (a Stat and its open
window, a handler and its thread or file, a watchdog) refuses with a
`TypeError` rather than be copied half alive. A class exported without a
place in one of the two lists fails here."""

from __future__ import annotations

import inspect
import math
import pickle
from datetime import datetime, timedelta

import pytest
from dist_samples import from_samples

import torchmon

VALUES = {"Aggregation", "Distribution", "Event", "RankInfo", "data_value_t"}
RESOURCES = {
    "AsyncEventHandler",
    "EventHandlerHandle",
    "JsonlEventHandler",
    "MLflowEventHandler",
    "OpenTelemetryEventHandler",
    "PrometheusEventHandler",
    "SignalFlush",
    "Stat",
    "SystemStats",
    "TensorboardEventHandler",
    "WaitCounter",
    "WandbEventHandler",
    "Watchdog",
    "_WaitCounter",
    "_WaitCounterTracker",
}


def test_every_exported_class_is_a_value_or_a_resource() -> None:
    exported = {name for name in torchmon.__all__ if inspect.isclass(getattr(torchmon, name))}
    assert exported == VALUES | RESOURCES


def _distribution() -> torchmon.Distribution:
    return from_samples([-2.0, 0.0, 1.0, math.inf])


def test_the_values_come_back_equal() -> None:
    for member in torchmon.Aggregation.__members__.values():
        assert pickle.loads(pickle.dumps(member)) is member
    distribution = _distribution()
    assert pickle.loads(pickle.dumps(distribution)) == distribution
    event = torchmon.Event("e", datetime(2026, 12, 7, 12), {"a": 1, "b": 2.5, "c": "x", "d": True})
    back = pickle.loads(pickle.dumps(event))
    assert (back.name, back.timestamp, back.data) == (event.name, event.timestamp, event.data)
    assert pickle.loads(pickle.dumps(torchmon.rank_info())) == torchmon.rank_info()
    assert pickle.loads(pickle.dumps(torchmon.data_value_t)) is torchmon.data_value_t


def test_a_distribution_pickles_through_the_binding_and_is_checked_when_read() -> None:
    reduced = _distribution().__reduce__()
    assert reduced[0] is torchmon._core._unpickle_distribution
    # A pickle whose fields do not add up is refused as the constructor
    # refuses them, not made into a broken value.
    values = list(reduced[1])
    values[1] = 1  # count
    with pytest.raises(ValueError, match=r"Distribution\("):
        torchmon._core._unpickle_distribution(*values)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torchmon.Stat("s", [torchmon.Aggregation.MEAN], timedelta(seconds=1)),
        lambda: torchmon.register_event_handler(lambda event: None),
        lambda: torchmon.WaitCounter("w"),
    ],
    ids=["Stat", "EventHandlerHandle", "WaitCounter"],
)
def test_a_live_resource_refuses_to_be_pickled(make: object) -> None:
    resource = make()  # type: ignore[operator]
    try:
        with pytest.raises(TypeError, match="cannot pickle"):
            pickle.dumps(resource)
    finally:
        if isinstance(resource, torchmon.EventHandlerHandle):
            torchmon.unregister_event_handler(resource)
