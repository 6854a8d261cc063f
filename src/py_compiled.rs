//! Where the values a `torch.compile` graph staged go (torchmon._compiled):
//! the module attribute store that dynamo replays after each graph run, and
//! the recording of its CPU tensors (docs/internals.md, "Tensors in compiled
//! graphs"); and the adds by a Stat's id that torchmon._tensors makes for
//! compiled graphs and for the deferred reads of device tensors.
//!
//! The store is the class `__setattr__` of `torchmon._compiled`'s module, a
//! builtin: CPython calls a builtin found on the type with `(name, value)`
//! (it binds no `self`), and no Python frame runs, so dynamo's frame hook,
//! still set while the compiled frame replays its stores, has nothing to
//! compile until a handler is called, and handlers are called with the hook
//! off.

use parking_lot::Mutex;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyString, PyTuple};
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::py_registry::Failures;
use crate::py_stat::StatShared;
use torchmon_core::recent::Recent;
use torchmon_core::stat::Closed;
use torchmon_core::stat::live::{self, Segments, segment_ranges};

/// What the store needs from torch and torchmon's Python side, set once
/// the compile support is installed (torchmon._tensors).
struct StagingStore {
    /// torchmon._compiled, whose other attributes are stored as usual.
    module: Py<PyAny>,
    /// `types.ModuleType.__setattr__`.
    generic_setattr: Py<PyAny>,
    /// `torch._C._dynamo.eval_frame.set_eval_frame`.
    set_eval_frame: Py<PyAny>,
    /// `_tensors.record_staged_outside_dynamo`: entries whose tensors are on
    /// another device, and every entry while CPU tensors are not read at the
    /// call.
    record_in_python: Py<PyAny>,
    staged_name: Py<PyString>,
}

static STORE: PyOnceLock<StagingStore> = PyOnceLock::new();

/// Whether CPU tensors are read at the call; cleared only by the tests, to
/// run the deferred reads of other devices on CPU tensors
/// (`torchmon._tensors.set_read_cpu_at_call`, which sets its own copy too).
static READ_CPU_AT_CALL: AtomicBool = AtomicBool::new(true);

#[pyfunction]
pub fn _set_read_cpu_at_call(read: bool) {
    READ_CPU_AT_CALL.store(read, Ordering::Relaxed);
}

/// Called once by torchmon._tensors when torch._dynamo is imported, before it
/// makes `_staging_store` the module's `__setattr__`. Later calls change
/// nothing; returns whether this one installed.
#[pyfunction]
pub fn _install_staging_store(
    py: Python<'_>,
    module: Py<PyAny>,
    generic_setattr: Py<PyAny>,
    set_eval_frame: Py<PyAny>,
    record_in_python: Py<PyAny>,
) -> bool {
    // `set`, not `get_or_init`, which detaches from the GIL (py_objects).
    STORE
        .set(
            py,
            StagingStore {
                module,
                generic_setattr,
                set_eval_frame,
                record_in_python,
                staged_name: PyString::intern(py, "_staged").unbind(),
            },
        )
        .is_ok()
}

/// `setattr(torchmon._compiled, name, value)`: the replayed store of a graph
/// run (`_staged` set to its entries) records them, in call order, as eager
/// adds made now, and leaves `_staged` None, the value the next trace reads
/// and compiled graphs guard on; any other store is an ordinary one.
#[pyfunction]
pub fn _staging_store(
    py: Python<'_>,
    name: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let Some(store) = STORE.get(py) else {
        return Err(PyRuntimeError::new_err(
            "torchmon._compiled: the staging store is not installed",
        ));
    };
    let staged_name = store.staged_name.bind(py);
    // The replayed store names the attribute with the code's interned string.
    let is_staged = name.is(staged_name) || name.eq(staged_name)?;
    let staged = match value.cast::<PyTuple>() {
        Ok(staged) if is_staged => staged,
        _ => {
            let args = (store.module.bind(py), name, value);
            store.generic_setattr.bind(py).call1(args)?;
            return Ok(());
        }
    };
    if !READ_CPU_AT_CALL.load(Ordering::Relaxed) {
        store.record_in_python.bind(py).call1((staged,))?;
        return Ok(());
    }
    let elsewhere = record_cpu_entries(py, staged, Some(store.set_eval_frame.bind(py)))?;
    if !elsewhere.is_empty() {
        let entries = PyTuple::new(py, elsewhere)?;
        store.record_in_python.bind(py).call1((entries,))?;
    }
    Ok(())
}

