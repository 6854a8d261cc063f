//! `torchmon summarize` (docs/cli.md) without a Python object per line: the
//! lines of JSON-lines logs split, read (`line`) and folded into per-Stat
//! series (`series`), merged distributions, counts of the other events and,
//! over several files, the per-rank table and straggler scores. The binding
//! feeds it the files' bytes; python/torchmon/cli/summarize.py formats the
//! rows. Memory grows with the number of Stats, event names and ranks, not
//! with the length of the logs (one line at most is kept whole).

pub mod line;
pub mod series;

use std::collections::HashMap;

use crate::aggregation::TABLE;
use crate::histogram::{Distribution, check_scale};
use crate::stat::STAT_EVENT;
use line::{NotHandled, StoredDistribution, Value};
use series::Series;

/// An event the Python reader read for a line [`line::parse`] left to it.
#[derive(Clone, Debug, Default)]
pub struct Decoded {
    pub name: String,
    pub data: Vec<(String, Value)>,
    pub distribution: Option<Distribution>,
}

/// Why [`Summary::feed`] stopped.
#[derive(Debug, PartialEq)]
pub enum FeedError<E> {
    /// Line `n` (1-based, of the current file) is longer than the limit.
    LineTooLong(u64),
    /// The fallback failed (with `--strict`, an unreadable line).
    Fallback(E),
}

/// A stored distribution checked by the rules of docs/api.md
/// ("Distribution"), or `NotHandled`: the Python reader then says why it is
/// not valid.
fn checked(stored: StoredDistribution) -> Result<Distribution, NotHandled> {
    if let Some(scale) = stored.scale {
        check_scale(i128::from(scale)).map_err(|_| NotHandled)?;
    }
    Distribution::from_parts(stored.parts).map_err(|_| NotHandled)
}

/// `"train.loss.mean"` -> `("train.loss", "mean")`; a key without a known
/// aggregation suffix is its own stat with aggregation `""`.
pub fn split_stat_key(key: &str) -> (&str, &str) {
    if let Some((stat, agg)) = key.rsplit_once('.')
        && TABLE.iter().any(|row| row.key_suffix == agg)
    {
        return (stat, agg);
    }
    (key, "")
}

/// The stat a window's distribution belongs to: its event's first key
/// without the aggregation (every key of a window event is
/// `<stat>.<aggregation>`).
fn distribution_stat(first_key: &str) -> &str {
    match first_key.rsplit_once('.') {
        Some((stat, _)) if !stat.is_empty() => stat,
        _ => first_key,
    }
}

fn merge_into(slot: &mut Option<Distribution>, d: Distribution) {
    *slot = Some(match slot.take() {
        Some(merged) => merged.merge(&d),
        None => d,
    });
}

#[derive(Debug)]
struct StatEntry {
    name: String,
    windows: u64,
    /// The number of the last event counted in `windows`.
    last_event: u64,
    series: Vec<(String, Series)>,
}

#[derive(Debug)]
struct OtherEntry {
    count: u64,
    /// The last such event's line: its data is shown as the Python reader
    /// reads it.
    last_line: Vec<u8>,
}

/// One (stat, aggregation) across files.
#[derive(Debug)]
struct RankRow {
    stat: String,
    agg: String,
    files: u64,
    last_file: u64,
    total: f64,
    low: f64,
    low_at: usize,
    high: f64,
    high_at: usize,
}

/// One rank's medians of one Stat: the merge of its stored distributions,
/// and its p50 windows.
#[derive(Debug, Default)]
struct Median {
    merged: Option<Distribution>,
    windows: Series,
}

#[derive(Debug, Default)]
struct Ranks {
    labels: Vec<String>,
    rows: Vec<RankRow>,
    index: HashMap<String, Vec<(String, usize)>>,
    /// stat -> (label, its medians) in first-seen order.
    medians: HashMap<String, Vec<(usize, Median)>>,
}

/// A row of the per-stat table.
#[derive(Debug, PartialEq)]
pub struct StatRow<'a> {
    pub stat: &'a str,
    pub aggregation: &'a str,
    pub windows: u64,
    pub last: f64,
    pub mean: f64,
    /// `None` when every window was NaN.
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub trend: String,
}

/// A row of the quantile table.
#[derive(Debug, PartialEq)]
pub struct QuantileRow<'a> {
    pub stat: &'a str,
    pub windows: u64,
    pub samples: u64,
    /// p50, p90, p99, p999.
    pub quantiles: [f64; 4],
}

