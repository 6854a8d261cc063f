//! Every Python object the binding calls or checks against, in one table.
//! None is imported by a name of torchmon's package: what the package
//! provides, it installs through a setter (the tensor support and the
//! compiled-graph store in `py_stat.rs` and `py_compiled.rs`).
//!
//! Fork safety (docs/reliability.md, "fork", the audit): PyO3's
//! `get_or_init` (and `intern!`, `Interned`, `import`) detaches from the GIL
//! before it marks the cell "being filled" and attaches again inside, so
//! another thread can fork meanwhile, whatever the initialiser does; the
//! child's first use of the cell then waits for ever. So every cell of the
//! binding is filled at import (`init`), or is filled outside the cell and
//! then `set`, which never touches the GIL.
//!
//! | object | what for | filled |
//! | --- | --- | --- |
//! | `datetime.datetime.now` | a window event's timestamp | at import |
//! | `datetime.timedelta` | `Stat`'s window size, its repr | at import |
//! | `collections.abc.Mapping` | an Event's data, `Distribution.from_dict` | at import |
//! | `collections.abc.Iterable` | a Distribution's buckets | at import |
//! | `numpy.complexfloating` | refusing numpy complex samples | first non-float sample once numpy is imported (never imports it) |
//! | the attribute names (`py_convert`'s and below) | samples, data values, tensors, distributions | at import |

use pyo3::prelude::*;
use pyo3::sync::{Interned, PyOnceLock};
use pyo3::types::PyType;

/// `datetime.datetime.now` (naive local time) called now.
pub fn datetime_now(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    static NOW: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    NOW.get_or_try_init(py, || -> PyResult<Py<PyAny>> {
        Ok(py
            .import("datetime")?
            .getattr("datetime")?
            .getattr("now")?
            .unbind())
    })?
    .bind(py)
    .call0()
}

/// The `datetime.timedelta` type.
pub fn timedelta_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static TIMEDELTA: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    TIMEDELTA.import(py, "datetime", "timedelta")
}

/// `collections.abc.Mapping`.
pub fn mapping_abc(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static MAPPING: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    MAPPING.import(py, "collections.abc", "Mapping")
}

/// `collections.abc.Iterable`.
pub fn iterable_abc(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static ITERABLE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    ITERABLE.import(py, "collections.abc", "Iterable")
}

static NUMPY: Interned = Interned::new("numpy");
static COMPLEXFLOATING_NAME: Interned = Interned::new("complexfloating");
/// A tensor's `is_cpu` and `tolist` (compiled graphs' staged tensors).
pub static IS_CPU: Interned = Interned::new("is_cpu");
pub static TOLIST: Interned = Interned::new("tolist");

/// Whether `value` is a numpy complex scalar. Looked up without importing
/// numpy: before numpy is imported there is none.
pub fn is_numpy_complex(value: &Bound<'_, PyAny>) -> bool {
    static COMPLEXFLOATING: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let py = value.py();
    if let Some(complexfloating) = COMPLEXFLOATING.get(py) {
        // SAFETY: both are live type objects (the value's, and one the cell
        // keeps alive); PyType_IsSubtype only reads their MROs.
        return unsafe {
            pyo3::ffi::PyType_IsSubtype(value.get_type_ptr(), complexfloating.as_ptr().cast()) != 0
        };
    }
    // SAFETY: the thread is attached (`py`) and the name a live str;
    // PyImport_GetModule only looks in sys.modules and returns a new
    // reference, or NULL when numpy is absent (no exception set) or on an
    // error (set, and cleared here).
    let numpy = unsafe {
        Bound::from_owned_ptr_or_opt(py, pyo3::ffi::PyImport_GetModule(NUMPY.get(py).as_ptr()))
    };
    let Some(numpy) = numpy else {
        drop(PyErr::take(py));
        return false;
    };
    let Ok(complexfloating) = numpy
        .getattr(COMPLEXFLOATING_NAME.get(py))
        .and_then(|t| t.cast_into::<PyType>().map_err(PyErr::from))
    else {
        return false; // numpy still importing
    };
    let is_complex = value.is_instance(&complexfloating).unwrap_or(false);
    let _ = COMPLEXFLOATING.set(py, complexfloating.unbind());
    is_complex
}

/// Fills the cells filled at import (the table above), and the attribute
/// names interned once, before any other thread can use the module.
pub fn init(py: Python<'_>) -> PyResult<()> {
    use crate::py_convert::{COMBINE, DTYPE, INDEX, INT, ITEMS, KIND};
    for name in [
        &DTYPE,
        &KIND,
        &INDEX,
        &INT,
        &COMBINE,
        &ITEMS,
        &NUMPY,
        &COMPLEXFLOATING_NAME,
        &IS_CPU,
        &TOLIST,
    ] {
        name.get(py);
    }
    datetime_now(py)?;
    timedelta_type(py)?;
    mapping_abc(py)?;
    iterable_abc(py)?;
    Ok(())
}
