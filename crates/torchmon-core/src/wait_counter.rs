//! PyTorch's own wait counters (`c10::monitor::WaitCounterHandle`: compile
//! phases, c10d collectives and store calls, ...) recorded as Stats, through
//! the dynamic backend that libc10 looks up by name
//! (`torch/include/c10/util/WaitCounterDynamicBackend.h` in the wheel): the
//! backend's C ABI, a Stat per counter key, and the delivery of the windows
//! closed on torch's threads. Generic over who delivers them: the embedder
//! exports `init_backend` under the name libc10 looks for and sets the sink
//! that dispatches windows (`set_deliverer`); docs/wait_counter_and_bridge.md,
//! "How it works".
//!
//! libc10 looks the init function up once, with `dlsym(RTLD_DEFAULT)`, when
//! it creates its first counter, and calls it once per counter key. The hot
//! path (`start`/`stop`, called by torch on any thread) is one lock-free
//! `Stat::add`. A window closed there is queued in a `worker::Worker`, whose
//! thread hands it to the sink: a sink never runs inside torch's frames,
//! where the caller may hold torch's locks. The queue is bounded
//! (`QUEUE_CAPACITY`: more are dropped and counted), made on the first
//! closed window with its thread, and made anew in a forked child.

use std::ffi::{c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicPtr, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::aggregation::Aggregation;
use crate::stat::{Stat, WindowStats, live};
use crate::worker::{Pushed, Sink, Worker};

/// `c10::monitor::detail::WaitCounterDynamicBackend`, version 1 (the
/// version is in the init function's name).
#[repr(C)]
pub struct WaitCounterDynamicBackend {
    pub backend_self: *mut c_void,
    pub start: Option<extern "C" fn(*mut c_void, i64) -> isize>,
    pub stop: Option<extern "C" fn(*mut c_void, i64, isize)>,
    pub destroy: Option<extern "C" fn(*mut c_void)>,
}

/// Prefix of every wait counter's Stat name.
const STAT_PREFIX: &str = "torch.wait_counter.";
/// The prefix torch's own keys carry; dropped from the Stat name.
const TORCH_KEY_PREFIX: &str = "pytorch.wait_counter.";
/// The key the embedder's check creates to learn whether libc10 found the
/// backend. Recorded nowhere: its init leaves the backend empty.
pub const PROBE_KEY: &str = "torchmon.record_wait_counters.probe";
/// What every counter's Stat aggregates (durations in seconds).
pub const AGGREGATIONS: [Aggregation; 5] = [
    Aggregation::Count,
    Aggregation::Sum,
    Aggregation::Max,
    Aggregation::P50,
    Aggregation::P99,
];
/// Windows waiting at most; more are dropped and counted. A sink slower
/// than the counters close windows would otherwise grow the queue without
/// bound, and the exit, which delivers what is queued, would last as long.
pub const QUEUE_CAPACITY: usize = 1024;
const THREAD_NAME: &str = "torchmon-wait-counters";

/// Window of counters created from now on; 0: recording is off.
static WINDOW_MS: AtomicI64 = AtomicI64::new(0);
static PROBE_SEEN: AtomicBool = AtomicBool::new(false);
/// Set by `finish_exit`: windows closed later are dropped, the sink untouched.
static AT_EXIT: AtomicBool = AtomicBool::new(false);

/// One torch counter key's Stat, set as the Stat's owner, by which the
/// list of live Stats finds it. A counter lives for the rest of the
/// process, as libc10's own do.
pub struct Counter {
    name: String,
    stat: Arc<Stat>,
}

impl Counter {
    /// The Stat's name: `torch.wait_counter.` and the key without torch's
    /// `pytorch.wait_counter.` prefix.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// A window closed on one of torch's threads, waiting for the sink.
pub struct ClosedWindow {
    pub counter: Arc<Counter>,
    pub window: WindowStats,
}

/// Turns recording on for counters created from now on, with windows of
/// `window_ms` (at least 1: 0 means off). `Err` with the window in use when
/// it is on with another one.
pub fn enable(window_ms: i64) -> Result<(), i64> {
    debug_assert!(window_ms >= 1);
    match WINDOW_MS.compare_exchange(0, window_ms, Ordering::SeqCst, Ordering::SeqCst) {
        Err(current) if current != window_ms => Err(current),
        _ => Ok(()),
    }
}

/// `enable` as `_enable_torch_wait_counters` calls it: its refusals as the
/// messages of its `ValueError`s. `window_ms` comes from the one window rule
/// (through `_core._window_ms` in `record_wait_counters`): at least 1 ms. The
/// check below 1 only keeps a direct call from storing 0 (which means "off")
/// or a negative window; it is not where `window_size` is validated.
pub fn enable_checked(window_ms: i64) -> Result<(), String> {
    if window_ms < 1 {
        return Err(format!(
            "_enable_torch_wait_counters: window_ms must be at least 1, got {window_ms} \
             (record_wait_counters validates window_size first)"
        ));
    }
    enable(window_ms).map_err(|current| window_mismatch_message(current, window_ms))
}

/// The refusal of `window_ms` while counters are recorded with `current`,
/// worded as the argument error of `record_wait_counters(window_size)`.
fn window_mismatch_message(current: i64, window_ms: i64) -> String {
    format!(
        "record_wait_counters(window_size): window_size must match the window wait \
         counters are already recorded with ({current} ms), not {window_ms} ms"
    )
}

/// The `RuntimeWarning` message of `dropped` windows that never reached the
/// handlers (the queue was full).
pub fn dropped_message(dropped: u64) -> String {
    format!(
        "torchmon: {dropped} torch wait counter window(s) dropped: the event handlers \
         fell behind and {QUEUE_CAPACITY} windows were already waiting for them"
    )
}

/// Turns recording off for counters created from now on.
pub fn disable() {
    WINDOW_MS.store(0, Ordering::SeqCst);
}

/// Whether libc10 called the init function with `PROBE_KEY`.
pub fn probe_seen() -> bool {
    PROBE_SEEN.load(Ordering::SeqCst)
}

/// Every counter created, in creation order.
pub fn counters() -> Vec<Arc<Counter>> {
    live::all()
        .iter()
        .filter_map(|stat| stat.owner::<Counter>())
        .collect()
}

/// libc10's init, called once per counter key: fills `backend` with this
/// module's functions and a counter, or leaves its `self` null (libc10 then
/// ignores the backend for the key). Never unwinds.
///
/// # Safety
/// `backend` is null or points to a writable `WaitCounterDynamicBackend`;
/// `key` points to `key_len` readable bytes (libc10 passes a
/// `std::string_view`'s data and size).
pub unsafe fn init_backend(
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
    let filled = catch_unwind(|| counter_for(key)).unwrap_or(None);
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
        None => backend.backend_self = std::ptr::null_mut(),
    }
}

fn counter_for(key: &[u8]) -> Option<Arc<Counter>> {
    if key == PROBE_KEY.as_bytes() {
        PROBE_SEEN.store(true, Ordering::SeqCst);
        return None;
    }
    let window_ms = WINDOW_MS.load(Ordering::SeqCst);
    if window_ms == 0 {
        return None;
    }
    let key = String::from_utf8_lossy(key);
    let name = format!(
        "{STAT_PREFIX}{}",
        key.strip_prefix(TORCH_KEY_PREFIX).unwrap_or(&key)
    );
    // libc10 makes one backend per key; should it ask again, both share one
    // Stat (two asks for one key at the same instant would get two).
    if let Some(existing) = counters().into_iter().find(|c| c.name == name) {
        return Some(existing);
    }
    let counter = Arc::new(Counter {
        name,
        stat: Stat::new(&AGGREGATIONS, window_ms, i64::MAX),
    });
    let owner: std::sync::Weak<Counter> = Arc::downgrade(&counter);
    counter.stat.set_owner(owner);
    // Kept for the rest of the process: its Stat's open window is emitted
    // at flush() and at exit even after libc10 destroyed the backend.
    std::mem::forget(Arc::clone(&counter));
    Some(counter)
}

/// The context torch hands back to `stop` is the start time.
extern "C" fn start(_backend_self: *mut c_void, now_us: i64) -> isize {
    now_us as isize
}

extern "C" fn stop(backend_self: *mut c_void, now_us: i64, started_us: isize) {
    // `backend_self` is what `init_backend` stored: a pointer from
    // `Arc::into_raw`, whose reference `destroy` gives back; libc10 calls
    // `stop` only before `destroy` (a backend is destroyed with its counter,
    // and a guard keeps its counter alive), so it points to a live `Counter`.
    let counter = backend_self.cast::<Counter>().cast_const();
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let seconds = now_us.wrapping_sub(started_us as i64) as f64 / 1_000_000.0;
        // SAFETY: a live `Arc<Counter>`'s pointer (see above).
        let closed = unsafe { &*counter }.stat.add(seconds);
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
    // SAFETY: `backend_self` came from `Arc::into_raw` in `init_backend`, and
    // libc10 calls `destroy` once, after the last `stop`. The counter itself
    // lives on (`counter_for`): dropping this reference runs no sink, so a
    // destroy after the embedder finished is safe.
    let counter = unsafe { Arc::from_raw(backend_self.cast::<Counter>().cast_const()) };
    let _ = catch_unwind(AssertUnwindSafe(|| drop(counter)));
}

/// Makes the sink of a process's delivery thread.
pub type MakeDeliverer = fn() -> Box<dyn Sink<ClosedWindow>>;

static DELIVERER: OnceLock<MakeDeliverer> = OnceLock::new();

/// Sets what the delivery thread hands the closed windows to, in order
/// (once; later calls change nothing). Until then windows wait in the queue
/// for `take_queued`.
pub fn set_deliverer(make: MakeDeliverer) {
    let _ = DELIVERER.set(make);
}

/// This process's queue: null until the first window closes, and again in
/// a forked child (`reset_after_fork`); otherwise one from `Box::leak`,
/// never freed, so a reference to it never dangles.
static QUEUE: AtomicPtr<Worker<ClosedWindow>> = AtomicPtr::new(std::ptr::null_mut());

fn existing_queue() -> Option<&'static Worker<ClosedWindow>> {
    // SAFETY: a non-null value is only ever stored from `Box::leak` (see
    // `QUEUE`), whose allocation lives for the rest of the process.
    unsafe { QUEUE.load(Ordering::Acquire).as_ref() }
}

