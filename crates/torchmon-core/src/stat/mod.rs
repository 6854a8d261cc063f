//! The windowed accumulator behind `Stat`, free of PyO3.
//!
//! It implements the window algorithm of docs/internals.md exactly, with a
//! lock-free `add` on the
//! common path (the sample lands in the window that is already open).
//!
//! # Design
//!
//! The open window's accumulators live in one of two buffers (`phases`).
//! `head` packs which buffer is active, whether the open window is already
//! closed (reached `max_samples`; the rest of it is dropped) and how many
//! writers have claimed a slot in the active buffer since it became active.
//! A writer claims slot `n` with one `fetch_add` on `head`; slot `n` is folded
//! in only if `n < max_samples`, so the sample count is exact without a lock.
//! When done, the writer bumps the buffer's `finished` counter.
//!
//! Closing a window (under `closing`, the only lock) swaps `head` to the other,
//! already empty buffer, then waits until `finished` of the old buffer equals
//! the number of slots claimed in it. Writers that claimed a slot before the
//! swap finish into the old buffer and are counted in the closing window;
//! writers that claim after the swap land in the new one. No sample is folded
//! twice or lost (the scheme is HdrHistogram's writer-reader phaser).
//!
//! Minimum and maximum start from `EMPTY_BITS`, a NaN payload that no sample
//! keeps (see `sample_bits`), so "the first sample sets them" needs no
//! knowledge of which writer came first.

mod accumulators;
#[cfg(not(loom))]
pub mod live;

use crate::aggregation::{Aggregation, Needs};
use crate::histogram::Distribution;
use crate::sync::{AtomicI64, AtomicU64, Mutex, Ordering, spin_wait};
use accumulators::Phase;
use std::any::Any;
use std::mem::MaybeUninit;
use std::sync::{Arc, OnceLock, Weak};

const PHASE_BIT: u64 = 1 << 63;
const DROP_BIT: u64 = 1 << 62;
const INDEX_MASK: u64 = DROP_BIT - 1;

/// Samples per window are capped here so that `head`'s slot index can never
/// run into its flag bits, even with many writers racing past the cap.
/// (2**61 samples at a billion per second take 73 years.)
pub const MAX_SAMPLES_CAP: u64 = 1 << 61;

/// The longest Stat name, in characters (docs/api.md, "Stat"). Every sink's
/// name derived from it fits: an OpenTelemetry instrument name (at most 255
/// characters) is the name, `.stddev` and possibly the prefix `torchmon.`;
/// a Prometheus scrape repeats the name on every series of every window.
pub const MAX_NAME_CHARS: usize = 200;

/// The name-length rule: at most `MAX_NAME_CHARS` characters (`length`);
/// the problem is worded to follow the argument's name.
pub fn check_name_length(length: usize) -> Result<(), String> {
    if length > MAX_NAME_CHARS {
        return Err(format!(
            "must be at most {MAX_NAME_CHARS} characters (the sinks' metric \
             names are made from it), got {length}"
        ));
    }
    Ok(())
}

/// Why a value is not a sample of `Stat.add`/`add_many`: the binding finds
/// which, this is the wording of its `TypeError` (docs/api.md, `Stat.add`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotASample {
    /// Not a real number (`float()` refuses it).
    NotANumber,
    /// An int beyond the float range.
    IntTooLarge,
    Complex,
}

impl NotASample {
    /// The message about a value of type `type_name`; `subject` names it:
    /// `Stat.add(v): v`.
    pub fn message(self, subject: &str, type_name: &str) -> String {
        match self {
            NotASample::NotANumber => format!(
                "{subject} must be a real number (float, int, bool or an object with \
                 __float__), not {type_name}"
            ),
            NotASample::IntTooLarge => {
                format!("{subject} must be a real number, not an int too large to convert to float")
            }
            NotASample::Complex => {
                format!("{subject} must be a real number, not a complex number ({type_name})")
            }
        }
    }
}

/// The name of a closed window's event (torch.monitor's).
pub const STAT_EVENT: &str = "torch.monitor.Stat";

