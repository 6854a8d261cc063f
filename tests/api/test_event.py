"""torchmon.Event (docs/api.md, "Event", and its paragraph on strings)."""

from __future__ import annotations

import collections
import enum
import functools
import pickle
import types
from collections.abc import Iterator, Mapping
from datetime import date, datetime, time, timedelta, timezone

import numpy as np
import pytest

import torchmon
from torchmon import Event

TS = datetime(2021, 3, 4, 5, 6, 7, 890123)
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


class Color(enum.IntEnum):
    RED = 7


class MyStr(str):
    pass


class MyFloat(float):
    pass


class MyInt(int):
    pass


class MyDatetime(datetime):
    pass


class ReadOnlyMapping(Mapping):
    def __init__(self, items: dict[str, object]) -> None:
        self._items = items

    def __getitem__(self, key: str) -> object:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


# --- construction and getters --------------------------------------------


def test_positional_constructor_and_getters() -> None:
    e = Event("my.event", TS, {"a": 1, "b": 2.5, "c": "x", "d": True})
    assert e.name == "my.event"
    assert e.timestamp == TS
    assert e.data == {"a": 1, "b": 2.5, "c": "x", "d": True}


def test_keyword_constructor() -> None:
    e = Event(name="kw", timestamp=TS, data={"k": 3})
    assert e.name == "kw"
    assert e.timestamp == TS
    assert e.data == {"k": 3}


def test_keywords_in_any_order() -> None:
    e = Event(data={"k": "v"}, name="kw", timestamp=TS)
    assert (e.name, e.timestamp, e.data) == ("kw", TS, {"k": "v"})


