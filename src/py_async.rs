//! `AsyncEventHandler`: runs a handler on a background thread fed by a
//! bounded queue (`worker::Worker`), so that a slow sink does not stall the
//! thread that logs.
//!
//! Choices (docs/sinks.md):
//! - The queue holds a snapshot of each Event (same parts, new object):
//!   Events have setters, and a caller that reuses one Event and changes it
//!   after `log_event` must not change what the handler sees later.
//! - Events offered after `close()` are dropped and counted: a closed sink
//!   that raises would break the training loop that still logs to it.
//! - At interpreter exit, after the Stats' last windows were emitted, every
//!   handler is drained and closed; events logged after that (by later exit
//!   hooks) are handled synchronously on the logging thread, in order.
//! - In a forked child each handler gets a new, empty queue and thread; the
//!   events queued in the parent at fork time are the parent's to deliver.
//! - An exception from the wrapped handler, `KeyboardInterrupt` and
//!   `SystemExit` included, goes to `sys.unraisablehook`, and the worker
//!   goes on: there is no caller to raise it to, and no event is skipped.

use parking_lot::Mutex;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyString};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::py_convert::{arg_type_error, arg_value_error};
use crate::py_event::Event;
use crate::py_gil_cell::GilCell;
use torchmon_core::worker::{Flow, Pushed, Sink, Worker};

/// How long a wait stays detached before checking for signals (Ctrl-C).
const SLICE: Duration = Duration::from_millis(50);

/// The queue's memory is allocated up front (about 24 bytes an item).
const MAX_QUEUE: usize = 1 << 22;

const THREAD_NAME: &str = "torchmon-async";

/// Every live handler, for the exit drain and the fork restart.
static LIVE: LazyLock<Mutex<HashMap<u64, Weak<Shared>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));
static NEXT_ID: AtomicU64 = AtomicU64::new(0);
/// Threads of handlers that were dropped while their queue still drained;
/// joined by the exit drain, so none touches a finalizing interpreter.
/// Those that ended are joined whenever another is added: a thread ended but
/// not joined keeps its stack mapped, and enough of them (tens of thousands
/// of handlers dropped without `close()`) leave the process unable to start
/// a thread (docs/reliability.md).
static ORPHANS: Mutex<Vec<JoinHandle<()>>> = Mutex::new(Vec::new());
/// Set by the exit drain: handlers made later start closed and synchronous.
static AT_EXIT: AtomicBool = AtomicBool::new(false);

/// Calls the wrapped handler on the worker thread.
struct PySink {
    handler: Option<Py<PyAny>>,
}

impl Sink<Py<Event>> for PySink {
    fn handle(&mut self, items: &mut dyn Iterator<Item = Py<Event>>) -> Flow {
        let Some(handler) = &self.handler else {
            return Flow::Stop;
        };
        // `None`: the interpreter is finalizing; the worker stops.
        Python::try_attach(|py| {
            let handler = handler.bind(py);
            for event in items {
                if let Err(err) = handler.call1((event,)) {
                    err.write_unraisable(py, Some(handler));
                }
            }
            Flow::Continue
        })
        .unwrap_or(Flow::Stop)
    }
}

impl Drop for PySink {
    fn drop(&mut self) {
        // Released attached when possible; otherwise PyO3 defers it.
        let handler = &mut self.handler;
        let _ = Python::try_attach(|_py| drop(handler.take()));
    }
}

/// The queue and thread, swapped as a whole in a forked child.
#[pyclass(frozen)]
struct WorkerBox {
    worker: Worker<Py<Event>>,
}

