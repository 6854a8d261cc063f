//! The accumulators of one window buffer (`Phase`): how a sample is folded
//! into the sum, min, max and last value, and, for the extension
//! aggregations, the shifted sums and the histogram (`Extra`), lock-free or
//! serialised, one at a time or a batch. Which buffer is written, and when a window closes, is
//! decided in `stat` (the window switch).

use super::WindowStats;
use crate::aggregation::Needs;
use crate::histogram::{Distribution, Histogram, QUANTILE_THOUSANDTHS};
use crate::sync::{AtomicU64, Ordering};
use std::sync::Arc;

/// Placeholder for "no sample yet" in the min/max cells.
pub(super) const EMPTY_BITS: u64 = 0x7ff8_dead_beef_0001;
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

/// One buffer of accumulators (f64 values stored as bits).
pub(super) struct Phase {
    sum: AtomicU64,
    min: AtomicU64,
    max: AtomicU64,
    last: AtomicU64,
    /// Writers that claimed a slot in this buffer and are done with it.
    pub(super) finished: AtomicU64,
    /// Only when an extension aggregation is configured, so that a Stat of
    /// torch aggregations pays one null check for them.
    extra: Option<Box<Extra>>,
}

/// The accumulators of STDDEV and the P aggregations.
struct Extra {
    spread: bool,
    /// STDDEV's shift K: the window's first sample (`EMPTY_BITS` until it
    /// is folded). Sums of `x - K` keep the variance's cancellation small
    /// when the spread is tiny next to the values (1e9 + N(0, 1)).
    shift: AtomicU64,
    /// sum(x - K) and sum((x - K)^2), as f64 bits.
    s1: AtomicU64,
    s2: AtomicU64,
    histogram: Option<Histogram>,
}

impl Phase {
    pub(super) fn new(needs: Needs) -> Self {
        let extra = (needs.spread || needs.histogram).then(|| {
            Box::new(Extra {
                spread: needs.spread,
                shift: AtomicU64::new(EMPTY_BITS),
                s1: AtomicU64::new(0.0f64.to_bits()),
                s2: AtomicU64::new(0.0f64.to_bits()),
                histogram: needs.histogram.then(Histogram::new),
            })
        });
        Phase {
            sum: AtomicU64::new(0.0f64.to_bits()),
            min: AtomicU64::new(EMPTY_BITS),
            max: AtomicU64::new(EMPTY_BITS),
            last: AtomicU64::new(0.0f64.to_bits()),
            finished: AtomicU64::new(0),
            extra,
        }
    }

    /// Heap bytes of the extension accumulators (histogram blocks included).
    pub(super) fn extra_bytes(&self) -> usize {
        self.extra.as_deref().map_or(0, |extra| {
            size_of::<Extra>()
                + extra
                    .histogram
                    .as_ref()
                    .map_or(0, |h| h.allocated_bytes() - size_of::<Histogram>())
        })
    }

    #[inline]
    pub(super) fn fold(&self, needs: Needs, v: f64) {
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
        if let Some(extra) = self.extra.as_deref() {
            extra.fold::<false>(v);
        }
    }

    /// `fold` without read-modify-write instructions, for serialised callers.
    #[inline(always)]
    pub(super) fn fold_serialized(&self, needs: Needs, v: f64) {
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
        if let Some(extra) = self.extra.as_deref() {
            extra.fold::<true>(v);
        }
    }

    /// Folds `values` in order, as that many `fold`s would: one pass over
    /// the values from the accumulators' current contents, then one publish
    /// each. A publish that lost a race with a concurrent writer redoes that
    /// accumulator's pass from the value it found.
    pub(super) fn fold_many(&self, needs: Needs, len: usize, value_at: &impl Fn(usize) -> f64) {
        if len > 0
            && let Some(extra) = self.extra.as_deref()
        {
            extra.fold_many(len, value_at);
        }
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
    pub(super) fn take(&self, count: u64) -> WindowStats {
        let read_or_zero = |cell: &AtomicU64| {
            let bits = cell.swap(EMPTY_BITS, Ordering::Relaxed);
            if bits == EMPTY_BITS {
                0.0
            } else {
                f64::from_bits(bits)
            }
        };
        let mut window = WindowStats {
            count,
            sum: f64::from_bits(self.sum.swap(0.0f64.to_bits(), Ordering::Relaxed)),
            min: read_or_zero(&self.min),
            max: read_or_zero(&self.max),
            last: f64::from_bits(self.last.swap(0.0f64.to_bits(), Ordering::Relaxed)),
            ..WindowStats::EMPTY
        };
        if let Some(extra) = self.extra.as_deref() {
            extra.take(&mut window);
        }
        self.finished.store(0, Ordering::Relaxed);
        if count == 0 {
            WindowStats::EMPTY
        } else {
            window
        }
    }
}

impl Extra {
    #[inline(always)]
    fn fold<const SERIALIZED: bool>(&self, v: f64) {
        if self.spread {
            let seen = self.shift.load(Ordering::Relaxed);
            let shift = if seen != EMPTY_BITS {
                f64::from_bits(seen)
            } else if SERIALIZED {
                self.shift.store(sample_bits(v), Ordering::Relaxed);
                v
            } else {
                // The first writer to land sets K; the others use its K.
                match self.shift.compare_exchange(
                    EMPTY_BITS,
                    sample_bits(v),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => v,
                    Err(seen) => f64::from_bits(seen),
                }
            };
            let d = v - shift;
            add_f64::<SERIALIZED>(&self.s1, d);
            add_f64::<SERIALIZED>(&self.s2, d * d);
        }
        if let Some(histogram) = &self.histogram {
            histogram.record::<SERIALIZED>(v);
        }
    }