def test_positional_and_keyword_mixed() -> None:
    e = Event("kw", TS, data={"k": 1.5})
    assert (e.name, e.timestamp, e.data) == ("kw", TS, {"k": 1.5})


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((), {}, "missing 3 required positional arguments"),
        (("e",), {}, "missing 2 required positional arguments"),
        (("e", TS, {}, 1), {}, "takes 3 positional arguments but 4 were given"),
        (("e", TS), {"data": {}, "extra": 1}, "unexpected keyword argument 'extra'"),
        (("e", TS, {}), {"name": "again"}, "multiple values for argument 'name'"),
    ],
)
def test_wrong_arguments_are_type_errors(
    args: tuple[object, ...], kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        Event(*args, **kwargs)  # type: ignore[arg-type, call-arg]


def test_type_call_route_builds_the_same_event() -> None:
    e = type.__call__(Event, "e", TS, {"k": 1})
    assert (e.name, e.timestamp, e.data) == ("e", TS, {"k": 1})


def test_empty_data() -> None:
    assert Event("e", TS, {}).data == {}


def test_value_types_are_kept() -> None:
    e = Event("e", TS, {"i": 3, "f": 3.0, "s": "3", "b": True})
    data = e.data
    assert type(data["i"]) is int
    assert type(data["f"]) is float
    assert type(data["s"]) is str
    assert type(data["b"]) is bool


def test_data_order_is_kept() -> None:
    keys = ["z", "a", "m", "b"]
    e = Event("e", TS, {k: 1 for k in keys})
    assert list(e.data) == keys


# --- data copying --------------------------------------------------------


def test_data_is_copied_at_construction() -> None:
    src: dict[str, object] = {"a": 1}
    e = Event("e", TS, src)
    src["a"] = 2
    src["b"] = 3
    assert e.data == {"a": 1}


def test_data_is_copied_when_a_kept_tuple_holds_its_only_reference() -> None:
    # `Event(*args)` passes the tuple's items: the dict's only reference is
    # the tuple the caller keeps, so a reference count of 1 does not make it
    # a temporary (docs/performance.md, "Where the remaining time goes").
    args = ("e", TS, {"a": 1})
    e = Event(*args)
    args[2]["a"] = 2
    args[2]["b"] = 3
    assert e.data == {"a": 1}


def test_data_is_copied_when_a_partial_holds_its_only_reference() -> None:
    make = functools.partial(Event, "e", TS, {"a": 1})
    first, second = make(), make()
    make.args[2]["a"] = 2
    assert first.data == {"a": 1}
    assert second.data == {"a": 1}


def test_a_dict_literal_argument_gives_its_values() -> None:
    e = Event("e", TS, {"a": 1, "b": 2.5, "c": "x", "d": True, "é": "ü"})
    assert e.data == {"a": 1, "b": 2.5, "c": "x", "d": True, "é": "ü"}


def test_data_getter_returns_a_fresh_dict_each_time() -> None:
    e = Event("e", TS, {"a": 1})
    first = e.data
    second = e.data
    assert first is not second
    first["a"] = 100
    first["new"] = "x"
    assert e.data == {"a": 1}
    assert second == {"a": 1}


def test_data_setter_copies_too() -> None:
    e = Event("e", TS, {})
    src: dict[str, object] = {"a": 1}
    e.data = src
    src["a"] = 99
    assert e.data == {"a": 1}


# --- setters -------------------------------------------------------------


def test_name_setter() -> None:
    e = Event("old", TS, {})
    e.name = "new"
    assert e.name == "new"
    e.name = b"caf\xc3\xa9"
    assert e.name == "caf\u00e9"


def test_timestamp_setter() -> None:
    e = Event("e", TS, {})
    other = datetime(1999, 12, 31, 23, 59, 59)
    e.timestamp = other
    assert e.timestamp == other


def test_timestamp_setter_accepts_date_as_midnight() -> None:
    e = Event("e", TS, {})
    e.timestamp = date(2010, 6, 7)
    assert e.timestamp == datetime(2010, 6, 7, 0, 0, 0)
    assert type(e.timestamp) is datetime


def test_data_setter_replaces_everything() -> None:
    e = Event("e", TS, {"a": 1, "b": 2})
    e.data = {"c": 3.5}
    assert e.data == {"c": 3.5}


def test_data_setter_converts_like_the_constructor() -> None:
    e = Event("e", TS, {})
    e.data = {b"k": b"v", "n": np.int16(4), "c": Color.RED, "t": True}
    data = e.data
    assert data == {"k": "v", "n": 4, "c": 7, "t": True}
    assert type(data["n"]) is int
    assert type(data["c"]) is int
    assert type(data["t"]) is bool


# --- integers ------------------------------------------------------------


@pytest.mark.parametrize("value", [INT64_MAX, INT64_MIN, 0, -1, 2**62])
def test_int64_range_is_accepted(value: int) -> None:
    got = Event("e", TS, {"n": value}).data["n"]
    assert got == value
    assert type(got) is int


@pytest.mark.parametrize("value", [2**63, INT64_MIN - 1, 2**100, -(2**100)])
def test_int_outside_int64_is_value_error(value: int) -> None:
    with pytest.raises(ValueError):
        Event("e", TS, {"n": value})


def test_large_int_is_not_converted_to_float() -> None:
    got = Event("e", TS, {"n": 2**53 + 1}).data["n"]
    assert got == 2**53 + 1
    assert type(got) is int


# --- bool ----------------------------------------------------------------


def test_bool_stays_bool() -> None:
    data = Event("e", TS, {"t": True, "f": False}).data
    assert data["t"] is True
    assert data["f"] is False


# --- numpy scalars -------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected", "kind"),
    [
        (np.int8(-5), -5, int),
        (np.int32(123), 123, int),
        (np.int64(INT64_MAX), INT64_MAX, int),
        (np.uint8(200), 200, int),
        (np.uint32(4_000_000_000), 4_000_000_000, int),
        (np.float32(0.5), 0.5, float),
        (np.float64(-2.25), -2.25, float),
        (np.float16(1.5), 1.5, float),
        (np.bool_(True), True, bool),
        (np.bool_(False), False, bool),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, type) else v.__name__,
)
def test_numpy_scalars_are_stored_as_python_types(
    value: object, expected: object, kind: type
) -> None:
    got = Event("e", TS, {"v": value}).data["v"]
    assert got == expected
    assert type(got) is kind


def test_numpy_uint64_above_int64_is_value_error() -> None:
    with pytest.raises(ValueError):
        Event("e", TS, {"v": np.uint64(2**63)})


# --- subclasses ----------------------------------------------------------


def test_int_enum_member_is_stored_as_int() -> None:
    got = Event("e", TS, {"c": Color.RED}).data["c"]
    assert got == 7
    assert type(got) is int