/// Records the CPU tensors of `staged`, what one run of a compiled graph
/// staged (torchmon._compiled), as adds made now, in order: entries
/// `(segments, tensor, on_cpu)` (or `(segments, tensor)`, whose device is
/// then read), where `segments` is `((live_id, length), ...)` and the
/// tensor's first values go `length` by `length` to those Stats (values past
/// the segments are the unused end of a staging buffer). Returns the entries
/// whose tensors are on another device, for the deferred reads.
/// torchmon._tensors calls it for what a store left in the module.
#[pyfunction]
pub fn _record_cpu_tensors<'py>(
    py: Python<'py>,
    staged: &Bound<'py, PyTuple>,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    record_cpu_entries(py, staged, None)
}

/// The Stats and lengths of a graph's `segments` tuple, parsed once: the
/// tuple is a constant of the replayed code, the same object at every run;
/// kept alive by the parse, so that its address, the key, is not reused.
type ParsedSegments = Segments<StatShared, Py<PyTuple>>;

/// How many graphs' segments stay parsed; a program that runs more
/// parses again (a tuple's parse is ~30 ns a segment, its lookup 1-2 ns).
const PARSED_SEGMENTS_KEPT: usize = 64;

/// Keyed by the tuple's address. Touched only while attached to Python and
/// with no Python code run under the lock (an evicted tuple is dropped after
/// it), so it is never contended on GIL builds and never held across a fork.
static PARSED_SEGMENTS: Mutex<Recent<usize, ParsedSegments>> =
    Mutex::new(Recent::new(PARSED_SEGMENTS_KEPT));

/// The Stats (None for one no longer alive) and lengths of `segments`.
fn stats_of_segments(
    segments: &Bound<'_, PyTuple>,
) -> PyResult<Vec<(Option<Arc<StatShared>>, usize)>> {
    let key = segments.as_ptr() as usize;
    if let Some(parsed) = PARSED_SEGMENTS.lock().get(&key) {
        return Ok(parsed.upgrade());
    }
    let mut ids_and_lengths = Vec::with_capacity(segments.len());
    for segment in segments.iter() {
        // Tuples the trace built: read as tuples, not as sequences.
        let segment = segment.cast::<PyTuple>()?;
        let live_id: u64 = segment.get_item(0)?.extract()?;
        let length: usize = segment.get_item(1)?.extract()?;
        ids_and_lengths.push((live_id, length));
    }
    let stats = live_stats(ids_and_lengths.iter().map(|(live_id, _)| *live_id));
    let lengths = ids_and_lengths.into_iter().map(|(_, length)| length);
    let found: Vec<_> = stats.into_iter().zip(lengths).collect();
    let parsed = ParsedSegments::new(segments.clone().unbind(), &found);
    // Dropped after the lock: `found` (returned) and the evicted parse.
    let evicted = PARSED_SEGMENTS.lock().insert(key, parsed);
    drop(evicted);
    Ok(found)
}

