//! `AsyncEventHandler`: runs a handler on a background thread fed by a
//! bounded queue (`worker::Worker`), so that a slow sink does not stall the
//! thread that logs. The set of them, the exit drain, `flush()`'s drain and
//! the fork restart are the core's `async_handlers`; this module converts
//! the arguments and calls Python.
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

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyString};
use std::time::Instant;

use crate::py_convert::{Given, arg_type_error, arg_value_error};
use crate::py_event::Event;
use torchmon_core::async_handlers::{
    AsyncHandlers, DEFAULT_MAXSIZE, Member, Offered, OnFull, Step, check_maxsize, check_on_full,
    deadline_in, own_thread_message, worker_start_message,
};
use torchmon_core::worker::{Flow, Sink, Worker};

const THREAD_NAME: &str = "torchmon-async";
const CALL: &str = "AsyncEventHandler";

/// Every live handler, for the exit drain, `flush()` and the fork restart.
static HANDLERS: AsyncHandlers<Py<Event>, Py<PyAny>> = AsyncHandlers::new();

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

fn spawn_worker(
    py: Python<'_>,
    handler: &Py<PyAny>,
    maxsize: usize,
) -> PyResult<Worker<Py<Event>>> {
    let sink = PySink {
        handler: Some(handler.clone_ref(py)),
    };
    Worker::spawn(maxsize, sink, THREAD_NAME)
        .map_err(|err| PyRuntimeError::new_err(worker_start_message(err)))
}

/// The core's waits, detached from Python in steps; signals (Ctrl-C) are
/// checked between steps.
fn detached(py: Python<'_>) -> impl FnMut(&mut Step<'_>) -> PyResult<()> {
    move |step| {
        while !py.detach(&mut *step) {
            py.check_signals()?;
        }
        Ok(())
    }
}

/// `timeout` seconds from now, checked for `function`; `None` (no limit)
/// for `None` or a time too long to represent.
fn deadline_arg(function: &str, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Instant>> {
    let Some(value) = timeout.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    let seconds: f64 = value
        .extract()
        .map_err(|_| arg_type_error(function, "timeout", "a number of seconds or None", value))?;
    deadline_in(seconds).map_err(|problem| arg_value_error(function, "timeout", problem))
}

fn maxsize_arg(value: &Bound<'_, PyAny>) -> PyResult<usize> {
    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        return Err(arg_type_error(CALL, "maxsize", "an int", value));
    }
    let repr = || value.repr().map(|r| r.to_string()).unwrap_or_default();
    check_maxsize(value.extract().ok(), repr)
        .map_err(|problem| arg_value_error(CALL, "maxsize", problem))
}

fn on_full_arg(value: &Bound<'_, PyAny>) -> PyResult<OnFull> {
    let text = value
        .cast::<PyString>()
        .map_err(|_| arg_type_error(CALL, "on_full", "\"drop\" or \"block\"", value))?;
    check_on_full(text.to_str()?).map_err(|problem| arg_value_error(CALL, "on_full", problem))
}

/// Calls `handler` on a background thread, in order, fed by a bounded queue.
#[pyclass(name = "AsyncEventHandler", module = "torchmon", frozen)]
pub struct AsyncEventHandler {
    member: Member<Py<Event>, Py<PyAny>>,
    /// The wrapped handler.
    #[pyo3(get)]
    handler: Py<PyAny>,
    #[pyo3(get)]
    maxsize: usize,
    #[pyo3(get)]
    on_full: &'static str,
}

