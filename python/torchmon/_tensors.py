"""Recording torch tensors with ``Stat.add`` / ``Stat.add_many``, eagerly and
inside ``torch.compile`` (docs/guide.md, "Recording tensors and torch.compile").

``import torchmon`` does not import torch, nor this module's torch parts:
:func:`install_when_imported` makes the eager support start when torch is
imported (at once when it already is), and the compile support when
``torch._dynamo`` is (``torch.compile`` imports it on its first call; importing
it costs about as much as ``import torch``, so nothing here imports it).

Eager: a CPU tensor is read at the call (no device is synchronised). A tensor
on another device is kept, detached, with the clock reading of its call, and
the Stat's pending tensors are read in one batch (one synchronisation) with
the first tensor add that falls in a later window, at ``torchmon.flush()`` and
at exit; each value then goes to the window of the call that added it, and the
earlier window closes at that add, as with floats.

Compiled: dynamo cannot trace into a native method, so ``Stat.add`` and
``Stat.add_many`` get a traceable stand-in (``torch.compiler.substitute_in_graph``)
that stages the detached tensor with the Stat's ``_live_id`` (a number never
reused, so that a graph does not keep its Stats alive) in ``_compiled``: the
graph returns the staged tensors, and one Python call after each run of the
graph, :func:`record_staged`, records them, in call order, as eager adds made
then.
"""

from __future__ import annotations

import sys
from types import ModuleType

from . import _compiled, _core, _forksafe
from ._errors import arg_message, arg_value_error

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported by `import torchmon`
    from typing import Any

    from ._compiled import Staged

#: The oldest torch whose ``torch.compiler.substitute_in_graph`` this
#: module uses.
MIN_TORCH_FOR_COMPILE = (2, 5)

# Guards _pending; released in a forked child (a DataLoader worker may fork
# while the training thread holds it).
_lock = _forksafe.new_lock()
_torch: Any = None
_compile_support_installed = False
# live_id -> [window id, clock readings, detached device tensors (1-d)]
_pending: dict[int, tuple[int, list[int], list[Any]]] = {}


def _check_values(values: Any, where: str, one_value: bool) -> None:
    """The checks that make a bad tensor a clear error (docs/api.md,
    ``Stat.add``). Only cheap tensor methods: a new tensor (``detach``,
    ``reshape``) costs microseconds in eager mode, more than the add."""
    argument = "v" if one_value else "values"
    if values.is_nested or values.layout is not _torch.strided:
        # Sparse, nested and mkldnn tensors have no storage to read in place
        # (.item() and .tolist() fail on most of them, with torch's messages).
        if values.is_nested:
            raise TypeError(
                arg_message(
                    where,
                    argument,
                    f"must be a dense torch.Tensor, not a nested one (layout {values.layout})",
                )
            )
        raise TypeError(
            arg_message(
                where,
                argument,
                "must be a dense (torch.strided) torch.Tensor, not one with layout "
                f"{values.layout}: convert it with .to_dense()",
            )
        )
    if values.is_complex():
        raise TypeError(
            arg_message(where, argument, f"must be real, not a complex tensor ({values.dtype})")
        )
    if values.is_meta:
        raise arg_value_error(
            where, argument, "must not be on the meta device, which has no values to record"
        )
    if one_value:
        if values.numel() != 1:
            raise arg_value_error(
                where,
                argument,
                f"must hold one number, not {values.numel()} (shape {tuple(values.shape)})",
            )
    elif values.dim() != 1:
        raise arg_value_error(
            where, argument, f"must be one-dimensional, not a tensor of shape {tuple(values.shape)}"
        )


#: Whether CPU tensors are read at the call (reading them synchronises
#: nothing). The tests clear it, with set_read_cpu_at_call, to run the
#: deferred reads of other devices on CPU tensors.
_read_cpu_at_call = True


def set_read_cpu_at_call(read: bool) -> bool:
    """Sets whether CPU tensors are read at the call, here and in the native
    store that compiled graphs run; returns the previous setting."""
    global _read_cpu_at_call
    previous = _read_cpu_at_call
    _read_cpu_at_call = read
    _core._set_read_cpu_at_call(read)
    return previous


def _read_at_call(values: Any) -> bool:
    return bool(values.is_cpu) and _read_cpu_at_call


