//! The per-window histogram behind the P aggregations: base-2 exponential
//! buckets at scale 6 (64 per octave; OpenTelemetry's ExponentialHistogram
//! and Prometheus's native-histogram schema 6), so that windows, files and
//! ranks merge by adding counts.
//!
//! Bucket `i` holds the `x` with `2^(i/64) < |x| <= 2^((i+1)/64)`, exact at
//! the boundaries (`2^k` is in bucket `64k - 1`). The index comes from the
//! float's bits by the OpenTelemetry specification's table lookup, without a
//! logarithm: the exponent gives the octave, and the 52-bit mantissa is
//! compared with the 63 sub-boundaries of an octave (`BOUNDARIES`, exact;
//! a 128-entry table of its top 7 bits leaves one comparison). Positive and
//! negative values have their own buckets (by `|x|`); zero, NaN and the
//! infinities are counted apart.
//!
//! Storage (docs/internals.md): 64 counters per octave touched, in blocks
//! allocated the first time a sample lands in that octave and installed
//! with one compare-and-swap, reached through a fixed table of groups of 32
//! block pointers. Blocks live as long as the histogram (the window close
//! zeroes what it reads), so once a window's octaves exist an add is a few
//! loads and one counter increment: no allocation, no lock.
//!
//! The tables are printed by tools/gen_histogram_tables.py (exact integer
//! arithmetic); the tests below prove them from scratch.

use crate::decimal::{self, python_repr};
use crate::sync::{AtomicPtr, AtomicU64, Ordering};
use std::{fmt, ptr};

/// Buckets per octave are `2^SCALE`.
pub const SCALE: i32 = 6;
/// The bucket of the smallest subnormal, `2^-1074` (a power of two: the
/// upper bound of bucket `64 * -1074 - 1`).
pub const MIN_INDEX: i32 = 64 * -1074 - 1;
/// The bucket of `f64::MAX`.
pub const MAX_INDEX: i32 = 64 * 1023 + 63;

const MANTISSA_MASK: u64 = (1 << 52) - 1;
const SIGN_BIT: u64 = 1 << 63;
const INFINITY_BITS: u64 = 0x7ff0_0000_0000_0000;

/// `BOUNDARIES[j]` = floor((2^(j/64) - 1) * 2^52) for j in 1..=63.
const BOUNDARIES: [u64; 65] = [
    0,
    0x02c9a3e778060,
    0x059b0d3158574,
    0x0874518759bc8,
    0x0b5586cf9890f,
    0x0e3ec32d3d1a2,
    0x11301d0125b50,
    0x1429aaea92ddf,
    0x172b83c7d517a,
    0x1a35beb6fcb75,
    0x1d4873168b9aa,
    0x2063b88628cd6,
    0x2387a6e756238,
    0x26b4565e27cdd,
    0x29e9df51fdee1,
    0x2d285a6e4030b,
    0x306fe0a31b715,
    0x33c08b26416ff,
    0x371a7373aa9ca,
    0x3a7db34e59ff6,
    0x3dea64c123422,
    0x4160a21f72e29,
    0x44e086061892d,
    0x486a2b5c13cd0,
    0x4bfdad5362a27,
    0x4f9b2769d2ca6,
    0x5342b569d4f81,
    0x56f4736b527da,
    0x5ab07dd485429,
    0x5e76f15ad2148,
    0x6247eb03a5584,
    0x6623882552224,
    0x6a09e667f3bcc,
    0x6dfb23c651a2e,
    0x71f75e8ec5f73,
    0x75feb564267c8,
    0x7a11473eb0186,
    0x7e2f336cf4e62,
    0x82589994cce12,
    0x868d99b4492ec,
    0x8ace5422aa0db,
    0x8f1ae99157736,
    0x93737b0cdc5e4,
    0x97d829fde4e4f,
    0x9c49182a3f090,
    0xa0c667b5de564,
    0xa5503b23e255c,
    0xa9e6b5579fdbf,
    0xae89f995ad3ad,
    0xb33a2b84f15fa,
    0xb7f76f2fb5e46,
    0xbcc1e904bc1d2,
    0xc199bdd85529c,
    0xc67f12e57d14b,
    0xcb720dcef9069,
    0xd072d4a07897b,
    0xd5818dcfba487,
    0xda9e603db3285,
    0xdfc97337b9b5e,
    0xe502ee78b3ff6,
    0xea4afa2a490d9,
    0xefa1bee615a27,
    0xf50765b6e4540,
    0xfa7c1819e90d8,
    // Sentinel: no 52-bit mantissa exceeds it.
    1 << 52,
];
/// The bits of `MIDPOINTS`.
const MIDPOINT_BITS: [u64; 64] = [
    0x3ff0163da9fb3335,
    0x3ff04315e86e7f85,
    0x3ff0706b29ddf6de,
    0x3ff09e3ecac6f383,
    0x3ff0cc922b7247f7,
    0x3ff0fb66affed31b,
    0x3ff12abdc06c31cc,
    0x3ff15a98c8a58e51,
    0x3ff18af9388c8dea,
    0x3ff1bbe084045cd4,
    0x3ff1ed5022fcd91d,
    0x3ff21f49917ddc96,
    0x3ff251ce4fb2a63f,
    0x3ff284dfe1f56381,
    0x3ff2b87fd0dad990,
    0x3ff2ecafa93e2f56,
    0x3ff32170fc4cd831,
    0x3ff356c55f929ff1,
    0x3ff38cae6d05d866,
    0x3ff3c32dc313a8e5,
    0x3ff3fa4504ac801c,
    0x3ff431f5d950a897,
    0x3ff46a41ed1d0057,
    0x3ff4a32af0d7d3de,
    0x3ff4dcb299fddd0d,
    0x3ff516daa2cf6642,
    0x3ff551a4ca5d920f,
    0x3ff58d12d497c7fd,
    0x3ff5c9268a5946b7,
    0x3ff605e1b976dc09,
    0x3ff6434634ccc320,
    0x3ff68155d44ca973,
    0x3ff6c012750bdabf,
    0x3ff6ff7df9519484,
    0x3ff73f9a48a58174,
    0x3ff780694fde5d3f,
    0x3ff7c1ed0130c132,
    0x3ff80427543e1a12,
    0x3ff8471a4623c7ad,
    0x3ff88ac7d98a6699,
    0x3ff8cf3216b5448c,
    0x3ff9145b0b91ffc6,
    0x3ff95a44cbc8520f,
    0x3ff9a0f170ca07ba,
    0x3ff9e86319e32323,
    0x3ffa309bec4a2d33,
    0x3ffa799e1330b358,
    0x3ffac36bbfd3f37a,
    0x3ffb0e07298db666,
    0x3ffb59728de5593a,
    0x3ffba5b030a1064a,
    0x3ffbf2c25bd71e09,
    0x3ffc40ab5fffd07a,
    0x3ffc8f6d9406e7b5,
    0x3ffcdf0b555dc3fa,
    0x3ffd2f87080d89f2,
    0x3ffd80e316c98398,
    0x3ffdd321f301b460,
    0x3ffe264614f5a129,
    0x3ffe7a51fbc74c83,
    0x3ffecf482d8e67f1,
    0x3fff252b376bba97,
    0x3fff7bfdad9cbe14,
    0x3fffd3c22b8f71f1,
];

