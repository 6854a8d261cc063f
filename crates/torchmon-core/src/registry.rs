//! The global event-handler registry, free of PyO3 (generic over the handler).
//!
//! Dispatch never holds the registry lock while a handler runs: it takes a
//! snapshot (an `Arc` of the current buffer and a length, so no allocation)
//! and iterates it. A handler may therefore log, register or unregister, and
//! another thread may register while a handler runs. Each entry has an
//! `active` flag, cleared under the lock by `unregister`, and checked by
//! dispatch right before it starts the handler: once `unregister` returned,
//! no dispatch, on any thread or snapshot, starts that handler again.
//!
//! A change costs O(1) amortized, not a copy of the list (registering or
//! unregistering N handlers was quadratic; docs/performance.md): entries live
//! in an append-only buffer shared by the snapshots taken from it. A
//! registration fills the next free slot, which no snapshot reads (each reads
//! only the slots filled before it was taken); an unregistration only clears
//! the entry's flag. When the buffer is full, or holds more unregistered
//! entries than registered ones, the registered ones move to a new buffer of
//! twice their number, so the copying is paid for by the changes since the
//! last move. Snapshots taken before keep the old buffer.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

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

/// Slots filled in order, each once, under the registry lock.
pub struct Buffer<H> {
    slots: Box<[OnceLock<Arc<Entry<H>>>]>,
}

impl<H> Buffer<H> {
    fn with_capacity(capacity: usize) -> Self {
        Buffer {
            slots: (0..capacity).map(|_| OnceLock::new()).collect(),
        }
    }
}

/// The entries registered when it was taken (and possibly unregistered
/// since: check `is_active`), in registration order.
pub struct Snapshot<H> {
    buffer: Arc<Buffer<H>>,
    len: usize,
}

impl<H> Clone for Snapshot<H> {
    fn clone(&self) -> Self {
        Snapshot {
            buffer: Arc::clone(&self.buffer),
            len: self.len,
        }
    }
}

impl<H> Snapshot<H> {
    #[inline]
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Entry<H>>> {
        // Every slot below `len` was filled before the snapshot was taken.
        self.buffer.slots[..self.len]
            .iter()
            .filter_map(OnceLock::get)
    }

    /// Whether both are the same list (the same buffer, as long).
    pub fn same_as(&self, other: &Snapshot<H>) -> bool {
        Arc::ptr_eq(&self.buffer, &other.buffer) && self.len == other.len
    }

    fn find(&self, id: u64) -> Option<&Arc<Entry<H>>> {
        // Slots are in registration order, which is increasing id order.
        let filled = &self.buffer.slots[..self.len];
        let position = filled
            .binary_search_by_key(&id, |slot| slot.get().map_or(u64::MAX, |e| e.id))
            .ok()?;
        filled[position].get()
    }
}

/// What a change replaced, to be dropped by the caller after the registry
/// lock is released (dropping it may drop the last reference to a handler).
pub type Replaced<H> = Option<Arc<Buffer<H>>>;

struct State<H> {
    current: Snapshot<H>,
    /// Entries in `current` still registered.
    live: usize,
}

impl<H> State<H> {
    /// Moves the registered entries to a new buffer with room for as many
    /// again; returns the old one.
    fn compact(&mut self) -> Arc<Buffer<H>> {
        let buffer = Buffer::with_capacity((2 * self.live).max(4));
        let mut len = 0;
        for entry in self.current.iter().filter(|e| e.is_active()) {
            let _ = buffer.slots[len].set(Arc::clone(entry));
            len += 1;
        }
        let old = std::mem::replace(
            &mut self.current,
            Snapshot {
                buffer: Arc::new(buffer),
                len,
            },
        );
        old.buffer
    }
}

pub struct Registry<H> {
    state: Mutex<Option<State<H>>>,
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
            state: Mutex::new(None),
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

    /// Adds a handler at the end of the dispatch order; returns its id,
    /// larger than every id before it, and what it replaced (drop it
    /// unlocked).
    pub fn register(&self, handler: H) -> (u64, Replaced<H>) {
        let mut state = self.state.lock();
        // Taken under the lock, so that slot order is id order (`find`).
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let state = state.get_or_insert_with(|| State {
            current: Snapshot {
                buffer: Arc::new(Buffer::with_capacity(4)),
                len: 0,
            },
            live: 0,
        });
        let mut replaced = None;
        if state.current.len == state.current.buffer.slots.len() {
            replaced = Some(state.compact());
        }
        let entry = Arc::new(Entry {
            id,
            handler,
            active: AtomicBool::new(true),
        });
        let current = &mut state.current;
        // The slot at `len` is empty: slots are filled in order, only here,
        // and `len` only grows until `compact` replaces the buffer.
        let _ = current.buffer.slots[current.len].set(entry);
        current.len += 1;
        state.live += 1;
        self.len.store(state.live, Ordering::Release);
        (id, replaced)
    }

    /// Unregisters the handler with this id; unknown or unregistered ids are
    /// a no-op. Returns its entry if it was registered, and what the change
    /// replaced (drop both unlocked).
    pub fn unregister(&self, id: u64) -> (Option<Arc<Entry<H>>>, Replaced<H>) {
        let mut guard = self.state.lock();
        let Some(state) = guard.as_mut() else {
            return (None, None);
        };
        let Some(entry) = state.current.find(id).filter(|e| e.is_active()).cloned() else {
            return (None, None);
        };
        entry.active.store(false, Ordering::Release);
        state.live -= 1;
        self.len.store(state.live, Ordering::Release);
        let replaced = if state.live == 0 {
            guard.take().map(|state| state.current.buffer)
        } else if state.current.len - state.live > state.live {
            Some(state.compact())
        } else {
            None
        };
        (Some(entry), replaced)
    }

