//! `Stat`: the binding around `stat::Stat`, emitting closed windows as Events,
//! and `WindowOwner`, what emits a live core Stat's window. Its arguments
//! are checked in `py_stat_args`, `add_many`'s values read in `py_add_many`,
//! tensors recognised in `py_convert` and recorded by id in `py_compiled`.

use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use crate::py_add_many::{add_buffer, add_iterable};
use crate::py_aggregation::PyAggregation;
use crate::py_clock::TIMEDELTA_MAX_MS;
use crate::py_convert::{Given, sample, tensor_support};
use crate::py_registry::{Failures, current_handlers};
use crate::py_stat_args::{StatArgs, stat_args};
use crate::py_window_event::dispatch_window_event;
use torchmon_core::aggregation::Aggregation;
use torchmon_core::stat::{Closed, Stat as CoreStat, WindowStats};

/// What a live Stat's window is emitted by: the Python object that owns it
/// (a `Stat`, or a torch wait counter in `py_torch_wait_counters`), found
/// through the core's list of live Stats by `py_lifecycle`.
pub(crate) trait WindowOwner {
    fn emit_window(&self, py: Python<'_>, window: &WindowStats) -> PyResult<()>;
    /// The Stat's name, for the context of a handler's error.
    fn name<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny>;
}

/// One configured aggregation, with its Python member and event key made once.
struct Output {
    aggregation: Aggregation,
    member: Py<PyAggregation>,
    key: Py<PyString>,
}

pub struct StatShared {
    core: Arc<CoreStat>,
    name: Py<PyString>,
    outputs: Vec<Output>,
    max_samples: i64,
}

/// Set once the exit flush ran: later destructions must not call into a
/// finalizing interpreter.
static AT_EXIT: AtomicBool = AtomicBool::new(false);

/// Called by the exit step once every open window was emitted.
pub(crate) fn mark_exited() {
    AT_EXIT.store(true, Ordering::Release);
}

impl StatShared {
    pub(crate) fn core(&self) -> &CoreStat {
        &self.core
    }

    /// Adds `values` at one clock reading, in order, as that many `add`
    /// calls would; returns the windows this closed.
    pub(crate) fn add_values_now(&self, values: &[f64]) -> Closed {
        let now_ms = self.core.now_ms();
        match values {
            // The path of a float add (add_many_at locks); serialized by the
            // GIL, as in `Stat::record`.
            #[cfg(not(Py_GIL_DISABLED))]
            [value] => self.core.add_at_serialized(*value, now_ms),
            #[cfg(Py_GIL_DISABLED)]
            [value] => self.core.add_at(*value, now_ms),
            _ => self
                .core
                .add_many_at(values.len(), |index| values[index], now_ms),
        }
    }

    /// Emits the windows an add closed, adding a handler's error to
    /// `failures`.
    pub(crate) fn emit_into(&self, py: Python<'_>, closed: &Closed, failures: &mut Failures) {
        if !closed.is_empty()
            && let Err(err) = self.emit(py, closed)
        {
            failures.add(py, err, self.name.bind(py).as_any());
        }
    }

    /// Emits the windows one call closed. Their handlers' errors are one
    /// dispatch's: the same `Failures` rule picks the one raised, so a
    /// KeyboardInterrupt from a later window is not lost behind an ordinary
    /// error from an earlier one (docs/reliability.md).
    fn emit(&self, py: Python<'_>, closed: &Closed) -> PyResult<()> {
        let mut failures = Failures::default();
        for window in closed.iter() {
            if let Err(err) = self.emit_window(py, window) {
                failures.add(py, err, self.name.bind(py).as_any());
            }
        }
        failures.into_result()
    }

