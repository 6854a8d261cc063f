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

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Two expositions whose bodies between them take every path of the
    /// encoder: labels, a gauge at 0 and one below it, a histogram with a
    /// created time, classic buckets, both native sides with a gap and a
    /// falling count (a negative delta), the infinities and a zero bucket,
    /// an empty histogram (its one span of length 0), and a schema reduced
    /// below 0 by a bucket limit of 1.
    fn representative_bodies() -> Vec<Vec<u8>> {
        let created = UNIX_EPOCH + std::time::Duration::new(1_700_000_000, 123_456_789);
        let mut bodies = Vec::new();
        for max_buckets in [160, 1] {
            let layout = super::super::ClassicLayout::new(1, 1.0, 4.0).unwrap();
            let e = Exposition::new(
                vec![("job".into(), "train".into()), ("rank".into(), "0".into())],
                max_buckets,
                Some(layout),
                true,
            );
            e.declare("g_zero", "a gauge at 0", false).unwrap();
            e.declare("g", "a gauge", false).unwrap();
            e.set_gauge("g", -2.5);
            e.declare("h", "a histogram", true).unwrap();
            e.update_histogram("h", |c| {
                c.add_window(
                    1234.5,
                    2,
                    1,
                    1,
                    [(-1, 1), (0, 4), (37, 3), (200, 2), (900, 1)],
                    [(5, 1), (6, 3), (70, 1)],
                )
            });
            e.declare("h_empty", "an empty histogram", true).unwrap();
            for family in &e.families.lock().list {
                let mut family = family.lock();
                if family.created.is_some() {
                    family.created = Some(created);
                }
            }
            let mut body = Vec::new();
            e.encode_protobuf(&mut body);
            bodies.push(body);
        }
        bodies
    }

    // The expected bytes were produced by this encoder before its writer
    // became the shared one (crate::wire), which must not change a byte;
    // the encoder's bodies are decoded by protobuf's own Python runtime,
    // from metrics.proto's field numbers (tests/prometheus_proto.py), in
    // the Python tests of tests/sinks.
    #[test]
    fn the_bodies_are_byte_for_byte_those_before_the_wire_module() {
        let bodies: Vec<String> = representative_bodies().iter().map(|b| hex(b)).collect();
        assert_eq!(
            bodies,
            [
                "3e0a06675f7a65726f120c612067617567652061742030180122240a0c0a036a6f62120574726169\
                 6e0a090a0472616e6b1201301209090000000000000000340a016712076120676175676518012224\
                 0a0c0a036a6f621205747261696e0a090a0472616e6b12013012090900000000000004c0cc010a01\
                 68120b6120686973746f6772616d180422b7010a0c0a036a6f621205747261696e0a090a0472616e\
                 6b1201303a9b0108141100000000004a93407a0b0880e2cfaa0610959aef3a1a0b08081100000000\
                 000000001a0b080911000000000000f03f1a0b08101100000000000000401a0b0810110000000000\
                 001040280c31000000000000f03738024a04080c10024a04087e10014a0608f0fe07100152040204\
                 030062021002620408481001620508c4021001620508f60a1001620608f4f10710016a0602060101\
                 01008b010a07685f656d7074791212616e20656d70747920686973746f6772616d1804226a0a0c0a\
                 036a6f621205747261696e0a090a0472616e6b1201303a4f1100000000000000007a0b0880e2cfaa\
                 0610959aef3a1a091100000000000000001a0911000000000000f03f1a091100000000000000401a\
                 09110000000000001040280c31000000000000f0376200",
                "3e0a06675f7a65726f120c612067617567652061742030180122240a0c0a036a6f62120574726169\
                 6e0a090a0472616e6b1201301209090000000000000000340a016712076120676175676518012224\
                 0a0c0a036a6f621205747261696e0a090a0472616e6b12013012090900000000000004c0a8010a01\
                 68120b6120686973746f6772616d18042293010a0c0a036a6f621205747261696e0a090a0472616e\
                 6b1201303a7808141100000000004a93407a0b0880e2cfaa0610959aef3a1a0b0808110000000000\
                 0000001a0b080911000000000000f03f1a0b08101100000000000000401a0b081011000000000000\
                 1040280731000000000000f03738024a04080210014a04087c100152020a07620210026204087c10\
                 016a030212118b010a07685f656d7074791212616e20656d70747920686973746f6772616d180422\
                 6a0a0c0a036a6f621205747261696e0a090a0472616e6b1201303a4f1100000000000000007a0b08\
                 80e2cfaa0610959aef3a1a091100000000000000001a0911000000000000f03f1a09110000000000\
                 0000401a09110000000000001040280c31000000000000f0376200",
            ]
        );
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
