//! `torchmon to-tensorboard` (python/torchmon/cli/to_tensorboard.py) without
//! a Python object per Stat line: `Conversion` splits the log's bytes into
//! lines as `summary::Summary` does, reads each with `summary::line` and
//! turns a Stat event it is sure of into the `SummaryEvent`s that
//! `TensorboardEventHandler._write_stat_natively` (python/torchmon/handlers/
//! tensorboard.py) would queue for it, the steps counted per tag here.
//!
//! Every other line goes to the relay, the Python reader: a bad line gets
//! its documented message, another event is written by the handler, and a
//! Stat event comes back written again by the sink's encoder, with its wall
//! time as Python reads it, to take its steps from the same per-tag counters
//! (TensorBoard drops the points of a tag whose step goes back).

use std::collections::HashMap;
use std::sync::Arc;

use super::SummaryEvent;
use crate::aggregation::TABLE;
use crate::histogram::Distribution;
use crate::stat::STAT_EVENT;
use crate::summary::checked;
use crate::summary::line::{self, Value};

/// What the relay made of a line the core left to it.
#[derive(Debug, Clone, PartialEq)]
pub enum Relayed {
    /// No event: a blank line, or one without its newline that is no whole
    /// event (an unreadable one is the relay's error).
    Nothing,
    /// An event the relay wrote itself (not a Stat event).
    Handled,
    /// A Stat event, written again as a JSON line, and its wall time.
    Stat(Vec<u8>, f64),
}

/// Why [`Conversion::feed`] stopped.
#[derive(Debug, PartialEq)]
pub enum ConvertError<E> {
    /// Line `n` (1-based) is longer than the limit.
    LineTooLong(u64),
    /// The relay failed (an unreadable line: its message).
    Relay(E),
    /// Line `n`'s Stat event, as the relay wrote it again, did not read.
    Unread(u64),
}

/// The relay: for a line and its number, what Python's reader made of it.
pub trait Relay<E>: FnMut(&[u8], u64) -> Result<Relayed, E> {}
impl<E, F: FnMut(&[u8], u64) -> Result<Relayed, E>> Relay<E> for F {}

pub struct Conversion {
    grouped: bool,
    limit: usize,
    /// Windows written so far per tag: the step of a tag's next window is
    /// one more (the handler's `_windows`).
    windows: HashMap<String, i64>,
    pending: Vec<u8>,
    lineno: u64,
    records: u64,
    stat_scalars: u64,
}

impl Conversion {
    /// `grouped`: `--layout grouped`; `limit`: the longest line, its newline
    /// included.
    pub fn new(grouped: bool, limit: usize) -> Self {
        Conversion {
            grouped,
            limit,
            windows: HashMap::new(),
            pending: Vec::new(),
            lineno: 0,
            records: 0,
            stat_scalars: 0,
        }
    }

    /// Events read so far, the relay's included.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Scalars written from Stat events.
    pub fn stat_scalars(&self) -> u64 {
        self.stat_scalars
    }

    /// The log's next bytes; `emit` queues an event on the writer.
    pub fn feed<E>(
        &mut self,
        mut block: &[u8],
        relay: &mut impl Relay<E>,
        emit: &mut impl FnMut(SummaryEvent),
    ) -> Result<(), ConvertError<E>> {
        if !self.pending.is_empty() {
            let Some(end) = memchr::memchr(b'\n', block) else {
                self.pending.extend_from_slice(block);
                return self.check_pending();
            };
            self.pending.extend_from_slice(&block[..=end]);
            block = &block[end + 1..];
            let line = std::mem::take(&mut self.pending);
            let result = self.line(&line, relay, emit);
            self.pending = line;
            self.pending.clear();
            result?;
        }
        while let Some(end) = memchr::memchr(b'\n', block) {
            self.line(&block[..=end], relay, emit)?;
            block = &block[end + 1..];
        }
        self.pending.extend_from_slice(block);
        self.check_pending()
    }

