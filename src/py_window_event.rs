//! The `torch.monitor.Stat` event of a closed window: its name, its data, its
//! Distribution, dispatched to the handlers. Python Stats and the torch
//! wait-counter backend both emit through here.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyFloat, PyString, PyTuple};

use crate::py_convert::datetime_now;
use crate::py_event::Event;
use crate::py_registry::{Handlers, dispatch};
use torchmon_core::histogram::Distribution;
use torchmon_core::stat::WindowStats;

pub const STAT_EVENT: &str = "torch.monitor.Stat";

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

/// `torchmon.Distribution._from_core`. The module is imported on first use
/// (`import torchmon` does not load it) and outside the cell: a cell filled
/// by a call that releases the GIL (an import does) stays "being filled" for
/// ever in a child forked meanwhile, and the child's first window hung on it.
/// The import itself is completed before every fork (`_prepare_fork`).
pub(crate) fn distribution_from_core(py: Python<'_>) -> PyResult<&Py<PyAny>> {
    static FROM_CORE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    if let Some(from_core) = FROM_CORE.get(py) {
        return Ok(from_core);
    }
    let from_core = py
        .import("torchmon._distribution")?
        .getattr("Distribution")?
        .getattr("_from_core")?
        .unbind();
    // Another thread may have filled it meanwhile: either value will do.
    let _ = FROM_CORE.set(py, from_core);
    FROM_CORE
        .get(py)
        .ok_or_else(|| pyo3::exceptions::PyRuntimeError::new_err("torchmon: Distribution unset"))
}

/// The `torchmon.Distribution` of a window.
fn distribution_object(py: Python<'_>, d: &Distribution) -> PyResult<Py<PyAny>> {
    let from_core = distribution_from_core(py)?;
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
    Ok(from_core.bind(py).call1(args)?.unbind())
}

/// Fills this module's lazy cells at import (see `py_convert::init_lazy`).
pub fn init_lazy(py: Python<'_>) {
    stat_event_name(py);
}