/// A row of the per-rank table.
#[derive(Debug, PartialEq)]
pub struct RankTableRow<'a> {
    pub stat: &'a str,
    pub aggregation: &'a str,
    pub files: u64,
    /// The total, for the aggregations that add up (count, sum).
    pub total: Option<f64>,
    pub min: f64,
    pub min_at: &'a str,
    pub max: f64,
    pub max_at: &'a str,
}

/// A row of the straggler table.
#[derive(Debug, PartialEq)]
pub struct StragglerRow<'a> {
    pub stat: &'a str,
    pub rank: &'a str,
    pub p50: f64,
    /// The fastest rank's p50 over this one's (docs/cli.md).
    pub score: Option<f64>,
}

/// Everything `torchmon summarize` prints, fed file by file.
#[derive(Debug, Default)]
pub struct Summary {
    stats: Vec<StatEntry>,
    stat_index: HashMap<String, usize>,
    distributions: HashMap<String, (Distribution, u64)>,
    others: HashMap<String, OtherEntry>,
    events: u64,
    ranks: Option<Ranks>,
    limit: usize,
    // The file being read.
    pending: Vec<u8>,
    lineno: u64,
    records: u64,
    label: usize,
    file: u64,
}

impl Summary {
    /// `line_limit`: the longest line, its newline included; `ranks`:
    /// whether to keep the across-files tables.
    pub fn new(line_limit: usize, ranks: bool) -> Self {
        Summary {
            limit: line_limit,
            ranks: ranks.then(Ranks::default),
            ..Summary::default()
        }
    }

    /// Starts reading a file, `label` naming it in the per-rank tables.
    pub fn start_file(&mut self, label: &str) {
        self.pending.clear();
        self.lineno = 0;
        self.records = 0;
        self.file += 1;
        if let Some(ranks) = &mut self.ranks {
            ranks.labels.push(label.to_owned());
            self.label = ranks.labels.len() - 1;
        }
    }

    /// The file's next bytes. A line the reader leaves to Python goes to
    /// `fallback(line, lineno, unfinished)`, which returns its event or
    /// `None` for an unreadable line (that it counted, or refused with an
    /// error).
    pub fn feed<E>(
        &mut self,
        mut block: &[u8],
        fallback: &mut impl FnMut(&[u8], u64, bool) -> Result<Option<Decoded>, E>,
    ) -> Result<(), FeedError<E>> {
        if !self.pending.is_empty() {
            let Some(end) = memchr::memchr(b'\n', block) else {
                self.pending.extend_from_slice(block);
                return self.check_pending();
            };
            self.pending.extend_from_slice(&block[..=end]);
            block = &block[end + 1..];
            let line = std::mem::take(&mut self.pending);
            let result = self.line(&line, false, fallback);
            self.pending = line;
            self.pending.clear();
            result?;
        }
        while let Some(end) = memchr::memchr(b'\n', block) {
            self.line(&block[..=end], false, fallback)?;
            block = &block[end + 1..];
        }
        self.pending.extend_from_slice(block);
        self.check_pending()
    }

    fn check_pending<E>(&self) -> Result<(), FeedError<E>> {
        if self.pending.len() > self.limit {
            return Err(FeedError::LineTooLong(self.lineno + 1));
        }
        Ok(())
    }

    /// Ends the file: a last line without its newline counts when it is a
    /// whole event (a writer may still be writing it, docs/sinks.md,
    /// "Reading"). Returns how many events the file held.
    pub fn finish_file<E>(
        &mut self,
        fallback: &mut impl FnMut(&[u8], u64, bool) -> Result<Option<Decoded>, E>,
    ) -> Result<u64, FeedError<E>> {
        if !self.pending.is_empty() {
            let line = std::mem::take(&mut self.pending);
            self.line(&line, true, fallback)?;
        }
        Ok(self.records)
    }

