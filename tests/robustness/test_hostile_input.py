"""Hostile input (docs/reliability.md): arbitrary Python objects into every constructor,
method and setter of the public API.

Allowed outcomes of each call: it succeeds, or it raises ``TypeError`` or
``ValueError`` (``RuntimeError`` only for a lone surrogate as an Event data
value, docs/api.md on strings), or it lets through the very exception that one of the
input's own methods raised (``Hostile``: a ``__float__`` or ``__iter__`` that
raises, as ``float(x)`` and ``list(x)`` do). Anything else fails the test: a
``SystemError``, an ``OverflowError`` (not documented anywhere), a
``PanicException``, a crash or a hang.

The hypothesis tests run in a child pytest process with a hard timeout (a
crash or hang there fails ``test_hostile_input_in_a_subprocess`` instead of the
whole run); the child writes how many inputs it tried, which the parent prints.
"""

from __future__ import annotations

import datetime as dt
import decimal
import fractions
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import torchmon
from torchmon import SUM, Aggregation, Event, Stat
from torchmon.testing import ManualClock

INNER = os.environ.get("TORCHMON_HOSTILE_INNER") == "1"
COUNT_FILE = os.environ.get("TORCHMON_HOSTILE_COUNT_FILE")
TIMEOUT = 420.0
#: Per test (7 tests): the profiles' 500 would take ~50 s here; 300 take ~30 s.
#: Smaller profiles (dev, ci-light) keep their own size.
EXAMPLES = (
    min(300, settings.default.max_examples)
    if settings.default.max_examples <= 500
    else settings.default.max_examples
)
TS = dt.datetime(2020, 1, 1)
SECOND = dt.timedelta(seconds=1)
ALL_AGGREGATIONS = [
    Aggregation.VALUE,
    Aggregation.MEAN,
    Aggregation.COUNT,
    SUM,
    Aggregation.MAX,
    Aggregation.MIN,
]


class Hostile(Exception):
    """Raised by the odd objects' own methods."""


def _raise(*_args: Any) -> Any:
    raise Hostile("from the input's own method")


class IntOdd(int):
    __index__ = _raise
    __float__ = _raise
    __eq__ = _raise
    __hash__ = _raise  # type: ignore[assignment]


class IntHashable(int):
    """Hashable (usable as a dict key), but every conversion raises."""

    __index__ = _raise
    __float__ = _raise
    __int__ = _raise


class FloatOdd(float):
    __float__ = _raise
    __eq__ = _raise
    __hash__ = _raise  # type: ignore[assignment]


class FloatLies(float):
    def __float__(self) -> Any:
        return "not a float"


class StrOdd(str):
    __eq__ = _raise
    __hash__ = _raise  # type: ignore[assignment]
    __str__ = _raise
    encode = _raise  # type: ignore[assignment]


class StrHashable(str):
    __str__ = _raise
    __iter__ = _raise  # type: ignore[assignment]


class DictOdd(dict):  # type: ignore[type-arg]
    __iter__ = _raise
    items = _raise  # type: ignore[assignment]
    keys = _raise  # type: ignore[assignment]
    __getitem__ = _raise
    __len__ = _raise


class IterRaises:
    def __iter__(self) -> Any:
        yield 1.0
        raise Hostile("mid-iteration")


class IterLies:
    """Claims a length it does not have."""

    def __len__(self) -> int:
        return 10**12

    def __iter__(self) -> Any:
        return iter([1.0, 2.0])


class FloatRaisesOther:
    def __float__(self) -> float:
        return 1 / 0


class IndexHuge:
    def __index__(self) -> int:
        return 2**200


class Callable_:
    def __call__(self, *args: Any) -> None:
        raise Hostile("called")


def _recursive_list() -> list[Any]:
    x: list[Any] = [1.0]
    x.append(x)
    return x


def _recursive_dict() -> dict[str, Any]:
    x: dict[str, Any] = {"a": 1}
    x["self"] = x
    return x


