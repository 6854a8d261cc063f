//! The Prometheus exposition of a `PrometheusEventHandler`'s cumulative
//! state, kept here so that a scrape renders it without Python: the last
//! window's value of every gauge and, per Stat with a distribution, every
//! sample of every closed window in scale-6 buckets, rendered as native
//! histograms in the Prometheus protobuf format (docs/sinks.md,
//! "Native histograms") and as the text format.
//!
//! This module holds the state and its API (`Exposition`: declaring,
//! feeding, a lock per metric); the rest by concern: `cumulative`, one
//! distribution's buckets and the native and classic histograms read from
//! them; `protobuf`, the delimited `MetricFamily` encoding; `text`, the text
//! format 0.0.4; `negotiate`, which of them and which name escaping a
//! scrape gets; `server`, the HTTP server of `serve()` (docs/internals.md,
//! the module map).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

mod cumulative;
pub mod negotiate;
mod protobuf;
pub mod server;
mod text;

pub use cumulative::{ClassicLayout, Cumulative, MIN_SCHEMA, Native, ZERO_THRESHOLD};
pub use text::go_float;

use negotiate::{Escaping, Format, Negotiated};
use std::borrow::Cow;
use std::time::SystemTime;

use text::TextLabels;

enum Value {
    Gauge(f64),
    Histogram(Box<Cumulative>),
}

struct Family {
    name: String,
    /// The name with the Stat key's own characters (`train.loss.mean`
    /// where `name` is `train_loss_mean`): what `Escaping::AllowUtf8`
    /// shows, and what the other schemes escape.
    utf8_name: String,
    help: String,
    value: Value,
    /// When a histogram was declared (its counts start then): the protobuf
    /// body's `created_timestamp`, which Prometheus 3 can ingest as a zero
    /// sample (docs/sinks.md, "Prometheus 3"). `None` for a gauge.
    created: Option<SystemTime>,
}

impl Family {
    /// The family's name in a body whose names follow `escaping`.
    fn shown_name(&self, escaping: Escaping) -> Cow<'_, str> {
        match escaping {
            Escaping::Underscores => Cow::Borrowed(&self.name),
            scheme => escape_name(&self.utf8_name, scheme),
        }
    }
}

/// Whether `name` is a metric name of Prometheus 2: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
pub fn is_legacy_name(name: &str) -> bool {
    !name.is_empty() && name.chars().enumerate().all(|(i, c)| legacy_char(c, i))
}

fn legacy_char(c: char, index: usize) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':' || (index > 0 && c.is_ascii_digit())
}

/// `name` as a body under `scheme` shows it, as client_golang escapes a
/// name (docs/sinks.md, "Prometheus 3"): `AllowUtf8` as it is;
/// `Underscores` each character outside the legacy set as `_` (a legacy
/// name as it is); `Dots` `_` as `__`, `.` as `_dot_`, any other character
/// outside the legacy set as `__`; `Values` a legacy name as it is, any
/// other prefixed `U__` with `_` as `__` and any other character outside
/// the legacy set as `_<hex code>_`.
pub fn escape_name(name: &str, scheme: Escaping) -> Cow<'_, str> {
    use std::fmt::Write;
    match scheme {
        Escaping::AllowUtf8 => Cow::Borrowed(name),
        Escaping::Underscores | Escaping::Values if is_legacy_name(name) => Cow::Borrowed(name),
        Escaping::Underscores => Cow::Owned(
            (name.chars().enumerate())
                .map(|(i, c)| if legacy_char(c, i) { c } else { '_' })
                .collect(),
        ),
        Escaping::Dots => {
            let mut out = String::with_capacity(name.len() + 8);
            for (i, c) in name.chars().enumerate() {
                match c {
                    '_' => out.push_str("__"),
                    '.' => out.push_str("_dot_"),
                    c if legacy_char(c, i) => out.push(c),
                    _ => out.push_str("__"),
                }
            }
            Cow::Owned(out)
        }
        Escaping::Values => {
            let mut out = String::from("U__");
            for (i, c) in name.chars().enumerate() {
                match c {
                    '_' => out.push_str("__"),
                    c if legacy_char(c, i) => out.push(c),
                    c => {
                        let _ = write!(out, "_{:x}_", u32::from(c));
                    }
                }
            }
            Cow::Owned(out)
        }
    }
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
    /// The text exposition's label sets, written once (`text::TextLabels`).
    text_labels: TextLabels,
    families: Mutex<Families>,
    /// Every `(name, utf8_name, help, histogram)` declared, for `fresh`:
    /// its lock is taken only by `declare_as` and `fresh`, never by a
    /// render, so a forked child never finds it held by a thread the fork
    /// left behind.
    declared: Mutex<Vec<(String, String, String, bool)>>,
    /// The name of the watchdog's beat-age gauge, read at each render
    /// (`with_watchdog_gauge`).
    watchdog_gauge: Option<String>,
}