/// `_record_cpu_tensors`; with `set_eval_frame`, handlers of the windows
/// the adds close run with dynamo's frame hook off. Every entry is read and
/// checked before the first add: a tensor attribute or method costs
/// 0.05-0.4 us, the add of a value 0.02 (docs/performance.md, "Recording
/// tensors").
fn record_cpu_entries<'py>(
    py: Python<'py>,
    staged: &Bound<'py, PyTuple>,
    set_eval_frame: Option<&Bound<'py, PyAny>>,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let mut elsewhere = Vec::new();
    let mut values: Vec<f64> = Vec::new();
    let mut adds: Vec<(Option<Arc<StatShared>>, Range<usize>)> = Vec::new();
    for entry in staged.iter() {
        let entry_items = entry.cast::<PyTuple>()?;
        let (entry_segments, tensor) = (entry_items.get_item(0)?, entry_items.get_item(1)?);
        let entry_segments = entry_segments.cast::<PyTuple>()?;
        // The trace's flag when the entry has one: a tensor attribute read
        // right after a graph costs ~0.25 us.
        let on_cpu = match entry_items.get_item(2) {
            Ok(flag) => flag.is_truthy()?,
            Err(_) => tensor
                .getattr(crate::py_objects::IS_CPU.get(py))?
                .is_truthy()?,
        };
        if !on_cpu {
            elsewhere.push(entry);
            continue;
        }
        let first = values.len();
        // A 0-d tensor's tolist() is a number, a 1-d one's a list: one call
        // reads either (bool and integer values convert as float() does).
        let read = tensor.call_method0(crate::py_objects::TOLIST.get(py))?;
        match read.cast::<PyList>() {
            Ok(list) => {
                values.reserve(list.len());
                for value in list.iter() {
                    values.push(value.extract::<f64>()?);
                }
            }
            Err(_) => values.push(read.extract::<f64>()?),
        }
        let segments = stats_of_segments(entry_segments)?;
        let lengths = segments.iter().map(|(_, length)| *length);
        let Some(ranges) = segment_ranges(first, values.len(), lengths) else {
            let message = live::segments_past_message(values.len() - first);
            return Err(PyValueError::new_err(message));
        };
        adds.extend(segments.into_iter().map(|(stat, _)| stat).zip(ranges));
    }
    let mut failures = Failures::default();
    // A Stat that no longer lives records nothing.
    for (stat, range) in adds {
        let Some(stat) = stat else {
            continue;
        };
        let closed = stat.add_values_now(&values[range]);
        if closed.is_empty() {
            continue;
        }
        match set_eval_frame {
            None => stat.emit_into(py, &closed, &mut failures),
            Some(set_eval_frame) => {
                emit_with_frame_hook_off(py, set_eval_frame, &stat, &closed, &mut failures)?
            }
        }
    }
    failures.into_result().map(|()| elsewhere)
}

/// Emits with dynamo's frame hook off, as `torch._dynamo.disable` turns it
/// off: otherwise dynamo would try to compile every Python frame a handler
/// runs, and count graph breaks in them.
fn emit_with_frame_hook_off(
    py: Python<'_>,
    set_eval_frame: &Bound<'_, PyAny>,
    stat: &Arc<StatShared>,
    closed: &Closed,
    failures: &mut Failures,
) -> PyResult<()> {
    let prior = set_eval_frame.call1((py.None(),))?;
    stat.emit_into(py, closed, failures);
    set_eval_frame.call1((prior,))?;
    Ok(())
}

/// The Python Stats of `live_ids`, in order (None for one no longer alive),
/// looked up under one lock in the core's list of live Stats.
fn live_stats(live_ids: impl Iterator<Item = u64>) -> Vec<Option<Arc<StatShared>>> {
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
        None => emit(stat.core().add_many_at(
            values.len(),
            |index| values[index],
            stat.core().now_ms(),
        )),
        Some(times) => {
            live::check_times(values.len(), times.len()).map_err(PyValueError::new_err)?;
            for (&value, &now_ms) in values.iter().zip(&times) {
                emit(stat.core().add_at(value, now_ms));
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
    let now_ms = stat.core().now_ms();
    Some((now_ms, stat.core().window_id(now_ms)))
}
