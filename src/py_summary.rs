//! `_Summary`, behind `torchmon summarize` (python/torchmon/cli/summarize.py):
//! the core's `summary::Summary` fed the logs' bytes, its tables' rows as
//! tuples. The lines the core leaves to Python go to the file's reader,
//! which returns their event written again as a JSON line.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyFloat, PyInt, PyString, PyTuple};
use torchmon_core::summary::{Cell, FeedError, Summary};

#[pyclass(module = "torchmon._core")]
pub struct _Summary {
    summary: Summary,
    /// The current file's reader of a line: `fallback(line, lineno)`.
    fallback: Option<Py<PyAny>>,
}

#[pymethods]
impl _Summary {
    /// `line_limit`: the longest line, its newline included; `ranks`: keep
    /// the tables across files.
    #[new]
    fn new(line_limit: usize, ranks: bool) -> Self {
        let summary = Summary::new(line_limit, ranks);
        _Summary {
            summary,
            fallback: None,
        }
    }

    /// Starts a file: `label` names it in the tables across files.
    fn start_file(&mut self, label: &str, fallback: Py<PyAny>) {
        self.summary.start_file(label);
        self.fallback = Some(fallback);
    }

    /// The file's next bytes (`b""` at its end); returns the number of a line
    /// longer than `line_limit`, or 0. At the end: how many events it held.
    fn feed(&mut self, py: Python<'_>, block: &[u8]) -> PyResult<u64> {
        let Some(fallback) = &self.fallback else {
            return Err(PyValueError::new_err("_Summary.feed: start_file() first"));
        };
        let mut call = |line: &[u8], lineno: u64| -> PyResult<_> {
            let line = fallback.bind(py).call1((PyBytes::new(py, line), lineno))?;
            Ok(match line.is_none() {
                true => None,
                false => Some(line.cast::<PyBytes>()?.as_bytes().to_vec()),
            })
        };
        let result = match block {
            [] => self.summary.finish_file(&mut call),
            _ => self.summary.feed(block, &mut call).map(|()| 0),
        };
        match result {
            Ok(n) | Err(FeedError::LineTooLong(n)) => Ok(n),
            Err(FeedError::Fallback(err)) => Err(err),
            Err(FeedError::CountsOverflow(n)) => Err(PyValueError::new_err(format!(
                "line {n}: a distribution's counts pass 2**64 with the earlier windows'"
            ))),
        }
    }

    /// One table's rows (`Summary::table`); None where there is no figure.
    fn rows<'py>(
        &self,
        py: Python<'py>,
        table: &str,
        bars: &str,
    ) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let bars: Vec<char> = bars.chars().collect();
        let Some(rows) = self.summary.table(table, &bars) else {
            return Err(PyValueError::new_err(format!(
                "_Summary.rows: no table {table:?}"
            )));
        };
        let cell = |cell: Cell<'_>| match cell {
            Cell::Text(text) => PyString::new(py, &text).into_any(),
            Cell::Int(n) => PyInt::new(py, n).into_any(),
            Cell::Float(x) => PyFloat::new(py, x).into_any(),
            Cell::Bytes(bytes) => PyBytes::new(py, bytes).into_any(),
            Cell::Nothing => py.None().into_bound(py),
        };
        let row = |row: Vec<Cell<'_>>| PyTuple::new(py, row.into_iter().map(cell));
        rows.into_iter().map(row).collect()
    }
}
