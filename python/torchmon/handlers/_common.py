"""What the gauge sinks (Prometheus, OpenTelemetry) and the file sinks share:
importing an optional library with a message that says how to install it,
checking a mapping of constant labels, naming a Stat key's gauge, setting one
gauge per numeric data value, and closing in a ``with`` block.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Callable, TypeVar

from .. import _lifecycle
from .._errors import arg_message, arg_type_error

__all__ = [
    "ClosesOnExit",
    "check_mapping",
    "require",
    "set_numeric_values",
    "stat_description",
]

_T = TypeVar("_T")
_Self = TypeVar("_Self", bound="ClosesOnExit")


def require(owner: str, module: str, *, library: str, pip_name: str, extra: str) -> None:
    """Imports ``module`` (an optional dependency of ``owner``), or raises an
    ImportError naming the ``pip install`` that provides it (docs/sinks.md)."""
    try:
        __import__(module)
    except ImportError as exc:
        raise ImportError(
            f"{owner} needs {library}, which cannot be imported "
            f"({exc}): pip install {pip_name} (in a torchmon checkout: "
            f"pip install '.[{extra}]')"
        ) from exc


def check_mapping(
    mapping: object,
    call: str,
    arg: str,
    *,
    expected: str,
    key_noun: str,
    check_key: Callable[[str], None],
    value_types: tuple[type, ...],
    value_text: str,
) -> dict[str, Any]:
    """``mapping`` (a handler's constant labels or attributes) as a new dict,
    after checking that it is a mapping (``expected`` says of what), that its
    keys are ``str`` and pass ``check_key``, and that its values are instances
    of ``value_types`` (named ``value_text``); ``None`` is an empty dict.
    Errors name ``call`` and ``arg`` in the one format (``_errors.py``)."""
    if mapping is None:
        return {}
    if not isinstance(mapping, Mapping):
        raise arg_type_error(call, arg, f"a mapping of {expected}", mapping)
    checked: dict[str, Any] = {}
    for key, value in mapping.items():
        if not isinstance(key, str):
            raise TypeError(arg_message(call, arg, f"must have str {key_noun}, not {key!r}"))
        check_key(key)
        if not isinstance(value, value_types):
            raise TypeError(
                arg_message(
                    call, arg, f"must map {key!r} to {value_text}, not {type(value).__name__}"
                )
            )
        checked[key] = value
    return checked


def stat_description(key: str) -> str:
    """The help text of the gauge of a Stat data key ``"<stat>.<aggregation>"``."""
    stat, _, aggregation = key.rpartition(".")
    if stat:
        return f"torchmon Stat {stat!r}, {aggregation} over the last closed window"
    return f"torchmon Stat value {key!r}"


def shortened(name: str, key: str, limit: int, *, tagged: bool = False) -> str:
    """``name``, a sink's name of Stat key ``key``, within ``limit``
    characters: a longer one keeps its last ``.<suffix>`` (the aggregation:
    ``.mean``, ``.p99``) and the start of the rest, joined by ``-`` and 8 hex
    digits of the key's SHA-256, so that every key keeps a name of its own.
    ``tagged``: those digits go in whatever the length (a renamed key: two
    keys renamed alike stay distinct)."""
    if len(name) <= limit and not tagged:
        return name
    import hashlib  # only here: `import torchmon` stays fast (docs/performance.md)

    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    stem, dot, suffix = name.rpartition(".")
    if not dot or len(suffix) > 16:
        stem, suffix = name, ""
    tail = f"-{digest}" + (f".{suffix}" if suffix else "")
    return stem[: limit - len(tail)] + tail


def set_numeric_values(
    data: Mapping[str, object],
    gauge_of: Callable[[str], _T],
    set_value: Callable[[_T, float], object],
    *,
    finite_only: bool = False,
) -> None:
    """Sets ``gauge_of(key)`` to each ``int``/``float`` value of ``data``
    (``bool`` and ``str`` values are skipped, and so are NaN and the
    infinities when ``finite_only``). A key whose gauge cannot be had
    (``gauge_of`` raised ValueError) does not stop the others: the first such
    error is raised once every other value is set."""
    first_error: ValueError | None = None
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if finite_only and isinstance(value, float) and not math.isfinite(value):
            continue
        try:
            gauge = gauge_of(key)
        except ValueError as exc:
            first_error = first_error or exc
            continue
        set_value(gauge, value)
    if first_error is not None:
        raise first_error


class ClosesOnExit:
    """``with handler:`` calls ``handler.close()`` on leaving the block."""

    __slots__ = ()

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class ClosesAtExit(ClosesOnExit):
    """A sink whose ``_close(at_exit=True)`` is an exit step of
    torchmon/_lifecycle.py (``close_at_exit``), run while the sink is alive
    (held weakly): the ones that deliver remotely, and end what they started."""

    __slots__ = ("_at_exit", "_closed")
    _at_exit: Callable[[], None] | None
    _closed: bool

    def _close(self, *, at_exit: bool) -> None:
        raise NotImplementedError

    def _close_at_exit(self) -> None:
        """Registers the exit step (again: it then runs before the exit
        hooks registered since)."""
        if self._at_exit is not None:
            _lifecycle.cancel_at_exit(self._at_exit)
        ref = weakref.ref(self)

        def close() -> None:
            alive = ref()
            if alive is not None:
                alive._close(at_exit=True)

        self._at_exit = _lifecycle.close_at_exit(close)

    def _begin_close(self) -> bool:
        """Marks the sink closed and takes its exit step back; False when it
        was closed already."""
        if self._closed:
            return False
        self._closed = True
        if self._at_exit is not None:
            _lifecycle.cancel_at_exit(self._at_exit)
            self._at_exit = None
        return True
