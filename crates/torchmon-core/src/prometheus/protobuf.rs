//! The protobuf exposition: length-delimited `io.prometheus.client.MetricFamily`
//! messages, the few of Prometheus's `metrics.proto` that a gauge and a
//! histogram need, written with the crate's one protobuf writer
//! (`crate::wire::protobuf`). Every field number is a named constant below,
//! per message, by the proto's field name; a test checks each against the
//! proto's text (tests/data/metrics.proto), and tests/prometheus_proto.py
//! decodes the bytes with protobuf's own Python runtime (tests/sinks) as
//! does a real Prometheus.

use super::negotiate::Escaping;
use super::{Cumulative, Exposition, Value, ZERO_THRESHOLD};
use crate::wire::protobuf::{Encoder, delimited, fields};
use std::time::{SystemTime, UNIX_EPOCH};

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
        for family in self.rendered() {
            let family = family.lock();
            delimited(out, |f| {
                f.bytes(metric_family::NAME, family.shown_name(names).as_bytes());
                f.bytes(metric_family::HELP, family.help.as_bytes());
                let kind = match family.value {
                    Value::Gauge(_) => metric_type::GAUGE,
                    Value::Histogram(_) => metric_type::HISTOGRAM,
                };
                f.varint(metric_family::TYPE, kind);
                f.message(metric_family::METRIC, |m| {
                    for (name, value) in &self.labels {
                        m.message(metric::LABEL, |pair| {
                            pair.bytes(label_pair::NAME, name.as_bytes());
                            pair.bytes(label_pair::VALUE, value.as_bytes());
                        });
                    }
                    match &family.value {
                        Value::Gauge(value) => m.message(metric::GAUGE, |g| {
                            g.double_always(gauge::VALUE, *value);
                        }),
                        Value::Histogram(cumulative) => m.message(metric::HISTOGRAM, |h| {
                            self.encode_histogram(cumulative, family.created, h);
                        }),
                    }
                });
            });
        }
    }

    fn encode_histogram(
        &self,
        cumulative: &Cumulative,
        created: Option<SystemTime>,
        h: &mut Encoder<'_>,
    ) {
        let native = cumulative.native(self.max_buckets);
        h.varint(histogram::SAMPLE_COUNT, native.count);
        h.double_always(histogram::SAMPLE_SUM, native.sum);
        // Since the epoch; a clock set before it gives no created time.
        if let Some(since) = created.and_then(|t| t.duration_since(UNIX_EPOCH).ok()) {
            h.message(histogram::CREATED_TIMESTAMP, |t| {
                t.varint(timestamp::SECONDS, since.as_secs());
                t.varint(timestamp::NANOS, u64::from(since.subsec_nanos()));
            });
        }
        if let Some(layout) = self.classic.as_ref().filter(|_| self.protobuf_classic) {
            for (le, count) in cumulative.classic(layout) {
                h.message(histogram::BUCKET, |b| {
                    b.varint(bucket::CUMULATIVE_COUNT, count);
                    b.double_always(bucket::UPPER_BOUND, le);
                });
            }
        }
        h.sint(histogram::SCHEMA, i64::from(native.schema));
        h.double_always(histogram::ZERO_THRESHOLD, ZERO_THRESHOLD);
        h.varint(histogram::ZERO_COUNT, native.zero_count);
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
                h.message(span_field, |s| {
                    s.sint(bucket_span::OFFSET, i64::from(offset));
                    s.varint(bucket_span::LENGTH, u64::from(length));
                });
            }
            // Each count minus the previous one.
            let counts = buckets
                .iter()
                .map(|&(_, count)| i64::try_from(count).unwrap_or(i64::MAX));
            let deltas = std::iter::once(0)
                .chain(counts.clone())
                .zip(counts)
                .map(|(last, count)| count.wrapping_sub(last));
            h.packed_sints(delta_field, deltas);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::protobuf::test_support;

    const PROTO: &str = include_str!("../../tests/data/metrics.proto");

    #[test]
    fn field_numbers_are_the_protos() {
        test_support::assert_fields_are_the_protos(FIELDS, PROTO);
        let proto = test_support::proto_numbers(PROTO);
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
        test_support::assert_no_bare_field_numbers(include_str!("protobuf.rs"));
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
}