/// `MIDPOINTS[j]`: the double nearest to `2^((j + 0.5)/64)`, the value a
/// quantile reports for bucket `j` of octave 0 (docs/api.md).
pub const MIDPOINTS: [f64; 64] = {
    let mut out = [0.0; 64];
    let mut j = 0;
    while j < 64 {
        out[j] = f64::from_bits(MIDPOINT_BITS[j]);
        j += 1;
    }
    out
};

/// `SEGMENT[t]`: how many boundaries lie below the mantissas whose top 7
/// bits are `t`. A segment holds at most one boundary (they are more than
/// 2^52/128 apart; tested), so one comparison finishes the count.
const SEGMENT: [u8; 128] = {
    let mut out = [0u8; 128];
    let mut t = 0;
    while t < 128 {
        let mut below = 0;
        let mut j = 1;
        while j < 64 {
            if BOUNDARIES[j] < (t as u64) << 45 {
                below += 1;
            }
            j += 1;
        }
        out[t] = below;
        t += 1;
    }
    out
};

/// The bucket of a finite nonzero `|x|`, given as its bits (sign clear).
#[inline(always)]
pub fn bucket_index(magnitude_bits: u64) -> i32 {
    let biased = (magnitude_bits >> 52) as i32;
    let mut mantissa = magnitude_bits & MANTISSA_MASK;
    let exponent = if biased == 0 {
        // Subnormal: normalise, so that the same tables apply.
        let top = 63 - mantissa.leading_zeros() as i32;
        mantissa = (mantissa << (52 - top)) & MANTISSA_MASK;
        top - 1074
    } else {
        biased - 1023
    };
    let below = u32::from(SEGMENT[(mantissa >> 45) as usize]);
    let sub = below + u32::from(mantissa > BOUNDARIES[below as usize + 1]);
    // An exact power of two is the upper bound of the bucket below.
    (exponent << SCALE) + sub as i32 - i32::from(mantissa == 0)
}

/// `ldexp(MIDPOINTS[i mod 64], i div 64)`, rounded once, moved one ulp
/// into bucket `i` if the rounding (of a subnormal) left it: the value a
/// quantile reports for a sample of positive bucket `i` (docs/api.md).
pub fn representative(index: i32) -> f64 {
    let octave = index.div_euclid(64);
    let mid = MIDPOINTS[index.rem_euclid(64) as usize];
    let value = if octave >= -1022 {
        // Exact: only the exponent field changes (octave <= 1023).
        f64::from_bits(mid.to_bits().wrapping_add(((octave as i64) << 52) as u64))
    } else {
        // `mid * 2^-1022` is exact; the second product rounds once.
        let normal = f64::from_bits(mid.to_bits() - (1022u64 << 52));
        normal * f64::from_bits(((octave + 1022 + 1023) as u64) << 52)
    };
    let bucket = bucket_index(value.to_bits());
    if bucket < index {
        value.next_up()
    } else if bucket > index {
        value.next_down()
    } else {
        value
    }
}

/// The octave of `MIN_INDEX`; octaves are stored from here.
const OCTAVE_MIN: i32 = MIN_INDEX >> SCALE;
const OCTAVES: usize = ((MAX_INDEX >> SCALE) - OCTAVE_MIN + 1) as usize;
const BLOCKS_PER_GROUP: usize = 32;
const GROUPS: usize = OCTAVES.div_ceil(BLOCKS_PER_GROUP);

