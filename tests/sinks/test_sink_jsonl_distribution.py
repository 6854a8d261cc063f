"""JsonlEventHandler(distributions=True) and read_jsonl(distributions=True)
(docs/sinks.md, "JSON lines"): a Stat window's distribution stored with the
event and read back equal."""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from dist_samples import from_samples

from torchmon import STAT_EVENT, Distribution, Event, JsonlEventHandler, read_jsonl

STAMP = datetime(2026, 3, 4, 5, 6, 7, 8)


def window_event(samples: list[float]) -> Any:
    """A Stat window event carrying a distribution: an event-like object, as a
    Python-made torchmon.Event has none."""
    return SimpleNamespace(
        name=STAT_EVENT,
        timestamp=STAMP,
        data={"lat.p99": 1.5, "lat.count": float(len(samples))},
        distribution=from_samples(samples),
    )


def strict_json(line: str) -> Any:
    def refuse(constant: str) -> None:
        raise AssertionError(f"non-standard JSON constant {constant}")

    return json.loads(line, parse_constant=refuse)


def test_written_with_the_event_and_read_back_equal(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    samples = [[0.5, 2.0, -3.0, 0.0, math.inf, math.nan], [1e-300, 7.0]]
    with JsonlEventHandler(path, distributions=True) as sink:
        for window in samples:
            sink(window_event(window))
        sink(Event("other", STAMP, {"k": 1}))
    lines = path.read_text().splitlines()
    first = strict_json(lines[0])
    assert list(first) == ["name", "timestamp", "data", "distribution"]
    assert first["distribution"]["sum"] == {"$float": "nan"}
    assert first["distribution"]["zero_count"] == 1
    assert "distribution" not in strict_json(lines[2])
    pairs = list(read_jsonl(path, distributions=True))
    assert [d for _, d in pairs] == [from_samples(w) for w in samples] + [None]
    event, distribution = pairs[0]
    assert isinstance(event, Event) and isinstance(distribution, Distribution)
    assert (event.name, event.timestamp, event.data) == (
        STAT_EVENT,
        STAMP,
        {"lat.p99": 1.5, "lat.count": 6.0},
    )
    # Without distributions=True the reader yields the events only.
    events = list(read_jsonl(path))
    assert [e.data for e in events] == [e.data for e, _ in pairs]


def test_off_by_default_lines_unchanged(tmp_path: Path) -> None:
    plain, stored = tmp_path / "plain.jsonl", tmp_path / "stored.jsonl"
    with JsonlEventHandler(plain) as sink:
        sink(window_event([1.0]))
    with JsonlEventHandler(stored, distributions=True) as sink:
        sink(Event(STAT_EVENT, STAMP, {"lat.p99": 1.5, "lat.count": 1.0}))
    expected = (
        '{"name":"torch.monitor.Stat","timestamp":"2026-03-04T05:06:07.000008",'
        '"data":{"lat.p99":1.5,"lat.count":1.0}}\n'
    )
    assert plain.read_text() == expected
    # An event without a distribution is written as before, flag or not.
    assert stored.read_text() == expected


def test_a_bad_stored_distribution_makes_the_line_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    good = from_samples([1.0, 2.0]).to_dict()
    bad = {**good, "count": 3}
    line = {"name": STAT_EVENT, "timestamp": "2026-01-01T00:00:00", "data": {}}
    path.write_text(
        json.dumps({**line, "distribution": bad})
        + "\n"
        + json.dumps({**line, "distribution": good})
        + "\n"
    )
    with pytest.raises(
        ValueError, match=r"events.jsonl:1: not a valid distribution: Distribution\(count\)"
    ):
        list(read_jsonl(path, distributions=True))
    reader = read_jsonl(path, errors="skip", distributions=True)
    assert [d for _, d in reader] == [from_samples([1.0, 2.0])]
    assert reader.skipped == 1
    # Not asked for, it is not looked at.
    assert len(list(read_jsonl(path))) == 2


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"JsonlEventHandler\(distributions\)"):
        JsonlEventHandler(tmp_path / "a.jsonl", distributions=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"read_jsonl\(distributions\)"):
        read_jsonl(tmp_path / "a.jsonl", distributions="yes")  # type: ignore[call-overload]


def test_repr_says_distributions(tmp_path: Path) -> None:
    with JsonlEventHandler(tmp_path / "a.jsonl", distributions=True) as sink:
        assert repr(sink).endswith(", distributions=True)")
    assert "distributions=True" in repr(read_jsonl(tmp_path / "a.jsonl", distributions=True))


def test_a_distribution_beyond_the_float_range_is_an_unreadable_line(tmp_path: Path) -> None:
    """A 400-digit int sum used to escape read_jsonl as OverflowError, even
    with errors="skip" (docs/sinks.md, "Reading")."""
    path = tmp_path / "huge.jsonl"
    with JsonlEventHandler(path, distributions=True) as handler:
        handler(window_event([1.0, 2.0]))
    record = json.loads(path.read_text())
    record["distribution"]["sum"] = 10**400
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
        f.write(path.read_text().splitlines()[0] + "\n")
    reader = read_jsonl(path, distributions=True, errors="skip")
    assert len(list(reader)) == 2
    assert reader.skipped == 1
    assert reader.first_skipped is not None
    assert reader.first_skipped.startswith(f"{path}:2: not a valid distribution: Distribution(sum)")
    with pytest.raises(ValueError, match=r":2: not a valid distribution: .*float range"):
        list(read_jsonl(path, distributions=True))
