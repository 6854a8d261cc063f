//! A distribution Stat's cumulative state (`Cumulative`: every closed
//! window's scale-6 buckets added up) and the two histograms a scrape reads
//! from it: the native one at the highest schema that fits the bucket limit
//! (`Cumulative::native`, the Prometheus spec's resolution reduction) and
//! the classic one at a handler's bounds (`Cumulative::classic`). No
//! encoding here: `protobuf` and `text` write what these return.

use std::collections::BTreeMap;

use crate::histogram::{Distribution, MAX_INDEX, MIN_INDEX, SCALE, bucket_index};

/// Values with `|x| <= ZERO_THRESHOLD` are counted in the zero bucket: 2**-128,
/// client_golang's and client_java's default, so that histograms from those
/// clients and ours add up bucket for bucket. Being above 0 also marks the
/// histogram as native for every Prometheus version that ingests them.
pub const ZERO_THRESHOLD: f64 = 2.938_735_877_055_719e-39;
/// The last torchmon bucket inside the zero bucket: bucket `i` ends at
/// `2**((i+1)/64)`, and `2**(-8192/64)` is `ZERO_THRESHOLD`.
const LAST_ZERO_INDEX: i32 = -8193;
/// The Prometheus spec's lowest schema: resolution reduction stops there.
pub const MIN_SCHEMA: i32 = -4;
/// The Prometheus bucket (schema 6) the infinities are counted in: the top
/// one, `(2**(65535/64), 2**1024]`, since a native histogram has no
/// infinity bucket.
const INFINITY_KEY: i32 = MAX_INDEX + 1;

/// Every sample of every window of one Stat: torchmon's scale-6 buckets
/// (bucket `i` holds `2**(i/64) < |x| <= 2**((i+1)/64)`) and the special
/// counters, added window by window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cumulative {
    pub zero_count: u64,
    pub positive_inf_count: u64,
    pub negative_inf_count: u64,
    pub positive: BTreeMap<i32, u64>,
    pub negative: BTreeMap<i32, u64>,
    /// The windows' finite sums (a window with a NaN or infinite sample
    /// adds nothing, as the classic `_sum`).
    pub sum: f64,
}

impl Cumulative {
    /// Adds a window's distribution (`add_window` with its parts).
    pub fn add_distribution(&mut self, window: &Distribution) {
        let b = &window.buckets;
        let (positive, negative) = (b.positive.iter().copied(), b.negative.iter().copied());
        let (zero, pinf, ninf) = (b.zero_count, b.positive_inf_count, b.negative_inf_count);
        self.add_window(window.sum, zero, pinf, ninf, positive, negative);
    }

    /// Adds one window; `sum` is the window's SUM. Bucket indices outside
    /// torchmon's range are clamped into it (the binding checks types only).
    pub fn add_window(
        &mut self,
        sum: f64,
        zero_count: u64,
        positive_inf_count: u64,
        negative_inf_count: u64,
        positive: impl IntoIterator<Item = (i32, u64)>,
        negative: impl IntoIterator<Item = (i32, u64)>,
    ) {
        self.zero_count = self.zero_count.saturating_add(zero_count);
        self.positive_inf_count = self.positive_inf_count.saturating_add(positive_inf_count);
        self.negative_inf_count = self.negative_inf_count.saturating_add(negative_inf_count);
        add_buckets(&mut self.positive, positive);
        add_buckets(&mut self.negative, negative);
        if sum.is_finite() {
            self.sum += sum;
        }
    }

    /// The samples in buckets: every one but NaN.
    pub fn count(&self) -> u64 {
        let buckets =
            |side: &BTreeMap<i32, u64>| side.values().fold(0u64, |a, &c| a.saturating_add(c));
        self.zero_count
            .saturating_add(self.positive_inf_count)
            .saturating_add(self.negative_inf_count)
            .saturating_add(buckets(&self.positive))
            .saturating_add(buckets(&self.negative))
    }

