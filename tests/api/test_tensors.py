"""`Stat.add(t)` / `Stat.add_many(t)` with torch tensors, eagerly and inside
torch.compile (docs/guide.md, "Recording tensors and torch.compile"): what
they record equals float adds of the same values at the same moments.

Each test feeds a Stat tensors and a twin the same values as Python floats
(`float(t)`, `t.tolist()`, computed by torch, not by torchmon), under one
ManualClock, and compares the events of the two.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

import torchmon
from torchmon import _tensors
from torchmon.testing import ManualClock

torch = pytest.importorskip("torch")

AGGREGATIONS = [
    torchmon.VALUE,
    torchmon.MEAN,
    torchmon.COUNT,
    torchmon.SUM,
    torchmon.MAX,
    torchmon.MIN,
    torchmon.P50,
]
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32]


class Twins:
    """A Stat fed tensors and one fed the same values as floats."""

    def __init__(self, max_samples: int = 2**63 - 1) -> None:
        self.tensors = torchmon.Stat("tensors", AGGREGATIONS, 1.0, max_samples)
        self.floats = torchmon.Stat("floats", AGGREGATIONS, 1.0, max_samples)
        self.events: dict[str, list[dict[str, float]]] = {"tensors": [], "floats": []}

    def __call__(self, event: torchmon.Event) -> None:
        data = event.data
        stat = next(iter(data), "").partition(".")[0]
        if stat not in self.events:
            # Another Stat's window: one an earlier test left for the garbage
            # collector is flushed when collected, into whatever handlers are
            # registered then (seen on CPython 3.14: a SystemStats figure).
            return
        self.events[stat].append({key.partition(".")[2]: v for key, v in data.items()})  # type: ignore[misc]

    def add(self, t: Any) -> None:
        self.tensors.add(t)
        self.floats.add(float(t))

    def add_many(self, t: Any) -> None:
        self.tensors.add_many(t)
        self.floats.add_many(t.tolist())

    def assert_same(self) -> None:
        torchmon.flush()
        assert self.events["tensors"] == self.events["floats"]
        assert len(self.events["floats"]) >= 2


@pytest.fixture
def twins() -> Iterator[Twins]:
    pair = Twins(max_samples=5)
    handle = torchmon.register_event_handler(pair)
    try:
        yield pair
    finally:
        torchmon.unregister_event_handler(handle)


@pytest.fixture(params=["read at the call", "read at window close"])
def read_mode(request: pytest.FixtureRequest) -> str:
    """CPU tensors are read at the call; the second mode runs the deferred
    reads that devices other than the CPU get, on CPU tensors."""
    if request.param == "read at window close":
        _read_at_window_close(request)
    return str(request.param)


def _read_at_window_close(request: pytest.FixtureRequest) -> None:
    previous = _tensors.set_read_cpu_at_call(False)
    request.addfinalizer(lambda: _tensors.set_read_cpu_at_call(previous))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_add_equals_float_adds_across_windows_and_max_samples(
    dtype: Any, twins: Twins, read_mode: str
) -> None:
    values = [0.1, 2.5, -3.75, 7.0, 1e3, 33.3, 5.5, -0.5, 9.0, 4.25, 8.0]
    with ManualClock() as clock:
        for index, value in enumerate(values):
            twins.add(torch.tensor(value).to(dtype))
            # Several adds per window, more than max_samples=5 in the first.
            if index in (6, 8):
                clock.advance(1000)
        twins.assert_same()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_add_many_equals_float_add_many(dtype: Any, twins: Twins, read_mode: str) -> None:
    with ManualClock() as clock:
        twins.add_many((torch.arange(4) * 1.5 - 2).to(dtype))
        twins.add(torch.tensor([3], dtype=dtype))
        twins.add_many(torch.tensor([100, 7], dtype=dtype))
        clock.advance(1500)
        twins.add_many(torch.arange(3).to(dtype))
        twins.assert_same()


def test_nan_and_inf_as_for_floats(twins: Twins, read_mode: str) -> None:
    with ManualClock() as clock:
        for value in (1.0, math.inf, -math.inf):
            twins.add(torch.tensor(value))
        clock.advance(1000)
        twins.add(torch.tensor(math.nan))
        twins.add(torch.tensor(2.0))
        torchmon.flush()
        nan_window = twins.events["tensors"][1]
        assert math.isnan(nan_window["mean"])
        # NaN != NaN: the windows are compared as reprs.
        assert repr(twins.events["tensors"]) == repr(twins.events["floats"])


def test_deferred_values_go_to_the_window_of_their_call(
    recorder: Any, request: pytest.FixtureRequest
) -> None:
    _read_at_window_close(request)
    with ManualClock() as clock:
        stat = torchmon.Stat("loss", [torchmon.SUM, torchmon.COUNT], 1.0)
        stat.add(torch.tensor(1.0))
        stat.add(torch.tensor(2.0))
        # Nothing read yet: the values wait for their window to close.
        assert stat.count == 0
        clock.advance(1000)
        # The first add of the next window reads both windows' values in
        # one copy and closes the first window, as a float add would.
        stat.add(torch.tensor(10.0))
        assert recorder.stat_data == [{"loss.sum": 3.0, "loss.count": 2.0}]
        assert stat.count == 1
        stat.add(torch.tensor(5.0))
        assert stat.count == 1
        torchmon.flush()
        assert recorder.stat_data[1:] == [{"loss.sum": 15.0, "loss.count": 2.0}]


def test_a_tensor_that_requires_grad_is_detached(recorder: Any, read_mode: str) -> None:
    import weakref

    stat = torchmon.Stat("loss", [torchmon.SUM], 60.0)
    weight = torch.ones(3, requires_grad=True)
    loss = (weight * 2).sum()
    scaled = weight * 3
    refs = [weakref.ref(loss), weakref.ref(scaled)]
    stat.add(loss)
    stat.add_many(scaled)
    # Not even a kept value holds the autograd graph: a detached tensor
    # shares the storage, not the tensor.
    del loss, scaled
    assert [ref() for ref in refs] == [None, None]
    assert all(not t.requires_grad for _, _, kept in _tensors._pending.values() for t in kept)
    torchmon.flush()
    assert recorder.stat_data == [{"loss.sum": 15.0}]


@pytest.mark.parametrize(
    ("call", "value", "error", "message"),
    [
        ("add", lambda: torch.ones(2, 3), ValueError, r"Stat.add\(v\).*not 6 \(shape \(2, 3\)\)"),
        ("add", lambda: torch.zeros(0), ValueError, r"Stat.add\(v\).*shape \(0,\)"),
        ("add", lambda: torch.tensor(1 + 2j), TypeError, r"Stat.add\(v\).*complex"),
        ("add", lambda: torch.empty((), device="meta"), ValueError, r"Stat.add\(v\).*meta"),
        ("add_many", lambda: torch.ones(2, 2), ValueError, r"add_many\(values\).*shape \(2, 2\)"),
        ("add_many", lambda: torch.ones(()), ValueError, r"add_many\(values\).*shape \(\)"),
        ("add_many", lambda: torch.ones(2, dtype=torch.complex64), TypeError, "complex"),
    ],
)
def test_bad_tensors_are_clear_errors_and_add_nothing(
    call: str, value: Any, error: type[Exception], message: str
) -> None:
    stat = torchmon.Stat("loss", [torchmon.SUM], 60.0)
    with pytest.raises(error, match=message):
        getattr(stat, call)(value())
    assert stat.count == 0


def _quietly(make: Any) -> Any:
    """Builds a tensor of a beta/prototype layout without torch's warning
    about the layout (the tests run with warnings as errors)."""

    def build() -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return make()

    return build


_OTHER_LAYOUTS = {
    "sparse_coo": (
        _quietly(lambda: torch.tensor([1.0, 2.0]).to_sparse()),
        r"not one with layout torch\.sparse_coo",
    ),
    "sparse_csr": (
        _quietly(lambda: torch.tensor([[1.0]]).to_sparse_csr()),
        r"not one with layout torch\.sparse_csr",
    ),
    "sparse_csc": (
        _quietly(lambda: torch.tensor([[1.0]]).to_sparse_csc()),
        r"not one with layout torch\.sparse_csc",
    ),
    "nested": (
        _quietly(lambda: torch.nested.nested_tensor([torch.tensor([1.0])])),
        r"not a nested one \(layout torch\.strided\)",
    ),
    "jagged": (
        _quietly(lambda: torch.nested.nested_tensor([torch.ones(1)], layout=torch.jagged)),
        r"not a nested one \(layout torch\.jagged\)",
    ),
}


@pytest.mark.parametrize("call", ["add", "add_many"])
@pytest.mark.parametrize("layout", list(_OTHER_LAYOUTS))
def test_tensors_of_other_layouts_are_type_errors_naming_the_layout(
    layout: str, call: str, read_mode: str
) -> None:
    make, message = _OTHER_LAYOUTS[layout]
    argument = "v" if call == "add" else "values"
    stat = torchmon.Stat("loss", [torchmon.SUM], 60.0)
    # The one format of an argument error (python/torchmon/_errors.py).
    prefix = rf"Stat\.{call}\({argument}\): {argument} must be a dense"
    with pytest.raises(TypeError, match=rf"{prefix} .*{message}"):
        getattr(stat, call)(make())
    assert stat.count == 0


# A training step (forward, backward by torch.func, SGD update) recording the
# loss, the gradient norm and a token count into three Stats, run eagerly and
# compiled, over three windows (ManualClock); prints both runs' events.
# torchmon is imported first: its torch support is installed when torch, and
# then torch._dynamo, finish importing.
_TRAINING_STEP = """
import json, sys
import torchmon
assert "torch" not in sys.modules
import torch
from torch._dynamo.utils import counters
from torch.func import functional_call, grad_and_value
from torchmon.testing import ManualClock