def test_int_subclass_is_stored_as_int() -> None:
    got = Event("e", TS, {"c": MyInt(9)}).data["c"]
    assert got == 9
    assert type(got) is int


def test_str_subclass_is_stored_as_str() -> None:
    got = Event("e", TS, {"s": MyStr("hello")}).data["s"]
    assert got == "hello"
    assert type(got) is str


def test_float_subclass_is_stored_as_float() -> None:
    got = Event("e", TS, {"f": MyFloat(1.25)}).data["f"]
    assert got == 1.25
    assert type(got) is float


def test_str_subclass_key_and_name_are_plain_str() -> None:
    e = Event(MyStr("nm"), TS, {MyStr("k"): 1})
    assert type(e.name) is str
    assert e.name == "nm"
    (key,) = e.data
    assert type(key) is str
    assert key == "k"


# --- strings -------------------------------------------------------------


def test_bytes_values_and_keys_are_decoded() -> None:
    data = Event("e", TS, {b"caf\xc3\xa9": b"\xe2\x98\x83", b"k": bytearray(b"v")}).data
    assert data == {"caf\u00e9": "\u2603", "k": "v"}
    assert all(type(k) is str and type(v) is str for k, v in data.items())


def test_bytes_name_is_decoded() -> None:
    e = Event(b"n\x00m", TS, {})
    assert e.name == "n\x00m"
    assert type(e.name) is str


@pytest.mark.parametrize("text", ["a\x00b", "\x00", "\u00e9\u4e2d\U0001f600", "", " spaced "])
def test_strings_are_kept_exactly(text: str) -> None:
    e = Event(text, TS, {text: text, "k": text})
    assert e.name == text
    assert e.data == {text: text, "k": text}


def test_float_values_are_kept_exactly() -> None:
    values = {"nan_is_checked_apart": 0.1, "neg_zero": -0.0, "inf": float("inf"), "tiny": 5e-324}
    data = Event("e", TS, values).data
    assert data == values
    assert str(data["neg_zero"]) == "-0.0"
    nan = Event("e", TS, {"nan": float("nan")}).data["nan"]
    assert nan != nan


# --- timestamps ----------------------------------------------------------


def test_date_timestamp_is_midnight_datetime() -> None:
    e = Event("e", date(2020, 1, 2), {})
    assert e.timestamp == datetime(2020, 1, 2, 0, 0, 0, 0)
    assert type(e.timestamp) is datetime
    assert e.timestamp.tzinfo is None


def test_date_subclass_timestamp_is_midnight_plain_datetime() -> None:
    class MyDate(date):
        pass

    e = Event("e", MyDate(2020, 1, 2), {})
    assert type(e.timestamp) is datetime
    assert e.timestamp == datetime(2020, 1, 2)


@pytest.mark.parametrize("tz", [None, timezone(timedelta(hours=2))])
def test_time_of_day_timestamp_is_that_time_on_1970_01_01(tz: timezone | None) -> None:
    e = Event("e", time(3, 4, 5, 6, tzinfo=tz), {})
    assert type(e.timestamp) is datetime
    assert e.timestamp == datetime(1970, 1, 1, 3, 4, 5, 6, tzinfo=tz)
    assert e.timestamp.tzinfo is tz
    e.timestamp = time(7)
    assert e.timestamp == datetime(1970, 1, 1, 7)


@pytest.mark.parametrize(
    "tz",
    [timezone.utc, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))],
)
def test_tz_aware_timestamp_is_returned_unchanged(tz: timezone) -> None:
    ts = datetime(2020, 1, 2, 3, 4, 5, 6, tzinfo=tz)
    got = Event("e", ts, {}).timestamp
    assert got == ts
    assert got.tzinfo is not None
    assert got.utcoffset() == ts.utcoffset()
    assert (got.year, got.month, got.day, got.hour, got.minute, got.second, got.microsecond) == (
        2020,
        1,
        2,
        3,
        4,
        5,
        6,
    )


def test_naive_timestamp_keeps_microseconds() -> None:
    ts = datetime(2001, 2, 3, 4, 5, 6, 999999)
    got = Event("e", ts, {}).timestamp
    assert got == ts
    assert got.tzinfo is None


