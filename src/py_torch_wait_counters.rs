//! PyTorch's own wait counters (`c10::monitor::WaitCounterHandle`: compile
//! phases, c10d collectives and store calls, ...) recorded as torchmon Stats,
//! through the dynamic backend that libc10 looks up by name
//! (`torch/include/c10/util/WaitCounterDynamicBackend.h` in the wheel).
//!
//! libc10 looks the init function up once, with `dlsym(RTLD_DEFAULT)`, when
//! it creates its first counter, and calls it once per counter key. The
//! Python side (`torchmon.bridge.record_wait_counters`) makes this module's
//! symbols global before that and checks, with a probe counter, that libc10
//! found them (docs/wait_counter_and_bridge.md).
//!
//! Each key's durations go into an ordinary core Stat. The hot path
//! (`start`/`stop`, called by torch on any thread, with or without the GIL)
//! is one lock-free `Stat::add`; it never takes the GIL. A window closed
//! there is queued for a delivery thread that dispatches it to the handlers:
//! handlers never run inside torch's frames, where the caller may hold
//! torch's locks (taking the GIL there could deadlock against a thread that
//! holds the GIL and waits for such a lock). The queue's lock is taken only
//! when a window closes.

use parking_lot::{Condvar, Mutex};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use std::ffi::{c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicPtr, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::py_convert::arg_value_error;
use crate::py_lifecycle::WindowOwner;
use crate::py_registry::{Failures, current_handlers};
use crate::py_window_event::dispatch_window_event;
use torchmon_core::aggregation::Aggregation;
use torchmon_core::stat::{Stat as CoreStat, WindowStats, live};

/// `c10::monitor::detail::WaitCounterDynamicBackend`, version 1 (the
/// version is in the init function's name).
#[repr(C)]
pub struct WaitCounterDynamicBackend {
    backend_self: *mut c_void,
    start: Option<extern "C" fn(*mut c_void, i64) -> isize>,
    stop: Option<extern "C" fn(*mut c_void, i64, isize)>,
    destroy: Option<extern "C" fn(*mut c_void)>,
}

/// Prefix of every wait counter's Stat name.
const STAT_PREFIX: &str = "torch.wait_counter.";
/// The prefix torch's own keys carry; dropped from the Stat name.
const TORCH_KEY_PREFIX: &str = "pytorch.wait_counter.";
/// The key `record_wait_counters` creates to learn whether libc10 found the
/// backend. Recorded nowhere: its init leaves the backend empty.
pub const PROBE_KEY: &str = "torchmon.record_wait_counters.probe";
const AGGREGATIONS: [Aggregation; 5] = [
    Aggregation::Count,
    Aggregation::Sum,
    Aggregation::Max,
    Aggregation::P50,
    Aggregation::P99,
];

/// Window of counters created from now on; 0: recording is off.
static WINDOW_MS: AtomicI64 = AtomicI64::new(0);
static PROBE_SEEN: AtomicBool = AtomicBool::new(false);
/// Set by the exit step: windows closed later are dropped, Python untouched.
static AT_EXIT: AtomicBool = AtomicBool::new(false);
/// One torch counter key's Stat, and the owner the core's list of live
/// Stats finds it by (`py_lifecycle`). A counter lives for the rest of the
/// process, as libc10's own do.
pub(crate) struct Counter {
    name: String,
    core: Arc<CoreStat>,
}

fn stat_name(key: &str) -> String {
    format!(
        "{STAT_PREFIX}{}",
        key.strip_prefix(TORCH_KEY_PREFIX).unwrap_or(key)
    )
}

/// Called by libc10 once per counter key. Never unwinds into C++.
///
/// # Safety
/// `backend` is null or points to a writable `WaitCounterDynamicBackend`;
/// `key` points to `key_len` readable bytes (libc10 passes a
/// `std::string_view`'s data and size).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn c10_monitor_wait_counter_dynamic_backend_init_v1(
    backend: *mut WaitCounterDynamicBackend,
    key: *const c_char,
    key_len: usize,
) {
    if backend.is_null() || (key.is_null() && key_len != 0) {
        return;
    }
    let key: &[u8] = if key_len == 0 {
        &[]
    } else {
        // SAFETY: non-null (checked above), and the caller's contract: `key`
        // points to `key_len` bytes that live for this call.
        unsafe { std::slice::from_raw_parts(key.cast::<u8>(), key_len) }
    };
    let filled = catch_unwind(|| backend_for(key)).unwrap_or(None);
    // SAFETY: non-null (checked above), and the caller's contract: it points
    // to a writable struct of this layout (the v1 header's).
    let backend = unsafe { &mut *backend };
    match filled {
        Some(counter) => {
            backend.backend_self = Arc::into_raw(counter).cast_mut().cast();
            backend.start = Some(start);
            backend.stop = Some(stop);
            backend.destroy = Some(destroy);
        }
        // A null `self`: libc10 ignores this backend for the key.
        None => backend.backend_self = std::ptr::null_mut(),
    }
}