    /// The native histogram at the highest schema (6 down to `MIN_SCHEMA`)
    /// whose populated buckets, both signs, number at most `max_buckets`:
    /// the Prometheus spec's resolution reduction, each step merging bucket
    /// pairs (`k` at schema `s` is `ceil(k/2)` at `s - 1`). A histogram that
    /// still has more at `MIN_SCHEMA` is exposed at `MIN_SCHEMA`.
    pub fn native(&self, max_buckets: usize) -> Native {
        let mut zero_count = self.zero_count;
        // Prometheus bucket k (schema 6) is (2**((k-1)/64), 2**(k/64)]: torchmon's i + 1.
        let mut side = |buckets: &BTreeMap<i32, u64>, infinities: u64| {
            let mut keyed: Vec<(i32, u64)> = Vec::with_capacity(buckets.len() + 1);
            for (&index, &count) in buckets {
                if index <= LAST_ZERO_INDEX {
                    zero_count = zero_count.saturating_add(count);
                } else {
                    keyed.push((index + 1, count));
                }
            }
            if infinities > 0 {
                match keyed.last_mut() {
                    Some((key, count)) if *key == INFINITY_KEY => {
                        *count = count.saturating_add(infinities)
                    }
                    _ => keyed.push((INFINITY_KEY, infinities)),
                }
            }
            keyed
        };
        let mut positive = side(&self.positive, self.positive_inf_count);
        let mut negative = side(&self.negative, self.negative_inf_count);
        let mut schema = SCALE;
        while positive.len() + negative.len() > max_buckets && schema > MIN_SCHEMA {
            halve(&mut positive);
            halve(&mut negative);
            schema -= 1;
        }
        Native {
            schema,
            count: self.count(),
            sum: self.sum,
            zero_count,
            positive,
            negative,
        }
    }

    /// Cumulative counts at the classic bounds of `layout`, without `+Inf`
    /// (the count): the text exposition's buckets and a collector's.
    pub fn classic(&self, layout: &ClassicLayout) -> Vec<(f64, u64)> {
        let mut counts = vec![0u64; layout.uppers.len()];
        let top = counts.len() as i64 - 1;
        for (&index, &count) in &self.positive {
            let j = i64::from(index >> layout.shift.min(31)) - i64::from(layout.first);
            if let Some(slot) = (j <= top)
                .then(|| counts.get_mut(j.max(0) as usize))
                .flatten()
            {
                *slot = slot.saturating_add(count);
            }
        }
        let mut below = self.negative.values().fold(
            self.zero_count.saturating_add(self.negative_inf_count),
            |a, &c| a.saturating_add(c),
        );
        let mut out = Vec::with_capacity(counts.len() + 1);
        out.push((0.0, below));
        for (&le, count) in layout.uppers.iter().zip(counts) {
            below = below.saturating_add(count);
            out.push((le, below));
        }
        out
    }
}

fn add_buckets(side: &mut BTreeMap<i32, u64>, buckets: impl IntoIterator<Item = (i32, u64)>) {
    for (index, count) in buckets {
        if count > 0 {
            let slot = side.entry(index.clamp(MIN_INDEX, MAX_INDEX)).or_insert(0);
            *slot = slot.saturating_add(count);
        }
    }
}

/// Merges pairs of adjacent buckets: one schema lower.
fn halve(buckets: &mut Vec<(i32, u64)>) {
    let mut merged: Vec<(i32, u64)> = Vec::with_capacity(buckets.len());
    for &(key, count) in buckets.iter() {
        // ceil(key / 2), for negative keys too.
        let key = (key + 1) >> 1;
        match merged.last_mut() {
            Some((last, total)) if *last == key => *total = total.saturating_add(count),
            _ => merged.push((key, count)),
        }
    }
    *buckets = merged;
}

/// A native histogram as exposed: Prometheus bucket keys at `schema`,
/// ascending.
#[derive(Clone, Debug, PartialEq)]
pub struct Native {
    pub schema: i32,
    pub count: u64,
    pub sum: f64,
    pub zero_count: u64,
    pub positive: Vec<(i32, u64)>,
    pub negative: Vec<(i32, u64)>,
}

/// The fixed classic bounds of a handler's histograms: positive bound `j`
/// counts the torchmon buckets whose `index >> shift` is `first + j` or
/// below. Ranks sum their histograms by `le` in PromQL, so every rank must
/// expose the same bounds whatever its data: a rank missing a bound adds
/// nothing to that bound's sum, and the summed counts stop being a
/// histogram (docs/sinks.md, "Histograms of the P aggregations").
#[derive(Clone, Debug, PartialEq)]
pub struct ClassicLayout {
    pub shift: u32,
    pub first: i32,
    pub uppers: Vec<f64>,
}

