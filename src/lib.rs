//! torchmon's native module, `torchmon._core`: torch.monitor's `Stat`,
//! `Event` and handler registry for Python. The logic lives in the PyO3-free
//! `torchmon-core` crate (crates/torchmon-core); the `py_*` modules here are
//! the thin binding layer over it (docs/internals.md, module map).
#![deny(clippy::undocumented_unsafe_blocks)]

mod py_add_many;
mod py_aggregation;
mod py_async;
mod py_clock;
mod py_compiled;
mod py_convert;
mod py_distribution;
mod py_entry_points;
mod py_event;
mod py_gil_cell;
mod py_lifecycle;
mod py_objects;
mod py_prometheus;
mod py_registry;
mod py_stat;
mod py_stat_args;
mod py_summary;
mod py_torch_wait_counters;
mod py_watchdog;
mod py_window_event;

use pyo3::prelude::*;

// The free-threaded (`Py_GIL_DISABLED`) code paths compile and pass clippy
// (CI checks them against a 3.14t configuration) but have not run on a
// free-threaded interpreter: none can be installed on our machines
// (docs/free-threading.md). Until the suite has run there, the module says it
// needs the GIL, so a free-threaded CPython re-enables the GIL on import (with
// a warning) rather than run untested code concurrently. `PYTHON_GIL=0`
// overrides that at the user's risk.
#[pymodule(gil_used = true)]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // First, before any class or cell is created: a type object made now
    // lives in a static that every interpreter would then share.
    refuse_subinterpreters()?;
    use crate::py_async::{
        _close_async_handlers_at_exit, _drain_async_handlers, _restart_async_handlers_after_fork,
        AsyncEventHandler,
    };
    use crate::py_clock::{_clock_ms, _set_clock_ms, _window_ms};
    use crate::py_compiled::{_stat_add_by_id, _stat_window_now};
    use crate::py_convert::_install_tensor_support;
    use crate::py_lifecycle::{
        _flush_all_stats, _flush_stats_now, _live_stat_count, _reset_stats_after_fork,
    };
    use crate::py_registry::{
        _close_exit_gate, _exit_gate_state, _handler_count, EventHandlerHandle,
        register_event_handler, unregister_event_handler,
    };
    use crate::py_stat::Stat;
    crate::py_aggregation::add_to_module(m)?;
    m.add_class::<AsyncEventHandler>()?;
    m.add_class::<crate::py_distribution::PyDistribution>()?;
    m.add_class::<crate::py_event::DataValueT>()?;
    m.add_class::<crate::py_event::Event>()?;
    m.add_function(wrap_pyfunction!(
        crate::py_event::_event_with_distribution,
        m
    )?)?;
    m.add_class::<EventHandlerHandle>()?;
    m.add_class::<Stat>()?;
    m.add_class::<crate::py_prometheus::_PrometheusExposition>()?;
    m.add_class::<crate::py_summary::_Summary>()?;
    {
        use crate::py_watchdog as watchdog;
        m.add_class::<watchdog::PyWatchdog>()?;
        m.add_class::<watchdog::PySection>()?;
        m.add_function(wrap_pyfunction!(watchdog::_set_stack_dumper, m)?)?;
        m.add_function(wrap_pyfunction!(watchdog::_signal_is_taken, m)?)?;
    }
    m.add_function(wrap_pyfunction!(_close_async_handlers_at_exit, m)?)?;
    m.add_function(wrap_pyfunction!(_restart_async_handlers_after_fork, m)?)?;
    m.add_function(wrap_pyfunction!(_drain_async_handlers, m)?)?;
    m.add_function(wrap_pyfunction!(_clock_ms, m)?)?;
    m.add_function(wrap_pyfunction!(_set_clock_ms, m)?)?;
    m.add_function(wrap_pyfunction!(_window_ms, m)?)?;
    m.add_function(wrap_pyfunction!(_close_exit_gate, m)?)?;
    m.add_function(wrap_pyfunction!(_exit_gate_state, m)?)?;
    m.add_function(wrap_pyfunction!(_handler_count, m)?)?;
    m.add_function(wrap_pyfunction!(register_event_handler, m)?)?;
    m.add_function(wrap_pyfunction!(unregister_event_handler, m)?)?;
    m.add_function(wrap_pyfunction!(_flush_all_stats, m)?)?;
    m.add_function(wrap_pyfunction!(_live_stat_count, m)?)?;
    m.add_function(wrap_pyfunction!(_flush_stats_now, m)?)?;
    m.add_function(wrap_pyfunction!(_reset_stats_after_fork, m)?)?;
    m.add_function(wrap_pyfunction!(_install_tensor_support, m)?)?;
    m.add_function(wrap_pyfunction!(_stat_add_by_id, m)?)?;
    {
        use crate::py_compiled as compiled;
        m.add_function(wrap_pyfunction!(compiled::_record_cpu_tensors, m)?)?;
        m.add_function(wrap_pyfunction!(compiled::_install_staging_store, m)?)?;
        m.add_function(wrap_pyfunction!(compiled::_staging_store, m)?)?;
        m.add_function(wrap_pyfunction!(compiled::_set_read_cpu_at_call, m)?)?;
    }
    m.add_function(wrap_pyfunction!(_stat_window_now, m)?)?;
    {
        use crate::py_torch_wait_counters as wc;
        m.add_function(wrap_pyfunction!(wc::_enable_torch_wait_counters, m)?)?;
        m.add_function(wrap_pyfunction!(wc::_disable_torch_wait_counters, m)?)?;
        m.add_function(wrap_pyfunction!(wc::_torch_wait_counter_probe_seen, m)?)?;
        m.add_function(wrap_pyfunction!(wc::_torch_wait_counter_names, m)?)?;
        m.add("_TORCH_WAIT_COUNTER_PROBE_KEY", wc::PROBE_KEY)?;
    }
    m.add("STAT_EVENT", crate::py_window_event::STAT_EVENT)?;
    m.add("MAX_STAT_NAME_LENGTH", torchmon_core::stat::MAX_NAME_CHARS)?;
    m.add(
        "_BUCKET_MIDPOINTS",
        pyo3::types::PyTuple::new(m.py(), torchmon_core::histogram::MIDPOINTS)?,
    )?;
    // The version is kept in one place, the workspace's Cargo.toml: maturin
    // gives it to the wheel, and `torchmon.__version__` reads it from here
    // (an attribute, not an `__all__` entry).
    m.setattr("__version__", env!("CARGO_PKG_VERSION"))?;
    // Every lazily initialised cell is filled now (py_objects).
    let py = m.py();
    crate::py_objects::init(py)?;
    crate::py_registry::init_lazy(py);
    crate::py_window_event::init_lazy(py);
    crate::py_torch_wait_counters::init();
    crate::py_entry_points::install(m)?;
    crate::py_watchdog::install_beat(py)?;
    Ok(())
}

