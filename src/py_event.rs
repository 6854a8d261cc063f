//! `Event` and `data_value_t`.
//!
//! An Event keeps a private dict whose keys and values were validated and
//! normalised (exact str keys; exact str/int/float/bool values), so reading
//! `event.data` is a dict copy.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDate, PyDateTime, PyDict, PyString, PyTime, PyTuple};

use crate::py_convert::{
    Surrogates, data_value, is_normalised_value, is_plain_str, string_arg, type_name,
};
use crate::py_gil_cell::GilCell;

/// Marker for the types an Event data value may have: str, float, int, bool.
#[pyclass(name = "data_value_t", module = "torchmon", frozen)]
pub struct DataValueT;

/// A structured record: a name, a timestamp and a dict of values.
#[pyclass(name = "Event", module = "torchmon", frozen)]
pub struct Event {
    // Replaced values are dropped after the cell is left: a drop may run
    // Python code (a datetime subclass's __del__) that reads this Event.
    name: GilCell<Py<PyString>>,
    timestamp: GilCell<Py<PyAny>>,
    data: GilCell<Py<PyDict>>,
    /// The window's `torchmon.Distribution` for a Stat window event of a
    /// Stat with a P aggregation (docs/api.md); never in `data`.
    distribution: Option<Py<PyAny>>,
}

fn event_name<'py>(value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyString>> {
    string_arg(value, "Event name", Surrogates::TypeError)
}

fn event_timestamp<'py>(value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = value.py();
    if value.is_instance_of::<PyDateTime>() {
        return Ok(value.clone());
    }
    // torch reads a date as midnight of that day, and a time of day as that
    // time on 1970-01-01.
    let (day, time) = if let Ok(date) = value.cast::<PyDate>() {
        (date.clone(), PyTime::new(py, 0, 0, 0, 0, None)?.into_any())
    } else if value.is_instance_of::<PyTime>() {
        (PyDate::new(py, 1970, 1, 1)?, value.clone())
    } else {
        return Err(PyTypeError::new_err(format!(
            "Event timestamp must be a datetime.datetime, not {}",
            type_name(value)
        )));
    };
    py.get_type::<PyDateTime>()
        .call_method1(crate::py_objects::COMBINE.get(py), (day, time))
}

/// Validates `data` and copies it into a new dict of normalised values.
pub fn event_data<'py>(value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    let py = value.py();
    // The common case, a plain dict of plain values, is one C-level copy.
    // It stays a copy even when the call seems to hold the only reference:
    // `Event(*args)` and `functools.partial(Event, name, ts, d)` pass a dict
    // whose one reference is a tuple the caller keeps, and a C caller may
    // lend one it goes on using, so a reference count of 1 does not prove
    // the dict is a temporary (docs/performance.md, "Where the remaining
    // time goes"; tests/api/test_event.py pins both cases).
    if let Ok(dict) = value.cast_exact::<PyDict>()
        && all_normalised(dict)
    {
        return dict.copy();
    }
    let copy = PyDict::new(py);
    let put = |key: &Bound<'py, PyAny>, item: &Bound<'py, PyAny>| -> PyResult<()> {
        let key = crate::py_convert::try_string(key, "Event data key", Surrogates::TypeError)?
            .ok_or_else(|| {
                PyTypeError::new_err(format!(
                    "Event data keys must be str, not {}",
                    type_name(key)
                ))
            })?;
        let normalised = data_value(item, key.to_str()?)?;
        copy.set_item(key, normalised)
    };
    if let Ok(dict) = value.cast::<PyDict>() {
        for (key, item) in dict.iter() {
            put(&key, &item)?;
        }
    } else if value.is_instance(crate::py_objects::mapping_abc(py)?)? {
        for pair in value
            .call_method0(crate::py_objects::ITEMS.get(py))?
            .try_iter()?
        {
            let pair = pair?;
            let (key, item): (Bound<'py, PyAny>, Bound<'py, PyAny>) = pair.extract()?;
            put(&key, &item)?;
        }
    } else {
        return Err(PyTypeError::new_err(format!(
            "Event data must be a dict of str to str/int/float/bool, not {}",
            type_name(value)
        )));
    }
    Ok(copy)
}

/// Whether every key of an exact dict is a plain str and every value is
/// normalised, so that a copy is all `event_data` has to make.
#[cfg(not(Py_GIL_DISABLED))]
fn all_normalised(dict: &Bound<'_, PyDict>) -> bool {
    let py = dict.py();
    let mut pos: pyo3::ffi::Py_ssize_t = 0;
    let mut key = std::ptr::null_mut();
    let mut item = std::ptr::null_mut();
    // PyDict_Next with borrowed references instead of PyO3's iterator, which
    // takes and releases a reference to each key and value and checks the
    // dict's size at every step (with is_plain_str's ASCII shortcut, the
    // check of three entries went from ~500 to ~370 instructions;
    // callgrind, docs/performance.md).
    // SAFETY: `dict` is a live dict for the whole loop (`&Bound` holds a
    // reference). PyDict_Next hands out borrowed references that stay valid
    // while the dict is not changed. A passing check only compares types and
    // reads an exact int's or exact str's value (is_normalised_value,
    // is_plain_str), which runs no Python code, and with the GIL held no
    // other thread runs, so nothing changes the dict before the next step.
    // Python code can run only inside a failing check (the error of an int
    // beyond int64 or a str with lone surrogates is an allocation, which
    // may start a garbage collection and its finalizers); the loop then
    // returns without touching `key` or `item` again.
    while unsafe { pyo3::ffi::PyDict_Next(dict.as_ptr(), &mut pos, &mut key, &mut item) } != 0 {
        // SAFETY: borrowed, non-NULL references from PyDict_Next (above).
        let (key, item) = unsafe { (Borrowed::from_ptr(py, key), Borrowed::from_ptr(py, item)) };
        if !(is_plain_str(&key) && is_normalised_value(&item)) {
            return false;
        }
    }
    true
}

