//! The tables proven exact with integer arithmetic, the bucket index
//! checked against an exact oracle, and the quantile rules of docs/api.md.

use super::*;
use std::cmp::Ordering as Cmp;

/// Unsigned big integers as little-endian 32-bit limbs: just enough to
/// raise a 54-bit integer to the 128th power exactly.
#[derive(Clone, Debug, PartialEq)]
struct Big(Vec<u32>);

impl Big {
    fn from(value: u64) -> Big {
        Big(vec![value as u32, (value >> 32) as u32])
    }

    fn mul(&self, other: &Big) -> Big {
        let mut out = vec![0u32; self.0.len() + other.0.len()];
        for (i, &a) in self.0.iter().enumerate() {
            let mut carry = 0u64;
            for (j, &b) in other.0.iter().enumerate() {
                let t = u64::from(a) * u64::from(b) + u64::from(out[i + j]) + carry;
                out[i + j] = t as u32;
                carry = t >> 32;
            }
            out[i + other.0.len()] = carry as u32;
        }
        while out.len() > 1 && *out.last().unwrap() == 0 {
            out.pop();
        }
        Big(out)
    }

    /// `self^(2^squarings)`.
    fn pow2(&self, squarings: u32) -> Big {
        (0..squarings).fold(self.clone(), |x, _| x.mul(&x))
    }

    fn bit_len(&self) -> u64 {
        let top = self.0.iter().rposition(|&l| l != 0).map_or(0, |i| i + 1);
        if top == 0 {
            return 0;
        }
        (top as u64 - 1) * 32 + u64::from(32 - self.0[top - 1].leading_zeros())
    }

    fn is_power_of_two(&self) -> bool {
        self.0.iter().map(|l| l.count_ones()).sum::<u32>() == 1
    }

    /// `self` compared with `2^k`.
    fn cmp_power_of_two(&self, k: u64) -> Cmp {
        match self.bit_len().cmp(&(k + 1)) {
            Cmp::Equal if self.is_power_of_two() => Cmp::Equal,
            Cmp::Equal => Cmp::Greater,
            other => other,
        }
    }
}

/// The bucket of a finite `x > 0` by exact arithmetic (the oracle of
/// docs/api.md): with `x = mant * 2^exp`, mant odd, bucket `i` is the one
/// with `2^i < x^64 <= 2^(i+1)`.
fn oracle(x: f64) -> i32 {
    assert!(x > 0.0 && x.is_finite());
    let bits = x.to_bits();
    let biased = (bits >> 52) as i32;
    let (mut mant, mut exp) = if biased == 0 {
        (bits & MANTISSA_MASK, -1074)
    } else {
        ((bits & MANTISSA_MASK) | 1 << 52, biased - 1075)
    };
    let zeros = mant.trailing_zeros();
    mant >>= zeros;
    exp += zeros as i32;
    if mant == 1 {
        return 64 * exp - 1;
    }
    let log = Big::from(mant).pow2(6).bit_len() as i32 - 1;
    log + 64 * exp
}

/// `2^k` exactly, subnormals included (`powi` is not exact there).
fn pow2(k: i32) -> f64 {
    if k >= -1022 {
        f64::from_bits(((k + 1023) as u64) << 52)
    } else {
        f64::from_bits(1 << (k + 1074))
    }
}

fn index_of(x: f64) -> i32 {
    bucket_index(x.abs().to_bits())
}

#[test]
fn boundaries_are_the_exact_floors() {
    for (j, &b) in BOUNDARIES.iter().enumerate().take(64).skip(1) {
        let n = (1u64 << 52) + b;
        let k = 52 * 64 + j as u64;
        assert_eq!(Big::from(n).pow2(6).cmp_power_of_two(k), Cmp::Less, "{j}");
        assert_eq!(
            Big::from(n + 1).pow2(6).cmp_power_of_two(k),
            Cmp::Greater,
            "{j}"
        );
    }
    assert_eq!(BOUNDARIES[0], 0);
    assert_eq!(BOUNDARIES[64], 1 << 52);
}

#[test]
fn midpoints_are_the_nearest_doubles() {
    for (j, &mid) in MIDPOINTS.iter().enumerate() {
        // mid = M / 2^52 in [1, 2); 2^((2j+1)/128) must lie within half an
        // ulp: (2M-1)^128 < 2^(53*128 + 2j+1) < (2M+1)^128.
        let m = mid.to_bits() & MANTISSA_MASK | 1 << 52;
        assert_eq!(mid.to_bits() >> 52, 1023);
        let k = 53 * 128 + 2 * j as u64 + 1;
        assert_eq!(Big::from(2 * m - 1).pow2(7).cmp_power_of_two(k), Cmp::Less);
        assert_eq!(
            Big::from(2 * m + 1).pow2(7).cmp_power_of_two(k),
            Cmp::Greater
        );
        assert_eq!(index_of(mid), j as i32, "the midpoint lies in its bucket");
    }
    assert_eq!(MIDPOINTS[0], f64::from_bits(0x3ff0163da9fb3335));
    assert_eq!(MIDPOINTS[63], f64::from_bits(0x3fffd3c22b8f71f1));
}