    /// The handlers registered now, in registration order (`None`: none).
    #[inline]
    pub fn snapshot(&self) -> Option<Snapshot<H>> {
        if self.is_empty() {
            return None;
        }
        self.state
            .lock()
            .as_ref()
            .map(|state| state.current.clone())
    }

    /// `make` of the handlers registered now (`None`: there are none), made
    /// again should the list change while `make` runs, so that what it
    /// returns matches the list as it is on return. The binding publishes
    /// the list as one object this way: making it may run code that
    /// registers or unregisters a handler (a garbage collection's
    /// finalizers, or a switch to another thread).
    pub fn build_current<T, E>(
        &self,
        mut make: impl FnMut(&Snapshot<H>) -> Result<T, E>,
    ) -> Result<Option<T>, E> {
        loop {
            let snapshot = self.snapshot();
            let built = snapshot.as_ref().map(&mut make).transpose()?;
            let unchanged = match (&snapshot, self.snapshot()) {
                (None, None) => true,
                (Some(then), Some(now)) => then.same_as(&now),
                _ => false,
            };
            if unchanged {
                return Ok(built);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids<H>(r: &Registry<H>) -> Vec<u64> {
        r.snapshot()
            .map(|s| s.iter().filter(|e| e.is_active()).map(|e| e.id).collect())
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
        assert_eq!(r.unregister(b).0.map(|e| e.id), Some(b));
        assert!(r.unregister(b).0.is_none(), "double unregister is a no-op");
        assert!(r.unregister(999).0.is_none());
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
            snapshot.iter().count(),
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

    #[test]
    fn build_current_makes_again_after_a_change_while_making() {
        let r = Registry::new();
        assert_eq!(r.build_current(|_| Ok::<_, ()>(0)), Ok(None));
        let (a, _) = r.register(10);
        let mut calls = 0;
        let built = r.build_current(|snapshot| {
            calls += 1;
            if calls == 1 {
                r.register(20); // as a finalizer run by the allocation would
            }
            Ok::<_, ()>(snapshot.iter().map(|e| e.handler).collect::<Vec<_>>())
        });
        assert_eq!(built, Ok(Some(vec![10, 20])));
        assert_eq!(calls, 2);
        r.unregister(a);
        let (_, _) = r.unregister(a + 1);
        let built = r.build_current(|_| Ok::<_, ()>(()));
        assert_eq!(built, Ok(None), "emptied: nothing to make");
        r.register(30);
        assert_eq!(
            r.build_current(|_| Err::<(), _>("no memory")),
            Err("no memory")
        );
    }

    /// Against a plain list: random registrations and unregistrations, with
    /// snapshots kept across buffer moves, which must still list exactly the
    /// entries registered when they were taken.
    #[test]
    fn matches_a_list_model_across_buffer_moves() {
        let r = Registry::new();
        let mut model: Vec<u64> = Vec::new();
        let mut kept: Vec<(Snapshot<u64>, Vec<u64>)> = Vec::new();
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut moves = 0;
        for step in 0..20_000u64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            // Phases of growth and of shrinking, so both kinds of move happen.
            let grow = (step / 2_000) % 2 == 0;
            let replaced = if model.is_empty() || seed.is_multiple_of(3) != grow {
                let (id, replaced) = r.register(step);
                assert!(model.last().is_none_or(|&last| id > last));
                model.push(id);
                replaced
            } else {
                let id = model.remove((seed as usize / 3) % model.len());
                let (entry, replaced) = r.unregister(id);
                assert_eq!(entry.map(|e| e.id), Some(id));
                replaced
            };
            moves += usize::from(replaced.is_some());
            assert_eq!(ids(&r), model);
            assert_eq!(r.len(), model.len());
            if step.is_multiple_of(997)
                && let Some(snapshot) = r.snapshot()
            {
                kept.push((snapshot, model.clone()));
            }
        }
        assert!(moves > 10, "the buffer moved {moves} times");
        for (snapshot, then) in kept {
            let listed: Vec<u64> = snapshot.iter().map(|e| e.id).collect();
            assert!(then.iter().all(|id| listed.contains(id)));
            assert!(listed.windows(2).all(|w| w[0] < w[1]));
        }
    }

    /// The copying a move does is paid for by the changes before it: at
    /// most a few entry copies per change, whatever the number registered.
    #[test]
    fn copying_is_amortized_constant() {
        let r = Registry::new();
        let mut copied = 0;
        let mut changes = 0;
        let ids: Vec<u64> = (0..100_000)
            .map(|i| {
                let (id, replaced) = r.register(i);
                copied += replaced.map_or(0, |b| b.slots.len());
                changes += 1;
                id
            })
            .collect();
        for id in ids {
            let (_, replaced) = r.unregister(id);
            copied += replaced.map_or(0, |b| b.slots.len());
            changes += 1;
        }
        assert!(
            copied <= 4 * changes,
            "{copied} copies for {changes} changes"
        );
    }
}