surrogates = st.text(st.characters(categories=["Cs", "Ll"]), max_size=4)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([2**63 - 1, -(2**63), 2**63, 2**64, 2**1024, -(2**1024), 10**400]),
    st.floats(),
    st.complex_numbers(),
    st.text(max_size=8),
    surrogates,
    st.binary(max_size=8),
    st.binary(max_size=8).map(bytearray),
    st.decimals(),
    st.fractions(),
    st.timedeltas(),
    st.datetimes(),
    st.datetimes(timezones=st.timezones()),
    st.dates(),
    st.times(),
    st.sampled_from(
        [
            Ellipsis,
            NotImplemented,
            object(),
            int,
            Stat,
            Event,
            Aggregation,
            Aggregation.SUM,
            range(3),
            slice(1, 2),
            memoryview(b"ab"),
            len,
            print,
            torchmon,
            dt.timedelta.max,
            dt.timedelta.min,
            dt.datetime.max,
            dt.datetime.min,
            decimal.Decimal("nan"),
            decimal.Decimal("inf"),
            fractions.Fraction(1, 3),
        ]
    ),
)
odd = st.one_of(
    st.integers().map(IntOdd),
    st.integers().map(IntHashable),
    st.floats().map(FloatOdd),
    st.floats().map(FloatLies),
    st.text(max_size=5).map(StrOdd),
    st.text(max_size=5).map(StrHashable),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=3).map(DictOdd),
    st.builds(IterRaises),
    st.builds(IterLies),
    st.builds(FloatRaisesOther),
    st.builds(IndexHuge),
    st.builds(Callable_),
    st.builds(_recursive_list),
    st.builds(_recursive_dict),
    st.sampled_from(["x" * 200_000, b"y" * 200_000]),  # huge strings
    st.builds(lambda: list(range(20_000))),  # a huge container
    st.builds(lambda: {str(i): i for i in range(5_000)}),
)
leaf = st.one_of(scalars, odd)
hashable_leaf = st.one_of(
    scalars.filter(lambda x: _hashable(x)),
    st.integers().map(IntHashable),
    st.text().map(StrHashable),
)
objects = st.recursive(
    leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.tuples(children, children),
        st.dictionaries(hashable_leaf, children, max_size=3),
        st.frozensets(hashable_leaf, max_size=3),
        st.lists(children, max_size=3).map(iter),
        st.lists(st.sampled_from(ALL_AGGREGATIONS), max_size=3).map(lambda xs: (x for x in xs)),
    ),
    max_leaves=6,
)


def _hashable(x: object) -> bool:
    try:
        hash(x)
    except Exception:
        return False
    return True


tried = 0


def allowed(call: Callable[[], object], *, runtime_error: bool = False) -> object:
    """Runs `call`; returns its result, or None when it raised an allowed exception."""
    global tried
    tried += 1
    try:
        return call()
    except (TypeError, ValueError, Hostile):
        return None
    except RuntimeError as exc:
        if runtime_error and type(exc) is RuntimeError:
            return None
        raise


@pytest.fixture(scope="module", autouse=True)
def _report_count() -> Any:
    yield
    if COUNT_FILE:
        Path(COUNT_FILE).write_text(json.dumps({"tried": tried}))


inner_only = pytest.mark.skipif(not INNER, reason="runs in the child of the test below")


class Recorder:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, e: Event) -> None:
        self.n += 1
        e.name  # noqa: B018
        e.data  # noqa: B018


@inner_only
@settings(max_examples=EXAMPLES)
@given(name=objects, aggregations=objects, window=objects, max_samples=objects)
def test_stat_constructor(name: Any, aggregations: Any, window: Any, max_samples: Any) -> None:
    valid = ("s", [SUM], SECOND, 5)
    for i, value in enumerate((name, aggregations, window, max_samples)):
        args = list(valid)
        args[i] = value
        stat = allowed(lambda args=args: Stat(*args))
        if isinstance(stat, Stat):
            with ManualClock(0):
                stat.add(1.0)
                repr(stat)
                stat.get()
    allowed(lambda: Stat(name, aggregations, window, max_samples))
    allowed(
        lambda: Stat(
            name=name, aggregations=aggregations, window_size=window, max_samples=max_samples
        )
    )


@inner_only
@settings(max_examples=EXAMPLES)
@given(value=objects)
def test_stat_add_and_add_many(value: Any) -> None:
    rec = Recorder()
    handle = torchmon.register_event_handler(rec)
    try:
        with ManualClock(0) as clock:
            stat = Stat("h", ALL_AGGREGATIONS, SECOND, 3)
            allowed(lambda: stat.add(value))
            allowed(lambda: stat.add(v=value))
            allowed(lambda: stat.add_many(value))
            allowed(lambda: stat.add_many([1.0, value, 2.0]))
            clock.advance(1000)
            stat.add(1.0)  # the Stat still works and emits
            allowed(lambda: stat.get())
    finally:
        torchmon.unregister_event_handler(handle)


@inner_only
@settings(max_examples=EXAMPLES)
@given(name=objects, timestamp=objects, data=objects, key=objects, item=objects)
def test_event_constructor_and_setters(
    name: Any, timestamp: Any, data: Any, key: Any, item: Any
) -> None:
    allowed(lambda: Event(name, TS, {}))
    allowed(lambda: Event("e", timestamp, {}))
    allowed(lambda: Event("e", TS, data), runtime_error=True)
    if _hashable(key):
        allowed(lambda: Event("e", TS, {key: 1}))
    allowed(lambda: Event("e", TS, {"k": item}), runtime_error=True)
    allowed(lambda: Event(name=name, timestamp=timestamp, data=data), runtime_error=True)
    e = Event("e", TS, {"a": 1})
    allowed(lambda: setattr(e, "name", name))
    allowed(lambda: setattr(e, "timestamp", timestamp))
    allowed(lambda: setattr(e, "data", data), runtime_error=True)
    # whatever happened, the Event is still a valid Event
    assert isinstance(e.name, str)
    assert isinstance(e.timestamp, (dt.datetime, dt.date, dt.time))
    assert isinstance(e.data, dict)
    repr(e)


