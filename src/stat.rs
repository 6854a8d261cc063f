//! The windowed accumulator behind `Stat`, free of PyO3.
//!
//! It implements SPEC §3 "Windows" exactly, with a lock-free `add` on the
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

use crate::aggregation::{Aggregation, Needs};
use crate::sync::{AtomicI64, AtomicU64, Mutex, Ordering, spin_wait};

const PHASE_BIT: u64 = 1 << 63;
const DROP_BIT: u64 = 1 << 62;
const INDEX_MASK: u64 = DROP_BIT - 1;

/// Samples per window are capped here so that `head`'s slot index can never
/// run into its flag bits, even with many writers racing past the cap.
/// (2**61 samples at a billion per second take 73 years.)
pub const MAX_SAMPLES_CAP: u64 = 1 << 61;

/// The id of "no window yet", SPEC's initial `cur_id`/`closed_id`. Window ids
/// here are SPEC's shifted down by one (`t // window_ms`, not `+ 1`), so
/// that every clock reading has one: `i64::MAX // 1 + 1` does not fit, and a
/// 1 ms Stat at that instant never closed its windows. Clocks never read
/// below 0 (`clock::MIN_OVERRIDE_MS`, and the monotonic clock counts from
/// boot), so no window has this id.
const NO_WINDOW: i64 = -1;

/// Placeholder for "no sample yet" in the min/max cells.
const EMPTY_BITS: u64 = 0x7ff8_dead_beef_0001;
const CANONICAL_NAN_BITS: u64 = 0x7ff8_0000_0000_0000;

/// A sample's bits, never equal to `EMPTY_BITS` (that one NaN payload
/// becomes the canonical NaN; it is still a NaN).
#[inline]
fn sample_bits(v: f64) -> u64 {
    let bits = v.to_bits();
    if bits == EMPTY_BITS {
        CANONICAL_NAN_BITS
    } else {
        bits
    }
}

/// What one closed window held. `min`/`max`/`last` are 0 when it was empty.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowStats {
    pub count: u64,
    pub sum: f64,
    pub min: f64,
    pub max: f64,
    pub last: f64,
}

impl WindowStats {
    pub const EMPTY: WindowStats = WindowStats {
        count: 0,
        sum: 0.0,
        min: 0.0,
        max: 0.0,
        last: 0.0,
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
        }
    }
}

/// Windows closed by one call, in the order they closed (at most two: the
/// previous window by time, then the new one by `max_samples`).
#[derive(Debug, Default)]
pub struct Closed {
    windows: [Option<WindowStats>; 2],
}

impl Closed {
    fn push(&mut self, window: WindowStats) {
        let slot = self
            .windows
            .iter_mut()
            .find(|w| w.is_none())
            .expect("a single add closes at most two windows");
        *slot = Some(window);
    }

    pub fn is_empty(&self) -> bool {
        self.windows[0].is_none()
    }

    pub fn iter(&self) -> impl Iterator<Item = &WindowStats> {
        self.windows.iter().flatten()
    }
}

/// One buffer of accumulators (f64 values stored as bits).
struct Phase {
    sum: AtomicU64,
    min: AtomicU64,
    max: AtomicU64,
    last: AtomicU64,
    /// Writers that claimed a slot in this buffer and are done with it.
    finished: AtomicU64,
}

impl Phase {
    fn new() -> Self {
        Phase {
            sum: AtomicU64::new(0.0f64.to_bits()),
            min: AtomicU64::new(EMPTY_BITS),
            max: AtomicU64::new(EMPTY_BITS),
            last: AtomicU64::new(0.0f64.to_bits()),
            finished: AtomicU64::new(0),
        }
    }

