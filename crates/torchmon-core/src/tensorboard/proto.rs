//! The few messages of TensorBoard's `event.proto`, `summary.proto` and
//! `histogram.proto` that a window needs (`Event`, `Summary`,
//! `Summary.Value`, `HistogramProto`), written with the crate's one
//! protobuf writer (`crate::wire::protobuf`): every field number is a named
//! constant below, checked by a test against tests/data/tensorboard.proto
//! (written out from tensorboard's own descriptors), and the bytes of a
//! whole event are checked against what tensorboard's protobuf runtime
//! writes.

use crate::histogram::{Distribution, bucket_upper, representative};
use crate::wire::protobuf::{Encoder, fields};

fields! {
    /// `message Event` (tensorboard/compat/proto/event.proto).
    mod event = "Event" {
        WALL_TIME = 1,
        STEP = 2,
        FILE_VERSION = 3,
        SUMMARY = 5,
    }
    /// `message Summary`.
    mod summary = "Summary" {
        VALUE = 1,
    }
    /// `message Summary.Value`.
    mod value = "Value" {
        TAG = 1,
        SIMPLE_VALUE = 2,
        HISTO = 5,
    }
    /// `message HistogramProto`.
    mod histogram_proto = "HistogramProto" {
        MIN = 1,
        MAX = 2,
        NUM = 3,
        SUM = 4,
        SUM_SQUARES = 5,
        BUCKET_LIMIT = 6,
        BUCKET = 7,
    }
}

/// What TensorBoard's loader expects as the first event of a file.
pub const FILE_VERSION: &str = "brain.Event:2";

/// One `Event` holding one `Summary`: the scalars and histograms of a window
/// (or of the windows that close with the same step).
#[derive(Clone, Debug, Default)]
pub struct SummaryEvent {
    pub wall_time: f64,
    pub step: i64,
    pub scalars: Vec<(String, f64)>,
    pub histograms: Vec<(String, std::sync::Arc<Distribution>)>,
}

/// The `Event` that opens a file: `file_version: "brain.Event:2"`.
pub fn encode_file_version(wall_time: f64, out: &mut Vec<u8>) {
    let mut e = Encoder::new(out);
    e.double(event::WALL_TIME, wall_time);
    e.bytes(event::FILE_VERSION, FILE_VERSION.as_bytes());
}

impl SummaryEvent {
    /// The `Event` message.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut e = Encoder::new(out);
        e.double(event::WALL_TIME, self.wall_time);
        e.varint(event::STEP, self.step as u64);
        e.message(event::SUMMARY, |s| {
            for (tag, number) in &self.scalars {
                s.message(summary::VALUE, |v| {
                    v.bytes(value::TAG, tag.as_bytes());
                    // `float` in summary.proto: TensorBoard keeps scalars as
                    // float32 (NaN and the infinities included), as
                    // SummaryWriter's add_scalar does.
                    v.float_always(value::SIMPLE_VALUE, *number as f32);
                });
            }
            for (tag, distribution) in &self.histograms {
                s.message(summary::VALUE, |v| {
                    v.bytes(value::TAG, tag.as_bytes());
                    v.message(value::HISTO, |h| encode_histogram(distribution, h));
                });
            }
        });
    }
}

