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
//! arithmetic); tests.rs proves them from scratch. What a closed window's
//! histogram becomes, `Distribution`, and its rules are distribution.rs's.

use crate::sync::{AtomicPtr, AtomicU64, Ordering};
use std::ptr;

mod distribution;
pub use distribution::*;

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
        self.exponential_at_most(max_buckets, SCALE)
    }

    /// `exponential(max_buckets)` at a scale of at most `max_scale`
    /// (clamped to `MIN_EXPONENTIAL_SCALE..=SCALE`). With `u64::MAX`
    /// buckets the scale is exactly `max_scale`, whatever the samples' range:
    /// the fixed scale of `OpenTelemetryEventHandler(scale=...)`, so that a
    /// cumulative series keeps its bucket bounds from export to export
    /// (docs/sinks.md, "OpenTelemetry").
    pub fn exponential_at_most(&self, max_buckets: u64, max_scale: i32) -> Exponential {
        let span = |side: &[(i32, u64)], shift: i32| match (side.first(), side.last()) {
            (Some(&(first, _)), Some(&(last, _))) => {
                ((last >> shift) - (first >> shift) + 1) as u64
            }
            _ => 0,
        };
        let mut shift = SCALE - max_scale.clamp(MIN_EXPONENTIAL_SCALE, SCALE);
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
mod tests;
