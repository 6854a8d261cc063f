//! `_TensorboardWriter`: the binding around `tensorboard::EventFileWriter`,
//! the native writer of `TensorboardEventHandler.logdir` (python/torchmon/
//! handlers/tensorboard.py) and `torchmon to-tensorboard`. It only converts
//! the Python arguments; the encoding and the file I/O run on the core's
//! worker thread. `_TensorboardConversion` is `torchmon to-tensorboard`'s
//! reader: the core's `tensorboard::convert` fed the log's bytes, queuing on
//! a `_TensorboardWriter` without a Python object per Stat line.

use crate::py_distribution::PyDistribution;
use pyo3::exceptions::{PyOSError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use torchmon_core::tensorboard::convert::{Conversion, ConvertError, Relayed};
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

impl _TensorboardWriter {
    /// Queues `event`, waiting for room without the GIL when the queue is
    /// full.
    fn queue(&self, py: Python<'_>, event: SummaryEvent) -> Written {
        match self.inner.try_write(event) {
            Ok(written) => written,
            Err(event) => py.detach(|| self.inner.write_within(event, patience(None))),
        }
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
        Ok(self.queue(py, event) == Written::Queued)
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

#[pyclass(module = "torchmon._core")]
pub struct _TensorboardConversion {
    conversion: Conversion,
    writer: Py<_TensorboardWriter>,
    /// The reader of a line the core leaves to Python: `relay(line, lineno)`
    /// returns None (no event), True (an event it wrote itself) or, for a
    /// Stat event, `(its JSON line again, its wall time)`.
    relay: Py<PyAny>,
}

#[pymethods]
impl _TensorboardConversion {
    /// `grouped`: `--layout grouped`; `line_limit`: the longest line, its
    /// newline included.
    #[new]
    fn new(
        writer: Py<_TensorboardWriter>,
        grouped: bool,
        line_limit: usize,
        relay: Py<PyAny>,
    ) -> Self {
        _TensorboardConversion {
            conversion: Conversion::new(grouped, line_limit),
            writer,
            relay,
        }
    }

    /// The log's next bytes (`b""` at its end); returns the number of a line
    /// longer than `line_limit`, or 0. At the end: how many events it held.
    fn feed(&mut self, py: Python<'_>, block: &[u8]) -> PyResult<u64> {
        let relay = self.relay.bind(py);
        let mut call = |line: &[u8], lineno: u64| -> PyResult<Relayed> {
            let made = relay.call1((PyBytes::new(py, line), lineno))?;
            if made.is_none() {
                return Ok(Relayed::Nothing);
            }
            if made.is_instance_of::<PyBool>() {
                return Ok(Relayed::Handled);
            }
            let (line, wall_time) = made.extract::<(Bound<'_, PyBytes>, f64)>()?;
            Ok(Relayed::Stat(line.as_bytes().to_vec(), wall_time))
        };
        let writer = self.writer.get();
        let mut emit = |event: SummaryEvent| {
            writer.queue(py, event);
        };
        let result = match block {
            [] => self.conversion.finish(&mut call, &mut emit),
            _ => self
                .conversion
                .feed(block, &mut call, &mut emit)
                .map(|()| 0),
        };
        match result {
            Ok(n) | Err(ConvertError::LineTooLong(n)) => Ok(n),
            Err(ConvertError::Relay(err)) => Err(err),
            Err(ConvertError::Unread(n)) => Err(PyRuntimeError::new_err(format!(
                "line {n}: its Stat event, written again, did not read"
            ))),
        }
    }

    /// `(events, scalars from Stat events)` so far.
    #[getter]
    fn counts(&self) -> (u64, u64) {
        (self.conversion.records(), self.conversion.stat_scalars())
    }
}