/// The 64 counters of one octave.
struct Block([AtomicU64; 64]);

/// Pointers to the blocks of 32 consecutive octaves (null: none yet).
struct Group([AtomicPtr<Block>; BLOCKS_PER_GROUP]);

/// The buckets of one sign.
struct Side([AtomicPtr<Group>; GROUPS]);

impl Block {
    fn new() -> Box<Self> {
        Box::new(Block(std::array::from_fn(|_| AtomicU64::new(0))))
    }
}

impl Group {
    fn new() -> Box<Self> {
        Box::new(Group(std::array::from_fn(|_| {
            AtomicPtr::new(ptr::null_mut())
        })))
    }
}

/// The object `slot` points to, installing `make()`'s if it is null.
///
/// Racing installers each allocate; the one whose compare-and-swap lands
/// wins and the others free theirs. Only the first sample of an octave (per
/// window buffer, for the life of the Stat) comes here.
#[cold]
#[inline(never)]
fn install<T>(slot: &AtomicPtr<T>, make: fn() -> Box<T>) -> &T {
    let fresh = Box::into_raw(make());
    match slot.compare_exchange(ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: `fresh` came from `Box::into_raw` and is now owned by
        // `slot`, which frees it only in `Side::drop` (that needs `&mut`,
        // so no borrow of `slot`, hence none of the result, is alive then).
        Ok(_) => unsafe { &*fresh },
        Err(seen) => {
            // SAFETY: the compare-and-swap failed, so `fresh` was never
            // published: this is its only pointer, from `Box::into_raw`.
            drop(unsafe { Box::from_raw(fresh) });
            // SAFETY: `seen` is non-null (the swap only fails on a non-null
            // value) and was published by another `install`'s successful
            // swap (Acquire pairs with its AcqRel, so the pointee is fully
            // written); it lives until `Side::drop`, as above.
            unsafe { &*seen }
        }
    }
}

/// `slot`'s object, or `None` while it is null.
#[inline(always)]
fn installed<T>(slot: &AtomicPtr<T>) -> Option<&T> {
    let pointer = slot.load(Ordering::Acquire);
    // SAFETY: a non-null pointer in a slot was published by `install` (the
    // Acquire load pairs with its swap) and is freed only by `Side::drop`,
    // which needs `&mut` of the side that `slot` borrows from.
    unsafe { pointer.as_ref() }
}

impl Side {
    fn new() -> Self {
        Side(std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())))
    }

    /// The counter of bucket `index` (`MIN_INDEX..=MAX_INDEX`).
    #[inline(always)]
    fn counter(&self, index: i32) -> &AtomicU64 {
        let octave = ((index >> SCALE) - OCTAVE_MIN) as usize;
        let group_slot = &self.0[octave / BLOCKS_PER_GROUP];
        let group = match installed(group_slot) {
            Some(group) => group,
            None => install(group_slot, Group::new),
        };
        let block_slot = &group.0[octave % BLOCKS_PER_GROUP];
        let block = match installed(block_slot) {
            Some(block) => block,
            None => install(block_slot, Block::new),
        };
        &block.0[(index & 63) as usize]
    }

    /// Appends `(index, count)` for every nonzero counter, ascending, and
    /// zeroes them.
    fn drain(&self, out: &mut Vec<(i32, u64)>) {
        for (g, group_slot) in self.0.iter().enumerate() {
            let Some(group) = installed(group_slot) else {
                continue;
            };
            for (b, block_slot) in group.0.iter().enumerate() {
                let Some(block) = installed(block_slot) else {
                    continue;
                };
                let octave = (g * BLOCKS_PER_GROUP + b) as i32 + OCTAVE_MIN;
                for (sub, counter) in block.0.iter().enumerate() {
                    if counter.load(Ordering::Relaxed) != 0 {
                        let count = counter.swap(0, Ordering::Relaxed);
                        out.push(((octave << SCALE) + sub as i32, count));
                    }
                }
            }
        }
    }

    /// Bytes of the groups and blocks allocated so far.
    fn allocated_bytes(&self) -> usize {
        let mut bytes = 0;
        for group_slot in &self.0 {
            if let Some(group) = installed(group_slot) {
                bytes += size_of::<Group>();
                bytes +=
                    group.0.iter().filter(|b| installed(b).is_some()).count() * size_of::<Block>();
            }
        }
        bytes
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        for group_slot in &self.0 {
            let group = group_slot.load(Ordering::Relaxed);
            if group.is_null() {
                continue;
            }
            // SAFETY: non-null slots hold pointers from `Box::into_raw`
            // (`install`), each published to exactly one slot; `&mut self`
            // means no reference obtained through the slots is alive.
            let group = unsafe { Box::from_raw(group) };
            for block_slot in &group.0 {
                let block = block_slot.load(Ordering::Relaxed);
                if !block.is_null() {
                    // SAFETY: as for the group above.
                    drop(unsafe { Box::from_raw(block) });
                }
            }
        }
    }
}

/// One window buffer's histogram.
pub struct Histogram {
    positive: Side,
    negative: Side,
    zero: AtomicU64,
    nan: AtomicU64,
    positive_inf: AtomicU64,
    negative_inf: AtomicU64,
}

