//! `Stat(name, aggregations, window_size, max_samples)`'s arguments: every
//! argument's type first, in order, then the values, as torch (whose binding
//! converts all arguments before the constructor runs); docs/api.md, `Stat`.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyString};

use crate::py_aggregation::PyAggregation;
use crate::py_clock::{WindowRule, window_arg, window_ms};
use crate::py_convert::{
    Given, Surrogates, arg_type_error, arg_value_error, string_arg, type_name,
};
use torchmon_core::aggregation::Aggregation;
use torchmon_core::stat::check_name_length;

/// A `Stat`'s arguments, checked.
pub struct StatArgs<'py> {
    pub name: Bound<'py, PyString>,
    /// In the order given, each once.
    pub aggregations: Vec<Aggregation>,
    pub window_ms: i64,
    pub max_samples: i64,
}

/// Checks `Stat`'s arguments.
pub fn stat_args<'py>(
    name: &Bound<'py, PyAny>,
    aggregations: &Bound<'py, PyAny>,
    window_size: &Bound<'py, PyAny>,
    max_samples: &Given,
) -> PyResult<StatArgs<'py>> {
    check_name_type(name)?;
    let aggregations = aggregations_arg(aggregations)?;
    let window = window_arg("Stat", "window_size", window_size, WindowRule::Torch)?;
    let max_samples = match &max_samples.0 {
        None => i64::MAX,
        Some(value) => max_samples_arg(value.bind(name.py()))?,
    };
    let name = string_arg(name, "Stat(name): name", Surrogates::TypeError)?;
    check_name_length(name.len()?).map_err(|problem| arg_value_error("Stat", "name", problem))?;
    let window_ms = window_ms("Stat", "window_size", window, WindowRule::Torch)?;
    Ok(StatArgs {
        name,
        aggregations,
        window_ms,
        max_samples,
    })
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
            .call_method0(crate::py_objects::INDEX.get(py))
            .or_else(|_| value.call_method0(crate::py_objects::INT.get(py)))
            .map_err(|_| type_error())?
    };
    integer.extract::<i64>().map_err(|_| {
        PyTypeError::new_err(format!(
            "Stat(max_samples): max_samples must be in the int64 range, got {}",
            integer.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    })
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
