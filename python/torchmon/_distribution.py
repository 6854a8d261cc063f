"""The names other modules import from here, all native: ``Distribution``
(src/py_distribution.rs) over the core's histogram, whose rules live in
crates/torchmon-core/src/histogram/ (docs/api.md, "Distribution").
Imported on first use, never by ``import torchmon``."""

from __future__ import annotations

from ._core import _BUCKET_MIDPOINTS as BUCKET_MIDPOINTS
from ._core import Distribution

__all__ = ["BUCKET_MIDPOINTS", "Distribution"]

bucket_index = Distribution._bucket_index
representative = Distribution._representative


def _restore(scale: int, *fields: object) -> Distribution:
    """Unpickles a Distribution (its ``__reduce__``, as before it was native)."""
    return Distribution._from_core(*fields)  # type: ignore[arg-type]