/// What `Histogram::take` read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Buckets {
    pub zero_count: u64,
    pub nan_count: u64,
    pub positive_inf_count: u64,
    pub negative_inf_count: u64,
    pub positive: Vec<(i32, u64)>,
    pub negative: Vec<(i32, u64)>,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Histogram {
    pub fn new() -> Self {
        Histogram {
            positive: Side::new(),
            negative: Side::new(),
            zero: AtomicU64::new(0),
            nan: AtomicU64::new(0),
            positive_inf: AtomicU64::new(0),
            negative_inf: AtomicU64::new(0),
        }
    }

    /// Counts `v`. `SERIALIZED`: the caller guarantees no concurrent
    /// `record` (see `Stat::add_serialized`): a plain load and store instead
    /// of a read-modify-write.
    #[inline(always)]
    pub fn record<const SERIALIZED: bool>(&self, v: f64) {
        let bits = v.to_bits();
        let magnitude = bits & !SIGN_BIT;
        // Zero, infinities and NaN: the magnitudes 0 and >= INFINITY_BITS.
        let counter = if magnitude.wrapping_sub(1) >= INFINITY_BITS - 1 {
            self.special(v)
        } else if bits & SIGN_BIT == 0 {
            self.positive.counter(bucket_index(magnitude))
        } else {
            self.negative.counter(bucket_index(magnitude))
        };
        if SERIALIZED {
            counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        } else {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[inline(never)]
    fn special(&self, v: f64) -> &AtomicU64 {
        if v == 0.0 {
            &self.zero
        } else if v == f64::INFINITY {
            &self.positive_inf
        } else if v == f64::NEG_INFINITY {
            &self.negative_inf
        } else {
            &self.nan
        }
    }

    /// Reads every count and zeroes it (the allocated blocks stay). Only
    /// the closer calls this, after every writer of the buffer finished.
    pub fn take(&self) -> Buckets {
        let mut buckets = Buckets {
            zero_count: self.zero.swap(0, Ordering::Relaxed),
            nan_count: self.nan.swap(0, Ordering::Relaxed),
            positive_inf_count: self.positive_inf.swap(0, Ordering::Relaxed),
            negative_inf_count: self.negative_inf.swap(0, Ordering::Relaxed),
            ..Buckets::default()
        };
        self.positive.drain(&mut buckets.positive);
        self.negative.drain(&mut buckets.negative);
        buckets
    }

    /// Bytes this histogram holds: itself and every block it allocated.
    pub fn allocated_bytes(&self) -> usize {
        size_of::<Histogram>() + self.positive.allocated_bytes() + self.negative.allocated_bytes()
    }
}

/// The histogram of a closed window, with the window's count, sum, min and
/// max: what a window event carries (`event.distribution`) and what the P
/// aggregations are computed from.
#[derive(Clone, Debug, PartialEq)]
pub struct Distribution {
    /// Every accepted sample, NaN included.
    pub count: u64,
    pub sum: f64,
    pub min: f64,
    pub max: f64,
    pub buckets: Buckets,
}

/// The P aggregations' quantiles, as thousandths (P50 to P999).
pub const QUANTILE_THOUSANDTHS: [u32; 5] = [500, 900, 950, 990, 999];

impl Distribution {
    /// Counts added bucket by bucket, count and sum added, min and max
    /// combined: a side without non-NaN samples adds none, and a NaN one of
    /// a side with some (its first sample was NaN, torch's MIN/MAX rule) is
    /// unknown and makes the merged one NaN, so that the quantile rules do
    /// not trust the other side's as exact (docs/api.md, Distribution.merge).
    /// `None` when a count passes `u64::MAX` (no Stat's window comes near).
    pub fn merge(&self, other: &Distribution) -> Option<Distribution> {
        let (a, b) = (&self.buckets, &other.buckets);
        // As signed numbers: one made unchecked (`_from_core`) may count
        // more NaNs than samples, and "known" is then not zero.
        let known = |d: &Distribution| i128::from(d.count) - i128::from(d.buckets.nan_count);
        let known = (known(self), known(other));
        let pick = |x: f64, y: f64, better: fn(f64, f64) -> bool| match known {
            (0, 0) if x.is_nan() || y.is_nan() => f64::NAN,
            (0, 0) | (_, 0) => x,
            (0, _) => y,
            _ if x.is_nan() || y.is_nan() => f64::NAN,
            _ if better(y, x) => y,
            _ => x,
        };
        Some(Distribution {
            count: self.count.checked_add(other.count)?,
            sum: self.sum + other.sum,
            min: pick(self.min, other.min, |y, x| y < x),
            max: pick(self.max, other.max, |y, x| y > x),
            buckets: Buckets {
                zero_count: a.zero_count.checked_add(b.zero_count)?,
                nan_count: a.nan_count.checked_add(b.nan_count)?,
                positive_inf_count: a.positive_inf_count.checked_add(b.positive_inf_count)?,
                negative_inf_count: a.negative_inf_count.checked_add(b.negative_inf_count)?,
                positive: merge_counts(&a.positive, &b.positive)?,
                negative: merge_counts(&a.negative, &b.negative)?,
            },
        })
    }

    /// The quantile `k/1000` (the P aggregations): `quantile`'s rule with
    /// `q = k/1000`, without formatting a float.
    pub fn quantile_thousandths(&self, k: u32) -> f64 {
        self.quantile_by_rank(|n| (u128::from(k) * u128::from(n)).div_ceil(1000))
    }

    /// The quantile `q` (in `[0, 1]`; past it, the nearest end) by the rules of docs/api.md
    /// ("Distribution"): the sample of rank `max(1, ceil(q*n))` among the
    /// `n` non-NaN ones, with `q` read as the decimal Python's `repr(q)`
    /// writes (0.1 is 1/10, not the double above it), exactly; estimated by
    /// its bucket's representative; min and max exact at ranks 1 and n;
    /// clamped into `[min, max]`. 0.0 for an empty window, NaN when all
    /// samples are NaN.
    pub fn quantile(&self, q: f64) -> f64 {
        let (digits, exponent) = decimal::shortest(q.clamp(0.0, 1.0));
        self.quantile_by_rank(|n| {
            let scaled = u128::from(digits) * u128::from(n);
            match u32::try_from(-exponent) {
                // A whole q: within [0, 1], 0 or 1, and q*n exact.
                Err(_) => scaled.saturating_mul(10u128.saturating_pow(exponent as u32)),
                // Past 10^38 the divisor exceeds digits * n < 2^121.
                Ok(places) if places > 38 => u128::from(scaled > 0),
                Ok(places) => scaled.div_ceil(10u128.pow(places)),
            }
        })
    }

    /// The quantile whose rank among `n` non-NaN samples is
    /// `max(1, ceil_rank(n))`.
    fn quantile_by_rank(&self, ceil_rank: impl FnOnce(u64) -> u128) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let n = self.count.saturating_sub(self.buckets.nan_count);
        if n == 0 {
            return f64::NAN;
        }
        // At most n: q <= 1.
        let rank = ceil_rank(n).clamp(1, u128::from(n)) as u64;
        let bounded = !self.min.is_nan() && !self.max.is_nan();
        if bounded && rank == 1 {
            return self.min;
        }
        if bounded && rank == n {
            return self.max;
        }
        let value = self.value_of_rank(rank);
        if !bounded {
            value
        } else if value < self.min {
            self.min
        } else if value > self.max {
            self.max
        } else {
            value
        }
    }

    /// The estimate of the sample of `rank` (1-based) in ascending order.
    fn value_of_rank(&self, rank: u64) -> f64 {
        let b = &self.buckets;
        let mut below = 0u64;
        let mut reaches = |count: u64| {
            below = below.saturating_add(count);
            rank <= below
        };
        if reaches(b.negative_inf_count) {
            return f64::NEG_INFINITY;
        }
        for &(index, count) in b.negative.iter().rev() {
            if reaches(count) {
                return -representative(index);
            }
        }
        if reaches(b.zero_count) {
            return 0.0;
        }
        for &(index, count) in &b.positive {
            if reaches(count) {
                return representative(index);
            }
        }
        if reaches(b.positive_inf_count) {
            return f64::INFINITY;
        }
        // Counts that do not add up to `count` (never made by a Stat).
        f64::NAN
    }
}

/// What a caller hands `Distribution::from_parts`: a distribution's fields
/// before the rules of docs/api.md ("Distribution") are checked. Indices are
/// `i64` so that any index a caller can name reaches the range rule.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DistributionParts {
    pub count: u64,
    pub sum: f64,
    pub min: f64,
    pub max: f64,
    pub zero_count: u64,
    pub nan_count: u64,
    pub positive_inf_count: u64,
    pub negative_inf_count: u64,
    pub positive: Vec<(i64, u64)>,
    pub negative: Vec<(i64, u64)>,
}