impl ClassicLayout {
    /// The bounds of `per_octave` (dividing 64) per power of two from the
    /// largest one at or below `lo` to the smallest at or above `hi`
    /// (`0 < lo < hi`, finite); `None` for anything else. A bound is the
    /// largest double of its group of `64 / per_octave` buckets, so that
    /// `x <= le` holds exactly for the samples of that group and below and
    /// the counts are exact.
    pub fn new(per_octave: u32, lo: f64, hi: f64) -> Option<ClassicLayout> {
        if per_octave == 0 || 64 % per_octave != 0 || !(0.0 < lo && lo < hi && hi.is_finite()) {
            return None;
        }
        let shift = (64 / per_octave).trailing_zeros();
        let group_upper = |group: i32| {
            let last = ((i64::from(group) + 1) << shift) - 1;
            upper(last.clamp(i64::from(MIN_INDEX) - 1, i64::from(MAX_INDEX)) as i32)
        };
        let mut first = bucket_index(lo.to_bits()) >> shift;
        if group_upper(first) != lo {
            first -= 1; // lo lies inside its group: the bound below it
        }
        if group_upper(first) == 0.0 {
            first += 1; // lo in the lowest group: no positive bound below it
        }
        let last = bucket_index(hi.to_bits()) >> shift;
        let uppers = (first..=last).map(group_upper).collect();
        Some(ClassicLayout {
            shift,
            first,
            uppers,
        })
    }
}

