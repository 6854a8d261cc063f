use super::accumulators::EMPTY_BITS;
use super::*;
use Aggregation::*;

const ALL: [Aggregation; 6] = [Value, Mean, Count, Sum, Max, Min];
const TWELVE: [Aggregation; 12] = [
    Value, Mean, Count, Sum, Max, Min, Stddev, P50, P90, P95, P99, P999,
];
const HOUR: i64 = 3_600_000;

fn windows(closed: Closed) -> Vec<WindowStats> {
    closed.iter().cloned().collect()
}

#[test]
fn max_samples_closes_at_once_and_drops_the_rest() {
    let s = Stat::new(&ALL, HOUR, 3);
    assert!(windows(s.add_at(1.0, 10)).is_empty());
    assert!(windows(s.add_at(2.0, 10)).is_empty());
    let closed = windows(s.add_at(4.0, 10));
    assert_eq!(closed.len(), 1);
    assert_eq!(closed[0].count, 3);
    assert_eq!(closed[0].sum, 7.0);
    assert_eq!(closed[0].last, 4.0);
    assert_eq!(s.count(), 0);
    assert!(windows(s.add_at(100.0, 11)).is_empty());
    assert_eq!(s.count(), 0);
    assert_eq!(s.last_closed().sum, 7.0);
}

#[test]
fn later_window_after_a_full_one_reports_zeros() {
    let s = Stat::new(&ALL, 10, 1);
    assert_eq!(windows(s.add_at(5.0, 0)).len(), 1);
    // Window 2 opens: the empty remainder of window 1 closes (no event),
    // then this sample fills window 2 at once.
    let closed = windows(s.add_at(6.0, 10));
    assert_eq!(closed.len(), 1);
    assert_eq!(closed[0].sum, 6.0);
}

#[test]
fn idle_windows_are_never_closed() {
    let s = Stat::new(&[Sum, Count], 10, i64::MAX);
    assert!(windows(s.add_at(1.0, 0)).is_empty());
    let closed = windows(s.add_at(2.0, 55));
    assert_eq!(closed.len(), 1);
    assert_eq!(closed[0].sum, 1.0);
    assert_eq!(s.last_closed().sum, 1.0);
    assert_eq!(s.count(), 1);
}

#[test]
fn first_add_of_a_later_window_after_max_close_gives_zeros() {
    let s = Stat::new(&[Sum, Count], 10, 2);
    s.add_at(1.0, 0);
    assert_eq!(windows(s.add_at(2.0, 0)).len(), 1);
    assert!(windows(s.add_at(3.0, 20)).is_empty());
    assert_eq!(s.last_closed(), WindowStats::EMPTY);
    assert_eq!(s.count(), 1);
}

#[test]
fn ieee_rules_for_min_max_and_sum() {
    let s = Stat::new(&ALL, HOUR, 3);
    s.add_at(-0.0, 0);
    s.add_at(0.0, 0);
    let w = windows(s.add_at(-0.0, 0))[0].clone();
    assert!(w.min.is_sign_negative() && w.max.is_sign_negative());
    assert!(w.sum.is_sign_positive());

    let s = Stat::new(&ALL, HOUR, 2);
    s.add_at(f64::NAN, 0);
    let w = windows(s.add_at(1.0, 0))[0].clone();
    assert!(w.min.is_nan() && w.max.is_nan() && w.sum.is_nan());

    let s = Stat::new(&ALL, HOUR, 2);
    s.add_at(1.0, 0);
    let w = windows(s.add_at(f64::NAN, 0))[0].clone();
    assert_eq!((w.min, w.max), (1.0, 1.0));
    assert!(w.sum.is_nan() && w.last.is_nan());
}

#[test]
fn the_placeholder_nan_is_still_a_nan_sample() {
    let s = Stat::new(&[Min, Max], HOUR, 1);
    let w = windows(s.add_at(f64::from_bits(EMPTY_BITS), 0))[0].clone();
    assert!(w.min.is_nan() && w.max.is_nan());
}

#[test]
fn flush_emits_the_open_window_once() {
    let s = Stat::new(&[Sum], HOUR, i64::MAX);
    s.add_at(1.5, 0);
    s.add_at(2.5, 0);
    assert_eq!(s.flush().map(|w| w.sum), Some(4.0));
    assert_eq!(s.flush(), None);
    s.add_at(1.0, 0);
    assert_eq!(s.flush().map(|w| w.count), Some(1));
}