/// Where a sample is counted: what `InvalidDistribution::Extreme` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    NegativeInf,
    /// The bucket of `|x|` among the negative ones.
    Negative(i32),
    Zero,
    Positive(i32),
    PositiveInf,
}

impl Place {
    /// The count or bucket that holds `value` (not NaN).
    pub fn of(value: f64) -> Place {
        if value == f64::NEG_INFINITY {
            Place::NegativeInf
        } else if value == f64::INFINITY {
            Place::PositiveInf
        } else if value == 0.0 {
            Place::Zero
        } else if value < 0.0 {
            Place::Negative(bucket_index((-value).to_bits()))
        } else {
            Place::Positive(bucket_index(value.to_bits()))
        }
    }
}

/// Why `from_parts` (or one of its checks, which a binding may call as it
/// converts arguments, so that errors come in argument order) refused a
/// distribution. Each names the argument at fault and carries the data of
/// its message, worded by its `Display`.
#[derive(Clone, Debug, PartialEq)]
pub enum InvalidDistribution {
    /// A scale other than `SCALE`, the only one supported.
    Scale { scale: i128 },
    /// A count below 0.
    Negative { argument: &'static str, value: i128 },
    /// A count that does not fit the `u64` counters of a Stat.
    TooLarge { argument: &'static str, value: i128 },
    /// A bucket index outside `MIN_INDEX..=MAX_INDEX`.
    IndexOutOfRange { argument: &'static str, index: i128 },
    /// A bucket counting no sample (or fewer than none).
    EmptyBucket {
        argument: &'static str,
        index: i64,
        count: i128,
    },
    /// Bucket indices not strictly ascending.
    NotAscending {
        argument: &'static str,
        previous: i64,
        index: i64,
    },
    /// `count` differs from the samples the other counts hold.
    CountMismatch { count: u64, counted: u128 },
    /// `min > max` (neither NaN).
    MinAboveMax { min: f64, max: f64 },
    /// A min (`is_min`) or max that is not NaN, outside the lowest (highest)
    /// place that counts a sample, `place`.
    Extreme {
        is_min: bool,
        value: f64,
        place: Place,
    },
}

impl InvalidDistribution {
    /// The argument the error is about.
    pub fn argument(&self) -> &'static str {
        match self {
            Self::Scale { .. } => "scale",
            Self::Negative { argument, .. }
            | Self::TooLarge { argument, .. }
            | Self::IndexOutOfRange { argument, .. }
            | Self::EmptyBucket { argument, .. }
            | Self::NotAscending { argument, .. } => argument,
            Self::CountMismatch { .. } => "count",
            Self::MinAboveMax { .. } => "min",
            Self::Extreme { is_min: true, .. } => "min",
            Self::Extreme { is_min: false, .. } => "max",
        }
    }
}

/// The problem, worded to follow the name of the argument at fault
/// (`argument`): the bindings' argument-error format is `{call}({argument}):
/// {argument} {problem}` (docs/api.md). Floats are written as Python's
/// `repr` writes them, as the Python API shows them.
impl fmt::Display for InvalidDistribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Scale { scale } => {
                write!(f, "must be {SCALE} (the only one supported), got {scale}")
            }
            Self::Negative { value, .. } => write!(f, "must be >= 0, got {value}"),
            Self::TooLarge {
                argument: "positive" | "negative",
                value,
            } => write!(f, "must hold bucket counts below 2**64, got {value}"),
            Self::TooLarge { value, .. } => write!(f, "must be below 2**64, got {value}"),
            Self::IndexOutOfRange { index, .. } => write!(
                f,
                "has bucket index {index}, which holds no finite double at scale {SCALE} \
                 (must be in {MIN_INDEX}..{MAX_INDEX})"
            ),
            Self::EmptyBucket { index, count, .. } => {
                write!(f, "must count > 0 samples in bucket {index}, got {count}")
            }
            Self::NotAscending {
                previous, index, ..
            } => write!(
                f,
                "must have strictly ascending bucket indices ({previous} then {index})"
            ),
            Self::CountMismatch { count, counted } => write!(
                f,
                "must equal the samples counted in the buckets, zeros, NaNs and infinities \
                 ({counted}), got {count}"
            ),
            Self::MinAboveMax { min, max } => write!(
                f,
                "must be <= max, got min={}, max={}",
                python_repr(*min),
                python_repr(*max)
            ),
            Self::Extreme {
                is_min,
                value,
                place,
            } => {
                write!(f, "{} is not in ", python_repr(*value))?;
                match place {
                    Place::NegativeInf => f.write_str("negative_inf_count")?,
                    Place::Negative(index) => write!(f, "negative bucket {index}")?,
                    Place::Zero => f.write_str("zero_count")?,
                    Place::Positive(index) => write!(f, "positive bucket {index}")?,
                    Place::PositiveInf => f.write_str("positive_inf_count")?,
                }
                let which = if *is_min { "smallest" } else { "largest" };
                write!(f, ", where the {which} sample is counted")
            }
        }
    }
}

