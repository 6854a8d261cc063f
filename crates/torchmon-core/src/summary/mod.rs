//! `torchmon summarize` (docs/cli.md) without a Python object per line: the
//! lines of JSON-lines logs split, read (`line`) and folded into per-Stat
//! series (`series`), merged distributions, counts of the other events and,
//! over several files, the per-rank table and straggler scores. The binding
//! feeds it the files' bytes; python/torchmon/cli/summarize.py formats the
//! rows. Memory grows with the number of Stats, event names and ranks, not
//! with the length of the logs (one line at most is kept whole).

pub mod line;
pub mod series;

use std::borrow::Cow;
use std::collections::HashMap;

use crate::aggregation::TABLE;
use crate::histogram::{Distribution, check_scale};
use crate::stat::STAT_EVENT;
use line::{NotHandled, StoredDistribution, Value};
use series::Series;

/// The fallback: for a line `line::parse` leaves to Python and its number,
/// the event Python's reader reads there written again as a JSON line (by
/// the sink's encoder, read here as sure), or `None` for an unreadable line
/// (that it counted, or refused with an error).
pub trait Fallback<E>: FnMut(&[u8], u64) -> Result<Option<Vec<u8>>, E> {}
impl<E, F: FnMut(&[u8], u64) -> Result<Option<Vec<u8>>, E>> Fallback<E> for F {}

/// Why [`Summary::feed`] stopped.
#[derive(Debug, PartialEq)]
pub enum FeedError<E> {
    /// Line `n` (1-based, of the current file) is longer than the limit.
    LineTooLong(u64),
    /// The fallback failed (with `--strict`, an unreadable line).
    Fallback(E),
    /// Line `n`'s distribution, merged with the earlier ones, counts more
    /// than `u64::MAX` samples somewhere (`Distribution::merge`).
    CountsOverflow(u64),
}

/// A stored distribution checked by the rules of docs/api.md
/// ("Distribution"), or `NotHandled`: the Python reader then says why it is
/// not valid.
pub(crate) fn checked(stored: StoredDistribution) -> Result<Distribution, NotHandled> {
    if let Some(scale) = stored.scale {
        check_scale(i128::from(scale)).map_err(|_| NotHandled)?;
    }
    Distribution::from_parts(stored.parts).map_err(|_| NotHandled)
}