#[test]
fn max_samples_below_one_behaves_like_one() {
    for max in [0, -5, i64::MIN] {
        let s = Stat::new(&[Count], HOUR, max);
        assert_eq!(windows(s.add_at(1.0, 0)).len(), 1);
        assert!(windows(s.add_at(1.0, 0)).is_empty());
    }
}

#[test]
fn windows_close_up_to_the_last_millisecond_of_the_clock() {
    for window_ms in [1, 2, 7, 1000, i64::MAX] {
        let s = Stat::new(&[Sum, Count], window_ms, i64::MAX);
        // A fresh Stat's first add, then one add per millisecond.
        let start = i64::MAX - 3;
        let mut closed_sums = Vec::new();
        for (i, now) in (start..=i64::MAX).enumerate() {
            closed_sums.extend(windows(s.add_at(i as f64, now)).iter().map(|w| w.sum));
        }
        let ids: Vec<i64> = (start..=i64::MAX).map(|t| t / window_ms).collect();
        let expected_closes = ids.windows(2).filter(|p| p[0] != p[1]).count();
        assert_eq!(closed_sums.len(), expected_closes, "window {window_ms} ms");
        let last = ids[ids.len() - 1];
        let open = ids.iter().filter(|&&id| id == last).count();
        assert_eq!(s.count() as usize, open, "window {window_ms} ms");
    }
    // 1 ms windows: each add closes the one before.
    let s = Stat::new(&[Sum], 1, i64::MAX);
    assert!(windows(s.add_at(1.0, i64::MAX - 1)).is_empty());
    let closed = windows(s.add_at(2.0, i64::MAX));
    assert_eq!(closed.iter().map(|w| w.sum).collect::<Vec<_>>(), [1.0]);
    assert_eq!(s.flush().map(|w| w.sum), Some(2.0));
}

#[test]
fn a_clock_that_goes_back_counts_in_the_open_window() {
    let s = Stat::new(&[Sum, Count], 10, i64::MAX);
    s.add_at(1.0, 100);
    assert!(windows(s.add_at(2.0, 5)).is_empty());
    assert_eq!(s.count(), 2);
}

#[test]
fn a_full_window_closed_by_a_later_add_leaves_get_zeros() {
    // The interleaving loom found, replayed on one thread: an add fills
    // window 1 lock-free, and before it takes the lock (docs/internals.md, window algorithm
    // step 4) an
    // add in window 2 takes it.
    let s = Stat::new(&[Sum, Count], 10, 2);
    assert!(windows(s.add_at(1.0, 5)).is_empty());
    let window = s.window_of(5);
    assert!(matches!(s.try_add_lock_free(2.0, window), Fast::Filled));
    let closed = windows(s.add_at(4.0, 15));
    assert_eq!(closed.len(), 1);
    assert_eq!((closed[0].count, closed[0].sum), (2, 3.0));
    // As after the two adds in either order: window 1's empty remainder
    // was closed last, so `get` reports zeros.
    assert_eq!(s.last_closed(), WindowStats::EMPTY);
    assert!(windows(s.add_locked(None, window)).is_empty());
    assert_eq!(s.last_closed(), WindowStats::EMPTY);
    assert_eq!(s.count(), 1);
    assert_eq!(s.flush().map(|w| w.sum), Some(4.0));
}

