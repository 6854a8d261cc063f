//! The `torch.monitor.Stat` event of a closed window: its name, its data, its
//! Distribution, dispatched to the handlers. Python Stats and the torch
//! wait-counter backend both emit through here.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyFloat, PyString, PyTuple};

use crate::py_event::Event;
use crate::py_objects::datetime_now;
use crate::py_registry::{Handlers, dispatch};
use torchmon_core::histogram::Distribution;
use torchmon_core::stat::WindowStats;

pub use torchmon_core::stat::STAT_EVENT;

pub fn stat_event_name(py: Python<'_>) -> &Bound<'_, PyString> {
    static NAME: PyOnceLock<Py<PyString>> = PyOnceLock::new();
    NAME.get_or_init(py, || PyString::intern(py, STAT_EVENT).unbind())
        .bind(py)
}

/// Dispatches a closed window's `data` (its `<name>.<aggregation>` keys) as
/// a `torch.monitor.Stat` event stamped now, with the window's Distribution:
/// Python Stats and the torch wait-counter backend share it.
pub(crate) fn dispatch_window_event(
    py: Python<'_>,
    handlers: &Handlers,
    data: Bound<'_, PyDict>,
    window: &WindowStats,
) -> PyResult<()> {
    let distribution = match &window.distribution {
        Some(d) => Some(distribution_object(py, d)?),
        None => None,
    };
    let timestamp = datetime_now(py)?.unbind();
    let name = stat_event_name(py).clone().unbind();
    let data = data.unbind();
    // Each handler gets its own Event (renaming one must not affect the
    // next). They may share the dict: an Event never hands it out.
    dispatch(py, handlers, |_| {
        // The Distribution is immutable: every handler's Event shares it.
        let event = Event::from_parts(
            name.clone_ref(py),
            timestamp.clone_ref(py),
            data.clone_ref(py),
            distribution.as_ref().map(|d| d.clone_ref(py)),
        );
        Ok(Bound::new(py, event)?.into_any())
    })
}

/// The `torchmon.Distribution` of a window.
fn distribution_object(py: Python<'_>, d: &Distribution) -> PyResult<Py<PyAny>> {
    let class = crate::py_objects::distribution_class(py)?;
    let b = &d.buckets;
    let positive = PyTuple::new(py, &b.positive)?;
    let negative = PyTuple::new(py, &b.negative)?;
    let args = PyTuple::new(
        py,
        [
            d.count.into_pyobject(py)?.into_any(),
            PyFloat::new(py, d.sum).into_any(),
            PyFloat::new(py, d.min).into_any(),
            PyFloat::new(py, d.max).into_any(),
            b.zero_count.into_pyobject(py)?.into_any(),
            b.nan_count.into_pyobject(py)?.into_any(),
            b.positive_inf_count.into_pyobject(py)?.into_any(),
            b.negative_inf_count.into_pyobject(py)?.into_any(),
            positive.into_any(),
            negative.into_any(),
        ],
    )?;
    Ok(class
        .call_method1(crate::py_objects::FROM_CORE.get(py), args)?
        .unbind())
}

/// Fills this module's lazy cells at import (see `py_objects`).
pub fn init_lazy(py: Python<'_>) {
    stat_event_name(py);
}