@inner_only
@settings(max_examples=EXAMPLES)
@given(value=objects)
def test_registry_functions(value: Any) -> None:
    rec = Recorder()
    handle = torchmon.register_event_handler(rec)
    try:
        allowed(lambda: torchmon.log_event(value))
        allowed(lambda: torchmon.unregister_event_handler(value))
        got = allowed(lambda: torchmon.register_event_handler(value))
        if got is not None:
            torchmon.unregister_event_handler(got)  # never called: it may print
        torchmon.log_event(Event("after", TS, {}))
        assert rec.n == 1
    finally:
        torchmon.unregister_event_handler(handle)


@inner_only
@settings(max_examples=EXAMPLES)
@given(value=objects)
def test_aggregation_and_wait_counter(value: Any) -> None:
    allowed(lambda: Aggregation(value))
    counter = allowed(lambda: torchmon.WaitCounter(value))
    allowed(lambda: torchmon.WaitCounter("k", value))
    allowed(lambda: torchmon._WaitCounter(value))
    if isinstance(counter, torchmon.WaitCounter):
        with counter.guard():
            pass


@inner_only
@settings(max_examples=EXAMPLES)
@given(value=objects, other=objects)
def test_handler_constructors(value: Any, other: Any) -> None:
    # The child runs in a scratch directory: a str path creates a file there.
    handler = allowed(lambda: torchmon.TensorboardEventHandler(value))
    if handler is not None:
        allowed(lambda: handler(Event(torchmon.STAT_EVENT, TS, {"a.sum": 1.0})))  # type: ignore[operator]
    allowed(lambda: torchmon.TensorboardEventHandler(_Writer(), other_events=value))
    allowed(lambda: torchmon.TensorboardEventHandler(_Writer(), step_field=value))
    allowed(lambda: torchmon.TensorboardEventHandler(_Writer(), layout=value))
    stepped = allowed(lambda: torchmon.TensorboardEventHandler(_Writer(), step=value))
    if stepped is not None:
        allowed(lambda: stepped(Event(torchmon.STAT_EVENT, TS, {"a.sum": 1.0})))  # type: ignore[operator]
    if not (isinstance(value, (str, bytes)) and len(value) > 200):
        sink = allowed(lambda: torchmon.JsonlEventHandler(value))
        if isinstance(sink, torchmon.JsonlEventHandler):
            sink.close()
    sink = allowed(lambda: torchmon.JsonlEventHandler("fixed.jsonl", max_bytes=value))
    if isinstance(sink, torchmon.JsonlEventHandler):
        sink.close()
    sink = allowed(lambda: torchmon.JsonlEventHandler("fixed.jsonl", backup_count=value))
    if isinstance(sink, torchmon.JsonlEventHandler):
        sink.close()


class _Writer:
    def add_scalar(
        self, tag: str, value: float, global_step: int | None = None, walltime: float | None = None
    ) -> None:
        assert isinstance(tag, str) and not math.isnan(walltime or 0.0)


@inner_only
@settings(max_examples=EXAMPLES)
@given(value=objects)
def test_manual_clock(value: Any) -> None:
    allowed(lambda: ManualClock(value))
    with ManualClock(5) as clock:
        allowed(lambda: clock.set(value))
        allowed(lambda: clock.advance(value))
        stat = Stat("c", [SUM], SECOND)
        stat.add(1.0)  # the clock still drives Stats
        del stat
    inactive = ManualClock()
    allowed(lambda: inactive.set(value))
    allowed(lambda: inactive.advance(value))


# --- the guard: run the tests above in a child with a hard timeout ----------------


@pytest.mark.hypothesis_suite
@pytest.mark.skipif(INNER, reason="the parent test")
def test_hostile_input_in_a_subprocess(tmp_path: Path) -> None:
    count_file = tmp_path / "count.json"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = dict(
        os.environ,
        TORCHMON_HOSTILE_INNER="1",
        TORCHMON_HOSTILE_COUNT_FILE=str(count_file),
        # tests/, for the child's `from support import ...`
        PYTHONPATH=os.pathsep.join(
            [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
        ),
    )
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-q",
                "-x",
                "--rootdir",
                str(Path(__file__).parents[2]),
                "-c",
                str(Path(__file__).parents[2] / "pyproject.toml"),
                str(Path(__file__)),
            ],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            env=env,
            cwd=scratch,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the hostile-input child hung (killed after {TIMEOUT}s): {exc.stdout!r}")
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    tried = json.loads(count_file.read_text())["tried"]
    print(f"hostile inputs tried: {tried}")
    assert tried > 1000


@pytest.mark.skipif(INNER, reason="the parent's own test")
def test_add_many_with_a_lying_len_does_not_abort() -> None:
    """Found by this file: add_many reserved `len(values)` slots up front, and a
    `__len__` of 10**12 made the allocation abort the process (SIGABRT)."""
    from support import run_python

    proc = run_python(
        """
        import datetime as dt, torchmon as m
        class Lies:
            def __len__(self):
                return 10**12
            def __iter__(self):
                return iter([1.0, 2.0])
        s = m.Stat("s", [m.SUM], dt.timedelta(hours=1))
        s.add_many(Lies())
        print(s.count)
        """,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == "2\n"