    /// `fold` of `len > 0` values in order, with the same sums as that many
    /// `fold`s (the same additions in the same order).
    fn fold_many(&self, len: usize, value_at: &impl Fn(usize) -> f64) {
        if self.spread {
            let first = value_at(0);
            let shift = match self.shift.compare_exchange(
                EMPTY_BITS,
                sample_bits(first),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => first,
                Err(seen) => f64::from_bits(seen),
            };
            publish(&self.s1, |s1| {
                (0..len).fold(s1, |s, i| s + (value_at(i) - shift))
            });
            publish(&self.s2, |s2| {
                (0..len).fold(s2, |s, i| {
                    let d = value_at(i) - shift;
                    s + d * d
                })
            });
        }
        if let Some(histogram) = &self.histogram {
            for i in 0..len {
                histogram.record::<false>(value_at(i));
            }
        }
    }

    /// Reads and empties the window's extension state into `window` (whose
    /// count, sum, min and max are already read).
    fn take(&self, window: &mut WindowStats) {
        if self.spread {
            self.shift.store(EMPTY_BITS, Ordering::Relaxed);
            let s1 = f64::from_bits(self.s1.swap(0.0f64.to_bits(), Ordering::Relaxed));
            let s2 = f64::from_bits(self.s2.swap(0.0f64.to_bits(), Ordering::Relaxed));
            window.stddev = stddev(window.count, s1, s2);
        }
        if let Some(histogram) = &self.histogram {
            let buckets = histogram.take();
            if window.count > 0 {
                let distribution = Distribution {
                    count: window.count,
                    sum: window.sum,
                    min: window.min,
                    max: window.max,
                    buckets,
                };
                for (out, k) in window.quantiles.iter_mut().zip(QUANTILE_THOUSANDTHS) {
                    *out = distribution.quantile_thousandths(k);
                }
                window.distribution = Some(Arc::new(distribution));
            }
        }
    }
}

/// The population standard deviation from the shifted sums (docs/api.md):
/// 0 for no sample, NaN when a sample was NaN or infinite.
fn stddev(count: u64, s1: f64, s2: f64) -> f64 {
    if count == 0 {
        return 0.0;
    }
    let n = count as f64;
    // `s1 * (s1 / n)`, not `s1 * s1 / n`: s1^2/n <= s2, so it overflows only
    // when s2 does, where s1 * s1 alone overflows for deviations ~1e154.
    let variance = (s2 - s1 * (s1 / n)) / n;
    if variance.is_nan() {
        f64::NAN
    } else {
        variance.max(0.0).sqrt()
    }
}

/// `cell += x` for f64 bits: a plain load and store for a serialised
/// caller, else a compare-and-swap loop.
#[inline(always)]
fn add_f64<const SERIALIZED: bool>(cell: &AtomicU64, x: f64) {
    if SERIALIZED {
        let sum = f64::from_bits(cell.load(Ordering::Relaxed)) + x;
        cell.store(sum.to_bits(), Ordering::Relaxed);
    } else {
        publish(cell, |current| current + x);
    }
}

/// Replaces the f64 in `cell` by `next(current)`, recomputed from the value
/// a racing writer left when the compare-and-swap loses.
#[inline(always)]
fn publish(cell: &AtomicU64, next: impl Fn(f64) -> f64) {
    let mut current = cell.load(Ordering::Relaxed);
    loop {
        let replacement = next(f64::from_bits(current)).to_bits();
        match cell.compare_exchange_weak(current, replacement, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => return,
            Err(seen) => current = seen,
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
