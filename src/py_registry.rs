//! Python side of the handler registry: handles, (un)registration, dispatch.

use pyo3::exceptions::PyException;
use pyo3::prelude::*;

use crate::py_convert::arg_type_error;
use crate::py_event::Event;
use crate::py_gil_cell::GilCell;
use std::time::Duration;
use torchmon_core::exit_gate;
use torchmon_core::registry::Registry;

/// A registered callback. `unregister_event_handler` takes it out, so that
/// it is freed then, although the registry keeps the entry itself until its
/// buffer moves (see `registry`). Reading it is a reference-count increment
/// on GIL builds; dispatch calls the callback through that new reference,
/// which keeps it alive should it unregister itself.
type Callback = GilCell<Option<Py<PyAny>>>;

static HANDLERS: Registry<Callback> = Registry::new();

/// How dispatch reaches the current list of handlers: one variant per kind
/// of build, so that neither is interleaved with the other.
///
/// On GIL builds, `HANDLERS`' current list is published as one Python
/// object, replaced with the GIL held whenever the list changes (registration
/// holds the GIL throughout, so it always matches the list). Dispatch takes
/// it with a `Py_INCREF` instead of the registry lock and an `Arc` count:
/// four atomic read-modify-writes (~40 ns here) fewer per `log_event`.
#[cfg(not(Py_GIL_DISABLED))]
mod published {
    use super::{Callback, HANDLERS};
    use crate::py_gil_cell::GilCell;
    use pyo3::prelude::*;
    use torchmon_core::registry::Snapshot;

    /// `HANDLERS`' current list as dispatch takes it.
    #[pyclass(frozen)]
    pub struct DispatchList {
        snapshot: Snapshot<Callback>,
    }

    static DISPATCH_LIST: GilCell<Option<Py<DispatchList>>> = GilCell::new(None);

    /// The handlers to call for one event, in registration order.
    pub struct Handlers {
        list: Py<DispatchList>,
    }

    /// Read as the registry's snapshot, as on free-threaded builds.
    impl std::ops::Deref for Handlers {
        type Target = Snapshot<Callback>;

        #[inline]
        fn deref(&self) -> &Snapshot<Callback> {
            &self.list.get().snapshot
        }
    }

    /// What a change replaced, to be dropped by the caller.
    pub type Republished = Option<Py<DispatchList>>;

    /// Creates the dispatch list's type at import rather than at the first
    /// registration (see `py_objects`).
    pub fn init_lazy(py: Python<'_>) {
        py.get_type::<DispatchList>();
    }

    /// The handlers registered now (`None`: there are none).
    #[inline]
    pub fn current(py: Python<'_>) -> Option<Handlers> {
        DISPATCH_LIST.get(py).map(|list| Handlers { list })
    }

    /// Publishes `HANDLERS`' current list to dispatch after it changed;
    /// returns the replaced one, to be dropped by the caller.
    ///
    /// It allocates one object, whatever the number of handlers (a change
    /// costs O(1) amortized: docs/performance.md). Allocating may run the
    /// garbage collector and with it Python code (a `__del__` that registers
    /// a handler, or a switch to another thread that does): the core's
    /// `build_current` makes it again after such a change, so the one
    /// published always matches the current list.
    pub fn publish(py: Python<'_>) -> PyResult<Republished> {
        let list = HANDLERS.build_current(|snapshot| {
            let snapshot = snapshot.clone();
            Py::new(py, DispatchList { snapshot })
        })?;
        Ok(DISPATCH_LIST.replace(py, list))
    }
}

/// On free-threaded builds dispatch takes the registry's snapshot itself
/// (there is no GIL to publish a Python object under).
#[cfg(Py_GIL_DISABLED)]
mod published {
    use super::{Callback, HANDLERS};
    use pyo3::prelude::*;
    use torchmon_core::registry::Snapshot;

    /// The handlers to call for one event, in registration order.
    pub type Handlers = Snapshot<Callback>;

    /// Nothing is published, so nothing is replaced.
    pub type Republished = ();

    pub fn init_lazy(_py: Python<'_>) {}

    /// The handlers registered now (`None`: there are none).
    #[inline]
    pub fn current(_py: Python<'_>) -> Option<Handlers> {
        HANDLERS.snapshot()
    }

    /// Dispatch reads the registry directly: nothing to publish.
    pub fn publish(_py: Python<'_>) -> PyResult<Republished> {
        Ok(())
    }
}

/// The exit gate (see `exit_gate`), closed at interpreter exit, on every
/// CPython: 3.14 parks late threads instead of ending them, but a parked
/// handler's last write is lost and its locks stay held (docs/reliability.md).
static EXIT_GATE: exit_gate::ExitGate = exit_gate::ExitGate::new();

/// How long the exiting thread waits for other threads' dispatches to end.
const EXIT_WAIT: Duration = Duration::from_secs(2);

// What dispatch reads, from this build's `published`: the handlers registered
// now (`None`: none), and the type made at import (see `py_objects`).
pub use published::{Handlers, current as current_handlers, init_lazy};

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
    let replaced = match published::publish(callback.py()) {
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
    // Should publishing fail, the old list still holds the entry, whose
    // cleared `active` flag keeps dispatch from starting it.
    let replaced = (replaced, published::publish(py)?);
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
    // Marks the dispatch as running until `_running` is dropped.
    #[cfg(not(Py_GIL_DISABLED))]
    let _running = EXIT_GATE.enter_serialised(); // dispatch holds the GIL
    #[cfg(Py_GIL_DISABLED)]
    let _running = EXIT_GATE.enter();
    let mut failures = Failures::default();
    let mut started = 0;
    for entry in handlers.iter() {
        if !entry.is_active() {
            continue;
        }
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
    EXIT_GATE.close();
    py.detach(|| EXIT_GATE.wait_idle(EXIT_WAIT))
}

/// For tests: (gate closed, dispatches running, handler calls skipped).
#[pyfunction]
pub fn _exit_gate_state() -> (bool, usize, u64) {
    EXIT_GATE.state()
}

/// For tests and diagnostics: the number of registered handlers.
#[pyfunction]
pub fn _handler_count() -> usize {
    HANDLERS.len()
}