    fn line<E>(
        &mut self,
        raw: &[u8],
        unfinished: bool,
        fallback: &mut impl FnMut(&[u8], u64, bool) -> Result<Option<Decoded>, E>,
    ) -> Result<(), FeedError<E>> {
        self.lineno += 1;
        if raw.len() > self.limit {
            return Err(FeedError::LineTooLong(self.lineno));
        }
        if raw
            .iter()
            .all(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
        {
            return Ok(());
        }
        if let Ok(record) = line::parse(raw) {
            let distribution = match record.distribution {
                None => Some(None),
                Some(stored) => checked(stored).ok().map(Some),
            };
            if let Some(distribution) = distribution {
                self.add(&record.name, &record.data, distribution, raw);
                return Ok(());
            }
        }
        match fallback(raw, self.lineno, unfinished) {
            Ok(Some(event)) => self.add(&event.name, &event.data, event.distribution, raw),
            Ok(None) => {}
            Err(e) => return Err(FeedError::Fallback(e)),
        }
        Ok(())
    }

    /// Folds one event in (`line`: its line, kept for the other events'
    /// last data).
    pub fn add<K: AsRef<str>>(
        &mut self,
        name: &str,
        data: &[(K, Value)],
        distribution: Option<Distribution>,
        line: &[u8],
    ) {
        self.records += 1;
        self.events += 1;
        if name != STAT_EVENT {
            if !self.others.contains_key(name) {
                let entry = OtherEntry {
                    count: 0,
                    last_line: Vec::new(),
                };
                self.others.insert(name.to_owned(), entry);
            }
            let other = self.others.get_mut(name).expect("inserted");
            other.count += 1;
            other.last_line.clear();
            other.last_line.extend_from_slice(line);
            return;
        }
        if let (Some(d), Some((first, _))) = (&distribution, data.first()) {
            let stat = distribution_stat(first.as_ref());
            match self.distributions.get_mut(stat) {
                Some((merged, windows)) => {
                    *merged = merged.merge(d);
                    *windows += 1;
                }
                None => {
                    self.distributions.insert(stat.to_owned(), (d.clone(), 1));
                }
            }
            if let Some(ranks) = &mut self.ranks {
                merge_into(&mut ranks.median(stat, self.label).merged, d.clone());
            }
        }
        for (key, value) in data {
            let Value::Number(value) = *value else {
                continue;
            };
            let (stat, agg) = split_stat_key(key.as_ref());
            let index = match self.stat_index.get(stat) {
                Some(&i) => i,
                None => {
                    self.stats.push(StatEntry {
                        name: stat.to_owned(),
                        windows: 0,
                        last_event: 0,
                        series: Vec::new(),
                    });
                    self.stat_index
                        .insert(stat.to_owned(), self.stats.len() - 1);
                    self.stats.len() - 1
                }
            };
            let entry = &mut self.stats[index];
            if entry.last_event != self.events {
                entry.last_event = self.events;
                entry.windows += 1;
            }
            match entry.series.iter_mut().find(|(a, _)| a == agg) {
                Some((_, series)) => series.add(value),
                None => {
                    let mut series = Series::default();
                    series.add(value);
                    entry.series.push((agg.to_owned(), series));
                }
            }
            if let Some(ranks) = &mut self.ranks {
                ranks.add(stat, agg, value, self.label, self.file);
            }
        }
    }

    /// Whether any Stat event had a number.
    pub fn has_stats(&self) -> bool {
        !self.stats.is_empty()
    }

    /// Per stat (sorted) and aggregation (first seen first): the table's
    /// figures, the trend drawn with `bars` (low to high).
    pub fn stat_rows(&self, bars: &[char]) -> Vec<StatRow<'_>> {
        let mut stats: Vec<&StatEntry> = self.stats.iter().collect();
        stats.sort_by(|a, b| a.name.cmp(&b.name));
        let mut rows = Vec::new();
        for entry in stats {
            for (agg, series) in &entry.series {
                let known = series.n > 0;
                rows.push(StatRow {
                    stat: &entry.name,
                    aggregation: agg,
                    windows: entry.windows,
                    last: series.last,
                    mean: series.mean(),
                    min: known.then_some(series.low),
                    max: known.then_some(series.high),
                    trend: series.trend.draw(bars),
                });
            }
        }
        rows
    }