fn backend_for(key: &[u8]) -> Option<Arc<Counter>> {
    if key == PROBE_KEY.as_bytes() {
        PROBE_SEEN.store(true, Ordering::SeqCst);
        return None;
    }
    let window_ms = WINDOW_MS.load(Ordering::SeqCst);
    if window_ms == 0 {
        return None;
    }
    let name = stat_name(&String::from_utf8_lossy(key));
    // libc10 makes one backend per key; should it ask again, both share one
    // Stat (two asks for one key at the same instant would get two).
    if let Some(existing) = counters().into_iter().find(|c| c.name == name) {
        return Some(existing);
    }
    let counter = Arc::new(Counter {
        name,
        core: CoreStat::new(&AGGREGATIONS, window_ms, i64::MAX),
    });
    let owner: std::sync::Weak<Counter> = Arc::downgrade(&counter);
    counter.core.set_owner(owner);
    // Kept for the rest of the process: its Stat's open window is emitted
    // at flush() and at exit even after libc10 destroyed the backend.
    std::mem::forget(Arc::clone(&counter));
    Some(counter)
}

/// Every counter created, in creation order.
fn counters() -> Vec<Arc<Counter>> {
    live::all()
        .iter()
        .filter_map(|stat| stat.owner::<Counter>())
        .collect()
}

/// The context torch hands back to `stop` is the start time.
extern "C" fn start(_backend_self: *mut c_void, now_us: i64) -> isize {
    now_us as isize
}

extern "C" fn stop(backend_self: *mut c_void, now_us: i64, started_us: isize) {
    // `backend_self` is what `init` stored: a pointer from `Arc::into_raw`,
    // whose reference `destroy` gives back; libc10 calls `stop` only before
    // `destroy` (a backend is destroyed with its counter, and a guard keeps
    // its counter alive), so it points to a live `Counter` here.
    let counter = backend_self.cast::<Counter>().cast_const();
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let seconds = now_us.wrapping_sub(started_us as i64) as f64 / 1_000_000.0;
        // SAFETY: a live `Arc<Counter>`'s pointer (see above).
        let closed = unsafe { &*counter }.core.add(seconds);
        if !closed.is_empty() {
            // SAFETY: `counter` is a live `Arc`'s pointer (see above): one
            // more reference, owned by the `Arc` made from it next.
            let counter = unsafe {
                Arc::increment_strong_count(counter);
                Arc::from_raw(counter)
            };
            for window in closed.iter() {
                queue_window(&counter, window.clone());
            }
        }
    }));
}

extern "C" fn destroy(backend_self: *mut c_void) {
    // SAFETY: `backend_self` came from `Arc::into_raw` in `init`, and libc10
    // calls `destroy` once, after the last `stop`. The counter itself lives
    // on (`backend_for`): dropping this reference touches no Python, so a
    // destroy after the interpreter exited is safe.
    let counter = unsafe { Arc::from_raw(backend_self.cast::<Counter>().cast_const()) };
    let _ = catch_unwind(AssertUnwindSafe(|| drop(counter)));
}

/// Closed windows waiting for the delivery thread.
struct Delivery {
    windows: Vec<(Arc<Counter>, WindowStats)>,
    thread: Option<JoinHandle<()>>,
    /// The thread is dispatching windows it took.
    busy: bool,
    stop: bool,
    /// Windows refused because `QUEUE_CAPACITY` were waiting.
    dropped: u64,
}

/// One process's delivery queue. A forked child gets a new one
/// (`reset_delivery_in_child`): the windows queued in the parent are the
/// parent's to deliver, its thread does not exist in the child, and its lock
/// may have been held at the fork by a thread that does not exist either
/// (torch's threads queue windows without the GIL).
struct DeliveryQueue {
    state: Mutex<Delivery>,
    changed: Condvar,
}

impl DeliveryQueue {
    const fn new() -> Self {
        DeliveryQueue {
            state: Mutex::new(Delivery {
                windows: Vec::new(),
                thread: None,
                busy: false,
                stop: false,
                dropped: 0,
            }),
            changed: Condvar::new(),
        }
    }
}