fn queue() -> &'static Worker<ClosedWindow> {
    if let Some(queue) = existing_queue() {
        return queue;
    }
    let fresh: *mut Worker<ClosedWindow> = Box::leak(Box::new(Worker::new(QUEUE_CAPACITY)));
    match QUEUE.compare_exchange(
        std::ptr::null_mut(),
        fresh,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        // SAFETY: just leaked above, and now published: lives for ever.
        Ok(_) => unsafe { &*fresh },
        Err(winner) => {
            // SAFETY: `fresh` lost the race, so it was never published and
            // is still only ours to free; `winner` came from `Box::leak`.
            unsafe {
                drop(Box::from_raw(fresh));
                &*winner
            }
        }
    }
}

/// In a forked child (called by `fork::after_fork_in_child`): the next
/// window gets a new, empty queue and thread. The parent's is left as it
/// was: its windows are the parent's to deliver, its thread does not exist
/// here, and its locks may have been held at the fork by a thread that does
/// not exist either (torch's threads queue windows).
pub(crate) fn reset_after_fork() {
    QUEUE.store(std::ptr::null_mut(), Ordering::Release);
}

#[cold]
fn queue_window(counter: &Arc<Counter>, window: WindowStats) {
    if AT_EXIT.load(Ordering::Acquire) {
        return;
    }
    let queue = queue();
    let counter = Arc::clone(counter);
    match queue.try_push(ClosedWindow { counter, window }) {
        Pushed::Queued => {}
        Pushed::Full(_) => queue.add_dropped(1),
        // Stopped by the exit: dropped, not counted.
        Pushed::Closed(_) => return,
    }
    if !queue.has_thread()
        && let Some(make) = DELIVERER.get()
    {
        // No thread (none can be started): the windows wait for the next
        // `take_queued`, and the next window tries again.
        let _ = queue.start(make(), THREAD_NAME);
    }
}