/// The largest double in bucket `index` or below (`2**((index+1)/64)`
/// rounded down; 0.0 below the subnormals): `bucket_index` grows with the
/// bits of a positive double, so a binary search over them finds it exactly.
fn upper(index: i32) -> f64 {
    if index < MIN_INDEX {
        return 0.0;
    }
    if index >= MAX_INDEX {
        return f64::MAX;
    }
    // bucket_index(low) <= index < bucket_index(high) throughout.
    let (mut low, mut high) = (1u64, f64::MAX.to_bits());
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        if bucket_index(mid) <= index {
            low = mid;
        } else {
            high = mid;
        }
    }
    f64::from_bits(low)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index_of(x: f64) -> i32 {
        bucket_index(x.abs().to_bits())
    }

    fn cumulative_of(values: &[f64]) -> Cumulative {
        let mut c = Cumulative::default();
        let mut positive = BTreeMap::new();
        let mut negative = BTreeMap::new();
        let (mut zero, mut pinf, mut ninf) = (0, 0, 0);
        for &v in values {
            if v == 0.0 {
                zero += 1;
            } else if v == f64::INFINITY {
                pinf += 1;
            } else if v == f64::NEG_INFINITY {
                ninf += 1;
            } else if v > 0.0 {
                *positive.entry(index_of(v)).or_insert(0) += 1;
            } else {
                *negative.entry(index_of(v)).or_insert(0) += 1;
            }
        }
        c.add_window(values.iter().sum(), zero, pinf, ninf, positive, negative);
        c
    }

    #[test]
    fn prometheus_keys_are_torchmon_indices_plus_one() {
        // 1.0 is the top of torchmon bucket -1 and of Prometheus bucket 0;
        // 2.0 of torchmon 63, Prometheus 64.
        let native = cumulative_of(&[1.0, 2.0, -2.0, 0.0]).native(160);
        assert_eq!(native.schema, 6);
        assert_eq!(native.positive, vec![(0, 1), (64, 1)]);
        assert_eq!(native.negative, vec![(64, 1)]);
        assert_eq!(native.zero_count, 1);
        assert_eq!(native.count, 4);
        assert_eq!(native.sum, 1.0);
    }

    #[test]
    fn values_at_or_below_the_zero_threshold_count_as_zeros() {
        let native = cumulative_of(&[
            ZERO_THRESHOLD,
            -ZERO_THRESHOLD,
            1e-300,
            ZERO_THRESHOLD * 1.01,
        ])
        .native(160);
        assert_eq!(native.zero_count, 3);
        assert_eq!(native.positive, vec![(-8191, 1)]);
        assert!(native.negative.is_empty());
    }

    #[test]
    fn infinities_go_to_the_top_bucket_and_count() {
        let native = cumulative_of(&[f64::INFINITY, f64::MAX, f64::NEG_INFINITY]).native(160);
        assert_eq!(native.positive, vec![(INFINITY_KEY, 2)]);
        assert_eq!(native.negative, vec![(INFINITY_KEY, 1)]);
        assert_eq!(native.count, 3);
    }

    #[test]
    fn resolution_is_reduced_until_the_buckets_fit() {
        // 1..=1000: one bucket per distinct scale-6 bucket, far above 20.
        let values: Vec<f64> = (1..=1000).map(f64::from).collect();
        let full = cumulative_of(&values);
        let native = full.native(20);
        assert!(native.positive.len() <= 20, "{native:?}");
        let at_six = full.native(usize::MAX);
        // Each reduction keeps every sample and maps keys as ceil(k / 2**steps).
        let steps = 6 - native.schema;
        assert!(steps > 0);
        let mut expected: BTreeMap<i32, u64> = BTreeMap::new();
        for &(key, count) in &at_six.positive {
            let mut k = key;
            for _ in 0..steps {
                k = (k + 1).div_euclid(2);
            }
            *expected.entry(k).or_insert(0) += count;
        }
        assert_eq!(native.positive, expected.into_iter().collect::<Vec<_>>());
        // And the one before it did not fit.
        let one_finer = native.positive.len();
        assert!(one_finer <= 20);
        assert_eq!(full.native(1).schema, MIN_SCHEMA);
    }

    #[test]
    fn halving_is_ceil_of_half_for_negative_keys() {
        let mut keys = vec![(-3, 1), (-2, 1), (-1, 1), (0, 1), (1, 1), (2, 1)];
        halve(&mut keys);
        assert_eq!(keys, vec![(-1, 2), (0, 2), (1, 2)]);
    }

    #[test]
    fn classic_counts_match_the_text_layout_rule() {
        // Four bounds per octave (shift 4), from group -5 (ending at 0.5)
        // upwards; the bounds are only labels here (counts go by group).
        let layout = ClassicLayout {
            shift: 4,
            first: -5,
            uppers: vec![0.5, 0.5946, 0.7, 0.8409, 1.0],
        };
        let c = cumulative_of(&[-5.0, 0.0, 0.1, 1.0, 3.0, f64::INFINITY]);
        assert_eq!(
            c.classic(&layout),
            vec![
                (0.0, 2),
                (0.5, 3),
                (0.5946, 3),
                (0.7, 3),
                (0.8409, 3),
                (1.0, 4)
            ]
        );
    }

    #[test]
    fn the_classic_layout_is_exact_and_refuses_what_it_cannot_render() {
        // Four bounds per octave from 2**-2 to 2**2: exact powers are bounds.
        let layout = ClassicLayout::new(4, 0.25, 4.0).unwrap();
        assert_eq!(layout.shift, 4);
        assert_eq!(layout.uppers.len(), 17);
        assert_eq!(layout.uppers[0], 0.25);
        assert_eq!(layout.uppers[4], 0.5);
        assert_eq!(layout.uppers[16], 4.0);
        for pair in layout.uppers.windows(2) {
            // Each bound is the last double of its group: the next one is in the next group.
            let (a, b) = (pair[0], pair[1]);
            assert!(a < b);
            assert_eq!(
                (bucket_index(a.to_bits()) >> 4) + 1,
                bucket_index(a.next_up().to_bits()) >> 4
            );
        }
        // lo inside a group: the bound below it.
        assert_eq!(
            ClassicLayout::new(1, 3.0, 8.0).unwrap().uppers,
            [2.0, 4.0, 8.0]
        );
        assert_eq!(
            ClassicLayout::new(1, 5e-324, 1.0).unwrap().uppers[0],
            5e-324
        );
        assert_eq!(
            ClassicLayout::new(1, 1.5e-323, 1.0).unwrap().uppers[0],
            1e-323
        );
        assert_eq!(upper(MAX_INDEX), f64::MAX);
        for (per_octave, lo, hi) in [(3, 1.0, 2.0), (0, 1.0, 2.0), (4, 2.0, 1.0), (4, 0.0, 1.0)] {
            assert_eq!(ClassicLayout::new(per_octave, lo, hi), None);
        }
        assert_eq!(ClassicLayout::new(4, 1.0, f64::INFINITY), None);
    }
}
