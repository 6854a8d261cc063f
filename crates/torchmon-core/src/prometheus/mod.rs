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
//! format 0.0.4 (docs/internals.md, the module map).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

mod cumulative;
mod protobuf;
mod text;

pub use cumulative::{ClassicLayout, Cumulative, MIN_SCHEMA, Native, ZERO_THRESHOLD};
pub use text::go_float;

use text::TextLabels;

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
    /// The text exposition's label sets, written once (`text::TextLabels`).
    text_labels: TextLabels,
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
        let text_labels = TextLabels::new(&labels, classic.as_ref());
        Exposition {
            labels,
            max_buckets: max_buckets.max(1),
            classic,
            protobuf_classic,
            text_labels,
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