/// A window's histogram as TensorBoard's buckets: `bucket_limit[i]` is the
/// right edge of bucket `i`, which holds the samples above
/// `bucket_limit[i-1]` (above `min` for the first). The scale-6 buckets in
/// ascending order: the negative ones (limit just below `-lower`: a bucket
/// holds the magnitudes above `lower`), zero (limit 0), the positive ones
/// (limit `upper`); a gap between two buckets gets an empty bucket, so that
/// no bucket seems wider than it is. NaN and infinite samples count in
/// `num` only: TensorBoard's dashboards interpolate between the limits,
/// `min` and `max`, which an infinity would turn into NaN (TensorFlow's own
/// histograms refuse non-finite values).
pub fn histogram_buckets(d: &Distribution) -> (Vec<f64>, Vec<f64>) {
    let b = &d.buckets;
    let mut limits = Vec::new();
    let mut counts = Vec::new();
    let mut push = |left: Option<f64>, right: f64, count: u64| {
        if let (Some(left), Some(&last)) = (left, limits.last())
            && last < left
        {
            limits.push(left);
            counts.push(0.0);
        }
        limits.push(right);
        counts.push(count as f64);
    };
    for &(index, count) in b.negative.iter().rev() {
        let index = i64::from(index);
        // Magnitudes in (lower, upper] are the samples in
        // [-upper, -lower): as a bucket of TensorBoard's, open on the left
        // and closed on the right, (-next_up(upper), -next_up(lower)].
        push(
            Some(-bucket_upper(index).next_up()),
            -bucket_upper(index - 1).next_up(),
            count,
        );
    }
    if b.zero_count > 0 {
        push(None, 0.0, b.zero_count);
    }
    for &(index, count) in &b.positive {
        let index = i64::from(index);
        push(Some(bucket_upper(index - 1)), bucket_upper(index), count);
    }
    (limits, counts)
}

/// `min` and `max` of the finite samples: the window's own when finite,
/// else the outer edge of the outermost finite bucket (0 when there is
/// none), so that the dashboards' interpolation stays finite.
pub fn histogram_range(d: &Distribution) -> (f64, f64) {
    let b = &d.buckets;
    let lowest = if let Some(&(index, _)) = b.negative.last() {
        -bucket_upper(i64::from(index))
    } else if b.zero_count > 0 {
        0.0
    } else if let Some(&(index, _)) = b.positive.first() {
        bucket_upper(i64::from(index) - 1)
    } else {
        0.0
    };
    let highest = if let Some(&(index, _)) = b.positive.last() {
        bucket_upper(i64::from(index))
    } else if b.zero_count > 0 {
        0.0
    } else if let Some(&(index, _)) = b.negative.first() {
        -bucket_upper(i64::from(index) - 1)
    } else {
        0.0
    };
    let min = if d.min.is_finite() { d.min } else { lowest };
    let max = if d.max.is_finite() { d.max } else { highest };
    (min, max)
}

/// The sum of the squares of the finite samples, estimated from each
/// bucket's representative (a window keeps no sum of squares).
fn sum_squares(d: &Distribution) -> f64 {
    let b = &d.buckets;
    b.positive
        .iter()
        .chain(&b.negative)
        .map(|&(index, count)| {
            let r = representative(index);
            r * r * count as f64
        })
        .sum()
}

/// The window's sum, or, when an infinity or a NaN made it non-finite, the
/// finite samples' sum estimated from the buckets' representatives.
fn finite_sum(d: &Distribution) -> f64 {
    if d.sum.is_finite() {
        return d.sum;
    }
    let b = &d.buckets;
    let side = |side: &[(i32, u64)]| -> f64 {
        side.iter()
            .map(|&(index, count)| representative(index) * count as f64)
            .sum()
    };
    side(&b.positive) - side(&b.negative)
}

