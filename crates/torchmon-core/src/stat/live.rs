//! The process's one list of live Stats, in creation order: what the exit
//! flush and `flush()` emit, what a forked child empties, and where a Stat is
//! found by its id (compiled graphs name their Stats by id).
//!
//! Every core `Stat` is entered by `Stat::new`, however and by whomever it is
//! created (Python's `Stat`, WaitCounters, SystemStats, torch's wait
//! counters, Stats made in Rust). The list holds weak references, pruned as
//! Stats are created (amortised: when the list has doubled since the last
//! pruning), so dropping a Stat takes no lock and `Stat::add` never looks
//! here. An embedder that wraps a Stat in state of its own (a name, the
//! handlers' keys) sets it as the Stat's owner (`Stat::set_owner`) and gets it
//! back from the list (`Stat::owner`), rather than keeping a second list.

use super::Stat;
use parking_lot::Mutex;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

struct Live {
    /// In increasing id order (ids are handed out under this lock).
    stats: Vec<(u64, Weak<Stat>)>,
    prune_at: usize,
}

const FIRST_PRUNE_AT: usize = 64;

static LIVE: Mutex<Live> = Mutex::new(Live {
    stats: Vec::new(),
    prune_at: FIRST_PRUNE_AT,
});
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// Enters `stat` and returns its id. Called once, by `Stat::new`.
pub(super) fn enter(stat: Weak<Stat>) -> u64 {
    let mut live = LIVE.lock();
    if live.stats.len() >= live.prune_at {
        live.stats.retain(|(_, weak)| weak.strong_count() > 0);
        live.prune_at = (live.stats.len() * 2).max(FIRST_PRUNE_AT);
    }
    // Taken under the lock, so that the list stays in id order.
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    live.stats.push((id, stat));
    id
}

/// Every live Stat, in creation order.
pub fn all() -> Vec<Arc<Stat>> {
    LIVE.lock()
        .stats
        .iter()
        .filter_map(|(_, weak)| weak.upgrade())
        .collect()
}

/// The live Stats of `ids`, in order (None for one no longer alive), looked
/// up under one lock.
pub fn find(ids: impl Iterator<Item = u64>) -> Vec<Option<Arc<Stat>>> {
    let live = LIVE.lock();
    ids.map(|id| {
        let position = live.stats.binary_search_by_key(&id, |(id, _)| *id).ok()?;
        live.stats[position].1.upgrade()
    })
    .collect()
}

/// The live Stat `id`, if it lives.
pub fn get(id: u64) -> Option<Arc<Stat>> {
    find(std::iter::once(id)).pop().flatten()
}

/// How many Stats are alive.
pub fn count() -> usize {
    LIVE.lock()
        .stats
        .iter()
        .filter(|(_, weak)| weak.strong_count() > 0)
        .count()
}

/// In a forked child: empties the open window of every live Stat (see
/// `Stat::reset_after_fork`); returns how many had samples in it.
///
/// Only the forking thread exists in the child. The list's lock is taken
/// only while holding the GIL, except by a Stat made off it (torch's wait
/// counters): should such a thread have held it at the fork, nothing is
/// reset rather than the child hung (docs/reliability.md, "fork").
pub(crate) fn reset_after_fork() -> usize {
    let stats: Vec<Arc<Stat>> = match LIVE.try_lock() {
        Some(live) => live
            .stats
            .iter()
            .filter_map(|(_, weak)| weak.upgrade())
            .collect(),
        None => Vec::new(),
    };
    stats.iter().filter(|stat| stat.reset_after_fork()).count()
}

/// A compiled graph's segments, parsed once (the binding's `py_compiled.rs`):
/// the owners of the Stats its values go to, in order, each with how many
/// values it takes. Weak: a graph does not keep its Stats alive, and a
/// Stat's id is never reused, so a Stat that died stays dead. `Keep` is held,
/// never read: the object whose address keys the parse, kept alive so that
/// no other object takes that address.
pub struct Segments<T, Keep> {
    _keep: Keep,
    stats: Vec<(Weak<T>, usize)>,
}

impl<T, Keep> Segments<T, Keep> {
    /// `stats`: each segment's owner (None for a Stat not alive) and length.
    pub fn new(keep: Keep, stats: &[(Option<Arc<T>>, usize)]) -> Self {
        let weak = |(stat, length): &(Option<Arc<T>>, usize)| {
            (
                stat.as_ref().map_or_else(Weak::new, Arc::downgrade),
                *length,
            )
        };
        let stats = stats.iter().map(weak).collect();
        Segments { _keep: keep, stats }
    }