impl AsyncEventHandler {
    /// `method` would wait for its own worker thread.
    fn refuse_own_thread(&self, method: &str) -> PyResult<()> {
        if self.member.worker().is_worker_thread() {
            return Err(PyRuntimeError::new_err(own_thread_message(method)));
        }
        Ok(())
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
            return Err(arg_type_error(CALL, "handler", "callable", handler));
        }
        let maxsize = maxsize
            .0
            .map_or(Ok(DEFAULT_MAXSIZE), |v| maxsize_arg(v.bind(py)))?;
        let on_full = on_full
            .0
            .map_or(Ok(OnFull::Drop), |v| on_full_arg(v.bind(py)))?;
        let member = HANDLERS.add(
            handler.clone().unbind(),
            maxsize,
            on_full,
            &mut |handler, maxsize| spawn_worker(py, handler, maxsize),
        )?;
        Ok(AsyncEventHandler {
            handler: member.handler.clone_ref(py),
            maxsize: member.maxsize,
            on_full: member.on_full.as_str(),
            member,
        })
    }

    /// Queues `event` (a snapshot of it) and returns; see `on_full`.
    fn __call__(&self, py: Python<'_>, event: &Bound<'_, PyAny>) -> PyResult<()> {
        let Ok(typed) = event.cast::<Event>() else {
            return Err(arg_type_error(CALL, "event", "a torchmon.Event", event));
        };
        let snapshot = Py::new(py, typed.get().snapshot(py))?;
        match self.member.offer(snapshot, detached(py))? {
            // After the exit drain: handled here, behind the queue's last.
            Offered::CallerHandles => self.member.handler.bind(py).call1((event,)).map(drop),
            Offered::Queued | Offered::Dropped => Ok(()),
        }
    }

    /// Waits until every event queued before the call was handled; `False`
    /// when `timeout` seconds passed first.
    #[pyo3(signature = (timeout = None))]
    fn flush(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
        let deadline = deadline_arg("AsyncEventHandler.flush", timeout)?;
        self.refuse_own_thread("flush")?;
        Ok(self.member.flush(deadline, detached(py))?.unwrap_or(false))
    }

    /// Handles what is queued, then stops the worker thread. Idempotent;
    /// events offered later are dropped and counted in `dropped`.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.refuse_own_thread("close")?;
        self.member.close(detached(py))
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

    /// Events not delivered: refused while the queue was full (drop mode),
    /// offered after close, or left when the interpreter finalized.
    #[getter]
    fn dropped(&self) -> u64 {
        self.member.worker().dropped()
    }

    /// Events queued and not yet handled (the one being handled included).
    #[getter]
    fn pending(&self) -> usize {
        self.member.worker().pending()
    }

    #[getter]
    fn closed(&self) -> bool {
        self.member.worker().is_closed()
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let worker = self.member.worker();
        Ok(format!(
            "torchmon.AsyncEventHandler({}, maxsize={}, on_full={:?}{}, pending={}, dropped={})",
            self.member.handler.bind(py).repr()?,
            self.member.maxsize,
            self.member.on_full.as_str(),
            if worker.is_closed() { ", closed" } else { "" },
            worker.pending(),
            worker.dropped()
        ))
    }
}

/// Drains and closes every AsyncEventHandler; called at interpreter exit,
/// after the Stats' last windows were emitted (the package registers it).
#[pyfunction]
pub fn _close_async_handlers_at_exit(py: Python<'_>) -> PyResult<()> {
    HANDLERS.close_all_at_exit(detached(py))
}

/// `torchmon.flush()`'s second step (docs/api.md): waits until every live
/// AsyncEventHandler handled what was queued before the call, leaving them
/// open; not one whose worker is the calling thread (a wrapped handler
/// calling `torchmon.flush()`). `False` when `timeout` seconds passed first.
#[pyfunction]
#[pyo3(signature = (timeout = None))]
pub fn _drain_async_handlers(py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
    let deadline = deadline_arg("flush", timeout)?;
    HANDLERS.drain_all(deadline, detached(py))
}

/// In a forked child: gives every handler a new queue and worker thread.
#[pyfunction]
pub fn _restart_async_handlers_after_fork(py: Python<'_>) -> PyResult<()> {
    HANDLERS.restart_in_child(&mut |handler, maxsize| spawn_worker(py, handler, maxsize))
}