/// The scale rule: only `SCALE`.
pub fn check_scale(scale: i128) -> Result<(), InvalidDistribution> {
    if scale == i128::from(SCALE) {
        Ok(())
    } else {
        Err(InvalidDistribution::Scale { scale })
    }
}

/// One of the counts (`count`, `zero_count`, ...): at least 0, and within a
/// Stat's `u64` counters.
pub fn check_count(argument: &'static str, value: i128) -> Result<u64, InvalidDistribution> {
    if value < 0 {
        Err(InvalidDistribution::Negative { argument, value })
    } else {
        u64::try_from(value).map_err(|_| InvalidDistribution::TooLarge { argument, value })
    }
}

/// One `(index, count)` pair of the buckets `argument` ("positive" or
/// "negative"), after `previous`, the index of the pair before it: the index
/// within `MIN_INDEX..=MAX_INDEX`, the count above 0 (and within `u64`),
/// indices strictly ascending, checked in this order.
pub fn check_bucket(
    argument: &'static str,
    previous: Option<i64>,
    index: i128,
    count: i128,
) -> Result<(i64, u64), InvalidDistribution> {
    if !(i128::from(MIN_INDEX)..=i128::from(MAX_INDEX)).contains(&index) {
        return Err(InvalidDistribution::IndexOutOfRange { argument, index });
    }
    let index = index as i64; // in range, checked above
    if count <= 0 {
        return Err(InvalidDistribution::EmptyBucket {
            argument,
            index,
            count,
        });
    }
    let count = u64::try_from(count).map_err(|_| InvalidDistribution::TooLarge {
        argument,
        value: count,
    })?;
    match previous {
        Some(previous) if index <= previous => Err(InvalidDistribution::NotAscending {
            argument,
            previous,
            index,
        }),
        _ => Ok((index, count)),
    }
}

