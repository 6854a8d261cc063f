//! One line of a JSON-lines log (the format of
//! python/torchmon/handlers/jsonl.py, docs/sinks.md) read without Python.
//!
//! [`parse`] reads the lines that `JsonlEventHandler` writes and that
//! `read_jsonl` reads as events. Anything else, an unreadable line and the
//! rare readable one this reader cannot vouch for, is [`NotHandled`] or not
//! [`Record::sure`]: the caller hands it to the Python reader, which says
//! what is wrong with it (its messages are the documented ones) or reads it
//! and writes its event again as the sink does, which `parse` then reads
//! (sure or not). So `parse` only has to be right when it is sure: a line it
//! takes must be one the Python reader takes, with the same event. That
//! rules out, here:
//!
//! - what Python's `json.loads` reads differently from serde_json or not at
//!   all: the `NaN`/`Infinity` literals (serde_json refuses them), integers
//!   beyond 64 bits (serde_json makes a float of them, Python an int that
//!   `Event` refuses: no float of magnitude 2**63 or more is sure), `-0` (an
//!   int 0 in Python, -0.0 for serde_json: no -0.0 is sure), duplicate keys (Python keeps the last value at the first
//!   key's place), nesting (serde_json stops at 128 levels; no value read
//!   here nests);
//! - keys the Python reader ignores, whose values it still parses (a
//!   4,301-digit integer there makes the line unreadable);
//! - timestamps other than `YYYY-MM-DDTHH:MM:SS[.ffffff][+HH:MM]` (what
//!   `datetime.isoformat()` writes), whose checks are `fromisoformat`'s (not
//!   sure).

use std::borrow::Cow;
use std::fmt;

use crate::histogram::{DistributionParts, FLOAT_TAG};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// A data value as `torchmon summarize` needs it: a number (an int or a
/// float, not a bool) as a float, or anything else.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    Number(f64),
    Other,
}

/// A window's histogram as the line stores it (`Distribution.to_dict()`),
/// not yet checked: its scale when given, and its parts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoredDistribution {
    pub scale: Option<u64>,
    pub parts: DistributionParts,
}

/// A line read: the event's name and data (in the line's order), and the
/// stored distribution when there is one.
#[derive(Clone, Debug, PartialEq)]
pub struct Record<'a> {
    pub name: Cow<'a, str>,
    /// As the line has it; and its `fold` (0 when left out).
    pub timestamp: Cow<'a, str>,
    pub fold: bool,
    pub data: Vec<(Cow<'a, str>, Value)>,
    pub distribution: Option<StoredDistribution>,
    /// Whether Python's reader reads the line as the same event: false when
    /// the timestamp is not in `is_isoformat`'s subset, or a float is -0.0
    /// or of magnitude 2**63 or more (see the module documentation).
    pub sure: bool,
}

/// A line left to the Python reader (see the module documentation).
#[derive(Debug, PartialEq, Eq)]
pub struct NotHandled;

/// The event of one line (its newline, if any, included); see
/// [`Record::sure`].
pub fn parse(line: &[u8]) -> Result<Record<'_>, NotHandled> {
    let mut de = serde_json::Deserializer::from_slice(line);
    let record = de.deserialize_map(RecordVisitor).map_err(|_| NotHandled)?;
    de.end().map_err(|_| NotHandled)?;
    Ok(record)
}

fn not_handled<E: de::Error>() -> E {
    E::custom("left to the Python reader")
}

/// A JSON string, borrowed from the line when it has no escapes.
struct Text<'a>(Cow<'a, str>);

impl<'de> de::Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

struct RecordVisitor;

impl<'de> Visitor<'de> for RecordVisitor {
    type Value = Record<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an event")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Record<'de>, A::Error> {
        let (mut name, mut timestamp, mut fold, mut data, mut distribution) =
            (None, None, None, None, None);
        while let Some(key) = map.next_key::<Text<'de>>()? {
            match &*key.0 {
                "name" if name.is_none() => name = Some(map.next_value::<Text<'de>>()?.0),
                "timestamp" if timestamp.is_none() => {
                    let text = map.next_value::<Text<'de>>()?.0;
                    timestamp = Some((is_isoformat(text.as_bytes()), text));
                }
                "fold" if fold.is_none() => {
                    // 0 or 1 exactly: true, 1.0 and null are Python's to refuse.
                    match map.next_value::<u64>()? {
                        0 => fold = Some(false),
                        1 => fold = Some(true),
                        _ => return Err(not_handled()),
                    }
                }
                "data" if data.is_none() => data = Some(map.next_value_seed(DataSeed)?),
                "distribution" if distribution.is_none() => {
                    distribution = Some(map.next_value::<Option<Stored>>()?.map(|s| s.0));
                }
                _ => return Err(not_handled()),
            }
        }
        let (Some(name), Some((usual_timestamp, timestamp)), Some(data)) = (name, timestamp, data)
        else {
            return Err(not_handled());
        };
        let distribution = distribution.flatten();
        let numbers = data.iter().filter_map(|(_, v)| match v {
            Value::Number(x) => Some(*x),
            Value::Other => None,
        });
        let stored = distribution
            .iter()
            .flat_map(|d| [d.parts.sum, d.parts.min, d.parts.max]);
        let sure = usual_timestamp && numbers.chain(stored).all(plain_float);
        Ok(Record {
            name,
            timestamp,
            fold: fold.unwrap_or(false),
            data,
            distribution,
            sure,
        })
    }
}

