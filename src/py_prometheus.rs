//! `_PrometheusExposition`: the binding around `prometheus::Exposition`, the
//! cumulative state of a `PrometheusEventHandler` (python/torchmon/handlers/
//! prometheus.py) that a scrape renders without holding the GIL.

use crate::py_distribution::PyDistribution;
use parking_lot::Mutex;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use torchmon_core::prometheus::negotiate::{Escaping, Format, Negotiated, negotiate};
use torchmon_core::prometheus::server::{Limits, MAX_HEAD, Render, Server};
use torchmon_core::prometheus::{ClassicLayout, Exposition, Reading, Served};

/// The outer lock is only ever taken while attached to Python and held for
/// an `Arc` clone or swap, so on GIL builds no thread holds it at a fork.
/// The exposition's own locks are taken by a scrape's render, detached from
/// Python: a fork may copy one locked, which is why a forked child gets a
/// new exposition (`_after_fork_in_child`).
#[pyclass(module = "torchmon._core", frozen, weakref)]
pub struct _PrometheusExposition {
    state: Mutex<Arc<Served>>,
    closed: Arc<AtomicBool>,
    /// The server of `serve`; like `state`, its lock is only taken while
    /// attached to Python, for a take or a put.
    server: Mutex<Option<Server>>,
}

impl _PrometheusExposition {
    fn state(&self) -> Arc<Served> {
        self.state.lock().clone()
    }
}

#[pymethods]
impl _PrometheusExposition {
    /// `labels`: `(name, value)` pairs on every metric; `max_buckets`: the
    /// bucket limit per native histogram; `classic`: `(per_octave, lo, hi)`
    /// of the handler's classic layout (`ClassicLayout::new`: the text
    /// exposition's and a collector's buckets); `protobuf_classic`: the
    /// protobuf body carries them too; `watchdog_gauge`: the name of the
    /// watchdog's beat-age gauge, read at each render.
    #[new]
    #[pyo3(signature = (labels, max_buckets, classic=None, protobuf_classic=false, watchdog_gauge=None))]
    fn new(
        labels: Vec<(String, String)>,
        max_buckets: usize,
        classic: Option<(u32, f64, f64)>,
        protobuf_classic: bool,
        watchdog_gauge: Option<String>,
    ) -> PyResult<Self> {
        // The handler checked its arguments; anything else is refused here
        // rather than met as a panic in a render.
        let layout = |(per_octave, lo, hi)| ClassicLayout::new(per_octave, lo, hi);
        let classic = match classic.map(layout) {
            Some(None) => Err(PyValueError::new_err(
                "_PrometheusExposition(classic): per_octave must divide 64 and 0 < lo < hi < inf",
            ))?,
            layout => layout.flatten(),
        };
        let mut exposition = Exposition::new(labels, max_buckets, classic, protobuf_classic);
        if let Some(name) = watchdog_gauge {
            exposition = exposition.with_watchdog_gauge(name);
        }
        Ok(_PrometheusExposition {
            state: Mutex::new(Served::new(exposition)),
            closed: Arc::new(AtomicBool::new(false)),
            server: Mutex::new(None),
        })
    }

    /// The Rust server's bounds on slow clients, which the Python server of
    /// `serve(registry=...)` keeps too: `Limits::default()`'s fields in
    /// order, deadlines in seconds, and `MAX_HEAD`.
    #[staticmethod]
    fn limits() -> (usize, f64, f64, usize, f64, usize) {
        let limits = Limits::default();
        (
            limits.max_connections,
            limits.head_deadline.as_secs_f64(),
            limits.response_deadline.as_secs_f64(),
            limits.max_rejecting,
            limits.reject_deadline.as_secs_f64(),
            MAX_HEAD,
        )
    }

    /// The Rust server's negotiation of a scrape with this `Accept` header,
    /// the one rule of every scrape path:
    /// `(protobuf, escaping scheme named or None, Content-Type)`.
    #[staticmethod]
    fn negotiate(accept: &str) -> (bool, Option<&'static str>, String) {
        let n = negotiate(accept);
        let protobuf = n.format == Format::Protobuf;
        (protobuf, n.escaping.map(Escaping::as_str), n.content_type())
    }

