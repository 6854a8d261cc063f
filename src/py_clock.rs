//! The clock override behind `torchmon.testing.ManualClock`, and the
//! window-size rule (docs/api.md, "Window sizes") read from Python objects:
//! the rule itself is the core's (`torchmon_core::window`).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDelta, PyDeltaAccess, PyFloat, PyInt};

use crate::py_convert::{arg_type_error, arg_value_error};

use torchmon_core::clock;

/// Sets the time (ms) every Stat reads, or restores the real clock with
/// `None`; returns the previous override.
#[pyfunction]
#[pyo3(signature = (ms))]
pub fn _set_clock_ms(ms: Option<i64>) -> PyResult<Option<i64>> {
    clock::set_checked_override_ms(ms).map_err(PyValueError::new_err)
}

/// The time (ms) Stats read now: the override if set, else the monotonic clock.
#[pyfunction]
pub fn _clock_ms() -> i64 {
    clock::now_ms()
}

pub use torchmon_core::window::{TIMEDELTA_MAX_MS, WindowArg, WindowRule};

/// Type phase of the window rule: `TypeError` for anything but a timedelta,
/// a float or (when the rule takes one) an int other than a bool.
pub fn window_arg(
    call: &str,
    arg: &str,
    value: &Bound<'_, PyAny>,
    rule: WindowRule,
) -> PyResult<WindowArg> {
    if let Ok(delta) = value.cast::<PyDelta>() {
        let (days, seconds, micros) = (
            delta.get_days(),
            delta.get_seconds(),
            delta.get_microseconds(),
        );
        return Ok(WindowArg::timedelta(days, seconds, micros));
    }
    if let Ok(f) = value.cast::<PyFloat>() {
        return Ok(WindowArg::Seconds(f.value()));
    }
    if rule.takes_int() && value.is_instance_of::<PyInt>() && !value.is_instance_of::<PyBool>() {
        return Ok(match value.extract::<i128>() {
            Ok(seconds) => WindowArg::int_seconds(seconds),
            Err(_) => WindowArg::HugeInt {
                negative: value.lt(0)?,
            },
        });
    }
    Err(arg_type_error(call, arg, rule.expected(), value))
}

/// Value phase of the window rule (`torchmon_core::window::window_ms`): its
/// refusal as the `ValueError` naming `call` and `arg`.
pub fn window_ms(call: &str, arg: &str, window: WindowArg, rule: WindowRule) -> PyResult<i64> {
    torchmon_core::window::window_ms(window, rule)
        .map_err(|problem| arg_value_error(call, arg, problem))
}

/// The window rule (`WindowRule::Torchmon`) for the APIs written in Python:
/// `value` in whole milliseconds, or the `TypeError`/`ValueError` naming
/// `call` and `arg` that `Stat` would raise in the same format.
#[pyfunction]
pub fn _window_ms(call: &str, arg: &str, value: &Bound<'_, PyAny>) -> PyResult<i64> {
    let window = window_arg(call, arg, value, WindowRule::Torchmon)?;
    window_ms(call, arg, window, WindowRule::Torchmon)
}
