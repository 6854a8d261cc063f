"""Locks that a forked child can use even if a parent thread held them at the fork.

A thread that holds a ``threading.Lock`` when another thread calls ``os.fork()``
does not exist in the child, so the child's copy of the lock stays held for
ever: the first handler call that takes it hangs the child. (The JSON lines
handler holds its lock across ``write``, which releases the GIL, so a fork
from another thread finds it held most of the time.) Every lock made by
:func:`new_lock` is made new and unlocked in the child right after the fork;
the state it protects is as the parent thread left it at that instant (for
the sinks here: at most one record half written or a counter one behind).
"""

from __future__ import annotations

import threading
import weakref

__all__ = ["new_lock"]

_locks: weakref.WeakSet[threading.Lock] = weakref.WeakSet()


def new_lock() -> threading.Lock:
    """A ``threading.Lock`` that is released in a forked child."""
    lock = threading.Lock()
    _locks.add(lock)
    return lock


def _release_in_child() -> None:  # the first step in a forked child (torchmon/_lifecycle.py)
    # Only the forking thread exists here, so nobody else can hold or take
    # these locks meanwhile. Each is made new and unlocked rather than
    # released when locked(): a parent thread that had taken a lock inside
    # acquire() and was waiting for the GIL to return when the fork happened
    # left it taken but not yet flagged, so locked() said False and the
    # child's first acquire() waited for ever (1 child in about 1,500 with a
    # JSON lines sink: docs/reliability.md, "fork"). _at_fork_reinit is what
    # threading and logging reset their own locks with in a child.
    for lock in list(_locks):
        lock._at_fork_reinit()  # type: ignore[attr-defined]