def _record(live_id: int, values: Any) -> None:
    """Records the checked tensor ``values`` (one number, or 1-d) into the
    Stat ``live_id``."""
    if _read_at_call(values):
        # .item() and .tolist() read the values without the autograd graph.
        one = values.numel() == 1
        _core._stat_add_by_id(live_id, [values.item()] if one else values.tolist())
        return
    now = _core._stat_window_now(live_id)
    if now is None:
        return
    now_ms, window_id = now
    # Kept detached: no autograd graph stays alive.
    values = values.detach().reshape(-1)
    with _lock:
        pending = _pending.get(live_id)
        if pending is None:
            pending = _pending[live_id] = (window_id, [], [])
        pending[1].extend([now_ms] * values.numel())
        pending[2].append(values)
        if pending[0] == window_id:
            return
        # The first add of a later window: it is read with the earlier
        # window's values, in the same copy, and closes that window now, as
        # a float add would.
        del _pending[live_id]
    _read_pending(live_id, pending)


def _read_pending(live_id: int, pending: tuple[int, list[int], list[Any]]) -> None:
    """One device-to-host copy for all of a window's pending tensors."""
    torch = _torch
    _, times_ms, tensors = pending
    # float64 holds every value of every dtype a Stat reads exactly, or
    # rounded as float(int) rounds it.
    values = torch.cat([t.to(torch.float64) for t in tensors]).cpu().tolist()
    _core._stat_add_by_id(live_id, values, times_ms)


def read_pending() -> None:
    """Reads every Stat's pending device tensors (``torchmon.flush()`` and
    exit call it)."""
    leftovers = _compiled.take_leftovers()
    if leftovers is not None:
        record_staged(leftovers)
    with _lock:
        pending = list(_pending.items())
        _pending.clear()
    for live_id, values in pending:
        _read_pending(live_id, values)


def add(stat: _core.Stat, v: Any) -> None:
    """``Stat.add`` with a tensor (called by the native ``Stat.add``)."""
    if v.is_cpu and _read_cpu_at_call:
        # The common case first, checked by what .item() returns: each
        # tensor method called costs ~0.1-0.5 us, the add itself 0.1 us.
        try:
            value = v.item()  # RuntimeError for more than one element
        except RuntimeError:
            _check_values(v, "Stat.add", one_value=True)  # raises the clear error
            raise  # a tensor the checks do not know: torch's own error
        if type(value) is complex:
            _check_values(v, "Stat.add", one_value=True)  # raises the clear error
        stat.add(value)  # a Python number: the native path
        return
    _check_values(v, "Stat.add", one_value=True)
    _record(stat._live_id, v)


def add_many(stat: _core.Stat, values: Any) -> None:
    """``Stat.add_many`` with a tensor (called by the native ``Stat.add_many``)."""
    _check_values(values, "Stat.add_many", one_value=False)
    if _read_at_call(values):
        stat.add_many(values.tolist())
    else:
        _record(stat._live_id, values)


def _torch_version(torch: ModuleType) -> tuple[int, int]:
    major, minor = str(torch.__version__).split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def _install_eager(torch: ModuleType) -> None:
    global _torch
    _torch = torch
    # Its pending values are read at exit by torchmon._lifecycle.
    _core._install_tensor_support(torch.Tensor, add, add_many)


def record_staged(staged: Staged) -> None:
    """Records what one run of a compiled graph staged (``_compiled``): its
    checked, detached tensors, in call order, as eager adds at this moment."""
    deferred = _core._record_cpu_tensors(staged) if _read_cpu_at_call else staged
    if not deferred:
        return
    # Copied, in one kernel, before being kept: a graph replayed as a CUDA
    # graph overwrites its outputs at the next run.
    torch = _torch
    copied = torch.cat([entry[1][: sum(length for _, length in entry[0])] for entry in deferred])
    start = 0
    for entry in deferred:
        for live_id, length in entry[0]:
            _record(live_id, copied[start : start + length])
            start += length