struct DataSeed;

impl<'de> DeserializeSeed<'de> for DataSeed {
    type Value = Vec<(Cow<'de, str>, Value)>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for DataSeed {
    type Value = Vec<(Cow<'de, str>, Value)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("event data")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut data: Vec<(Cow<'de, str>, Value)> = Vec::with_capacity(8);
        while let Some(key) = map.next_key::<Text<'de>>()? {
            let value = map.next_value::<DataValue>()?.0;
            if data.iter().any(|(k, _)| *k == key.0) {
                return Err(not_handled());
            }
            data.push((key.0, value));
        }
        Ok(data)
    }
}

/// A data value: a string, a bool, an int of int64, a float, or the object
/// `{"$float": "nan" | "inf" | "-inf"}`.
struct DataValue(Value);

/// Whether Python reads `v`'s text as the same float: not -0.0 (`-0` is an
/// int 0 there) and, if finite, below 2**63 in magnitude (a longer integer
/// is an int there).
fn plain_float(v: f64) -> bool {
    let negative_zero = v == 0.0 && v.is_sign_negative();
    let long_int = v.is_finite() && v.abs() >= 9_223_372_036_854_775_808.0;
    !(negative_zero || long_int)
}

fn tagged_float<'de, A: MapAccess<'de>>(mut map: A) -> Result<f64, A::Error> {
    let key = map.next_key::<Text<'de>>()?.ok_or_else(not_handled)?;
    if key.0 != FLOAT_TAG {
        return Err(not_handled());
    }
    let value = match &*map.next_value::<Text<'de>>()?.0 {
        "nan" => f64::NAN,
        "inf" => f64::INFINITY,
        "-inf" => f64::NEG_INFINITY,
        _ => return Err(not_handled()),
    };
    if map.next_key::<Text<'de>>()?.is_some() {
        return Err(not_handled());
    }
    Ok(value)
}