backend = sys.argv[1]
events = {"eager": [], "compiled": []}
run = ["eager"]
torchmon.register_event_handler(lambda e: events[run[0]].append(dict(e.data)))
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

def train(compiled):
    torch.manual_seed(0)
    params = {k: torch.randn_like(v) for k, v in model.named_parameters()}
    aggregations = [torchmon.MEAN, torchmon.MAX, torchmon.COUNT, torchmon.P90]
    loss_stat = torchmon.Stat("loss", aggregations, 1.0)
    grad_norm_stat = torchmon.Stat("grad_norm", aggregations, 1.0)
    tokens_stat = torchmon.Stat("tokens", aggregations, 1.0, max_samples=4)

    def loss_fn(p, x, y):
        return torch.nn.functional.mse_loss(functional_call(model, p, (x,)), y)

    def step(x, y):
        grads, loss = grad_and_value(loss_fn)(params, x, y)
        for name, grad in grads.items():
            params[name].sub_(0.05 * grad)
        loss_stat.add(loss)
        grad_norm_stat.add(torch.sqrt(sum((g * g).sum() for g in grads.values())))
        tokens_stat.add((x > 0).sum())
        tokens_stat.add_many((y > 0).sum(dim=1))
        return loss

    if compiled:
        step = torch.compile(step, fullgraph=True, backend=backend)
    with ManualClock() as clock:
        for index in range(9):
            step(torch.randn(5, 4), torch.randn(5, 1))
            if index % 3 == 2:
                clock.advance(1000)
        torchmon.flush()