fn encode_histogram(d: &Distribution, h: &mut Encoder<'_>) {
    let (limits, counts) = histogram_buckets(d);
    let (min, max) = histogram_range(d);
    h.double(histogram_proto::MIN, min);
    h.double(histogram_proto::MAX, max);
    h.double(histogram_proto::NUM, d.count as f64);
    h.double(histogram_proto::SUM, finite_sum(d));
    h.double(histogram_proto::SUM_SQUARES, sum_squares(d));
    h.packed_doubles(histogram_proto::BUCKET_LIMIT, &limits);
    h.packed_doubles(histogram_proto::BUCKET, &counts);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::histogram::bucket_index;
    use crate::wire::protobuf::test_support;
    use std::sync::Arc;

    #[test]
    fn field_numbers_are_the_protos() {
        let proto = include_str!("../../tests/data/tensorboard.proto");
        test_support::assert_fields_are_the_protos(FIELDS, proto);
    }

    #[test]
    fn the_writer_names_every_field_it_writes() {
        test_support::assert_no_bare_field_numbers(include_str!("proto.rs"));
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    // The expected bytes are what tensorboard 2.21's event_pb2 writes for
    // the same Event (SerializeToString), so that the encoding is protobuf's,
    // field order and packing included.
    #[test]
    fn a_summary_event_is_encoded_as_protobuf_does() {
        let mut out = Vec::new();
        let mut e = Encoder::new(&mut out);
        e.double(event::WALL_TIME, 1.5);
        e.varint(event::STEP, 3);
        e.message(event::SUMMARY, |s| {
            s.message(summary::VALUE, |v| {
                v.bytes(value::TAG, b"a");
                v.float_always(value::SIMPLE_VALUE, 0.5);
            });
            s.message(summary::VALUE, |v| {
                v.bytes(value::TAG, b"h");
                v.message(value::HISTO, |h| {
                    h.double(histogram_proto::MIN, 1.0);
                    h.double(histogram_proto::MAX, 2.0);
                    h.double(histogram_proto::NUM, 2.0);
                    h.double(histogram_proto::SUM, 3.0);
                    h.double(histogram_proto::SUM_SQUARES, 5.0);
                    h.packed_doubles(histogram_proto::BUCKET_LIMIT, &[1.0, 2.0]);
                    h.packed_doubles(histogram_proto::BUCKET, &[1.0, 1.0]);
                });
            });
        });
        assert_eq!(
            hex(&out),
            "09000000000000f83f10032a620a080a0161150000003f0a560a01682a5109000000000000f03f11\
             00000000000000401900000000000000402100000000000008402900000000000014403210000000\
             000000f03f00000000000000403a10000000000000f03f000000000000f03f"
        );
    }

    #[test]
    fn scalars_file_version_and_negative_steps() {
        let mut out = Vec::new();
        encode_file_version(1.5, &mut out);
        assert_eq!(
            hex(&out),
            "09000000000000f83f1a0d627261696e2e4576656e743a32"
        );
        out.clear();
        let event = SummaryEvent {
            wall_time: 1.5,
            step: -1,
            scalars: vec![("z".to_owned(), 0.0)],
            histograms: vec![],
        };
        event.encode(&mut out);
        assert_eq!(
            hex(&out),
            "09000000000000f83f10ffffffffffffffffff012a0a0a080a017a1500000000"
        );
    }

    fn distribution_of(samples: &[f64]) -> Distribution {
        let histogram = crate::histogram::Histogram::new();
        for &s in samples {
            histogram.record::<false>(s);
        }
        let finite: Vec<f64> = samples.iter().copied().filter(|s| !s.is_nan()).collect();
        Distribution {
            count: samples.len() as u64,
            sum: samples.iter().sum(),
            min: finite.iter().copied().fold(f64::INFINITY, f64::min),
            max: finite.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            buckets: histogram.take(),
        }
    }

    #[test]
    fn histogram_buckets_ascend_and_hold_every_sample() {
        let samples = [
            -3.0,
            -3.0,
            -0.25,
            0.0,
            1.0,
            1.01,
            100.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ];
        let d = distribution_of(&samples);
        let (limits, counts) = histogram_buckets(&d);
        assert_eq!(limits.len(), counts.len());
        assert!(limits.windows(2).all(|w| w[0] < w[1]), "{limits:?}");
        // Every non-NaN sample is in the bucket whose limit is the first at
        // or above it.
        for &s in samples.iter().filter(|s| s.is_finite()) {
            let at = limits.iter().position(|&l| s <= l).unwrap();
            assert!(counts[at] > 0.0, "{s} falls in an empty bucket");
            if at > 0 {
                assert!(s > limits[at - 1]);
            }
        }
        assert_eq!(counts.iter().sum::<f64>(), 7.0);
        // -3.0 twice: one bucket, counted twice, whose right edge is just
        // below the lower bound of its magnitude's bucket.
        let at = limits.iter().position(|&l| -3.0 <= l).unwrap();
        assert_eq!(counts[at], 2.0);
        let index = i64::from(bucket_index(3.0f64.to_bits()));
        assert_eq!(limits[at], -bucket_upper(index - 1).next_up());
        // min and max of the finite samples, from the outermost buckets:
        // -3.0's bucket's lower edge and 100.0's bucket's upper one.
        let (min, max) = histogram_range(&d);
        assert!(min <= -3.0 && min > -3.1, "{min}");
        assert!((100.0..102.0).contains(&max), "{max}");
        assert!(min <= limits[0] && max >= *limits.last().unwrap());
        let finite = distribution_of(&[f64::NAN, 2.0, 5.0]);
        assert_eq!(histogram_range(&finite), (2.0, 5.0));
        assert!((6.9..7.1).contains(&finite_sum(&finite)));
    }

    /// The opening event and a summary event whose bytes take every path
    /// of the encoder: scalars at 0, negative and NaN, a negative step, and
    /// histograms of both signs with zeros, infinities, a NaN and a gap
    /// between buckets, and an empty one.
    fn representative_events() -> Vec<Vec<u8>> {
        let mut opening = Vec::new();
        encode_file_version(1_700_000_000.25, &mut opening);
        let wide = distribution_of(&[
            -3.0,
            -3.0,
            -0.25,
            0.0,
            0.0,
            1.0,
            1.01,
            100.0,
            1e300,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ]);
        let event = SummaryEvent {
            wall_time: 1_700_000_000.5,
            step: -12345,
            scalars: vec![
                ("zero".to_owned(), 0.0),
                ("loss".to_owned(), -1.5),
                ("nan".to_owned(), f64::NAN),
            ],
            histograms: vec![
                ("wide".to_owned(), Arc::new(wide)),
                ("empty".to_owned(), Arc::new(distribution_of(&[]))),
            ],
        };
        let mut summary = Vec::new();
        event.encode(&mut summary);
        vec![opening, summary]
    }

    // The expected bytes were produced by this encoder before its writer
    // became the shared one (crate::wire), which must not change a byte;
    // the encoder's events are read back by tensorboard's own protobuf
    // runtime and loader in tests/sinks/test_tensorboard_native.py.
    #[test]
    fn the_events_are_byte_for_byte_those_before_the_wire_module() {
        let events: Vec<String> = representative_events().iter().map(|e| hex(e)).collect();
        assert_eq!(
            events,
            [
                "0900001040fc54d9411a0d627261696e2e4576656e743a32",
                "0900002040fc54d94110c79fffffffffffffff012ab0020a0b0a047a65726f15000000000a0b0a04\
                 6c6f7373150000c0bf0a0a0a036e616e150000c07f0aea010a04776964652ae1010912ce4c998925\
                 08c01112ce4c998925387e19000000000000284021121a3e542704387e29000000000000f07f3258\
                 634ecf36f3e207c0010000000000d0bfd9909e81c1a7cfbf0000000000000000d8909e81c1a7ef3f\
                 000000000000f03f6080773e9a2cf03f36771599aef15840e4c5cdb037375940624ecf36f3e2377e\
                 12ce4c998925387e3a5800000000000000400000000000000000000000000000f03f000000000000\
                 00400000000000000000000000000000f03f000000000000f03f0000000000000000000000000000\
                 f03f0000000000000000000000000000f03f0a1b0a05656d7074792a122100000000000000802900\
                 00000000000080",
            ]
        );
    }

    #[test]
    fn histogram_message_counts_the_window() {
        let d = distribution_of(&[1.0, 2.0, 2.0, f64::NAN]);
        let event = SummaryEvent {
            wall_time: 2.0,
            step: 7,
            scalars: vec![],
            histograms: vec![("h".to_owned(), Arc::new(d))],
        };
        let mut out = Vec::new();
        event.encode(&mut out);
        // NUM = 4.0 (count with the NaN) as a double after its key.
        let key = ((histogram_proto::NUM << 3) | 1) as u8;
        let mut expected = vec![key];
        expected.extend_from_slice(&4.0f64.to_le_bytes());
        assert!(out.windows(9).any(|w| w == expected.as_slice()));
    }
}