/// `parts`' buckets of one side, checked, as the histogram stores them.
fn checked_side(
    argument: &'static str,
    pairs: &[(i64, u64)],
) -> Result<Vec<(i32, u64)>, InvalidDistribution> {
    let mut previous = None;
    let mut out = Vec::with_capacity(pairs.len());
    for &(index, count) in pairs {
        let (index, count) =
            check_bucket(argument, previous, i128::from(index), i128::from(count))?;
        previous = Some(index);
        out.push((index as i32, count)); // in MIN_INDEX..=MAX_INDEX
    }
    Ok(out)
}

impl Distribution {
    /// A distribution from its parts, if they obey the rules of docs/api.md
    /// ("Distribution"), checked in this order: each side's buckets
    /// (`check_bucket`), `count` equal to the samples counted elsewhere, then
    /// the extremes: a min or max that is not NaN is a sample (torch's
    /// MIN/MAX keep the first one when it is NaN), so the smallest lies in
    /// the lowest place that counts a sample and the largest in the highest,
    /// and min <= max. So quantiles clamped into `[min, max]` never come
    /// from extremes the buckets contradict.
    pub fn from_parts(parts: DistributionParts) -> Result<Distribution, InvalidDistribution> {
        let positive = checked_side("positive", &parts.positive)?;
        let negative = checked_side("negative", &parts.negative)?;
        let counted = [
            parts.zero_count,
            parts.nan_count,
            parts.positive_inf_count,
            parts.negative_inf_count,
        ]
        .into_iter()
        .chain(positive.iter().chain(&negative).map(|&(_, count)| count))
        .map(u128::from)
        .sum::<u128>();
        if counted != u128::from(parts.count) {
            return Err(InvalidDistribution::CountMismatch {
                count: parts.count,
                counted,
            });
        }
        let (low, high) = (parts.min, parts.max);
        if !low.is_nan() && !high.is_nan() && low > high {
            return Err(InvalidDistribution::MinAboveMax {
                min: low,
                max: high,
            });
        }
        let distribution = Distribution {
            count: parts.count,
            sum: parts.sum,
            min: low,
            max: high,
            buckets: Buckets {
                zero_count: parts.zero_count,
                nan_count: parts.nan_count,
                positive_inf_count: parts.positive_inf_count,
                negative_inf_count: parts.negative_inf_count,
                positive,
                negative,
            },
        };
        if let Some((lowest, highest)) = distribution.buckets.extreme_places() {
            for (is_min, value, place) in [(true, low, lowest), (false, high, highest)] {
                if !value.is_nan() && Place::of(value) != place {
                    return Err(InvalidDistribution::Extreme {
                        is_min,
                        value,
                        place,
                    });
                }
            }
        }
        Ok(distribution)
    }
}

/// A distribution's fields by name, in the order of `torchmon.Distribution`'s
/// signature, of its `to_dict` and of its pickle (docs/api.md, "Distribution").
pub const FIELDS: [&str; 11] = [
    "scale",
    "count",
    "sum",
    "min",
    "max",
    "zero_count",
    "nan_count",
    "positive_inf_count",
    "negative_inf_count",
    "positive",
    "negative",
];
/// The fields without a default.
pub const REQUIRED: [&str; 4] = ["count", "sum", "min", "max"];

/// The place of the field `name` in `FIELDS`.
pub fn field_index(name: &str) -> Option<usize> {
    FIELDS.iter().position(|field| *field == name)
}

/// One field's value (`Distribution::fields`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Field<'a> {
    /// The scale or one of the counts.
    Count(u64),
    /// The sum, min or max.
    Float(f64),
    /// The `(index, count)` pairs of one sign.
    Buckets(&'a [(i32, u64)]),
}

impl Distribution {
    /// Each field's value, in the order of `FIELDS`.
    pub fn fields(&self) -> [Field<'_>; 11] {
        let b = &self.buckets;
        [
            Field::Count(SCALE as u64),
            Field::Count(self.count),
            Field::Float(self.sum),
            Field::Float(self.min),
            Field::Float(self.max),
            Field::Count(b.zero_count),
            Field::Count(b.nan_count),
            Field::Count(b.positive_inf_count),
            Field::Count(b.negative_inf_count),
            Field::Buckets(&b.positive),
            Field::Buckets(&b.negative),
        ]
    }
}

/// `repr(torchmon.Distribution)`: the fields but the scale, floats as Python
/// writes them, the zero, NaN and infinity counts only when not 0, and the
/// number of buckets of each sign, e.g. `Distribution(count=2, sum=3.0,
/// min=1.0, max=2.0, positive=2 buckets, negative=0 buckets)`.
impl fmt::Display for Distribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Distribution(")?;
        for (name, field) in FIELDS.into_iter().zip(self.fields()).skip(1) {
            // `count` is always written, and first.
            let separator = if name == "count" { "" } else { ", " };
            match field {
                Field::Count(0) if name != "count" => {}
                Field::Count(value) => write!(f, "{separator}{name}={value}")?,
                Field::Float(value) => write!(f, "{separator}{name}={}", python_repr(value))?,
                Field::Buckets(pairs) => write!(f, "{separator}{name}={} buckets", pairs.len())?,
            }
        }
        f.write_str(")")
    }
}

