//! loom models of `Stat`'s concurrent paths: every interleaving (up to a
//! preemption bound) and every weak-memory outcome loom allows is run, and
//! each must be one that some sequential order of the same calls gives.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release -p torchmon-core --lib loom_`
//! (see .ci/run).
//!
//! Each sample is a distinct power of two, so a window's exact sum names
//! the samples in it: a sample lost, counted twice or in two windows, or a
//! window read half-written (count and sum disagree) changes what is seen.
//! What is compared with the sequential reference (`Reference`, written from
//! docs/internals.md's window algorithm and not from `Stat`): the set of emitted windows, what each
//! `last_closed` (the binding's `get`) and `flush` call returned, and the
//! final state. Which add returns a window is not compared: a lock-free add
//! that fills a window may find it already closed by a racing add, which
//! then returns it instead.

use super::*;
use loom::sync::Arc;
use std::collections::BTreeSet;

const WINDOW_MS: i64 = 10;

#[derive(Clone, Debug)]
enum Op {
    Add(f64, i64),
    AddMany(Vec<f64>, i64),
    Get,
    Flush,
}

/// A window as (count, exact sum's bits): enough to name its samples.
type Seen = (u64, u64);

fn seen(w: &WindowStats) -> Seen {
    (w.count, w.sum.to_bits())
}

/// What one run of a model showed, comparable between runs.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Outcome {
    /// Every window emitted by an add, sorted (their order across threads
    /// is not observable to the caller anyway).
    emitted: Vec<Seen>,
    /// Per thread, in program order, what each `Get` and `Flush` returned
    /// (`Flush` returning nothing is `None`).
    reads: Vec<Vec<Option<Seen>>>,
    /// After every thread is done: the open window's count, what a final
    /// flush emits, then `last_closed`.
    open_count: u64,
    final_flush: Option<Seen>,
    final_prev: Seen,
}

/// docs/internals.md's window algorithm, one call at a time. A window id never goes back
/// (the clock of a call that lost a race with a close counts in the window
/// that is open), as `Stat` documents.
struct Reference {
    max_samples: u64,
    cur_id: i64,
    closed_id: i64,
    count: u64,
    sum: f64,
    prev: Seen,
    emitted: Vec<Seen>,
}

impl Reference {
    fn new(max_samples: u64) -> Self {
        Reference {
            max_samples,
            cur_id: 0,
            closed_id: 0,
            count: 0,
            sum: 0.0,
            prev: (0, 0.0f64.to_bits()),
            emitted: Vec::new(),
        }
    }

    fn close(&mut self) {
        self.prev = (self.count, self.sum.to_bits());
        self.count = 0;
        self.sum = 0.0;
    }

    fn step_1(&mut self, w: i64) {
        if (self.cur_id != w || self.count >= self.max_samples) && self.closed_id != w {
            if self.count > 0 {
                self.emitted.push((self.count, self.sum.to_bits()));
            }
            self.close();
            self.closed_id = self.cur_id;
            self.cur_id = w;
        }
    }

    fn add(&mut self, v: f64, now_ms: i64) {
        let w = (now_ms.div_euclid(WINDOW_MS) + 1).max(self.cur_id);
        self.step_1(w);
        if self.closed_id == w {
            return;
        }
        self.count += 1;
        self.sum += v;
        self.step_1(w);
    }

    fn flush(&mut self) -> Option<Seen> {
        if self.count == 0 {
            return None;
        }
        self.close();
        Some(self.prev)
    }

    fn run(&mut self, op: &Op) -> Option<Option<Seen>> {
        match op {
            Op::Add(v, t) => self.add(*v, *t),
            Op::AddMany(vs, t) => vs.iter().for_each(|v| self.add(*v, *t)),
            Op::Get => return Some(Some(self.prev)),
            Op::Flush => return Some(self.flush()),
        }
        None
    }
}

/// Every outcome of every sequential interleaving of `threads`' scripts.
fn sequential_outcomes(max_samples: u64, threads: &[Vec<Op>]) -> BTreeSet<Outcome> {
    fn go(
        max_samples: u64,
        threads: &[Vec<Op>],
        order: &mut Vec<usize>,
        out: &mut BTreeSet<Outcome>,
    ) {
        let total: usize = threads.iter().map(Vec::len).sum();
        if order.len() == total {
            let mut reference = Reference::new(max_samples);
            let mut next = vec![0; threads.len()];
            let mut reads = vec![Vec::new(); threads.len()];
            for &t in order.iter() {
                if let Some(read) = reference.run(&threads[t][next[t]]) {
                    reads[t].push(read);
                }
                next[t] += 1;
            }
            let open_count = reference.count;
            let final_flush = reference.flush();
            let mut emitted = reference.emitted.clone();
            emitted.sort_unstable();
            out.insert(Outcome {
                emitted,
                reads,
                open_count,
                final_flush,
                final_prev: reference.prev,
            });
            return;
        }
        for t in 0..threads.len() {
            let done = order.iter().filter(|&&u| u == t).count();
            if done < threads[t].len() {
                order.push(t);
                go(max_samples, threads, order, out);
                order.pop();
            }
        }
    }
    let mut out = BTreeSet::new();
    go(max_samples, threads, &mut Vec::new(), &mut out);
    out
}