    /// Emits the open window, reporting handler errors as unraisable
    /// (there is no caller to raise them to).
    fn flush_unraisable(&self, py: Python<'_>, context: &str) {
        if let Some(window) = self.core.flush()
            && let Err(err) = self.emit_window(py, &window)
        {
            let context = format!("torchmon.Stat({}) {context}", self.name.bind(py));
            crate::py_convert::write_unraisable(py, err, &context);
        }
    }
}

impl WindowOwner for StatShared {
    /// Dispatches one closed window as a `torch.monitor.Stat` event.
    fn emit_window(&self, py: Python<'_>, window: &WindowStats) -> PyResult<()> {
        let Some(handlers) = current_handlers(py) else {
            return Ok(());
        };
        let data = PyDict::new(py);
        for output in &self.outputs {
            data.set_item(output.key.bind(py), window.get(output.aggregation))?;
        }
        dispatch_window_event(py, &handlers, data, window)
    }

    fn name<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        self.name.bind(py).clone().into_any()
    }
}

/// Windowed aggregation of float samples; each closed window is logged as
/// a `torch.monitor.Stat` event.
#[pyclass(name = "Stat", module = "torchmon", frozen)]
pub struct Stat {
    shared: Arc<StatShared>,
    /// `shared.core`, one pointer less on `add`'s path.
    core: Arc<CoreStat>,
}

impl Stat {
    /// `Stat.add(v)`'s body after the float fast path; its entry point is
    /// `py_entry_points::stat_add`. A torch tensor goes to torchmon._tensors
    /// (only once torch was imported, and after the float path, which stays
    /// untouched).
    pub(crate) fn add_value(
        slf: &Bound<'_, Stat>,
        py: Python<'_>,
        v: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        if let Some(support) = tensor_support(py, v)? {
            support.add.bind(py).call1((slf, v))?;
            return Ok(());
        }
        let value = sample(v).map_err(|err| err.into_error(v, "Stat.add(v): v"))?;
        let this = slf.get();
        let closed = this.record(value);
        this.emit_closed(py, &closed)
    }

    /// Adds one sample to the core; returns the windows it closed.
    #[inline]
    pub(crate) fn record(&self, value: f64) -> Closed {
        // On GIL builds the GIL serialises every call on every Stat (no
        // binding releases it while touching one), which is the guarantee
        // `add_serialized` asks for; free-threaded builds take the lock-free
        // path.
        #[cfg(not(Py_GIL_DISABLED))]
        let closed = self.core.add_serialized(value);
        #[cfg(Py_GIL_DISABLED)]
        let closed = self.core.add(value);
        closed
    }

    /// Emits the windows an add closed, as `torch.monitor.Stat` events.
    pub(crate) fn emit_closed(&self, py: Python<'_>, closed: &Closed) -> PyResult<()> {
        if closed.is_empty() {
            return Ok(());
        }
        self.shared.emit(py, closed)
    }
}

