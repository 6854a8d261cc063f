//! `_Watchdog` and `_Section`, the native base of `torchmon.Watchdog`
//! (python/torchmon/_watchdog.py) over the core's `watchdog`: `beat`,
//! `section` and its `with` block cost what a native call costs; the hang
//! and resumption reports reach the Python subclass's callback from the
//! watchdog's thread, attached with `try_attach`.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use pyo3::exceptions::{PyOSError, PyRuntimeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

use crate::py_convert::{arg_type_error, arg_value_error};
use crate::py_stat::Stat;
use torchmon_core::watchdog::{Config, InterpreterLock, Report, Shared, Watchdog};

const CALL: &str = "Watchdog";

/// A started watchdog and its sections by name.
struct Started {
    watchdog: Watchdog,
    shared: Arc<Shared>,
    sections: Py<PyDict>,
}

/// The native part of `torchmon.Watchdog`; made unstarted, started once by
/// the subclass's `__init__` (`_start`).
#[pyclass(name = "_Watchdog", module = "torchmon._core", subclass, frozen)]
pub struct PyWatchdog {
    started: OnceLock<Started>,
}

impl PyWatchdog {
    fn started(&self) -> PyResult<&Started> {
        (self.started.get()).ok_or_else(|| PyRuntimeError::new_err("the Watchdog was not started"))
    }
}

/// The report as the subclass's callback takes it: `(kind, stalled_s,
/// timeout_s, section, dump, beats)`.
fn report_args(py: Python<'_>, report: Report) -> PyResult<Bound<'_, PyTuple>> {
    let seconds = |ms: i64| ms as f64 / 1000.0;
    match report {
        Report::Hang {
            stalled_ms,
            timeout_ms,
            section,
            dump,
            beats,
        } => {
            let dump = dump.map(|path| path.display().to_string());
            let args = ("hang", seconds(stalled_ms), seconds(timeout_ms), section);
            (
                args.0,
                args.1,
                args.2,
                args.3,
                dump.unwrap_or_default(),
                beats,
            )
                .into_pyobject(py)
        }
        Report::Resumed { stalled_ms, beats } => {
            ("resumed", seconds(stalled_ms), 0.0, "", "", beats).into_pyobject(py)
        }
    }
}

#[pymethods]
impl PyWatchdog {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> Self {
        PyWatchdog {
            started: OnceLock::new(),
        }
    }

    /// Starts the clock and the thread; the settings in seconds, checked by
    /// the core (a `ValueError` naming the argument). `callback(kind,
    /// stalled_s, timeout_s, section, dump, beats)` runs on the watchdog's
    /// thread for each hang and resumption.
    #[allow(clippy::too_many_arguments)]
    fn _start(
        &self,
        py: Python<'_>,
        min_timeout: f64,
        factor: f64,
        max_timeout: Option<f64>,
        first_timeout: Option<f64>,
        warmup_beats: u64,
        exit_code: Option<i32>,
        rank: i64,
        dump_dir: Option<PathBuf>,
        callback: Py<PyAny>,
    ) -> PyResult<()> {
        let mut config = Config::from_seconds(
            min_timeout,
            factor,
            max_timeout,
            first_timeout,
            warmup_beats,
        )
        .map_err(|invalid| arg_value_error(CALL, invalid.argument, invalid.must))?;
        config.exit_code = exit_code;
        let report = move |report: Report| {
            // `None`: the interpreter is finalizing; nobody is left to tell.
            let _ = Python::try_attach(|py| {
                let called = report_args(py, report).and_then(|args| callback.call1(py, args));
                if let Err(err) = called {
                    err.write_unraisable(py, Some(callback.bind(py)));
                }
            });
        };
        let watchdog = Watchdog::start(config, rank, dump_dir, report)
            .map_err(|err| PyOSError::new_err(format!("{CALL}: cannot start its thread: {err}")))?;
        let shared = Arc::clone(watchdog.shared());
        let started = Started {
            watchdog,
            shared,
            sections: PyDict::new(py).unbind(),
        };
        if let Err(started) = self.started.set(started) {
            py.detach(|| started.watchdog.close());
            return Err(PyRuntimeError::new_err("the Watchdog was already started"));
        }
        Ok(())
    }

    /// The section `name`'s `with` block (made once per name; its Stat by
    /// the subclass's `_section_stat(name)`).
    fn section<'py>(
        slf: &Bound<'py, Self>,
        name: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let name = name
            .cast::<PyString>()
            .map_err(|_| arg_type_error("Watchdog.section", "name", "a str", name))?;
        let started = slf.get().started()?;
        let sections = started.sections.bind(slf.py());
        if let Some(section) = sections.get_item(name)? {
            return Ok(section);
        }
        let stat = slf.call_method1("_section_stat", (name,))?;
        let stat = stat.cast_into::<Stat>()?.unbind();
        let index = started.shared.sections().index(name.to_str()?);
        let section = Bound::new(
            slf.py(),
            PySection {
                shared: Arc::clone(&started.shared),
                index,
                stat,
            },
        )?;
        sections.set_item(name, &section)?;
        Ok(section.into_any())
    }

    /// The sections made so far, by name (a copy).
    fn _sections<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.started()?.sections.bind(py).copy()
    }

    fn _pause(&self) -> PyResult<()> {
        self.started()?.shared.pause();
        Ok(())
    }

    fn _resume(&self) -> PyResult<()> {
        self.started()?.shared.resume();
        Ok(())
    }

    /// Stops the thread (a report in progress finishes first); idempotent.
    fn _stop(&self, py: Python<'_>) {
        if let Some(started) = self.started.get() {
            py.detach(|| started.watchdog.close());
        }
    }

    #[getter]
    fn beats(&self) -> u64 {
        self.started
            .get()
            .map_or(0, |started| started.shared.beats())
    }

    /// The timeout now, in seconds.
    #[getter]
    fn timeout(&self) -> PyResult<f64> {
        Ok(self.started()?.shared.timeout_ms() as f64 / 1000.0)
    }

    /// Seconds since the last beat, the start or a pause's end (0 while
    /// paused).
    #[getter]
    fn seconds_since_beat(&self) -> PyResult<f64> {
        Ok(self.started()?.shared.stalled_ms() as f64 / 1000.0)
    }

    #[getter]
    fn closed(&self) -> bool {
        self.started
            .get()
            .is_some_and(|started| started.watchdog.is_closed())
    }

    /// The open section's name ("" if none).
    #[getter]
    fn _open_section(&self) -> PyResult<String> {
        Ok(self.started()?.shared.open_section())
    }
}

