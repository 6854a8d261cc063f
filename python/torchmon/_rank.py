"""Which rank of a distributed job this process is, from torchrun's environment.

The sinks use it for default labels (``PrometheusEventHandler.serve``) and
per-rank file names (``JsonlEventHandler.for_rank``); see docs/api.md
("`rank_info` and the per-rank sinks") and docs/guide.md ("Multi-node setups").

``import torchmon`` loads this module when ``rank_info`` is first used, and
it imports only ``os`` and ``_errors`` (``socket`` when called): docs/performance.md,
"`import torchmon`".
"""

from __future__ import annotations

import os

from ._errors import arg_type_error, arg_value_error

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["RankInfo", "rank_info"]

_FIELDS = (
    "rank",
    "local_rank",
    "world_size",
    "local_world_size",
    "group_rank",
    "run_id",
    "host",
)


class RankInfo:
    """This process's place in a torchrun job; immutable, hashable, picklable.

    - ``rank`` (``RANK``), ``local_rank`` (``LOCAL_RANK``), ``world_size``
      (``WORLD_SIZE``), ``local_world_size`` (``LOCAL_WORLD_SIZE``),
      ``group_rank`` (``GROUP_RANK``: the node's index in the job): ``int``.
    - ``run_id``: ``TORCHELASTIC_RUN_ID`` (``str``), ``None`` outside torchrun.
    - ``host``: the host name (``socket.gethostname()``).
    """

    __slots__ = _FIELDS

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    group_rank: int
    run_id: str | None
    host: str

    def __init__(
        self,
        *,
        rank: int = 0,
        local_rank: int = 0,
        world_size: int = 1,
        local_world_size: int = 1,
        group_rank: int = 0,
        run_id: str | None = None,
        host: str = "",
    ) -> None:
        ints = {
            "rank": rank,
            "local_rank": local_rank,
            "world_size": world_size,
            "local_world_size": local_world_size,
            "group_rank": group_rank,
        }
        for name, number in ints.items():
            if isinstance(number, bool) or not isinstance(number, int):
                raise arg_type_error("RankInfo", name, "an int", number)
        if run_id is not None and not isinstance(run_id, str):
            raise arg_type_error("RankInfo", "run_id", "a str or None", run_id)
        if not isinstance(host, str):
            raise arg_type_error("RankInfo", "host", "a str", host)
        contradiction = _rank_contradiction(ints, {name: name for name in ints})
        if contradiction is not None:
            field, problem = contradiction
            raise arg_value_error("RankInfo", field, f"{problem}, got {ints[field]}")
        for name, value in (*ints.items(), ("run_id", run_id), ("host", host)):
            object.__setattr__(self, name, value)

    @property
    def node(self) -> int:
        """The node's index in the job (``group_rank``)."""
        return self.group_rank

    def labels(self) -> dict[str, str]:
        """Constant labels for the sinks: ``rank``, ``local_rank``, ``node``
        (``group_rank``) and ``job`` (``run_id``, ``""`` outside torchrun),
        all ``str``; a new dict each call."""
        return {
            "rank": str(self.rank),
            "local_rank": str(self.local_rank),
            "node": str(self.group_rank),
            "job": self.run_id if self.run_id is not None else "",
        }

    def format(self, template: str) -> str:
        """``template.format(...)`` with this record's fields and ``node``:
        ``rank_info().format("events-rank{rank}.jsonl")``."""
        if not isinstance(template, str):
            raise arg_type_error("RankInfo.format", "template", "a str", template)
        fields = {name: getattr(self, name) for name in _FIELDS}
        fields["node"] = self.group_rank
        try:
            return template.format(**fields)
        except (KeyError, IndexError) as exc:
            raise arg_value_error(
                "RankInfo.format",
                "template",
                f"{template!r} names {exc}, which is not one of {', '.join((*_FIELDS, 'node'))}",
            ) from None

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in _FIELDS)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"RankInfo is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"RankInfo is immutable: cannot delete {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RankInfo):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __reduce__(self) -> tuple[object, ...]:
        return (_restore, self._values())

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in _FIELDS)
        return f"RankInfo({inner})"


