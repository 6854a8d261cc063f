//! `ForkSafeMutex`: a process-wide lock that a forked child replaces
//! instead of waiting for.
//!
//! A child made by `fork()` has only the thread that forked. A lock that a
//! torchmon thread of the parent held at the fork (the watchdog's thread
//! while it dumps, the Prometheus server's thread while it renders) stays
//! held for ever in the child's copy, and the child's first `lock()` would
//! hang. A `ForkSafeMutex` is a pointer to a leaked `parking_lot::Mutex`:
//! `fork::after_fork_in_child` points each one at a new, unlocked mutex,
//! carrying over what the old one guarded (the caller says how), and never
//! touches the old lock again (an unlock could wake parked threads, whose
//! bookkeeping the parent's threads may also have held at the fork).

use std::sync::atomic::{AtomicPtr, Ordering};

use parking_lot::{Mutex, MutexGuard};

pub struct ForkSafeMutex<T: 'static> {
    current: AtomicPtr<Mutex<T>>,
    initial: fn() -> T,
}

impl<T: Send + 'static> ForkSafeMutex<T> {
    /// A lock whose value is made by `initial` on first use.
    pub const fn new(initial: fn() -> T) -> Self {
        ForkSafeMutex {
            current: AtomicPtr::new(std::ptr::null_mut()),
            initial,
        }
    }

    fn mutex(&self) -> &'static Mutex<T> {
        let existing = self.current.load(Ordering::Acquire);
        // SAFETY: a non-null value is only ever stored from `Box::leak`
        // (here and in `replace_in_child`), never freed: it lives for the
        // rest of the process.
        if let Some(mutex) = unsafe { existing.as_ref() } {
            return mutex;
        }
        let fresh: *mut Mutex<T> = Box::leak(Box::new(Mutex::new((self.initial)())));
        match self.current.compare_exchange(
            std::ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            // SAFETY: just leaked, and now published: lives for ever.
            Ok(_) => unsafe { &*fresh },
            Err(winner) => {
                // SAFETY: `fresh` lost the race, so it was never published
                // and is still only ours to free; `winner` came from
                // `Box::leak`.
                unsafe {
                    drop(Box::from_raw(fresh));
                    &*winner
                }
            }
        }
    }

    pub fn lock(&self) -> MutexGuard<'static, T> {
        self.mutex().lock()
    }

    pub fn try_lock(&self) -> Option<MutexGuard<'static, T>> {
        self.mutex().try_lock()
    }

    /// In a forked child: a new, unlocked mutex holding `carry(old)`, where
    /// `old` is the value the parent left (`None` if the lock was never
    /// used). The old mutex is leaked as it is.
    ///
    /// # Safety
    ///
    /// Only in a forked child, on the thread that forked, before the child
    /// starts any thread, and while this thread holds no guard of this
    /// lock: then nobody else can touch the old value. `carry` reads it
    /// even if the lock was held at the fork, so every holder of this lock
    /// must leave the value whole at every instant it holds it (values
    /// replaced by one assignment, or only read), or `carry` must not read
    /// it.
    pub(crate) unsafe fn replace_in_child(&self, carry: impl FnOnce(Option<&T>) -> T) {
        let old = self.current.load(Ordering::Acquire);
        // SAFETY: `old` is null or a leaked mutex (see `mutex`), and its
        // value is read without its lock: the caller's contract makes this
        // thread the only one alive to touch it, and every holder left the
        // value whole.
        let old_value: Option<&T> = unsafe { old.as_ref().map(|mutex| &*mutex.data_ptr()) };
        let fresh: *mut Mutex<T> = Box::leak(Box::new(Mutex::new(carry(old_value))));
        self.current.store(fresh, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static HELD: ForkSafeMutex<Vec<u32>> = ForkSafeMutex::new(Vec::new);

    #[test]
    fn a_lock_held_at_the_fork_is_replaced_with_its_value_carried() {
        HELD.lock().push(7);
        // A parent thread's guard at the fork: never released.
        std::mem::forget(HELD.lock());
        // SAFETY: a forked child's step, simulated on the test's own thread:
        // no other thread uses `HELD`, and this one holds no guard.
        unsafe { HELD.replace_in_child(|old| old.cloned().unwrap_or_default()) };
        let mut fresh = HELD.try_lock().expect("a new, unlocked mutex");
        assert_eq!(*fresh, vec![7]);
        fresh.push(8);
    }
}