train(compiled=False)
run[0] = "compiled"
train(compiled=True)
print(json.dumps({
    "events": events,
    "graph_breaks": sum(counters["graph_break"].values()),
    "unique_graphs": counters["stats"]["unique_graphs"],
}))
"""


@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_training_step_records_what_eager_records_without_graph_breaks(
    backend: str, tmp_path: Any
) -> None:
    import json
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(_TRAINING_STEP)
    result = subprocess.run(
        [sys.executable, str(script), backend], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["graph_breaks"] == 0
    # One graph for every window and all three Stats.
    assert report["unique_graphs"] == 1
    eager, compiled = report["events"]["eager"], report["events"]["compiled"]
    assert len(eager) == 9  # 3 windows x 3 Stats
    assert [e.keys() for e in compiled] == [e.keys() for e in eager]
    for got, want in zip(compiled, eager):
        assert got == {key: pytest.approx(value, rel=1e-5) for key, value in want.items()}
    assert [e["tokens.count"] for e in eager if "tokens.count" in e] == [4.0, 4.0, 4.0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_adds_do_not_synchronise_the_device(recorder: Any) -> None:
    with ManualClock() as clock:
        stat = torchmon.Stat("loss", [torchmon.SUM, torchmon.COUNT], 1.0)
        values = torch.arange(6, dtype=torch.float32, device="cuda")
        torch.cuda.set_sync_debug_mode("error")
        try:
            for value in values[:3]:
                stat.add(value)
            stat.add_many(values[3:])
        finally:
            torch.cuda.set_sync_debug_mode("default")
        clock.advance(1000)
        stat.add(torch.tensor(100.0, device="cuda"))  # closes the window: one read
        assert recorder.stat_data == [{"loss.sum": 15.0, "loss.count": 6.0}]
        torchmon.flush()


# In-process compiled tests: the eager backend compiles in about a second and
# traces exactly what inductor does (the subprocess test above runs both).
def _compile(fn: Any, **options: Any) -> Any:
    return torch.compile(fn, backend="eager", **options)


@pytest.fixture
def dynamo_counters() -> Any:
    from torch._dynamo.utils import counters

    counters.clear()
    return counters


class _Logger:
    """What a trainer's logging helper looks like: dynamo inlines its methods."""

    def __init__(self, stat: torchmon.Stat) -> None:
        self.stat = stat

    def log(self, value: Any) -> None:
        self._log(value * 1)

    def _log(self, value: Any) -> None:
        self.stat.add(value)


