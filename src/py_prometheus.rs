//! `_PrometheusExposition`: the binding around `prometheus::Exposition`, the
//! cumulative state of a `PrometheusEventHandler` (python/torchmon/handlers/
//! prometheus.py) that a scrape renders without holding the GIL.

use parking_lot::Mutex;
use pyo3::exceptions::{PyOSError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use std::time::Duration;
use torchmon_core::prometheus::{ClassicLayout, Exposition};
use torchmon_core::prometheus_server::{Format, Render, Server};

/// The outer lock is only ever taken while attached to Python and held for
/// an `Arc` clone or swap, so on GIL builds no thread holds it at a fork.
/// The exposition's own locks are taken by a scrape's render, detached from
/// Python: a fork may copy one locked, which is why a forked child gets a
/// new exposition (`_after_fork_in_child`).
#[pyclass(module = "torchmon._core", frozen, weakref)]
pub struct _PrometheusExposition {
    state: Mutex<Arc<Shared>>,
    closed: Arc<AtomicBool>,
    /// The server of `serve`; like `state`, its lock is only taken while
    /// attached to Python, for a take or a put.
    server: Mutex<Option<Server>>,
    /// The constructor's arguments, for the child's new state.
    config: (Vec<(String, String)>, usize, Option<ClassicLayout>, bool),
}

struct Shared {
    exposition: Exposition,
    /// Held across a render and by close(), so that a render completes
    /// before a close or sees it.
    closing: Mutex<()>,
}

impl Shared {
    fn new(exposition: Exposition) -> Arc<Shared> {
        Arc::new(Shared {
            exposition,
            closing: Mutex::new(()),
        })
    }
}

impl _PrometheusExposition {
    fn state(&self) -> Arc<Shared> {
        self.state.lock().clone()
    }
}

impl Shared {
    /// A scrape's body, or `None` once closed; never attached to Python.
    fn render(&self, closed: &AtomicBool, format: Format) -> Option<Vec<u8>> {
        let _not_closing = self.closing.lock();
        if closed.load(Ordering::Acquire) {
            return None;
        }
        Some(match format {
            Format::Protobuf => {
                let mut body = Vec::with_capacity(256 * self.exposition.len());
                self.exposition.encode_protobuf(&mut body);
                body
            }
            Format::Text => {
                let mut body = String::with_capacity(512 * self.exposition.len());
                self.exposition.encode_text(&mut body);
                body.into_bytes()
            }
        })
    }
}

fn clash(name: &str) -> PyErr {
    PyValueError::new_err(format!(
        "_PrometheusExposition: {name:?} is already a metric of the other kind"
    ))
}

/// A `(index, count)` pair sequence of a Distribution (its `positive` or
/// `negative`): a tuple of 2-tuples of ints.
fn bucket_pairs(side: &Bound<'_, PyAny>) -> PyResult<Vec<(i32, u64)>> {
    let side = side.cast::<PyTuple>().map_err(|_| {
        PyTypeError::new_err("_PrometheusExposition.add_distribution: buckets must be a tuple")
    })?;
    let mut pairs = Vec::with_capacity(side.len());
    for pair in side.iter() {
        pairs.push(pair.extract::<(i32, u64)>()?);
    }
    Ok(pairs)
}

#[pymethods]
impl _PrometheusExposition {
    /// `labels`: `(name, value)` pairs on every metric; `max_buckets`: the
    /// bucket limit per native histogram; `classic`: `(shift, first, uppers)`
    /// of the handler's classic layout (the text exposition's buckets);
    /// `protobuf_classic`: the protobuf body carries them too.
    #[new]
    #[pyo3(signature = (labels, max_buckets, classic=None, protobuf_classic=false))]
    fn new(
        labels: Vec<(String, String)>,
        max_buckets: usize,
        classic: Option<(u32, i32, Vec<f64>)>,
        protobuf_classic: bool,
    ) -> PyResult<Self> {
        // The handler passes its layout; anything else is refused here
        // rather than met as a panic in a render.
        if let Some((shift, _, uppers)) = &classic
            && (*shift > 6 || uppers.is_empty())
        {
            return Err(PyValueError::new_err(
                "_PrometheusExposition(classic): shift must be 0 to 6 and the bounds not empty",
            ));
        }
        let classic = classic.map(|(shift, first, uppers)| ClassicLayout {
            shift,
            first,
            uppers,
        });
        let config = (labels, max_buckets, classic, protobuf_classic);
        Ok(_PrometheusExposition {
            state: Mutex::new(Shared::new(Exposition::new(
                config.0.clone(),
                config.1,
                config.2.clone(),
                config.3,
            ))),
            closed: Arc::new(AtomicBool::new(false)),
            server: Mutex::new(None),
            config,
        })
    }

    /// Creates the gauge `name` (a no-op if it exists).
    fn declare_gauge(&self, name: &str, help: &str) -> PyResult<()> {
        self.state()
            .exposition
            .declare(name, help, false)
            .map_err(|_| clash(name))
    }

    /// Creates the histogram `name` (a no-op if it exists).
    fn declare_histogram(&self, name: &str, help: &str) -> PyResult<()> {
        self.state()
            .exposition
            .declare(name, help, true)
            .map_err(|_| clash(name))
    }

    /// Sets a declared gauge; an undeclared name is ignored.
    fn set_gauge(&self, name: &str, value: f64) {
        self.state().exposition.set_gauge(name, value);
    }

    /// Adds a window's `torchmon.Distribution` to a declared histogram; an
    /// undeclared name is ignored.
    fn add_distribution(&self, name: &str, distribution: &Bound<'_, PyAny>) -> PyResult<()> {
        let sum: f64 = distribution.getattr("sum")?.extract()?;
        let zero: u64 = distribution.getattr("zero_count")?.extract()?;
        let positive_inf: u64 = distribution.getattr("positive_inf_count")?.extract()?;
        let negative_inf: u64 = distribution.getattr("negative_inf_count")?.extract()?;
        let positive = bucket_pairs(&distribution.getattr("positive")?)?;
        let negative = bucket_pairs(&distribution.getattr("negative")?)?;
        self.state().exposition.update_histogram(name, |histogram| {
            histogram.add_window(sum, zero, positive_inf, negative_inf, positive, negative);
        });
        Ok(())
    }

    /// Every metric as length-delimited protobuf `MetricFamily` messages,
    /// rendered detached from Python (the GIL is held only to take the state
    /// and to make the bytes); `None` once closed.
    fn render_protobuf<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        let state = self.state();
        let body = py.detach(|| state.render(&self.closed, Format::Protobuf))?;
        Some(PyBytes::new(py, &body))
    }

    /// The text exposition (format 0.0.4) of every metric, byte for byte
    /// prometheus_client's for the handler's registry, rendered detached
    /// from Python like `render_protobuf`; `None` once closed.
    fn render_text<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        let state = self.state();
        let body = py.detach(|| state.render(&self.closed, Format::Text))?;
        Some(PyBytes::new(py, &body))
    }

    /// Serves `render`'s bodies over HTTP on `host:port` from a Rust thread
    /// that never attaches to Python (torchmon_core::prometheus_server);
    /// returns the port. An `OSError` with the errno if it cannot bind.
    fn serve(&self, py: Python<'_>, host: &str, port: u16) -> PyResult<u16> {
        if self.server.lock().is_some() {
            return Err(PyValueError::new_err(
                "_PrometheusExposition.serve: already serving",
            ));
        }
        let state = self.state();
        let closed = self.closed.clone();
        let render: Arc<Render> = Arc::new(move |format| state.render(&closed, format));
        let server =
            py.detach(|| Server::start(host, port, render))
                .map_err(|error| match error.raw_os_error() {
                    Some(code) => PyOSError::new_err((code, error.to_string())),
                    None => PyOSError::new_err(error.to_string()),
                })?;
        let port = server.port();
        *self.server.lock() = Some(server);
        Ok(port)
    }

    /// Stops the server of `serve` and frees its port, waiting (detached)
    /// up to 5 s for its accepting thread; a no-op if none runs.
    fn stop_server(&self, py: Python<'_>) {
        let server = self.server.lock().take();
        if let Some(server) = server {
            py.detach(|| server.stop(Duration::from_secs(5)));
        }
    }

    /// The port served by `serve`, `None` if none.
    #[getter]
    fn server_port(&self) -> Option<u16> {
        self.server.lock().as_ref().map(Server::port)
    }

    /// Later renders return `None`; a render in progress completes first.
    fn close(&self, py: Python<'_>) {
        let state = self.state();
        py.detach(|| {
            let _no_render = state.closing.lock();
            self.closed.store(true, Ordering::Release);
        });
    }

    #[getter]
    fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// In a forked child: a new, empty state (the parent's may have been
    /// copied locked by a render on another thread; a child serves nothing
    /// of the parent's).
    fn _after_fork_in_child(&self) {
        // The server's threads are the parent's: the child closes its
        // copies of the listening socket and of the connections, and
        // forgets the rest.
        if let Some(server) = self.server.lock().take() {
            server.forget_in_child();
        }
        let (labels, max_buckets, classic, protobuf_classic) = &self.config;
        let fresh = Exposition::new(
            labels.clone(),
            *max_buckets,
            classic.clone(),
            *protobuf_classic,
        );
        *self.state.lock() = Shared::new(fresh);
    }
}
