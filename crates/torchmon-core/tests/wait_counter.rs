//! The torch wait counters' backend (`wait_counter`) driven as libc10 drives
//! it, through the C ABI, on a test clock (docs/wait_counter_and_bridge.md,
//! "How it works"). A binary of its own: the backend's state and the clock
//! override are process-wide, so the tests here take turns.
#![cfg(not(loom))]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};
use torchmon_core::clock;
use torchmon_core::wait_counter::{
    self as wc, ClosedWindow, PROBE_KEY, QUEUE_CAPACITY, WaitCounterDynamicBackend,
};
use torchmon_core::worker::{Flow, Sink};

static TURN: Mutex<()> = Mutex::new(());
/// What the sink delivered: (Stat name, count, sum).
static DELIVERED: Mutex<Vec<(String, u64, f64)>> = Mutex::new(Vec::new());
/// Held by a test to keep the sink from finishing a window.
static GATE: Mutex<()> = Mutex::new(());
/// Windows the sink has started to deliver.
static TAKEN: AtomicUsize = AtomicUsize::new(0);
const LONG: Duration = Duration::from_secs(10);

struct Collect;

impl Sink<ClosedWindow> for Collect {
    fn handle(&mut self, items: &mut dyn Iterator<Item = ClosedWindow>) -> Flow {
        for item in items {
            TAKEN.fetch_add(1, Ordering::SeqCst);
            let _open = lock(&GATE);
            let (name, window) = (item.counter.name().to_owned(), &item.window);
            lock(&DELIVERED).push((name, window.count, window.sum));
        }
        Flow::Continue
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn turn() -> MutexGuard<'static, ()> {
    let guard = lock(&TURN);
    wc::set_deliverer(|| Box::new(Collect));
    guard
}

fn backend(key: &str) -> WaitCounterDynamicBackend {
    let mut backend = WaitCounterDynamicBackend {
        backend_self: std::ptr::null_mut(),
        start: None,
        stop: None,
        destroy: None,
    };
    // SAFETY: a writable struct of the layout, and `key.len()` readable bytes.
    unsafe { wc::init_backend(&mut backend, key.as_ptr().cast(), key.len()) };
    backend
}

/// One start/stop pair of `micros` microseconds at clock time `at_ms`.
fn pair(backend: &WaitCounterDynamicBackend, at_ms: i64, micros: i64) {
    clock::set_override_ms(Some(at_ms));
    let context = (backend.start.unwrap())(backend.backend_self, 5_000);
    (backend.stop.unwrap())(backend.backend_self, 5_000 + micros, context);
}

fn delivered(name: &str) -> Vec<(u64, f64)> {
    lock(&DELIVERED)
        .iter()
        .filter(|(n, ..)| n == name)
        .map(|&(_, count, sum)| (count, sum))
        .collect()
}

/// Waits (up to `LONG`) until `ready()`.
fn wait_for(ready: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + LONG;
    while !ready() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    ready()
}

#[test]
fn a_key_becomes_one_stat_whose_closed_windows_reach_the_sink_in_order() {
    let _turn = turn();
    wc::disable();
    assert_eq!(wc::enable(1000), Ok(()));
    let first = backend("pytorch.wait_counter.alpha");
    assert!(!first.backend_self.is_null());
    // libc10 asking again for the key gets the same counter.
    let again = backend("pytorch.wait_counter.alpha");
    assert_eq!(first.backend_self, again.backend_self);
    (again.destroy.unwrap())(again.backend_self);
    let name = "torch.wait_counter.alpha";
    assert_eq!(
        wc::counters().iter().filter(|c| c.name() == name).count(),
        1
    );
    for window in 0..4 {
        let at = 1_000_000 + window * 1000;
        for _ in 0..=window {
            pair(&first, at, 250_000);
        }
    }
    // The fourth window is still open: the caller's to flush.
    assert!(wait_for(|| delivered(name).len() == 3));
    assert_eq!(delivered(name), vec![(1, 0.25), (2, 0.5), (3, 0.75)]);
    (first.destroy.unwrap())(first.backend_self);
    assert!(wc::counters().iter().any(|c| c.name() == name));
    wc::disable();
}

#[test]
fn the_probe_and_a_recorder_turned_off_leave_the_backend_empty() {
    let _turn = turn();
    wc::disable();
    assert!(backend("pytorch.wait_counter.off").backend_self.is_null());
    assert!(!wc::probe_seen());
    assert!(backend(PROBE_KEY).backend_self.is_null());
    assert!(wc::probe_seen());
    assert!(!wc::counters().iter().any(|c| c.name().ends_with("off")));
    // Null pointers are refused, not read.
    // SAFETY: null pointers, which `init_backend` checks for.
    unsafe {
        wc::init_backend(std::ptr::null_mut(), c"k".as_ptr(), 1);
        let mut empty = backend("unused");
        wc::init_backend(&mut empty, std::ptr::null(), 3);
        assert!(empty.backend_self.is_null());
    }
}

#[test]
fn enable_keeps_the_first_window() {
    let _turn = turn();
    wc::disable();
    assert_eq!(wc::enable(250), Ok(()));
    assert_eq!(wc::enable(250), Ok(()));
    assert_eq!(wc::enable(1000), Err(250));
    wc::disable();
    assert_eq!(wc::enable(1000), Ok(()));
    wc::disable();
}

#[test]
fn a_full_queue_drops_and_counts_and_the_caller_takes_the_rest() {
    let _turn = turn();
    wc::disable();
    wc::enable(1000).unwrap();
    let name = "torch.wait_counter.beta";
    let beta = backend("beta");
    let closed_gate = lock(&GATE);
    let taken = TAKEN.load(Ordering::SeqCst);
    let start = 2_000_000;
    pair(&beta, start, 1);
    pair(&beta, start + 1000, 1);
    // The sink holds the first window, blocked on the gate.
    assert!(wait_for(|| TAKEN.load(Ordering::SeqCst) == taken + 1));
    let extra = 50;
    let windows = QUEUE_CAPACITY as i64 + extra;
    for window in 2..=windows {
        pair(&beta, start + window * 1000, window);
    }
    // The one in hand counts in the bound: 1,023 wait, the rest dropped.
    let (queued, dropped) = wc::take_queued(Duration::from_millis(10));
    assert_eq!(queued.len(), QUEUE_CAPACITY - 1);
    assert_eq!(dropped, windows as u64 - QUEUE_CAPACITY as u64);
    let sums: Vec<f64> = queued.iter().map(|w| w.window.sum).collect();
    let expected: Vec<f64> = (1..QUEUE_CAPACITY).map(|w| w as f64 / 1e6).collect();
    assert_eq!(sums, expected);
    assert!(queued.iter().all(|w| w.counter.name() == name));
    drop(closed_gate);
    assert!(wait_for(|| delivered(name).len() == 1));
    assert_eq!(wc::take_queued(LONG).1, 0);
    assert_eq!(delivered(name), vec![(1, 1e-6)]);
    wc::disable();
}

#[test]
fn a_forked_child_leaves_the_parents_queue_and_starts_its_own() {
    let _turn = turn();
    wc::disable();
    wc::enable(1000).unwrap();
    let name = "torch.wait_counter.gamma";
    let gamma = backend("gamma");
    let start = 3_000_000;
    let closed_gate = lock(&GATE);
    let taken = TAKEN.load(Ordering::SeqCst);
    for window in 0..4 {
        pair(&gamma, start + window * 1000, 1);
    }
    assert!(wait_for(|| TAKEN.load(Ordering::SeqCst) == taken + 1));
    // Two wait in the parent's queue, a fourth window is open.
    torchmon_core::fork::after_fork_in_child();
    let (queued, dropped) = wc::take_queued(Duration::ZERO);
    assert_eq!((queued.len(), dropped), (0, 0));
    // The child's own window (the open one was emptied) goes to a new queue,
    // whose own thread takes it while the parent's is still held.
    pair(&gamma, start + 10_000, 7);
    pair(&gamma, start + 11_000, 1);
    assert!(wait_for(|| TAKEN.load(Ordering::SeqCst) == taken + 2));
    drop(closed_gate);
    assert!(wait_for(|| delivered(name).len() == 4));
    // In a real child the parent's thread and its three windows do not exist.
    assert!(delivered(name).contains(&(1, 7e-6)));
    assert_eq!(wc::take_queued(LONG).0.len(), 0);
    wc::disable();
}
