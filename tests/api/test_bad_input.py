"""Argument validation: every documented TypeError / ValueError / RuntimeError.

docs/api.md: "Stat", "Event", "Handlers (registry)" and its paragraph on strings.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from datetime import date, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import torchmon
from torchmon import COUNT, SUM, VALUE, Aggregation, Event, Stat
from torchmon.testing import ManualClock

TS = datetime(2020, 1, 2, 3, 4, 5)
SECOND = timedelta(seconds=1)
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
ADD_MESSAGE = r"Stat\.add|value"


# --- Stat(name) ---------------------------------------------------------------


@pytest.mark.parametrize("name", [None, 1, 1.5, ["x"], ("x",), object()], ids=repr)
def test_stat_name_of_wrong_type_is_type_error(name: object) -> None:
    with pytest.raises(TypeError, match="name"):
        Stat(name, [SUM], SECOND)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["\ud800", "a\udfffb", "\udc80"], ids=ascii)
def test_stat_name_with_lone_surrogate_is_type_error(name: str) -> None:
    with pytest.raises(TypeError, match="name"):
        Stat(name, [SUM], SECOND)


@pytest.mark.parametrize("name", [b"\xff", b"a\xc3", bytearray(b"\xc3\x28"), b"\xed\xa0\x80"])
def test_stat_name_with_invalid_utf8_bytes_is_value_error(name: bytes) -> None:
    with pytest.raises(ValueError, match="name"):
        Stat(name, [SUM], SECOND)


# --- Stat(aggregations) ---------------------------------------------------------


@pytest.mark.parametrize(
    "aggregations",
    [4, [4], "SUM", None, [SUM, 4], [None], SUM, [1.0], [Aggregation], ["SUM"], (3,)],
    ids=repr,
)
def test_stat_bad_aggregations_is_type_error(aggregations: object) -> None:
    with pytest.raises(TypeError, match="aggregations"):
        Stat("s", aggregations, SECOND)  # type: ignore[arg-type]


# --- Stat(window_size) --------------------------------------------------------


@pytest.mark.parametrize("window", [60, 0, 1, True, None, "1.0", b"1", [1.0], 1j], ids=repr)
def test_stat_window_size_of_wrong_type_is_type_error(window: object) -> None:
    with pytest.raises(TypeError, match="window_size"):
        Stat("s", [SUM], window)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "window",
    [
        0.0005,
        0.000999,
        0.0,
        -0.0,
        -1.0,
        -0.001,
        timedelta(0),
        timedelta(microseconds=999),
        timedelta(microseconds=1),
        timedelta(seconds=-1),
        timedelta(microseconds=-1500),
        timedelta.min,
    ],
    ids=repr,
)
def test_stat_window_size_under_one_ms_is_value_error(window: object) -> None:
    with pytest.raises(ValueError, match="window_size"):
        Stat("s", [SUM], window)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "window", [math.nan, -math.nan, math.inf, -math.inf, 1e300, 9.3e15, 1e16], ids=repr
)
def test_stat_window_size_not_finite_or_too_large_is_value_error(window: float) -> None:
    with pytest.raises(ValueError, match="window_size"):
        Stat("s", [SUM], window)


@pytest.mark.parametrize(
    "window", [0.001, 9.2e15, timedelta.max, timedelta(microseconds=1000)], ids=repr
)
def test_stat_window_size_at_the_limits_is_accepted(window: object) -> None:
    Stat("s", [SUM], window)  # type: ignore[arg-type]


# --- Stat(max_samples) --------------------------------------------------------


@pytest.mark.parametrize(
    "max_samples",
    [1.5, 1.0, None, "3", b"3", [3], 2**63, INT64_MIN - 1, 2**100, 3j],
    ids=repr,
)
def test_stat_bad_max_samples_is_type_error(max_samples: object) -> None:
    with pytest.raises(TypeError, match="max_samples"):
        Stat("s", [SUM], SECOND, max_samples)  # type: ignore[arg-type]


@pytest.mark.parametrize("max_samples", [INT64_MAX, INT64_MIN, 0, True, False], ids=repr)
def test_stat_max_samples_at_the_int64_limits_is_accepted(max_samples: int) -> None:
    Stat("s", [SUM], SECOND, max_samples)


def test_stat_bad_max_samples_as_keyword_is_type_error() -> None:
    with pytest.raises(TypeError, match="max_samples"):
        Stat("s", [SUM], SECOND, max_samples=None)  # type: ignore[arg-type]


# --- Stat: which argument decides ---------------------------------------------


def test_stat_type_error_beats_an_earlier_value_error() -> None:
    # window_size -1.0 is a ValueError, max_samples "3" a TypeError: type errors first.
    with pytest.raises(TypeError, match="max_samples"):
        Stat("x", [SUM], -1.0, "3")  # type: ignore[arg-type]


def test_stat_nan_window_with_bad_max_samples_is_type_error() -> None:
    with pytest.raises(TypeError, match="max_samples"):
        Stat("x", [SUM], math.nan, 1.5)  # type: ignore[arg-type]


def test_stat_first_bad_argument_decides_name() -> None:
    with pytest.raises(TypeError, match="name"):
        Stat(None, [4], None, None)  # type: ignore[arg-type]


def test_stat_first_bad_argument_decides_aggregations() -> None:
    with pytest.raises(TypeError, match="aggregations"):
        Stat("x", [4], None, None)  # type: ignore[arg-type]


def test_stat_first_bad_argument_decides_window_size() -> None:
    with pytest.raises(TypeError, match="window_size"):
        Stat("x", [SUM], 60, None)  # type: ignore[arg-type]


def test_stat_name_type_error_beats_a_later_max_samples_type_error() -> None:
    with pytest.raises(TypeError, match="name"):
        Stat(None, [SUM], SECOND, None)  # type: ignore[arg-type]


def test_stat_aggregations_type_error_beats_a_later_max_samples_type_error() -> None:
    with pytest.raises(TypeError, match="aggregations"):
        Stat("x", [4], SECOND, "3")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("s",), {}),
        (("s", [SUM]), {}),
        (("s", [SUM], SECOND, 1, 2), {}),
        (("s", [SUM], SECOND), {"unknown": 1}),
        ((), {"aggregations": [SUM], "window_size": SECOND}),
    ],
)
def test_stat_wrong_argument_count_is_type_error(args: tuple[Any, ...], kwargs: dict) -> None:
    with pytest.raises(TypeError):
        Stat(*args, **kwargs)


# --- Stat.add -----------------------------------------------------------------


class NotANumber:
    pass


@pytest.mark.parametrize(
    "value",
    ["1", "1.5", None, object(), NotANumber(), 2**1024, -(2**1024), [1], (1.0,), {}, b"1", 1j],
    ids=repr,
)
def test_stat_add_rejects_non_numbers_with_type_error(value: object) -> None:
    with ManualClock(0):
        stat = Stat("s", [SUM, COUNT], SECOND, 1)
        with pytest.raises(TypeError, match=ADD_MESSAGE):
            stat.add(value)  # type: ignore[arg-type]
        assert stat.count == 0
        stat.add(1.0)  # still usable; the rejected value was not folded in
        assert stat.get() == {SUM: 1.0, COUNT: 1.0}


COMPLEX_SCALARS = [
    pytest.param(lambda: np.complex64(1 + 2j), id="np.complex64"),
    pytest.param(lambda: np.complex128(1 + 2j), id="np.complex128"),
    pytest.param(lambda: np.clongdouble(1 + 2j), id="np.clongdouble"),
    pytest.param(lambda: np.complex64(3), id="np.complex64 with no imaginary part"),
    pytest.param(lambda: 1 + 2j, id="complex"),
]


@pytest.mark.parametrize("make", COMPLEX_SCALARS)
def test_complex_scalars_are_type_errors_as_complex_tensors(make: Any) -> None:
    # numpy's complex scalars have a __float__ that warns (ComplexWarning)
    # and returns the real part: they must not get that far.
    stat = Stat("s", [SUM], SECOND)
    value = make()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(TypeError, match=r"Stat\.add\(v\): v must be a real number, not a comp"):
            stat.add(value)
        with pytest.raises(
            TypeError, match=r"add_many\(values\): values\[1\] must be a real number, not a complex"
        ):
            stat.add_many([1.0, value])
        with pytest.raises(TypeError, match=r"add_many\(values\): values\[0\] .*complex"):
            stat.add_many(np.array([value]))
    assert caught == []
    assert stat.count == 0


@pytest.mark.parametrize("value", [10**400, -(2**1024), 2**1024 - 2**970], ids=repr)
def test_an_int_beyond_the_float_range_is_named_as_such(value: int) -> None:
    # TypeError as torch.monitor raises (its pybind11 overload does not
    # match), with float()'s OverflowError as the cause.
    stat = Stat("s", [SUM], SECOND)
    message = "must be a real number, not an int too large to convert to float"
    with pytest.raises(TypeError, match=rf"Stat\.add\(v\): v {message}") as raised:
        stat.add(value)
    assert isinstance(raised.value.__cause__, OverflowError)
    with pytest.raises(TypeError, match=rf"Stat\.add_many\(values\): values\[1\] {message}"):
        stat.add_many([1, value])
    assert stat.count == 0
    stat.add(2**1024 - 2**971)  # float(): 1.7976931348623157e+308
    assert stat.count == 1


def test_stat_add_rejects_a_tensor_with_more_than_one_element() -> None:
    torch = pytest.importorskip("torch")
    stat = Stat("s", [SUM], SECOND)
    with pytest.raises((TypeError, ValueError, RuntimeError)):
        stat.add(torch.tensor([1.0, 2.0]))
    assert stat.count == 0


def test_stat_add_without_argument_is_type_error() -> None:
    stat = Stat("s", [SUM], SECOND)
    with pytest.raises(TypeError):
        stat.add()  # type: ignore[call-arg]


# --- Stat.add / log_event argument lists ------------------------------------
# Both parse their arguments by hand (src/py_entry_points.rs), not through
# PyO3: these are the messages written there, in CPython's wording.

_STAT = Stat("entry.points", [SUM], SECOND)
_EVENT = Event("entry.points", TS, {})


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: _STAT.add(), "Stat.add() missing 1 required positional argument: 'v'"),
        (lambda: _STAT.add(1.0, 2.0), "Stat.add() takes 1 positional argument but 2 were given"),
        (
            lambda: Stat.add(_STAT, 1.0, 2.0),
            "Stat.add() takes 1 positional argument but 2 were given",
        ),
        (lambda: _STAT.add(x=1.0), "Stat.add() got an unexpected keyword argument 'x'"),
        (lambda: _STAT.add(1.0, v=2.0), "Stat.add() got multiple values for argument 'v'"),
        (
            lambda: torchmon.log_event(),
            "log_event() missing 1 required positional argument: 'event'",
        ),
        (
            lambda: torchmon.log_event(_EVENT, _EVENT),
            "log_event() takes 1 positional argument but 2 were given",
        ),
        (
            lambda: torchmon.log_event(e=_EVENT),
            "log_event() got an unexpected keyword argument 'e'",
        ),
        (
            lambda: torchmon.log_event(_EVENT, event=_EVENT),
            "log_event() got multiple values for argument 'event'",
        ),
    ],
    ids=[
        "add-none",
        "add-two",
        "add-unbound-two",
        "add-unknown-keyword",
        "add-twice",
        "log-none",
        "log-two",
        "log-unknown-keyword",
        "log-twice",
    ],
)
def test_hand_parsed_argument_errors_have_the_documented_messages(call: Any, message: str) -> None:
    with pytest.raises(TypeError) as info:
        call()
    assert str(info.value) == message


def test_hand_parsed_entry_points_take_their_argument_by_keyword(recorder) -> None:
    stat = Stat("s", [SUM], SECOND)
    stat.add(v=2.0)
    assert stat.count == 1
    torchmon.log_event(event=_EVENT)
    assert recorder.events == [_EVENT]


def test_python_and_native_argument_errors_share_one_format() -> None:
    from torchmon._errors import arg_type_error, arg_value_error

    with pytest.raises(TypeError) as native_type:
        Stat("s", [SUM], "1")  # type: ignore[arg-type]
    expected = (
        "Stat(window_size): window_size must be a datetime.timedelta or a float "
        "number of seconds, not str"
    )
    assert str(native_type.value) == expected
    helper = arg_type_error(
        "Stat", "window_size", "a datetime.timedelta or a float number of seconds", "1"
    )
    assert str(helper) == expected
    with pytest.raises(ValueError) as native_value:
        Stat("s", [SUM], math.nan)
    assert str(native_value.value) == "Stat(window_size): window_size must be finite, not NaN"
    helper_value = arg_value_error("Stat", "window_size", "must be finite, not NaN")
    assert str(helper_value) == str(native_value.value)
    # WaitCounter is written in Python and uses the same format. (Its
    # window_size goes through the binding's window rule: test_window_rule.py.)
    with pytest.raises(ValueError) as python_value:
        torchmon.WaitCounter("k" * 201)
    assert str(python_value.value) == (
        "WaitCounter(key): key must be at most 200 characters (it names the counter's Stat), "
        "got 201"
    )
    with pytest.raises(TypeError) as python_type:
        torchmon.WaitCounter(1)  # type: ignore[arg-type]
    assert str(python_type.value) == "WaitCounter(key): key must be a str, not int"


# --- Event(name) ----------------------------------------------------------------


@pytest.mark.parametrize("name", [1, None, 1.0, ["e"], object()], ids=repr)
def test_event_name_of_wrong_type_is_type_error(name: object) -> None:
    with pytest.raises(TypeError, match="name"):
        Event(name, TS, {})  # type: ignore[arg-type]


def test_event_name_with_lone_surrogate_is_type_error() -> None:
    with pytest.raises(TypeError, match="name"):
        Event("\ud800", TS, {})


def test_event_name_with_invalid_utf8_is_value_error() -> None:
    with pytest.raises(ValueError, match="name"):
        Event(b"\xff", TS, {})


# --- Event(timestamp) -----------------------------------------------------------


@pytest.mark.parametrize(
    "timestamp", [1.0, 0, None, "2020", "2020-01-01T00:00:00", 1_600_000_000, [TS]], ids=repr
)
def test_event_timestamp_of_wrong_type_is_type_error(timestamp: object) -> None:
    with pytest.raises(TypeError, match="timestamp"):
        Event("e", timestamp, {})  # type: ignore[arg-type]


def test_event_timedelta_timestamp_is_type_error() -> None:
    with pytest.raises(TypeError, match="timestamp"):
        Event("e", timedelta(seconds=1), {})  # type: ignore[arg-type]


# --- Event(data) ---------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        None,
        [("a", 1)],
        {1: 1},
        {None: 1},
        {("a",): 1},
        {"a": None},
        {"a": [1]},
        {"a": (1,)},
        {"a": {"b": 1}},
        {"a": 1j},
        {"a": object()},
        {"a": {1, 2}},
        {"ok": 1, "bad": None},
        "a=1",
    ],
    ids=repr,
)
def test_event_bad_data_is_type_error(data: object) -> None:
    with pytest.raises(TypeError, match="data"):
        Event("e", TS, data)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [2**63, INT64_MIN - 1, 2**200], ids=repr)
def test_event_data_int_outside_int64_is_value_error(value: int) -> None:
    with pytest.raises(ValueError, match="data"):
        Event("e", TS, {"a": value})


def test_event_data_value_with_lone_surrogate_is_runtime_error() -> None:
    with pytest.raises(RuntimeError, match="data"):
        Event("e", TS, {"a": "\ud800"})


def test_event_data_key_with_lone_surrogate_is_type_error() -> None:
    with pytest.raises(TypeError, match="data"):
        Event("e", TS, {"\ud800": 1})


def test_event_data_value_with_invalid_utf8_is_value_error() -> None:
    with pytest.raises(ValueError, match="data"):
        Event("e", TS, {"a": b"\xff"})


def test_event_data_key_with_invalid_utf8_is_value_error() -> None:
    with pytest.raises(ValueError, match="data"):
        Event("e", TS, {b"\xff": 1})


def test_event_data_tensor_value_is_type_error() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="data"):
        Event("e", TS, {"t": torch.tensor(1.0)})


# --- Event: which argument decides ----------------------------------------------


def test_event_first_bad_argument_decides_name() -> None:
    with pytest.raises(TypeError, match="name"):
        Event(1, None, None)  # type: ignore[arg-type]


def test_event_first_bad_argument_decides_timestamp() -> None:
    with pytest.raises(TypeError, match="timestamp"):
        Event("e", None, None)  # type: ignore[arg-type]


def test_event_timestamp_type_error_beats_data_value_error() -> None:
    with pytest.raises(TypeError, match="timestamp"):
        Event("e", 1.0, {"a": 2**63})  # type: ignore[arg-type]


def test_event_name_type_error_beats_data_runtime_error() -> None:
    with pytest.raises(TypeError, match="name"):
        Event(None, TS, {"a": "\ud800"})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [(("e", TS), {}), (("e",), {}), (("e", TS, {}, 1), {}), (("e", TS, {}), {"extra": 1})],
)
def test_event_wrong_argument_count_is_type_error(args: tuple[Any, ...], kwargs: dict) -> None:
    with pytest.raises(TypeError):
        Event(*args, **kwargs)


# --- Event setters ----------------------------------------------------------------


def fresh_event() -> Event:
    return Event("orig", TS, {"k": 1})


@pytest.mark.parametrize(
    ("value", "error"),
    [(1, TypeError), (None, TypeError), ("\ud800", TypeError), (b"\xff", ValueError)],
    ids=repr,
)
def test_event_name_setter_validates_and_keeps_old_value(value: object, error: type) -> None:
    e = fresh_event()
    with pytest.raises(error, match="name"):
        e.name = value  # type: ignore[assignment]
    assert e.name == "orig"


@pytest.mark.parametrize("value", [1.0, None, "2020", 0], ids=repr)
def test_event_timestamp_setter_validates_and_keeps_old_value(value: object) -> None:
    e = fresh_event()
    with pytest.raises(TypeError, match="timestamp"):
        e.timestamp = value  # type: ignore[assignment]
    assert e.timestamp == TS


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (None, TypeError),
        ([("a", 1)], TypeError),
        ({1: 1}, TypeError),
        ({"a": None}, TypeError),
        ({"a": [1]}, TypeError),
        ({"a": 1j}, TypeError),
        ({"good": 2, "bad": None}, TypeError),
        ({"\ud800": 1}, TypeError),
        ({"a": 2**63}, ValueError),
        ({"a": b"\xff"}, ValueError),
        ({"good": 2, "a": "\ud800"}, RuntimeError),
    ],
    ids=ascii,
)
def test_event_data_setter_validates_and_keeps_old_value(value: object, error: type) -> None:
    e = fresh_event()
    with pytest.raises(error, match="data"):
        e.data = value  # type: ignore[assignment]
    assert e.data == {"k": 1}


def test_event_setters_accept_valid_values_after_a_failure() -> None:
    e = fresh_event()
    with pytest.raises(TypeError):
        e.data = {"a": None}  # type: ignore[dict-item]
    e.data = {"a": 2}
    assert e.data == {"a": 2}
    with pytest.raises(TypeError):
        e.timestamp = 5  # type: ignore[assignment]
    e.timestamp = date(2000, 1, 1)
    assert e.timestamp == datetime(2000, 1, 1)


# --- handler functions --------------------------------------------------------------


@pytest.mark.parametrize("handle", [None, 1, "h", object(), print], ids=repr)
def test_unregister_with_a_non_handle_is_type_error(handle: object) -> None:
    with pytest.raises(TypeError, match="handle"):
        torchmon.unregister_event_handler(handle)  # type: ignore[arg-type]


def test_unregister_with_the_callback_instead_of_the_handle_is_type_error(recorder) -> None:
    with pytest.raises(TypeError, match="handle"):
        torchmon.unregister_event_handler(recorder)  # type: ignore[arg-type]
    event = fresh_event()
    torchmon.log_event(event)
    assert recorder.events == [event]  # still registered


@pytest.mark.parametrize("callback", [None, 1, "x", b"x", [print]], ids=repr)
def test_register_with_a_non_callable_is_type_error(callback: object) -> None:
    with pytest.raises(TypeError, match="callback"):
        torchmon.register_event_handler(callback)  # type: ignore[arg-type]


@pytest.mark.parametrize("event", [None, "e", {"name": "e"}, 1.0], ids=repr)
def test_log_event_with_a_non_event_is_type_error(recorder, event: object) -> None:
    with pytest.raises(TypeError, match="event"):
        torchmon.log_event(event)  # type: ignore[arg-type]
    assert recorder.events == []


# --- hypothesis: arbitrary objects ------------------------------------------------

surrogate_text = st.text(st.characters(categories=["Cs", "Ll", "Nd"]), max_size=5)
hashable_objects = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([INT64_MAX, INT64_MIN, 2**63, INT64_MIN - 1, 2**1024, -(2**1024), 2**1023]),
    st.floats(),
    st.text(max_size=10),
    surrogate_text,
    st.binary(max_size=10),
    st.tuples(st.integers()),
    st.complex_numbers(),
    st.timedeltas(),
)
arbitrary_objects = st.one_of(
    hashable_objects,
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
)


def same_float(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1, a) == math.copysign(1, b)


def expected_sample(x: object) -> float | None:
    """float(x) if Stat.add must accept x (docs/api.md, "Stat"), else None (a TypeError)."""
    if isinstance(x, (bool, float)):
        return float(x)
    if isinstance(x, int):
        try:
            return float(x)
        except OverflowError:
            return None
    return None


@given(arbitrary_objects)
def test_hypothesis_stat_add(x: object) -> None:
    expected = expected_sample(x)
    with ManualClock(0):
        stat = Stat("h", [VALUE, COUNT], SECOND, 1)
        if expected is None:
            with pytest.raises(TypeError):
                stat.add(x)  # type: ignore[arg-type]
            assert stat.get() == {VALUE: 0.0, COUNT: 0.0}
        else:
            stat.add(x)  # type: ignore[arg-type]
            got = stat.get()
            assert got[COUNT] == 1.0
            assert same_float(got[VALUE], expected)


def expected_data_value(x: object) -> tuple[type[BaseException] | None, object]:
    """(error class, None) or (None, stored value) for an Event data value
    (docs/api.md, "Event")."""
    if isinstance(x, bool):
        return None, x
    if isinstance(x, int):
        if INT64_MIN <= x <= INT64_MAX:
            return None, x
        return ValueError, None
    if isinstance(x, float):
        return None, x
    if isinstance(x, str):
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:
            return RuntimeError, None
        return None, x
    if isinstance(x, bytes):
        try:
            return None, x.decode("utf-8")
        except UnicodeDecodeError:
            return ValueError, None
    return TypeError, None


@given(arbitrary_objects)
def test_hypothesis_event_data_value(x: object) -> None:
    error, stored = expected_data_value(x)
    if error is not None:
        with pytest.raises(error):
            Event("h", TS, {"k": x})
        e = Event("h", TS, {})
        with pytest.raises(error):
            e.data = {"k": x}
        assert e.data == {}
        return
    got = Event("h", TS, {"k": x}).data["k"]
    assert type(got) is type(stored)
    if isinstance(stored, float):
        assert same_float(got, stored)  # type: ignore[arg-type]
    else:
        assert got == stored


def expected_data_key(x: object) -> tuple[type[BaseException] | None, object]:
    if isinstance(x, str):
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:
            return TypeError, None
        return None, x
    if isinstance(x, bytes):
        try:
            return None, x.decode("utf-8")
        except UnicodeDecodeError:
            return ValueError, None
    return TypeError, None


@given(hashable_objects)
def test_hypothesis_event_data_key(x: object) -> None:
    error, stored = expected_data_key(x)
    if error is not None:
        with pytest.raises(error):
            Event("h", TS, {x: 1})
    else:
        assert Event("h", TS, {x: 1}).data == {stored: 1}


def expected_window_ms(x: object) -> tuple[type[BaseException] | None, int]:
    """(error class, 0) or (None, window length in ms) for Stat's window_size
    (docs/api.md, "Stat")."""
    if isinstance(x, timedelta):
        us = (x.days * 86_400 + x.seconds) * 1_000_000 + x.microseconds
        ms = int(us / 1000) if abs(us) < 2**52 else (abs(us) // 1000) * (1 if us >= 0 else -1)
        return (ValueError, 0) if ms < 1 else (None, ms)
    if isinstance(x, float):
        scaled = x * 1000.0
        if not math.isfinite(scaled):
            return ValueError, 0
        # Too close to the int64 limit to say which side the Rust rounding lands on.
        assume(not (9.2e18 <= abs(scaled) <= 9.3e18))
        ms = math.trunc(scaled)
        if ms < 1 or ms > INT64_MAX:
            return ValueError, 0
        return None, ms
    return TypeError, 0


@given(arbitrary_objects)
def test_hypothesis_stat_window_size(x: object) -> None:
    error, ms = expected_window_ms(x)
    if error is not None:
        with pytest.raises(error):
            Stat("h", [SUM], x)  # type: ignore[arg-type]
        return
    seen: list[dict[str, object]] = []
    handle = torchmon.register_event_handler(lambda e: seen.append(e.data))
    try:
        with ManualClock(0) as clock:
            stat = Stat("h", [SUM], x)  # type: ignore[arg-type]
            if ms <= 10**12:
                # window 1 is [0, ms): still open at ms - 1, closed by an add at ms
                stat.add(1.0)
                clock.set(ms - 1)
                stat.add(2.0)
                assert seen == []
                clock.set(ms)
                stat.add(4.0)
                assert seen == [{"h.sum": 3.0}]
            del stat
    finally:
        torchmon.unregister_event_handler(handle)


def expected_max_samples(x: object) -> int | None:
    """The effective max_samples (<= 0 acts as 1), or None for a TypeError
    (docs/api.md, "Stat")."""
    if isinstance(x, int):  # bool included
        if INT64_MIN <= x <= INT64_MAX:
            return max(int(x), 1)
        return None
    return None


@given(arbitrary_objects)
def test_hypothesis_stat_max_samples(x: object) -> None:
    effective = expected_max_samples(x)
    if effective is None:
        with pytest.raises(TypeError):
            Stat("h", [COUNT], SECOND, x)  # type: ignore[arg-type]
        return
    with ManualClock(0):
        stat = Stat("h", [COUNT], SECOND, x)  # type: ignore[arg-type]
        stat.add(1.0)
        assert stat.count == (0 if effective == 1 else 1)
        stat.add(1.0)
        if effective == 1:
            assert stat.count == 0  # dropped: the window already closed
            assert stat.get() == {COUNT: 1.0}
        elif effective == 2:
            assert stat.count == 0
            assert stat.get() == {COUNT: 2.0}
        else:
            assert stat.count == 2
            assert stat.get() == {COUNT: 0.0}


@pytest.mark.parametrize("active", [False, True], ids=["inactive", "active"])
def test_manual_clock_rejects_times_the_clock_cannot_show(active: bool) -> None:
    """The clock is a signed 64-bit count of milliseconds: outside it, a
    ValueError naming the call (found on 3.13 by the hostile-input test, where
    an active clock let the core's OverflowError through)."""
    clock = ManualClock(5)
    with contextlib.ExitStack() as stack:
        if active:
            stack.enter_context(clock)
        # The one format of an argument error (python/torchmon/_errors.py).
        with pytest.raises(ValueError, match=r"^ManualClock\.set\(ms\): ms must be >= 0, got -1$"):
            clock.set(-1)
        past = r"cannot take the clock past 2\*\*63 - 1 ms$"
        with pytest.raises(ValueError, match=r"^ManualClock\.set\(ms\): ms " + past):
            clock.set(2**63)
        with pytest.raises(ValueError, match=r"^ManualClock\.set\(ms\): ms " + past):
            clock.set(10**5000)  # too large even to convert to a string
        assert clock.now_ms == 5
        clock.set(2**63 - 1)  # the last millisecond is fine
        with pytest.raises(ValueError, match=r"^ManualClock\.advance\(ms\): ms " + past):
            clock.advance(1)
        assert clock.now_ms == 2**63 - 1
        if active:
            assert torchmon._core._clock_ms() == 2**63 - 1
    with pytest.raises(ValueError, match=r"^ManualClock\(start_ms\): start_ms " + past):
        ManualClock(2**63)