/// Equal as values: NaN equals NaN (whatever its payload), `-0.0` only
/// `-0.0`, so that a distribution equals its round trip through text.
fn same_float(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

impl Distribution {
    /// Every field equal, floats by `same_float` (`==` of `PartialEq` has
    /// NaN unequal to itself).
    pub fn same(&self, other: &Distribution) -> bool {
        self.count == other.count
            && same_float(self.sum, other.sum)
            && same_float(self.min, other.min)
            && same_float(self.max, other.max)
            && self.buckets == other.buckets
    }
}

impl Buckets {
    /// The places of the smallest and the largest non-NaN sample, or `None`
    /// without any.
    pub fn extreme_places(&self) -> Option<(Place, Place)> {
        let mut places = Vec::with_capacity(7);
        if self.negative_inf_count > 0 {
            places.push(Place::NegativeInf);
        }
        if let (Some(&(first, _)), Some(&(last, _))) = (self.negative.first(), self.negative.last())
        {
            places.extend([Place::Negative(last), Place::Negative(first)]);
        }
        if self.zero_count > 0 {
            places.push(Place::Zero);
        }
        if let (Some(&(first, _)), Some(&(last, _))) = (self.positive.first(), self.positive.last())
        {
            places.extend([Place::Positive(first), Place::Positive(last)]);
        }
        if self.positive_inf_count > 0 {
            places.push(Place::PositiveInf);
        }
        Some((*places.first()?, *places.last()?))
    }
}

/// Two ascending `(index, count)` lists added index by index (`None` past
/// `u64::MAX`).
fn merge_counts(a: &[(i32, u64)], b: &[(i32, u64)]) -> Option<Vec<(i32, u64)>> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].0.cmp(&b[j].0) {
            std::cmp::Ordering::Less => {
                out.push(a[i]);
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                out.push(b[j]);
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                out.push((a[i].0, a[i].1.checked_add(b[j].1)?));
                i += 1;
                j += 1;
            }
        }
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
    Some(out)
}

/// The largest double whose bucket is `index` or below: `2^((index+1)/64)`
/// rounded down; 0.0 below `MIN_INDEX`, `f64::MAX` from `MAX_INDEX` up. Found
/// by bisection over the bits of the positive doubles, whose order is their
/// values' and along which `bucket_index` never decreases.
pub fn bucket_upper(index: i64) -> f64 {
    if index < i64::from(MIN_INDEX) {
        return 0.0;
    }
    if index >= i64::from(MAX_INDEX) {
        return f64::MAX;
    }
    // Invariant: bucket(low) <= index < bucket(high).
    let (mut low, mut high) = (1u64, f64::MAX.to_bits());
    while high - low > 1 {
        let middle = low + (high - low) / 2;
        if i64::from(bucket_index(middle)) <= index {
            low = middle;
        } else {
            high = middle;
        }
    }
    f64::from_bits(low)
}

/// `(lower, upper)` of bucket `index`: it holds exactly the doubles `x` with
/// `lower < |x| <= upper` (equal bounds for a subnormal bucket that holds
/// none). `None` outside `MIN_INDEX..=MAX_INDEX`.
pub fn bucket_bounds(index: i64) -> Option<(f64, f64)> {
    (i64::from(MIN_INDEX)..=i64::from(MAX_INDEX))
        .contains(&index)
        .then(|| (bucket_upper(index - 1), bucket_upper(index)))
}

/// OpenTelemetry's smallest scale: its buckets hold `2^1024 : 1`, so every
/// double falls into 3 of them.
pub const MIN_EXPONENTIAL_SCALE: i32 = -10;

/// One sign's buckets as OpenTelemetry's dense range: `counts[k]` is bucket
/// `offset + k`'s.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DenseBuckets {
    pub offset: i32,
    pub counts: Vec<u64>,
}

/// A distribution's buckets at the largest scale (at most `SCALE`, at least
/// `MIN_EXPONENTIAL_SCALE`) where each sign's dense range has at most
/// `max_buckets` buckets: OpenTelemetry's ExponentialHistogram with
/// `max_size` (docs/sinks.md, "OpenTelemetry"). Bucket `i` of scale 6 lies
/// in bucket `i >> shift` of scale `6 - shift` (floor, negative indices
/// included): halving the scale is exact.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Exponential {
    pub scale: i32,
    pub positive: DenseBuckets,
    pub negative: DenseBuckets,
}

impl Buckets {
    pub fn exponential(&self, max_buckets: u64) -> Exponential {
        let span = |side: &[(i32, u64)], shift: i32| match (side.first(), side.last()) {
            (Some(&(first, _)), Some(&(last, _))) => {
                ((last >> shift) - (first >> shift) + 1) as u64
            }
            _ => 0,
        };
        let mut shift = 0;
        while shift < SCALE - MIN_EXPONENTIAL_SCALE
            && (span(&self.positive, shift) > max_buckets
                || span(&self.negative, shift) > max_buckets)
        {
            shift += 1;
        }
        let dense = |side: &[(i32, u64)]| {
            let Some(&(first, _)) = side.first() else {
                return DenseBuckets::default();
            };
            let offset = first >> shift;
            let mut counts = vec![0u64; span(side, shift) as usize];
            for &(index, count) in side {
                let slot = &mut counts[((index >> shift) - offset) as usize];
                *slot = slot.saturating_add(count);
            }
            DenseBuckets { offset, counts }
        };
        Exponential {
            scale: SCALE - shift,
            positive: dense(&self.positive),
            negative: dense(&self.negative),
        }
    }
}

#[cfg(all(test, not(loom)))]
#[path = "histogram_tests.rs"]
mod tests;
