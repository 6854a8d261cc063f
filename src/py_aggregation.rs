//! `Aggregation`: an enum whose members are singletons, as Python enums are.
//! Its members, values and messages come from the core's table
//! (aggregation.rs), installed on the class when the module loads.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyMappingProxy, PyTuple, PyType};

use crate::py_convert::arg_type_error;
use torchmon_core::aggregation::{Aggregation as Core, TABLE};

/// Aggregation applied to the samples of one Stat window.
///
/// Members compare equal only to themselves (not to ints, as in torch);
/// `int(member)` and `.value` give the C++ enum value.
#[pyclass(name = "Aggregation", module = "torchmon", frozen, eq, hash)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PyAggregation(Core);

/// Adds `Aggregation` to the module with one member per row of the table, as
/// class attributes and in `Aggregation.__members__` (name to member, in
/// value order, as a Python enum's), and `_AGGREGATION_KEY_SUFFIXES`, the
/// event-key suffixes in the same order, for the Python code that splits
/// event keys.
pub fn add_to_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let class = py.get_type::<PyAggregation>();
    let members = PyDict::new(py);
    for row in TABLE {
        let member = Bound::new(py, PyAggregation(row.aggregation))?;
        class.setattr(row.name, &member)?;
        members.set_item(row.name, member)?;
    }
    class.setattr("__members__", PyMappingProxy::new(py, members.as_mapping()))?;
    m.add_class::<PyAggregation>()?;
    let suffixes = PyTuple::new(py, TABLE.iter().map(|row| row.key_suffix))?;
    m.add("_AGGREGATION_KEY_SUFFIXES", suffixes)?;
    Ok(())
}

impl PyAggregation {
    pub fn core(self) -> Core {
        self.0
    }

    /// The member object itself (the class attribute), so identity holds.
    pub fn member(py: Python<'_>, aggregation: Core) -> PyResult<Bound<'_, PyAggregation>> {
        Ok(py
            .get_type::<PyAggregation>()
            .getattr(aggregation.name())?
            .cast_into::<PyAggregation>()?)
    }
}

#[pymethods]
impl PyAggregation {
    /// `Aggregation(2) is Aggregation.MEAN`; unknown values raise ValueError.
    #[new]
    fn new(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<Py<PyAggregation>> {
        if let Ok(member) = value.cast::<PyAggregation>() {
            return Ok(member.clone().unbind());
        }
        if value.is_instance_of::<pyo3::types::PyBool>()
            || !value.is_instance_of::<pyo3::types::PyInt>()
        {
            return Err(arg_type_error("Aggregation", "value", "an int", value));
        }
        let number: i64 = value.extract().unwrap_or(i64::MIN);
        match Core::from_value(number) {
            Some(core) => Ok(Self::member(py, core)?.unbind()),
            None => {
                let message = Core::invalid_value_message(&value.repr()?.to_cow()?);
                Err(PyValueError::new_err(message))
            }
        }
    }

    #[getter]
    fn name(&self) -> &'static str {
        self.core().name()
    }

    #[getter]
    fn value(&self) -> i64 {
        self.core() as i64
    }

    fn __int__(&self) -> i64 {
        self.core() as i64
    }

    fn __index__(&self) -> i64 {
        self.core() as i64
    }

    fn __repr__(&self) -> String {
        self.core().repr()
    }

    fn __str__(&self) -> String {
        format!("Aggregation.{}", self.core().name())
    }

    /// Pickles as `Aggregation(value)`, which gives the member back.
    fn __reduce__<'py>(&self, py: Python<'py>) -> (Bound<'py, PyType>, (i64,)) {
        (py.get_type::<PyAggregation>(), (self.core() as i64,))
    }
}