#[test]
fn a_table_segment_holds_at_most_one_boundary() {
    for j in 1..64 {
        assert!(BOUNDARIES[j + 1] - BOUNDARIES[j] > 1 << 45, "{j}");
    }
    // And the lookup counts the boundaries a mantissa exceeds.
    let mut probes = vec![0, 1, MANTISSA_MASK];
    for &b in &BOUNDARIES[1..64] {
        probes.extend([b - 1, b, b + 1]);
    }
    probes.extend((0..128u64).flat_map(|t| [t << 45, (t << 45) | ((1 << 45) - 1)]));
    for m in probes {
        let exceeded = BOUNDARIES[1..64].iter().filter(|&&b| m > b).count() as i32;
        let x = f64::from_bits((1023 << 52) | m);
        assert_eq!(index_of(x), exceeded - i32::from(m == 0), "mantissa {m:#x}");
    }
}

#[test]
fn powers_of_two_are_upper_bounds() {
    for k in -1074..=1023 {
        let x = pow2(k);
        assert_eq!(index_of(x), 64 * k - 1, "2^{k}");
        if k < 1023 {
            // Subnormals near 2^-1074 are too coarse to reach the next
            // bucket in one ulp: the oracle says where they fall.
            let expected = if k >= -1022 {
                64 * k
            } else {
                oracle(x.next_up())
            };
            assert_eq!(index_of(x.next_up()), expected, "next_up(2^{k})");
        }
        if k > -1074 {
            let below = x.next_down();
            assert_eq!(index_of(below), oracle(below), "next_down(2^{k})");
            if k > -1022 {
                assert_eq!(index_of(below), 64 * k - 1, "next_down(2^{k})");
            }
        }
    }
    assert_eq!(index_of(f64::from_bits(1)), MIN_INDEX);
    assert_eq!(index_of(f64::MAX), MAX_INDEX);
    assert_eq!(index_of(f64::MIN_POSITIVE), 64 * -1022 - 1);
    assert_eq!(index_of(-2.0), 63);
}

#[test]
fn every_boundary_float_matches_the_oracle() {
    let exponents = (-1022..=-1015)
        .chain([-500, -1, 0, 1, 52, 600])
        .chain(1016..=1023);
    for e in exponents {
        for &b in &BOUNDARIES[1..64] {
            let below = f64::from_bits(((e + 1023) as u64) << 52 | b);
            for x in [
                below.next_down(),
                below,
                below.next_up(),
                below.next_up().next_up(),
            ] {
                assert_eq!(index_of(x), oracle(x), "{x:e} ({:#x})", x.to_bits());
            }
        }
    }
}

#[test]
fn random_and_subnormal_values_match_the_oracle() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut checked = 0;
    while checked < 4000 {
        let bits = next() & !SIGN_BIT;
        // Half of them subnormal (bits in the low 52 only).
        let bits = if checked % 2 == 0 {
            bits & MANTISSA_MASK
        } else {
            bits
        };
        let x = f64::from_bits(bits);
        if x == 0.0 || !x.is_finite() {
            continue;
        }
        assert_eq!(index_of(x), oracle(x), "{x:e} ({bits:#x})");
        assert_eq!(index_of(-x), oracle(x));
        checked += 1;
    }
    for m in 1..2000u64 {
        let x = f64::from_bits(m);
        assert_eq!(index_of(x), oracle(x), "subnormal {m}");
    }
}

#[test]
fn representatives_lie_in_their_bucket_and_are_the_scaled_midpoints() {
    let mut indices: Vec<i32> = (-70_000 / 2..-70_000 / 2 + 200).collect();
    indices.extend(64 * -1022..64 * -1022 + 200);
    indices.extend(-200..200);
    indices.extend(MAX_INDEX - 200..=MAX_INDEX);
    for i in indices {
        let rep = representative(i);
        assert_eq!(index_of(rep), i, "rep({i}) = {rep:e}");
        let exact = MIDPOINTS[i.rem_euclid(64) as usize] * pow2(i.div_euclid(64));
        assert_eq!(rep, exact, "{i}");
    }
    // Subnormal buckets (those holding a double): rounded once, then moved
    // into the bucket.
    for m in (1..5000u64).chain((1..2000).map(|k| k << 40)) {
        let i = index_of(f64::from_bits(m));
        let rep = representative(i);
        assert_eq!(index_of(rep), i, "rep({i}) = {rep:e}");
        let rounded =
            MIDPOINTS[i.rem_euclid(64) as usize] * pow2(-1022) * pow2(i.div_euclid(64) + 1022);
        assert!(rep == rounded || rep == rounded.next_up() || rep == rounded.next_down());
    }
    assert_eq!(representative(MIN_INDEX), f64::from_bits(1));
    assert_eq!(representative(0), MIDPOINTS[0]);
    assert_eq!(representative(-1), MIDPOINTS[63] / 2.0);
}