    #[inline]
    fn fold(&self, needs: Needs, v: f64) {
        if needs.sum {
            let mut current = self.sum.load(Ordering::Relaxed);
            loop {
                let next = (f64::from_bits(current) + v).to_bits();
                match self.sum.compare_exchange_weak(
                    current,
                    next,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break,
                    Err(seen) => current = seen,
                }
            }
        }
        let bits = sample_bits(v);
        // Plain IEEE comparisons, as torch: a NaN first sample sticks, a later
        // NaN is ignored, and -0.0 then 0.0 keeps -0.0.
        if needs.max {
            replace_while(&self.max, bits, |current| current < v);
        }
        if needs.min {
            replace_while(&self.min, bits, |current| current > v);
        }
        if needs.last {
            self.last.store(bits, Ordering::Relaxed);
        }
    }

    /// `fold` without read-modify-write instructions, for serialised callers.
    #[inline(always)]
    fn fold_serialized(&self, needs: Needs, v: f64) {
        if needs.sum {
            let sum = f64::from_bits(self.sum.load(Ordering::Relaxed)) + v;
            self.sum.store(sum.to_bits(), Ordering::Relaxed);
        }
        let bits = sample_bits(v);
        let store_if = |cell: &AtomicU64, should_replace: fn(f64, f64) -> bool| {
            let current = cell.load(Ordering::Relaxed);
            if current == EMPTY_BITS || should_replace(f64::from_bits(current), v) {
                cell.store(bits, Ordering::Relaxed);
            }
        };
        if needs.max {
            store_if(&self.max, |current, v| current < v);
        }
        if needs.min {
            store_if(&self.min, |current, v| current > v);
        }
        if needs.last {
            self.last.store(bits, Ordering::Relaxed);
        }
    }

    /// Folds `values` in order, as that many `fold`s would: one pass over
    /// the values from the accumulators' current contents, then one publish
    /// each. A publish that lost a race with a concurrent writer redoes that
    /// accumulator's pass from the value it found.
    fn fold_many(&self, needs: Needs, len: usize, value_at: &impl Fn(usize) -> f64) {
        let start = Folded {
            sum: self.sum.load(Ordering::Relaxed),
            min: self.min.load(Ordering::Relaxed),
            max: self.max.load(Ordering::Relaxed),
            last: EMPTY_BITS,
        };
        let folded = start.fold_by(needs, len, value_at);
        if folded.last == EMPTY_BITS {
            return; // no values
        }
        let redo = |cell: &AtomicU64, start: u64, done: u64, pick: fn(&Folded) -> u64| {
            if cell
                .compare_exchange(start, done, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
            let mut current = cell.load(Ordering::Relaxed);
            loop {
                let again = Folded {
                    sum: current,
                    min: current,
                    max: current,
                    last: EMPTY_BITS,
                }
                .fold_by(needs, len, value_at);
                match cell.compare_exchange_weak(
                    current,
                    pick(&again),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return,
                    Err(seen) => current = seen,
                }
            }
        };
        if needs.sum {
            redo(&self.sum, start.sum, folded.sum, |f| f.sum);
        }
        if needs.min {
            redo(&self.min, start.min, folded.min, |f| f.min);
        }
        if needs.max {
            redo(&self.max, start.max, folded.max, |f| f.max);
        }
        if needs.last {
            self.last.store(folded.last, Ordering::Relaxed);
        }
    }

    /// Reads the buffer's window and empties it. Only the closer (holding the
    /// Stat's lock) calls this, after every writer of the buffer finished.
    fn take(&self, count: u64) -> WindowStats {
        let read_or_zero = |cell: &AtomicU64| {
            let bits = cell.swap(EMPTY_BITS, Ordering::Relaxed);
            if bits == EMPTY_BITS {
                0.0
            } else {
                f64::from_bits(bits)
            }
        };
        let window = WindowStats {
            count,
            sum: f64::from_bits(self.sum.swap(0.0f64.to_bits(), Ordering::Relaxed)),
            min: read_or_zero(&self.min),
            max: read_or_zero(&self.max),
            last: f64::from_bits(self.last.swap(0.0f64.to_bits(), Ordering::Relaxed)),
        };
        self.finished.store(0, Ordering::Relaxed);
        if count == 0 {
            WindowStats::EMPTY
        } else {
            window
        }
    }
}

/// Accumulators (as stored bits) while `fold_many` runs over a batch.
#[derive(Clone, Copy)]
struct Folded {
    sum: u64,
    min: u64,
    max: u64,
    /// The last sample folded (unused as an input).
    last: u64,
}

impl Folded {
    /// Folds `values` in order by `Phase::fold`'s rules: the first sample
    /// sets an empty min/max, and plain IEEE comparisons after that (a NaN
    /// min/max sticks, a later NaN never replaces). Written without branches
    /// so that only the sum's dependency chain bounds it; `WITH_SUM` false
    /// skips that chain when no aggregation reads the sum.
    #[inline(always)]
    fn fold<const WITH_SUM: bool>(self, len: usize, value_at: &impl Fn(usize) -> f64) -> Folded {
        if len == 0 {
            return self;
        }
        let first = value_at(0);
        let mut sum = f64::from_bits(self.sum);
        if WITH_SUM {
            sum += first;
        }
        let start = |bits: u64, replace: bool| {
            if bits == EMPTY_BITS || replace {
                first
            } else {
                f64::from_bits(bits)
            }
        };
        let mut min = start(self.min, f64::from_bits(self.min) > first);
        let mut max = start(self.max, f64::from_bits(self.max) < first);
        for index in 1..len {
            let v = value_at(index);
            if WITH_SUM {
                sum += v;
            }
            min = if min > v { v } else { min };
            max = if max < v { v } else { max };
        }
        Folded {
            sum: sum.to_bits(),
            min: sample_bits(min),
            max: sample_bits(max),
            last: sample_bits(value_at(len - 1)),
        }
    }