    /// Each segment's owner (None for one no longer alive) and length.
    pub fn upgrade(&self) -> Vec<(Option<Arc<T>>, usize)> {
        let strong = |(stat, length): &(Weak<T>, usize)| (stat.upgrade(), *length);
        self.stats.iter().map(strong).collect()
    }
}

/// The values that segments of `lengths` take, in order, from `first` on;
/// `None` when they pass `end`, the number of values staged (values past the
/// segments are the unused end of a staging buffer).
pub fn segment_ranges(
    first: usize,
    end: usize,
    lengths: impl IntoIterator<Item = usize>,
) -> Option<Vec<Range<usize>>> {
    let mut start = first;
    let mut range = |length: usize| {
        let range = start..start.checked_add(length).filter(|&e| e <= end)?;
        start = range.end;
        Some(range)
    };
    lengths.into_iter().map(&mut range).collect()
}

/// The `ValueError` message of `_record_cpu_tensors` when the segments pass
/// the `staged` values.
pub fn segments_past_message(staged: usize) -> String {
    format!("_record_cpu_tensors: segments past the {staged} staged values")
}

/// `_stat_add_by_id`'s rule: one time per value; otherwise the message of
/// its `ValueError`.
pub fn check_times(values: usize, times: usize) -> Result<(), String> {
    if values != times {
        return Err(format!(
            "_stat_add_by_id: {values} values but {times} times"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregation::Aggregation::Sum;

    #[test]
    fn staged_values_errors_are_worded_for_python() {
        assert_eq!(check_times(2, 2), Ok(()));
        assert_eq!(
            check_times(2, 3),
            Err("_stat_add_by_id: 2 values but 3 times".to_owned())
        );
        assert_eq!(
            segments_past_message(4),
            "_record_cpu_tensors: segments past the 4 staged values"
        );
    }

    #[test]
    fn segments_hold_their_stats_weakly_and_split_the_values_in_order() {
        let (alive, dead) = (Arc::new("a"), Arc::new("b"));
        let segments = Segments::new((), &[(Some(alive.clone()), 2), (Some(dead), 1), (None, 3)]);
        let found = segments.upgrade();
        assert!(Arc::ptr_eq(found[0].0.as_ref().unwrap(), &alive));
        assert!(found[1].0.is_none() && found[2].0.is_none());
        let lengths: Vec<usize> = found.iter().map(|(_, length)| *length).collect();
        assert_eq!(lengths, [2, 1, 3]);
        assert_eq!(
            segment_ranges(4, 10, [2, 1, 3]),
            Some(vec![4..6, 6..7, 7..10])
        );
        assert_eq!(segment_ranges(4, 9, [2, 1, 3]), None);
        assert_eq!(segment_ranges(0, 1, [usize::MAX, 1]), None);
        assert_eq!(segment_ranges(3, 3, []), Some(vec![]));
    }

    #[test]
    fn stats_are_found_by_id_and_listed_in_creation_order_while_alive() {
        let first = Stat::new(&[Sum], 1000, i64::MAX);
        let dropped = Stat::new(&[Sum], 1000, i64::MAX);
        let last = Stat::new(&[Sum], 1000, i64::MAX);
        assert!(first.id() < dropped.id() && dropped.id() < last.id());
        let dropped_id = dropped.id();
        drop(dropped);

        let found = find([last.id(), dropped_id, first.id()].into_iter());
        assert!(Arc::ptr_eq(found[0].as_ref().unwrap(), &last));
        assert!(found[1].is_none());
        assert!(Arc::ptr_eq(found[2].as_ref().unwrap(), &first));
        // Other tests make Stats concurrently: only the order of these two.
        let ids: Vec<u64> = all().iter().map(|s| s.id()).collect();
        let position = |id| ids.iter().position(|&i| i == id).unwrap();
        assert!(position(first.id()) < position(last.id()));
        assert!(!ids.contains(&dropped_id));
    }

    #[test]
    fn the_owner_is_found_by_its_type_while_it_lives() {
        struct Owner(&'static str);
        let stat = Stat::new(&[Sum], 1000, i64::MAX);
        assert!(stat.owner::<Owner>().is_none());
        let owner = Arc::new(Owner("a"));
        let weak: Weak<Owner> = Arc::downgrade(&owner);
        stat.set_owner(weak);
        assert_eq!(get(stat.id()).unwrap().owner::<Owner>().unwrap().0, "a");
        assert!(stat.owner::<String>().is_none());
        drop(owner);
        assert!(stat.owner::<Owner>().is_none());
    }
}
