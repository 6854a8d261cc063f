//! Native threads hammering one `Stat` (the loom models in src/stat/loom.rs
//! prove small cases exhaustively; this runs many windows at full speed).
//! Every test does a fixed amount of work: a few hundred thousand adds.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use torchmon_core::aggregation::Aggregation::{Count, Max, Min, Sum, Value};
use torchmon_core::stat::{Stat, WindowStats};

const THREADS: u64 = 4;

/// Runs `body(thread, stat)` on `THREADS` threads and returns every window
/// their adds emitted.
fn hammer(
    stat: &Arc<Stat>,
    body: impl Fn(u64, &Stat, &mut Vec<WindowStats>) + Send + Sync + 'static,
) -> Vec<WindowStats> {
    // A bug in the close's wait for writers hangs rather than fails: end
    // the test binary instead (the work takes well under a second).
    let (done, finished) = mpsc::channel::<()>();
    thread::spawn(move || {
        if let Err(RecvTimeoutError::Timeout) = finished.recv_timeout(Duration::from_secs(60)) {
            eprintln!("stress threads still running after 60 s: hung");
            std::process::abort();
        }
    });
    let body = Arc::new(body);
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let stat = Arc::clone(stat);
            let body = Arc::clone(&body);
            thread::spawn(move || {
                let mut emitted = Vec::new();
                body(t, &stat, &mut emitted);
                emitted
            })
        })
        .collect();
    let emitted = handles
        .into_iter()
        .flat_map(|h| h.join().expect("a stress thread panicked"))
        .collect();
    drop(done);
    emitted
}

#[test]
fn rolling_windows_lose_and_double_count_nothing() {
    const ADDS: u64 = 60_000; // a multiple of 4, for thread 3's batches
    let stat = Stat::new(&[Sum, Count, Min, Max, Value], 3, i64::MAX);
    // Thread 0 moves the clock on; the others read it, so adds race every
    // boundary, and some read a time that a close has already left behind.
    let clock = Arc::new(AtomicI64::new(0));
    let shared = Arc::clone(&clock);
    let emitted = hammer(&stat, move |t, stat, emitted| {
        for i in 0..ADDS {
            if t == 0 && i % 50 == 0 {
                shared.fetch_add(1, Ordering::Relaxed);
            }
            let now = shared.load(Ordering::Relaxed);
            // Distinct integers (exact in f64): a sample lost and another
            // counted twice cannot cancel out in both count and sum.
            let v = (t * ADDS + i + 1) as f64;
            // Thread 3 adds its samples i, i + 1 and i + 2 as one batch.
            let closed = match (t, i % 4) {
                (3, 0) => stat.add_many_at(3, |k| v + k as f64, now),
                (3, 1 | 2) => continue,
                _ => stat.add_at(v, now),
            };
            emitted.extend(closed.iter().cloned());
        }
    });
    let all: Vec<WindowStats> = emitted.iter().cloned().chain(stat.flush()).collect();
    let adds = THREADS * ADDS;
    assert_eq!(all.iter().map(|w| w.count).sum::<u64>(), adds);
    let total: f64 = all.iter().map(|w| w.sum).sum();
    assert_eq!(total, (adds * (adds + 1) / 2) as f64);
    let windows = clock.load(Ordering::Relaxed) / 3 + 1;
    assert!(all.len() as i64 <= windows + 1, "{} windows", all.len());
    for w in &all {
        assert!(w.count > 0);
        // Not torn: the extremes and the last value are samples of a window
        // whose sum is at least theirs.
        assert!(w.min <= w.last && w.last <= w.max, "{w:?}");
        assert!(w.min >= 1.0 && w.max <= adds as f64, "{w:?}");
        assert!(w.sum >= w.max + (w.count - 1) as f64 * 1.0, "{w:?}");
        assert!(w.sum <= w.count as f64 * w.max, "{w:?}");
    }
}

#[test]
fn max_samples_keeps_exactly_that_many_per_window() {
    const ROUNDS: i64 = 200;
    const ADDS_PER_ROUND: u64 = 300;
    const MAX: u64 = 37;
    let stat = Stat::new(&[Sum, Count], 10, MAX as i64);
    let barrier = Arc::new(Barrier::new(THREADS as usize));
    let emitted = hammer(&stat, move |t, stat, emitted| {
        for round in 0..ROUNDS {
            // Every thread adds in the same window, far more than fits; the
            // barrier keeps rounds apart so each window's fate is exact.
            let now = round * 10 + 5;
            for i in 0..ADDS_PER_ROUND {
                let closed = if t == 3 && i % 10 == 0 {
                    stat.add_many_at(4, |_| 1.0, now)
                } else {
                    stat.add_at(1.0, now)
                };
                emitted.extend(closed.iter().cloned());
            }
            barrier.wait();
        }
    });
    assert_eq!(emitted.len() as i64, ROUNDS, "one window per round");
    for w in &emitted {
        assert_eq!((w.count, w.sum), (MAX, MAX as f64), "{w:?}");
    }
    // The last window closed by max_samples: the rest of it was dropped.
    assert_eq!(stat.count(), 0);
    assert_eq!(stat.flush(), None);
    assert_eq!(stat.last_closed().count, MAX);
}