    fn fold_by(self, needs: Needs, len: usize, value_at: &impl Fn(usize) -> f64) -> Folded {
        if needs.sum {
            self.fold::<true>(len, value_at)
        } else {
            self.fold::<false>(len, value_at)
        }
    }
}

/// Stores `bits` into `cell` while the cell is empty or `should_replace` holds
/// for its current value.
#[inline]
fn replace_while(cell: &AtomicU64, bits: u64, should_replace: impl Fn(f64) -> bool) {
    let mut current = cell.load(Ordering::Relaxed);
    while current == EMPTY_BITS || should_replace(f64::from_bits(current)) {
        match cell.compare_exchange_weak(current, bits, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return,
            Err(seen) => current = seen,
        }
    }
}

/// State that changes only when a window closes.
struct Locked {
    /// The last closed window: what `get()` reports.
    prev: WindowStats,
    /// Id of the last window that was closed (SPEC's `closed_id`).
    closed_id: i64,
}

/// Outcome of the lock-free attempt.
enum Fast {
    Done,
    /// This sample filled the window: close it now (SPEC step 4).
    Filled,
    /// The lock-free path cannot decide; take the lock.
    Slow,
}

pub struct Stat {
    window_ms: i64,
    max_samples: u64,
    needs: Needs,
    /// Id of the window the active buffer belongs to (SPEC's `cur_id`).
    /// Written only under `locked`.
    cur_id: AtomicI64,
    head: AtomicU64,
    phases: [Phase; 2],
    locked: Mutex<Locked>,
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
    pub fn new(aggregations: &[Aggregation], window_ms: i64, max_samples: i64) -> Self {
        assert!(window_ms >= 1, "window_ms must be positive");
        Stat {
            window_ms,
            max_samples: (max_samples.max(1) as u64).min(MAX_SAMPLES_CAP),
            needs: Needs::of(aggregations),
            cur_id: AtomicI64::new(NO_WINDOW),
            head: AtomicU64::new(0),
            phases: [Phase::new(), Phase::new()],
            locked: Mutex::new(Locked {
                prev: WindowStats::EMPTY,
                closed_id: NO_WINDOW,
            }),
        }
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

    /// SPEC §3 steps 1 to 4 under the lock. `v` is `None` when the sample was
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

    /// SPEC step 1 (and 4): close if the window changed or is full, unless
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
                window_stats
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
        locked.prev = window_stats;
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
        self.locked.lock().prev
    }
}

// Under loom these would run outside a model (loom's atomics panic there).
#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use Aggregation::*;

