//! The torch wait counters' backend at the embedder's exit
//! (docs/internals.md, "Exit"): after `stop_delivery` no window is queued,
//! and after `finish_exit` none reaches the sink or any queue. A binary of
//! its own: the exit is for the rest of the process.
#![cfg(not(loom))]

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use torchmon_core::clock;
use torchmon_core::wait_counter::{self as wc, ClosedWindow, WaitCounterDynamicBackend};
use torchmon_core::worker::{Flow, Sink};

static DELIVERED: AtomicUsize = AtomicUsize::new(0);
static GATE: Mutex<()> = Mutex::new(());

struct Count;

impl Sink<ClosedWindow> for Count {
    fn handle(&mut self, items: &mut dyn Iterator<Item = ClosedWindow>) -> Flow {
        for _ in items {
            DELIVERED.fetch_add(1, Ordering::SeqCst);
            drop(GATE.lock());
        }
        Flow::Continue
    }
}

fn pair(backend: &WaitCounterDynamicBackend, at_ms: i64) {
    clock::set_override_ms(Some(at_ms));
    let context = (backend.start.unwrap())(backend.backend_self, 0);
    (backend.stop.unwrap())(backend.backend_self, 1, context);
}

#[test]
fn windows_closed_after_the_exit_steps_are_dropped() {
    wc::set_deliverer(|| Box::new(Count));
    wc::enable(1000).unwrap();
    let mut backend = WaitCounterDynamicBackend {
        backend_self: std::ptr::null_mut(),
        start: None,
        stop: None,
        destroy: None,
    };
    let key = "exit";
    // SAFETY: a writable struct of the layout, and `key.len()` readable bytes.
    unsafe { wc::init_backend(&mut backend, key.as_ptr().cast(), key.len()) };
    let closed_gate = GATE.lock().unwrap();
    for window in 0..4 {
        pair(&backend, window * 1000);
    }
    // The sink holds the first window; two wait.
    let deadline = Instant::now() + Duration::from_secs(10);
    while DELIVERED.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    wc::stop_delivery();
    pair(&backend, 4000);
    let (queued, dropped) = wc::take_queued(Duration::from_millis(10));
    assert_eq!((queued.len(), dropped), (2, 0));
    drop(closed_gate);
    wc::finish_exit();
    assert_eq!(DELIVERED.load(Ordering::SeqCst), 1);
    pair(&backend, 5000);
    pair(&backend, 6000);
    let (queued, dropped) = wc::take_queued(Duration::ZERO);
    assert_eq!((queued.len(), dropped), (0, 0));
    assert_eq!(DELIVERED.load(Ordering::SeqCst), 1);
}
