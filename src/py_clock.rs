//! The clock override behind `torchmon.testing.ManualClock`, and the
//! conversion of window sizes in seconds.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

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

/// A window size in float seconds as whole milliseconds
/// (`clock::seconds_to_ms`), so that `WaitCounter` converts as `Stat` does.
/// NaN or infinite: `ValueError`.
#[pyfunction]
pub fn _window_ms_of_seconds(seconds: f64) -> PyResult<i128> {
    if !seconds.is_finite() {
        return Err(PyValueError::new_err(format!(
            "window_size must be finite, not {seconds}"
        )));
    }
    Ok(clock::seconds_to_ms(seconds))
}