/// Free-threaded builds: PyO3's iterator, which locks the dict while it
/// reads (another thread may change it meanwhile).
#[cfg(Py_GIL_DISABLED)]
fn all_normalised(dict: &Bound<'_, PyDict>) -> bool {
    dict.iter()
        .all(|(key, item)| is_plain_str(&key) && is_normalised_value(&item))
}

impl Event {
    /// An Event from already-validated parts (Stat events).
    pub fn from_parts(
        name: Py<PyString>,
        timestamp: Py<PyAny>,
        data: Py<PyDict>,
        distribution: Option<Py<PyAny>>,
    ) -> Self {
        Event {
            name: GilCell::new(name),
            timestamp: GilCell::new(timestamp),
            data: GilCell::new(data),
            distribution,
        }
    }

    /// A new Event with the same parts. Setters on either replace parts
    /// rather than change them, and the dict is never handed out, so later
    /// changes to one never show in the other.
    pub fn snapshot(&self, py: Python<'_>) -> Self {
        Event::from_parts(
            self.name.get(py),
            self.timestamp.get(py),
            self.data.get(py),
            self.distribution.as_ref().map(|d| d.clone_ref(py)),
        )
    }
}

#[pymethods]
impl Event {
    #[new]
    #[pyo3(signature = (name, timestamp, data))]
    pub(crate) fn new(
        name: &Bound<'_, PyAny>,
        timestamp: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        Ok(Event::from_parts(
            event_name(name)?.unbind(),
            event_timestamp(timestamp)?.unbind(),
            event_data(data)?.unbind(),
            None,
        ))
    }

    #[getter]
    fn name(&self, py: Python<'_>) -> Py<PyString> {
        self.name.get(py)
    }

    #[setter]
    fn set_name(&self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.name.set(value.py(), event_name(value)?.unbind());
        Ok(())
    }

    #[getter]
    fn timestamp(&self, py: Python<'_>) -> Py<PyAny> {
        self.timestamp.get(py)
    }

    #[setter]
    fn set_timestamp(&self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.timestamp
            .set(value.py(), event_timestamp(value)?.unbind());
        Ok(())
    }

    /// A fresh dict each time: changing it does not change the Event.
    #[getter]
    fn data<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.data.get(py).bind(py).copy()
    }

    #[setter]
    fn set_data(&self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.data.set(value.py(), event_data(value)?.unbind());
        Ok(())
    }

    /// The window's histogram (a `torchmon.Distribution`) when this is the
    /// window event of a Stat with a P aggregation, else None. Read-only.
    #[getter]
    fn distribution(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.distribution.as_ref().map(|d| d.clone_ref(py))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let name = self.name.get(py);
        let timestamp = self.timestamp.get(py);
        let data = self.data.get(py);
        Ok(format!(
            "torchmon.Event(name={}, timestamp={}, data={})",
            name.bind(py).repr()?,
            timestamp.bind(py).repr()?,
            data.bind(py).repr()?
        ))
    }

    /// Events pickle (for queues and multiprocessing, and `copy.copy`) as
    /// their three parts, and a window event with its distribution, which
    /// `Event(...)` does not take (`_event_with_distribution` restores it).
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let this = slf.get();
        let mut parts = vec![
            this.name.get(py).into_any(),
            this.timestamp.get(py),
            this.data.get(py).bind(py).copy()?.into_any().unbind(),
        ];
        let Some(distribution) = &this.distribution else {
            return Ok((py.get_type::<Event>().into_any(), PyTuple::new(py, parts)?));
        };
        parts.push(distribution.clone_ref(py));
        // The module's function, which pickle finds by its qualified name.
        let restore = py
            .import("torchmon._core")?
            .getattr("_event_with_distribution")?;
        Ok((restore, PyTuple::new(py, parts)?))
    }
}

/// An unpickled window event: `Event(name, timestamp, data)` with its
/// `distribution` (a `torchmon.Distribution`).
#[pyfunction]
pub fn _event_with_distribution(
    name: &Bound<'_, PyAny>,
    timestamp: &Bound<'_, PyAny>,
    data: &Bound<'_, PyAny>,
    distribution: &Bound<'_, PyAny>,
) -> PyResult<Event> {
    if !distribution.is_instance_of::<crate::py_distribution::PyDistribution>() {
        return Err(crate::py_convert::arg_type_error(
            "_event_with_distribution",
            "distribution",
            "a torchmon.Distribution",
            distribution,
        ));
    }
    let event = Event::new(name, timestamp, data)?;
    Ok(Event {
        distribution: Some(distribution.clone().unbind()),
        ..event
    })
}
