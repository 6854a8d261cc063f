//! Python side of the handler registry: handles, (un)registration, dispatch.

use pyo3::exceptions::{PyException, PyTypeError};
use pyo3::prelude::*;

use crate::py_convert::type_name;
use crate::py_event::Event;
use crate::registry::{Registry, Snapshot};

pub static HANDLERS: Registry<Py<PyAny>> = Registry::new();

/// Returned by `register_event_handler`; pass it to `unregister_event_handler`.
#[pyclass(name = "EventHandlerHandle", module = "torchmon", frozen)]
pub struct EventHandlerHandle {
    id: u64,
}

#[pymethods]
impl EventHandlerHandle {
    fn __repr__(&self) -> String {
        format!("<torchmon.EventHandlerHandle {}>", self.id)
    }
}

/// Registers `callback(event)` to be called for every logged event.
#[pyfunction]
pub fn register_event_handler(callback: &Bound<'_, PyAny>) -> PyResult<EventHandlerHandle> {
    if !callback.is_callable() {
        return Err(PyTypeError::new_err(format!(
            "register_event_handler(callback): callback must be callable, not {}",
            type_name(callback)
        )));
    }
    let (id, replaced) = HANDLERS.register(callback.clone().unbind());
    drop(replaced);
    Ok(EventHandlerHandle { id })
}

/// Unregisters a handler. Unregistering the same handle twice is a no-op.
#[pyfunction]
pub fn unregister_event_handler(handle: &Bound<'_, PyAny>) -> PyResult<()> {
    let handle = handle.cast::<EventHandlerHandle>().map_err(|_| {
        PyTypeError::new_err(format!(
            "unregister_event_handler(handle): handle must be an EventHandlerHandle, not {}",
            type_name(handle)
        ))
    })?;
    let (_, replaced) = HANDLERS.unregister(handle.get().id);
    // Dropping the replaced list may run a handler's __del__: do it unlocked.
    drop(replaced);
    Ok(())
}

/// Calls every registered handler with `event`, in registration order.
#[pyfunction]
pub fn log_event(event: &Bound<'_, PyAny>) -> PyResult<()> {
    if event.cast::<Event>().is_err() {
        return Err(PyTypeError::new_err(format!(
            "log_event(event): event must be a torchmon.Event, not {}",
            type_name(event)
        )));
    }
    match HANDLERS.snapshot() {
        None => Ok(()),
        Some(snapshot) => dispatch(event.py(), &snapshot, |_| Ok(event.clone())),
    }
}

/// Collects the exceptions of one dispatch: the first is raised afterwards,
/// except that a KeyboardInterrupt/SystemExit-like exception (not an
/// `Exception`) is never displaced by an ordinary one. The others go to
/// `sys.unraisablehook`, so none is silently lost.
#[derive(Default)]
pub struct Failures {
    first: Option<PyErr>,
}

impl Failures {
    pub fn add(&mut self, py: Python<'_>, err: PyErr, handler: &Bound<'_, PyAny>) {
        match &self.first {
            None => self.first = Some(err),
            Some(first) => {
                let is_ordinary = |e: &PyErr| e.is_instance_of::<PyException>(py);
                if is_ordinary(first) && !is_ordinary(&err) {
                    let displaced = self.first.replace(err).expect("checked above");
                    displaced.write_unraisable(py, Some(handler));
                } else {
                    err.write_unraisable(py, Some(handler));
                }
            }
        }
    }

    pub fn into_result(self) -> PyResult<()> {
        self.first.map_or(Ok(()), Err)
    }
}

/// Runs the active handlers of `snapshot`; `event_for(i)` gives the Event
/// handed to the i-th handler started.
pub fn dispatch<'py>(
    py: Python<'py>,
    snapshot: &Snapshot<Py<PyAny>>,
    mut event_for: impl FnMut(usize) -> PyResult<Bound<'py, PyAny>>,
) -> PyResult<()> {
    let mut failures = Failures::default();
    let mut started = 0;
    for entry in snapshot.iter() {
        if !entry.is_active() {
            continue;
        }
        let handler = entry.handler.bind(py);
        let result = event_for(started).and_then(|event| handler.call1((event,)).map(drop));
        started += 1;
        if let Err(err) = result {
            failures.add(py, err, handler);
        }
    }
    failures.into_result()
}

/// For tests and diagnostics: the number of registered handlers.
#[pyfunction]
pub fn _handler_count() -> usize {
    HANDLERS.len()
}
