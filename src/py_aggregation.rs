//! `Aggregation`: an enum whose members are singletons, as Python enums are.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::py_convert::type_name;
use torchmon_core::aggregation::Aggregation as Core;

/// Aggregation applied to the samples of one Stat window.
///
/// Members compare equal only to themselves (not to ints, as in torch);
/// `int(member)` and `.value` give the C++ enum value.
#[pyclass(
    name = "Aggregation",
    module = "torchmon",
    frozen,
    eq,
    hash,
    rename_all = "UPPERCASE"
)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum PyAggregation {
    Value = 1,
    Mean = 2,
    Count = 3,
    Sum = 4,
    Max = 5,
    Min = 6,
}

impl PyAggregation {
    pub fn core(self) -> Core {
        match self {
            PyAggregation::Value => Core::Value,
            PyAggregation::Mean => Core::Mean,
            PyAggregation::Count => Core::Count,
            PyAggregation::Sum => Core::Sum,
            PyAggregation::Max => Core::Max,
            PyAggregation::Min => Core::Min,
        }
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
            return Err(PyTypeError::new_err(format!(
                "Aggregation(value): value must be an int, not {}",
                type_name(value)
            )));
        }
        let number: i64 = value.extract().unwrap_or(i64::MIN);
        match Core::from_value(number) {
            Some(core) => Ok(Self::member(py, core)?.unbind()),
            None => Err(PyValueError::new_err(format!(
                "{} is not a valid Aggregation (valid values: 1 to 6)",
                value.repr()?
            ))),
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
        format!(
            "<Aggregation.{}: {}>",
            self.core().name(),
            self.core() as i64
        )
    }

    fn __str__(&self) -> String {
        format!("Aggregation.{}", self.core().name())
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        Ok((
            py.get_type::<PyAggregation>().into_any(),
            PyTuple::new(py, [slf.get().core() as i64])?,
        ))
    }
}
