//! `Stat::add` on its own, against the same accumulator behind a `Mutex`,
//! single-threaded and with two threads on one Stat; and the clocks it reads.
//!
//! Run: `cargo bench --bench stat_add` (the README's development section says
//! how the numbers are reported in docs/performance.md).

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use parking_lot::Mutex;
use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use torchmon_core::aggregation::Aggregation;
use torchmon_core::clock;
use torchmon_core::stat::Stat;

const ALL: [Aggregation; 5] = [
    Aggregation::Mean,
    Aggregation::Count,
    Aggregation::Sum,
    Aggregation::Max,
    Aggregation::Min,
];
/// Every aggregation: the torch ones, STDDEV and the five quantiles.
const TWELVE: [Aggregation; 12] = [
    Aggregation::Value,
    Aggregation::Mean,
    Aggregation::Count,
    Aggregation::Sum,
    Aggregation::Max,
    Aggregation::Min,
    Aggregation::Stddev,
    Aggregation::P50,
    Aggregation::P90,
    Aggregation::P95,
    Aggregation::P99,
    Aggregation::P999,
];
const HOUR_MS: i64 = 3_600_000;
/// `add_at` benches read no clock: they all add inside this window.
const FIXED_NOW_MS: i64 = HOUR_MS / 2;

/// The same window accumulator as `Stat`, guarded by one lock: the design the
/// lock-free fast path is measured against.
struct MutexStat {
    window_ms: i64,
    inner: Mutex<Window>,
}

#[derive(Default)]
struct Window {
    id: i64,
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
    closed: u64,
}

impl MutexStat {
    fn new(window_ms: i64) -> Self {
        MutexStat {
            window_ms,
            inner: Mutex::new(Window::default()),
        }
    }

    fn add_at(&self, v: f64, now_ms: i64) {
        let id = now_ms.div_euclid(self.window_ms) + 1;
        let mut w = self.inner.lock();
        if w.id != id {
            if w.count > 0 {
                w.closed += 1;
            }
            *w = Window {
                id,
                closed: w.closed,
                ..Window::default()
            };
        }
        if w.count == 0 || v < w.min {
            w.min = v;
        }
        if w.count == 0 || v > w.max {
            w.max = v;
        }
        w.count += 1;
        w.sum += v;
    }
}

fn clocks(c: &mut Criterion) {
    let mut g = c.benchmark_group("clock");
    g.bench_function("now_ms (no override: one relaxed load + clock)", |b| {
        b.iter(clock::now_ms)
    });
    g.bench_function("monotonic_ms (CLOCK_MONOTONIC)", |b| {
        b.iter(clock::monotonic_ms)
    });
    g.bench_function("monotonic_coarse_ms (CLOCK_MONOTONIC_COARSE)", |b| {
        b.iter(clock::monotonic_coarse_ms)
    });
    g.finish();
}

fn single_thread(c: &mut Criterion) {
    let mut g = c.benchmark_group("add, 1 thread, 5 aggregations");
    let stat = Stat::new(&ALL, HOUR_MS, i64::MAX);
    g.bench_function("Stat::add_at (lock-free)", |b| {
        b.iter(|| black_box(stat.add_at(black_box(1.5), FIXED_NOW_MS)))
    });
    let locked = MutexStat::new(HOUR_MS);
    g.bench_function("MutexStat::add_at (parking_lot Mutex)", |b| {
        b.iter(|| locked.add_at(black_box(1.5), FIXED_NOW_MS))
    });
    g.bench_function(
        "Stat::add_at_serialized (what GIL builds call: no RMW instructions)",
        |b| b.iter(|| black_box(stat.add_at_serialized(black_box(1.5), FIXED_NOW_MS))),
    );
    g.bench_function("Stat::add (with the clock read)", |b| {
        b.iter(|| black_box(stat.add(black_box(1.5))))
    });
    let small = Stat::new(&ALL, HOUR_MS, 1000);
    g.bench_function(
        "Stat::add_at, max_samples=1000 (window fills and drops)",
        |b| {
            b.iter_batched(
                || (),
                |()| black_box(small.add_at(black_box(1.5), FIXED_NOW_MS)),
                BatchSize::SmallInput,
            )
        },
    );
    g.finish();
}

/// Time for each of `threads` threads to do `iters` adds on one shared target
/// at once: the figure is per add of one thread while the others add too.
fn contended<T: Send + Sync + 'static>(
    target: Arc<T>,
    threads: usize,
    iters: u64,
    add: fn(&T, f64),
) -> Duration {
    let barrier = Arc::new(Barrier::new(threads + 1));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (target, barrier) = (Arc::clone(&target), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                let start = Instant::now();
                for i in 0..iters {
                    add(&target, black_box(i as f64));
                }
                start.elapsed()
            })
        })
        .collect();
    barrier.wait();
    workers
        .into_iter()
        .map(|w| w.join().expect("worker panicked"))
        .max()
        .unwrap_or_default()
}

fn two_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("add, 2 threads on one Stat, 5 aggregations");
    let stat = Stat::new(&ALL, HOUR_MS, i64::MAX);
    g.bench_function("Stat::add_at (lock-free)", |b| {
        b.iter_custom(|iters| {
            contended(Arc::clone(&stat), 2, iters, |s, v| {
                black_box(s.add_at(v, FIXED_NOW_MS));
            })
        })
    });
    let locked = Arc::new(MutexStat::new(HOUR_MS));
    g.bench_function("MutexStat::add_at (parking_lot Mutex)", |b| {
        b.iter_custom(|iters| {
            contended(Arc::clone(&locked), 2, iters, |s, v| {
                s.add_at(v, FIXED_NOW_MS)
            })
        })
    });
    g.finish();
}

fn twelve_aggregations(c: &mut Criterion) {
    let mut g = c.benchmark_group("add, 1 thread, 12 aggregations");
    let stat = Stat::new(&TWELVE, HOUR_MS, i64::MAX);
    // Six decades of values, cycled: every octave block exists after the
    // first round, as in a long-running window.
    let values: Vec<f64> = (0..4096)
        .map(|i| 1e-3 * 10f64.powf(6.0 * i as f64 / 4096.0))
        .collect();
    let mut next = 0usize;
    let mut value = move || {
        next = (next + 1) & 4095;
        values[next]
    };
    g.bench_function("Stat::add_at (lock-free)", |b| {
        b.iter(|| black_box(stat.add_at(black_box(value()), FIXED_NOW_MS)))
    });
    g.bench_function("Stat::add_at_serialized (GIL builds)", |b| {
        b.iter(|| black_box(stat.add_at_serialized(black_box(value()), FIXED_NOW_MS)))
    });
    let five = Stat::new(&ALL, HOUR_MS, i64::MAX);
    g.bench_function(
        "Stat::add_at_serialized, 5 aggregations, same values",
        |b| b.iter(|| black_box(five.add_at_serialized(black_box(value()), FIXED_NOW_MS))),
    );
    // The window close with a full histogram: 4096 samples over six decades
    // in both signs, then the close (snapshot, quantiles, Distribution).
    let closing = Stat::new(&TWELVE, 1, i64::MAX);
    let mut now = 0i64;
    g.bench_function("window close, 8192 samples over six decades", |b| {
        b.iter_batched(
            || {
                for _ in 0..4096 {
                    let v = value();
                    closing.add_at(v, now);
                    closing.add_at(-v, now);
                }
                now += 1;
                now
            },
            |at| black_box(closing.add_at(1.0, at)),
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(
    benches,
    clocks,
    single_thread,
    two_threads,
    twelve_aggregations
);
criterion_main!(benches);