/// Takes the windows the delivery thread has not taken yet (they closed
/// after those it is delivering), then waits up to `patience` for its
/// delivery in progress, so that the caller delivers them next, in order;
/// not on the delivery thread itself (a sink flushing there must not wait
/// for itself). Returns them with the count of windows dropped since the
/// last call. Every counter's open window is the caller's.
pub fn take_queued(patience: Duration) -> (Vec<ClosedWindow>, u64) {
    let Some(queue) = existing_queue() else {
        return (Vec::new(), 0);
    };
    let queued = queue.take_queued();
    if !queue.is_worker_thread() {
        queue.wait_idle(patience);
    }
    (queued, queue.take_dropped())
}

/// The exit's first step: windows closed from now on are dropped; the
/// delivery thread finishes what it took.
pub fn stop_delivery() {
    if let Some(queue) = existing_queue() {
        queue.begin_close();
    }
}

/// The exit's last step, once what was queued and every open window were
/// delivered: windows closed later (torch's threads run during and after
/// the embedder's finalization) are dropped and the sink is never called
/// again; the delivery thread is joined when idle, else left to end.
pub fn finish_exit() {
    AT_EXIT.store(true, Ordering::Release);
    if let Some(queue) = existing_queue() {
        queue.begin_close();
        if !queue.finish_close(Duration::ZERO) {
            drop(queue.take_thread());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_and_warnings_are_worded_for_python() {
        assert_eq!(
            enable_checked(0),
            Err(
                "_enable_torch_wait_counters: window_ms must be at least 1, got 0 \
                 (record_wait_counters validates window_size first)"
                    .to_owned()
            )
        );
        assert_eq!(
            window_mismatch_message(1000, 500),
            "record_wait_counters(window_size): window_size must match the window wait \
             counters are already recorded with (1000 ms), not 500 ms"
        );
        assert_eq!(
            dropped_message(3),
            "torchmon: 3 torch wait counter window(s) dropped: the event handlers fell \
             behind and 1024 windows were already waiting for them"
        );
    }
}
