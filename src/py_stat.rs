//! `Stat`: the binding around `stat::Stat`, emitting closed windows as Events.

use pyo3::buffer::{Element, ElementType, PyUntypedBuffer};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use crate::py_aggregation::PyAggregation;
use crate::py_clock::{TIMEDELTA_MAX_MS, WindowRule, window_arg, window_ms};
use crate::py_convert::{
    Surrogates, arg_type_error, arg_value_error, sample, string_arg, type_name,
};
use crate::py_lifecycle::WindowOwner;
use crate::py_registry::{Failures, current_handlers};
use crate::py_window_event::dispatch_window_event;
use torchmon_core::aggregation::Aggregation;
use torchmon_core::stat::{Closed, MAX_NAME_CHARS, Stat as CoreStat, WindowStats, live};

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
            let context = PyString::new(
                py,
                &format!("torchmon.Stat({}) {context}", self.name.bind(py)),
            );
            err.write_unraisable(py, Some(context.as_any()));
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

/// `max_samples`: an int in int64 range, or what pybind11's int64 caster
/// converts (`__index__`, or `__int__` as for `Decimal`), but never a float,
/// a str or None.
fn max_samples_arg(value: &Bound<'_, PyAny>) -> PyResult<i64> {
    let py = value.py();
    let type_error = || arg_type_error("Stat", "max_samples", "an int in the int64 range", value);
    if value.is_instance_of::<PyBool>() {
        return Ok(i64::from(value.is_truthy()?));
    }
    if value.is_none()
        || value.is_instance_of::<PyFloat>()
        || value.is_instance_of::<PyString>()
        || value.is_instance_of::<pyo3::types::PyBytes>()
    {
        return Err(type_error());
    }
    let integer = if value.is_instance_of::<PyInt>() {
        value.clone()
    } else {
        value
            .call_method0(crate::py_convert::INDEX.get(py))
            .or_else(|_| value.call_method0(crate::py_convert::INT.get(py)))
            .map_err(|_| type_error())?
    };
    integer.extract::<i64>().map_err(|_| {
        PyTypeError::new_err(format!(
            "Stat(max_samples): max_samples must be in the int64 range, got {}",
            integer.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    })
}

/// The `max_samples` argument as passed, or `None` when omitted: an explicit
/// `None` is a TypeError (as torch), checked in argument order by the body.
pub struct MaxSamplesArg(Option<Py<PyAny>>);

impl<'a, 'py> FromPyObject<'a, 'py> for MaxSamplesArg {
    type Error = PyErr;

    fn extract(obj: pyo3::Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(MaxSamplesArg(Some(obj.to_owned().unbind())))
    }
}

fn aggregations_arg(value: &Bound<'_, PyAny>) -> PyResult<Vec<Aggregation>> {
    let items = value
        .try_iter()
        .map_err(|_| arg_type_error("Stat", "aggregations", "an iterable of Aggregation", value))?;
    let mut aggregations = Vec::new();
    for item in items {
        let item = item?;
        let member = item.cast::<PyAggregation>().map_err(|_| {
            PyTypeError::new_err(format!(
                "Stat(aggregations): every item must be an Aggregation, not {} ({})",
                type_name(&item),
                item.repr().map(|r| r.to_string()).unwrap_or_default()
            ))
        })?;
        let aggregation = member.get().core();
        if !aggregations.contains(&aggregation) {
            aggregations.push(aggregation);
        }
    }
    Ok(aggregations)
}

/// Type phase of the name check: str (UTF-8 encodable), bytes or bytearray.
fn check_name_type(value: &Bound<'_, PyAny>) -> PyResult<()> {
    match crate::py_convert::try_string(value, "Stat(name): name", Surrogates::TypeError) {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(arg_type_error(
            "Stat",
            "name",
            "a str (or UTF-8 bytes)",
            value,
        )),
        // Invalid UTF-8 bytes are a value error, reported in the value phase.
        Err(err) if err.is_instance_of::<PyValueError>(value.py()) => Ok(()),
        Err(err) => Err(err),
    }
}

#[pymethods]
impl Stat {
    #[new]
    #[pyo3(
        signature = (name, aggregations, window_size, max_samples = MaxSamplesArg(None)),
        text_signature = "(name, aggregations, window_size, max_samples=9223372036854775807)"
    )]
    fn new(
        py: Python<'_>,
        name: &Bound<'_, PyAny>,
        aggregations: &Bound<'_, PyAny>,
        window_size: &Bound<'_, PyAny>,
        max_samples: MaxSamplesArg,
    ) -> PyResult<Self> {
        // Every argument's type first, in order, then the values (as torch,
        // whose binding converts all arguments before the constructor runs).
        check_name_type(name)?;
        let aggregations = aggregations_arg(aggregations)?;
        let window = window_arg("Stat", "window_size", window_size, WindowRule::Torch)?;
        let max_samples = match &max_samples.0 {
            None => i64::MAX,
            Some(value) => max_samples_arg(value.bind(py))?,
        };
        let name = string_arg(name, "Stat(name): name", Surrogates::TypeError)?;
        let length = name.len()?;
        if length > MAX_NAME_CHARS {
            return Err(arg_value_error(
                "Stat",
                "name",
                format_args!(
                    "must be at most {MAX_NAME_CHARS} characters (the sinks' metric \
                     names are made from it), got {length}"
                ),
            ));
        }
        let window_ms = window_ms("Stat", "window_size", window, WindowRule::Torch)?;

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

/// torch.Tensor and the functions of torchmon._tensors that record tensors,
/// set once torch is imported (docs/guide.md, "Recording tensors and
/// torch.compile").
struct TensorSupport {
    tensor_type: Py<PyAny>,
    add: Py<PyAny>,
    add_many: Py<PyAny>,
}

static TENSOR_SUPPORT: PyOnceLock<TensorSupport> = PyOnceLock::new();

/// The tensor handlers when `v` is a torch tensor.
fn tensor_support<'a>(py: Python<'a>, v: &Bound<'_, PyAny>) -> PyResult<Option<&'a TensorSupport>> {
    match TENSOR_SUPPORT.get(py) {
        Some(support) if v.is_instance(support.tensor_type.bind(py))? => Ok(Some(support)),
        _ => Ok(None),
    }
}

/// Called once by torchmon._tensors when torch is imported: from then on
/// `Stat.add` and `Stat.add_many` hand tensors to `add` / `add_many`
/// (called with the Stat and the tensor). Later calls change nothing.
#[pyfunction]
pub fn _install_tensor_support(
    py: Python<'_>,
    tensor_type: Py<PyAny>,
    add: Py<PyAny>,
    add_many: Py<PyAny>,
) -> bool {
    // `set`, not `get_or_init`, which detaches from the GIL (py_objects).
    TENSOR_SUPPORT
        .set(
            py,
            TensorSupport {
                tensor_type,
                add,
                add_many,
            },
        )
        .is_ok()
}

/// The Python Stats of `live_ids`, in order (None for one no longer alive),
/// looked up under one lock in the core's list of live Stats.
pub(crate) fn live_stats(live_ids: impl Iterator<Item = u64>) -> Vec<Option<Arc<StatShared>>> {
    live::find(live_ids)
        .into_iter()
        .map(|stat| stat?.owner::<StatShared>())
        .collect()
}

fn live_stat(live_id: u64) -> Option<Arc<StatShared>> {
    live::get(live_id)?.owner::<StatShared>()
}

/// Adds `values` to the live Stat `live_id`, the value `values[i]` at the
/// clock reading `times_ms[i]` (or all now when `times_ms` is None), in
/// order; a Stat that no longer lives records nothing. What a compiled graph
/// and the deferred reads of device tensors call (torchmon._tensors).
/// Returns whether the Stat lives.
#[pyfunction]
#[pyo3(signature = (live_id, values, times_ms = None))]
pub fn _stat_add_by_id(
    py: Python<'_>,
    live_id: u64,
    values: Vec<f64>,
    times_ms: Option<Vec<i64>>,
) -> PyResult<bool> {
    let Some(stat) = live_stat(live_id) else {
        return Ok(false);
    };
    let mut failures = Failures::default();
    let mut emit = |closed: Closed| stat.emit_into(py, &closed, &mut failures);
    match times_ms {
        None => emit(stat.core.add_many_at(
            values.len(),
            |index| values[index],
            stat.core.now_ms(),
        )),
        Some(times) => {
            if times.len() != values.len() {
                return Err(PyValueError::new_err(format!(
                    "_stat_add_by_id: {} values but {} times",
                    values.len(),
                    times.len()
                )));
            }
            for (&value, &now_ms) in values.iter().zip(&times) {
                emit(stat.core.add_at(value, now_ms));
            }
        }
    }
    failures.into_result().map(|()| true)
}

/// The clock reading the Stat `live_id` measures its windows on now, and the
/// id of the window it falls in; None when the Stat no longer lives.
#[pyfunction]
pub fn _stat_window_now(live_id: u64) -> Option<(i64, i64)> {
    let stat = live_stat(live_id)?;
    let now_ms = stat.core.now_ms();
    Some((now_ms, stat.core.window_id(now_ms)))
}

/// `add_many` over a buffer whose items it can read as numbers; `None` for
/// other item types (bool, float16, structs, big-endian), which are iterated.
fn add_buffer(
    core: &CoreStat,
    py: Python<'_>,
    buffer: &PyUntypedBuffer,
) -> PyResult<Option<Closed>> {
    if buffer.dimensions() != 1 {
        return Err(arg_value_error(
            "Stat.add_many",
            "values",
            format_args!(
                "must be one-dimensional, not a {}-dimensional buffer",
                buffer.dimensions()
            ),
        ));
    }
    if !native_byte_order(buffer.format().to_bytes()) {
        return Ok(None);
    }
    let now = core.now_ms();
    match ElementType::from_format(buffer.format()) {
        ElementType::Float { bytes: 8 } => add_typed::<f64>(core, py, buffer, now),
        ElementType::Float { bytes: 4 } => add_typed::<f32>(core, py, buffer, now),
        ElementType::SignedInteger { bytes: 8 } => {
            // Rounded to nearest, ties to even: what float(int) does.
            add_typed::<i64>(core, py, buffer, now)
        }
        ElementType::SignedInteger { bytes: 4 } => add_typed::<i32>(core, py, buffer, now),
        ElementType::SignedInteger { bytes: 2 } => add_typed::<i16>(core, py, buffer, now),
        ElementType::SignedInteger { bytes: 1 } => add_typed::<i8>(core, py, buffer, now),
        ElementType::UnsignedInteger { bytes: 8 } => add_typed::<u64>(core, py, buffer, now),
        ElementType::UnsignedInteger { bytes: 4 } => add_typed::<u32>(core, py, buffer, now),
        ElementType::UnsignedInteger { bytes: 2 } => add_typed::<u16>(core, py, buffer, now),
        ElementType::UnsignedInteger { bytes: 1 } => add_typed::<u8>(core, py, buffer, now),
        _ => Ok(None),
    }
}

/// Whether a struct-module format's items are in this machine's byte order.
/// Checked here because PyO3 0.30.1's own check (`Element::is_compatible_format`)
/// takes `>` for native on little-endian machines and would read big-endian
/// data as if it were native.
fn native_byte_order(format: &[u8]) -> bool {
    match format.first() {
        Some(b'@' | b'=') => true,
        Some(b'<') => cfg!(target_endian = "little"),
        Some(b'>' | b'!') => cfg!(target_endian = "big"),
        _ => true,
    }
}

/// A buffer item type `add_many` reads, and its conversion to a sample.
trait BufferItem: Element + Copy {
    fn to_f64(self) -> f64;
}

macro_rules! lossless_items {
    ($($t:ty),*) => {$(
        impl BufferItem for $t {
            #[inline(always)]
            fn to_f64(self) -> f64 {
                f64::from(self)
            }
        }
    )*};
}
lossless_items!(f64, f32, i32, i16, i8, u32, u16, u8);

impl BufferItem for i64 {
    #[inline(always)]
    fn to_f64(self) -> f64 {
        // Rounded to nearest, ties to even: what float(int) does.
        self as f64
    }
}

impl BufferItem for u64 {
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
}

/// Reads the buffer as `T` (in place when C-contiguous, else through a copy);
/// `None` when its format is not exactly `T` (e.g. byte-swapped).
fn add_typed<T: BufferItem>(
    core: &CoreStat,
    py: Python<'_>,
    buffer: &PyUntypedBuffer,
    now: i64,
) -> PyResult<Option<Closed>> {
    let Ok(typed) = buffer.as_typed::<T>() else {
        return Ok(None);
    };
    // Free-threaded builds always copy (in C, PyBuffer_ToContiguous): a
    // Python thread may write the buffer while it is read.
    let in_place = typed
        .as_slice_ptr()
        .filter(|items| cfg!(not(Py_GIL_DISABLED)) && items.cast::<T>().as_ptr().is_aligned());
    let closed = match in_place {
        Some(items) if items.is_empty() => Closed::default(),
        Some(items) => {
            let (first, len) = (items.cast::<T>().as_ptr().cast_const(), items.len());
            let read = |index: usize| {
                let index = index.min(len - 1);
                // SAFETY: `first` points at `len > 0` items of `T` (as the
                // exporter described them; `as_typed` checked the format and
                // item size), C-contiguous, aligned (checked above), valid
                // and in place until `buffer` is released after this function
                // returns (PEP 3118's contract), and `index < len` (clamped
                // above). Every bit pattern is a valid `T`. No writer runs
                // meanwhile: we hold the GIL (a GIL build, see above), which
                // excludes every Python-level writer; a native thread writing
                // the buffer without the GIL would race with every consumer
                // of the buffer protocol (numpy's own reductions included),
                // and is outside what any reader can exclude. The read is
                // volatile so the compiler does not merge or reorder it.
                unsafe { first.add(index).read_volatile() }
            };
            core.add_many_at(len, |index| read(index).to_f64(), now)
        }
        None => {
            let copy = typed.to_vec(py)?;
            core.add_many_at(copy.len(), |index| copy[index].to_f64(), now)
        }
    };
    Ok(Some(closed))
}

/// `add_many` over any iterable: every value is converted first, so that a
/// bad one adds nothing.
fn add_iterable(core: &CoreStat, values: &Bound<'_, PyAny>) -> PyResult<Closed> {
    let iterator = values.try_iter().map_err(|_| {
        arg_type_error(
            "Stat.add_many",
            "values",
            "a buffer or an iterable of real numbers",
            values,
        )
    })?;
    // `len()` is only a hint: a hostile `__len__` (10**12) would make the
    // reservation abort the process (tests/robustness/test_hostile_input.py).
    const RESERVE_AT_MOST: usize = 1 << 16;
    let mut samples = Vec::with_capacity(values.len().unwrap_or(0).min(RESERVE_AT_MOST));
    for (index, value) in iterator.enumerate() {
        let value = value?;
        let converted = sample(&value).map_err(|err| {
            err.into_error(&value, &format!("Stat.add_many(values): values[{index}]"))
        })?;
        samples.push(converted);
    }
    Ok(core.add_many_at(samples.len(), |index| samples[index], core.now_ms()))
}
