//! `Distribution`: a closed window's histogram with its count, sum, min and
//! max, and every rule of `torchmon.Distribution` (docs/api.md,
//! "Distribution"): merge, the quantiles, the checked constructor
//! `from_parts` and its errors, the field list, the repr.

use super::{Buckets, MAX_INDEX, MIN_INDEX, SCALE, bucket_index, representative};
use crate::decimal::{self, python_repr};
use std::fmt;

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

/// How `to_dict` writes a non-finite sum, min or max, `{"$float": "nan"}`,
/// as the JSON-lines sink writes a data value; `from_dict` reads it back.
pub const FLOAT_TAG: &str = "$float";

/// What the binding calls `Distribution.__init__()` in the errors CPython
/// would raise for a Python function with its signature.
const INIT: &str = "Distribution.__init__()";

/// The `TypeError` message of positional arguments (`given` of them): the
/// constructor takes keywords only.
pub fn positional_message(given: usize) -> String {
    let given = given + 1; // `self`, as CPython counts
    format!("{INIT} takes 1 positional argument but {given} were given")
}

/// The `AttributeError` message of setting (`verb` "set") or deleting
/// ("delete") the attribute `name_repr` (its Python repr): a Distribution
/// is immutable.
pub fn immutable_message(verb: &str, name_repr: &str) -> String {
    format!("Distribution is immutable: cannot {verb} {name_repr}")
}

/// The problem of an int float argument past the float range, `digits`
/// long (`None`: over 4000 digits, too many to count), worded to follow
/// the argument's name.
pub fn float_range_problem(digits: Option<usize>) -> String {
    let digits = digits.map_or("over 4000".to_owned(), |n| n.to_string());
    format!("must be within the float range, got an int of {digits} digits")
}

/// The `TypeError` message of a keyword that is not a field; `repr` is the
/// keyword's Python repr.
pub fn unexpected_keyword_message(repr: &str) -> String {
    format!("{INIT} got an unexpected keyword argument {repr}")
}

/// The `TypeError` message of the `REQUIRED` fields not given (`given(i)`:
/// whether the field at `FIELDS[i]` was), worded as CPython words missing
/// keyword-only arguments; `None` when none is missing.
pub fn missing_message(given: impl Fn(usize) -> bool) -> Option<String> {
    let missing: Vec<String> = REQUIRED
        .iter()
        .filter(|name| field_index(name).is_some_and(|i| !given(i)))
        .map(|name| format!("'{name}'"))
        .collect();
    let (last, rest) = missing.split_last()?;
    let (s, names) = match rest {
        [] => ("", last.clone()),
        [one] => ("s", format!("{one} and {last}")),
        _ => ("s", format!("{}, and {last}", rest.join(", "))),
    };
    let count = missing.len();
    Some(format!(
        "{INIT} missing {count} required keyword-only argument{s}: {names}"
    ))
}

/// Why `from_dict`'s mapping was refused, before the constructor's checks:
/// worded to follow its argument's name, `d`.
#[derive(Clone, Debug, PartialEq)]
pub enum InvalidDict {
    /// A key that is not a field; its Python repr.
    UnknownKey(String),
    /// A `REQUIRED` field's key missing.
    MissingKey(&'static str),
    /// A `{"$float": ...}` tag at `key` holding `got` (its short repr), not
    /// "nan", "inf" or "-inf".
    FloatTag { got: String, key: &'static str },
}

impl fmt::Display for InvalidDict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownKey(repr) => write!(f, "has an unknown key {repr}"),
            Self::MissingKey(key) => write!(f, "is missing the key '{key}'"),
            Self::FloatTag { got, key } => write!(
                f,
                "holds {got} at d['{key}'], where {{\"{FLOAT_TAG}\": ...}} \
                 must be \"nan\", \"inf\" or \"-inf\""
            ),
        }
    }
}

/// Whether the field `name` is a float (`sum`, `min`, `max`), which
/// `to_dict` may write as a `FLOAT_TAG` tag.
pub fn is_float_field(name: &str) -> bool {
    matches!(name, "sum" | "min" | "max")
}

/// Why an item of `positive` or `negative` is not an `(index, count)` pair
/// of ints (its values are `check_bucket`'s): a `TypeError` but for
/// `Length`. Worded to follow the argument's name; `got` is the item's (or
/// the index's, the count's) Python type name, or for `Length` its short
/// repr.
#[derive(Clone, Debug, PartialEq)]
pub enum InvalidPair {
    /// Not an iterable.
    NotPair { got: String },
    /// An iterable of other than two items.
    Length { got: String },
    /// An index that is not an int.
    Index { got: String },
    /// A count that is not an int.
    Count { got: String },
}

impl fmt::Display for InvalidPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotPair { got } => write!(f, "must hold (index, count) pairs, not {got}"),
            Self::Length { got } => write!(f, "must hold (index, count) pairs, got {got}"),
            Self::Index { got } => write!(f, "must hold int bucket indices, not {got}"),
            Self::Count { got } => write!(f, "must hold int bucket counts, not {got}"),
        }
    }
}

/// `Distribution.bucket_bounds(index)`: the bounds of positive bucket
/// `index`, or the problem with `index` (worded to follow its name).
pub fn checked_bucket_bounds(index: i128) -> Result<(f64, f64), String> {
    i64::try_from(index)
        .ok()
        .and_then(super::bucket_bounds)
        .ok_or_else(|| {
            format!("must be in {MIN_INDEX}..{MAX_INDEX} (bucket {index} holds no finite double)")
        })
}

/// A quantile's `q`: in [0, 1]. The problem names `repr`, `q`'s Python repr.
pub fn check_quantile(q: f64, repr: impl FnOnce() -> String) -> Result<f64, String> {
    if (0.0..=1.0).contains(&q) {
        Ok(q)
    } else {
        Err(format!("must be in [0, 1], got {}", repr()))
    }
}
