//! A watchdog's sections (`torchmon.Watchdog.section`): the time spent in
//! each, and the section a hang names.
//!
//! Each thread keeps its own stack of open sections (a thread-local), so a
//! section nested in itself times each level from its own start, and the
//! same section open on two threads at once times each thread's. The
//! watchdog's thread sees, per thread, only the innermost open section (an
//! atomic of that thread's `ThreadSlot`), and a hang names the one of the
//! thread that beat last: the thread whose steps stopped.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::clock;

/// How long a lock of a watchdog's sections is waited for. They are held
/// for microseconds; one still held after this is a forked child's copy of
/// a lock that a parent thread held at the fork, and is skipped.
const LOCK_WAIT: Duration = Duration::from_secs(1);

/// The index of a section whose name could not be registered (see
/// `LOCK_WAIT`): timed as any, named by nobody.
const UNNAMED: u32 = u32::MAX - 1;

/// One beat in this many (and the first) notes its thread.
const BEAT_SAMPLE: u64 = 64;

/// Every `Sections` gets a number, so that a thread's frames are matched to
/// their watchdog without keeping it alive.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

#[derive(Default)]
struct Names {
    index: HashMap<String, u32>,
    names: Vec<String>,
}

/// One thread's innermost open section of one watchdog (index plus one, 0
/// for none), written by that thread, read by the watchdog's thread.
struct ThreadSlot {
    key: usize,
    open: AtomicU32,
}

/// The sections of one watchdog.
pub struct Sections {
    id: u64,
    names: Mutex<Names>,
    threads: Mutex<Vec<Arc<ThreadSlot>>>,
    /// The thread that beat last (`thread_key`), 0 before the first beat.
    last_beat_thread: AtomicUsize,
}

/// A section open on the calling thread.
struct Frame {
    sections: u64,
    index: u32,
    started_ns: u64,
}

/// The calling thread's open sections (of every watchdog) and its slots.
struct ThreadFrames {
    slots: Vec<(u64, Arc<ThreadSlot>)>,
    frames: Vec<Frame>,
}

impl Drop for ThreadFrames {
    /// A thread that ends has no open section (its `with` blocks ended, or
    /// it died inside them).
    fn drop(&mut self) {
        for (_, slot) in &self.slots {
            slot.open.store(0, Ordering::Relaxed);
        }
    }
}

thread_local! {
    static FRAMES: RefCell<ThreadFrames> = const {
        RefCell::new(ThreadFrames {
            slots: Vec::new(),
            frames: Vec::new(),
        })
    };
    /// Its address tells threads apart (no destructor: `const`, read with
    /// no initialisation check).
    static KEY: u8 = const { 0 };
}

/// The calling thread's key: an address unique among the live threads.
#[inline]
pub(super) fn thread_key() -> usize {
    KEY.with(|key| key as *const u8 as usize)
}

impl Default for Sections {
    fn default() -> Self {
        Sections {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            names: Mutex::default(),
            threads: Mutex::default(),
            last_beat_thread: AtomicUsize::new(0),
        }
    }
}

impl Sections {
    /// Called by a beat: the first, then one in `BEAT_SAMPLE` notes its
    /// thread (the thread that beats is the training loop's, seldom
    /// another; reading the thread's key at every beat cost 17
    /// instructions, 3% of a beat: benches/callgrind_per_call.py).
    #[inline]
    pub(super) fn beat_on_this_thread(&self, beats: u64) {
        if beats % BEAT_SAMPLE == 1 {
            self.last_beat_thread.store(thread_key(), Ordering::Relaxed);
        }
    }

    /// The index of section `name`, made on first use.
    pub fn index(&self, name: &str) -> u32 {
        let Some(mut names) = self.names.try_lock_for(LOCK_WAIT) else {
            return UNNAMED;
        };
        if let Some(&index) = names.index.get(name) {
            return index;
        }
        let index = names.names.len() as u32;
        names.names.push(name.to_owned());
        names.index.insert(name.to_owned(), index);
        index
    }

    /// Section `index` opens on the calling thread.
    #[inline]
    pub fn enter(&self, index: u32) {
        let started_ns = clock::monotonic_ns();
        // `try_with`: a thread being torn down has no frames (nothing to
        // time), and no panic crosses into the embedder.
        let _ = FRAMES.try_with(|frames| {
            let Ok(mut frames) = frames.try_borrow_mut() else {
                return;
            };
            self.slot(&mut frames)
                .open
                .store(index + 1, Ordering::Relaxed);
            frames.frames.push(Frame {
                sections: self.id,
                index,
                started_ns,
            });
        });
    }