    fn check_pending<E>(&self) -> Result<(), ConvertError<E>> {
        if self.pending.len() > self.limit {
            return Err(ConvertError::LineTooLong(self.lineno + 1));
        }
        Ok(())
    }

    /// Ends the log: a last line without its newline counts when it is a
    /// whole event, as for the Python reader (docs/sinks.md, "Reading").
    /// Returns how many events the log held.
    pub fn finish<E>(
        &mut self,
        relay: &mut impl Relay<E>,
        emit: &mut impl FnMut(SummaryEvent),
    ) -> Result<u64, ConvertError<E>> {
        if !self.pending.is_empty() {
            let line = std::mem::take(&mut self.pending);
            self.line(&line, relay, emit)?;
        }
        Ok(self.records)
    }

    fn line<E>(
        &mut self,
        raw: &[u8],
        relay: &mut impl Relay<E>,
        emit: &mut impl FnMut(SummaryEvent),
    ) -> Result<(), ConvertError<E>> {
        self.lineno += 1;
        if raw.len() > self.limit {
            return Err(ConvertError::LineTooLong(self.lineno));
        }
        if raw
            .iter()
            .all(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
        {
            return Ok(());
        }
        if let Some((record, distribution, wall_time)) = sure_stat(raw) {
            self.records += 1;
            self.write_stat(&record.data, distribution, wall_time, emit);
            return Ok(());
        }
        match relay(raw, self.lineno).map_err(ConvertError::Relay)? {
            Relayed::Nothing => {}
            Relayed::Handled => self.records += 1,
            Relayed::Stat(line, wall_time) => {
                self.records += 1;
                // The sink's own encoding of an event Python read: it reads.
                let Some((record, distribution)) = read(&line) else {
                    return Err(ConvertError::Unread(self.lineno));
                };
                self.write_stat(&record.data, distribution, wall_time, emit);
            }
        }
        Ok(())
    }

    /// `_write_stat_natively` with `step="window"`, in its order: the steps
    /// of every tag taken before any is counted, a histogram's last.
    fn write_stat<K: AsRef<str>>(
        &mut self,
        data: &[(K, Value)],
        distribution: Option<Distribution>,
        wall_time: f64,
        emit: &mut impl FnMut(SummaryEvent),
    ) {
        let grouped = self.grouped;
        let scalars: Vec<(String, f64)> = data
            .iter()
            .filter_map(|(key, value)| match value {
                Value::Number(x) => Some((tag(key.as_ref(), grouped), *x)),
                Value::Other => None,
            })
            .collect();
        let histogram = match (distribution, scalars.first()) {
            (Some(d), Some((first, _))) => Some((histogram_tag(first, grouped), Arc::new(d))),
            _ => None,
        };
        let step = |tag: &str| self.windows.get(tag).copied().unwrap_or(0) + 1;
        let mut steps: Vec<i64> = scalars.iter().map(|(t, _)| step(t)).collect();
        if let Some((tag, _)) = &histogram {
            steps.push(step(tag));
        }
        for ((tag, _), window) in scalars.iter().zip(&steps) {
            self.windows.insert(tag.clone(), *window);
        }
        if let (Some((tag, _)), Some(window)) = (&histogram, steps.last()) {
            self.windows.insert(tag.clone(), *window);
        }
        let Some(&first) = steps.first() else {
            return;
        };
        self.stat_scalars += scalars.len() as u64;
        if steps.iter().all(|&s| s == first) {
            emit(SummaryEvent {
                wall_time,
                step: first,
                scalars,
                histograms: histogram.into_iter().collect(),
            });
            return;
        }
        // The tags' window counts differ (a Stat re-created with other
        // aggregations): one event per step, in the order of first use.
        let last = *steps.last().unwrap_or(&first);
        let mut by_step: Vec<(i64, Vec<(String, f64)>)> = Vec::new();
        for (scalar, window) in scalars.into_iter().zip(steps) {
            match by_step.iter_mut().find(|(s, _)| *s == window) {
                Some((_, group)) => group.push(scalar),
                None => by_step.push((window, vec![scalar])),
            }
        }
        for (step, scalars) in by_step {
            emit(SummaryEvent {
                wall_time,
                step,
                scalars,
                histograms: vec![],
            });
        }
        if let Some(histogram) = histogram {
            emit(SummaryEvent {
                wall_time,
                step: last,
                scalars: vec![],
                histograms: vec![histogram],
            });
        }
    }
}

/// A line's Stat event when `line` is sure of it, with its checked
/// distribution and the wall time Python's `timestamp()` gives it.
fn sure_stat(raw: &[u8]) -> Option<(line::Record<'_>, Option<Distribution>, f64)> {
    let mut record = line::parse(raw).ok().filter(|r| r.sure)?;
    if record.name != STAT_EVENT {
        return None;
    }
    let wall_time = wall_time(record.timestamp.as_bytes(), record.fold)?;
    let distribution = match record.distribution.take() {
        None => None,
        Some(stored) => Some(checked(stored).ok()?),
    };
    Some((record, distribution, wall_time))
}

/// A line the sink's encoder wrote, read whether sure or not.
fn read(raw: &[u8]) -> Option<(line::Record<'_>, Option<Distribution>)> {
    let mut record = line::parse(raw).ok()?;
    let distribution = match record.distribution.take() {
        None => None,
        Some(stored) => Some(checked(stored).ok()?),
    };
    Some((record, distribution))
}

/// `_grouped_tag`: `train.loss.mean` as `train.loss/mean` when grouped and
/// the key ends in an aggregation's suffix after a non-empty stat name.
fn tag(key: &str, grouped: bool) -> String {
    if grouped
        && let Some((stat, agg)) = key.rsplit_once('.')
        && !stat.is_empty()
        && TABLE.iter().any(|row| row.key_suffix == agg)
    {
        return format!("{stat}/{agg}");
    }
    key.to_owned()
}

/// `_histogram_tag`: the stat of the first tag, then `.histogram`
/// (`/histogram` grouped).
fn histogram_tag(first: &str, grouped: bool) -> String {
    let separator = if grouped { '/' } else { '.' };
    let stat = match first.rsplit_once(separator) {
        Some((stat, _)) if !stat.is_empty() => stat,
        _ => first,
    };
    format!("{stat}{separator}histogram")
}

/// Days from 0001-01-01 (day 1) to `year-month-day`: CPython's
/// `ymd_to_ord`.
fn ordinal(year: i64, month: i64, day: i64) -> i64 {
    const BEFORE: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let y = year - 1;
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days_before_month = BEFORE[(month - 1) as usize] + i64::from(month > 2 && leap);
    y * 365 + y / 4 - y / 100 + y / 400 + days_before_month + day
}

/// CPython's `utc_to_seconds`: seconds since 0001-01-01 00:00 minus a day.
fn utc_to_seconds(y: i64, mo: i64, d: i64, h: i64, mi: i64, s: i64) -> i64 {
    ordinal(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s
}

/// `utc_to_seconds(1970, 1, 1, 0, 0, 0)`.
const EPOCH: i64 = 719_163 * 86_400;

/// CPython's `local()`: the local time at `u` (seconds as
/// `utc_to_seconds`), in the same seconds.
#[cfg(unix)]
fn local(u: i64) -> Option<i64> {
    let t = libc::time_t::try_from(u - EPOCH).ok()?;
    // SAFETY: all-zero bytes are a valid `libc::tm` (integers, and on some
    // platforms a null `tm_zone` pointer, which localtime_r overwrites).
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to live locals of the right types for the
    // call's duration; localtime_r is the reentrant variant, as Python's.
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return None;
    }
    Some(utc_to_seconds(
        i64::from(tm.tm_year) + 1900,
        i64::from(tm.tm_mon) + 1,
        i64::from(tm.tm_mday),
        i64::from(tm.tm_hour),
        i64::from(tm.tm_min),
        i64::from(tm.tm_sec),
    ))
}

/// CPython's `local_to_seconds`: a naive local time as seconds, the
/// repeated hour's `fold` and the skipped hour as `datetime.timestamp()`
/// reads them (Modules/_datetimemodule.c).
#[cfg(unix)]
fn local_to_seconds(t: i64, fold: bool) -> Option<i64> {
    const MAX_FOLD_SECONDS: i64 = 24 * 3600;
    let a = local(t)? - t;
    let u1 = t - a;
    let t1 = local(u1)?;
    let b = if t1 == t {
        let u2 = if fold {
            u1 + MAX_FOLD_SECONDS
        } else {
            u1 - MAX_FOLD_SECONDS
        };
        let b = local(u2)? - u2;
        if a == b {
            return Some(u1);
        }
        b
    } else {
        t1 - u1
    };
    let u2 = t - b;
    let t2 = local(u2)?;
    if t2 == t {
        return Some(u2);
    }
    if t1 == t {
        return Some(u1);
    }
    Some(if fold { u1.min(u2) } else { u1.max(u2) })
}

#[cfg(not(unix))]
fn local_to_seconds(_t: i64, _fold: bool) -> Option<i64> {
    None
}

/// `datetime.fromisoformat(stamp).timestamp()` (with `fold`) for a stamp
/// `line::is_isoformat` accepts, computed as CPython does: a naive time
/// through the C library's local time, an offset one exactly; `None` where
/// the two might differ (then Python reads the line).
pub fn wall_time(stamp: &[u8], fold: bool) -> Option<f64> {
    if !line::is_isoformat(stamp) {
        return None;
    }
    let number = |at: usize, n: usize| -> i64 {
        stamp[at..at + n]
            .iter()
            .fold(0, |acc, &b| acc * 10 + i64::from(b - b'0'))
    };
    let (year, month, day) = (number(0, 4), number(5, 2), number(8, 2));
    let (hour, minute, second) = (number(11, 2), number(14, 2), number(17, 2));
    let mut rest = &stamp[19..];
    let mut micros = 0;
    if rest.first() == Some(&b'.') {
        micros = number(20, 6);
        rest = &rest[7..];
    }
    let t = utc_to_seconds(year, month, day, hour, minute, second);
    if rest.is_empty() {
        // Far from year 1 and 9999, where CPython's conversion may fail.
        if !(2..=9998).contains(&year) {
            return None;
        }
        let seconds = local_to_seconds(t, fold)?;
        return Some((seconds - EPOCH) as f64 + micros as f64 / 1e6);
    }
    let offset = (i64::from(rest[1] - b'0') * 10 + i64::from(rest[2] - b'0')) * 3600
        + (i64::from(rest[4] - b'0') * 10 + i64::from(rest[5] - b'0')) * 60;
    let offset = if rest[0] == b'-' { -offset } else { offset };
    // total_seconds(): microseconds / 10**6, one rounding while they fit a
    // double exactly, as Python's int division then makes it.
    let total = (t - offset - EPOCH) * 1_000_000 + micros;
    (total.unsigned_abs() < 1 << 53).then(|| total as f64 / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_as_the_handler_makes_them() {
        assert_eq!(tag("train.loss.mean", true), "train.loss/mean");
        assert_eq!(tag("train.loss.mean", false), "train.loss.mean");
        assert_eq!(tag(".mean", true), ".mean");
        assert_eq!(tag("loss.other", true), "loss.other");
        assert_eq!(histogram_tag("a.b.mean", false), "a.b.histogram");
        assert_eq!(histogram_tag("a.b/mean", true), "a.b/histogram");
        assert_eq!(histogram_tag("mean", false), "mean.histogram");
        assert_eq!(histogram_tag(".mean", false), ".mean.histogram");
    }

    #[test]
    fn wall_time_with_an_offset_is_exact() {
        assert_eq!(wall_time(b"1970-01-01T00:00:00+00:00", false), Some(0.0));
        assert_eq!(
            wall_time(b"2024-05-06T12:13:14.000015+02:00", false),
            Some(1_714_990_394_000_015.0 / 1e6)
        );
        assert_eq!(wall_time(b"2024-05-06 12:13:14", false), None);
    }
}
