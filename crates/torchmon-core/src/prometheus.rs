//! The Prometheus exposition of a `PrometheusEventHandler`'s cumulative
//! state, kept here so that a scrape renders it without Python: the last
//! window's value of every gauge and, per Stat with a distribution, every
//! sample of every closed window in scale-6 buckets, rendered as native
//! histograms in the Prometheus protobuf format (docs/sinks.md,
//! "Native histograms").
//!
//! The protobuf messages are the few of Prometheus's `metrics.proto`
//! (`io.prometheus.client`) that a gauge and a histogram need, encoded by
//! hand (`Encoder`): a handful of field kinds, so that neither a code
//! generator nor `protoc` is needed to build the package. Tests decode the
//! bytes with protobuf's own Python runtime and with a real Prometheus.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::histogram::{MAX_INDEX, MIN_INDEX, SCALE};

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
    /// (the count): the classic histogram python/torchmon/handlers/prometheus.py
    /// exposes as text, the same counts.
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

/// The classic bounds of a handler (python/torchmon/handlers/prometheus.py,
/// `_HistogramLayout`): positive bound `j` counts the torchmon buckets whose
/// `index >> shift` is `first + j` or below.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassicLayout {
    pub shift: u32,
    pub first: i32,
    pub uppers: Vec<f64>,
}

enum Value {
    Gauge(f64),
    Histogram(Box<Cumulative>),
}

struct Family {
    name: String,
    help: String,
    value: Value,
}

#[derive(Default)]
struct Families {
    list: Vec<Arc<Mutex<Family>>>,
    by_name: HashMap<String, usize>,
}

/// A handler's metrics: gauges and histograms in the order first declared,
/// every one with the handler's constant labels. Each metric has a lock of
/// its own, and a render holds one only while it encodes that metric, so a
/// window folded in during a scrape waits for one metric's encoding at
/// most, never for the whole render; the list's lock is held for a lookup
/// or a copy of the list.
pub struct Exposition {
    labels: Vec<(String, String)>,
    max_buckets: usize,
    classic: Option<ClassicLayout>,
    /// Whether the protobuf body carries the classic buckets too.
    protobuf_classic: bool,
    /// The text exposition's label sets, rendered once: every label sorted
    /// by name (`name="value"`, escaped), and for a histogram's buckets the
    /// labels before and after `le` in that order (a constant label named
    /// `le` is replaced by the bucket's, as prometheus_client does).
    text_labels: String,
    /// A histogram's `_bucket` label set per classic bound, `+Inf` last:
    /// the same for every histogram of the handler, so written once.
    text_bucket_labels: Vec<String>,
    families: Mutex<Families>,
}

/// `Exposition::declare`'s refusal: the name is taken by the other kind.
#[derive(Debug, PartialEq, Eq)]
pub struct KindClash;

impl Exposition {
    /// `max_buckets`: the bucket limit per native histogram (at least 1);
    /// `classic`: the histograms' classic bounds (the text exposition's);
    /// `protobuf_classic`: also expose them in the protobuf body.
    pub fn new(
        labels: Vec<(String, String)>,
        max_buckets: usize,
        classic: Option<ClassicLayout>,
        protobuf_classic: bool,
    ) -> Self {
        let mut sorted: Vec<&(String, String)> = labels.iter().collect();
        sorted.sort();
        let join = |pairs: &mut dyn Iterator<Item = &&(String, String)>| {
            let mut text = String::new();
            for (name, value) in pairs {
                if !text.is_empty() {
                    text.push(',');
                }
                text.push_str(name);
                text.push_str("=\"");
                escape_label_value(value, &mut text);
                text.push('"');
            }
            text
        };
        let text_labels = join(&mut sorted.iter());
        let before_le = join(&mut sorted.iter().filter(|(name, _)| name.as_str() < "le"));
        let after_le = join(&mut sorted.iter().filter(|(name, _)| name.as_str() > "le"));
        let bounds = classic
            .as_ref()
            .map_or(&[][..], |layout| &layout.uppers[..]);
        let text_bucket_labels = std::iter::once(0.0)
            .chain(bounds.iter().copied())
            .chain(std::iter::once(f64::INFINITY))
            .map(|le| {
                let mut labels = before_le.clone();
                if !labels.is_empty() {
                    labels.push(',');
                }
                labels.push_str("le=\"");
                go_float(le, &mut labels);
                labels.push('"');
                if !after_le.is_empty() {
                    labels.push(',');
                    labels.push_str(&after_le);
                }
                labels
            })
            .collect();
        Exposition {
            labels,
            max_buckets: max_buckets.max(1),
            classic,
            protobuf_classic,
            text_labels,
            text_bucket_labels,
            families: Mutex::new(Families::default()),
        }
    }