/// Windows waiting at most; more are dropped and counted. A handler slower
/// than the counters close windows would otherwise grow the queue without
/// bound, and the exit, which delivers what is queued, would last as long.
const QUEUE_CAPACITY: usize = 1024;

static FIRST_QUEUE: DeliveryQueue = DeliveryQueue::new();
/// The queue of this process: null for `FIRST_QUEUE`, else one leaked by
/// `reset_delivery_in_child` (never freed, so a reference to it never dangles).
static CURRENT_QUEUE: AtomicPtr<DeliveryQueue> = AtomicPtr::new(std::ptr::null_mut());

fn delivery() -> &'static DeliveryQueue {
    let current = CURRENT_QUEUE.load(Ordering::Acquire);
    if current.is_null() {
        &FIRST_QUEUE
    } else {
        // SAFETY: a non-null value is only ever stored from `Box::leak`,
        // whose allocation lives for the rest of the process.
        unsafe { &*current }
    }
}

/// In a forked child (a `torchmon_core::fork::on_fork_in_child` hook): a new,
/// empty queue with no thread. The parent's is left as it was, untouched.
fn reset_delivery_in_child() {
    let fresh: &'static mut DeliveryQueue = Box::leak(Box::new(DeliveryQueue::new()));
    CURRENT_QUEUE.store(fresh, Ordering::Release);
}

/// Registers the child's reset with the core's fork reset, which
/// `_reset_stats_after_fork` runs (docs/reliability.md, "fork").
pub fn init_fork_reset() {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| torchmon_core::fork::on_fork_in_child(reset_delivery_in_child));
}

#[cold]
fn queue_window(counter: &Arc<Counter>, window: WindowStats) {
    if AT_EXIT.load(Ordering::Acquire) {
        return;
    }
    let counter = Arc::clone(counter);
    let queue = delivery();
    let mut delivery = queue.state.lock();
    if delivery.stop {
        return;
    }
    if delivery.windows.len() >= QUEUE_CAPACITY {
        delivery.dropped += 1;
        return;
    }
    delivery.windows.push((counter, window));
    if delivery.thread.is_none() {
        // No thread (none can be started): the windows wait for the next
        // flush() or the exit.
        delivery.thread = std::thread::Builder::new()
            .name("torchmon-wait-counters".into())
            .spawn(move || deliver_forever(queue))
            .ok();
    }
    queue.changed.notify_all();
}

thread_local! {
    /// This thread is the delivery thread (a handler calling `flush()` there
    /// must not wait for its own dispatch).
    static IS_DELIVERY_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn deliver_forever(queue: &'static DeliveryQueue) {
    IS_DELIVERY_THREAD.with(|is| is.set(true));
    loop {
        let windows = {
            let mut delivery = queue.state.lock();
            while delivery.windows.is_empty() && !delivery.stop {
                queue.changed.wait(&mut delivery);
            }
            if delivery.windows.is_empty() {
                return; // stopped
            }
            delivery.busy = true;
            std::mem::take(&mut delivery.windows)
        };
        // `None`: the interpreter is finalizing; nothing can be delivered.
        let attached = Python::try_attach(|py| {
            for (counter, window) in &windows {
                if let Err(err) = counter.emit_window(py, window) {
                    let context = PyString::new(
                        py,
                        &format!(
                            "torchmon: a handler of the wait counter Stat '{}'",
                            counter.name
                        ),
                    );
                    err.write_unraisable(py, Some(context.as_any()));
                }
            }
        });
        let mut delivery = queue.state.lock();
        delivery.busy = false;
        queue.changed.notify_all();
        if attached.is_none() {
            return;
        }
    }
}

impl WindowOwner for Counter {
    /// Dispatches one closed window as a `torch.monitor.Stat` event, with the
    /// keys `<name>.count`, `.sum`, `.max`, `.p50`, `.p99` (seconds).
    fn emit_window(&self, py: Python<'_>, window: &WindowStats) -> PyResult<()> {
        let Some(handlers) = current_handlers(py) else {
            return Ok(());
        };
        let data = PyDict::new(py);
        for aggregation in AGGREGATIONS {
            data.set_item(
                format!("{}.{}", self.name, aggregation.key_suffix()),
                window.get(aggregation),
            )?;
        }
        dispatch_window_event(py, &handlers, data, window)
    }

    fn name<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        PyString::new(py, &self.name).into_any()
    }
}

