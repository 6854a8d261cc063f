//! The protobuf exposition: length-delimited `io.prometheus.client.MetricFamily`
//! messages, the few of Prometheus's `metrics.proto` that a gauge and a
//! histogram need, encoded by hand (`Encoder`): a handful of field kinds,
//! so that neither a code generator nor `protoc` is needed to build the
//! package. Every field number is a named constant below, per message, by
//! the proto's field name; a test checks each against the proto's text
//! (tests/data/metrics.proto), and tests/prometheus_proto.py decodes the
//! bytes with protobuf's own Python runtime (tests/sinks) as does a real
//! Prometheus.

use super::{Cumulative, Exposition, Value, ZERO_THRESHOLD};
use crate::prometheus_server::Escaping;
use std::time::{SystemTime, UNIX_EPOCH};

/// Declares a module of field numbers per message, named as in
/// `metrics.proto` (the constant is the field name in upper case), and, for
/// the test against the proto, the table of them all.
macro_rules! fields {
    ($(
        $(#[$doc:meta])*
        mod $module:ident = $message:literal { $($field:ident = $number:literal,)* }
    )*) => {
        $(
            $(#[$doc])*
            mod $module {
                $(pub const $field: u32 = $number;)*
            }
        )*
        /// (message, constant, number) for every constant above.
        #[cfg(test)]
        const FIELDS: &[(&str, &str, u32)] = &[
            $($(($message, stringify!($field), $module::$field),)*)*
        ];
    };
}

fields! {
    /// `message MetricFamily`.
    mod metric_family = "MetricFamily" {
        NAME = 1,
        HELP = 2,
        TYPE = 3,
        METRIC = 4,
    }
    /// `message Metric`: one per family here, with the handler's labels.
    mod metric = "Metric" {
        LABEL = 1,
        GAUGE = 2,
        HISTOGRAM = 7,
    }
    /// `message LabelPair`.
    mod label_pair = "LabelPair" {
        NAME = 1,
        VALUE = 2,
    }
    /// `message Gauge`.
    mod gauge = "Gauge" {
        VALUE = 1,
    }
    /// `message Histogram`: the classic buckets, then the native ones.
    mod histogram = "Histogram" {
        SAMPLE_COUNT = 1,
        SAMPLE_SUM = 2,
        BUCKET = 3,
        CREATED_TIMESTAMP = 15,
        SCHEMA = 5,
        ZERO_THRESHOLD = 6,
        ZERO_COUNT = 7,
        NEGATIVE_SPAN = 9,
        NEGATIVE_DELTA = 10,
        POSITIVE_SPAN = 12,
        POSITIVE_DELTA = 13,
    }
    /// `message Bucket`: a classic bucket.
    mod bucket = "Bucket" {
        CUMULATIVE_COUNT = 1,
        UPPER_BOUND = 2,
    }
    /// `message Timestamp` of google/protobuf/timestamp.proto: a histogram's
    /// `created_timestamp`.
    mod timestamp = "Timestamp" {
        SECONDS = 1,
        NANOS = 2,
    }
    /// `message BucketSpan`: a run of consecutive native buckets.
    mod bucket_span = "BucketSpan" {
        OFFSET = 1,
        LENGTH = 2,
    }
}

/// `enum MetricType`: the values of `MetricFamily.type` written here.
mod metric_type {
    pub const GAUGE: u64 = 1;
    pub const HISTOGRAM: u64 = 4;
}

impl Exposition {
    /// Every metric family as length-delimited `io.prometheus.client.MetricFamily`
    /// messages (`application/vnd.google.protobuf;
    /// proto=io.prometheus.client.MetricFamily; encoding=delimited`).
    pub fn encode_protobuf(&self, out: &mut Vec<u8>) {
        self.encode_protobuf_as(out, Escaping::Underscores);
    }

    /// `encode_protobuf` with the names `names` shows (`Escaping`).
    pub fn encode_protobuf_as(&self, out: &mut Vec<u8>, names: Escaping) {
        let list = self.rendered();
        let mut family_bytes = Vec::new();
        let mut metric_bytes = Vec::new();
        let mut scratch = Vec::new();
        for family in list {
            family_bytes.clear();
            metric_bytes.clear();
            let mut f = Encoder(&mut family_bytes);
            let mut m = Encoder(&mut metric_bytes);
            for (name, value) in &self.labels {
                scratch.clear();
                let mut pair = Encoder(&mut scratch);
                pair.bytes(label_pair::NAME, name.as_bytes());
                pair.bytes(label_pair::VALUE, value.as_bytes());
                m.bytes(metric::LABEL, &scratch);
            }
            {
                let family = family.lock();
                f.bytes(metric_family::NAME, family.shown_name(names).as_bytes());
                f.bytes(metric_family::HELP, family.help.as_bytes());
                match &family.value {
                    Value::Gauge(value) => {
                        f.varint(metric_family::TYPE, metric_type::GAUGE);
                        scratch.clear();
                        Encoder(&mut scratch).double_always(gauge::VALUE, *value);
                        m.bytes(metric::GAUGE, &scratch);
                    }
                    Value::Histogram(cumulative) => {
                        f.varint(metric_family::TYPE, metric_type::HISTOGRAM);
                        scratch.clear();
                        self.encode_histogram(cumulative, family.created, &mut scratch);
                        m.bytes(metric::HISTOGRAM, &scratch);
                    }
                }
            }
            f.bytes(metric_family::METRIC, &metric_bytes);
            put_varint(out, family_bytes.len() as u64);
            out.extend_from_slice(&family_bytes);
        }
    }

    fn encode_histogram(
        &self,
        cumulative: &Cumulative,
        created: Option<SystemTime>,
        out: &mut Vec<u8>,
    ) {
        let native = cumulative.native(self.max_buckets);
        let mut h = Encoder(out);
        h.varint(histogram::SAMPLE_COUNT, native.count);
        h.double_always(histogram::SAMPLE_SUM, native.sum);
        // Since the epoch; a clock set before it gives no created time.
        if let Some(since) = created.and_then(|t| t.duration_since(UNIX_EPOCH).ok()) {
            let mut stamp = Vec::with_capacity(12);
            let mut t = Encoder(&mut stamp);
            t.varint(timestamp::SECONDS, since.as_secs());
            t.varint(timestamp::NANOS, u64::from(since.subsec_nanos()));
            h.bytes(histogram::CREATED_TIMESTAMP, &stamp);
        }
        if let Some(layout) = self.classic.as_ref().filter(|_| self.protobuf_classic) {
            let mut bucket_bytes = Vec::new();
            for (le, count) in cumulative.classic(layout) {
                bucket_bytes.clear();
                let mut b = Encoder(&mut bucket_bytes);
                b.varint(bucket::CUMULATIVE_COUNT, count);
                b.double_always(bucket::UPPER_BOUND, le);
                h.bytes(histogram::BUCKET, &bucket_bytes);
            }
        }
        h.sint(histogram::SCHEMA, i64::from(native.schema));
        h.double_always(histogram::ZERO_THRESHOLD, ZERO_THRESHOLD);
        h.varint(histogram::ZERO_COUNT, native.zero_count);
        let mut spans = Vec::new();
        for (buckets, span_field, delta_field) in [
            (
                &native.negative,
                histogram::NEGATIVE_SPAN,
                histogram::NEGATIVE_DELTA,
            ),
            (
                &native.positive,
                histogram::POSITIVE_SPAN,
                histogram::POSITIVE_DELTA,
            ),
        ] {
            let empty = native.negative.is_empty() && native.positive.is_empty();
            if buckets.is_empty() && !(empty && span_field == histogram::POSITIVE_SPAN) {
                continue;
            }
            // An empty histogram still carries one span of length 0, so that
            // a scraper recognises it as native.
            let mut runs: Vec<(i32, u32)> = Vec::new();
            let mut previous: Option<i32> = None;
            for &(key, _) in buckets {
                match (previous, runs.last_mut()) {
                    (Some(p), Some((_, length))) if key == p + 1 => *length += 1,
                    (Some(p), _) => runs.push((key - p - 1, 1)),
                    (None, _) => runs.push((key, 1)),
                }
                previous = Some(key);
            }
            if runs.is_empty() {
                runs.push((0, 0));
            }
            for (offset, length) in runs {
                spans.clear();
                let mut s = Encoder(&mut spans);
                s.sint(bucket_span::OFFSET, i64::from(offset));
                s.varint(bucket_span::LENGTH, u64::from(length));
                h.bytes(span_field, &spans);
            }
            if !buckets.is_empty() {
                // Packed sint64 deltas: each count minus the previous one.
                spans.clear();
                let mut last = 0i64;
                for &(_, count) in buckets {
                    let count = i64::try_from(count).unwrap_or(i64::MAX);
                    put_varint(&mut spans, zigzag(count.wrapping_sub(last)));
                    last = count;
                }
                h.bytes(delta_field, &spans);
            }
        }
    }
}

/// Protobuf wire format writer: field keys, varints, zigzag, doubles and
/// length-delimited fields. Proto3 scalars at their default are normally
/// left out; `double_always` writes one regardless (a gauge of 0.0 must
/// still say it is a gauge's value).
struct Encoder<'a>(&'a mut Vec<u8>);

impl Encoder<'_> {
    fn key(&mut self, field: u32, wire_type: u8) {
        put_varint(self.0, (u64::from(field) << 3) | u64::from(wire_type));
    }

    fn varint(&mut self, field: u32, value: u64) {
        if value != 0 {
            self.key(field, 0);
            put_varint(self.0, value);
        }
    }

    fn sint(&mut self, field: u32, value: i64) {
        self.varint(field, zigzag(value));
    }

    fn double_always(&mut self, field: u32, value: f64) {
        self.key(field, 1);
        self.0.extend_from_slice(&value.to_le_bytes());
    }

    fn bytes(&mut self, field: u32, bytes: &[u8]) {
        self.key(field, 2);
        put_varint(self.0, bytes.len() as u64);
        self.0.extend_from_slice(bytes);
    }
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Prometheus's metrics.proto (tests/data/metrics.proto, which names
    /// its source): per message or enum, each field's or value's number by
    /// name, from its `<type> <name> = <number>;` and `<NAME> = <number>;`
    /// lines.
    fn proto_numbers() -> HashMap<(String, String), u32> {
        let text = include_str!("../../tests/data/metrics.proto");
        let mut numbers = HashMap::new();
        let mut scope: Vec<String> = Vec::new();
        for line in text.lines() {
            let line = line.split("//").next().unwrap_or("").trim();
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["message" | "enum", name, "{"] => scope.push((*name).to_owned()),
                ["}"] => {
                    scope.pop();
                }
                _ if scope.is_empty() => {} // syntax, package
                _ => {
                    let Some((declaration, number)) = line.split_once('=') else {
                        continue;
                    };
                    let Some(name) = declaration.split_whitespace().last() else {
                        continue;
                    };
                    let number = number.trim().trim_end_matches(';').split('[').next();
                    let number: u32 =
                        number.unwrap_or("").trim().parse().unwrap_or_else(|_| {
                            panic!("{line:?}: not `<type> <name> = <number>;`")
                        });
                    let message = scope.last().expect("a field outside a message").clone();
                    let previous = numbers.insert((message, name.to_owned()), number);
                    assert!(previous.is_none(), "{line:?} twice");
                }
            }
        }
        assert!(scope.is_empty(), "unbalanced braces in metrics.proto");
        numbers
    }

    #[test]
    fn field_numbers_are_the_protos() {
        let proto = proto_numbers();
        for &(message, constant, number) in FIELDS {
            let name = constant.to_lowercase();
            assert_eq!(
                proto.get(&(message.to_owned(), name.clone())),
                Some(&number),
                "{message}.{name}"
            );
        }
        for (name, value) in [
            ("GAUGE", metric_type::GAUGE),
            ("HISTOGRAM", metric_type::HISTOGRAM),
        ] {
            let number = proto.get(&("MetricType".to_owned(), name.to_owned()));
            assert_eq!(
                number.map(|&n| u64::from(n)),
                Some(value),
                "MetricType.{name}"
            );
        }
    }

    #[test]
    fn the_writer_names_every_field_it_writes() {
        // Every field the writer writes goes through a constant checked
        // above: no call here takes a bare number as its field.
        let source = include_str!("protobuf.rs");
        let code = &source[..source.find("#[cfg(test)]\nmod tests").unwrap()];
        for call in [".varint(", ".sint(", ".double_always(", ".bytes("] {
            for (at, _) in code.match_indices(call) {
                let argument = code[at + call.len()..].trim_start();
                assert!(
                    !argument.starts_with(|c: char| c.is_ascii_digit()),
                    "a bare field number: {}",
                    &code[at..(at + 40).min(code.len())]
                );
            }
        }
    }

    #[test]
    fn varints_and_zigzag() {
        let mut out = Vec::new();
        put_varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
        assert_eq!(zigzag(0), 0);
        assert_eq!(zigzag(-1), 1);
        assert_eq!(zigzag(1), 2);
        assert_eq!(zigzag(-2), 3);
        assert_eq!(zigzag(i64::MIN), u64::MAX);
    }
}
