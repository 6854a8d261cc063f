//! torchmon's native core: torch.monitor's `Stat`, `Event` and handler
//! registry. The logic lives in PyO3-free modules (`aggregation`, `clock`,
//! `exit_gate`, `registry`, `stat`, `worker`); the `py_*` modules are the
//! thin binding layer.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod aggregation;
pub mod clock;
pub mod exit_gate;
pub mod registry;
pub mod stat;
mod sync;
pub mod worker;

mod py_aggregation;
mod py_async;
mod py_clock;
mod py_convert;
mod py_event;
mod py_fast;
mod py_gil_cell;
mod py_registry;
mod py_stat;

use pyo3::prelude::*;

// The free-threaded (`Py_GIL_DISABLED`) code paths compile and pass clippy
// (CI checks them against a 3.14t configuration) but have not run on a
// free-threaded interpreter: none can be installed on our machines
// (docs/free-threading.md). Until the suite has run there, the module says it
// needs the GIL, so a free-threaded CPython re-enables the GIL on import (with
// a warning) rather than run untested code concurrently. `PYTHON_GIL=0`
// overrides that at the user's risk.
#[pymodule(gil_used = true)]
mod _core {
    #[pymodule_export]
    use crate::py_aggregation::PyAggregation;
    #[pymodule_export]
    use crate::py_async::{
        _close_async_handlers_at_exit, _drain_async_handlers, _restart_async_handlers_after_fork,
        AsyncEventHandler,
    };
    #[pymodule_export]
    use crate::py_clock::{_clock_ms, _clock_override_ms, _set_clock_ms};
    #[pymodule_export]
    use crate::py_event::{DataValueT, Event};
    #[pymodule_export]
    use crate::py_registry::{
        _close_exit_gate, _exit_gate_state, _handler_count, EventHandlerHandle,
        register_event_handler, unregister_event_handler,
    };
    #[pymodule_export]
    use crate::py_stat::{_flush_all_stats, _flush_stats_now, _live_stat_count, Stat};

    use super::*;

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add("STAT_EVENT", crate::py_stat::STAT_EVENT)?;
        // Every lazily initialised cell is filled now (py_convert::init_lazy).
        let py = m.py();
        crate::py_convert::init_lazy(py)?;
        crate::py_event::mapping_abc(py)?;
        crate::py_registry::init_lazy(py);
        crate::py_stat::init_lazy(py);
        crate::py_fast::install(m)?;
        Ok(())
    }
}
