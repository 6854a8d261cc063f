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
mod py_tensorboard;
mod py_torch_wait_counters;
mod py_watchdog;
mod py_window_event;

use pyo3::prelude::*;

/// Adds each class to the module: with `add_functions!`, the one list of
/// what `torchmon._core` exports (python/torchmon/_core.pyi mirrors it).
macro_rules! add_classes {
    ($m:expr, $($class:path),+ $(,)?) => {
        $($m.add_class::<$class>()?;)+
    };
}

/// Adds each `#[pyfunction]` to the module.
macro_rules! add_functions {
    ($m:expr, $($function:path),+ $(,)?) => {
        $($m.add_function(wrap_pyfunction!($function, $m)?)?;)+
    };
}

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
    crate::py_aggregation::add_to_module(m)?;
    add_classes!(
        m,
        crate::py_async::AsyncEventHandler,
        crate::py_distribution::PyDistribution,
        crate::py_event::DataValueT,
        crate::py_event::Event,
        crate::py_registry::EventHandlerHandle,
        crate::py_stat::Stat,
        crate::py_prometheus::_PrometheusExposition,
        crate::py_summary::_Summary,
        crate::py_tensorboard::_TensorboardWriter,
        crate::py_tensorboard::_TensorboardConversion,
        crate::py_watchdog::PyWatchdog,
        crate::py_watchdog::PySection,
    );
    add_functions!(
        m,
        crate::py_event::_event_with_distribution,
        crate::py_distribution::_unpickle_distribution,
        crate::py_watchdog::_set_stack_dumper,
        crate::py_watchdog::_signal_is_taken,
        crate::py_async::_close_async_handlers_at_exit,
        crate::py_async::_restart_async_handlers_after_fork,
        crate::py_async::_drain_async_handlers,
        crate::py_clock::_clock_ms,
        crate::py_clock::_set_clock_ms,
        crate::py_clock::_window_ms,
        crate::py_registry::_close_exit_gate,
        crate::py_registry::_exit_gate_state,
        crate::py_registry::_handler_count,
        crate::py_registry::register_event_handler,
        crate::py_registry::unregister_event_handler,
        crate::py_lifecycle::_flush_all_stats,
        crate::py_lifecycle::_live_stat_count,
        crate::py_lifecycle::_flush_stats_now,
        crate::py_lifecycle::_reset_stats_after_fork,
        crate::py_convert::_install_tensor_support,
        crate::py_compiled::_stat_add_by_id,
        crate::py_compiled::_record_cpu_tensors,
        crate::py_compiled::_install_staging_store,
        crate::py_compiled::_staging_store,
        crate::py_compiled::_set_read_cpu_at_call,
        crate::py_compiled::_stat_window_now,
        crate::py_torch_wait_counters::_enable_torch_wait_counters,
        crate::py_torch_wait_counters::_disable_torch_wait_counters,
        crate::py_torch_wait_counters::_torch_wait_counter_probe_seen,
        crate::py_torch_wait_counters::_torch_wait_counter_names,
    );
    m.add(
        "_TORCH_WAIT_COUNTER_PROBE_KEY",
        crate::py_torch_wait_counters::PROBE_KEY,
    )?;
    m.add("STAT_EVENT", crate::py_window_event::STAT_EVENT)?;
    m.add("MAX_STAT_NAME_LENGTH", torchmon_core::stat::MAX_NAME_CHARS)?;
    // The key of a non-finite float's object in JSON (`{"$float": "nan"}`),
    // for the JSON-lines handler: the core's, which its readers use.
    m.add("_FLOAT_TAG", torchmon_core::histogram::FLOAT_TAG)?;
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