    /// Creates the histogram (`histogram` true) or the gauge `name`; a
    /// no-op if it exists with that kind. `utf8_name`: the name a scraper
    /// asking for UTF-8 names gets (default `name`).
    #[pyo3(signature = (name, help, histogram, utf8_name = None))]
    fn declare(
        &self,
        name: &str,
        help: &str,
        histogram: bool,
        utf8_name: Option<&str>,
    ) -> PyResult<()> {
        let utf8_name = utf8_name.unwrap_or(name);
        let exposition = &self.state().exposition;
        let created = exposition.declare_as(name, utf8_name, help, histogram);
        created.map(drop).map_err(|_| {
            let message = format!("_PrometheusExposition: {name:?} is already of the other kind");
            PyValueError::new_err(message)
        })
    }

    /// Every metric as `(name, help, value, None)` for a gauge and `(name,
    /// help, sum, [cumulative count at each of le_texts])` for a histogram,
    /// read detached from Python: what the handler's collector gives its
    /// prometheus_client registry.
    fn families(&self, py: Python<'_>) -> Vec<(String, String, f64, Option<Vec<u64>>)> {
        let state = self.state();
        let readings = py.detach(|| state.exposition.snapshot());
        let family = |(name, help, reading)| match reading {
            Reading::Gauge(value) => (name, help, value, None),
            Reading::Histogram(counts, sum) => (name, help, sum, Some(counts)),
        };
        readings.into_iter().map(family).collect()
    }

    /// The `le` label values of a histogram's buckets (`Exposition::le_texts`).
    #[getter]
    fn le_texts(&self) -> Vec<String> {
        self.state().exposition.le_texts()
    }

    /// Sets a declared gauge; an undeclared name is ignored.
    fn set_gauge(&self, name: &str, value: f64) {
        self.state().exposition.set_gauge(name, value);
    }

    /// Adds a window's `torchmon.Distribution` to a declared histogram; an
    /// undeclared name is ignored.
    fn add_distribution(&self, name: &str, distribution: &Bound<'_, PyDistribution>) {
        let window = distribution.get().core();
        let exposition = &self.state().exposition;
        exposition.update_histogram(name, |histogram| histogram.add_distribution(window));
    }

    /// Every metric as length-delimited protobuf `MetricFamily` messages
    /// (`protobuf`) or as the text exposition (format 0.0.4, byte for byte
    /// prometheus_client's for the handler's registry), rendered detached
    /// from Python (the GIL is held only to take the state and to make the
    /// bytes); `None` once closed. `escaping`: the scheme `negotiate` found
    /// (an unknown one, or `None`: the names as Prometheus 2 gets them).
    #[pyo3(signature = (protobuf, escaping = None))]
    fn render<'py>(
        &self,
        py: Python<'py>,
        protobuf: bool,
        escaping: Option<&str>,
    ) -> Option<Bound<'py, PyBytes>> {
        let state = self.state();
        let format = if protobuf {
            Format::Protobuf
        } else {
            Format::Text
        };
        let negotiated = Negotiated {
            format,
            escaping: escaping.and_then(Escaping::parse),
        };
        let body = py.detach(|| state.render(&self.closed, negotiated))?;
        Some(PyBytes::new(py, &body))
    }

    /// Serves `render`'s bodies over HTTP on `host:port` from a Rust thread
    /// that never attaches to Python (torchmon_core::prometheus::server);
    /// returns the port. An `OSError` with the errno if it cannot bind.
    fn serve(&self, py: Python<'_>, host: &str, port: u16) -> PyResult<u16> {
        if self.server.lock().is_some() {
            return Err(PyValueError::new_err(
                "_PrometheusExposition.serve: already serving",
            ));
        }
        let state = self.state();
        let closed = self.closed.clone();
        let render: Arc<Render> = Arc::new(move |negotiated| state.render(&closed, negotiated));
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

    /// Later renders return `None`; a render in progress completes first.
    fn close(&self, py: Python<'_>) {
        let state = self.state();
        py.detach(|| state.close(&self.closed));
    }

    /// In a forked child: a new, empty state (the parent's may have been
    /// copied locked by a render on another thread; a child serves nothing
    /// of the parent's).
    fn _after_fork_in_child(&self) {
        // The server's threads are the parent's: the child closes its copies
        // of the listening socket and of the connections, and forgets the rest.
        if let Some(server) = self.server.lock().take() {
            server.forget_in_child();
        }
        let fresh = self.state().exposition.fresh();
        *self.state.lock() = Served::new(fresh);
    }
}