impl Drop for WorkerBox {
    fn drop(&mut self) {
        // Dropping the queue's sender lets the thread drain it and end.
        if let Some(thread) = self.worker.take_thread() {
            let ended = {
                let mut orphans = ORPHANS.lock();
                let (ended, draining) = std::mem::take(&mut *orphans)
                    .into_iter()
                    .partition(JoinHandle::is_finished);
                *orphans = draining;
                orphans.push(thread);
                ended
            };
            // Their sink was dropped and their loop left: joining waits for
            // the OS thread to exit, never for Python (the GIL may be held).
            for thread in ended {
                let _ = thread.join();
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum OnFull {
    Drop,
    Block,
}

impl OnFull {
    fn as_str(self) -> &'static str {
        match self {
            OnFull::Drop => "drop",
            OnFull::Block => "block",
        }
    }
}

struct Shared {
    handler: Py<PyAny>,
    maxsize: usize,
    on_full: OnFull,
    worker: GilCell<Py<WorkerBox>>,
    /// Closed by the exit drain (or no thread could be started in a forked
    /// child): events are then handled on the calling thread.
    synchronous_when_closed: AtomicBool,
}

fn spawn_worker(py: Python<'_>, handler: &Py<PyAny>, maxsize: usize) -> PyResult<WorkerBox> {
    let sink = PySink {
        handler: Some(handler.clone_ref(py)),
    };
    let worker = Worker::spawn(maxsize, sink, THREAD_NAME).map_err(|err| {
        PyRuntimeError::new_err(format!(
            "AsyncEventHandler: cannot start its worker thread: {err}"
        ))
    })?;
    Ok(WorkerBox { worker })
}

/// Waits, detached in slices, until `step` returns true; signals (Ctrl-C)
/// are checked between slices.
fn wait_detached(py: Python<'_>, mut step: impl FnMut() -> bool + Send) -> PyResult<()> {
    while !py.detach(&mut step) {
        py.check_signals()?;
    }
    Ok(())
}

fn timeout_arg(value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Duration>> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    let seconds: f64 = value.extract().map_err(|_| {
        arg_type_error(
            "AsyncEventHandler.flush",
            "timeout",
            "a number of seconds or None",
            value,
        )
    })?;
    if seconds.is_nan() || seconds < 0.0 {
        return Err(arg_value_error(
            "AsyncEventHandler.flush",
            "timeout",
            format_args!("must be >= 0 seconds, got {seconds}"),
        ));
    }
    // Too long to represent: no limit.
    Ok(Duration::try_from_secs_f64(seconds).ok())
}

fn maxsize_arg(value: &Bound<'_, PyAny>) -> PyResult<usize> {
    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        return Err(arg_type_error(
            "AsyncEventHandler",
            "maxsize",
            "an int",
            value,
        ));
    }
    let out_of_range = || {
        arg_value_error(
            "AsyncEventHandler",
            "maxsize",
            format_args!(
                "must be between 1 and {MAX_QUEUE}, got {}",
                value.repr().map(|r| r.to_string()).unwrap_or_default()
            ),
        )
    };
    let maxsize: i64 = value.extract().map_err(|_| out_of_range())?;
    match usize::try_from(maxsize) {
        Ok(n) if (1..=MAX_QUEUE).contains(&n) => Ok(n),
        _ => Err(out_of_range()),
    }
}

fn on_full_arg(value: &Bound<'_, PyAny>) -> PyResult<OnFull> {
    let text = value.cast::<PyString>().map_err(|_| {
        arg_type_error(
            "AsyncEventHandler",
            "on_full",
            "\"drop\" or \"block\"",
            value,
        )
    })?;
    match text.to_str()? {
        "drop" => Ok(OnFull::Drop),
        "block" => Ok(OnFull::Block),
        other => Err(arg_value_error(
            "AsyncEventHandler",
            "on_full",
            format_args!("must be \"drop\" or \"block\", got {other:?}"),
        )),
    }
}

fn from_own_handler(method: &str) -> PyErr {
    PyRuntimeError::new_err(format!(
        "AsyncEventHandler.{method}() called from its own handler would wait for itself"
    ))
}

/// An optional argument as passed (`None` when omitted), so that an explicit
/// `None` is reported as a wrong type rather than taken for the default.
pub struct Given(Option<Py<PyAny>>);

impl<'a, 'py> FromPyObject<'a, 'py> for Given {
    type Error = PyErr;

    fn extract(obj: pyo3::Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(Given(Some(obj.to_owned().unbind())))
    }
}

/// Calls `handler` on a background thread, in order, fed by a bounded queue.
#[pyclass(name = "AsyncEventHandler", module = "torchmon", frozen)]
pub struct AsyncEventHandler {
    shared: Arc<Shared>,
    live_id: u64,
}

impl AsyncEventHandler {
    fn worker(&self, py: Python<'_>) -> Py<WorkerBox> {
        self.shared.worker.get(py)
    }

    /// After the exit drain: handle `event` here, behind the queue's last.
    fn deliver_now(
        &self,
        py: Python<'_>,
        worker: &Worker<Py<Event>>,
        event: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        wait_detached(py, || worker.wait_idle(SLICE))?;
        self.shared.handler.bind(py).call1((event,)).map(drop)
    }
}

#[pymethods]
impl AsyncEventHandler {
    #[new]
    #[pyo3(
        signature = (handler, maxsize = Given(None), on_full = Given(None)),
        text_signature = "(handler, maxsize=1024, on_full='drop')"
    )]
    fn new(
        py: Python<'_>,
        handler: &Bound<'_, PyAny>,
        maxsize: Given,
        on_full: Given,
    ) -> PyResult<Self> {
        if !handler.is_callable() {
            return Err(arg_type_error(
                "AsyncEventHandler",
                "handler",
                "callable",
                handler,
            ));
        }
        let maxsize = maxsize.0.map_or(Ok(1024), |v| maxsize_arg(v.bind(py)))?;
        let on_full = on_full
            .0
            .map_or(Ok(OnFull::Drop), |v| on_full_arg(v.bind(py)))?;
        let handler = handler.clone().unbind();
        let at_exit = AT_EXIT.load(Ordering::SeqCst);
        let worker = if at_exit {
            WorkerBox {
                worker: Worker::closed(maxsize),
            }
        } else {
            spawn_worker(py, &handler, maxsize)?
        };
        let shared = Arc::new(Shared {
            handler,
            maxsize,
            on_full,
            worker: GilCell::new(Py::new(py, worker)?),
            synchronous_when_closed: AtomicBool::new(at_exit),
        });
        let live_id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        LIVE.lock().insert(live_id, Arc::downgrade(&shared));
        Ok(AsyncEventHandler { shared, live_id })
    }

