"""Random programs run against real torch.monitor 2.13 and torchmon side by side.

torch's clock cannot be driven, so every window is huge and windows close
only by ``max_samples`` and destruction. Inputs that crash or hang torch
(docs/compatibility.md: sub-millisecond windows, double unregister, reentrant handlers,
raising handlers) are never generated. Only the documented differences are
normalised: torch ignores ``Aggregation.VALUE`` (so its results are compared
without VALUE), and turns bools in Event data into floats.
"""

from __future__ import annotations

import ast
import datetime
from typing import Any, Callable

import pytest
from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import consumes, rule

import torchmon

from .rules import (
    FIXED_TS,
    SharedRules,
    System,
    data_keys,
    data_values,
    floats,
    make_handler,
    names,
    observe,
    tag,
)

torch_monitor = pytest.importorskip(
    "torch.monitor", reason="torch is not installed (CI installs it from ../shared/wheels)"
)

pytestmark = pytest.mark.hypothesis_suite

HUGE_WINDOWS = [
    datetime.timedelta(hours=100),
    datetime.timedelta(days=30),
    360_000.5,  # float seconds
]


def is_value_key(tagged_key: str) -> bool:
    """Whether a key of a tagged dict (the `repr` of a tag) ends in `.value`.
    Parsed, not matched as text: the repr quotes a key that holds `'` with
    `"` (a deep run found a Stat named `...'l...` whose VALUE key the text
    match missed)."""
    key = ast.literal_eval(tagged_key)
    return key[0] == "str" and key[1].endswith(".value")


def normalise(value: Any) -> Any:
    """torch's view of a torchmon observation: bools in data become floats,
    VALUE entries and `.value` keys disappear."""
    if isinstance(value, tuple) and value and value[0] == "bool":
        return ("float", float(value[1]), 1.0)
    if isinstance(value, tuple) and value and value[0] == "dict":
        return (
            "dict",
            [(k, normalise(v)) for k, v in value[1] if not is_value_key(k)],
        )
    if isinstance(value, (list, tuple)):
        return type(value)(normalise(v) for v in value)
    return value


def tag_get(result: Any) -> Any:
    if not isinstance(result, dict):
        return ("other", type(result).__name__)
    return sorted((k.name, tag(v)) for k, v in result.items() if k.name != "VALUE")


class TorchmonMatchesTorch(SharedRules):
    stat_ids = SharedRules.stat_ids
    handle_ids = SharedRules.handle_ids

    def __init__(self) -> None:
        super().__init__()
        self.torchmon = System(torchmon, lambda ms: None)
        self.torch = System(torch_monitor, lambda ms: None)
        self.systems = (self.torchmon, self.torch)
        self.next_id = 0

    def both(self, action: Callable[[System], Any], view: Callable[[Any], Any] = tag) -> Any:
        seen = []
        for system in self.systems:
            result, error, calls = observe(system, lambda s=system: action(s))
            seen.append((view(result) if error is None else None, error, calls))
        ours, theirs = normalise(seen[0]), seen[1]
        note(f"torchmon: {seen[0]!r}")
        assert ours == theirs, f"torchmon {ours!r} != torch {theirs!r}"
        return seen[0]

    @rule(
        target=stat_ids,
        name=names,
        aggregations=st.lists(
            st.sampled_from(["VALUE", "MEAN", "COUNT", "SUM", "MAX", "MIN"]), max_size=7
        ),
        window=st.sampled_from(HUGE_WINDOWS),
        max_samples=st.one_of(st.none(), st.sampled_from([0, 1, 2, 3, 5, -1, True])),
    )
    def create_stat(
        self, name: str, aggregations: list[str], window: Any, max_samples: int | None
    ) -> Any:
        return self.create_stat_in_both(name, aggregations, window, max_samples)

    @rule(sid=stat_ids, values=st.lists(floats, min_size=1, max_size=12))
    def add_several(self, sid: int, values: list[float]) -> None:
        self.add_in_a_row(sid, values)

    @rule(sid=stat_ids)
    def get_count_name(self, sid: int) -> None:
        self.both(
            lambda s: (s.stats[sid].get(), s.stats[sid].count, s.stats[sid].name),
            view=lambda r: (tag_get(r[0]), tag(r[1]), tag(r[2])),
        )

    @rule(target=handle_ids, kind=st.sampled_from(["record", "record", "rename"]))
    def register(self, kind: str) -> int:
        hid = self.new_id()

        def register_in(system: System) -> None:
            handler = make_handler(system, hid, kind, "")
            system.handles[hid] = system.module.register_event_handler(handler)

        self.both(register_in)
        return hid

    @rule(hid=consumes(handle_ids))
    def unregister(self, hid: int) -> None:
        # Each handle once: a second unregister segfaults torch.
        self.both(lambda s: s.module.unregister_event_handler(s.handles.pop(hid)))

    @rule(name=names, data=st.dictionaries(data_keys, data_values, max_size=4))
    def log_event(self, name: str, data: dict[str, Any]) -> None:
        self.log_event_in_both(name, data, FIXED_TS)

    @rule(value=st.sampled_from([5, "event", 1.5]))
    def log_non_event(self, value: Any) -> None:
        self.log_non_event_in_both(value)

    @rule(value=st.sampled_from([1, "handler", 2.5]))
    def register_non_callable(self, value: Any) -> None:
        self.register_non_callable_in_both(value)

    def teardown(self) -> None:
        self.unregister_all()


TestTorchmonMatchesTorch = TorchmonMatchesTorch.TestCase


@pytest.mark.parametrize("name", ["loss", "it's", 'say "hi"', "\U0006bc62'\x7f\U0010c8d0"])
def test_normalise_drops_the_value_key_whatever_the_name_quotes(name: str) -> None:
    """The shrunk counterexample of a deep run was a test bug: a Stat named
    with a `'` kept its `.value` key through normalise()."""
    ours = tag({f"{name}.value": 0.0, f"{name}.count": 1})
    assert normalise(ours) == tag({f"{name}.count": 1})