#[test]
fn concurrent_readers_never_see_a_torn_window() {
    const ADDS: u64 = 40_000;
    let stat = Stat::new(&[Sum, Count, Max], 2, 64);
    let clock = Arc::new(AtomicI64::new(0));
    let shared = Arc::clone(&clock);
    let emitted = hammer(&stat, move |t, stat, emitted| {
        for i in 0..ADDS {
            if t == 0 {
                // A reader (the binding's `get`) and the clock.
                if i % 40 == 0 {
                    shared.fetch_add(1, Ordering::Relaxed);
                }
                let w = stat.last_closed();
                assert!(w.count <= 64, "{w:?}");
                assert_eq!(w.sum, 2.0 * w.count as f64, "torn {w:?}");
                assert!(w.count == 0 || w.max == 2.0, "torn {w:?}");
            } else {
                let now = shared.load(Ordering::Relaxed);
                emitted.extend(stat.add_at(2.0, now).iter().cloned());
            }
        }
    });
    assert!(!emitted.is_empty());
    for w in &emitted {
        assert!(w.count >= 1 && w.count <= 64, "{w:?}");
        assert_eq!(w.sum, 2.0 * w.count as f64, "{w:?}");
    }
}

#[test]
fn histograms_and_shifted_sums_lose_and_double_count_nothing() {
    use torchmon_core::aggregation::Aggregation::{P50, P999, Stddev};
    use torchmon_core::histogram::bucket_index;
    const ADDS: u64 = 40_000;
    let stat = Stat::new(&[Sum, Count, Min, Max, Stddev, P50, P999], 3, 500);
    let clock = Arc::new(AtomicI64::new(0));
    let shared = Arc::clone(&clock);
    // Every thread adds the same cycle of 97 values over many octaves, both
    // signs, zero and the infinities; writers race the first sample of an
    // octave (block installs), closes and max_samples.
    let value = |i: u64| match i % 97 {
        0 => 0.0,
        1 => f64::INFINITY,
        k if k % 2 == 0 => -(k as f64) * 1e-3,
        k => 1.7f64.powi(k as i32 - 50),
    };
    let emitted = hammer(&stat, move |t, stat, emitted| {
        for i in 0..ADDS {
            if t == 0 && i % 300 == 0 {
                shared.fetch_add(1, Ordering::Relaxed);
            }
            let now = shared.load(Ordering::Relaxed);
            let closed = if t == 3 && i % 8 == 0 {
                stat.add_many_at(2, |k| value(i + k as u64), now)
            } else {
                stat.add_at(value(i), now)
            };
            emitted.extend(closed.iter().cloned());
        }
    });
    let all: Vec<WindowStats> = emitted.into_iter().chain(stat.flush()).collect();
    assert!(all.len() > 10, "{} windows", all.len());
    for w in &all {
        let d = w
            .distribution
            .as_ref()
            .expect("a P aggregation keeps the histogram");
        let b = &d.buckets;
        let positive: u64 = b.positive.iter().map(|x| x.1).sum();
        let negative: u64 = b.negative.iter().map(|x| x.1).sum();
        let total = positive + negative + b.zero_count + b.positive_inf_count;
        assert_eq!(total, w.count, "the histogram counts the window's samples");
        assert_eq!((b.nan_count, b.negative_inf_count), (0, 0));
        assert_eq!(d.count, w.count);
        // Every bucket is one the samples could land in.
        for &(index, _) in &b.positive {
            assert!((0..97).any(|k| {
                let v = value(k);
                v > 0.0 && v.is_finite() && bucket_index(v.to_bits()) == index
            }));
        }
        // An infinity in the window makes STDDEV NaN; else it is finite.
        assert_eq!(w.stddev.is_nan(), b.positive_inf_count > 0, "{w:?}");
        assert!(w.min <= w.get(P50) && w.get(P50) <= w.max, "{w:?}");
    }
}