    /// Queues `event` (a snapshot of it) and returns; see `on_full`.
    fn __call__(&self, py: Python<'_>, event: &Bound<'_, PyAny>) -> PyResult<()> {
        let Ok(typed) = event.cast::<Event>() else {
            return Err(arg_type_error(
                "AsyncEventHandler",
                "event",
                "a torchmon.Event",
                event,
            ));
        };
        let boxed = self.worker(py);
        let worker = &boxed.get().worker;
        let snapshot = Py::new(py, typed.get().snapshot(py))?;
        let mut pushed = worker.try_push(snapshot);
        // Blocking on the worker thread (its handler logging) would wait for
        // itself: there, a full queue drops.
        if self.shared.on_full == OnFull::Block && !worker.is_worker_thread() {
            while let Pushed::Full(item) = pushed {
                pushed = py.detach(|| worker.push_within(item, SLICE));
                if matches!(pushed, Pushed::Full(_)) {
                    py.check_signals()?;
                }
            }
        }
        match pushed {
            Pushed::Queued => Ok(()),
            Pushed::Full(_) => {
                worker.add_dropped(1);
                Ok(())
            }
            Pushed::Closed(_) => {
                if self.shared.synchronous_when_closed.load(Ordering::SeqCst) {
                    self.deliver_now(py, worker, event)
                } else {
                    worker.add_dropped(1);
                    Ok(())
                }
            }
        }
    }

    /// Waits until every event queued before the call was handled; `False`
    /// when `timeout` seconds passed first.
    #[pyo3(signature = (timeout = None))]
    fn flush(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
        let timeout = timeout_arg(timeout)?;
        let boxed = self.worker(py);
        let worker = &boxed.get().worker;
        if worker.is_worker_thread() {
            return Err(from_own_handler("flush"));
        }
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut flush = worker.start_flush();
        loop {
            let now = Instant::now();
            let until = deadline.map_or(now + SLICE, |d| d.min(now + SLICE));
            if let Some(done) = py.detach(|| flush.wait(until)) {
                return Ok(done);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(false);
            }
            py.check_signals()?;
        }
    }

    /// Handles what is queued, then stops the worker thread. Idempotent;
    /// events offered later are dropped and counted in `dropped`.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let boxed = self.worker(py);
        let worker = &boxed.get().worker;
        if worker.is_worker_thread() {
            return Err(from_own_handler("close"));
        }
        worker.begin_close();
        wait_detached(py, || worker.finish_close(SLICE))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (exc_type, exc_value, traceback))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: &Bound<'_, PyAny>,
        exc_value: &Bound<'_, PyAny>,
        traceback: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let _ = (exc_type, exc_value, traceback);
        self.close(py)
    }

    /// The wrapped handler.
    #[getter]
    fn handler(&self, py: Python<'_>) -> Py<PyAny> {
        self.shared.handler.clone_ref(py)
    }

    #[getter]
    fn maxsize(&self) -> usize {
        self.shared.maxsize
    }

    #[getter]
    fn on_full(&self) -> &'static str {
        self.shared.on_full.as_str()
    }

    /// Events not delivered: refused while the queue was full (drop mode),
    /// offered after close, or left when the interpreter finalized.
    #[getter]
    fn dropped(&self, py: Python<'_>) -> u64 {
        self.worker(py).get().worker.dropped()
    }

    /// Events queued and not yet handled (the one being handled included).
    #[getter]
    fn pending(&self, py: Python<'_>) -> usize {
        self.worker(py).get().worker.pending()
    }

    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        self.worker(py).get().worker.is_closed()
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let boxed = self.worker(py);
        let worker = &boxed.get().worker;
        Ok(format!(
            "torchmon.AsyncEventHandler({}, maxsize={}, on_full={:?}{}, pending={}, dropped={})",
            self.shared.handler.bind(py).repr()?,
            self.shared.maxsize,
            self.shared.on_full.as_str(),
            if worker.is_closed() { ", closed" } else { "" },
            worker.pending(),
            worker.dropped()
        ))
    }
}