/// The id of "no window yet", the initial `cur_id`/`closed_id` of the
/// window algorithm (docs/internals.md). Window ids here are torch's shifted
/// down by one (`t // window_ms`, not `+ 1`), so
/// that every clock reading has one: `i64::MAX // 1 + 1` does not fit, and a
/// 1 ms Stat at that instant never closed its windows. Clocks never read
/// below 0 (`clock::MIN_OVERRIDE_MS`, and the monotonic clock counts from
/// boot), so no window has this id.
const NO_WINDOW: i64 = -1;

/// What one closed window held. `min`/`max`/`last` are 0 when it was empty.
/// STDDEV and the quantiles are computed when the window closes (so `get`
/// only reads them); they are 0 when not configured.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowStats {
    pub count: u64,
    pub sum: f64,
    pub min: f64,
    pub max: f64,
    pub last: f64,
    pub stddev: f64,
    /// P50, P90, P95, P99, P999 (`histogram::QUANTILE_THOUSANDTHS`).
    pub quantiles: [f64; 5],
    /// The window's histogram, when a P aggregation is configured and the
    /// window is not empty (shared by every reader of the window).
    pub distribution: Option<Arc<Distribution>>,
}

impl WindowStats {
    pub const EMPTY: WindowStats = WindowStats {
        count: 0,
        sum: 0.0,
        min: 0.0,
        max: 0.0,
        last: 0.0,
        stddev: 0.0,
        quantiles: [0.0; 5],
        distribution: None,
    };

    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum / self.count as f64
        }
    }

    /// The value reported for one aggregation (COUNT as a float, as torch).
    pub fn get(&self, aggregation: Aggregation) -> f64 {
        match aggregation {
            Aggregation::Value => self.last,
            Aggregation::Mean => self.mean(),
            Aggregation::Count => self.count as f64,
            Aggregation::Sum => self.sum,
            Aggregation::Max => self.max,
            Aggregation::Min => self.min,
            Aggregation::Stddev => self.stddev,
            Aggregation::P50 => self.quantiles[0],
            Aggregation::P90 => self.quantiles[1],
            Aggregation::P95 => self.quantiles[2],
            Aggregation::P99 => self.quantiles[3],
            Aggregation::P999 => self.quantiles[4],
        }
    }
}

/// Windows closed by one call, in the order they closed (at most two: the
/// previous window by time, then the new one by `max_samples`).
///
/// Every add returns one, almost always empty, so making, testing and
/// dropping an empty one is one store, one load and one branch: a length
/// and uninitialised slots, rather than `[Option<WindowStats>; 2]`, whose
/// drop glue (a `WindowStats` may hold a `Distribution`) tests both slots.
pub struct Closed {
    len: usize,
    windows: [MaybeUninit<WindowStats>; 2],
}

impl Default for Closed {
    #[inline(always)]
    fn default() -> Self {
        Closed {
            len: 0,
            windows: [MaybeUninit::uninit(), MaybeUninit::uninit()],
        }
    }
}

impl Closed {
    fn push(&mut self, window: WindowStats) {
        assert!(self.len < 2, "a single add closes at most two windows");
        self.windows[self.len].write(window);
        self.len += 1;
    }

    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = &WindowStats> {
        // SAFETY: `push` wrote slots `0..len` before counting them, and no
        // slot is ever taken out or overwritten.
        self.windows[..self.len]
            .iter()
            .map(|w| unsafe { w.assume_init_ref() })
    }
}

impl Drop for Closed {
    #[inline(always)]
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        for window in &mut self.windows[..self.len] {
            // SAFETY: slots `0..len` were written by `push` and are dropped
            // once, here; `len` is never read again.
            unsafe { window.assume_init_drop() };
        }
    }
}

impl std::fmt::Debug for Closed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// State that changes only when a window closes.
struct Locked {
    /// The last closed window: what `get()` reports.
    prev: WindowStats,
    /// Id of the last window that was closed (the window algorithm's
    /// `closed_id`, docs/internals.md).
    closed_id: i64,
}

/// Outcome of the lock-free attempt.
enum Fast {
    Done,
    /// This sample filled the window: close it now (docs/internals.md,
    /// window algorithm step 4).
    Filled,
    /// The lock-free path cannot decide; take the lock.
    Slow,
}

