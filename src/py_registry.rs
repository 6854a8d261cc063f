//! Python side of the handler registry: handles, (un)registration, dispatch.

use pyo3::exceptions::PyException;
use pyo3::prelude::*;

use crate::py_convert::arg_type_error;
use crate::py_event::Event;
use crate::py_gil_cell::GilCell;
#[cfg(not(Py_3_14))]
use std::time::Duration;
#[cfg(not(Py_3_14))]
use torchmon_core::exit_gate::ExitGate;
use torchmon_core::registry::{Registry, Snapshot};

/// A registered callback. `unregister_event_handler` takes it out, so that
/// it is freed then, although the registry keeps the entry itself until its
/// buffer moves (see `registry`). Reading it is a reference-count increment
/// on GIL builds; dispatch calls the callback through that new reference,
/// which keeps it alive should it unregister itself.
type Callback = GilCell<Option<Py<PyAny>>>;

static HANDLERS: Registry<Callback> = Registry::new();

/// Closed at interpreter exit (see `exit_gate`). CPython 3.14 hangs late
/// threads instead of ending them with `pthread_exit` (gh-87135), so from 3.14
/// on the gate is not used; PyO3 supports free-threaded builds only from 3.14.
#[cfg(not(Py_3_14))]
static EXIT_GATE: ExitGate = ExitGate::new();

/// How long the exiting thread waits for other threads' dispatches to end.
#[cfg(not(Py_3_14))]
const EXIT_WAIT: Duration = Duration::from_secs(2);

/// `HANDLERS`' current list as GIL-build dispatch takes it.
#[cfg(not(Py_GIL_DISABLED))]
#[pyclass(frozen)]
struct DispatchList {
    snapshot: Snapshot<Callback>,
}

/// On GIL builds, `HANDLERS`' current list, replaced with the GIL held
/// whenever the list changes (registration holds the GIL throughout, so it
/// always matches the list). Dispatch takes it with a `Py_INCREF` instead of
/// the registry lock and an `Arc` count: four atomic read-modify-writes
/// (~40 ns here) fewer per `log_event`.
#[cfg(not(Py_GIL_DISABLED))]
static DISPATCH_LIST: GilCell<Option<Py<DispatchList>>> = GilCell::new(None);

/// The handlers to call for one event, in registration order.
pub struct Handlers {
    #[cfg(not(Py_GIL_DISABLED))]
    list: Py<DispatchList>,
    #[cfg(Py_GIL_DISABLED)]
    list: Snapshot<Callback>,
}

impl Handlers {
    #[inline]
    fn snapshot(&self) -> &Snapshot<Callback> {
        #[cfg(not(Py_GIL_DISABLED))]
        {
            &self.list.get().snapshot
        }
        #[cfg(Py_GIL_DISABLED)]
        {
            &self.list
        }
    }
}

/// Creates the dispatch list's type at import rather than at the first
/// registration (see `py_convert::init_lazy`).
pub fn init_lazy(py: Python<'_>) {
    #[cfg(not(Py_GIL_DISABLED))]
    py.get_type::<DispatchList>();
    #[cfg(Py_GIL_DISABLED)]
    let _ = py;
}

/// The handlers registered now (`None`: there are none).
#[inline]
pub fn current_handlers(py: Python<'_>) -> Option<Handlers> {
    #[cfg(not(Py_GIL_DISABLED))]
    {
        DISPATCH_LIST.get(py).map(|list| Handlers { list })
    }
    #[cfg(Py_GIL_DISABLED)]
    {
        let _ = py;
        HANDLERS.snapshot().map(|list| Handlers { list })
    }
}

/// Publishes `HANDLERS`' current list to dispatch after it changed; returns
/// the replaced one, to be dropped by the caller.
///
/// It allocates one object, whatever the number of handlers (a change costs
/// O(1) amortized: docs/performance.md). Allocating may run the garbage
/// collector and with it Python code (a `__del__` that registers a handler,
/// or a switch to another thread that does): a list taken before a change
/// made meanwhile is taken again, so the one published always matches the
/// current list.
#[cfg(not(Py_GIL_DISABLED))]
fn publish(py: Python<'_>) -> PyResult<Option<Py<DispatchList>>> {
    loop {
        let snapshot = HANDLERS.snapshot();
        let list = match &snapshot {
            None => None,
            Some(snapshot) => Some(Py::new(
                py,
                DispatchList {
                    snapshot: snapshot.clone(),
                },
            )?),
        };
        let unchanged = match (&snapshot, HANDLERS.snapshot()) {
            (None, None) => true,
            (Some(built), Some(now)) => built.same_as(&now),
            _ => false,
        };
        if unchanged {
            return Ok(DISPATCH_LIST.replace(py, list));
        }
    }
}

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
        return Err(arg_type_error(
            "register_event_handler",
            "callback",
            "callable",
            callback,
        ));
    }
    let (id, replaced) = HANDLERS.register(GilCell::new(Some(callback.clone().unbind())));
    #[cfg(not(Py_GIL_DISABLED))]
    let replaced = match publish(callback.py()) {
        Ok(list) => (replaced, list),
        Err(err) => {
            // Not dispatchable (out of memory): not registered either.
            let (entry, undone) = HANDLERS.unregister(id);
            let callback = entry
                .as_ref()
                .map(|e| e.handler.replace(callback.py(), None));
            drop((replaced, undone, callback, entry));
            return Err(err);
        }
    };
    drop(replaced);
    Ok(EventHandlerHandle { id })
}

