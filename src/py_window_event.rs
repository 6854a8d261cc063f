//! The `torch.monitor.Stat` event of a closed window: its name, its data, its
//! Distribution, dispatched to the handlers. Python Stats and the torch
//! wait-counter backend both emit through here.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString};

use crate::py_distribution::PyDistribution;
use crate::py_event::Event;
use crate::py_objects::datetime_now;
use crate::py_registry::{Handlers, dispatch};
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
        Some(d) => Some(Py::new(py, PyDistribution::from_core(d.clone()))?),
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
            distribution.as_ref().map(|d| d.clone_ref(py).into_any()),
        );
        Ok(Bound::new(py, event)?.into_any())
    })
}

/// Fills this module's lazy cells at import (see `py_objects`).
pub fn init_lazy(py: Python<'_>) {
    stat_event_name(py);
}