@pytest.mark.parametrize("ts", [datetime(1, 1, 1), datetime(9999, 12, 31, 23, 59, 59, 999999)])
def test_extreme_timestamps_are_kept(ts: datetime) -> None:
    assert Event("e", ts, {}).timestamp == ts


def test_datetime_subclass_is_kept() -> None:
    ts = MyDatetime(2022, 2, 2, 2, 2, 2)
    got = Event("e", ts, {}).timestamp
    assert got == ts
    assert type(got) is MyDatetime


# --- repr, pickle, identity ----------------------------------------------


def test_repr_shows_name_timestamp_and_data() -> None:
    e = Event("my_event_name", datetime(2019, 8, 7, 6, 5, 4), {"answer_key": 42})
    text = repr(e)
    assert "my_event_name" in text
    assert "2019" in text
    assert "answer_key" in text
    assert "42" in text
    assert "object at 0x" not in text


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickle_round_trip_keeps_name_timestamp_and_data(protocol: int) -> None:
    ts = datetime(2020, 5, 6, 7, 8, 9, 10, tzinfo=timezone(timedelta(hours=2)))
    data = {"i": INT64_MIN, "f": 0.25, "s": "a\x00\u00e9", "b": False, "t": True}
    e = Event("pick\x00led", ts, data)
    back = pickle.loads(pickle.dumps(e, protocol=protocol))
    assert type(back) is Event
    assert back is not e
    assert back.name == "pick\x00led"
    assert back.timestamp == ts
    assert back.timestamp.utcoffset() == timedelta(hours=2)
    got = back.data
    assert got == data
    assert [type(v) for v in got.values()] == [int, float, str, bool, bool]


def test_pickled_event_can_be_logged() -> None:
    back = pickle.loads(pickle.dumps(Event("e", TS, {"a": 1})))
    seen: list[Event] = []
    handle = torchmon.register_event_handler(seen.append)
    try:
        torchmon.log_event(back)
    finally:
        torchmon.unregister_event_handler(handle)
    assert seen == [back]
    assert seen[0] is back


def test_equality_is_by_identity() -> None:
    a = Event("e", TS, {"a": 1})
    b = Event("e", TS, {"a": 1})
    assert a == a
    assert a != b
    assert not (a == b)


def test_hash_is_by_identity() -> None:
    a = Event("e", TS, {"a": 1})
    b = Event("e", TS, {"a": 1})
    assert hash(a) == hash(a)
    assert len({a, b}) == 2
    table = {a: "a", b: "b"}
    assert table[a] == "a"
    assert table[b] == "b"


def test_hash_is_stable_after_mutation() -> None:
    a = Event("e", TS, {"a": 1})
    before = hash(a)
    a.name = "changed"
    a.data = {"z": 2}
    assert hash(a) == before
    assert a in {a}


# --- data must be a mapping ------------------------------------------------


def test_data_accepts_a_dict_subclass() -> None:
    data = collections.OrderedDict([("b", 1), ("a", 2)])
    assert Event("e", TS, data).data == {"b": 1, "a": 2}


def test_data_accepts_a_defaultdict() -> None:
    data: collections.defaultdict[str, int] = collections.defaultdict(int, {"a": 1})
    assert Event("e", TS, data).data == {"a": 1}


def test_data_accepts_a_mapping_proxy() -> None:
    assert Event("e", TS, types.MappingProxyType({"a": 1})).data == {"a": 1}


def test_data_accepts_a_collections_abc_mapping() -> None:
    e = Event("e", TS, ReadOnlyMapping({"x": 1.5, "y": "z"}))
    assert e.data == {"x": 1.5, "y": "z"}
    assert type(e.data) is dict


@pytest.mark.parametrize(
    "not_a_mapping",
    [[("a", 1)], (("a", 1),), {"a", "b"}, "ab", 3, None],
    ids=["list-of-pairs", "tuple-of-pairs", "set", "str", "int", "None"],
)
def test_data_must_be_a_mapping(not_a_mapping: object) -> None:
    with pytest.raises(TypeError, match="data"):
        Event("e", TS, not_a_mapping)  # type: ignore[arg-type]