/// Unregisters a handler. Unregistering the same handle twice is a no-op.
#[pyfunction]
pub fn unregister_event_handler(handle: &Bound<'_, PyAny>) -> PyResult<()> {
    let handle = handle.cast::<EventHandlerHandle>().map_err(|_| {
        arg_type_error(
            "unregister_event_handler",
            "handle",
            "an EventHandlerHandle",
            handle,
        )
    })?;
    let py = handle.py();
    let (entry, replaced) = HANDLERS.unregister(handle.get().id);
    let callback = entry.as_ref().map(|e| e.handler.replace(py, None));
    #[cfg(not(Py_GIL_DISABLED))]
    // Should publishing fail, the old list still holds the entry, whose
    // cleared `active` flag keeps dispatch from starting it.
    let replaced = (replaced, publish(py)?);
    // Dropping the callback or the replaced buffer may run a handler's
    // __del__: do it unlocked, after the registry changed.
    drop((callback, entry, replaced));
    Ok(())
}

/// Whether any handler is registered (one atomic load).
#[inline]
pub fn has_handlers() -> bool {
    !HANDLERS.is_empty()
}

/// `log_event(event)`'s body; its entry point is `py_entry_points::log_event`.
pub fn log_event_checked(event: &Bound<'_, PyAny>) -> PyResult<()> {
    if event.cast::<Event>().is_err() {
        return Err(arg_type_error(
            "log_event",
            "event",
            "a torchmon.Event",
            event,
        ));
    }
    match current_handlers(event.py()) {
        None => Ok(()),
        Some(handlers) => dispatch(event.py(), &handlers, |_| Ok(event.clone())),
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

/// Runs the active handlers of `handlers`; `event_for(i)` gives the Event
/// handed to the i-th handler started.
pub fn dispatch<'py>(
    py: Python<'py>,
    handlers: &Handlers,
    mut event_for: impl FnMut(usize) -> PyResult<Bound<'py, PyAny>>,
) -> PyResult<()> {
    #[cfg(all(not(Py_3_14), not(Py_GIL_DISABLED)))]
    let _running = EXIT_GATE.enter_serialised(); // dispatch holds the GIL
    #[cfg(all(not(Py_3_14), Py_GIL_DISABLED))]
    let _running = EXIT_GATE.enter();
    let mut failures = Failures::default();
    let mut started = 0;
    for entry in handlers.snapshot().iter() {
        if !entry.is_active() {
            continue;
        }
        #[cfg(not(Py_3_14))]
        if !EXIT_GATE.admits_current_thread() {
            continue;
        }
        // `None`: on free-threaded builds, another thread unregistered it
        // since the flag was read.
        let Some(handler) = entry.handler.get(py) else {
            continue;
        };
        let handler = handler.into_bound(py);
        let result = event_for(started).and_then(|event| handler.call1((event,)).map(drop));
        started += 1;
        if let Err(err) = result {
            failures.add(py, err, &handler);
        }
    }
    failures.into_result()
}

/// The exiting thread's last step before finalization (the package registers
/// it with `atexit` at import, so it runs after every `atexit` handler
/// registered later, torchmon's own included): from now on only this thread
/// starts handlers, and it waits, with the GIL released, up to `EXIT_WAIT`
/// for the other threads' dispatches to end. Returns whether they all did.
#[pyfunction]
pub fn _close_exit_gate(py: Python<'_>) -> bool {
    #[cfg(not(Py_3_14))]
    {
        EXIT_GATE.close();
        py.detach(|| EXIT_GATE.wait_idle(EXIT_WAIT))
    }
    #[cfg(Py_3_14)]
    {
        let _ = py;
        true
    }
}

/// For tests: (gate closed, dispatches running, handler calls skipped).
#[pyfunction]
pub fn _exit_gate_state() -> (bool, usize, u64) {
    #[cfg(not(Py_3_14))]
    {
        (
            EXIT_GATE.is_closed(),
            EXIT_GATE.running(),
            EXIT_GATE.skipped(),
        )
    }
    #[cfg(Py_3_14)]
    {
        (false, 0, 0)
    }
}

/// For tests and diagnostics: the number of registered handlers.
#[pyfunction]
pub fn _handler_count() -> usize {
    HANDLERS.len()
}
