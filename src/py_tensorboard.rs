//! `_TensorboardWriter`: the binding around `tensorboard::EventFileWriter`,
//! the native writer of `TensorboardEventHandler.logdir` (python/torchmon/
//! handlers/tensorboard.py) and `torchmon to-tensorboard`. It only converts
//! the Python arguments; the encoding and the file I/O run on the core's
//! worker thread.

use crate::py_distribution::PyDistribution;
use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use torchmon_core::tensorboard::{EventFileWriter, SummaryEvent, Written};

#[pyclass(module = "torchmon._core", frozen, weakref)]
pub struct _TensorboardWriter {
    inner: EventFileWriter,
}

/// Seconds as a `Duration`; `None` (no limit) as a year.
fn patience(seconds: Option<f64>) -> Duration {
    match seconds {
        Some(s) if s.is_finite() && s >= 0.0 => Duration::from_secs_f64(s.min(3.0e7)),
        Some(s) if s.is_nan() || s < 0.0 => Duration::ZERO,
        _ => Duration::from_secs(365 * 24 * 3600),
    }
}

#[pymethods]
impl _TensorboardWriter {
    /// Makes `logdir` if needed and the event file in it; else an
    /// `OSError(errno, message, path)` naming the path that could not be
    /// made or written.
    #[new]
    #[pyo3(signature = (logdir, filename_suffix=""))]
    fn new(logdir: PathBuf, filename_suffix: &str) -> PyResult<Self> {
        match EventFileWriter::create(&logdir, filename_suffix) {
            Ok(inner) => Ok(_TensorboardWriter { inner }),
            Err(failed) => {
                let message = failed.error.to_string();
                let path = failed.path;
                Err(match failed.error.raw_os_error() {
                    Some(code) => PyOSError::new_err((code, message, path)),
                    None => PyOSError::new_err(format!("{}: {message}", path.display())),
                })
            }
        }
    }

    /// The event file being written: a new one once the first was removed.
    #[getter]
    fn path(&self) -> PathBuf {
        self.inner.path()
    }

    /// `(scalars, non_finite)`: the scalars handed to `write` in this
    /// process, and the NaN or infinite ones among them.
    #[getter]
    fn counts(&self) -> (u64, u64) {
        self.inner.counts()
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// Queues one `Event`: its scalars (`tags[i]` = `values[i]`) and, if
    /// given, a histogram `(tag, distribution)`. Waits for room only when
    /// the queue is full (without the GIL). Returns whether it was queued
    /// (`False`: closed, or called in a forked child).
    #[pyo3(signature = (wall_time, step, tags, values, histogram=None))]
    fn write(
        &self,
        py: Python<'_>,
        wall_time: f64,
        step: i64,
        tags: Vec<String>,
        values: Vec<f64>,
        histogram: Option<(String, PyRef<'_, PyDistribution>)>,
    ) -> PyResult<bool> {
        if tags.len() != values.len() {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "_TensorboardWriter.write(): tags and values differ in length",
            ));
        }
        let event = SummaryEvent {
            wall_time,
            step,
            scalars: tags.into_iter().zip(values).collect(),
            histograms: histogram
                .map(|(tag, d)| vec![(tag, Arc::clone(d.core()))])
                .unwrap_or_default(),
        };
        let written = match self.inner.try_write(event) {
            Ok(written) => written,
            Err(event) => py.detach(|| self.inner.write_within(event, patience(None))),
        };
        Ok(written == Written::Queued)
    }

    /// Waits up to `timeout` seconds (`None`: no limit) for everything
    /// queued before to be in the file, without the GIL.
    #[pyo3(signature = (timeout=None))]
    fn flush(&self, py: Python<'_>, timeout: Option<f64>) -> bool {
        let deadline = Instant::now() + patience(timeout);
        py.detach(|| self.inner.flush(deadline))
    }

    /// Writes what is queued (up to `timeout` seconds), then stops the
    /// worker thread; later writes return `False`.
    #[pyo3(signature = (timeout=None))]
    fn close(&self, py: Python<'_>, timeout: Option<f64>) -> bool {
        let patience = patience(timeout);
        py.detach(|| self.inner.close(patience))
    }
}