/// Checks one window against the samples its sum names: count, min, max
/// and last (when `aggregations` ask for them) belong to that set.
fn check_window(w: &WindowStats, aggregations: &[Aggregation]) {
    let bits = w.sum as u64;
    assert_eq!(
        bits as f64, w.sum,
        "sums of distinct powers of two are exact"
    );
    assert_eq!(u64::from(bits.count_ones()), w.count, "torn window {w:?}");
    if w.count == 0 {
        assert_eq!(*w, WindowStats::EMPTY);
        return;
    }
    let lowest = (1u64 << bits.trailing_zeros()) as f64;
    let highest = (1u64 << (63 - bits.leading_zeros())) as f64;
    if aggregations.contains(&Aggregation::Min) {
        assert_eq!(w.min, lowest, "{w:?}");
    }
    if aggregations.contains(&Aggregation::Max) {
        assert_eq!(w.max, highest, "{w:?}");
    }
    if aggregations.contains(&Aggregation::Value) {
        let last = w.last as u64;
        assert!(last.is_power_of_two() && bits & last != 0, "{w:?}");
    }
    if aggregations.contains(&Aggregation::P50) {
        // The histogram holds exactly the window's samples: 2^k is the
        // upper bound of bucket 64k - 1.
        let d = w
            .distribution
            .as_ref()
            .expect("a P aggregation keeps the histogram");
        let expected: Vec<(i32, u64)> = (0..64)
            .filter(|k| bits & (1 << k) != 0)
            .map(|k| (64 * k - 1, 1))
            .collect();
        assert_eq!(d.buckets.positive, expected, "{w:?}");
        assert_eq!(d.count, w.count);
    }
    if aggregations.contains(&Aggregation::Stddev) {
        assert!(w.stddev.is_finite() && w.stddev >= 0.0, "{w:?}");
        assert_eq!(w.stddev == 0.0, w.count == 1, "{w:?}");
    }
}

/// Runs `threads`' scripts on one Stat, each in its own loom thread (the
/// first on the model's main thread), and asserts that every execution's
/// outcome is a sequential one.
fn model(aggregations: &'static [Aggregation], max_samples: i64, threads: Vec<Vec<Op>>) {
    model_bounded(aggregations, max_samples, threads, 3);
}

/// `model` with loom's preemption bound: 3 unless the model is too big for
/// CI's time with it (each one more multiplies the executions ~30-fold).
fn model_bounded(
    aggregations: &'static [Aggregation],
    max_samples: i64,
    threads: Vec<Vec<Op>>,
    preemption_bound: usize,
) {
    let expected = sequential_outcomes(max_samples as u64, &threads);
    let sequential = expected.len();
    let executions = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&executions);
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(preemption_bound);
    // A histogram's close reads every group pointer (132 loads per buffer),
    // each a loom branch point.
    if aggregations.contains(&Aggregation::P50) {
        builder.max_branches = 100_000;
    }
    builder.check(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let stat = Arc::new(Stat::new(aggregations, WINDOW_MS, max_samples));
        let run = |stat: &Stat, script: &[Op]| {
            let mut emitted = Vec::new();
            let mut reads = Vec::new();
            for op in script {
                let closed = match op {
                    Op::Add(v, t) => stat.add_at(*v, *t),
                    Op::AddMany(vs, t) => stat.add_many_at(vs.len(), |i| vs[i], *t),
                    Op::Get => {
                        reads.push(Some(stat.last_closed()));
                        continue;
                    }
                    Op::Flush => {
                        reads.push(stat.flush());
                        continue;
                    }
                };
                emitted.extend(closed.iter().cloned());
            }
            (emitted, reads)
        };
        let handles: Vec<_> = threads[1..]
            .iter()
            .map(|script| {
                let stat = Arc::clone(&stat);
                let script = script.clone();
                loom::thread::spawn(move || run(&stat, &script))
            })
            .collect();
        let mut results = vec![run(&stat, &threads[0])];
        results.extend(handles.into_iter().map(|h| h.join().unwrap()));

        let open_count = stat.count();
        let final_flush = stat.flush();
        let final_prev = stat.last_closed();
        let mut emitted: Vec<Seen> = Vec::new();
        for (windows, reads) in &results {
            for w in windows.iter().chain(reads.iter().flatten()) {
                check_window(w, aggregations);
            }
            emitted.extend(windows.iter().map(seen));
        }
        final_flush
            .iter()
            .chain([&final_prev])
            .for_each(|w| check_window(w, aggregations));
        emitted.sort_unstable();
        let outcome = Outcome {
            emitted,
            reads: results
                .iter()
                .map(|(_, reads)| reads.iter().map(|r| r.as_ref().map(seen)).collect())
                .collect(),
            open_count,
            final_flush: final_flush.as_ref().map(seen),
            final_prev: seen(&final_prev),
        };
        assert!(
            expected.contains(&outcome),
            "no sequential order gives {outcome:#?}\nthose give: {expected:#?}"
        );
    });
    let executions = executions.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("{executions} executions, {sequential} sequential outcomes");
    // A model that explored one schedule would prove nothing.
    assert!(executions > 10, "only {executions} executions");
}

