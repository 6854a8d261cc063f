"""The names other modules import from here, all native: ``Distribution``
(src/py_distribution.rs) over the core's histogram, whose rules live in
crates/torchmon-core/src/histogram/ (docs/api.md, "Distribution").
Imported on first use, never by ``import torchmon``."""

from __future__ import annotations

from ._core import _BUCKET_MIDPOINTS as BUCKET_MIDPOINTS
from ._core import Distribution, _unpickle_distribution

__all__ = ["BUCKET_MIDPOINTS", "Distribution"]


# The pickles written before the type was native (and since, under the
# name the binding gives it) call this with the fields in the core's order.
_restore = _unpickle_distribution
