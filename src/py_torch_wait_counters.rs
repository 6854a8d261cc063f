//! PyTorch's own wait counters recorded as torchmon Stats: the symbol
//! libc10 looks up, over the core's backend (`torchmon_core::wait_counter`:
//! a Stat per counter key, the bounded delivery queue and its thread), and
//! the Python end of it: the delivery thread's dispatch, the windows it had
//! not dispatched at `flush()` and at exit, and the `_core` functions of
//! `torchmon.bridge.record_wait_counters`, which makes this module's symbols
//! global before libc10 looks and checks, with a probe counter, that it
//! found them (docs/wait_counter_and_bridge.md).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use std::ffi::c_char;
use std::time::Duration;

use crate::py_convert::write_unraisable;
use crate::py_registry::{Failures, current_handlers};
use crate::py_stat::WindowOwner;
use crate::py_window_event::dispatch_window_event;
use torchmon_core::stat::WindowStats;
use torchmon_core::wait_counter::{
    self as core, AGGREGATIONS, ClosedWindow, Counter, WaitCounterDynamicBackend,
};
use torchmon_core::worker::{Flow, Sink};

pub use torchmon_core::wait_counter::PROBE_KEY;

/// Called by libc10 once per counter key; the name carries the ABI version.
///
/// # Safety
/// `torchmon_core::wait_counter::init_backend`'s contract, which libc10
/// keeps: `backend` is null or points to a writable
/// `WaitCounterDynamicBackend`; `key` points to `key_len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn c10_monitor_wait_counter_dynamic_backend_init_v1(
    backend: *mut WaitCounterDynamicBackend,
    key: *const c_char,
    key_len: usize,
) {
    // SAFETY: this function's own contract, passed on unchanged.
    unsafe { core::init_backend(backend, key, key_len) }
}

/// The delivery thread's sink: dispatches the windows closed on torch's
/// threads, with the GIL, and reports a handler's error as unraisable
/// (there is no caller to raise it to).
struct Deliver;

impl Sink<ClosedWindow> for Deliver {
    fn handle(&mut self, items: &mut dyn Iterator<Item = ClosedWindow>) -> Flow {
        // `None`: the interpreter is finalizing; nothing can be delivered.
        Python::try_attach(|py| {
            for ClosedWindow { counter, window } in items {
                if let Err(err) = counter.emit_window(py, &window) {
                    let context = format!(
                        "torchmon: a handler of the wait counter Stat '{}'",
                        counter.name()
                    );
                    write_unraisable(py, err, &context);
                }
            }
            Flow::Continue
        })
        .unwrap_or(Flow::Stop)
    }
}

/// Sets the delivery thread's sink; called when the module is initialised.
pub fn init() {
    core::set_deliverer(|| Box::new(Deliver));
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
                format!("{}.{}", self.name(), aggregation.key_suffix()),
                window.get(aggregation),
            )?;
        }
        dispatch_window_event(py, &handlers, data, window)
    }

    fn name<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        PyString::new(py, self.name()).into_any()
    }
}

/// Waits (GIL released, up to `timeout`) for the delivery thread's dispatch
/// in progress, whose windows closed before the queued ones, then emits the
/// queued windows. Handler errors are collected in `failures`; returns how
/// many windows were emitted. Every counter's open window is the caller's
/// (`py_lifecycle`), with every other Stat's.
pub fn emit_queued(py: Python<'_>, failures: &mut Failures, timeout: Duration) -> usize {
    let (queued, dropped) = py.detach(|| core::take_queued(timeout));
    if dropped > 0 {
        warn_dropped(py, dropped);
    }
    for ClosedWindow { counter, window } in &queued {
        if let Err(err) = counter.emit_window(py, window) {
            failures.add(py, err, &WindowOwner::name(&**counter, py));
        }
    }
    queued.len()
}

/// Says, as a RuntimeWarning, that `dropped` windows never reached the
/// handlers. Reported where the queue is emptied (flush and exit): the
/// thread that finds it full has no caller to warn.
fn warn_dropped(py: Python<'_>, dropped: u64) {
    let message = core::dropped_message(dropped);
    let category = py.get_type::<pyo3::exceptions::PyRuntimeWarning>();
    if let Ok(message) = std::ffi::CString::new(message)
        && let Err(err) = PyErr::warn(py, &category, &message, 0)
    {
        err.write_unraisable(py, None);
    }
}

pub use torchmon_core::wait_counter::stop_delivery;

/// The exit step's last part, once what was queued and every open window
/// were emitted: from now on closed windows are dropped and Python is never
/// touched, whatever torch does during and after finalization; the stopped
/// thread is joined when idle.
pub fn finish_exit(py: Python<'_>) {
    py.detach(core::finish_exit);
}

/// Turns recording on for counters created from now on, with windows of
/// `window_ms` (from the window rule: `py_clock::window_ms`). `ValueError`
/// below 1 ms or if it is on with another window (`core::enable_checked`).
#[pyfunction]
pub fn _enable_torch_wait_counters(window_ms: i64) -> PyResult<()> {
    core::enable_checked(window_ms).map_err(PyValueError::new_err)
}

/// Turns recording off for counters created from now on (a failed
/// `record_wait_counters`).
#[pyfunction]
pub fn _disable_torch_wait_counters() {
    core::disable();
}

/// Whether libc10 called the init function with `PROBE_KEY`.
#[pyfunction]
pub fn _torch_wait_counter_probe_seen() -> bool {
    core::probe_seen()
}

/// The names of the Stats of the counters torch created, in creation order.
#[pyfunction]
pub fn _torch_wait_counter_names() -> Vec<String> {
    core::counters()
        .iter()
        .map(|c| c.name().to_owned())
        .collect()
}