use Aggregation::{Count, Max, Min, P50, Stddev, Sum, Value};
const SUM_COUNT: &[Aggregation] = &[Sum, Count];
const WITH_SPREAD: &[Aggregation] = &[Sum, Count, Stddev];
const WITH_HISTOGRAM: &[Aggregation] = &[Sum, Count, P50];
const ALL: &[Aggregation] = &[Value, Sum, Count, Max, Min];

#[test]
fn loom_adds_across_a_boundary_lose_and_double_count_nothing() {
    model(
        SUM_COUNT,
        i64::MAX,
        vec![
            vec![Op::Get],
            vec![Op::Add(1.0, 5), Op::Add(2.0, 15)],
            vec![Op::Add(4.0, 5), Op::Add(8.0, 15)],
        ],
    );
}

#[test]
fn loom_min_max_last_are_of_the_window_they_are_in() {
    model(
        ALL,
        i64::MAX,
        vec![
            vec![Op::Add(1.0, 5), Op::Get],
            vec![Op::Add(2.0, 5), Op::Add(4.0, 15)],
        ],
    );
}

#[test]
fn loom_max_samples_keeps_the_first_and_drops_the_rest() {
    model(
        SUM_COUNT,
        2,
        vec![
            vec![Op::Get],
            vec![Op::Add(1.0, 5), Op::Add(2.0, 5)],
            vec![Op::Add(4.0, 5)],
        ],
    );
}

#[test]
fn loom_a_full_window_closes_before_a_later_one_opens() {
    model(
        SUM_COUNT,
        2,
        vec![
            vec![Op::Add(1.0, 5), Op::Add(2.0, 5)],
            vec![Op::Add(4.0, 15), Op::Get],
        ],
    );
}

#[test]
fn loom_add_many_races_add() {
    model(
        SUM_COUNT,
        3,
        vec![
            vec![Op::AddMany(vec![1.0, 2.0], 5), Op::Get],
            vec![Op::Add(4.0, 5), Op::Add(8.0, 15)],
            vec![Op::AddMany(vec![16.0, 32.0], 15)],
        ],
    );
}

#[test]
fn loom_flush_races_add() {
    model(
        SUM_COUNT,
        i64::MAX,
        vec![
            vec![Op::Flush, Op::Get],
            vec![Op::Add(1.0, 5), Op::Add(2.0, 5)],
        ],
    );
}

#[test]
fn loom_three_writers_fill_and_cross_windows() {
    model_bounded(
        SUM_COUNT,
        2,
        vec![
            vec![Op::Add(1.0, 5), Op::Add(2.0, 15)],
            vec![Op::Add(4.0, 5), Op::Add(8.0, 15)],
            vec![Op::Add(16.0, 5), Op::Get],
        ],
        2,
    );
}

#[test]
fn loom_flush_races_writers_and_a_boundary() {
    model(
        SUM_COUNT,
        i64::MAX,
        vec![
            vec![Op::Flush, Op::Get],
            vec![Op::Add(1.0, 5), Op::Add(2.0, 15)],
            vec![Op::Add(4.0, 5)],
        ],
    );
}

#[test]
fn loom_stddev_first_sample_races_across_a_boundary() {
    // The shift K is set by whichever first sample lands (a CAS from
    // EMPTY); the close resets it for the next window.
    model(
        WITH_SPREAD,
        i64::MAX,
        vec![
            vec![Op::Add(1.0, 5), Op::Add(4.0, 15)],
            vec![Op::Add(2.0, 5), Op::Add(8.0, 15)],
        ],
    );
}

#[test]
fn loom_histogram_a_close_races_a_writer() {
    // A close reads every octave slot (hundreds of loom branch points), so
    // this model is kept to two adds and one boundary.
    model_bounded(
        WITH_HISTOGRAM,
        i64::MAX,
        vec![
            vec![Op::Add(1.0, 5), Op::Add(4.0, 15)],
            vec![Op::Add(2.0, 5)],
        ],
        2,
    );
}

#[test]
fn loom_histogram_racing_installs_of_one_block() {
    use crate::histogram::Histogram;
    let mut builder = loom::model::Builder::new();
    builder.max_branches = 100_000;
    builder.check(|| {
        let histogram = Arc::new(Histogram::new());
        let other = Arc::clone(&histogram);
        // 1.5 and 1.75 are in octave 0: both writers find its block
        // missing, one install wins, the other frees its own.
        let writer = loom::thread::spawn(move || other.record::<false>(1.5));
        histogram.record::<false>(1.75);
        writer.join().unwrap();
        let buckets = histogram.take();
        assert_eq!(buckets.positive.iter().map(|b| b.1).sum::<u64>(), 2);
        let one = Histogram::new();
        one.record::<false>(1.5);
        assert_eq!(histogram.allocated_bytes(), one.allocated_bytes());
    });
}
