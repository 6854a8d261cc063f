//! The clock override behind `torchmon.testing.ManualClock`, and the
//! one rule for a window size (docs/api.md, "Window sizes").

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
    if let Some(ms) = ms
        && ms < clock::MIN_OVERRIDE_MS
    {
        return Err(PyValueError::new_err(format!(
            "the test clock cannot be set before 0 ms (got {ms})"
        )));
    }
    Ok(clock::set_override_ms(ms))
}

/// The time (ms) Stats read now: the override if set, else the monotonic clock.
#[pyfunction]
pub fn _clock_ms() -> i64 {
    clock::now_ms()
}

/// `datetime.timedelta.max` in whole milliseconds (999,999,999 days and
/// 86,399,999 ms): the longest window a timedelta holds.
pub const TIMEDELTA_MAX_MS: i64 = 999_999_999 * 86_400_000 + 86_399_999;

/// Whose contract a window size follows: the one rule of docs/api.md
/// ("Window sizes"), in its two forms.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum WindowRule {
    /// `Stat`, torch.monitor's: a timedelta or a float (an int is a
    /// `TypeError`, as torch), up to int64 milliseconds (SPEC.md).
    Torch,
    /// Every torchmon API that takes a window size: a timedelta or an int or
    /// float number of seconds, up to `timedelta.max` (they hold the window
    /// as a timedelta).
    Torchmon,
}

/// A window size whose type was checked (the type phase), before its value.
pub enum WindowArg {
    Millis(i128),
    Seconds(f64),
    /// An int number of seconds beyond i128: past every bound, either way.
    HugeInt {
        negative: bool,
    },
}

/// Type phase of the window rule: `TypeError` for anything but a timedelta,
/// a float or (under `WindowRule::Torchmon`) an int other than a bool.
pub fn window_arg(
    call: &str,
    arg: &str,
    value: &Bound<'_, PyAny>,
    rule: WindowRule,
) -> PyResult<WindowArg> {
    if let Ok(delta) = value.cast::<PyDelta>() {
        let micros = i128::from(delta.get_days()) * 86_400_000_000
            + i128::from(delta.get_seconds()) * 1_000_000
            + i128::from(delta.get_microseconds());
        // Truncated toward zero, like std::chrono::duration_cast.
        return Ok(WindowArg::Millis(micros / 1000));
    }
    if let Ok(f) = value.cast::<PyFloat>() {
        return Ok(WindowArg::Seconds(f.value()));
    }
    if rule == WindowRule::Torchmon
        && value.is_instance_of::<PyInt>()
        && !value.is_instance_of::<PyBool>()
    {
        return Ok(match value.extract::<i128>() {
            Ok(seconds) => WindowArg::Millis(seconds.saturating_mul(1000)),
            Err(_) => WindowArg::HugeInt {
                negative: value.lt(0)?,
            },
        });
    }
    let expected = match rule {
        WindowRule::Torch => "a datetime.timedelta or a float number of seconds",
        WindowRule::Torchmon => "a datetime.timedelta or an int or float number of seconds",
    };
    Err(arg_type_error(call, arg, expected, value))
}

/// Value phase of the window rule: whole milliseconds, truncated (seconds:
/// the decimal that `repr` shows, `clock::seconds_to_ms`), finite, at least
/// 1 ms and at most the rule's bound; else `ValueError`.
pub fn window_ms(call: &str, arg: &str, window: WindowArg, rule: WindowRule) -> PyResult<i64> {
    let millis = match window {
        WindowArg::Millis(ms) => ms,
        WindowArg::Seconds(s) => {
            if !s.is_finite() {
                return Err(arg_value_error(
                    call,
                    arg,
                    format_args!("must be finite, not {s}"),
                ));
            }
            clock::seconds_to_ms(s)
        }
        WindowArg::HugeInt { negative: true } => {
            return Err(arg_value_error(
                call,
                arg,
                "must be at least 1 millisecond (got an int below -2**127 seconds)",
            ));
        }
        // Past either bound: the "too large" below.
        WindowArg::HugeInt { negative: false } => i128::MAX,
    };
    if millis < 1 {
        return Err(arg_value_error(
            call,
            arg,
            format_args!(
                "must be at least 1 millisecond (got {millis} ms after truncation to whole milliseconds)"
            ),
        ));
    }
    let (bound, what) = match rule {
        WindowRule::Torch => (i64::MAX, "int64"),
        WindowRule::Torchmon => (TIMEDELTA_MAX_MS, "datetime.timedelta.max"),
    };
    if millis > i128::from(bound) {
        return Err(arg_value_error(
            call,
            arg,
            format_args!("is too large (at most {bound} milliseconds, {what})"),
        ));
    }
    Ok(millis as i64)
}

/// The window rule (`WindowRule::Torchmon`) for the APIs written in Python:
/// `value` in whole milliseconds, or the `TypeError`/`ValueError` naming
/// `call` and `arg` that `Stat` would raise in the same format.
#[pyfunction]
pub fn _window_ms(call: &str, arg: &str, value: &Bound<'_, PyAny>) -> PyResult<i64> {
    let window = window_arg(call, arg, value, WindowRule::Torchmon)?;
    window_ms(call, arg, window, WindowRule::Torchmon)
}