def _restore(*values: object) -> RankInfo:
    return RankInfo(**dict(zip(_FIELDS, values)))  # type: ignore[arg-type]


def _rank_contradiction(
    values: Mapping[str, int], names: Mapping[str, str]
) -> tuple[str, str] | None:
    """``(field, "must be < world_size=2")`` for the first field that
    contradicts the others, None when they agree; ``names`` maps each field
    to what the message calls it (a variable or an argument)."""

    def shown(field: str) -> str:
        return f"{names[field]}={values[field]}"

    for field in ("world_size", "local_world_size"):
        if values[field] < 1:
            return field, "must be >= 1"
    for field in ("rank", "local_rank", "group_rank"):
        if values[field] < 0:
            return field, "must be >= 0"
    for field, size in (("rank", "world_size"), ("local_rank", "local_world_size")):
        if values[field] >= values[size]:
            return field, f"must be < {shown(size)}"
    if values["local_world_size"] > values["world_size"]:
        return "local_world_size", f"must be <= {shown('world_size')}"
    return None


# The variable torchrun sets for each field, and the value outside torchrun.
_ENV = {
    "rank": ("RANK", 0),
    "local_rank": ("LOCAL_RANK", 0),
    "world_size": ("WORLD_SIZE", 1),
    "local_world_size": ("LOCAL_WORLD_SIZE", 1),
    "group_rank": ("GROUP_RANK", 0),
}


def _env_int(environ: Mapping[str, str], variable: str, default: int) -> int:
    text = environ.get(variable)
    if text is None:
        return default
    if not isinstance(text, str):
        raise TypeError(
            f"rank_info: environment variable {variable} must be a str, not {type(text).__name__}"
        )
    stripped = text.strip()
    # int() also takes "+1", "1_000" and non-ASCII digits: a launcher writes
    # plain decimal, so anything else is a mistake worth naming.
    if not (stripped.isascii() and stripped.isdigit()):
        raise ValueError(
            f"rank_info: environment variable {variable}={text!r} is not a non-negative integer"
        )
    return int(stripped)


def rank_info(environ: Mapping[str, str] | None = None) -> RankInfo:
    """This process's rank, from torchrun's environment variables (``RANK``,
    ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
    ``TORCHELASTIC_RUN_ID``) and the host name.

    A variable that is not set takes its single-process value (rank 0 of a
    world of 1, node 0, no run id; ``LOCAL_WORLD_SIZE`` defaults to
    ``WORLD_SIZE``), so outside torchrun this describes one process. A value
    that is not a non-negative decimal integer, or ranks that contradict each
    other (``RANK`` >= ``WORLD_SIZE``), raise ``ValueError`` naming the
    variable. ``environ`` (default ``os.environ``) is read anew on
    every call.
    """
    if environ is None:
        environ = os.environ
    values = {
        field: _env_int(environ, variable, default) for field, (variable, default) in _ENV.items()
    }
    if "LOCAL_WORLD_SIZE" not in environ:
        # Launchers other than torchrun may set LOCAL_RANK alone: assume one node.
        values["local_world_size"] = values["world_size"]
    names = {field: variable for field, (variable, _) in _ENV.items()}
    contradiction = _rank_contradiction(values, names)
    if contradiction is not None:
        field, problem = contradiction
        raise ValueError(
            f"rank_info: environment variable {names[field]}={values[field]} {problem}"
        )
    run_id = environ.get("TORCHELASTIC_RUN_ID")
    if run_id is not None and not isinstance(run_id, str):
        raise TypeError(
            "rank_info: environment variable TORCHELASTIC_RUN_ID must be a str, "
            f"not {type(run_id).__name__}"
        )
    import socket

    return RankInfo(**values, run_id=run_id, host=socket.gethostname())