/// A line's event and its checked distribution; `sure`: whether to take a
/// line that Python may read otherwise (`Record::sure`).
fn read(raw: &[u8], sure: bool) -> Option<(line::Record<'_>, Option<Distribution>)> {
    let mut record = line::parse(raw).ok().filter(|r| sure || r.sure)?;
    let distribution = match record.distribution.take() {
        None => None,
        Some(stored) => Some(checked(stored).ok()?),
    };
    Some((record, distribution))
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

/// Counts past `u64::MAX` (see [`FeedError::CountsOverflow`]).
struct CountsOverflow;

fn merge_into(slot: &mut Option<Distribution>, d: &Distribution) -> Result<(), CountsOverflow> {
    *slot = Some(match slot {
        Some(merged) => merged.merge(d).ok_or(CountsOverflow)?,
        None => d.clone(),
    });
    Ok(())
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

/// A cell of [`Summary::table`]'s rows, as the binding hands it on.
#[derive(Clone, Debug, PartialEq)]
pub enum Cell<'a> {
    Text(Cow<'a, str>),
    Int(u64),
    Float(f64),
    Bytes(&'a [u8]),
    /// No figure: min/max when every window was NaN, a total that does not
    /// add up, a score without a usable p50.
    Nothing,
}

use Cell::{Bytes, Float, Int, Nothing};

#[allow(non_snake_case)]
fn Text(text: &str) -> Cell<'_> {
    Cell::Text(Cow::Borrowed(text))
}

fn maybe(value: Option<f64>) -> Cell<'static> {
    value.map_or(Nothing, Float)
}

type Rows<'a> = Vec<Vec<Cell<'a>>>;

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

    /// The file's next bytes (lines left to Python go to `fallback`).
    pub fn feed<E>(
        &mut self,
        mut block: &[u8],
        fallback: &mut impl Fallback<E>,
    ) -> Result<(), FeedError<E>> {
        if !self.pending.is_empty() {
            let Some(end) = memchr::memchr(b'\n', block) else {
                self.pending.extend_from_slice(block);
                return self.check_pending();
            };
            self.pending.extend_from_slice(&block[..=end]);
            block = &block[end + 1..];
            let line = std::mem::take(&mut self.pending);
            let result = self.line(&line, fallback);
            self.pending = line;
            self.pending.clear();
            result?;
        }
        while let Some(end) = memchr::memchr(b'\n', block) {
            self.line(&block[..=end], fallback)?;
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
    pub fn finish_file<E>(&mut self, fallback: &mut impl Fallback<E>) -> Result<u64, FeedError<E>> {
        if !self.pending.is_empty() {
            let line = std::mem::take(&mut self.pending);
            self.line(&line, fallback)?;
        }
        Ok(self.records)
    }

    fn line<E>(&mut self, raw: &[u8], fallback: &mut impl Fallback<E>) -> Result<(), FeedError<E>> {
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
        if let Some((record, distribution)) = read(raw, false) {
            return self.add(&record.name, &record.data, distribution, raw);
        }
        match fallback(raw, self.lineno) {
            // Python's event always reads (a count beyond u64 aside, which
            // no Stat makes).
            Ok(Some(line)) => match read(&line, true) {
                Some((record, distribution)) => {
                    self.add(&record.name, &record.data, distribution, raw)
                }
                None => Ok(()),
            },
            Ok(None) => Ok(()),
            Err(e) => Err(FeedError::Fallback(e)),
        }
    }

    /// Folds one event in (`line`: its line, kept for the other events'
    /// last data).
    fn add<K: AsRef<str>, E>(
        &mut self,
        name: &str,
        data: &[(K, Value)],
        distribution: Option<Distribution>,
        line: &[u8],
    ) -> Result<(), FeedError<E>> {
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
            return Ok(());
        }
        if let (Some(d), Some((first, _))) = (&distribution, data.first()) {
            let stat = distribution_stat(first.as_ref());
            match self.distributions.get_mut(stat) {
                Some((merged, windows)) => {
                    *merged = merged
                        .merge(d)
                        .ok_or(FeedError::CountsOverflow(self.lineno))?;
                    *windows += 1;
                }
                None => {
                    self.distributions.insert(stat.to_owned(), (d.clone(), 1));
                }
            }
            if let Some(ranks) = &mut self.ranks {
                let lineno = self.lineno;
                merge_into(&mut ranks.median(stat, self.label).merged, d)
                    .map_err(|_| FeedError::CountsOverflow(lineno))?;
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
        Ok(())
    }

    /// The rows of one table by name (`None` for another name), each
    /// sorted by stat: `stats` (stat, aggregation, windows, last, mean, min,
    /// max, trend drawn with `bars`, low to high; aggregations in first-seen
    /// order), `quantiles` (stat, windows, samples, p50, p90, p99, p999, of
    /// every sample of every window), `others` (event, count, last line),
    /// `ranks` (stat, aggregation, files, total, min, min_rank, max,
    /// max_rank) and `stragglers` (stat, rank, p50, score).
    pub fn table(&self, name: &str, bars: &[char]) -> Option<Rows<'_>> {
        Some(match name {
            "stats" => self.stat_rows(bars),
            "quantiles" => {
                let mut rows: Vec<(&String, Vec<Cell<'_>>)> = (self.distributions.iter())
                    .map(|(stat, (merged, windows))| {
                        let mut row = vec![Text(stat), Int(*windows), Int(merged.count)];
                        row.extend(
                            [500, 900, 990, 999].map(|k| Float(merged.quantile_thousandths(k))),
                        );
                        (stat, row)
                    })
                    .collect();
                rows.sort_by(|a, b| a.0.cmp(b.0));
                rows.into_iter().map(|(_, row)| row).collect()
            }
            "others" => {
                let mut rows: Vec<_> = self.others.iter().collect();
                rows.sort_by(|a, b| a.0.cmp(b.0));
                (rows.into_iter())
                    .map(|(name, o)| vec![Text(name), Int(o.count), Bytes(&o.last_line)])
                    .collect()
            }
            "ranks" => self.ranks.as_ref().map_or_else(Vec::new, Ranks::rank_rows),
            "stragglers" => self
                .ranks
                .as_ref()
                .map_or_else(Vec::new, Ranks::straggler_rows),
            _ => return None,
        })
    }

    fn stat_rows(&self, bars: &[char]) -> Rows<'_> {
        let mut stats: Vec<&StatEntry> = self.stats.iter().collect();
        stats.sort_by(|a, b| a.name.cmp(&b.name));
        let mut rows = Vec::new();
        for entry in stats {
            for (agg, series) in &entry.series {
                let known = series.n > 0;
                rows.push(vec![
                    Text(&entry.name),
                    Text(agg),
                    Int(entry.windows),
                    Float(series.last),
                    Float(series.mean()),
                    maybe(known.then_some(series.low)),
                    maybe(known.then_some(series.high)),
                    Cell::Text(Cow::Owned(series.trend.draw(bars))),
                ]);
            }
        }
        rows
    }
}

impl Ranks {
    fn rank_rows(&self) -> Rows<'_> {
        let label = |i: usize| {
            Text(if i == usize::MAX {
                "-"
            } else {
                &self.labels[i]
            })
        };
        let mut rows: Vec<&RankRow> = self.rows.iter().collect();
        rows.sort_by(|a, b| a.stat.cmp(&b.stat));
        (rows.into_iter())
            .map(|r| {
                let adds_up = matches!(r.agg.as_str(), "count" | "sum");
                vec![
                    Text(&r.stat),
                    Text(&r.agg),
                    Int(r.files),
                    maybe(adds_up.then_some(r.total)),
                    Float(r.low),
                    label(r.low_at),
                    Float(r.high),
                    label(r.high_at),
                ]
            })
            .collect()
    }

    /// Per Stat with a median and rank: the rank's p50 (of all its samples
    /// when their distributions were stored, else the mean of its windows'
    /// p50) and its straggler score, the fastest rank's p50 over that p50
    /// (docs/cli.md); Stats seen on one rank only, or without a finite p50,
    /// are left out.
    fn straggler_rows(&self) -> Rows<'_> {
        let mut stats: Vec<&String> = self.medians.keys().collect();
        stats.sort();
        let mut rows = Vec::new();
        for stat in stats {
            let p50s: Vec<(usize, f64)> = (self.medians[stat].iter())
                .map(|(label, m)| match &m.merged {
                    Some(d) => (*label, d.quantile_thousandths(500)),
                    None => (*label, m.windows.mean()),
                })
                .collect();
            let finite = p50s.iter().map(|&(_, p)| p).filter(|p| p.is_finite());
            let fastest = finite.reduce(|low, p| if p < low { p } else { low });
            let Some(fastest) = fastest.filter(|_| p50s.len() >= 2) else {
                continue;
            };
            for (label, p50) in p50s {
                let usable = p50.is_finite() && fastest > 0.0;
                let score = maybe(usable.then(|| fastest / p50));
                rows.push(vec![
                    Text(stat),
                    Text(&self.labels[label]),
                    Float(p50),
                    score,
                ]);
            }
        }
        rows
    }

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