fn distribution_of(samples: &[f64]) -> Distribution {
    let histogram = Histogram::new();
    for &v in samples {
        histogram.record::<false>(v);
    }
    // The window's MIN/MAX by torch's rules (a first NaN sticks).
    let (mut min, mut max) = (samples.first().copied().unwrap_or(0.0), 0.0);
    max = samples.first().copied().unwrap_or(max);
    for &v in samples.iter().skip(1) {
        if min > v {
            min = v;
        }
        if max < v {
            max = v;
        }
    }
    Distribution {
        count: samples.len() as u64,
        sum: samples.iter().sum(),
        min,
        max,
        buckets: histogram.take(),
    }
}

/// The sample of rank `max(1, ceil(k*n/1000))` among the non-NaN ones.
fn exact_quantile(samples: &[f64], k: u32) -> f64 {
    let mut sorted: Vec<f64> = samples.iter().copied().filter(|v| !v.is_nan()).collect();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len() as u64;
    let rank = (u64::from(k) * n).div_ceil(1000).max(1);
    sorted[(rank - 1) as usize]
}

#[test]
fn take_reads_every_sample_once_and_empties_the_histogram() {
    let histogram = Histogram::new();
    let samples = [
        1.0,
        1.0,
        -1.0,
        0.0,
        -0.0,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        3e-310,
        1e300,
    ];
    for v in samples {
        histogram.record::<true>(v);
    }
    let buckets = histogram.take();
    assert_eq!(
        (
            buckets.zero_count,
            buckets.nan_count,
            buckets.positive_inf_count,
            buckets.negative_inf_count
        ),
        (2, 1, 1, 1)
    );
    let mut positive = vec![(index_of(3e-310), 1), (-1, 2), (index_of(1e300), 1)];
    positive.sort_unstable();
    assert_eq!(buckets.positive, positive);
    assert_eq!(buckets.negative, [(-1, 1)]);
    assert_eq!(histogram.take(), Buckets::default());
}

#[test]
fn quantiles_follow_the_rules() {
    // Empty: 0.0; all NaN: NaN.
    assert_eq!(distribution_of(&[]).quantile_thousandths(500), 0.0);
    assert!(
        distribution_of(&[f64::NAN, f64::NAN])
            .quantile_thousandths(500)
            .is_nan()
    );
    // Ranks 1 and n are the exact min and max.
    let d = distribution_of(&[3.0, 1.1, 7.3]);
    assert_eq!(d.quantile_thousandths(0), 1.1);
    assert_eq!(d.quantile_thousandths(999), 7.3);
    // Rank 2 of 3: 3.0's bucket, by its representative.
    let rep = d.quantile_thousandths(500);
    assert_eq!(rep, representative(index_of(3.0)));
    assert!((rep - 3.0).abs() / 3.0 < 0.0055);
    // Infinities and zeros.
    let d = distribution_of(&[f64::NEG_INFINITY, 0.0, -0.0, 5.0, f64::INFINITY, f64::NAN]);
    assert_eq!(d.quantile_thousandths(200), f64::NEG_INFINITY);
    assert_eq!(d.quantile_thousandths(500), 0.0);
    assert_eq!(d.quantile_thousandths(999), f64::INFINITY);
    // A NaN first sample makes min/max NaN: no exact ends, no clamp.
    let d = distribution_of(&[f64::NAN, 2.0, 2.0]);
    assert_eq!(d.quantile_thousandths(999), representative(index_of(2.0)));
    // A constant window reports the constant (clamped).
    let d = distribution_of(&[0.1; 10]);
    assert_eq!(d.quantile_thousandths(500), 0.1);
}

#[test]
fn quantiles_are_within_the_bucket_half_width_of_the_exact_ones() {
    let mut state = 12345u64;
    let mut uniform = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    for case in 0..40 {
        let n = 1 + case * 37;
        let samples: Vec<f64> = (0..n)
            .map(|i| {
                let magnitude = (uniform() * 40.0 - 20.0).exp();
                match (case + i) % 7 {
                    0 => -magnitude,
                    1 => magnitude * 1e-310,
                    2 if case % 5 == 0 => 0.0,
                    _ => magnitude,
                }
            })
            .collect();
        let d = distribution_of(&samples);
        for k in QUANTILE_THOUSANDTHS.into_iter().chain([0, 1, 250, 1000]) {
            let exact = exact_quantile(&samples, k);
            let got = d.quantile_thousandths(k);
            let error = if exact == 0.0 {
                got.abs()
            } else {
                ((got - exact) / exact).abs()
            };
            // Subnormals with few significant bits round further.
            let bound = if exact.abs() < f64::MIN_POSITIVE * 1e3 {
                0.02
            } else {
                0.0055
            };
            assert!(error <= bound, "case {case} k {k}: {got:e} vs {exact:e}");
        }
    }
}