    const ALL: [Aggregation; 6] = [Value, Mean, Count, Sum, Max, Min];
    const HOUR: i64 = 3_600_000;

    fn windows(closed: Closed) -> Vec<WindowStats> {
        closed.iter().copied().collect()
    }

    #[test]
    fn max_samples_closes_at_once_and_drops_the_rest() {
        let s = Stat::new(&ALL, HOUR, 3);
        assert!(windows(s.add_at(1.0, 10)).is_empty());
        assert!(windows(s.add_at(2.0, 10)).is_empty());
        let closed = windows(s.add_at(4.0, 10));
        assert_eq!(closed.len(), 1);
        assert_eq!(closed[0].count, 3);
        assert_eq!(closed[0].sum, 7.0);
        assert_eq!(closed[0].last, 4.0);
        assert_eq!(s.count(), 0);
        assert!(windows(s.add_at(100.0, 11)).is_empty());
        assert_eq!(s.count(), 0);
        assert_eq!(s.last_closed().sum, 7.0);
    }

    #[test]
    fn later_window_after_a_full_one_reports_zeros() {
        let s = Stat::new(&ALL, 10, 1);
        assert_eq!(windows(s.add_at(5.0, 0)).len(), 1);
        // Window 2 opens: the empty remainder of window 1 closes (no event),
        // then this sample fills window 2 at once.
        let closed = windows(s.add_at(6.0, 10));
        assert_eq!(closed.len(), 1);
        assert_eq!(closed[0].sum, 6.0);
    }

    #[test]
    fn idle_windows_are_never_closed() {
        let s = Stat::new(&[Sum, Count], 10, i64::MAX);
        assert!(windows(s.add_at(1.0, 0)).is_empty());
        let closed = windows(s.add_at(2.0, 55));
        assert_eq!(closed.len(), 1);
        assert_eq!(closed[0].sum, 1.0);
        assert_eq!(s.last_closed().sum, 1.0);
        assert_eq!(s.count(), 1);
    }

    #[test]
    fn first_add_of_a_later_window_after_max_close_gives_zeros() {
        let s = Stat::new(&[Sum, Count], 10, 2);
        s.add_at(1.0, 0);
        assert_eq!(windows(s.add_at(2.0, 0)).len(), 1);
        assert!(windows(s.add_at(3.0, 20)).is_empty());
        assert_eq!(s.last_closed(), WindowStats::EMPTY);
        assert_eq!(s.count(), 1);
    }

    #[test]
    fn ieee_rules_for_min_max_and_sum() {
        let s = Stat::new(&ALL, HOUR, 3);
        s.add_at(-0.0, 0);
        s.add_at(0.0, 0);
        let w = windows(s.add_at(-0.0, 0))[0];
        assert!(w.min.is_sign_negative() && w.max.is_sign_negative());
        assert!(w.sum.is_sign_positive());

        let s = Stat::new(&ALL, HOUR, 2);
        s.add_at(f64::NAN, 0);
        let w = windows(s.add_at(1.0, 0))[0];
        assert!(w.min.is_nan() && w.max.is_nan() && w.sum.is_nan());

        let s = Stat::new(&ALL, HOUR, 2);
        s.add_at(1.0, 0);
        let w = windows(s.add_at(f64::NAN, 0))[0];
        assert_eq!((w.min, w.max), (1.0, 1.0));
        assert!(w.sum.is_nan() && w.last.is_nan());
    }

    #[test]
    fn the_placeholder_nan_is_still_a_nan_sample() {
        let s = Stat::new(&[Min, Max], HOUR, 1);
        let w = windows(s.add_at(f64::from_bits(EMPTY_BITS), 0))[0];
        assert!(w.min.is_nan() && w.max.is_nan());
    }