    /// Section `index` closes on the calling thread: the seconds since its
    /// innermost open frame on this thread started, or `None` if it is not
    /// open here (closed on another thread than it opened on).
    #[inline]
    pub fn exit(&self, index: u32) -> Option<f64> {
        let now_ns = clock::monotonic_ns();
        FRAMES
            .try_with(|frames| {
                let mut frames = frames.try_borrow_mut().ok()?;
                let is_this = |frame: &Frame| frame.sections == self.id && frame.index == index;
                // The innermost frame, as `with` blocks close; any other
                // when blocks close out of order.
                let frame = if frames.frames.last().is_some_and(is_this) {
                    frames.frames.pop()?
                } else {
                    let position = frames.frames.iter().rposition(is_this)?;
                    frames.frames.remove(position)
                };
                let open = frames
                    .frames
                    .iter()
                    .rev()
                    .find(|frame| frame.sections == self.id)
                    .map_or(0, |frame| frame.index + 1);
                self.slot(&mut frames).open.store(open, Ordering::Relaxed);
                Some(now_ns.saturating_sub(frame.started_ns) as f64 * 1e-9)
            })
            .ok()
            .flatten()
    }

    /// The calling thread's slot, entered in `threads` on first use.
    fn slot<'a>(&self, frames: &'a mut ThreadFrames) -> &'a Arc<ThreadSlot> {
        let found = frames.slots.iter().position(|(id, _)| *id == self.id);
        let position = match found {
            Some(position) => position,
            None => {
                let slot = Arc::new(ThreadSlot {
                    key: thread_key(),
                    open: AtomicU32::new(0),
                });
                if let Some(mut threads) = self.threads.try_lock_for(LOCK_WAIT) {
                    // The slots of ended threads (held by the list alone).
                    threads.retain(|slot| Arc::strong_count(slot) > 1);
                    threads.push(Arc::clone(&slot));
                }
                frames.slots.push((self.id, slot));
                frames.slots.len() - 1
            }
        };
        &frames.slots[position].1
    }

    /// The section a hang names: the innermost open one of the thread that
    /// beat last ("" if it has none open); before any beat, the one of the
    /// first thread with a section open.
    pub fn hung_section(&self) -> String {
        let beating = self.last_beat_thread.load(Ordering::Relaxed);
        let open = {
            let Some(threads) = self.threads.try_lock_for(LOCK_WAIT) else {
                return String::new();
            };
            let mut live = threads.iter().filter(|slot| Arc::strong_count(slot) > 1);
            let slot = if beating != 0 {
                live.find(|slot| slot.key == beating)
            } else {
                live.find(|slot| slot.open.load(Ordering::Relaxed) != 0)
            };
            slot.map_or(0, |slot| slot.open.load(Ordering::Relaxed))
        };
        self.name(open)
    }

    /// The name of an open-section value (index plus one; 0: "").
    fn name(&self, open: u32) -> String {
        if open == 0 {
            return String::new();
        }
        (self.names.try_lock_for(LOCK_WAIT))
            .and_then(|names| names.names.get(open as usize - 1).cloned())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_nested_in_itself_times_each_level_from_its_own_start() {
        let sections = Sections::default();
        let a = sections.index("a");
        sections.enter(a);
        std::thread::sleep(Duration::from_millis(60));
        sections.enter(a);
        std::thread::sleep(Duration::from_millis(5));
        let inner = sections.exit(a).unwrap();
        let outer = sections.exit(a).unwrap();
        assert!(inner < 0.05, "{inner}");
        assert!(outer >= 0.065, "{outer}");
        assert_eq!(sections.exit(a), None);
    }

    #[test]
    fn threads_keep_their_own_sections_and_a_hang_names_the_beating_thread() {
        let sections = Arc::new(Sections::default());
        let (data, compute) = (sections.index("data"), sections.index("compute"));
        assert_eq!(sections.index("data"), data);
        sections.enter(compute);
        let other = Arc::clone(&sections);
        let (entered, entered_seen) = std::sync::mpsc::channel();
        let (leave, leave_seen) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            other.enter(data);
            entered.send(()).unwrap();
            leave_seen.recv().unwrap();
            other.exit(data).unwrap()
        });
        entered_seen.recv().unwrap();
        // Before any beat: the first thread with an open section (this one).
        assert_eq!(sections.hung_section(), "compute");
        sections.beat_on_this_thread(1);
        assert_eq!(sections.hung_section(), "compute");
        leave.send(()).unwrap();
        let seconds = thread.join().unwrap();
        assert!(seconds >= 0.0);
        sections.exit(compute).unwrap();
        assert_eq!(sections.hung_section(), "");
    }

    #[test]
    fn many_section_names_are_made_in_linear_time() {
        let sections = Sections::default();
        for i in 0..100_000u32 {
            assert_eq!(sections.index(&format!("s{i}")), i);
        }
        assert_eq!(sections.index("s99999"), 99_999);
    }
}
