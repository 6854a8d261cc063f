//! The global event-handler registry, free of PyO3 (generic over the handler).
//!
//! Dispatch never holds the registry lock while a handler runs: it takes a
//! snapshot (an `Arc` of the current handler list, so no allocation) and
//! iterates it. A handler may therefore log, register or unregister, and
//! another thread may register while a handler runs. Each entry has an
//! `active` flag, cleared under the lock by `unregister`, and checked by
//! dispatch right before it starts the handler: once `unregister` returned,
//! no dispatch, on any thread or snapshot, starts that handler again.

use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

pub struct Entry<H> {
    pub id: u64,
    pub handler: H,
    active: AtomicBool,
}

impl<H> Entry<H> {
    #[inline]
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }
}

pub type Snapshot<H> = Arc<[Arc<Entry<H>>]>;

pub struct Registry<H> {
    entries: Mutex<Option<Snapshot<H>>>,
    /// Registered handlers, read without the lock so that logging with no
    /// handler costs one load.
    len: AtomicUsize,
    next_id: AtomicU64,
}

impl<H> Default for Registry<H> {
    fn default() -> Self {
        Self::new()
    }
}

impl<H> Registry<H> {
    pub const fn new() -> Self {
        Registry {
            entries: Mutex::new(None),
            len: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
        }
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
    }

    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// Adds a handler at the end of the dispatch order; returns its id.
    /// The replaced list is returned to the caller so that it is dropped
    /// (and with it, possibly, the last reference to a handler) after the
    /// lock is released.
    pub fn register(&self, handler: H) -> (u64, Option<Snapshot<H>>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let entry = Arc::new(Entry {
            id,
            handler,
            active: AtomicBool::new(true),
        });
        let mut entries = self.entries.lock();
        let old = entries.take();
        let mut list: Vec<Arc<Entry<H>>> = old.as_deref().unwrap_or(&[]).to_vec();
        list.push(entry);
        self.len.store(list.len(), Ordering::Release);
        *entries = Some(list.into());
        (id, old)
    }

    /// Removes the handler with this id; unknown ids are a no-op. Returns
    /// whether it was registered, and the replaced list (drop it unlocked).
    pub fn unregister(&self, id: u64) -> (bool, Option<Snapshot<H>>) {
        let mut entries = self.entries.lock();
        let Some(current) = entries.as_ref() else {
            return (false, None);
        };
        let Some(position) = current.iter().position(|e| e.id == id) else {
            return (false, None);
        };
        current[position].active.store(false, Ordering::Release);
        let remaining: Vec<Arc<Entry<H>>> =
            current.iter().filter(|e| e.id != id).cloned().collect();
        self.len.store(remaining.len(), Ordering::Release);
        let replacement = (!remaining.is_empty()).then(|| remaining.into());
        let old = std::mem::replace(&mut *entries, replacement);
        (true, old)
    }

    /// The handlers registered now, in registration order.
    #[inline]
    pub fn snapshot(&self) -> Option<Snapshot<H>> {
        if self.is_empty() {
            return None;
        }
        self.entries.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids<H>(r: &Registry<H>) -> Vec<u64> {
        r.snapshot()
            .map(|s| s.iter().map(|e| e.id).collect())
            .unwrap_or_default()
    }

    #[test]
    fn order_duplicates_and_unregister() {
        let r = Registry::new();
        assert!(r.snapshot().is_none());
        let (a, _) = r.register("a");
        let (b, _) = r.register("a");
        let (c, _) = r.register("c");
        assert_eq!(ids(&r), [a, b, c]);
        assert!(r.unregister(b).0);
        assert!(!r.unregister(b).0, "double unregister is a no-op");
        assert!(!r.unregister(999).0);
        assert_eq!(ids(&r), [a, c]);
        assert_eq!(r.len(), 2);
    }

    #[test]
    fn a_snapshot_sees_unregister_through_the_active_flag() {
        let r = Registry::new();
        let (a, _) = r.register(1);
        let (b, _) = r.register(2);
        let snapshot = r.snapshot().unwrap();
        r.unregister(b);
        let runnable: Vec<u64> = snapshot
            .iter()
            .filter(|e| e.is_active())
            .map(|e| e.id)
            .collect();
        assert_eq!(runnable, [a]);
        r.register(3);
        assert_eq!(
            snapshot.len(),
            2,
            "snapshots do not see later registrations"
        );
    }

    #[test]
    fn empty_after_last_unregister() {
        let r = Registry::new();
        let (a, _) = r.register(());
        r.unregister(a);
        assert!(r.is_empty());
        assert!(r.snapshot().is_none());
    }
}
