//! The atomics, lock and spin wait that `stat` is built on, swapped for
//! loom's model-checked ones when its loom models run
//! (`RUSTFLAGS="--cfg loom" cargo test -p torchmon-core --lib loom_`).
//!
//! loom is a dev-dependency, so only the crate's own test build can use it:
//! hence `all(loom, test)`. Every other build gets the std atomics and
//! parking_lot's lock themselves (re-exports, not wrappers), so the normal
//! build's code is what it was before this module existed.

#[cfg(all(loom, test))]
pub(crate) use loom::sync::atomic::{AtomicI64, AtomicPtr, AtomicU64, Ordering};
#[cfg(not(all(loom, test)))]
pub(crate) use std::sync::atomic::{AtomicI64, AtomicPtr, AtomicU64, Ordering};

#[cfg(not(all(loom, test)))]
pub(crate) use parking_lot::Mutex;

/// loom's mutex behind parking_lot's signature: `lock` returns the guard
/// (loom's cannot be poisoned by the models, which never panic holding it).
#[cfg(all(loom, test))]
pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

#[cfg(all(loom, test))]
impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Mutex(loom::sync::Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
        self.0
            .lock()
            .expect("a loom model panicked holding the lock")
    }
}

/// One round of a wait for other threads: a CPU spin hint for the first 64
/// rounds, then a yield to the scheduler (a waited-for thread that was
/// preempted needs the core). Under loom every round yields, which is how
/// loom learns that this thread cannot progress until another one runs.
#[inline(always)]
pub(crate) fn spin_wait(spins: &mut u32) {
    #[cfg(not(all(loom, test)))]
    {
        *spins += 1;
        if *spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
    #[cfg(all(loom, test))]
    {
        *spins += 1;
        loom::thread::yield_now();
    }
}