/// Waits (GIL released, up to `timeout`) for the delivery thread's dispatch
/// in progress, whose windows closed before the queued ones, then emits the
/// queued windows. Handler errors are collected in `failures`; returns how
/// many windows were emitted. Every counter's open window is the caller's
/// (`py_lifecycle`), with every other Stat's.
pub fn emit_queued(py: Python<'_>, failures: &mut Failures, timeout: Duration) -> usize {
    // A handler calling flush() on the delivery thread must not wait for
    // its own dispatch.
    let timeout = if IS_DELIVERY_THREAD.with(std::cell::Cell::get) {
        Duration::ZERO
    } else {
        timeout
    };
    let queue = delivery();
    let (queued, dropped) = py.detach(|| {
        let deadline = Instant::now() + timeout;
        let mut delivery = queue.state.lock();
        while delivery.busy
            && !queue
                .changed
                .wait_until(&mut delivery, deadline)
                .timed_out()
        {}
        (
            std::mem::take(&mut delivery.windows),
            std::mem::take(&mut delivery.dropped),
        )
    });
    if dropped > 0 {
        warn_dropped(py, dropped);
    }
    for (counter, window) in &queued {
        if let Err(err) = counter.emit_window(py, window) {
            failures.add(py, err, &counter.name(py));
        }
    }
    queued.len()
}

/// Says, as a RuntimeWarning, that `dropped` windows never reached the
/// handlers. Reported where the queue is emptied (flush and exit): the
/// delivery thread that finds it full has no caller to warn.
fn warn_dropped(py: Python<'_>, dropped: u64) {
    let message = format!(
        "torchmon: {dropped} torch wait counter window(s) dropped: the event handlers \
         fell behind and {QUEUE_CAPACITY} windows were already waiting for them"
    );
    let category = py.get_type::<pyo3::exceptions::PyRuntimeWarning>();
    if let Ok(message) = std::ffi::CString::new(message)
        && let Err(err) = PyErr::warn(py, &category, &message, 0)
    {
        err.write_unraisable(py, None);
    }
}

/// The exit step's first part: the delivery thread is told to stop after
/// its dispatch in progress; returns it, for `finish_exit`.
pub fn stop_delivery() -> Option<JoinHandle<()>> {
    let queue = delivery();
    let mut delivery = queue.state.lock();
    delivery.stop = true;
    queue.changed.notify_all();
    delivery.thread.take()
}

/// The exit step's last part, once what was queued and every open window
/// were emitted: from now on closed windows are dropped and Python is never
/// touched, whatever torch does during and after finalization; the stopped
/// thread is joined when idle.
pub fn finish_exit(py: Python<'_>, thread: Option<JoinHandle<()>>) {
    AT_EXIT.store(true, Ordering::Release);
    if let Some(handle) = thread {
        if !delivery().state.lock().busy {
            // Stopped and idle: it returns without touching Python.
            py.detach(|| drop(handle.join()));
        } else {
            std::mem::forget(handle);
        }
    }
}

/// Turns recording on for counters created from now on, with windows of
/// `window_ms`. `ValueError` if it is on with another window.
///
/// `window_ms` comes from the one window rule (`py_clock::window_ms`, through
/// `_core._window_ms` in `record_wait_counters`): at least 1 ms. The check
/// below only keeps a direct call from storing 0 (which means "off") or a
/// negative window; it is not where `window_size` is validated.
#[pyfunction]
pub fn _enable_torch_wait_counters(window_ms: i64) -> PyResult<()> {
    if window_ms < 1 {
        return Err(PyValueError::new_err(format!(
            "_enable_torch_wait_counters: window_ms must be at least 1, got {window_ms} \
             (record_wait_counters validates window_size first)"
        )));
    }
    match WINDOW_MS.compare_exchange(0, window_ms, Ordering::SeqCst, Ordering::SeqCst) {
        Ok(_) => Ok(()),
        Err(current) if current == window_ms => Ok(()),
        Err(current) => Err(arg_value_error(
            "record_wait_counters",
            "window_size",
            format_args!(
                "must match the window wait counters are already recorded with \
                 ({current} ms), not {window_ms} ms"
            ),
        )),
    }
}

/// Turns recording off for counters created from now on (a failed
/// `record_wait_counters`).
#[pyfunction]
pub fn _disable_torch_wait_counters() {
    WINDOW_MS.store(0, Ordering::SeqCst);
}

/// Whether libc10 called the init function with `PROBE_KEY`.
#[pyfunction]
pub fn _torch_wait_counter_probe_seen() -> bool {
    PROBE_SEEN.load(Ordering::SeqCst)
}

/// The names of the Stats of the counters torch created, in creation order.
#[pyfunction]
pub fn _torch_wait_counter_names() -> Vec<String> {
    counters().iter().map(|c| c.name.clone()).collect()
}