#[test]
fn merging_equals_the_histogram_of_all_samples() {
    let a = [1.0, -2.0, 0.0, 5e-320, f64::NAN, 1e10];
    let b = [3.0, 1.0, f64::INFINITY, -2.0, -7.0];
    let merged = distribution_of(&a).merge(&distribution_of(&b)).unwrap();
    let all: Vec<f64> = a.iter().chain(&b).copied().collect();
    let whole = distribution_of(&all);
    assert_eq!(merged.buckets, whole.buckets);
    assert_eq!(merged.count, whole.count);
    assert_eq!((merged.min, merged.max), (-7.0, f64::INFINITY));
    // The NaN min/max of a window whose first sample is NaN is unknown: the
    // merged ones are too, and the quantile is the bucket estimate of 4.0,
    // not the other window's 2.0 (rank 2 of 2.0, 4.0).
    let nan_first = distribution_of(&[f64::NAN, 4.0]);
    let m = nan_first.merge(&distribution_of(&[2.0])).unwrap();
    assert!(m.min.is_nan() && m.max.is_nan());
    assert!((m.quantile_thousandths(999) - 4.0).abs() <= 0.0055 * 4.0);
    // A window without non-NaN samples adds no extremes.
    let m = distribution_of(&[f64::NAN])
        .merge(&distribution_of(&[2.0, 3.0]))
        .unwrap();
    assert_eq!((m.min, m.max), (2.0, 3.0));
    assert!(
        distribution_of(&[f64::NAN])
            .merge(&distribution_of(&[f64::NAN]))
            .unwrap()
            .min
            .is_nan()
    );
}

