//! What a forked child must not inherit: the parent's open windows, and the
//! per-process state that other modules register a hook for.
//!
//! A child made by `fork()` starts with a copy of the parent's memory, so
//! every Stat's open window still holds the parent's samples; a child that
//! emitted them would log them a second time (docs/reliability.md, "fork").
//! `after_fork_in_child` empties the open window of every live Stat (the list
//! of `stat::live`), replaces the torch wait counters' delivery queue, then
//! runs the hooks registered with `on_fork_in_child` for state kept outside
//! Stats (queues, cumulative totals, buffers kept in Rust).
//!
//! The embedder calls `after_fork_in_child` in the child, on the thread that
//! forked, before any other code of the child runs (the Python package does
//! it from `os.register_at_fork(after_in_child=...)`). `Stat::add` does not
//! look at any of it.

use parking_lot::Mutex;

static CHILD_HOOKS: Mutex<Vec<fn()>> = Mutex::new(Vec::new());

/// Registers `hook` to run in every forked child, after the Stats were reset,
/// in registration order. For per-process state kept outside Stats.
pub fn on_fork_in_child(hook: fn()) {
    CHILD_HOOKS.lock().push(hook);
}

/// In a forked child: empties the open window of every live Stat (see
/// `Stat::reset_after_fork`), gives the torch wait counters a new delivery
/// queue (`wait_counter`), then runs the `on_fork_in_child` hooks.
/// Returns how many Stats had samples in their open window.
///
/// Only the forking thread exists in the child. A lock that another parent
/// thread held at the fork stays held for ever; what it guards is skipped
/// rather than waited for (docs/reliability.md, "fork").
pub fn after_fork_in_child() -> usize {
    let discarded = crate::stat::live::reset_after_fork();
    crate::wait_counter::reset_after_fork();
    let hooks = CHILD_HOOKS
        .try_lock()
        .map(|h| h.clone())
        .unwrap_or_default();
    for hook in hooks {
        hook();
    }
    discarded
}
