//! `_Summary`, behind `torchmon summarize` (python/torchmon/cli/summarize.py):
//! the core's `summary::Summary` fed the logs' bytes, and its rows as tuples
//! for the Python table formatting. A line the core leaves to Python goes to
//! the reader's fallback, whose event (or error) is the Python reader's.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyString};
use torchmon_core::histogram::{Buckets, Distribution};
use torchmon_core::summary::line::Value;
use torchmon_core::summary::{Decoded, FeedError, Summary};

#[pyclass(module = "torchmon._core")]
pub struct _Summary {
    summary: Summary,
    /// The current file's reader of a line: `(event, distribution)` or None.
    fallback: Option<Py<PyAny>>,
}

/// The fallback's `(event, distribution)`, or `None` for an unreadable line.
fn decoded(result: &Bound<'_, PyAny>) -> PyResult<Option<Decoded>> {
    if result.is_none() {
        return Ok(None);
    }
    let (event, distribution): (Bound<'_, PyAny>, Bound<'_, PyAny>) = result.extract()?;
    let name: String = event.getattr("name")?.extract()?;
    let data = event.getattr("data")?.cast_into::<PyDict>()?;
    let mut values = Vec::with_capacity(data.len());
    for (key, value) in data.iter() {
        let number = if value.is_instance_of::<PyBool>() || value.is_instance_of::<PyString>() {
            Value::Other
        } else if value.is_instance_of::<PyInt>() || value.is_instance_of::<PyFloat>() {
            Value::Number(value.extract::<f64>()?)
        } else {
            return Err(PyTypeError::new_err(
                "an event's data value is not str/int/float/bool",
            ));
        };
        values.push((key.extract::<String>()?, number));
    }
    let distribution = if distribution.is_none() {
        None
    } else {
        let get = |name: &str| distribution.getattr(name);
        Some(Distribution {
            count: get("count")?.extract()?,
            sum: get("sum")?.extract()?,
            min: get("min")?.extract()?,
            max: get("max")?.extract()?,
            buckets: Buckets {
                zero_count: get("zero_count")?.extract()?,
                nan_count: get("nan_count")?.extract()?,
                positive_inf_count: get("positive_inf_count")?.extract()?,
                negative_inf_count: get("negative_inf_count")?.extract()?,
                positive: get("positive")?.extract()?,
                negative: get("negative")?.extract()?,
            },
        })
    };
    Ok(Some(Decoded {
        name,
        data: values,
        distribution,
    }))
}

#[pymethods]
impl _Summary {
    /// `line_limit`: the longest line, its newline included; `ranks`:
    /// whether to keep the tables across files.
    #[new]
    fn new(line_limit: usize, ranks: bool) -> Self {
        _Summary {
            summary: Summary::new(line_limit, ranks),
            fallback: None,
        }
    }

    /// Starts a file: `label` names it in the tables across files, and
    /// `fallback(line, lineno)` reads the lines the core leaves to Python
    /// (`JsonlReader._line`).
    fn start_file(&mut self, label: &str, fallback: Py<PyAny>) {
        self.summary.start_file(label);
        self.fallback = Some(fallback);
    }

    /// The file's next bytes; returns the number of a line longer than
    /// `line_limit`, or 0.
    fn feed(&mut self, py: Python<'_>, block: &[u8]) -> PyResult<u64> {
        let fallback = self.fallback(py)?;
        let mut call = |line: &[u8], lineno: u64, _: bool| {
            decoded(&fallback.call1((PyBytes::new(py, line), lineno))?)
        };
        match self.summary.feed(block, &mut call) {
            Ok(()) => Ok(0),
            Err(FeedError::LineTooLong(lineno)) => Ok(lineno),
            Err(FeedError::Fallback(err)) => Err(err),
        }
    }

    /// Ends the file; returns how many events it held.
    fn finish_file(&mut self, py: Python<'_>) -> PyResult<u64> {
        let fallback = self.fallback(py)?;
        let mut call = |line: &[u8], lineno: u64, _: bool| {
            decoded(&fallback.call1((PyBytes::new(py, line), lineno))?)
        };
        match self.summary.finish_file(&mut call) {
            Ok(records) => Ok(records),
            // feed() refused the line when it grew too long.
            Err(FeedError::LineTooLong(_)) => Ok(0),
            Err(FeedError::Fallback(err)) => Err(err),
        }
    }

    fn has_stats(&self) -> bool {
        self.summary.has_stats()
    }

    /// `(stat, aggregation, windows, last, mean, min, max, trend)` rows; min
    /// and max None when every window was NaN.
    #[allow(clippy::type_complexity)]
    fn stat_rows(
        &self,
        bars: &str,
    ) -> Vec<(
        String,
        String,
        u64,
        f64,
        f64,
        Option<f64>,
        Option<f64>,
        String,
    )> {
        let bars: Vec<char> = bars.chars().collect();
        self.summary
            .stat_rows(&bars)
            .into_iter()
            .map(|r| {
                let (stat, agg) = (r.stat.to_owned(), r.aggregation.to_owned());
                (stat, agg, r.windows, r.last, r.mean, r.min, r.max, r.trend)
            })
            .collect()
    }

    /// `(stat, windows, samples, p50, p90, p99, p999)` rows.
    fn quantile_rows(&self) -> Vec<(String, u64, u64, f64, f64, f64, f64)> {
        self.summary
            .quantile_rows()
            .into_iter()
            .map(|r| {
                let [a, b, c, d] = r.quantiles;
                (r.stat.to_owned(), r.windows, r.samples, a, b, c, d)
            })
            .collect()
    }

    /// `(name, count, last line)` rows of the other events.
    fn other_rows<'py>(&self, py: Python<'py>) -> Vec<(String, u64, Bound<'py, PyBytes>)> {
        self.summary
            .other_rows()
            .into_iter()
            .map(|(name, count, line)| (name.to_owned(), count, PyBytes::new(py, line)))
            .collect()
    }

    /// `(stat, aggregation, files, total, min, min_rank, max, max_rank)` rows;
    /// total None for the aggregations that do not add up.
    #[allow(clippy::type_complexity)]
    fn rank_rows(&self) -> Vec<(String, String, u64, Option<f64>, f64, String, f64, String)> {
        self.summary
            .rank_rows()
            .into_iter()
            .map(|r| {
                (
                    r.stat.to_owned(),
                    r.aggregation.to_owned(),
                    r.files,
                    r.total,
                    r.min,
                    r.min_at.to_owned(),
                    r.max,
                    r.max_at.to_owned(),
                )
            })
            .collect()
    }

    /// `(stat, rank, p50, score)` rows; score None where there is none.
    fn straggler_rows(&self) -> Vec<(String, String, f64, Option<f64>)> {
        self.summary
            .straggler_rows()
            .into_iter()
            .map(|r| (r.stat.to_owned(), r.rank.to_owned(), r.p50, r.score))
            .collect()
    }
}

impl _Summary {
    fn fallback<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match &self.fallback {
            Some(f) => Ok(f.bind(py).clone()),
            None => Err(PyValueError::new_err("_Summary: start_file() first")),
        }
    }
}