def test_compiled_adds_from_inlined_methods_are_recorded(
    twins: Twins, read_mode: str, dynamo_counters: Any
) -> None:
    logger = _Logger(twins.tensors)

    @_compile
    def step(x: Any) -> Any:
        loss = (x * x).mean()
        logger.log(loss)
        twins.tensors.add_many(x[:2])
        return loss

    with ManualClock() as clock:
        for index in range(7):
            x = torch.arange(4.0) + index
            step(x)
            twins.floats.add(float((x * x).mean()))
            twins.floats.add_many(x[:2].tolist())
            if index in (2, 4):
                clock.advance(1000)
        twins.assert_same()
    assert sum(dynamo_counters["graph_break"].values()) == 0
    assert dynamo_counters["stats"]["unique_graphs"] == 1
    # Only the step's frame: the recording after each run, and the event
    # handlers of the windows it closed, ran with dynamo's frame hook off.
    assert dynamo_counters["frames"]["total"] == 1


def test_values_staged_before_a_graph_break_are_recorded_in_call_order(
    recorder: Any, dynamo_counters: Any
) -> None:
    stat = torchmon.Stat("order", [torchmon.VALUE, torchmon.COUNT], 60.0)

    @_compile
    def step(x: Any) -> Any:
        stat.add(x.sum())
        torch._dynamo.graph_break()
        stat.add(x.max())
        return x

    step(torch.tensor([1.0, 2.0]))
    step(torch.tensor([5.0, 7.0]))
    torchmon.flush()
    assert sum(dynamo_counters["graph_break"].values()) == 1
    # VALUE is the last value added: the second graph's x.max() of the last call.
    assert recorder.stat_data == [{"order.value": 7.0, "order.count": 4.0}]


def test_a_compiled_step_run_by_several_threads_counts_every_value(recorder: Any) -> None:
    import threading

    stat = torchmon.Stat("threads", [torchmon.SUM, torchmon.COUNT], 3600.0)

    @_compile
    def step(x: Any) -> Any:
        stat.add(x.sum())
        return x + 1

    step(torch.ones(3))  # compiled once, before the threads start
    torchmon.flush()  # emits that call's window
    recorder.events.clear()

    def run() -> None:
        for _ in range(200):
            step(torch.ones(3))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    torchmon.flush()
    assert recorder.stat_data == [{"threads.sum": 2400.0, "threads.count": 800.0}]


def test_values_a_store_left_in_the_staging_module_are_recorded_at_flush(
    recorder: Any,
) -> None:
    from torchmon import _compiled

    pytest.importorskip("torch._dynamo")  # installs the compile support
    stat = torchmon.Stat("leftover", [torchmon.SUM], 60.0)
    # What a dynamo that stored into the module's __dict__, past its
    # __setattr__, would leave (docs/internals.md, "Tensors in compiled graphs").
    vars(_compiled)["_staged"] = ((((stat._live_id, 1),), torch.tensor([2.5])),)
    torchmon.flush()
    assert vars(_compiled)["_staged"] is None
    assert recorder.stat_data == [{"leftover.sum": 2.5}]


def test_other_stores_into_the_staging_module_are_ordinary() -> None:
    from torchmon import _compiled

    pytest.importorskip("torch._dynamo")  # installs the native store
    # The module's __setattr__ is native and records only `_staged` tuples
    # (docs/internals.md, "Tensors in compiled graphs").
    _compiled.some_setting = 3  # type: ignore[attr-defined]
    try:
        assert _compiled.some_setting == 3  # type: ignore[attr-defined]
        _compiled._staged = None
        assert vars(_compiled)["_staged"] is None
    finally:
        del _compiled.some_setting  # type: ignore[attr-defined]
    assert not hasattr(_compiled, "some_setting")


def test_a_compiled_step_records_into_the_stat_that_replaced_a_dead_one(
    recorder: Any, dynamo_counters: Any
) -> None:
    import gc

    stats = [torchmon.Stat("first", [torchmon.SUM], 60.0)]

    @_compile
    def step(x: Any) -> Any:
        stats[0].add(x.sum())
        return x

    step(torch.ones(2))
    torchmon.flush()
    assert recorder.stat_data == [{"first.sum": 2.0}]
    recorder.events.clear()
    # The graph keeps no Stat alive: the dead one is gone, and its
    # successor (another _live_id, so another graph) records.
    stats[0] = torchmon.Stat("second", [torchmon.SUM], 60.0)
    gc.collect()
    step(torch.ones(3))
    step(torch.ones(3))
    torchmon.flush()
    assert recorder.stat_data == [{"second.sum": 6.0}]
    assert dynamo_counters["stats"]["unique_graphs"] == 2


