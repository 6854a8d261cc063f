"""What the two conformance state machines share: how a value is compared
(tag), one implementation under test (System) with its recording handlers,
the input strategies, and the rule bodies (SharedRules).

test_state_machine.py runs torchmon against the reference model (model.py),
test_differential_torch.py against torch.monitor; each declares its rules with
its own strategies (torch is never handed inputs that crash it) and calls the
bodies here, so that a fix to a rule reaches both.
"""

from __future__ import annotations

import datetime
import gc
import math
import random
from typing import Any, Callable

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, multiple, rule

HANDLER_ERRORS: dict[str, type[BaseException]] = {
    "ValueError": ValueError,
    "KeyError": KeyError,
    "ZeroDivisionError": ZeroDivisionError,
    "KeyboardInterrupt": KeyboardInterrupt,
}
FIXED_TS = datetime.datetime(2011, 5, 6, 12, 13, 14, 15)
AWARE_TS = datetime.datetime(
    2020, 1, 2, 3, 4, 5, tzinfo=datetime.timezone(datetime.timedelta(hours=5))
)


def tag(value: Any) -> Any:
    """A comparable, type-preserving form of a value (NaN equals NaN, the
    sign of zero counts)."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, float):
        if math.isnan(value):
            return ("float", "nan")
        return ("float", value, math.copysign(1.0, value))
    if isinstance(value, str):
        return ("str", value)
    if isinstance(value, dict):
        return ("dict", sorted((repr(tag(k)), tag(v)) for k, v in value.items()))
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None and abs((value - datetime.datetime.now()).total_seconds()) < 3600:
            return ("datetime", "now")
        return ("datetime", value.isoformat())
    if value is None:
        return None
    return ("other", type(value).__name__)


class System:
    """One implementation (torchmon or the model) and what it was seen doing."""

    def __init__(self, module: Any, set_clock: Callable[[int | None], object]) -> None:
        self.module = module
        self.set_clock = set_clock
        self.calls: list[Any] = []
        self.stats: dict[int, Any] = {}
        self.handles: dict[int, Any] = {}
        self.logged: Any = None
        self.depth = 0

    def aggregation(self, name: str) -> Any:
        return getattr(self.module.Aggregation, name)


def make_handler(
    system: System,
    number: int,
    kind: str,
    arg: str,
    describe: Callable[[Any], Any] = lambda event: tag(event.data),
) -> Callable[[Any], None]:
    """A handler recording each event it gets, its data as `describe` views it."""

    def handler(event: Any) -> None:
        system.calls.append(
            (
                number,
                tag(event.name),
                describe(event),
                tag(event.timestamp),
                event is system.logged,
            )
        )
        if kind == "raise":
            raise HANDLER_ERRORS[arg](f"handler {number}")
        if kind == "rename":
            event.name = event.name + "!"
        if kind == "log_inner" and system.depth == 0:
            system.depth += 1
            try:
                system.module.log_event(system.module.Event("inner", FIXED_TS, {"from": number}))
            finally:
                system.depth -= 1
        if kind == "unregister_self" and number in system.handles:
            system.module.unregister_event_handler(system.handles.pop(number))

    return handler


def observe(system: System, action: Callable[[], Any]) -> tuple[Any, str | None, list[Any]]:
    system.calls = []
    try:
        result, error = action(), None
    except BaseException as exc:  # KeyboardInterrupt from a handler included
        result, error = None, type(exc).__name__
    calls, system.calls = system.calls, []
    return result, error, calls


names = st.text(st.characters(codec="utf-8"), max_size=8)
data_keys = st.text(st.characters(codec="utf-8"), max_size=5)
floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e308, -1e308, 5e-324, float("nan"), float("inf")]),
)
data_values = st.one_of(
    st.text(max_size=5),
    st.integers(min_value=-(2**64), max_value=2**64),
    floats,
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=2),
)
samples = st.one_of(
    floats,
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**1024, -(2**1100)]),
    st.booleans(),
    st.builds(np.float32, st.floats(width=32)),
    st.builds(np.int64, st.integers(min_value=-(2**63), max_value=2**63 - 1)),
    st.sampled_from(["1.5", None, object, [1.0], b"1"]),
)


#: Families of window samples for the estimated aggregations (STDDEV, Pq),
#: each a function of a seeded random.Random: drawing a seed and a size
#: keeps batches of hundreds of samples cheap to generate.
SAMPLE_FAMILIES: dict[str, Callable[[random.Random], float]] = {
    "lognormal": lambda r: r.lognormvariate(0.0, 2.5),
    "bimodal": lambda r: r.gauss(10.0, 1.0) if r.random() < 0.7 else r.gauss(5000.0, 300.0),
    "negative": lambda r: -r.lognormvariate(3.0, 1.5),
    "mixed_signs": lambda r: r.choice((-1.0, 1.0)) * r.lognormvariate(0.0, 4.0),
    "near_1e9": lambda r: 1e9 + r.gauss(0.0, 1.0),
    "near_1e15": lambda r: 1e15 + r.choice((0.125, 0.25, 0.5, 1.0)) * r.randint(-8, 8),
    "zeros": lambda r: r.choice((0.0, -0.0, 0.0, 1.0, -1.0)),
    "subnormal": lambda r: r.choice((-1.0, 1.0)) * r.randint(1, 2000) * 2.0**-1074,
    "tiny_and_huge": lambda r: r.choice((5e-324, 2.2250738585072014e-308, 1e-300, 1e300, 1e308)),
    "nan_inf": lambda r: r.choice((math.nan, math.inf, -math.inf, r.uniform(-10.0, 10.0))),
    "rare_nan": lambda r: math.nan if r.random() < 0.01 else r.expovariate(1.0),
    "integers": lambda r: float(r.randint(-3, 3)),
}


@st.composite
def sample_batches(draw: st.DrawFn) -> tuple[str, int, list[float]]:
    """(family, seed, samples): up to 1,500 samples, so that P99 and P999
    fall on interior ranks (a window needs more than 1,000 samples for P999's
    rank to be below the max)."""
    family = draw(st.sampled_from([*sorted(SAMPLE_FAMILIES), "constant"]))
    size = draw(
        st.one_of(
            st.integers(min_value=1, max_value=12),
            st.integers(min_value=13, max_value=300),
            st.integers(min_value=1001, max_value=1500),
        )
    )
    if family == "constant":  # STDDEV exactly 0 (or NaN), every Pq the value
        return family, 0, [draw(floats)] * size
    seed = draw(st.integers(min_value=0, max_value=2**32 - 1))
    rng = random.Random(seed)
    draw_one = SAMPLE_FAMILIES[family]
    return family, seed, [draw_one(rng) for _ in range(size)]


class SharedRules(RuleBasedStateMachine):
    """The rules and rule bodies of both machines. A machine sets
    ``self.systems`` (torchmon first) and ``self.next_id``, and defines
    ``both()``: run an action on each system and check they behaved alike."""

    stat_ids = Bundle("stat_ids")
    handle_ids = Bundle("handle_ids")

    systems: tuple[System, System]
    next_id: int

    def both(self, action: Callable[[System], Any], view: Callable[[Any], Any] = tag) -> Any:
        """What the first system was seen doing: ``(result view, error type
        name or None, handler calls, ...)``."""
        raise NotImplementedError

    def new_id(self) -> int:
        number = self.next_id
        self.next_id += 1
        return number

    def create_stat_in_both(
        self, name: str, aggregations: list[str], window: Any, max_samples: Any
    ) -> Any:
        """A Stat in each system; its id, or no id when creating it raised."""
        sid = self.new_id()

        def create(system: System) -> None:
            args = [name, [system.aggregation(a) for a in aggregations], window]
            if max_samples is not None:
                args.append(max_samples)
            system.stats[sid] = system.module.Stat(*args)

        error = self.both(create)[1]
        return multiple() if error else sid

    @rule(sid=stat_ids, value=samples)
    def add(self, sid: int, value: Any) -> None:
        self.both(lambda s: s.stats[sid].add(value))

    def add_in_a_row(self, sid: int, values: list[float]) -> None:
        def add_all(system: System) -> None:
            for value in values:
                system.stats[sid].add(value)

        self.both(add_all)

    @rule(sid=consumes(stat_ids))
    def delete_stat(self, sid: int) -> None:
        def delete(system: System) -> None:
            # The last reference: destruction is immediate (gc.collect() would
            # make each step slow once torch is imported).
            del system.stats[sid]

        self.both(delete)

    def log_event_in_both(self, name: str, data: dict[str, Any], timestamp: Any) -> None:
        def log(system: System) -> Any:
            event = system.module.Event(name, timestamp, data)
            system.logged = event
            try:
                system.module.log_event(event)
            finally:
                system.logged = None
            return (event.name, event.data, event.timestamp)

        self.both(log, view=lambda r: tuple(tag(x) for x in r))

    def log_non_event_in_both(self, value: Any) -> None:
        self.both(lambda s: s.module.log_event(value))

    def register_non_callable_in_both(self, value: Any) -> None:
        self.both(lambda s: s.module.register_event_handler(value))

    def unregister_all(self) -> None:
        """Unregisters every handler first, so that dropping the Stats then
        calls none."""
        for system in self.systems:
            for handle in system.handles.values():
                system.module.unregister_event_handler(handle)
            system.handles.clear()
            system.stats.clear()
        gc.collect()