    /// Creates the gauge (`histogram` false, value 0) or the histogram
    /// `name` with `help`; a no-op if it exists with that kind.
    pub fn declare(&self, name: &str, help: &str, histogram: bool) -> Result<(), KindClash> {
        let mut families = self.families.lock();
        if let Some(&index) = families.by_name.get(name) {
            let is_histogram = matches!(families.list[index].lock().value, Value::Histogram(_));
            return if is_histogram == histogram {
                Ok(())
            } else {
                Err(KindClash)
            };
        }
        let value = if histogram {
            Value::Histogram(Box::default())
        } else {
            Value::Gauge(0.0)
        };
        families.list.push(Arc::new(Mutex::new(Family {
            name: name.to_owned(),
            help: help.to_owned(),
            value,
        })));
        let index = families.list.len() - 1;
        families.by_name.insert(name.to_owned(), index);
        Ok(())
    }

    fn find(&self, name: &str) -> Option<Arc<Mutex<Family>>> {
        let families = self.families.lock();
        families
            .by_name
            .get(name)
            .map(|&index| families.list[index].clone())
    }

    /// Sets the declared gauge `name`; false if there is none.
    pub fn set_gauge(&self, name: &str, value: f64) -> bool {
        match self.find(name) {
            Some(family) => match &mut family.lock().value {
                Value::Gauge(gauge) => {
                    *gauge = value;
                    true
                }
                Value::Histogram(_) => false,
            },
            None => false,
        }
    }

    /// Runs `update` on the declared histogram `name`; false if there is none.
    pub fn update_histogram(&self, name: &str, update: impl FnOnce(&mut Cumulative)) -> bool {
        match self.find(name) {
            Some(family) => match &mut family.lock().value {
                Value::Histogram(histogram) => {
                    update(histogram);
                    true
                }
                Value::Gauge(_) => false,
            },
            None => false,
        }
    }