pub struct Stat {
    window_ms: i64,
    max_samples: u64,
    needs: Needs,
    /// Id of the window the active buffer belongs to (the window
    /// algorithm's `cur_id`, docs/internals.md).
    /// Written only under `locked`.
    cur_id: AtomicI64,
    head: AtomicU64,
    phases: [Phase; 2],
    locked: Mutex<Locked>,
    /// Its place in the list of live Stats (`live`), unique in the process.
    id: u64,
    /// What the embedder wraps it in (`set_owner`).
    owner: OnceLock<Weak<dyn Any + Send + Sync>>,
}

#[inline]
fn slot_index(head: u64) -> u64 {
    head & INDEX_MASK
}

#[inline]
fn phase_of(head: u64) -> usize {
    (head >> 63) as usize
}

impl Stat {
    /// `window_ms` must be at least 1; `max_samples` below 1 behaves like 1.
    /// The Stat is shared, and entered in the list of live Stats (`live`),
    /// so that the exit flush finds it and a forked child can empty the
    /// window it inherited.
    pub fn new(aggregations: &[Aggregation], window_ms: i64, max_samples: i64) -> Arc<Self> {
        assert!(window_ms >= 1, "window_ms must be positive");
        let needs = Needs::of(aggregations);
        Arc::new_cyclic(|weak| Stat {
            window_ms,
            max_samples: (max_samples.max(1) as u64).min(MAX_SAMPLES_CAP),
            needs,
            cur_id: AtomicI64::new(NO_WINDOW),
            head: AtomicU64::new(0),
            phases: [Phase::new(needs), Phase::new(needs)],
            locked: Mutex::new(Locked {
                prev: WindowStats::EMPTY,
                closed_id: NO_WINDOW,
            }),
            #[cfg(not(loom))]
            id: live::enter(weak.clone()),
            #[cfg(loom)]
            id: {
                let _ = weak;
                0
            },
            owner: OnceLock::new(),
        })
    }

    /// Its id in the list of live Stats: unique in the process, increasing
    /// in creation order.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Sets what the embedder wraps this Stat in, found again by `owner`
    /// from the list of live Stats. Only the first call takes effect; the
    /// Stat holds it weakly.
    pub fn set_owner(&self, owner: Weak<dyn Any + Send + Sync>) {
        let _ = self.owner.set(owner);
    }

