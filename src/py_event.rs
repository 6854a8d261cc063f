//! `Event` and `data_value_t`.
//!
//! An Event keeps a private dict whose keys and values were validated and
//! normalised (exact str keys; exact str/int/float/bool values), so reading
//! `event.data` is a dict copy.

use parking_lot::Mutex;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDate, PyDateTime, PyDict, PyString, PyTuple, PyType};

use crate::py_convert::{Surrogates, data_value, string_arg, type_name};

/// Marker for the types an Event data value may have: str, float, int, bool.
#[pyclass(name = "data_value_t", module = "torchmon", frozen)]
pub struct DataValueT;

struct Fields {
    name: Py<PyString>,
    timestamp: Py<PyAny>,
    data: Py<PyDict>,
}

/// A structured record: a name, a timestamp and a dict of values.
#[pyclass(name = "Event", module = "torchmon", frozen)]
pub struct Event {
    // Setters swap values in and drop the old ones after unlocking, since a
    // drop may run Python code (a datetime subclass's __del__) that reads
    // this Event.
    fields: Mutex<Fields>,
}

fn mapping_abc(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static MAPPING: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    MAPPING.import(py, "collections.abc", "Mapping")
}

fn event_name<'py>(value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyString>> {
    string_arg(value, "Event name", Surrogates::TypeError)
}

fn event_timestamp<'py>(value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    if value.is_instance_of::<PyDateTime>() {
        return Ok(value.clone());
    }
    if let Ok(date) = value.cast::<PyDate>() {
        // torch reads a date as midnight of that day.
        use pyo3::types::PyDateAccess;
        let midnight = PyDateTime::new(
            value.py(),
            date.get_year(),
            date.get_month(),
            date.get_day(),
            0,
            0,
            0,
            0,
            None,
        )?;
        return Ok(midnight.into_any());
    }
    if value.is_instance_of::<pyo3::types::PyTime>() {
        // torch reads a time of day as that time on 1970-01-01.
        let epoch_day = PyDate::new(value.py(), 1970, 1, 1)?;
        return value
            .py()
            .get_type::<PyDateTime>()
            .call_method1(pyo3::intern!(value.py(), "combine"), (epoch_day, value));
    }
    Err(PyTypeError::new_err(format!(
        "Event timestamp must be a datetime.datetime, not {}",
        type_name(value)
    )))
}

/// Validates `data` and copies it into a new dict of normalised values.
pub fn event_data<'py>(value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    let py = value.py();
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
    } else if value.is_instance(mapping_abc(py)?)? {
        for pair in value.call_method0(pyo3::intern!(py, "items"))?.try_iter()? {
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

impl Event {
    /// An Event from already-validated parts (Stat events).
    pub fn from_parts(name: Py<PyString>, timestamp: Py<PyAny>, data: Py<PyDict>) -> Self {
        Event {
            fields: Mutex::new(Fields {
                name,
                timestamp,
                data,
            }),
        }
    }

    fn name_ref(&self, py: Python<'_>) -> Py<PyString> {
        self.fields.lock().name.clone_ref(py)
    }

    fn timestamp_ref(&self, py: Python<'_>) -> Py<PyAny> {
        self.fields.lock().timestamp.clone_ref(py)
    }

    fn data_ref(&self, py: Python<'_>) -> Py<PyDict> {
        self.fields.lock().data.clone_ref(py)
    }
}

#[pymethods]
impl Event {
    #[new]
    #[pyo3(signature = (name, timestamp, data))]
    fn new(
        name: &Bound<'_, PyAny>,
        timestamp: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let name = event_name(name)?;
        let timestamp = event_timestamp(timestamp)?;
        let data = event_data(data)?;
        Ok(Event::from_parts(
            name.unbind(),
            timestamp.unbind(),
            data.unbind(),
        ))
    }

    #[getter]
    fn name(&self, py: Python<'_>) -> Py<PyString> {
        self.name_ref(py)
    }

    #[setter]
    fn set_name(&self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let name = event_name(value)?.unbind();
        let old = std::mem::replace(&mut self.fields.lock().name, name);
        drop(old);
        Ok(())
    }

    #[getter]
    fn timestamp(&self, py: Python<'_>) -> Py<PyAny> {
        self.timestamp_ref(py)
    }

    #[setter]
    fn set_timestamp(&self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let timestamp = event_timestamp(value)?.unbind();
        let old = std::mem::replace(&mut self.fields.lock().timestamp, timestamp);
        drop(old);
        Ok(())
    }

    /// A fresh dict each time: changing it does not change the Event.
    #[getter]
    fn data<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.data_ref(py).bind(py).copy()
    }

    #[setter]
    fn set_data(&self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let data = event_data(value)?.unbind();
        let old = std::mem::replace(&mut self.fields.lock().data, data);
        drop(old);
        Ok(())
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let name = self.name_ref(py);
        let timestamp = self.timestamp_ref(py);
        let data = self.data_ref(py);
        Ok(format!(
            "torchmon.Event(name={}, timestamp={}, data={})",
            name.bind(py).repr()?,
            timestamp.bind(py).repr()?,
            data.bind(py).repr()?
        ))
    }

    /// Events pickle (for queues and multiprocessing) as their three parts.
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let this = slf.get();
        let args = PyTuple::new(
            py,
            [
                this.name_ref(py).into_any(),
                this.timestamp_ref(py),
                this.data_ref(py).bind(py).copy()?.into_any().unbind(),
            ],
        )?;
        Ok((py.get_type::<Event>().into_any(), args))
    }
}