    pub fn len(&self) -> usize {
        self.families.lock().list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every metric family as length-delimited `io.prometheus.client.MetricFamily`
    /// messages (`application/vnd.google.protobuf;
    /// proto=io.prometheus.client.MetricFamily; encoding=delimited`).
    pub fn encode_protobuf(&self, out: &mut Vec<u8>) {
        let list = self.families.lock().list.clone();
        let mut family_bytes = Vec::new();
        let mut metric = Vec::new();
        let mut scratch = Vec::new();
        for family in list {
            family_bytes.clear();
            metric.clear();
            let mut f = Encoder(&mut family_bytes);
            let mut m = Encoder(&mut metric);
            for (name, value) in &self.labels {
                scratch.clear();
                let mut pair = Encoder(&mut scratch);
                pair.bytes(1, name.as_bytes());
                pair.bytes(2, value.as_bytes());
                m.bytes(1, &scratch);
            }
            {
                let family = family.lock();
                f.bytes(1, family.name.as_bytes());
                f.bytes(2, family.help.as_bytes());
                match &family.value {
                    Value::Gauge(value) => {
                        f.varint(3, 1); // GAUGE
                        scratch.clear();
                        Encoder(&mut scratch).double_always(1, *value);
                        m.bytes(2, &scratch);
                    }
                    Value::Histogram(cumulative) => {
                        f.varint(3, 4); // HISTOGRAM
                        scratch.clear();
                        self.encode_histogram(cumulative, &mut scratch);
                        m.bytes(7, &scratch);
                    }
                }
            }
            f.bytes(4, &metric);
            put_varint(out, family_bytes.len() as u64);
            out.extend_from_slice(&family_bytes);
        }
    }

    /// Every metric family in the Prometheus text format 0.0.4, byte for
    /// byte what prometheus_client's `generate_latest` writes for the
    /// handler's registry (python/torchmon/handlers/prometheus.py): `HELP`
    /// and `TYPE` lines, labels sorted by name, values as its
    /// `floatToGoString`, a histogram's `_bucket` lines at the classic
    /// bounds, then `_count` and `_sum`.
    pub fn encode_text(&self, out: &mut String) {
        let list = self.families.lock().list.clone();
        for family in list {
            let family = family.lock();
            let name = family.name.as_str();
            out.push_str("# HELP ");
            out.push_str(name);
            out.push(' ');
            escape_help(&family.help, out);
            out.push_str("\n# TYPE ");
            out.push_str(name);
            match &family.value {
                Value::Gauge(value) => {
                    out.push_str(" gauge\n");
                    self.text_sample(out, name, "", &self.text_labels, *value);
                }
                Value::Histogram(cumulative) => {
                    out.push_str(" histogram\n");
                    let count = cumulative.count() as f64;
                    let bounds = self
                        .classic
                        .as_ref()
                        .map(|layout| cumulative.classic(layout))
                        .unwrap_or_default();
                    // Without a layout only `+Inf`, the last label set.
                    let skip = self.text_bucket_labels.len() - 1 - bounds.len();
                    let counts = bounds.iter().map(|&(_, below)| below as f64);
                    for (labels, value) in self.text_bucket_labels[skip..]
                        .iter()
                        .zip(counts.chain(std::iter::once(count)))
                    {
                        self.text_sample(out, name, "_bucket", labels, value);
                    }
                    self.text_sample(out, name, "_count", &self.text_labels, count);
                    self.text_sample(out, name, "_sum", &self.text_labels, cumulative.sum);
                }
            }
        }
    }

    fn text_sample(&self, out: &mut String, name: &str, suffix: &str, labels: &str, value: f64) {
        out.push_str(name);
        out.push_str(suffix);
        if !labels.is_empty() {
            out.push('{');
            out.push_str(labels);
            out.push('}');
        }
        out.push(' ');
        // Most values are counts: a whole number below 10**6 is its digits
        // and ".0" in floatToGoString too, without go_float's formatting.
        if value.fract() == 0.0 && (0.0..1e6).contains(&value) && value.is_sign_positive() {
            use std::fmt::Write;
            let _ = write!(out, "{}.0", value as u32);
        } else {
            go_float(value, out);
        }
        out.push('\n');
    }

    fn encode_histogram(&self, cumulative: &Cumulative, out: &mut Vec<u8>) {
        let native = cumulative.native(self.max_buckets);
        let mut h = Encoder(out);
        h.varint(1, native.count);
        h.double_always(2, native.sum);
        if let Some(layout) = self.classic.as_ref().filter(|_| self.protobuf_classic) {
            let mut bucket = Vec::new();
            for (le, count) in cumulative.classic(layout) {
                bucket.clear();
                let mut b = Encoder(&mut bucket);
                b.varint(1, count);
                b.double_always(2, le);
                h.bytes(3, &bucket);
            }
        }
        h.sint(5, i64::from(native.schema));
        h.double_always(6, ZERO_THRESHOLD);
        h.varint(7, native.zero_count);
        let mut spans = Vec::new();
        for (buckets, span_field, delta_field) in
            [(&native.negative, 9, 10), (&native.positive, 12, 13)]
        {
            let empty = native.negative.is_empty() && native.positive.is_empty();
            if buckets.is_empty() && !(empty && span_field == 12) {
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
                s.sint(1, i64::from(offset));
                s.varint(2, u64::from(length));
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

/// A `HELP` text as prometheus_client escapes it: backslash and newline.
fn escape_help(text: &str, out: &mut String) {
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// A label value as prometheus_client escapes it: backslash, newline and
/// double quote.
fn escape_label_value(text: &str, out: &mut String) {
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

/// `x` as prometheus_client's `floatToGoString` writes it: `+Inf`, `-Inf`,
/// `NaN`, otherwise Python's `repr(x)` (the shortest digits that read back
/// as `x`; positional for a decimal exponent from -4 to 15, `3.0`, `1e-05`,
/// `1.5e+16`), except that a positive number with more than 6 digits before
/// the point is written with an exponent as Go does (`1.234567e+06`).
pub fn go_float(x: f64, out: &mut String) {
    use std::fmt::Write;
    if x.is_nan() {
        out.push_str("NaN");
        return;
    }
    if x.is_infinite() {
        out.push_str(if x > 0.0 { "+Inf" } else { "-Inf" });
        return;
    }
    // `{:e}` gives as many digits as the shortest round trip needs:
    // "-1.2345e-5". When two such strings are equally close to `x`, Python
    // picks the even last digit; `{:.Ne}` rounds `x` exactly, half to even,
    // to that many digits, which is Python's string.
    let mut scientific = String::with_capacity(32);
    let _ = write!(scientific, "{x:e}");
    let shortest = scientific
        .split_once('e')
        .map_or(0, |(mantissa, _)| mantissa.trim_start_matches('-').len());
    let decimals = shortest.saturating_sub(2); // "d" or "d.ddd"
    scientific.clear();
    let _ = write!(scientific, "{x:.decimals$e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (negative, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    // Python's decimal point position: the value is 0.<digits> * 10**point.
    let point = exponent + 1;
    if negative {
        out.push('-');
    }
    if !(-4 < point && point <= 16) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(
            out,
            "e{}{:02}",
            if exponent < 0 { '-' } else { '+' },
            exponent.abs()
        );
        return;
    }
    if point <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-point) as usize));
        out.push_str(&digits);
        return;
    }
    let point = point as usize;
    if !negative && point > 6 {
        // floatToGoString: the repr's digits with the point after the first,
        // trailing zeros and point dropped, and the exponent of the repr's point.
        let mut all = digits.clone();
        if all.len() < point {
            all.extend(std::iter::repeat_n('0', point - all.len()));
        }
        let mut mantissa = format!("{}.{}", &all[..1], &all[1..]);
        // Python also strips the ".0" the repr ends an integral value with.
        let trimmed = mantissa.trim_end_matches(['0', '.']).len();
        mantissa.truncate(trimmed);
        out.push_str(&mantissa);
        let _ = write!(out, "e+{:02}", point - 1);
        return;
    }
    if digits.len() <= point {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', point - digits.len()));
        out.push_str(".0");
    } else {
        out.push_str(&digits[..point]);
        out.push('.');
        out.push_str(&digits[point..]);
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
    use crate::histogram::bucket_index;

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
    fn kinds_do_not_share_a_name() {
        let e = Exposition::new(vec![], 160, None, false);
        e.declare("a", "h", false).unwrap();
        assert_eq!(e.declare("a", "h", true), Err(KindClash));
        e.declare("b", "h", true).unwrap();
        e.declare("b", "h", true).unwrap();
        assert_eq!(e.declare("b", "h", false), Err(KindClash));
        assert!(e.set_gauge("a", 1.0));
        assert!(!e.set_gauge("b", 1.0));
        assert!(!e.set_gauge("c", 1.0));
        assert!(e.update_histogram("b", |c| c.add_window(1.0, 0, 0, 0, [(0, 1)], [])));
        assert!(!e.update_histogram("a", |_| ()));
        assert_eq!(e.len(), 2);
    }

    #[test]
    fn floats_are_written_as_prometheus_client_writes_them() {
        // Expected: prometheus_client.utils.floatToGoString (tests/sinks/
        // test_prometheus_text.py compares many more against it).
        for (x, expected) in [
            (3.0, "3.0"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (0.1, "0.1"),
            (123456.5, "123456.5"),
            (1234567.0, "1.234567e+06"),
            (1e15, "1e+15"),
            (1234567890123456.0, "1.234567890123456e+15"),
            (1e16, "1e+16"),
            (-1234567.0, "-1234567.0"),
            (-1e16, "-1e+16"),
            (2.5e-300, "2.5e-300"),
            // Halfway between two 17-digit strings: Python's even one.
            (1_760_485_316_806_258.0 + 0.25, "1.7604853168062582e+15"),
            (f64::INFINITY, "+Inf"),
            (f64::NEG_INFINITY, "-Inf"),
            (f64::NAN, "NaN"),
        ] {
            let mut out = String::new();
            go_float(x, &mut out);
            assert_eq!(out, expected, "{x:e}");
        }
    }

    #[test]
    fn text_labels_are_sorted_and_escaped_with_le_among_them() {
        let layout = ClassicLayout {
            shift: 6,
            first: 0,
            uppers: vec![2.0],
        };
        let labels = vec![
            ("rank".to_owned(), "0".to_owned()),
            ("job".to_owned(), "a\"b\\c\nd".to_owned()),
        ];
        let e = Exposition::new(labels, 160, Some(layout), false);
        e.declare("g", "help \\ and\nline", false).unwrap();
        e.declare("h", "hist", true).unwrap();
        e.set_gauge("g", 1.5);
        e.update_histogram("h", |c| c.add_window(3.0, 1, 0, 0, [(0, 2)], []));
        let mut text = String::new();
        e.encode_text(&mut text);
        let labels = r#"job="a\"b\\c\nd",rank="0""#;
        assert_eq!(
            text,
            format!(
                "# HELP g help \\\\ and\\nline\n# TYPE g gauge\ng{{{labels}}} 1.5\n\
                 # HELP h hist\n# TYPE h histogram\n\
                 h_bucket{{job=\"a\\\"b\\\\c\\nd\",le=\"0.0\",rank=\"0\"}} 1.0\n\
                 h_bucket{{job=\"a\\\"b\\\\c\\nd\",le=\"2.0\",rank=\"0\"}} 3.0\n\
                 h_bucket{{job=\"a\\\"b\\\\c\\nd\",le=\"+Inf\",rank=\"0\"}} 3.0\n\
                 h_count{{{labels}}} 3.0\nh_sum{{{labels}}} 3.0\n"
            )
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