impl Drop for AsyncEventHandler {
    fn drop(&mut self) {
        LIVE.lock().remove(&self.live_id);
    }
}

fn live_handlers() -> Vec<Arc<Shared>> {
    LIVE.lock().values().filter_map(Weak::upgrade).collect()
}

/// Drains and closes every AsyncEventHandler; called at interpreter exit,
/// after the Stats' last windows were emitted (the package registers it).
#[pyfunction]
pub fn _close_async_handlers_at_exit(py: Python<'_>) -> PyResult<()> {
    AT_EXIT.store(true, Ordering::SeqCst);
    for shared in live_handlers() {
        let boxed = shared.worker.get(py);
        let worker = &boxed.get().worker;
        if !worker.is_closed() {
            // Before `begin_close`: a caller that sees it closed sees this.
            shared.synchronous_when_closed.store(true, Ordering::SeqCst);
        }
        worker.begin_close();
        wait_detached(py, || worker.finish_close(SLICE))?;
    }
    let orphans = std::mem::take(&mut *ORPHANS.lock());
    for thread in orphans {
        wait_detached(py, || {
            if thread.is_finished() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
            thread.is_finished()
        })?;
        let _ = thread.join();
    }
    Ok(())
}

/// Waits until every live AsyncEventHandler handled what was queued before
/// the call (`torchmon.flush()`'s second step, docs/api.md): markers go into
/// every queue first, so the queues drain side by side. The handlers stay
/// open. A handler whose worker is the calling thread (a wrapped handler
/// calling `torchmon.flush()`) is not waited for: it would wait for itself.
/// `False` when `timeout` seconds passed first.
#[pyfunction]
#[pyo3(signature = (timeout = None))]
pub fn _drain_async_handlers(py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
    let deadline = match timeout {
        None => None,
        Some(seconds) if seconds.is_nan() || seconds < 0.0 => {
            return Err(arg_value_error(
                "flush",
                "timeout",
                format_args!("must be >= 0 seconds, got {seconds}"),
            ));
        }
        Some(seconds) => Duration::try_from_secs_f64(seconds)
            .ok()
            .and_then(|t| Instant::now().checked_add(t)),
    };
    let workers: Vec<Py<WorkerBox>> = live_handlers()
        .iter()
        .map(|shared| shared.worker.get(py))
        .filter(|boxed| !boxed.get().worker.is_worker_thread())
        .collect();
    let mut flushes: Vec<_> = workers
        .iter()
        .map(|boxed| boxed.get().worker.start_flush())
        .collect();
    let mut all_done = true;
    for flush in &mut flushes {
        loop {
            let now = Instant::now();
            let until = deadline.map_or(now + SLICE, |d| d.min(now + SLICE));
            if let Some(done) = py.detach(|| flush.wait(until)) {
                all_done &= done;
                break;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(false);
            }
            py.check_signals()?;
        }
    }
    Ok(all_done)
}

/// In a forked child: gives every handler a new queue and worker thread.
/// The old ones are leaked: their thread does not exist here, and their
/// locks may have been held by it at fork time.
#[pyfunction]
pub fn _restart_async_handlers_after_fork(py: Python<'_>) -> PyResult<()> {
    std::mem::forget(std::mem::take(&mut *ORPHANS.lock()));
    let mut first_error = None;
    for shared in live_handlers() {
        let was_closed = shared.worker.get(py).get().worker.is_closed();
        let fresh = if was_closed || AT_EXIT.load(Ordering::SeqCst) {
            WorkerBox {
                worker: Worker::closed(shared.maxsize),
            }
        } else {
            match spawn_worker(py, &shared.handler, shared.maxsize) {
                Ok(fresh) => fresh,
                Err(err) => {
                    // No thread: deliver on the logging thread instead.
                    shared.synchronous_when_closed.store(true, Ordering::SeqCst);
                    first_error.get_or_insert(err);
                    WorkerBox {
                        worker: Worker::closed(shared.maxsize),
                    }
                }
            }
        };
        let old = shared.worker.replace(py, Py::new(py, fresh)?);
        std::mem::forget(old);
    }
    first_error.map_or(Ok(()), Err)
}