/// torchmon's state is process-wide (the handler registry, the live Stats,
/// the exit gate, the async workers, the exit hooks) and its Python objects
/// belong to the interpreter that made them, so only the main interpreter
/// may import it. In a subinterpreter, `Stat.add` hung, the subinterpreter's
/// end ran torchmon's exit steps for the whole process, and a handler it left
/// behind crashed the next `log_event` (docs/reliability.md). PyO3's own
/// check covers only submodules, not a module initialised in several phases
/// as this one is, and CPython admits such a module into every
/// subinterpreter that shares the main GIL.
fn refuse_subinterpreters() -> PyResult<()> {
    // SAFETY: called from the module's exec slot, so the calling thread is
    // attached to the interpreter importing the module: `PyInterpreterState_Get`
    // requires exactly that (it returns that interpreter, never NULL), and
    // `PyInterpreterState_Main` only reads the runtime's pointer to the main
    // interpreter, which lives until the runtime is finalized. Only the
    // pointers are compared; nothing is dereferenced.
    let (current, main) = unsafe {
        (
            pyo3::ffi::PyInterpreterState_Get(),
            pyo3::ffi::PyInterpreterState_Main(),
        )
    };
    if current == main {
        return Ok(());
    }
    Err(pyo3::exceptions::PyImportError::new_err(
        "torchmon cannot be imported in a subinterpreter: its state (the handler \
         registry, the live Stats, the exit hooks) is process-wide and belongs to \
         the main interpreter; import and use torchmon there",
    ))
}