def test_a_handler_error_in_a_window_a_compiled_step_closes_reaches_the_step(
    dynamo_counters: Any,
) -> None:
    def failing(event: torchmon.Event) -> None:
        raise RuntimeError(f"handler failed on {event.name}")

    stat = torchmon.Stat("closing", [torchmon.SUM], 1.0)

    @_compile
    def step(x: Any) -> Any:
        stat.add(x.sum())
        return x

    handle = torchmon.register_event_handler(failing)
    try:
        with ManualClock() as clock:
            step(torch.ones(2))
            clock.advance(1000)
            # The add of the next window closes the first one: its handler's
            # error is raised by the step, as by an eager add.
            with pytest.raises(RuntimeError, match=r"handler failed on torch\.monitor\.Stat"):
                step(torch.ones(2))
    finally:
        torchmon.unregister_event_handler(handle)
    assert dynamo_counters["frames"]["total"] == 1


@pytest.mark.parametrize("dynamic", [False, True], ids=["static shapes", "dynamic shapes"])
def test_a_graph_staging_more_values_than_a_staging_buffer_records_each_in_order(
    recorder: Any, read_mode: str, dynamic: bool, dynamo_counters: Any
) -> None:
    # More values than one staging buffer holds, a 1-d tensor longer than a
    # buffer, and, with dynamic shapes, lengths the trace knows only as
    # symbols (docs/internals.md, "Tensors in compiled graphs").
    from torchmon import _compiled

    aggregations = [torchmon.SUM, torchmon.COUNT, torchmon.VALUE, torchmon.MAX]
    scalars, long, short = (
        torchmon.Stat(name, aggregations, 3600.0) for name in ("scalars", "long", "short")
    )
    floats = {name: torchmon.Stat(f"f{name}", aggregations, 3600.0) for name in ("s", "l", "h")}
    values_per_buffer = _compiled.BUFFER_SIZE

    @functools.partial(torch.compile, backend="eager", fullgraph=True, dynamic=dynamic)
    def step(x: Any) -> Any:
        for index in range(values_per_buffer + 5):
            scalars.add(x[index % x.shape[0]] * index)
            if index == 3:
                long.add_many(torch.cat([x, x, x]) + index)
            if index == 7:
                short.add_many(x[:3] - 1)
        return x.sum()

    for size in (2 * values_per_buffer, 2 * values_per_buffer + 3):
        x = torch.arange(float(size)) / 4
        step(x)
        for index in range(values_per_buffer + 5):
            floats["s"].add(float(x[index % size] * index))
            if index == 3:
                floats["l"].add_many((torch.cat([x, x, x]) + index).tolist())
            if index == 7:
                floats["h"].add_many((x[:3] - 1).tolist())
    torchmon.flush()
    events = {next(iter(data)).partition(".")[0]: data for data in recorder.stat_data}

    def values(name: str) -> dict[str, object]:
        return {key.partition(".")[2]: v for key, v in events[name].items()}

    assert values("scalars") == values("fs")
    assert values("long") == values("fl")
    assert values("short") == values("fh")
    assert values("long")["count"] == 3 * (4 * values_per_buffer + 3)
    assert sum(dynamo_counters["graph_break"].values()) == 0


def test_tensor_support_installs_after_a_find_spec_of_torch() -> None:
    """Frameworks ask ``importlib.util.find_spec("torch")`` whether torch is
    installed before they import it (transformers does, at its import): the
    tensor support still installs at the ``import torch`` that follows, so a
    tensor Stat.add gets torchmon's checks and deferred reads, and
    torch.compile support follows (docs/guide.md, "Recording tensors and
    torch.compile")."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import importlib.util
        import torchmon
        assert importlib.util.find_spec("torch") is not None
        assert importlib.util.find_spec("torch._dynamo") is not None
        import torch
        stat = torchmon.Stat("loss", [torchmon.COUNT], 60.0)
        try:
            stat.add(torch.tensor([1.0, 2.0]))
        except Exception as exc:
            print(type(exc).__name__, exc)
        import torch._dynamo
        from torchmon import _tensors
        print(_tensors._compile_support_installed)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "ValueError Stat.add(v): v must hold one number, not 2 (shape (2,))",
        "True",
    ]