#[pymethods]
impl Stat {
    #[new]
    #[pyo3(
        signature = (name, aggregations, window_size, max_samples = Given(None)),
        text_signature = "(name, aggregations, window_size, max_samples=9223372036854775807)"
    )]
    fn new(
        py: Python<'_>,
        name: &Bound<'_, PyAny>,
        aggregations: &Bound<'_, PyAny>,
        window_size: &Bound<'_, PyAny>,
        max_samples: Given,
    ) -> PyResult<Self> {
        let StatArgs {
            name,
            aggregations,
            window_ms,
            max_samples,
        } = stat_args(name, aggregations, window_size, &max_samples)?;
        let outputs = aggregations
            .iter()
            .map(|&aggregation| {
                Ok(Output {
                    aggregation,
                    member: PyAggregation::member(py, aggregation)?.unbind(),
                    key: PyString::new(py, &format!("{}.{}", name, aggregation.key_suffix()))
                        .unbind(),
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let core = CoreStat::new(&aggregations, window_ms, max_samples);
        let shared = Arc::new(StatShared {
            core: Arc::clone(&core),
            name: name.unbind(),
            outputs,
            max_samples,
        });
        // The core's list of live Stats finds the Python side through this
        // (exit flush, flush(), compiled graphs naming the Stat by id).
        let owner: Weak<StatShared> = Arc::downgrade(&shared);
        core.set_owner(owner);
        Ok(Stat { shared, core })
    }

    /// Adds every value of `values` in order, at one instant: the same
    /// result as calling `add` on each (see docs/performance.md). `values` is
    /// a one-dimensional buffer of float64/float32 or (un)signed integers,
    /// read in place, or any iterable of numbers. Nothing is added when one
    /// of the values is not a number.
    fn add_many(slf: &Bound<'_, Self>, py: Python<'_>, values: &Bound<'_, PyAny>) -> PyResult<()> {
        let core = &slf.get().shared.core;
        let closed = match PyUntypedBuffer::get(values) {
            Ok(buffer) => match add_buffer(core, py, &buffer)? {
                Some(closed) => closed,
                None => add_iterable(core, values)?,
            },
            // A torch tensor has no buffer interface: checked here, off the
            // buffer path.
            Err(_) => match tensor_support(py, values)? {
                Some(support) => {
                    support.add_many.bind(py).call1((slf, values))?;
                    return Ok(());
                }
                None => add_iterable(core, values)?,
            },
        };
        if closed.is_empty() {
            return Ok(());
        }
        slf.get().shared.emit(py, &closed)
    }

    /// A number that identifies this Stat for the life of the process (never
    /// reused), by which a compiled graph records into it without keeping
    /// it alive (torchmon._tensors).
    #[getter]
    fn _live_id(&self) -> u64 {
        self.core.id()
    }

    /// The last closed window: `{Aggregation: float}`.
    fn get<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let window = self.shared.core.last_closed();
        let result = PyDict::new(py);
        for output in &self.shared.outputs {
            result.set_item(output.member.bind(py), window.get(output.aggregation))?;
        }
        Ok(result)
    }

    /// Closes the open window now if it holds samples (as `flush()` does,
    /// without ending it), emits it, and returns its event data, or None:
    /// the watchdog's report cuts its section windows at each interval.
    fn _flush_window<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(window) = self.core.flush() else {
            return Ok(None);
        };
        self.shared.emit_window(py, &window)?;
        let data = PyDict::new(py);
        for output in &self.shared.outputs {
            data.set_item(output.key.bind(py), window.get(output.aggregation))?;
        }
        Ok(Some(data))
    }

    /// Samples in the open window.
    #[getter]
    fn count(&self) -> u64 {
        self.shared.core.count()
    }

    #[getter]
    fn name(&self, py: Python<'_>) -> Py<PyString> {
        self.shared.name.clone_ref(py)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let members = PyList::new(py, self.shared.outputs.iter().map(|o| o.member.bind(py)))?;
        let max_samples = if self.shared.max_samples == i64::MAX {
            String::new()
        } else {
            format!(", max_samples={}", self.shared.max_samples)
        };
        let window_ms = self.shared.core.window_ms();
        let window_size = if window_ms <= TIMEDELTA_MAX_MS {
            crate::py_objects::timedelta_type(py)?
                .call1((0, 0, 0, window_ms))?
                .repr()?
                .to_string()
        } else {
            // Longer than a timedelta holds (the constructor takes such
            // windows as float seconds): exact seconds, as a float literal.
            format!("{}.{:03}", window_ms / 1000, window_ms % 1000)
        };
        Ok(format!(
            "torchmon.Stat(name={}, aggregations={}, window_size={}{}, count={})",
            self.shared.name.bind(py).repr()?,
            members.str()?,
            window_size,
            max_samples,
            self.shared.core.count()
        ))
    }
}

impl Drop for Stat {
    fn drop(&mut self) {
        if AT_EXIT.load(Ordering::Acquire) || self.shared.core.count() == 0 {
            return;
        }
        Python::attach(|py| {
            self.shared
                .flush_unraisable(py, "flushing its window on destruction")
        });
    }
}