#[test]
fn racing_first_samples_of_one_octave_allocate_one_block() {
    let histogram = std::sync::Arc::new(Histogram::new());
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let histogram = histogram.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                for i in 0..10_000 {
                    histogram
                        .record::<false>(1.0 + ((i % 64) as f64 + 0.5) / 64.0 + t as f64 * 1e-9);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let buckets = histogram.take();
    assert_eq!(buckets.positive.iter().map(|b| b.1).sum::<u64>(), 40_000);
    let one_block = size_of::<Histogram>() + size_of::<Group>() + size_of::<Block>();
    assert_eq!(histogram.allocated_bytes(), one_block);
}

fn parts_of(samples: &[f64]) -> DistributionParts {
    let d = distribution_of(samples);
    let wide = |side: &[(i32, u64)]| side.iter().map(|&(i, c)| (i64::from(i), c)).collect();
    DistributionParts {
        count: d.count,
        sum: d.sum,
        min: d.min,
        max: d.max,
        zero_count: d.buckets.zero_count,
        nan_count: d.buckets.nan_count,
        positive_inf_count: d.buckets.positive_inf_count,
        negative_inf_count: d.buckets.negative_inf_count,
        positive: wide(&d.buckets.positive),
        negative: wide(&d.buckets.negative),
    }
}

#[test]
fn from_parts_accepts_what_a_window_makes() {
    for samples in [
        &[][..],
        &[f64::NAN],
        &[1.5, -3.0, 0.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN],
        &[5e-324, f64::MAX, -f64::MAX],
    ] {
        let parts = parts_of(samples);
        let made = Distribution::from_parts(parts).unwrap();
        assert!(made.same(&distribution_of(samples)), "{samples:?}");
    }
}

#[test]
fn from_parts_refuses_bad_buckets_in_argument_order() {
    use InvalidDistribution::*;
    let base = parts_of(&[1.5, 3.0]);
    let with = |positive: Vec<(i64, u64)>, negative: Vec<(i64, u64)>| DistributionParts {
        positive,
        negative,
        ..base.clone()
    };
    let low = i64::from(MIN_INDEX) - 1;
    let err = |p| Distribution::from_parts(p).unwrap_err();
    assert_eq!(
        err(with(vec![(low, 1)], vec![(70_000, 1)])),
        IndexOutOfRange {
            argument: "positive",
            index: i128::from(low)
        }
    );
    assert_eq!(
        err(with(base.positive.clone(), vec![(70_000, 1)])),
        IndexOutOfRange {
            argument: "negative",
            index: 70_000
        }
    );
    assert_eq!(
        err(with(vec![(3, 0)], vec![])),
        EmptyBucket {
            argument: "positive",
            index: 3,
            count: 0
        }
    );
    assert_eq!(
        err(with(vec![(37, 1), (37, 1)], vec![])),
        NotAscending {
            argument: "positive",
            previous: 37,
            index: 37
        }
    );
    // The range rule comes before the count rule, which comes before order.
    assert_eq!(
        check_bucket("negative", Some(5), 1 << 70, -1),
        Err(IndexOutOfRange {
            argument: "negative",
            index: 1 << 70
        })
    );
    assert_eq!(
        check_bucket("negative", Some(5), 2, -1),
        Err(EmptyBucket {
            argument: "negative",
            index: 2,
            count: -1
        })
    );
    assert_eq!(
        check_bucket("positive", None, 0, 1 << 64),
        Err(TooLarge {
            argument: "positive",
            value: 1 << 64
        })
    );
    assert_eq!(check_bucket("positive", Some(-1), 0, 7), Ok((0, 7)));
}

#[test]
fn from_parts_refuses_counts_that_do_not_add_up() {
    let parts = DistributionParts {
        count: 3,
        ..parts_of(&[1.5, 3.0])
    };
    assert_eq!(
        Distribution::from_parts(parts).unwrap_err(),
        InvalidDistribution::CountMismatch {
            count: 3,
            counted: 2
        }
    );
    // Counts whose total passes u64 are added without overflow.
    let parts = DistributionParts {
        count: u64::MAX,
        zero_count: u64::MAX,
        nan_count: u64::MAX,
        min: 0.0,
        max: 0.0,
        ..DistributionParts::default()
    };
    assert_eq!(
        Distribution::from_parts(parts).unwrap_err(),
        InvalidDistribution::CountMismatch {
            count: u64::MAX,
            counted: 2 * u128::from(u64::MAX)
        }
    );
}

#[test]
fn from_parts_refuses_extremes_the_buckets_contradict() {
    use InvalidDistribution::*;
    let base = parts_of(&[-2.0, 1.5, 3.0]);
    let extremes = |min: f64, max: f64| {
        Distribution::from_parts(DistributionParts {
            min,
            max,
            ..base.clone()
        })
    };
    assert_eq!(
        extremes(3.0, -2.0).unwrap_err(),
        MinAboveMax {
            min: 3.0,
            max: -2.0
        }
    );
    assert_eq!(
        extremes(-2.5, 3.0).unwrap_err(),
        Extreme {
            is_min: true,
            value: -2.5,
            place: Place::Negative(index_of(2.0))
        }
    );
    assert_eq!(
        extremes(-2.0, 1.5).unwrap_err(),
        Extreme {
            is_min: false,
            value: 1.5,
            place: Place::Positive(index_of(3.0))
        }
    );
    // NaN extremes are unknown, never contradicted; other samples of the
    // extreme's bucket are.
    assert!(extremes(f64::NAN, f64::NAN).is_ok());
    assert!(extremes(-1.99, 3.01).is_ok());
    // Without a non-NaN sample the extremes are whatever the window held.
    let nan_only = parts_of(&[f64::NAN]);
    assert!(
        Distribution::from_parts(DistributionParts {
            min: 7.0,
            max: 8.0,
            ..nan_only
        })
        .is_ok()
    );
    let zero = parts_of(&[0.0, f64::INFINITY]);
    assert_eq!(
        Distribution::from_parts(DistributionParts {
            min: -0.0,
            max: 4.0,
            ..zero
        })
        .unwrap_err(),
        Extreme {
            is_min: false,
            value: 4.0,
            place: Place::PositiveInf
        }
    );
}

#[test]
fn scale_and_count_rules() {
    assert_eq!(check_scale(6), Ok(()));
    assert_eq!(check_scale(5), Err(InvalidDistribution::Scale { scale: 5 }));
    assert_eq!(check_count("count", 0), Ok(0));
    assert_eq!(
        check_count("nan_count", -1),
        Err(InvalidDistribution::Negative {
            argument: "nan_count",
            value: -1
        })
    );
    assert_eq!(
        check_count("count", 1 << 64),
        Err(InvalidDistribution::TooLarge {
            argument: "count",
            value: 1 << 64
        })
    );
    assert_eq!(InvalidDistribution::Scale { scale: 1 }.argument(), "scale");
}

/// The wording follows the argument's name in the bindings' error format
/// (docs/api.md); floats are written as Python's repr writes them.
#[test]
fn invalid_distributions_are_worded_with_python_floats() {
    use InvalidDistribution::*;
    let cases = [
        (
            Scale { scale: 5 },
            "must be 6 (the only one supported), got 5",
        ),
        (
            TooLarge {
                argument: "positive",
                value: 1 << 64,
            },
            "must hold bucket counts below 2**64, got 18446744073709551616",
        ),
        (
            IndexOutOfRange {
                argument: "negative",
                index: 70000,
            },
            "has bucket index 70000, which holds no finite double at scale 6 \
             (must be in -68737..65535)",
        ),
        (
            MinAboveMax {
                min: 1e16,
                max: -0.0,
            },
            "must be <= max, got min=1e+16, max=-0.0",
        ),
        (
            Extreme {
                is_min: false,
                value: 1.5e-5,
                place: Place::Negative(3),
            },
            "1.5e-05 is not in negative bucket 3, where the largest sample is counted",
        ),
        (
            Extreme {
                is_min: true,
                value: f64::NEG_INFINITY,
                place: Place::PositiveInf,
            },
            "-inf is not in positive_inf_count, where the smallest sample is counted",
        ),
    ];
    for (error, text) in cases {
        assert_eq!(error.to_string(), text);
    }
}

#[test]
fn a_distribution_displays_as_its_python_repr() {
    let d = distribution_of(&[1.0, 2.0, 0.0, f64::INFINITY]);
    assert_eq!(
        d.to_string(),
        "Distribution(count=4, sum=inf, min=0.0, max=inf, zero_count=1, \
         positive_inf_count=1, positive=2 buckets, negative=0 buckets)"
    );
    let empty = Distribution {
        sum: 0.0,
        ..distribution_of(&[])
    };
    assert_eq!(
        empty.to_string(),
        "Distribution(count=0, sum=0.0, min=0.0, max=0.0, positive=0 buckets, negative=0 buckets)"
    );
}

#[test]
fn fields_are_in_the_order_of_their_names() {
    // The first sample sets min and max; a later NaN leaves them alone.
    let d = distribution_of(&[-1.0, 2.0, f64::NAN]);
    let (fields, field) = (d.fields(), |name| field_index(name).unwrap());
    assert_eq!(fields[field("scale")], Field::Count(6));
    assert_eq!(fields[field("nan_count")], Field::Count(1));
    assert_eq!(fields[field("max")], Field::Float(2.0));
    assert_eq!(fields[field("negative")], Field::Buckets(&[(-1, 1)]));
    assert!(REQUIRED.iter().all(|name| field_index(name).is_some()));
    assert_eq!(field_index("bogus"), None);
}

#[test]
fn same_compares_floats_by_value_with_nan_equal_and_signed_zeros() {
    let a = distribution_of(&[f64::NAN, 1.5]);
    assert!(a.same(&distribution_of(&[f64::NAN, 1.5])));
    let a = distribution_of(&[2.5, 1.5]);
    assert!(a.same(&a.clone()));
    let b = Distribution {
        sum: -a.sum,
        ..a.clone()
    };
    assert!(!a.same(&b));
    let zero = distribution_of(&[0.0]);
    let negative_zero = Distribution {
        min: -0.0,
        ..zero.clone()
    };
    assert!(!zero.same(&negative_zero));
    assert!(!zero.same(&distribution_of(&[0.0, 0.0])));
}

#[test]
fn merge_refuses_counts_past_u64() {
    let big = Distribution {
        count: u64::MAX,
        buckets: Buckets {
            zero_count: u64::MAX,
            ..Buckets::default()
        },
        ..distribution_of(&[0.0])
    };
    assert_eq!(big.merge(&distribution_of(&[])), Some(big.clone()));
    assert_eq!(big.merge(&distribution_of(&[0.0])), None);
    let in_bucket = Distribution {
        count: u64::MAX,
        buckets: Buckets {
            positive: vec![(0, u64::MAX)],
            ..Buckets::default()
        },
        ..distribution_of(&[1.01])
    };
    let other = Distribution {
        count: 0,
        ..distribution_of(&[1.01])
    };
    assert_eq!(in_bucket.merge(&other), None);
}

#[test]
fn quantile_reads_q_as_written_and_agrees_with_the_thousandths() {
    let samples: Vec<f64> = (1..=10).map(f64::from).collect();
    let d = distribution_of(&samples);
    // 0.1 * 10 is 1 as written: rank 1, the min; the double 0.1 is a little
    // above 1/10, which would make it rank 2.
    assert_eq!(d.quantile(0.1), 1.0);
    assert_eq!(d.quantile(0.0), 1.0);
    assert_eq!(d.quantile(1.0), 10.0);
    assert_eq!(d.quantile(5e-324), 1.0);
    assert_eq!(d.quantile(0.2), representative(index_of(2.0)));
    let d = distribution_of(
        &(0..2000)
            .map(|i| f64::from(i) * 0.37 - 50.0)
            .collect::<Vec<_>>(),
    );
    for k in [0, 1, 500, 900, 950, 990, 999, 1000] {
        let q: f64 = format!("0.{k:03}").parse::<f64>().unwrap() + f64::from(u8::from(k == 1000));
        assert_eq!(
            d.quantile(q).to_bits(),
            d.quantile_thousandths(k).to_bits(),
            "{k}"
        );
    }
    assert_eq!(distribution_of(&[]).quantile(0.5), 0.0);
    assert!(distribution_of(&[f64::NAN]).quantile(0.5).is_nan());
    // Outside [0, 1] (the binding refuses it): the nearest end, no panic.
    let d = distribution_of(&samples);
    assert_eq!((d.quantile(1e300), d.quantile(-1.0)), (10.0, 1.0));
    assert_eq!(d.quantile(f64::NAN), 1.0);
}

#[test]
fn bucket_bounds_hold_exactly_their_bucket() {
    for index in [
        MIN_INDEX,
        MIN_INDEX + 64,
        -64 * 1022 - 1,
        -65,
        -1,
        0,
        1,
        37,
        63,
        64,
        MAX_INDEX,
    ] {
        let (lower, upper) = bucket_bounds(i64::from(index)).unwrap();
        assert_eq!(oracle(upper), index);
        assert!(upper == f64::MAX || oracle(upper.next_up()) > index);
        if lower > 0.0 {
            assert!(oracle(lower) < index);
        }
        assert_eq!(lower, bucket_upper(i64::from(index) - 1));
    }
    assert_eq!(bucket_bounds(63), Some((bucket_upper(62), 2.0)));
    assert_eq!(bucket_bounds(i64::from(MIN_INDEX)), Some((0.0, 5e-324)));
    assert_eq!(bucket_bounds(i64::from(MIN_INDEX) - 1), None);
    assert_eq!(bucket_bounds(i64::from(MAX_INDEX) + 1), None);
    assert_eq!(bucket_upper(i64::MIN), 0.0);
    assert_eq!(bucket_upper(i64::MAX), f64::MAX);
}

#[test]
fn exponential_halves_the_scale_until_each_sign_fits() {
    let d = distribution_of(&[1.5, 3.0, 1000.0, -0.001, 0.0]);
    let wide = d.buckets.exponential(1000);
    assert_eq!(wide.scale, 6);
    assert_eq!(wide.positive.offset, index_of(1.5));
    assert_eq!(
        wide.positive.counts.len() as i32,
        index_of(1000.0) - index_of(1.5) + 1
    );
    assert_eq!(wide.positive.counts.iter().sum::<u64>(), 3);
    assert_eq!(wide.negative.counts, vec![1]);
    let narrow = d.buckets.exponential(3);
    // 1.5 .. 1000 spans octaves 0 to 9: 10 at scale 0, 3 at scale -2.
    assert_eq!(narrow.scale, -2);
    assert_eq!(narrow.positive.offset, index_of(1.5) >> 8);
    assert_eq!(narrow.positive.counts, vec![2, 0, 1]);
    assert_eq!(narrow.negative.offset, index_of(0.001) >> 8);
    // Scale -10 is the floor, whatever the limit.
    let all = distribution_of(&[5e-324, f64::MAX]);
    assert_eq!(all.buckets.exponential(1).scale, MIN_EXPONENTIAL_SCALE);
    assert_eq!(
        distribution_of(&[]).buckets.exponential(3),
        Exponential {
            scale: 6,
            ..Exponential::default()
        }
    );
}

#[test]
fn exponential_at_most_keeps_a_fixed_scale_whatever_the_range() {
    let d = distribution_of(&[1.5, 3.0, 1000.0, -0.001, 0.0]);
    // Unbounded buckets: exactly the scale asked for, with every bucket the
    // range needs (1.5 .. 1000: octaves 0 to 9, 32 buckets each at scale 5).
    let fixed = d.buckets.exponential_at_most(u64::MAX, 5);
    assert_eq!(fixed.scale, 5);
    assert_eq!(fixed.positive.offset, index_of(1.5) >> 1);
    assert_eq!(
        fixed.positive.counts.len() as i32,
        (index_of(1000.0) >> 1) - (index_of(1.5) >> 1) + 1
    );
    assert_eq!(fixed.positive.counts.iter().sum::<u64>(), 3);
    assert_eq!(fixed.negative.offset, index_of(0.001) >> 1);
    // A narrower range gets the same scale: the bounds of a bucket do not
    // move from one export to the next.
    let narrow = distribution_of(&[1.5])
        .buckets
        .exponential_at_most(u64::MAX, 5);
    assert_eq!(
        (narrow.scale, narrow.positive.offset),
        (5, index_of(1.5) >> 1)
    );
    // max_buckets still lowers it further; the scale is clamped to -10..=6.
    assert_eq!(d.buckets.exponential_at_most(3, 5).scale, -2);
    assert_eq!(d.buckets.exponential_at_most(u64::MAX, 9).scale, 6);
    assert_eq!(
        d.buckets.exponential_at_most(u64::MAX, -20).scale,
        MIN_EXPONENTIAL_SCALE
    );
    assert_eq!(
        d.buckets.exponential_at_most(1000, 6),
        d.buckets.exponential(1000)
    );
}

#[test]
fn attribute_and_float_range_errors_are_worded_for_python() {
    assert_eq!(
        immutable_message("delete", "'sum'"),
        "Distribution is immutable: cannot delete 'sum'"
    );
    assert_eq!(
        float_range_problem(Some(400)),
        "must be within the float range, got an int of 400 digits"
    );
    assert_eq!(
        float_range_problem(None),
        "must be within the float range, got an int of over 4000 digits"
    );
}

#[test]
fn constructor_keyword_errors_are_worded_as_cpython_words_them() {
    assert_eq!(
        positional_message(2),
        "Distribution.__init__() takes 1 positional argument but 3 were given"
    );
    assert_eq!(
        unexpected_keyword_message("'x'"),
        "Distribution.__init__() got an unexpected keyword argument 'x'"
    );
    let given = |names: &[&str]| {
        let names: Vec<usize> = names.iter().filter_map(|n| field_index(n)).collect();
        missing_message(move |i| names.contains(&i))
    };
    assert_eq!(given(&["count", "sum", "min", "max"]), None);
    assert_eq!(
        given(&["count", "sum", "min"]).as_deref(),
        Some("Distribution.__init__() missing 1 required keyword-only argument: 'max'")
    );
    assert_eq!(
        given(&["count", "sum"]).as_deref(),
        Some("Distribution.__init__() missing 2 required keyword-only arguments: 'min' and 'max'")
    );
    assert_eq!(
        given(&[]).as_deref(),
        Some(
            "Distribution.__init__() missing 4 required keyword-only arguments: \
             'count', 'sum', 'min', and 'max'"
        )
    );
}

#[test]
fn dict_and_pair_problems_follow_the_argument_name() {
    assert_eq!(
        InvalidDict::UnknownKey("'x'".into()).to_string(),
        "has an unknown key 'x'"
    );
    assert_eq!(
        InvalidDict::MissingKey("sum").to_string(),
        "is missing the key 'sum'"
    );
    let tag = InvalidDict::FloatTag {
        got: "'NaN'".into(),
        key: "min",
    };
    assert_eq!(
        tag.to_string(),
        "holds 'NaN' at d['min'], where {\"$float\": ...} must be \"nan\", \"inf\" or \"-inf\""
    );
    let got = || "str".to_owned();
    assert_eq!(
        InvalidPair::NotPair { got: got() }.to_string(),
        "must hold (index, count) pairs, not str"
    );
    assert_eq!(
        InvalidPair::Length { got: "(1,)".into() }.to_string(),
        "must hold (index, count) pairs, got (1,)"
    );
    assert_eq!(
        InvalidPair::Index { got: got() }.to_string(),
        "must hold int bucket indices, not str"
    );
    assert_eq!(
        InvalidPair::Count { got: got() }.to_string(),
        "must hold int bucket counts, not str"
    );
    assert!(is_float_field("sum") && is_float_field("max") && !is_float_field("count"));
}

#[test]
fn checked_helpers_refuse_what_the_api_refuses() {
    assert_eq!(
        checked_bucket_bounds(0),
        bucket_bounds(0).ok_or(String::new())
    );
    let far = i128::from(MAX_INDEX) + 1;
    assert_eq!(
        checked_bucket_bounds(far),
        Err(format!(
            "must be in {MIN_INDEX}..{MAX_INDEX} (bucket {far} holds no finite double)"
        ))
    );
    assert!(checked_bucket_bounds(i128::MAX).is_err());
    assert_eq!(check_quantile(0.5, || unreachable!()), Ok(0.5));
    assert_eq!(
        check_quantile(f64::NAN, || "nan".into()),
        Err("must be in [0, 1], got nan".to_owned())
    );
    assert_eq!(
        check_quantile(1.5, || "1.5".into()).unwrap_err(),
        "must be in [0, 1], got 1.5"
    );
}

#[test]
fn ranks_past_the_buckets_counts_are_nan() {
    // A count of 3 non-NaN samples over buckets that hold 1 (no window makes
    // one; `from_parts` refuses it): ranks past the buckets are NaN, not a
    // panic or a bucket's value.
    let d = Distribution {
        count: 3,
        sum: 3.0,
        min: f64::NAN,
        max: f64::NAN,
        buckets: Buckets {
            positive: vec![(0, 1)],
            ..Buckets::default()
        },
    };
    assert!(d.quantile(1.0).is_nan());
    assert_eq!(d.quantile(0.0), f64::from_bits(0x3ff0_163d_a9fb_3335));
}
