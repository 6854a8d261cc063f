"""torchmon.Aggregation (docs/api.md, "Aggregation")."""

from __future__ import annotations

import ast
import copy
import datetime as dt
import pickle
from pathlib import Path

import pytest

import torchmon
from torchmon import Aggregation, _core

# The C++ enum's values (docs/api.md, "Aggregation"), then torchmon's
# extensions (docs/compatibility.md).
TORCH_VALUES = {"VALUE": 1, "MEAN": 2, "COUNT": 3, "SUM": 4, "MAX": 5, "MIN": 6}
EXTENSION_VALUES = {"STDDEV": 7, "P50": 8, "P90": 9, "P95": 10, "P99": 11, "P999": 12}
EXPECTED_VALUES = {**TORCH_VALUES, **EXTENSION_VALUES}
ALL_NAMES = sorted(EXPECTED_VALUES, key=EXPECTED_VALUES.__getitem__)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_member_has_its_name_and_integer_value(name: str) -> None:
    member = getattr(Aggregation, name)
    assert member.name == name
    assert member.value == EXPECTED_VALUES[name]
    assert type(member.value) is int


@pytest.mark.parametrize("name", ALL_NAMES)
def test_int_of_member_is_its_value(name: str) -> None:
    member = getattr(Aggregation, name)
    assert int(member) == EXPECTED_VALUES[name]
    assert type(int(member)) is int


def test_value_is_one_not_zero() -> None:
    # torch's binding maps VALUE to 0 by mistake; torchmon keeps the C++ value.
    assert Aggregation.VALUE.value == 1
    assert int(Aggregation.VALUE) == 1


def test_members_are_distinct() -> None:
    members = [getattr(Aggregation, name) for name in ALL_NAMES]
    assert len(set(members)) == 12
    for i, a in enumerate(members):
        for j, b in enumerate(members):
            assert (a == b) is (i == j)
            assert (a != b) is (i != j)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_member_does_not_compare_equal_to_its_int(name: str) -> None:
    member = getattr(Aggregation, name)
    value = EXPECTED_VALUES[name]
    assert member != value
    assert not (member == value)
    assert value != member
    assert member != float(value)


def test_sum_is_not_four() -> None:
    assert Aggregation.SUM != 4
    assert 4 not in [Aggregation.SUM]


@pytest.mark.parametrize("name", ALL_NAMES)
def test_lookup_by_value_returns_the_same_member(name: str) -> None:
    assert Aggregation(EXPECTED_VALUES[name]) is getattr(Aggregation, name)


def test_aggregation_two_is_mean() -> None:
    assert Aggregation(2) is Aggregation.MEAN


def test_the_torch_members_keep_their_values_and_come_first() -> None:
    assert ALL_NAMES[:6] == list(TORCH_VALUES)
    assert ALL_NAMES[6:] == ["STDDEV", "P50", "P90", "P95", "P99", "P999"]
    assert Aggregation(7) is Aggregation.STDDEV
    assert Aggregation(12) is Aggregation.P999


@pytest.mark.parametrize("bad", [13, -1, 0, 100, 2**70])
def test_lookup_by_invalid_int_raises_value_error(bad: int) -> None:
    with pytest.raises(ValueError):
        Aggregation(bad)