#[test]
fn threads_lose_and_double_count_nothing_across_boundaries() {
    use std::sync::Arc;
    use std::sync::atomic::AtomicI64 as Clock;
    const THREADS: usize = 4;
    const ADDS: usize = 50_000;
    for max_samples in [i64::MAX, 7] {
        let stat = Stat::new(&[Sum, Count], 3, max_samples);
        let clock = Arc::new(Clock::new(0));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let stat = Arc::clone(&stat);
                let clock = Arc::clone(&clock);
                std::thread::spawn(move || {
                    let mut windows = Vec::new();
                    for i in 0..ADDS {
                        if t == 0 && i % 97 == 0 {
                            clock.fetch_add(1, Ordering::Relaxed);
                        }
                        let now = clock.load(Ordering::Relaxed);
                        windows.extend(stat.add_at(1.0, now).iter().cloned());
                    }
                    windows
                })
            })
            .collect();
        let emitted: Vec<WindowStats> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        let final_window = stat.flush();
        let total: u64 = emitted
            .iter()
            .chain(final_window.iter())
            .map(|w| w.count)
            .sum();
        for w in &emitted {
            assert_eq!(w.sum, w.count as f64, "sum and count agree per window");
            assert!(w.count <= stat.max_samples);
        }
        if max_samples == i64::MAX {
            assert_eq!(total, (THREADS * ADDS) as u64);
        } else {
            assert!(
                total < (THREADS * ADDS) as u64,
                "some samples must be dropped"
            );
        }
    }
}

/// A small deterministic generator, so the equivalence tests need no crate.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn sample(&mut self) -> f64 {
        match self.next() % 12 {
            0 => f64::NAN,
            1 => -0.0,
            2 => 0.0,
            3 => f64::INFINITY,
            4 => f64::NEG_INFINITY,
            5 => 1e308,
            6 => f64::MIN_POSITIVE / 4.0,
            _ => (self.next() % 2001) as f64 / 8.0 - 125.0,
        }
    }
}

fn same(a: &WindowStats, b: &WindowStats) -> bool {
    let eq = |x: f64, y: f64| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan());
    a.count == b.count
        && eq(a.sum, b.sum)
        && eq(a.min, b.min)
        && eq(a.max, b.max)
        && eq(a.last, b.last)
        && eq(a.stddev, b.stddev)
        && a.quantiles
            .iter()
            .zip(&b.quantiles)
            .all(|(x, y)| eq(*x, *y))
        && a.distribution.as_ref().map(|d| &d.buckets)
            == b.distribution.as_ref().map(|d| &d.buckets)
}

fn assert_same_stats(a: &Stat, b: &Stat, context: &str) {
    assert_eq!(a.count(), b.count(), "{context}: open count");
    let (pa, pb) = (a.last_closed(), b.last_closed());
    assert!(same(&pa, &pb), "{context}: last closed {pa:?} vs {pb:?}");
    assert_eq!(
        a.cur_id.load(Ordering::Relaxed),
        b.cur_id.load(Ordering::Relaxed),
        "{context}: window"
    );
}

#[test]
fn add_many_is_the_loop_of_add_at() {
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    for round in 0..2000 {
        let max_samples = [1, 2, 3, 5, 17, i64::MAX][(rng.next() % 6) as usize];
        let window_ms = [1, 10, HOUR][(rng.next() % 3) as usize];
        let aggregations: &[Aggregation] = if round % 2 == 0 { &ALL } else { &TWELVE };
        let batched = Stat::new(aggregations, window_ms, max_samples);
        let looped = Stat::new(aggregations, window_ms, max_samples);
        let mut now = 0;
        for step in 0..8 {
            now += [0, 1, 5, 10, 25][(rng.next() % 5) as usize];
            let values: Vec<f64> = (0..rng.next() % 9).map(|_| rng.sample()).collect();
            let from_batch = windows(batched.add_many_at(values.len(), |i| values[i], now));
            let from_loop: Vec<WindowStats> = values
                .iter()
                .flat_map(|&v| windows(looped.add_at(v, now)))
                .collect();
            let context = format!("round {round} step {step} {values:?} at {now}");
            assert_eq!(from_batch.len(), from_loop.len(), "{context}: events");
            for (a, b) in from_batch.iter().zip(&from_loop) {
                assert!(same(a, b), "{context}: {a:?} vs {b:?}");
            }
            assert_same_stats(&batched, &looped, &context);
        }
        let (a, b) = (batched.flush(), looped.flush());
        assert_eq!(a.is_some(), b.is_some(), "round {round}: flush");
        if let (Some(a), Some(b)) = (a, b) {
            assert!(same(&a, &b), "round {round}: flush {a:?} vs {b:?}");
        }
    }
}