/// The help text of the watchdog's beat-age gauge.
pub const WATCHDOG_GAUGE_HELP: &str =
    "Seconds since a torchmon.Watchdog last saw a step (0 while paused), read at scrape time";

/// One metric as a collector reads it (`Exposition::snapshot`).
#[derive(Clone, Debug, PartialEq)]
pub enum Reading {
    Gauge(f64),
    /// Cumulative counts at `Exposition::le_texts`, and the sum.
    Histogram(Vec<u64>, f64),
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
        let text_labels = TextLabels::new(&labels, classic.as_ref());
        Exposition {
            labels,
            max_buckets: max_buckets.max(1),
            classic,
            protobuf_classic,
            text_labels,
            families: Mutex::new(Families::default()),
            declared: Mutex::new(Vec::new()),
            watchdog_gauge: None,
        }
    }

    /// Renders, after the declared metrics, the gauge `name`: the seconds
    /// since a running `watchdog::Watchdog` of this process last saw a beat,
    /// read at each render, so that it grows while the process is wedged
    /// (absent while no watchdog runs).
    pub fn with_watchdog_gauge(mut self, name: String) -> Self {
        self.watchdog_gauge = Some(name);
        self
    }

    /// What a render encodes: the declared metrics, then the live gauge.
    fn rendered(&self) -> Vec<Arc<Mutex<Family>>> {
        let mut list = self.families.lock().list.clone();
        if let Some(name) = &self.watchdog_gauge
            && let Some(seconds) = crate::watchdog::seconds_since_beat()
        {
            list.push(Arc::new(Mutex::new(Family {
                name: name.clone(),
                utf8_name: name.clone(),
                help: WATCHDOG_GAUGE_HELP.to_owned(),
                value: Value::Gauge(seconds),
                created: None,
            })));
        }
        list
    }

    /// A new exposition of this one's configuration with the metrics it
    /// declared, empty. It reads none of the locks a render takes: a forked
    /// child's copy of one may be held for ever.
    pub fn fresh(&self) -> Self {
        let labels = self.labels.clone();
        let mut fresh = Exposition::new(
            labels,
            self.max_buckets,
            self.classic.clone(),
            self.protobuf_classic,
        );
        fresh.watchdog_gauge = self.watchdog_gauge.clone();
        for (name, utf8_name, help, histogram) in self.declared.lock().iter() {
            let _ = fresh.declare_as(name, utf8_name, help, *histogram);
        }
        fresh
    }

    /// Creates the gauge (`histogram` false, value 0) or the histogram
    /// `name` with `help` (true); a no-op if it exists with that kind (false).
    pub fn declare(&self, name: &str, help: &str, histogram: bool) -> Result<bool, KindClash> {
        self.declare_as(name, name, help, histogram)
    }

    /// `declare`, with the name a body whose scraper asked for UTF-8 names
    /// shows (`train.loss.mean` for `train_loss_mean`; `Escaping`).
    pub fn declare_as(
        &self,
        name: &str,
        utf8_name: &str,
        help: &str,
        histogram: bool,
    ) -> Result<bool, KindClash> {
        let mut declared = self.declared.lock();
        let mut families = self.families.lock();
        if let Some(&index) = families.by_name.get(name) {
            let is_histogram = matches!(families.list[index].lock().value, Value::Histogram(_));
            return if is_histogram == histogram {
                Ok(false)
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
            utf8_name: utf8_name.to_owned(),
            help: help.to_owned(),
            value,
            created: histogram.then(SystemTime::now),
        })));
        let index = families.list.len() - 1;
        families.by_name.insert(name.to_owned(), index);
        declared.push((
            name.to_owned(),
            utf8_name.to_owned(),
            help.to_owned(),
            histogram,
        ));
        Ok(true)
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

    /// Every metric in the order declared, with its help text, copied out
    /// under each one's lock in turn: what a prometheus_client collector
    /// turns into families, holding no lock (docs/sinks.md, "Prometheus").
    pub fn snapshot(&self) -> Vec<(String, String, Reading)> {
        let list = self.rendered();
        let read = |family: &Family| match &family.value {
            Value::Gauge(value) => Reading::Gauge(*value),
            Value::Histogram(cumulative) => {
                let mut counts: Vec<u64> = (self.classic.iter())
                    .flat_map(|layout| cumulative.classic(layout))
                    .map(|(_, below)| below)
                    .collect();
                counts.push(cumulative.count());
                Reading::Histogram(counts, cumulative.sum)
            }
        };
        list.iter()
            .map(|family| {
                let family = family.lock();
                (family.name.clone(), family.help.clone(), read(&family))
            })
            .collect()
    }

    /// A histogram's `le` label values as prometheus_client writes them,
    /// ascending: `0.0`, the classic bounds and `+Inf`, or only `+Inf`
    /// without a layout.
    pub fn le_texts(&self) -> Vec<String> {
        let uppers = self.classic.iter().flat_map(|layout| &layout.uppers);
        let bounds = self.classic.iter().map(|_| 0.0).chain(uppers.copied());
        (bounds.chain([f64::INFINITY]))
            .map(|le| {
                let mut text = String::new();
                go_float(le, &mut text);
                text
            })
            .collect()
    }

    pub fn len(&self) -> usize {
        self.families.lock().list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a handler's scrapes render (every path: `render()`, the server of
/// `serve()`), until the handler closes: an `Exposition` and the lock that
/// orders a render and a close.
pub struct Served {
    pub exposition: Exposition,
    /// Held across a render and by `close`, so that a render completes
    /// before a close or sees it.
    closing: Mutex<()>,
}

impl Served {
    pub fn new(exposition: Exposition) -> Arc<Served> {
        let closing = Mutex::new(());
        Arc::new(Served {
            exposition,
            closing,
        })
    }

    /// A scrape's body as negotiated, or `None` once `closed`.
    pub fn render(&self, closed: &AtomicBool, negotiated: Negotiated) -> Option<Vec<u8>> {
        let _not_closing = self.closing.lock();
        if closed.load(Ordering::Acquire) {
            return None;
        }
        let names = negotiated.names();
        Some(match negotiated.format {
            Format::Protobuf => {
                let mut body = Vec::with_capacity(256 * self.exposition.len());
                self.exposition.encode_protobuf_as(&mut body, names);
                body
            }
            Format::Text => {
                let mut body = String::with_capacity(512 * self.exposition.len());
                self.exposition.encode_text_as(&mut body, names);
                body.into_bytes()
            }
        })
    }

    /// Sets `closed` once no render is in progress: later renders return
    /// `None`. `closed` is the handler's, shared by the `Served` a forked
    /// child makes anew.
    pub fn close(&self, closed: &AtomicBool) {
        let _no_render = self.closing.lock();
        closed.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_escaped_as_client_golang_escapes_them() {
        use Escaping::*;
        for (name, scheme, expected) in [
            ("train.loss", AllowUtf8, "train.loss"),
            ("train.loss", Underscores, "train_loss"),
            ("0a.b", Underscores, "_a_b"),
            ("train.loss_x", Dots, "train_dot_loss__x"),
            ("legacy_name", Dots, "legacy__name"),
            ("a-b", Dots, "a__b"),
            ("legacy_name", Values, "legacy_name"),
            ("train.loss_x", Values, "U__train_2e_loss__x"),
            ("é", Values, "U___e9_"),
            ("a\u{1F600}", Values, "U__a_1f600_"),
            ("0a", Values, "U___30_a"),
        ] {
            assert_eq!(escape_name(name, scheme), expected, "{name} {scheme:?}");
        }
        assert!(is_legacy_name("a:b_0") && !is_legacy_name("0a") && !is_legacy_name(""));
        assert!(!is_legacy_name("a.b"));
    }

    #[test]
    fn a_fresh_exposition_keeps_the_utf8_names() {
        let e = Exposition::new(vec![], 160, None, false);
        e.declare_as("a_b", "a.b", "h", false).unwrap();
        let mut body = Vec::new();
        e.fresh().encode_protobuf_as(&mut body, Escaping::AllowUtf8);
        assert!(body.windows(3).any(|w| w == b"a.b"));
        body.clear();
        e.fresh().encode_protobuf(&mut body);
        assert!(!body.windows(3).any(|w| w == b"a.b"));
        assert!(body.windows(3).any(|w| w == b"a_b"));
    }

    #[test]
    fn kinds_do_not_share_a_name() {
        let e = Exposition::new(vec![], 160, None, false);
        e.declare("a", "h", false).unwrap();
        assert_eq!(e.declare("a", "h", true), Err(KindClash));
        assert_eq!(e.declare("b", "h", true), Ok(true));
        assert_eq!(e.declare("b", "h", true), Ok(false));
        assert_eq!(e.declare("b", "h", false), Err(KindClash));
        assert!(e.set_gauge("a", 1.0));
        assert!(!e.set_gauge("b", 1.0));
        assert!(!e.set_gauge("c", 1.0));
        assert!(e.update_histogram("b", |c| c.add_window(1.0, 0, 0, 0, [(0, 1)], [])));
        assert!(!e.update_histogram("a", |_| ()));
        assert_eq!(e.len(), 2);
    }

    #[test]
    fn a_snapshot_reads_every_metric_in_declared_order_and_a_fresh_one_nothing() {
        let layout = ClassicLayout::new(1, 1.0, 2.0).unwrap();
        let e = Exposition::new(vec![], 160, Some(layout), false);
        assert_eq!(e.le_texts(), ["0.0", "1.0", "2.0", "+Inf"]);
        e.declare("h", "hist", true).unwrap();
        e.declare("g", "gauge", false).unwrap();
        e.set_gauge("g", 2.5);
        // 1.0 is the top of bucket -1, 1.5 in bucket 37; a zero and a +inf.
        e.update_histogram("h", |c| c.add_window(3.0, 1, 1, 0, [(-1, 1), (37, 1)], []));
        assert_eq!(
            e.snapshot(),
            [
                (
                    "h".into(),
                    "hist".into(),
                    Reading::Histogram(vec![1, 2, 3, 4], 3.0)
                ),
                ("g".into(), "gauge".into(), Reading::Gauge(2.5)),
            ]
        );
        let _held = e.families.lock(); // as a fork may copy it
        let fresh = e.fresh();
        assert_eq!(fresh.le_texts(), e.le_texts());
        assert_eq!(
            fresh.snapshot(),
            [
                (
                    "h".into(),
                    "hist".into(),
                    Reading::Histogram(vec![0, 0, 0, 0], 0.0)
                ),
                ("g".into(), "gauge".into(), Reading::Gauge(0.0)),
            ]
        );
        let bare = Exposition::new(vec![], 160, None, false);
        bare.declare("h", "hist", true).unwrap();
        assert_eq!(bare.le_texts(), ["+Inf"]);
        assert_eq!(bare.snapshot()[0].2, Reading::Histogram(vec![0], 0.0));
    }

    #[test]
    fn fresh_declares_each_metric_once_and_not_a_refused_one() {
        let e = Exposition::new(vec![], 160, None, false);
        e.declare("g", "gauge", false).unwrap();
        e.declare("g", "gauge", false).unwrap();
        assert_eq!(e.declare("g", "gauge", true), Err(KindClash));
        let names: Vec<_> = e.fresh().snapshot().into_iter().map(|m| m.0).collect();
        assert_eq!(names, ["g"]);
    }

    #[test]
    fn a_served_exposition_renders_either_format_until_closed() {
        let served = Served::new(Exposition::new(vec![], 160, None, false));
        served.exposition.declare("g", "gauge", false).unwrap();
        served.exposition.set_gauge("g", 2.0);
        let closed = AtomicBool::new(false);
        let text = served.render(&closed, Format::Text.into()).unwrap();
        assert_eq!(text, b"# HELP g gauge\n# TYPE g gauge\ng 2.0\n");
        let mut protobuf = Vec::new();
        served.exposition.encode_protobuf(&mut protobuf);
        assert_eq!(
            served.render(&closed, Format::Protobuf.into()),
            Some(protobuf)
        );
        served.close(&closed);
        assert!(closed.load(Ordering::Acquire));
        assert_eq!(served.render(&closed, Format::Text.into()), None);
    }
}