    #[test]
    fn flush_emits_the_open_window_once() {
        let s = Stat::new(&[Sum], HOUR, i64::MAX);
        s.add_at(1.5, 0);
        s.add_at(2.5, 0);
        assert_eq!(s.flush().map(|w| w.sum), Some(4.0));
        assert_eq!(s.flush(), None);
        s.add_at(1.0, 0);
        assert_eq!(s.flush().map(|w| w.count), Some(1));
    }

    #[test]
    fn max_samples_below_one_behaves_like_one() {
        for max in [0, -5, i64::MIN] {
            let s = Stat::new(&[Count], HOUR, max);
            assert_eq!(windows(s.add_at(1.0, 0)).len(), 1);
            assert!(windows(s.add_at(1.0, 0)).is_empty());
        }
    }

    #[test]
    fn windows_close_up_to_the_last_millisecond_of_the_clock() {
        for window_ms in [1, 2, 7, 1000, i64::MAX] {
            let s = Stat::new(&[Sum, Count], window_ms, i64::MAX);
            // A fresh Stat's first add, then one add per millisecond.
            let start = i64::MAX - 3;
            let mut closed_sums = Vec::new();
            for (i, now) in (start..=i64::MAX).enumerate() {
                closed_sums.extend(windows(s.add_at(i as f64, now)).iter().map(|w| w.sum));
            }
            let ids: Vec<i64> = (start..=i64::MAX).map(|t| t / window_ms).collect();
            let expected_closes = ids.windows(2).filter(|p| p[0] != p[1]).count();
            assert_eq!(closed_sums.len(), expected_closes, "window {window_ms} ms");
            let last = ids[ids.len() - 1];
            let open = ids.iter().filter(|&&id| id == last).count();
            assert_eq!(s.count() as usize, open, "window {window_ms} ms");
        }
        // 1 ms windows: each add closes the one before.
        let s = Stat::new(&[Sum], 1, i64::MAX);
        assert!(windows(s.add_at(1.0, i64::MAX - 1)).is_empty());
        let closed = windows(s.add_at(2.0, i64::MAX));
        assert_eq!(closed.iter().map(|w| w.sum).collect::<Vec<_>>(), [1.0]);
        assert_eq!(s.flush().map(|w| w.sum), Some(2.0));
    }

    #[test]
    fn a_clock_that_goes_back_counts_in_the_open_window() {
        let s = Stat::new(&[Sum, Count], 10, i64::MAX);
        s.add_at(1.0, 100);
        assert!(windows(s.add_at(2.0, 5)).is_empty());
        assert_eq!(s.count(), 2);
    }

    #[test]
    fn a_full_window_closed_by_a_later_add_leaves_get_zeros() {
        // The interleaving loom found, replayed on one thread: an add fills
        // window 1 lock-free, and before it takes the lock (SPEC step 4) an
        // add in window 2 takes it.
        let s = Stat::new(&[Sum, Count], 10, 2);
        assert!(windows(s.add_at(1.0, 5)).is_empty());
        let window = s.window_of(5);
        assert!(matches!(s.try_add_lock_free(2.0, window), Fast::Filled));
        let closed = windows(s.add_at(4.0, 15));
        assert_eq!(closed.len(), 1);
        assert_eq!((closed[0].count, closed[0].sum), (2, 3.0));
        // As after the two adds in either order: window 1's empty remainder
        // was closed last, so `get` reports zeros.
        assert_eq!(s.last_closed(), WindowStats::EMPTY);
        assert!(windows(s.add_locked(None, window)).is_empty());
        assert_eq!(s.last_closed(), WindowStats::EMPTY);
        assert_eq!(s.count(), 1);
        assert_eq!(s.flush().map(|w| w.sum), Some(4.0));
    }