impl<'de> de::Deserialize<'de> for DataValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = DataValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a data value")
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<DataValue, E> {
                Ok(DataValue(Value::Other))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<DataValue, E> {
                Ok(DataValue(Value::Number(v as f64)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<DataValue, E> {
                match i64::try_from(v) {
                    Ok(v) => Ok(DataValue(Value::Number(v as f64))),
                    Err(_) => Err(not_handled()),
                }
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<DataValue, E> {
                Ok(DataValue(Value::Number(v)))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<DataValue, E> {
                Ok(DataValue(Value::Other))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<DataValue, A::Error> {
                Ok(DataValue(Value::Number(tagged_float(map)?)))
            }
        }
        d.deserialize_any(V)
    }
}

/// `Distribution.to_dict()` as stored; the checks are
/// `histogram::Distribution`'s, not made here.
struct Stored(StoredDistribution);

/// A count: an int of 0 or more (a bool, a float or a negative int is
/// Python's to refuse).
struct Count(u64);

impl<'de> de::Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Count;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a count")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Count, E> {
                Ok(Count(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// sum, min or max: an int or a float (as Python's `float()` of it) or a
/// tagged non-finite one.
struct StoredFloat(f64);

impl<'de> de::Deserialize<'de> for StoredFloat {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StoredFloat;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a float")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<StoredFloat, E> {
                Ok(StoredFloat(v as f64))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<StoredFloat, E> {
                match i64::try_from(v) {
                    Ok(v) => Ok(StoredFloat(v as f64)),
                    Err(_) => Err(not_handled()),
                }
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<StoredFloat, E> {
                Ok(StoredFloat(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<StoredFloat, A::Error> {
                Ok(StoredFloat(tagged_float(map)?))
            }
        }
        d.deserialize_any(V)
    }
}

/// `[[index, count], ...]`.
struct Buckets(Vec<(i64, u64)>);

impl<'de> de::Deserialize<'de> for Buckets {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Buckets;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("buckets")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Buckets, A::Error> {
                let mut buckets = Vec::with_capacity(seq.size_hint().unwrap_or(64));
                while let Some(Pair(index, count)) = seq.next_element::<Pair>()? {
                    buckets.push((index, count));
                }
                Ok(Buckets(buckets))
            }
        }
        d.deserialize_seq(V)
    }
}

struct Pair(i64, u64);

impl<'de> de::Deserialize<'de> for Pair {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Pair;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("[index, count]")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Pair, A::Error> {
                let index = seq.next_element::<i64>()?.ok_or_else(not_handled)?;
                let count = seq.next_element::<Count>()?.ok_or_else(not_handled)?;
                if seq.next_element::<de::IgnoredAny>()?.is_some() {
                    return Err(not_handled());
                }
                Ok(Pair(index, count.0))
            }
        }
        d.deserialize_seq(V)
    }
}

impl<'de> de::Deserialize<'de> for Stored {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Stored;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a distribution")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Stored, A::Error> {
                let mut s = StoredDistribution::default();
                let p = &mut s.parts;
                let mut seen = 0u16;
                while let Some(key) = map.next_key::<Text<'de>>()? {
                    let bit = match &*key.0 {
                        "scale" => 0,
                        "count" => 1,
                        "sum" => 2,
                        "min" => 3,
                        "max" => 4,
                        "zero_count" => 5,
                        "nan_count" => 6,
                        "positive_inf_count" => 7,
                        "negative_inf_count" => 8,
                        "positive" => 9,
                        "negative" => 10,
                        _ => return Err(not_handled()),
                    };
                    if seen & (1 << bit) != 0 {
                        return Err(not_handled());
                    }
                    seen |= 1 << bit;
                    match bit {
                        0 => s.scale = Some(map.next_value::<Count>()?.0),
                        1 => p.count = map.next_value::<Count>()?.0,
                        2 => p.sum = map.next_value::<StoredFloat>()?.0,
                        3 => p.min = map.next_value::<StoredFloat>()?.0,
                        4 => p.max = map.next_value::<StoredFloat>()?.0,
                        5 => p.zero_count = map.next_value::<Count>()?.0,
                        6 => p.nan_count = map.next_value::<Count>()?.0,
                        7 => p.positive_inf_count = map.next_value::<Count>()?.0,
                        8 => p.negative_inf_count = map.next_value::<Count>()?.0,
                        9 => p.positive = map.next_value::<Buckets>()?.0,
                        _ => p.negative = map.next_value::<Buckets>()?.0,
                    }
                }
                // count, sum, min and max have no default.
                if seen & 0b11110 != 0b11110 {
                    return Err(not_handled());
                }
                Ok(Stored(s))
            }
        }
        d.deserialize_map(V)
    }
}

/// Whether `text` is `YYYY-MM-DDTHH:MM:SS[.ffffff][+HH:MM]` with a valid
/// date and time: a subset of what `datetime.fromisoformat` reads on every
/// Python torchmon supports (the rest is left to it).
pub fn is_isoformat(text: &[u8]) -> bool {
    fn digits(t: &[u8], at: usize, n: usize) -> Option<u32> {
        let part = t.get(at..at + n)?;
        part.iter().try_fold(0u32, |acc, &b| {
            b.is_ascii_digit().then(|| acc * 10 + u32::from(b - b'0'))
        })
    }
    fn at(t: &[u8], i: usize, b: u8) -> bool {
        t.get(i) == Some(&b)
    }
    let date_time = (|| {
        let year = digits(text, 0, 4)?;
        let month = digits(text, 5, 2)?;
        let day = digits(text, 8, 2)?;
        let ok = at(text, 4, b'-')
            && at(text, 7, b'-')
            && at(text, 10, b'T')
            && at(text, 13, b':')
            && at(text, 16, b':')
            && digits(text, 11, 2)? < 24
            && digits(text, 14, 2)? < 60
            && digits(text, 17, 2)? < 60;
        let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
        let days = [
            31,
            if leap { 29 } else { 28 },
            31,
            30,
            31,
            30,
            31,
            31,
            30,
            31,
            30,
            31,
        ];
        Some(
            ok && year >= 1
                && (1..=12).contains(&month)
                && day >= 1
                && day <= days[month as usize - 1],
        )
    })();
    if date_time != Some(true) {
        return false;
    }
    let mut rest = &text[19..];
    if rest.first() == Some(&b'.') {
        if digits(rest, 1, 6).is_none() {
            return false;
        }
        rest = &rest[7..];
    }
    match rest {
        [] => true,
        [b'+' | b'-', ..] if rest.len() == 6 => {
            at(rest, 3, b':')
                && digits(rest, 1, 2).is_some_and(|h| h < 24)
                && digits(rest, 4, 2).is_some_and(|m| m < 60)
        }
        _ => false,
    }
}