    /// Per stat (sorted) with stored distributions: the quantiles of every
    /// sample of every window.
    pub fn quantile_rows(&self) -> Vec<QuantileRow<'_>> {
        let mut rows: Vec<QuantileRow<'_>> = self
            .distributions
            .iter()
            .map(|(stat, (merged, windows))| QuantileRow {
                stat,
                windows: *windows,
                samples: merged.count,
                quantiles: [500, 900, 990, 999].map(|k| merged.quantile_thousandths(k)),
            })
            .collect();
        rows.sort_by(|a, b| a.stat.cmp(b.stat));
        rows
    }

    /// Per other event name (sorted): its count and its last line.
    pub fn other_rows(&self) -> Vec<(&str, u64, &[u8])> {
        let mut rows: Vec<(&str, u64, &[u8])> = self
            .others
            .iter()
            .map(|(name, o)| (name.as_str(), o.count, o.last_line.as_slice()))
            .collect();
        rows.sort_by(|a, b| a.0.cmp(b.0));
        rows
    }

    /// Across files, per stat (sorted, aggregations in first-seen order).
    pub fn rank_rows(&self) -> Vec<RankTableRow<'_>> {
        let Some(ranks) = &self.ranks else {
            return Vec::new();
        };
        let label = |i: usize| {
            if i == usize::MAX {
                "-"
            } else {
                ranks.labels[i].as_str()
            }
        };
        let mut rows: Vec<&RankRow> = ranks.rows.iter().collect();
        rows.sort_by(|a, b| a.stat.cmp(&b.stat));
        rows.into_iter()
            .map(|r| RankTableRow {
                stat: &r.stat,
                aggregation: &r.agg,
                files: r.files,
                total: matches!(r.agg.as_str(), "count" | "sum").then_some(r.total),
                min: r.low,
                min_at: label(r.low_at),
                max: r.high,
                max_at: label(r.high_at),
            })
            .collect()
    }

    /// Per Stat with a median (sorted) and rank: the rank's p50 (of all its
    /// samples when their distributions were stored, else the mean of its
    /// windows' p50) and its straggler score, the fastest rank's p50 over
    /// that p50 (docs/cli.md); Stats seen on one rank only, or without a
    /// finite p50, are left out.
    pub fn straggler_rows(&self) -> Vec<StragglerRow<'_>> {
        let Some(ranks) = &self.ranks else {
            return Vec::new();
        };
        let mut stats: Vec<&String> = ranks.medians.keys().collect();
        stats.sort();
        let mut rows = Vec::new();
        for stat in stats {
            let p50s: Vec<(&str, f64)> = ranks.medians[stat]
                .iter()
                .map(|(label, m)| {
                    let p50 = match &m.merged {
                        Some(d) => d.quantile_thousandths(500),
                        None => m.windows.mean(),
                    };
                    (ranks.labels[*label].as_str(), p50)
                })
                .collect();
            let fastest = p50s
                .iter()
                .map(|&(_, p)| p)
                .filter(|p| p.is_finite())
                .fold(None, |low: Option<f64>, p| {
                    Some(low.map_or(p, |l| if p < l { p } else { l }))
                });
            let Some(fastest) = fastest.filter(|_| p50s.len() >= 2) else {
                continue;
            };
            for (rank, p50) in p50s {
                let usable = p50.is_finite() && fastest > 0.0;
                rows.push(StragglerRow {
                    stat,
                    rank,
                    p50,
                    score: usable.then(|| fastest / p50),
                });
            }
        }
        rows
    }
}

impl Ranks {
    fn median(&mut self, stat: &str, label: usize) -> &mut Median {
        if !self.medians.contains_key(stat) {
            self.medians.insert(stat.to_owned(), Vec::new());
        }
        let ranks = self.medians.get_mut(stat).expect("inserted");
        // Labels are compared by text: two files given by the same path are
        // one rank.
        let found = ranks
            .iter()
            .position(|(l, _)| self.labels[*l] == self.labels[label]);
        let i = found.unwrap_or_else(|| {
            ranks.push((label, Median::default()));
            ranks.len() - 1
        });
        &mut ranks[i].1
    }

    fn add(&mut self, stat: &str, agg: &str, value: f64, label: usize, file: u64) {
        if !self.index.contains_key(stat) {
            self.index.insert(stat.to_owned(), Vec::new());
        }
        let aggs = self.index.get_mut(stat).expect("inserted");
        let i = match aggs.iter().find(|(a, _)| a == agg) {
            Some(&(_, i)) => i,
            None => {
                self.rows.push(RankRow {
                    stat: stat.to_owned(),
                    agg: agg.to_owned(),
                    files: 0,
                    last_file: 0,
                    total: 0.0,
                    low: f64::NAN,
                    low_at: usize::MAX,
                    high: f64::NAN,
                    high_at: usize::MAX,
                });
                aggs.push((agg.to_owned(), self.rows.len() - 1));
                self.rows.len() - 1
            }
        };
        let row = &mut self.rows[i];
        if row.last_file != file {
            row.last_file = file;
            row.files += 1;
        }
        row.total += value;
        if agg == "p50" {
            self.median(stat, label).windows.add(value);
        }
        if value.is_nan() {
            return;
        }
        let row = &mut self.rows[i];
        // Strict comparisons: on a tie the first file given keeps it.
        if row.low.is_nan() || value < row.low {
            (row.low, row.low_at) = (value, label);
        }
        if row.high.is_nan() || value > row.high {
            (row.high, row.high_at) = (value, label);
        }
    }
}

#[cfg(test)]
mod tests;
