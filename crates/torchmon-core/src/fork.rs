//! What a forked child must not inherit: the parent's open windows.
//!
//! A child made by `fork()` starts with a copy of the parent's memory, so
//! every Stat's open window still holds the parent's samples; a child that
//! emitted them would log them a second time (docs/reliability.md, "fork").
//! Every core `Stat` is tracked here from its creation (`Stat::new`), however
//! and by whomever it is created, and `after_fork_in_child` empties the open
//! window of each one that is still alive. Other per-process state that a
//! child must not re-send (cumulative totals, buffers kept in Rust) hooks in
//! with `on_fork_in_child`.
//!
//! The embedder calls `after_fork_in_child` in the child, on the thread that
//! forked, before any other code of the child runs (the Python package does
//! it from `os.register_at_fork(after_in_child=...)`). Tracking costs one
//! lock and a push per Stat created; `Stat::add` does not look at any of it.

use crate::stat::Stat;
use parking_lot::Mutex;
use std::sync::{Arc, Weak};

/// Weak references to every Stat created; dead ones are pruned as Stats are
/// created (amortised: when the list has doubled since the last pruning), so
/// dropping a Stat takes no lock.
struct Tracked {
    stats: Vec<Weak<Stat>>,
    prune_at: usize,
}

const FIRST_PRUNE_AT: usize = 64;

static TRACKED: Mutex<Tracked> = Mutex::new(Tracked {
    stats: Vec::new(),
    prune_at: FIRST_PRUNE_AT,
});

static CHILD_HOOKS: Mutex<Vec<fn()>> = Mutex::new(Vec::new());

pub(crate) fn track(stat: &Arc<Stat>) {
    let mut tracked = TRACKED.lock();
    if tracked.stats.len() >= tracked.prune_at {
        tracked.stats.retain(|weak| weak.strong_count() > 0);
        tracked.prune_at = (tracked.stats.len() * 2).max(FIRST_PRUNE_AT);
    }
    tracked.stats.push(Arc::downgrade(stat));
}

/// Registers `hook` to run in every forked child, after the Stats were reset,
/// in registration order. For per-process state kept outside Stats.
pub fn on_fork_in_child(hook: fn()) {
    CHILD_HOOKS.lock().push(hook);
}

/// In a forked child: empties the open window of every live Stat (see
/// `Stat::reset_after_fork`), then runs the `on_fork_in_child` hooks.
/// Returns how many Stats had samples in their open window.
///
/// Only the forking thread exists in the child. A lock that another parent
/// thread held at the fork stays held for ever; on GIL builds none can be
/// (docs/reliability.md, "fork"), and otherwise what it guards is skipped
/// rather than waited for.
pub fn after_fork_in_child() -> usize {
    let stats: Vec<Arc<Stat>> = match TRACKED.try_lock() {
        Some(tracked) => tracked.stats.iter().filter_map(Weak::upgrade).collect(),
        None => Vec::new(),
    };
    let discarded = stats.iter().filter(|stat| stat.reset_after_fork()).count();
    let hooks = CHILD_HOOKS
        .try_lock()
        .map(|h| h.clone())
        .unwrap_or_default();
    for hook in hooks {
        hook();
    }
    discarded
}

/// How many tracked Stats are alive (for tests).
pub fn live_stat_count() -> usize {
    TRACKED
        .lock()
        .stats
        .iter()
        .filter(|weak| weak.strong_count() > 0)
        .count()
}