    #[test]
    fn threads_lose_and_double_count_nothing_across_boundaries() {
        use std::sync::Arc;
        use std::sync::atomic::AtomicI64 as Clock;
        const THREADS: usize = 4;
        const ADDS: usize = 50_000;
        for max_samples in [i64::MAX, 7] {
            let stat = Arc::new(Stat::new(&[Sum, Count], 3, max_samples));
            let clock = Arc::new(Clock::new(0));
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let stat = Arc::clone(&stat);
                    let clock = Arc::clone(&clock);
                    std::thread::spawn(move || {
                        let mut windows = Vec::new();
                        for i in 0..ADDS {
                            if t == 0 && i % 97 == 0 {
                                clock.fetch_add(1, Ordering::Relaxed);
                            }
                            let now = clock.load(Ordering::Relaxed);
                            windows.extend(stat.add_at(1.0, now).iter().copied());
                        }
                        windows
                    })
                })
                .collect();
            let emitted: Vec<WindowStats> = handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect();
            let final_window = stat.flush();
            let total: u64 = emitted
                .iter()
                .chain(final_window.iter())
                .map(|w| w.count)
                .sum();
            for w in &emitted {
                assert_eq!(w.sum, w.count as f64, "sum and count agree per window");
                assert!(w.count <= stat.max_samples);
            }
            if max_samples == i64::MAX {
                assert_eq!(total, (THREADS * ADDS) as u64);
            } else {
                assert!(
                    total < (THREADS * ADDS) as u64,
                    "some samples must be dropped"
                );
            }
        }
    }

    /// A small deterministic generator, so the equivalence tests need no crate.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn sample(&mut self) -> f64 {
            match self.next() % 12 {
                0 => f64::NAN,
                1 => -0.0,
                2 => 0.0,
                3 => f64::INFINITY,
                4 => f64::NEG_INFINITY,
                5 => 1e308,
                6 => f64::MIN_POSITIVE / 4.0,
                _ => (self.next() % 2001) as f64 / 8.0 - 125.0,
            }
        }
    }

    fn same(a: &WindowStats, b: &WindowStats) -> bool {
        let eq = |x: f64, y: f64| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan());
        a.count == b.count
            && eq(a.sum, b.sum)
            && eq(a.min, b.min)
            && eq(a.max, b.max)
            && eq(a.last, b.last)
    }

    fn assert_same_stats(a: &Stat, b: &Stat, context: &str) {
        assert_eq!(a.count(), b.count(), "{context}: open count");
        let (pa, pb) = (a.last_closed(), b.last_closed());
        assert!(same(&pa, &pb), "{context}: last closed {pa:?} vs {pb:?}");
        assert_eq!(
            a.cur_id.load(Ordering::Relaxed),
            b.cur_id.load(Ordering::Relaxed),
            "{context}: window"
        );
    }

    #[test]
    fn add_many_is_the_loop_of_add_at() {
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        for round in 0..2000 {
            let max_samples = [1, 2, 3, 5, 17, i64::MAX][(rng.next() % 6) as usize];
            let window_ms = [1, 10, HOUR][(rng.next() % 3) as usize];
            let batched = Stat::new(&ALL, window_ms, max_samples);
            let looped = Stat::new(&ALL, window_ms, max_samples);
            let mut now = 0;
            for step in 0..8 {
                now += [0, 1, 5, 10, 25][(rng.next() % 5) as usize];
                let values: Vec<f64> = (0..rng.next() % 9).map(|_| rng.sample()).collect();
                let from_batch = windows(batched.add_many_at(values.len(), |i| values[i], now));
                let from_loop: Vec<WindowStats> = values
                    .iter()
                    .flat_map(|&v| windows(looped.add_at(v, now)))
                    .collect();
                let context = format!("round {round} step {step} {values:?} at {now}");
                assert_eq!(from_batch.len(), from_loop.len(), "{context}: events");
                for (a, b) in from_batch.iter().zip(&from_loop) {
                    assert!(same(a, b), "{context}: {a:?} vs {b:?}");
                }
                assert_same_stats(&batched, &looped, &context);
            }
            let (a, b) = (batched.flush(), looped.flush());
            assert_eq!(a.is_some(), b.is_some(), "round {round}: flush");
            if let (Some(a), Some(b)) = (a, b) {
                assert!(same(&a, &b), "round {round}: flush {a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn serialized_add_is_the_lock_free_add() {
        let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
        for round in 0..2000 {
            let max_samples = [1, 2, 3, 7, i64::MAX][(rng.next() % 5) as usize];
            let aggregations: Vec<Aggregation> = ALL
                .iter()
                .copied()
                .filter(|_| rng.next().is_multiple_of(2))
                .collect();
            let serialized = Stat::new(&aggregations, 10, max_samples);
            let lock_free = Stat::new(&aggregations, 10, max_samples);
            let mut now = 0;
            for step in 0..40 {
                now += [0, 0, 0, 3, 10, 30][(rng.next() % 6) as usize];
                let v = rng.sample();
                let a = windows(serialized.add_at_serialized(v, now));
                let b = windows(lock_free.add_at(v, now));
                let context = format!("round {round} step {step} {v} at {now}");
                assert_eq!(a.len(), b.len(), "{context}: events");
                for (x, y) in a.iter().zip(&b) {
                    assert!(same(x, y), "{context}: {x:?} vs {y:?}");
                }
                assert_same_stats(&serialized, &lock_free, &context);
            }
        }
    }

    /// Counts the heap allocations made by the current thread, so tests that
    /// run in parallel do not disturb each other's figures.
    struct CountingAllocator;

    thread_local! {
        static ALLOCATIONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    // SAFETY: every method forwards to the system allocator with the caller's
    // own arguments, so it upholds `GlobalAlloc`'s contract exactly as
    // `System` does; the counter is a const-initialised thread-local `Cell`
    // without a destructor, which neither allocates nor unwinds.
    unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
        unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
            ALLOCATIONS.with(|n| n.set(n.get() + 1));
            // SAFETY: forwarded with the caller's layout (see the impl).
            unsafe { std::alloc::System.alloc(layout) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
            // SAFETY: `ptr` came from `System.alloc` with this layout.
            unsafe { std::alloc::System.dealloc(ptr, layout) }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
            ALLOCATIONS.with(|n| n.set(n.get() + 1));
            // SAFETY: `ptr` came from `System` with `layout`; forwarded as is.
            unsafe { std::alloc::System.realloc(ptr, layout, new) }
        }
    }

    #[global_allocator]
    static COUNTING: CountingAllocator = CountingAllocator;

    fn allocations() -> u64 {
        ALLOCATIONS.with(|n| n.get())
    }

    #[test]
    fn add_never_allocates() {
        let unbounded = Stat::new(&ALL, 10, i64::MAX);
        let bounded = Stat::new(&ALL, 10, 3);
        let batch = [1.0, 2.0, f64::NAN, -0.0, 5.0];
        let before = allocations();
        for i in 0..100_000i64 {
            let now = i / 7; // windows close every 70 adds
            let v = (i % 13) as f64;
            black_box_closed(unbounded.add_at(v, now));
            black_box_closed(bounded.add_at(v, now));
            black_box_closed(unbounded.add_at_serialized(v, now));
            black_box_closed(bounded.add_at_serialized(v, now));
            if i % 100 == 0 {
                black_box_closed(bounded.add_many_at(batch.len(), |i| batch[i], now));
                std::hint::black_box(unbounded.last_closed());
                std::hint::black_box(unbounded.count());
            }
        }
        std::hint::black_box(unbounded.flush());
        let made = allocations() - before;
        assert_eq!(made, 0, "{made} heap allocations in 400,000 adds");
        // The counter itself works: a Vec allocates once.
        let before = allocations();
        std::hint::black_box(vec![1u8; 16]);
        assert_eq!(allocations() - before, 1);
    }

    fn black_box_closed(closed: Closed) {
        std::hint::black_box(closed.iter().count());
    }
}

#[cfg(all(test, loom))]
#[path = "stat_loom.rs"]
mod loom_tests;