/// A section's `with` block: its time added to the Stat `section.<name>`.
/// One per name, used by every thread: the core times it per thread.
#[pyclass(name = "_Section", module = "torchmon", frozen)]
pub struct PySection {
    shared: Arc<Shared>,
    index: u32,
    stat: Py<Stat>,
}

#[pymethods]
impl PySection {
    fn __enter__(&self) {
        self.shared.sections().enter(self.index);
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _type: &Bound<'_, PyAny>,
        _value: &Bound<'_, PyAny>,
        _traceback: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        // Not open on this thread (an `__exit__` on another thread than its
        // `__enter__`): no time to record.
        if let Some(seconds) = self.shared.sections().exit(self.index) {
            let stat = self.stat.get();
            stat.emit_closed(py, &stat.record(seconds))?;
        }
        Ok(false)
    }

    /// The section's Stat (`section.<name>`).
    #[getter]
    fn stat(&self, py: Python<'_>) -> Py<Stat> {
        self.stat.clone_ref(py)
    }
}

/// Dumps go through faulthandler, registered by the package for `signal` on
/// `fd` (every thread), just now; they hold the GIL when they can get it
/// (`attach_gil`, `release_gil`).
#[pyfunction]
pub fn _set_stack_dumper(signal: i32, fd: i32) -> PyResult<()> {
    let lock = InterpreterLock {
        attach: attach_gil,
        release: release_gil,
    };
    torchmon_core::watchdog::set_stack_dumper(signal, fd, Some(lock)).map_err(PyErr::from)
}

/// The core's `InterpreterLock::attach`: runs `body` on the calling thread
/// (the watchdog's GIL helper) attached; false when the interpreter is
/// finalizing (`try_attach`).
fn attach_gil(body: &mut dyn FnMut()) -> bool {
    Python::try_attach(|_py| body()).is_some()
}

/// The core's `InterpreterLock::release`: `f` with the GIL released.
fn release_gil(f: &mut (dyn FnMut() + Send)) {
    // SAFETY: the core calls `release` only inside `attach`'s body, on the
    // thread `attach_gil` attached (stack_dump.rs, `InterpreterLock`), so
    // this thread is attached now.
    let py = unsafe { Python::assume_attached() };
    py.detach(f);
}

/// Whether a handler other than the default is installed for `signal`, in
/// C or in Python.
#[pyfunction]
pub fn _signal_is_taken(signal: i32) -> bool {
    torchmon_core::watchdog::signal_is_taken(signal)
}

/// Installs `_Watchdog.beat`: a `METH_NOARGS` function of its own rather
/// than a PyO3 method, whose trampoline cost as much as the beat itself
/// (benches/bench_watchdog.py: 23 ns against `math.fabs`'s 14 ns before).
pub fn install_beat(py: Python<'_>) -> PyResult<()> {
    let def = Box::into_raw(Box::new(ffi::PyMethodDef {
        ml_name: c"beat".as_ptr(),
        ml_meth: ffi::PyMethodDefPointer {
            PyCFunction: watchdog_beat,
        },
        ml_flags: ffi::METH_NOARGS,
        ml_doc: c"beat($self, /)\n--\n\nOne step done.".as_ptr(),
    }));
    let watchdog_type = py.get_type::<PyWatchdog>();
    // SAFETY: `watchdog_type` is a live type object (kept alive by the
    // module) and `def` a leaked, hence 'static and never moved,
    // PyMethodDef; PyDescr_NewMethod returns a new reference or NULL with an
    // exception set, which `from_owned_ptr_or_err` turns into an error.
    let descriptor = unsafe {
        Bound::from_owned_ptr_or_err(py, ffi::PyDescr_NewMethod(watchdog_type.as_type_ptr(), def))?
    };
    watchdog_type.setattr("beat", descriptor)
}

/// `_Watchdog.beat()`: nothing in it can fail or panic (a `OnceLock` read,
/// then loads and stores of atomics).
unsafe extern "C" fn watchdog_beat(
    slf: *mut ffi::PyObject,
    _no_args: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls this method with the calling thread attached
    // (holding the GIL on GIL builds), and `slf` is a borrowed reference
    // valid for the call.
    let py = unsafe { Python::assume_attached() };
    // SAFETY: as above.
    let slf = unsafe { Borrowed::from_ptr(py, slf) };
    // SAFETY: `slf` is a `_Watchdog` or an instance of a subclass (whose
    // layout starts with `_Watchdog`'s): CPython calls a method
    // descriptor's function only after checking that `self` is an instance
    // of the descriptor's type (`descr_check` in Objects/descrobject.c).
    let watchdog = unsafe { slf.cast_unchecked::<PyWatchdog>() };
    if let Some(started) = watchdog.get().started.get() {
        started.shared.beat();
    }
    py.None().into_ptr()
}
