"""torchmon.Aggregation (docs/api.md, "Aggregation")."""

from __future__ import annotations

import copy
import pickle

import pytest

import torchmon
from torchmon import Aggregation

# The C++ enum's values (docs/api.md, "Aggregation").
EXPECTED_VALUES = {"VALUE": 1, "MEAN": 2, "COUNT": 3, "SUM": 4, "MAX": 5, "MIN": 6}
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
    assert len(set(members)) == 6
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


@pytest.mark.parametrize("bad", [7, -1, 0, 100, 2**70])
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
    assert len(table) == 6
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
