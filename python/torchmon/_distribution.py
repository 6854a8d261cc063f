"""The names other modules import from here, all native: ``Distribution``
(src/py_distribution.rs) over the core's histogram, whose rules live in
crates/torchmon-core/src/histogram/ (docs/api.md, "Distribution").
Imported on first use, never by ``import torchmon``."""

from __future__ import annotations

from ._core import _BUCKET_MIDPOINTS as BUCKET_MIDPOINTS
from ._core import Distribution

__all__ = ["BUCKET_MIDPOINTS", "Distribution"]


# The fields of a pickled Distribution, in order: its ``__reduce__`` calls
# ``_restore(*values)``, as before the type was native.
_PICKLED_FIELDS = (
    "scale",
    "count",
    "sum",
    "min",
    "max",
    "zero_count",
    "nan_count",
    "positive_inf_count",
    "negative_inf_count",
    "positive",
    "negative",
)


def _restore(*values: object) -> Distribution:
    """Unpickles a Distribution, checked as any other."""
    return Distribution(**dict(zip(_PICKLED_FIELDS, values)))  # type: ignore[arg-type]