@pytest.mark.parametrize("bad", ["x", "SUM", None, 2.0, [2]])
def test_lookup_by_non_int_raises_type_error(bad: object) -> None:
    with pytest.raises(TypeError):
        Aggregation(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("name", ALL_NAMES)
def test_pickle_round_trip_gives_the_identical_member(name: str, protocol: int) -> None:
    member = getattr(Aggregation, name)
    assert pickle.loads(pickle.dumps(member, protocol=protocol)) is member


def test_copy_and_deepcopy_give_the_identical_member() -> None:
    assert copy.copy(Aggregation.MAX) is Aggregation.MAX
    assert copy.deepcopy(Aggregation.MIN) is Aggregation.MIN


def test_members_are_hashable_and_usable_as_dict_keys() -> None:
    table = {getattr(Aggregation, name): name.lower() for name in ALL_NAMES}
    assert len(table) == 12
    assert table[Aggregation.SUM] == "sum"
    assert table[Aggregation(3)] == "count"
    assert hash(Aggregation.MEAN) == hash(Aggregation(2))
    assert Aggregation.MEAN in {Aggregation.MEAN}
    assert 2 not in table


@pytest.mark.parametrize("name", ALL_NAMES)
def test_module_level_alias_is_the_member(name: str) -> None:
    assert getattr(torchmon, name) is getattr(Aggregation, name)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_repr_is_readable(name: str) -> None:
    text = repr(getattr(Aggregation, name))
    assert f"Aggregation.{name}" in text
    assert "object at 0x" not in text


def test_member_is_an_instance_of_aggregation() -> None:
    for name in ALL_NAMES:
        assert isinstance(getattr(Aggregation, name), Aggregation)
    assert not isinstance(4, Aggregation)


# --- one table ------------------------------------------------------------
# The members, their values, the module aliases, the stubs, the event-key
# suffixes and the names the CLI and the TensorBoard sink recognise all come
# from one table in the native core (src/aggregation.rs); these tests check
# that every place that must list them agrees with it.

#: The imported package's own files (the wheel ships the stub), so that these
#: tests also run outside a checkout (.ci/wheel-check).
PACKAGE = Path(torchmon.__file__).resolve().parent


def test_members_mapping_lists_every_member_in_value_order() -> None:
    members = Aggregation.__members__
    assert list(members) == ALL_NAMES
    for name, member in members.items():
        assert member is getattr(Aggregation, name)
        assert member.name == name
    assert [m.value for m in members.values()] == list(range(1, len(members) + 1))


def test_members_mapping_is_read_only() -> None:
    with pytest.raises(TypeError):
        Aggregation.__members__["EXTRA"] = Aggregation.SUM  # type: ignore[index]


def test_invalid_value_message_gives_the_valid_range() -> None:
    with pytest.raises(ValueError) as info:
        Aggregation(13)
    assert str(info.value) == "13 is not a valid Aggregation (valid values: 1 to 12)"


def test_every_member_has_a_module_alias_exported_by_star_import() -> None:
    for name, member in Aggregation.__members__.items():
        assert getattr(torchmon, name) is member
        assert name in torchmon.__all__


def _class_vars_of(tree: ast.Module, class_name: str) -> list[str]:
    (cls,) = (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    return [
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign)
        and isinstance(n.target, ast.Name)
        and ast.unparse(n.annotation) == f"ClassVar[{class_name}]"
    ]


def test_stub_declares_every_member() -> None:
    stub = ast.parse((PACKAGE / "_core.pyi").read_text())
    assert _class_vars_of(stub, "Aggregation") == list(Aggregation.__members__)


def test_type_checkers_see_every_module_alias() -> None:
    init = ast.parse((PACKAGE / "__init__.py").read_text())
    (block,) = (
        n
        for n in init.body
        if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
        if any(isinstance(s, ast.Assign) for s in n.body)
    )
    aliases = {
        s.targets[0].id: ast.unparse(s.value)
        for s in block.body
        if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name)
    }
    assert aliases == {name: f"Aggregation.{name}" for name in Aggregation.__members__}


def _stat_event_keys() -> list[str]:
    events: list[torchmon.Event] = []
    handle = torchmon.register_event_handler(events.append)
    try:
        members = list(Aggregation.__members__.values())
        stat = torchmon.Stat("s", members, dt.timedelta(hours=1), max_samples=1)
        stat.add(2.0)
    finally:
        torchmon.unregister_event_handler(handle)
    (event,) = (e for e in events if e.name == torchmon.STAT_EVENT)
    return list(event.data)


def test_event_key_suffixes_are_the_names_the_cli_and_tensorboard_recognise() -> None:
    from torchmon.handlers import tensorboard

    suffixes = [key.removeprefix("s.") for key in _stat_event_keys()]
    assert suffixes == [name.lower() for name in Aggregation.__members__]
    assert list(_core._AGGREGATION_KEY_SUFFIXES) == suffixes
    # torchmon summarize splits keys by the core's table itself (a cargo
    # test of crates/torchmon-core/src/summary/ checks every suffix).
    assert tensorboard._AGGREGATION_SUFFIXES == set(suffixes)


def test_reference_model_has_the_same_members() -> None:
    from conformance import model

    assert {m.name: m.value for m in model.Aggregation} == {
        name: m.value for name, m in Aggregation.__members__.items()
    }
