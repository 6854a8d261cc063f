"""How values recorded inside a ``torch.compile`` graph leave it: in one
graph output and one Python call per graph run, with no operator call inside
the graph (docs/internals.md, "Tensors in compiled graphs").

Dynamo cannot trace a native method, so ``Stat.add``'s traceable stand-in
(``_tensors``) calls :func:`stage`, which dynamo does trace: each call rebinds
this module's global ``_staged`` to a tuple of entries ``(segments, tensor,
on_cpu)``.
A value of a size the trace knows is written, as float64, into the last
entry's staging buffer of ``BUFFER_SIZE`` values (``torch.slice_scatter``, which
inductor fuses into a kernel the step already runs), and ``segments``, constants
of the graph, say which Stat gets how many of its values. Dynamo does not run
that Python at run time; it keeps the entries' tensors as graph outputs and,
after the graph, replays the final rebinding once, as
``torchmon._compiled._staged = (...)`` (a module attribute store, since
``stage`` is not in the compiled frame's module). The module's class has a
native ``__setattr__`` (``_core._staging_store``, installed with the compile
support) that records the entries and leaves ``_staged`` None, the value the
next trace reads (and dynamo guards on). So a step pays for its values with
one graph output, one tensor read and one native call, with no Python frame
and no dispatcher call into a Python kernel per value (docs/performance.md,
"Recording tensors").
"""

from __future__ import annotations

import sys
from types import ModuleType

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported by `import torchmon`
    from typing import Any, Callable

    # Entries (segments, tensor, whether the tensor is on the CPU), segments
    # being ((live_id, length), ...): the tensor's first values, `length` to
    # each Stat, in order. The flag is a constant of the trace, which saves
    # the recording a tensor attribute read (0.25 us right after a graph);
    # an entry without it is checked.
    Staged = tuple[tuple[Any, ...], ...]

#: The values a staging buffer holds: a graph staging more has more buffers;
#: a 1-d tensor of more stays an entry of its own. Small, since its read
#: costs about 10 ns a value, used or not, and a recorded value 50.
BUFFER_SIZE = 16

# (buffer or None, values, start) -> the buffer with `values` written from
# `start` (a new one of BUFFER_SIZE zeros for None): set by `_tensors` with
# the compile support, since this module does not import torch.
_write: Callable[[Any, Any, int], Any] | None = None
# Read by every traced `stage` call; always None outside a trace.
_staged: Staged | None = None


def stage(live_id: int, values: Any, length: int) -> None:
    """Records the checked, detached float64 1-d tensor ``values`` of
    ``length`` values into the Stat ``live_id`` once the graph being traced
    has run (dynamo traces this)."""
    global _staged
    staged = () if _staged is None else _staged
    write = _write
    on_cpu = values.device.type == "cpu"
    if length > BUFFER_SIZE or write is None:
        _staged = (*staged, (((live_id, length),), values, on_cpu))
        return
    if staged:
        segments, buffer = staged[-1][0], staged[-1][1]
        # A loop, not sum(): dynamo guards on every builtin a trace calls.
        used = 0
        for _, staged_length in segments:
            used += staged_length
        if (
            buffer.shape[0] == BUFFER_SIZE
            and used + length <= BUFFER_SIZE
            and buffer.device == values.device
        ):
            entry = ((*segments, (live_id, length)), write(buffer, values, used), on_cpu)
            _staged = (*staged[:-1], entry)
            return
    _staged = (*staged, (((live_id, length),), write(None, values, 0), on_cpu))


def take_leftovers() -> Staged | None:
    """What a store that bypassed the module's ``__setattr__`` left (none
    with the torch versions tested; a later dynamo writing the module's
    ``__dict__`` directly would): ``torchmon.flush()`` records it."""
    staged: Staged | None = globals()["_staged"]
    globals()["_staged"] = None
    return staged


class _StagingModule(ModuleType):
    """This module's class: ``_tensors._install_compile`` sets its
    ``__setattr__`` to ``_core._staging_store``."""


sys.modules[__name__].__class__ = _StagingModule