    /// The owner set by `set_owner`, if it is a `T` and still alive.
    pub fn owner<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.owner.get()?.upgrade()?.downcast::<T>().ok()
    }

    /// In a forked child (`live::reset_after_fork`, one thread): empties
    /// the open window, which holds the parent's samples, so that the child
    /// emits only what it adds itself. The window stays open, empty and
    /// accepting samples even if the parent had filled it to `max_samples`;
    /// `get()` still reports the last window the parent closed. Returns
    /// whether samples were discarded. A Stat whose lock a vanished parent
    /// thread held is left as it is.
    #[cfg(not(loom))]
    pub fn reset_after_fork(&self) -> bool {
        let Some(mut locked) = self.locked.try_lock() else {
            return false;
        };
        let head = self.head.load(Ordering::Relaxed);
        let had_samples = self.count() > 0;
        // A writer that had claimed a slot when the parent forked never
        // finishes here: clearing both buffers (`take` zeroes `finished`)
        // also spares the next close from waiting for it.
        for phase in &self.phases {
            drop(phase.take(0));
        }
        self.head.store(head & PHASE_BIT, Ordering::Release);
        // Only `closed_id == cur_id` (the parent filled the window) matters:
        // it would drop the child's samples as if the child had filled it.
        locked.closed_id = NO_WINDOW;
        had_samples
    }

    pub fn window_ms(&self) -> i64 {
        self.window_ms
    }

    /// The id of the window holding `now_ms` (see `NO_WINDOW`).
    #[inline]
    pub fn window_id(&self, now_ms: i64) -> i64 {
        now_ms.div_euclid(self.window_ms)
    }

    /// `window_id(now_ms)`, without the division (a 64-bit `idiv`, tens of
    /// cycles) when `now_ms` falls in the open window, as it does for all
    /// but the first add of each window.
    #[inline(always)]
    fn window_of(&self, now_ms: i64) -> i64 {
        let open = self.cur_id.load(Ordering::Relaxed);
        // `open * window_ms` is at most a clock reading, or `-window_ms` for
        // NO_WINDOW, so it cannot overflow. One unsigned comparison is
        // `start <= now_ms < start + window_ms` without overflowing near
        // i64::MAX: a `now_ms` below `start` wraps to a huge difference.
        let start = open.wrapping_mul(self.window_ms);
        if (now_ms.wrapping_sub(start) as u64) < self.window_ms as u64 {
            open
        } else {
            self.window_id(now_ms)
        }
    }

    /// The time this Stat's windows are measured on (see
    /// `clock::now_ms_for_window`).
    #[inline(always)]
    pub fn now_ms(&self) -> i64 {
        crate::clock::now_ms_for_window(self.window_ms)
    }

    /// Adds `v` at the current time.
    #[inline]
    pub fn add(&self, v: f64) -> Closed {
        self.add_at(v, self.now_ms())
    }

    /// `add` for a caller that guarantees that no other call on this Stat
    /// runs at the same time: the Python binding on GIL builds, where the GIL
    /// serialises every call. The result is the same as `add`'s; the fast
    /// path's read-modify-write instructions (a `lock`-prefixed instruction
    /// costs ~10 ns here, see benches/stat_add.rs) become plain loads and
    /// stores. Breaking the guarantee cannot cause undefined behaviour (every
    /// cell stays atomic), only lost samples.
    #[inline(always)]
    pub fn add_serialized(&self, v: f64) -> Closed {
        self.add_at_serialized(v, self.now_ms())
    }

    /// `add_at` under `add_serialized`'s guarantee.
    #[inline(always)]
    pub fn add_at_serialized(&self, v: f64, now_ms: i64) -> Closed {
        let window = self.window_of(now_ms);
        match self.try_add_serialized(v, window) {
            Fast::Done => Closed::default(),
            Fast::Filled => self.add_locked(None, window),
            Fast::Slow => self.add_locked(Some(v), window),
        }
    }

    #[inline(always)]
    fn try_add_serialized(&self, v: f64, window: i64) -> Fast {
        if self.cur_id.load(Ordering::Relaxed) != window {
            return Fast::Slow;
        }
        let seen = self.head.load(Ordering::Relaxed);
        if seen & DROP_BIT != 0 {
            return Fast::Done;
        }
        let slot = slot_index(seen);
        if slot >= self.max_samples {
            return Fast::Slow;
        }
        self.head.store(seen + 1, Ordering::Relaxed);
        let phase = &self.phases[phase_of(seen)];
        phase.fold_serialized(self.needs, v);
        let finished = phase.finished.load(Ordering::Relaxed);
        phase.finished.store(finished + 1, Ordering::Relaxed);
        if slot + 1 == self.max_samples {
            Fast::Filled
        } else {
            Fast::Done
        }
    }

    /// Adds `v` as if the clock read `now_ms`; returns the windows this closed.
    #[inline]
    pub fn add_at(&self, v: f64, now_ms: i64) -> Closed {
        let window = self.window_of(now_ms);
        match self.try_add_lock_free(v, window) {
            Fast::Done => Closed::default(),
            Fast::Filled => self.add_locked(None, window),
            Fast::Slow => self.add_locked(Some(v), window),
        }
    }

    #[inline]
    fn try_add_lock_free(&self, v: f64, window: i64) -> Fast {
        if self.cur_id.load(Ordering::Acquire) != window {
            return Fast::Slow;
        }
        let seen = self.head.load(Ordering::Acquire);
        if seen & DROP_BIT != 0 {
            // The open window reached max_samples and was closed (step 2).
            return Fast::Done;
        }
        if slot_index(seen) >= self.max_samples {
            return Fast::Slow;
        }
        let claimed = self.head.fetch_add(1, Ordering::AcqRel);
        let phase = &self.phases[phase_of(claimed)];
        let slot = slot_index(claimed);
        // A close may have happened between the check and the claim; the
        // claim is what counts. In a dropped window, or past max_samples, the
        // sample is not folded, but the slot must still be finished.
        let accepted = claimed & DROP_BIT == 0 && slot < self.max_samples;
        if accepted {
            phase.fold(self.needs, v);
        }
        phase.finished.fetch_add(1, Ordering::Release);
        if claimed & DROP_BIT != 0 {
            Fast::Done
        } else if !accepted {
            // Filled by others meanwhile: the lock decides (close, then drop).
            Fast::Slow
        } else if slot + 1 == self.max_samples {
            Fast::Filled
        } else {
            Fast::Done
        }
    }

    /// Adds every value in order at one instant `now_ms`: exactly what
    /// calling `add_at` on each would do (the same window closes, the same
    /// `max_samples` drops, the same sums, since they are folded in order),
    /// with one lock acquisition and one publish per accumulator.
    /// `value_at(i)` for `i` in `0..len` gives the values; it is called more
    /// than once per index.
    pub fn add_many_at(&self, len: usize, value_at: impl Fn(usize) -> f64, now_ms: i64) -> Closed {
        let mut closed = Closed::default();
        if len == 0 {
            return closed;
        }
        let mut locked = self.locked.lock();
        let window = self
            .window_id(now_ms)
            .max(self.cur_id.load(Ordering::Relaxed));
        // The first value's step 1 (a later window or a full one closes).
        let reserve = (len as u64).min(self.max_samples);
        let reserved = self.close_if_due(&mut locked, window, &mut closed, reserve);
        if locked.closed_id == window {
            // This window was closed by max_samples: every value is dropped.
            return closed;
        }
        let (claimed, take) = match reserved {
            Some(claimed) => (claimed, reserve),
            None => {
                let room = self.max_samples.saturating_sub(self.count());
                let take = (len as u64).min(room);
                (self.head.fetch_add(take, Ordering::AcqRel), take)
            }
        };
        let phase = &self.phases[phase_of(claimed)];
        // Lock-free writers may have claimed slots since `count()`.
        let accepted = take.min(self.max_samples.saturating_sub(slot_index(claimed)));
        phase.fold_many(self.needs, accepted as usize, &value_at);
        phase.finished.fetch_add(take, Ordering::Release);
        // Step 4 for the value that filled the window; the values after it
        // fall into a closed window and are dropped, as in the loop.
        self.close_if_due(&mut locked, window, &mut closed, 0);
        closed
    }

    /// Steps 1 to 4 of the window algorithm (docs/internals.md) under the lock. `v` is `None` when the sample was
    /// already folded lock-free and only step 4 remains.
    #[cold]
    fn add_locked(&self, v: Option<f64>, window_seen: i64) -> Closed {
        let mut closed = Closed::default();
        let mut locked = self.locked.lock();
        // Windows never go back: a clock read that lost a race with a close,
        // or a test clock set earlier, counts in the window that is open.
        let window = window_seen.max(self.cur_id.load(Ordering::Relaxed));
        let reserved = match v {
            Some(_) => self.close_if_due(&mut locked, window, &mut closed, 1),
            None => None,
        };
        if let Some(v) = v {
            if locked.closed_id == window {
                return closed;
            }
            // The buffer cannot change while we hold the lock, but lock-free
            // writers may still be claiming slots in it.
            let claimed = reserved.unwrap_or_else(|| self.head.fetch_add(1, Ordering::AcqRel));
            let phase = &self.phases[phase_of(claimed)];
            debug_assert_eq!(
                claimed & DROP_BIT,
                0,
                "a dropped window has closed_id == cur_id"
            );
            if slot_index(claimed) < self.max_samples {
                phase.fold(self.needs, v);
            }
            phase.finished.fetch_add(1, Ordering::Release);
        }
        self.close_if_due(&mut locked, window, &mut closed, 0);
        closed
    }

    /// Window algorithm step 1 (and 4, docs/internals.md): close if the window changed or is full, unless
    /// this window was already closed.
    ///
    /// When this opens a later window, the first `reserve` slots of its
    /// buffer are claimed for the caller in the same instruction that makes
    /// it active, and the claim is returned (as `fetch_add` would return
    /// it): the caller must fold into them and finish them. Claiming them
    /// afterwards would let lock-free adds whose clock read the old window
    /// claim first, and the add that opened the window could then be
    /// dropped by max_samples in favour of earlier ones, an outcome no
    /// order of the adds gives (found by the loom model
    /// `loom_three_writers_fill_and_cross_windows`).
    fn close_if_due(
        &self,
        locked: &mut Locked,
        window: i64,
        closed: &mut Closed,
        reserve: u64,
    ) -> Option<u64> {
        let due = self.cur_id.load(Ordering::Relaxed) != window || self.count() >= self.max_samples;
        if due && locked.closed_id != window {
            let cur = self.cur_id.load(Ordering::Relaxed);
            // Closing the window we are in (it is full) drops the rest of it.
            let dropping = cur == window;
            let reserve = if dropping { 0 } else { reserve };
            let (window_stats, reserved) = self.swap_phase(dropping, reserve);
            // A window closed by time that is full lost a race with the add
            // that filled it (lock-free, `Fast::Filled`, not yet at the lock;
            // `count()` above may not have seen its claim, the swap did). In
            // any order of the two adds that add's step 4 closes the window
            // first, and this later window's step 1 then closes its empty
            // remainder: `get` reports zeros. (Found by the loom model
            // `loom_a_full_window_closes_before_a_later_one_opens`.)
            let full = window_stats.count >= self.max_samples;
            locked.prev = if full && !dropping {
                WindowStats::EMPTY
            } else {
                window_stats.clone()
            };
            locked.closed_id = cur;
            self.cur_id.store(window, Ordering::Release);
            if window_stats.count > 0 {
                closed.push(window_stats);
            }
            return (reserve > 0).then_some(reserved);
        }
        None
    }

    /// Makes the other (empty) buffer active with its first `reserve` slots
    /// claimed, and returns what the old one held and the claim (the new
    /// buffer's `head` with slot 0).
    fn swap_phase(&self, dropping: bool, reserve: u64) -> (WindowStats, u64) {
        let current = self.head.load(Ordering::Relaxed);
        let next_phase = (current & PHASE_BIT) ^ PHASE_BIT;
        let fresh = next_phase | if dropping { DROP_BIT } else { 0 };
        let old = self.head.swap(fresh + reserve, Ordering::AcqRel);
        let phase = &self.phases[phase_of(old)];
        let claimed = slot_index(old);
        let mut spins = 0u32;
        while phase.finished.load(Ordering::Acquire) != claimed {
            // Writers finish within a few instructions of claiming; yield only
            // if one was preempted in between.
            spin_wait(&mut spins);
        }
        let count = if old & DROP_BIT != 0 {
            0
        } else {
            claimed.min(self.max_samples)
        };
        (phase.take(count), fresh)
    }

    /// Closes the open window if it holds samples, without ending it: later
    /// adds in the same window start a fresh partial window. Used when the
    /// Stat is destroyed and at interpreter exit.
    pub fn flush(&self) -> Option<WindowStats> {
        let mut locked = self.locked.lock();
        if self.count() == 0 {
            return None;
        }
        let (window_stats, _) = self.swap_phase(false, 0);
        locked.prev = window_stats.clone();
        Some(window_stats)
    }

    /// Samples in the open window (exact when no add is in flight).
    #[inline]
    pub fn count(&self) -> u64 {
        let head = self.head.load(Ordering::Acquire);
        if head & DROP_BIT != 0 {
            0
        } else {
            slot_index(head).min(self.max_samples)
        }
    }

    /// The last closed window.
    pub fn last_closed(&self) -> WindowStats {
        self.locked.lock().prev.clone()
    }

    /// Heap bytes of the extension aggregations' state (the shifted sums
    /// and the histograms of both window buffers, their blocks included);
    /// 0 for a Stat of torch aggregations only.
    pub fn extension_bytes(&self) -> usize {
        self.phases.iter().map(Phase::extra_bytes).sum()
    }
}

// Under loom these would run outside a model (loom's atomics panic there).
#[cfg(all(test, not(loom)))]
mod tests;

#[cfg(all(test, loom))]
#[path = "loom.rs"]
mod loom_tests;