#[test]
fn serialized_add_is_the_lock_free_add() {
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    for round in 0..2000 {
        let max_samples = [1, 2, 3, 7, i64::MAX][(rng.next() % 5) as usize];
        let aggregations: Vec<Aggregation> = TWELVE
            .iter()
            .copied()
            .filter(|_| rng.next().is_multiple_of(2))
            .collect();
        let serialized = Stat::new(&aggregations, 10, max_samples);
        let lock_free = Stat::new(&aggregations, 10, max_samples);
        let mut now = 0;
        for step in 0..40 {
            now += [0, 0, 0, 3, 10, 30][(rng.next() % 6) as usize];
            let v = rng.sample();
            let a = windows(serialized.add_at_serialized(v, now));
            let b = windows(lock_free.add_at(v, now));
            let context = format!("round {round} step {step} {v} at {now}");
            assert_eq!(a.len(), b.len(), "{context}: events");
            for (x, y) in a.iter().zip(&b) {
                assert!(same(x, y), "{context}: {x:?} vs {y:?}");
            }
            assert_same_stats(&serialized, &lock_free, &context);
        }
    }
}

/// Counts the heap allocations made by the current thread, so tests that
/// run in parallel do not disturb each other's figures.
struct CountingAllocator;

thread_local! {
    static ALLOCATIONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

// SAFETY: every method forwards to the system allocator with the caller's
// own arguments, so it upholds `GlobalAlloc`'s contract exactly as
// `System` does; the counter is a const-initialised thread-local `Cell`
// without a destructor, which neither allocates nor unwinds.
unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: forwarded with the caller's layout (see the impl).
        unsafe { std::alloc::System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: `ptr` came from `System` with `layout`; forwarded as is.
        unsafe { std::alloc::System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static COUNTING: CountingAllocator = CountingAllocator;

fn allocations() -> u64 {
    ALLOCATIONS.with(|n| n.get())
}

#[test]
fn add_never_allocates() {
    let unbounded = Stat::new(&ALL, 10, i64::MAX);
    let bounded = Stat::new(&ALL, 10, 3);
    let batch = [1.0, 2.0, f64::NAN, -0.0, 5.0];
    let before = allocations();
    for i in 0..100_000i64 {
        let now = i / 7; // windows close every 70 adds
        let v = (i % 13) as f64;
        black_box_closed(unbounded.add_at(v, now));
        black_box_closed(bounded.add_at(v, now));
        black_box_closed(unbounded.add_at_serialized(v, now));
        black_box_closed(bounded.add_at_serialized(v, now));
        if i % 100 == 0 {
            black_box_closed(bounded.add_many_at(batch.len(), |i| batch[i], now));
            std::hint::black_box(unbounded.last_closed());
            std::hint::black_box(unbounded.count());
        }
    }
    std::hint::black_box(unbounded.flush());
    let made = allocations() - before;
    assert_eq!(made, 0, "{made} heap allocations in 400,000 adds");
    // The counter itself works: a Vec allocates once.
    let before = allocations();
    std::hint::black_box(vec![1u8; 16]);
    assert_eq!(allocations() - before, 1);
}

fn black_box_closed(closed: Closed) {
    std::hint::black_box(closed.iter().count());
}

#[test]
fn adds_with_histograms_allocate_nothing_once_their_octaves_exist() {
    let stat = Stat::new(&TWELVE, HOUR, i64::MAX);
    let values: Vec<f64> = (0..600).map(|i| 1e-3 * 1.0233f64.powi(i) - 2.0).collect();
    // Both buffers see every octave once (a window closes in between).
    for now in [0, HOUR] {
        for &v in &values {
            black_box_closed(stat.add_at(v, now));
            black_box_closed(stat.add_at(-v, now));
        }
    }
    // This one closes a window (the close allocates the Distribution).
    black_box_closed(stat.add_at(1.0, 2 * HOUR));
    let before = allocations();
    for round in 0..100 {
        for &v in &values {
            black_box_closed(stat.add_at(v, 2 * HOUR));
            black_box_closed(stat.add_at_serialized(-v, 2 * HOUR));
        }
        std::hint::black_box(round);
    }
    assert_eq!(allocations() - before, 0);
}

#[test]
fn a_stat_of_torch_aggregations_keeps_no_extension_state() {
    let stat = Stat::new(&ALL, HOUR, i64::MAX);
    stat.add_at(1.0, 0);
    assert_eq!(stat.extension_bytes(), 0);
    assert_eq!(
        stat.add_at(2.0, HOUR).iter().next().unwrap().distribution,
        None
    );
    let stddev_only = Stat::new(&[Stddev], HOUR, i64::MAX);
    stddev_only.add_at(1.0, 0);
    let window = stddev_only.add_at(2.0, HOUR).iter().next().unwrap().clone();
    assert_eq!(window.distribution, None);
}

/// Memory per Stat for samples spanning six decades, both window buffers
/// (the figure docs/performance.md reports).
#[test]
fn six_decades_fit_in_32_kib() {
    let stat = Stat::new(&TWELVE, 10, i64::MAX);
    let base = stat.extension_bytes();
    let mut now = 0;
    for window in 0..4 {
        for i in 0..=6000 {
            stat.add_at(1e-3 * 10f64.powf(i as f64 / 1000.0), now);
        }
        now += 10;
        let bytes = stat.extension_bytes();
        eprintln!("window {window}: {bytes} bytes of extension state (empty Stat: {base})");
        assert!(bytes <= 32 * 1024, "{bytes} bytes");
    }
}

#[test]
fn stddev_is_the_population_one_from_shifted_sums() {
    let stat = Stat::new(&[Stddev, Count], HOUR, i64::MAX);
    for v in [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0] {
        stat.add_at(v, 0);
    }
    let w = windows(stat.add_at(0.0, HOUR))[0].clone();
    assert_eq!(w.get(Stddev), 2.0);
    // Large offset, unit spread: the unshifted formula would give 0 or noise.
    let stat = Stat::new(&[Stddev], HOUR, i64::MAX);
    let mut rng = XorShift(7);
    let n = 10_000;
    let noise: Vec<f64> = (0..n)
        .map(|_| (rng.next() % 2001) as f64 / 1000.0 - 1.0)
        .collect();
    for &d in &noise {
        stat.add_at(1e9 + d, 0);
    }
    let mean = noise.iter().sum::<f64>() / n as f64;
    let exact = (noise.iter().map(|d| (d - mean) * (d - mean)).sum::<f64>() / n as f64).sqrt();
    let got = windows(stat.add_at(0.0, HOUR))[0].stddev;
    assert!((got - exact).abs() < 1e-6 * exact, "{got} vs {exact}");
    // One sample: 0; NaN or an infinity: NaN; empty: 0.
    let stat = Stat::new(&[Stddev], HOUR, i64::MAX);
    stat.add_at(3.0, 0);
    assert_eq!(windows(stat.add_at(f64::INFINITY, HOUR))[0].stddev, 0.0);
    stat.add_at(1.0, HOUR);
    assert!(windows(stat.add_at(f64::NAN, 2 * HOUR))[0].stddev.is_nan());
    assert!(windows(stat.add_at(1.0, 3 * HOUR))[0].stddev.is_nan());
    assert_eq!(WindowStats::EMPTY.get(Stddev), 0.0);
    // Deviations whose S1 squared overflows while S2 does not: the exact
    // value, 8e153 * sqrt(2) / 3, not 0.
    let stat = Stat::new(&[Stddev], HOUR, i64::MAX);
    for v in [0.0, 8e153, 8e153] {
        stat.add_at(v, 0);
    }
    let got = windows(stat.add_at(0.0, HOUR))[0].stddev;
    let exact = 8e153 * 2f64.sqrt() / 3.0;
    assert!((got - exact).abs() <= exact * 1e-12, "{got:e}");
}

#[test]
fn quantiles_are_computed_at_close_from_the_accepted_samples() {
    // max_samples 100: the 100 accepted samples are 1..=100, the rest dropped.
    let stat = Stat::new(&TWELVE, HOUR, 100);
    let mut closed = Vec::new();
    for v in 1..=150 {
        closed.extend(windows(stat.add_at(f64::from(v) * 1000.0, 0)));
    }
    assert_eq!(closed.len(), 1);
    let w = &closed[0];
    let d = w.distribution.as_ref().unwrap();
    assert_eq!(d.count, 100);
    assert_eq!(d.buckets.positive.iter().map(|b| b.1).sum::<u64>(), 100);
    assert_eq!((d.min, d.max, d.sum), (1000.0, 100_000.0, 5_050_000.0));
    for (aggregation, exact) in [
        (P50, 50e3),
        (P90, 90e3),
        (P95, 95e3),
        (P99, 99e3),
        (P999, 100e3),
    ] {
        let got = w.get(aggregation);
        assert!(
            (got - exact).abs() <= exact * 0.0055,
            "{aggregation:?}: {got}"
        );
    }
    assert_eq!(w.get(P999), 100_000.0, "rank n is the exact max");
    assert_eq!(stat.last_closed().get(P90), w.get(P90));
    // Only NaN: NaN; an empty window: 0.
    let stat = Stat::new(&[P50], HOUR, i64::MAX);
    stat.add_at(f64::NAN, 0);
    assert!(windows(stat.add_at(1.0, HOUR))[0].get(P50).is_nan());
    assert_eq!(WindowStats::EMPTY.get(P99), 0.0);
}

/// docs/reliability.md, "fork": a forked child's Stat starts with an empty
/// window; what it adds is emitted once, without the parent's samples.
#[test]
fn reset_after_fork_empties_the_open_window_and_keeps_it_usable() {
    let s = Stat::new(&TWELVE, HOUR, i64::MAX);
    for _ in 0..500 {
        s.add_at(2.0, 10);
    }
    assert!(s.reset_after_fork());
    assert_eq!(s.count(), 0);
    assert!(
        s.flush().is_none(),
        "the parent's samples were emitted again"
    );
    s.add_at(7.0, 11);
    s.add_at(9.0, 12);
    let closed = windows(s.add_at(1.0, HOUR + 1));
    assert_eq!(closed.len(), 1);
    let w = &closed[0];
    assert_eq!(
        (w.count, w.sum, w.min, w.max, w.last),
        (2, 16.0, 7.0, 9.0, 9.0)
    );
    assert_eq!(w.distribution.as_ref().map(|d| d.count), Some(2));
}

#[test]
fn reset_after_fork_keeps_the_last_closed_window_for_get() {
    let s = Stat::new(&ALL, 10, i64::MAX);
    s.add_at(3.0, 0);
    s.add_at(4.0, 10); // closes window 0 (sum 3)
    assert!(s.reset_after_fork());
    assert_eq!(s.last_closed().sum, 3.0);
    assert!(!s.reset_after_fork(), "nothing left to discard");
}

#[test]
fn a_window_the_parent_filled_accepts_the_childs_samples() {
    let s = Stat::new(&ALL, HOUR, 2);
    s.add_at(1.0, 5);
    assert_eq!(windows(s.add_at(1.0, 5)).len(), 1); // full: the rest is dropped
    s.add_at(1.0, 5);
    assert_eq!(s.count(), 0);
    s.reset_after_fork();
    s.add_at(5.0, 6);
    assert_eq!(s.count(), 1);
    let closed = windows(s.add_at(6.0, 6));
    assert_eq!(closed.len(), 1);
    assert_eq!((closed[0].count, closed[0].sum), (2, 11.0));
}

#[test]
fn a_writer_stranded_by_the_fork_does_not_block_the_childs_closes() {
    let s = Stat::new(&ALL, 10, i64::MAX);
    s.add_at(1.0, 0);
    // A parent thread claimed a slot and was copied into the child before it
    // finished it: a close would wait for it for ever.
    s.head.fetch_add(1, Ordering::AcqRel);
    s.reset_after_fork();
    s.add_at(2.0, 1);
    let closed = windows(s.add_at(3.0, 10));
    assert_eq!(closed.len(), 1);
    assert_eq!((closed[0].count, closed[0].sum), (1, 2.0));
}

#[test]
fn a_refused_sample_is_worded_by_its_reason() {
    let message = |reason: NotASample| reason.message("Stat.add(v): v", "str");
    assert_eq!(
        message(NotASample::NotANumber),
        "Stat.add(v): v must be a real number (float, int, bool or an object with __float__), not str"
    );
    assert_eq!(
        message(NotASample::IntTooLarge),
        "Stat.add(v): v must be a real number, not an int too large to convert to float"
    );
    assert_eq!(
        message(NotASample::Complex),
        "Stat.add(v): v must be a real number, not a complex number (str)"
    );
}