def _install_compile(torch: ModuleType) -> None:
    """Makes ``stat.add(t)`` / ``stat.add_many(t)`` traceable by dynamo."""
    global _compile_support_installed
    if _compile_support_installed:
        return
    if _torch_version(torch) < MIN_TORCH_FOR_COMPILE:
        import warnings

        warnings.warn(
            f"torchmon: recording tensors inside torch.compile needs torch >= "
            f"{MIN_TORCH_FOR_COMPILE[0]}.{MIN_TORCH_FOR_COMPILE[1]}, this is "
            f"{torch.__version__}: Stat.add in a compiled function breaks the graph",
            RuntimeWarning,
            stacklevel=2,
        )
        return
    _compile_support_installed = True
    # The replayed store runs inside the compiled call, where dynamo's frame
    # hook is still set: without this, dynamo would try to compile every
    # Python frame the recording runs (the event handlers of the windows it
    # closes, and the deferred reads here) and count graph breaks in them.
    # The native store turns the hook off around handlers; what it hands to
    # Python runs below a skipped frame (checked in C per frame, with no
    # wrapper) with the hook off, as torch._dynamo.disable turns it off, for
    # two C calls instead of disable's wrapper.
    from torch._C._dynamo.eval_frame import set_eval_frame
    from torch._dynamo.decorators import skip as skip_frames_of

    def record_staged_outside_dynamo(staged: Staged) -> None:
        prior = set_eval_frame(None)
        try:
            record_staged(staged)
        finally:
            set_eval_frame(prior)

    skip_frames_of(record_staged_outside_dynamo)
    _core._install_staging_store(
        _compiled, ModuleType.__setattr__, set_eval_frame, record_staged_outside_dynamo
    )
    # A builtin found on the type is called with (name, value): no Python
    # frame runs for the replayed store (docs/internals.md, "Tensors in
    # compiled graphs").
    _compiled._StagingModule.__setattr__ = _core._staging_store  # type: ignore[assignment]
    stage = _compiled.stage
    is_compiling = torch.compiler.is_compiling
    original_add = _core.Stat.add
    original_add_many = _core.Stat.add_many
    float64 = torch.float64

    def stage_leaving_the_graph(live_id: int, values: Any) -> None:
        # Detached: the graph's outputs keep no autograd graph alive.
        # float64 and 1-d in the graph, where it is free, for a staging
        # buffer. (With dynamic shapes the length is a symbolic int: dynamo
        # guards on what stage compares it with, and replays its value.)
        values = values.detach().reshape(-1).to(float64)
        stage(live_id, values, values.shape[0])

    buffer_size = _compiled.BUFFER_SIZE
    zeros = torch.zeros
    slice_scatter = torch.slice_scatter

    def write(buffer: Any, values: Any, start: int) -> Any:
        if buffer is None:
            buffer = zeros(buffer_size, dtype=float64, device=values.device)
        return slice_scatter(buffer, values, 0, start, start + values.shape[0])

    _compiled._write = write

    @torch.compiler.substitute_in_graph(original_add, skip_signature_check=True)  # type: ignore[untyped-decorator]
    def traceable_add(self: _core.Stat, v: Any) -> None:
        if not is_compiling():  # dynamo only calls a stand-in while tracing
            original_add(self, v)
        elif isinstance(v, torch.Tensor):
            _check_values(v, "Stat.add", one_value=True)
            stage_leaving_the_graph(self._live_id, v)
        else:
            # A number computed in the graph: left to the native method.
            torch._dynamo.graph_break()
            original_add(self, v)

    @torch.compiler.substitute_in_graph(original_add_many, skip_signature_check=True)  # type: ignore[untyped-decorator]
    def traceable_add_many(self: _core.Stat, values: Any) -> None:
        if not is_compiling():
            original_add_many(self, values)
        elif isinstance(values, torch.Tensor):
            _check_values(values, "Stat.add_many", one_value=False)
            stage_leaving_the_graph(self._live_id, values)
        else:
            torch._dynamo.graph_break()
            original_add_many(self, values)


class _AfterImport:
    """A meta path finder that runs ``then(module)`` once ``name`` finished
    importing, then leaves ``sys.meta_path``.

    It stays until the module really executes: ``importlib.util.find_spec``
    (which frameworks call to see whether torch is installed, before
    importing it) also asks the finders, and the spec it gets is never
    executed, so a finder that left at the first question missed the import
    that followed."""

    def __init__(self, name: str, then: Any) -> None:
        self.name = name
        self.then = then
        self.done = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.name or self.done:
            return None
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            if finder is self or find_spec is None:
                continue
            spec = find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_then(module: ModuleType) -> None:
            exec_module(module)
            if not self.done:
                self.done = True
                self._remove()
                _run_hook(self.then, module)

        loader.exec_module = exec_then
        return spec

    def _remove(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


def _run_hook(then: Any, module: ModuleType) -> None:
    # A failure here must not fail the user's `import torch`.
    try:
        then(module)
    except Exception as exc:  # pragma: no cover - reported, not raised
        import warnings

        warnings.warn(
            f"torchmon: could not install its torch support: {exc!r}",
            RuntimeWarning,
            stacklevel=2,
        )


def _when_imported(name: str, then: Any) -> None:
    module = sys.modules.get(name)
    if module is not None:
        _run_hook(then, module)
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


def _on_torch(torch: ModuleType) -> None:
    _install_eager(torch)
    _when_imported("torch._dynamo", lambda _: _install_compile(torch))


def install_when_imported() -> None:
    """Called by ``import torchmon``."""
    _when_imported("torch", _on_torch)
