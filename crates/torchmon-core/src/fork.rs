//! What a forked child must not inherit: the parent's open windows and the
//! torch wait counters' delivery queue, reset in that order by one function
//! (the core's part of the ordered list of docs/internals.md, "Fork").
//!
//! A child made by `fork()` starts with a copy of the parent's memory, so
//! every Stat's open window still holds the parent's samples; a child that
//! emitted them would log them a second time (docs/reliability.md, "fork").
//! Core state that must not outlive a fork gets a step here, written out,
//! not a hook registered at run time: the order is read in one place.
//!
//! The embedder calls `after_fork_in_child` in the child, on the thread that
//! forked, before any other code of the child runs (the Python package does
//! it from `torchmon/_lifecycle.py`). `Stat::add` does not look at any of it.

/// In a forked child: empties the open window of every live Stat (see
/// `Stat::reset_after_fork`), then gives the torch wait counters a new
/// delivery queue (`wait_counter`), then replaces the watchdog's
/// process-wide locks (`watchdog::reset_after_fork`). Returns how many Stats had samples in
/// their open window.
///
/// Only the forking thread exists in the child. A lock that another parent
/// thread held at the fork stays held for ever; what it guards is skipped
/// rather than waited for (docs/reliability.md, "fork").
pub fn after_fork_in_child() -> usize {
    let discarded = crate::stat::live::reset_after_fork();
    crate::wait_counter::reset_after_fork();
    crate::watchdog::reset_after_fork();
    discarded
}
