//! `torchmon.Distribution` (docs/api.md, "Distribution"): the core's
//! `histogram::Distribution` wrapped. Only conversion lives here: Python
//! objects to the core's parts (the checks of argument types) and back.
//! Every rule (values, quantile, merge, bucket bounds, the OpenTelemetry
//! downscaling), the field list, the wording of `InvalidDistribution` and
//! the repr are the core's.

use std::sync::{Arc, OnceLock};

use pyo3::exceptions::{PyAttributeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};
use torchmon_core::decimal::{non_finite, python_repr};
use torchmon_core::histogram::{
    self as core, Distribution, DistributionParts, FIELDS, FLOAT_TAG, Field, InvalidDict,
    InvalidDistribution, InvalidPair,
};

use crate::py_convert::{arg_message, arg_type_error, arg_value_error, type_name};

const CALL: &str = "Distribution";
const FROM_DICT: &str = "Distribution.from_dict";

#[pyclass(name = "Distribution", module = "torchmon", frozen)]
pub struct PyDistribution {
    /// Shared with the window that made it, if one did.
    inner: Arc<Distribution>,
    /// `positive` and `negative` as Python tuples, made at the first read:
    /// a window costs no Python object per bucket unless a handler reads
    /// them, and later reads cost none.
    tuples: [OnceLock<Py<PyTuple>>; 2],
    // The numbers of `inner`, copied at construction for the getters.
    #[pyo3(get)]
    scale: i32,
    #[pyo3(get)]
    count: u64,
    #[pyo3(get)]
    sum: f64,
    #[pyo3(get)]
    min: f64,
    #[pyo3(get)]
    max: f64,
    #[pyo3(get)]
    zero_count: u64,
    #[pyo3(get)]
    nan_count: u64,
    #[pyo3(get)]
    positive_inf_count: u64,
    #[pyo3(get)]
    negative_inf_count: u64,
}

impl PyDistribution {
    pub fn from_core(inner: Arc<Distribution>) -> Self {
        let buckets = &inner.buckets;
        PyDistribution {
            tuples: Default::default(),
            scale: core::SCALE,
            count: inner.count,
            sum: inner.sum,
            min: inner.min,
            max: inner.max,
            zero_count: buckets.zero_count,
            nan_count: buckets.nan_count,
            positive_inf_count: buckets.positive_inf_count,
            negative_inf_count: buckets.negative_inf_count,
            inner,
        }
    }

    /// The core's distribution, shared (the TensorBoard writer's histograms
    /// keep it until they are encoded, on the writer's thread).
    pub fn core(&self) -> &Arc<Distribution> {
        &self.inner
    }

    /// Side 0 (positive) or 1 (negative) as a tuple of `(index, count)`.
    fn side<'py>(&self, py: Python<'py>, side: usize) -> PyResult<Bound<'py, PyTuple>> {
        if let Some(tuple) = self.tuples[side].get() {
            return Ok(tuple.bind(py).clone());
        }
        let b = &self.inner.buckets;
        let tuple = PyTuple::new(py, [&b.positive, &b.negative][side])?;
        // Made outside the cell, then set: nothing that could let go of the
        // GIL runs inside it (py_objects.rs says why). A racing reader's
        // equal tuple may have landed first; either is the value.
        let _ = self.tuples[side].set(tuple.clone().unbind());
        Ok(tuple)
    }

    /// The checked constructor, from the keyword arguments by name.
    fn from_fields(fields: &[Option<Bound<'_, PyAny>>; 11]) -> PyResult<Self> {
        let field = |name: &str| core::field_index(name).and_then(|i| fields[i].as_ref());
        if let Some(scale) = field("scale") {
            core::check_scale(int_arg(CALL, scale, "scale")?).map_err(invalid)?;
        }
        let count = |name: &'static str| match field(name) {
            Some(value) => core::check_count(name, int_arg(CALL, value, name)?).map_err(invalid),
            None => Ok(0),
        };
        let (count, zero_count, nan_count, positive_inf_count, negative_inf_count) = (
            count("count")?,
            count("zero_count")?,
            count("nan_count")?,
            count("positive_inf_count")?,
            count("negative_inf_count")?,
        );
        let float = |name: &str| field(name).map_or(Ok(0.0), |value| float_arg(value, name));
        let (sum, min, max) = (float("sum")?, float("min")?, float("max")?);
        let buckets =
            |name: &'static str| field(name).map_or(Ok(Vec::new()), |v| buckets_arg(v, name));
        let parts = DistributionParts {
            count,
            sum,
            min,
            max,
            zero_count,
            nan_count,
            positive_inf_count,
            negative_inf_count,
            positive: buckets("positive")?,
            negative: buckets("negative")?,
        };
        let inner = Distribution::from_parts(parts).map_err(invalid)?;
        Ok(Self::from_core(Arc::new(inner)))
    }

    /// The fields' values in `FIELDS`' order, as `to_dict` writes them
    /// (`for_dict`: non-finite floats tagged, buckets as lists) or as the
    /// pickle holds them (floats, the tuples of the getters).
    fn values<'py>(&self, py: Python<'py>, for_dict: bool) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let value = |name: &str, field: Field<'_>| -> PyResult<Bound<'py, PyAny>> {
            Ok(match field {
                Field::Count(count) => count.into_pyobject(py)?.into_any(),
                Field::Float(value) if for_dict => encode_float(py, value)?,
                Field::Float(value) => PyFloat::new(py, value).into_any(),
                Field::Buckets(pairs) if for_dict => {
                    let out = PyList::empty(py);
                    for &(index, count) in pairs {
                        let (index, count) = (index.into_pyobject(py)?, count.into_pyobject(py)?);
                        out.append(PyList::new(py, [index.into_any(), count.into_any()])?)?;
                    }
                    out.into_any()
                }
                Field::Buckets(_) => self.side(py, usize::from(name == "negative"))?.into_any(),
            })
        };
        let fields = FIELDS.into_iter().zip(self.inner.fields());
        fields.map(|(name, field)| value(name, field)).collect()
    }
}

/// A ValueError naming the argument of `Distribution(...)` at fault.
fn invalid(error: InvalidDistribution) -> PyErr {
    arg_value_error(CALL, error.argument(), error)
}

/// The AttributeError of setting or deleting (`verb`) attribute `name`.
fn immutable(verb: &str, name: &Bound<'_, PyAny>) -> PyResult<PyErr> {
    let message = core::immutable_message(verb, &name.repr()?.to_cow()?);
    Ok(PyAttributeError::new_err(message))
}

fn is_int(value: &Bound<'_, PyAny>) -> bool {
    value.is_instance_of::<PyInt>() && !value.is_instance_of::<PyBool>()
}

/// What a float argument takes: a float or an int, not bool.
fn is_real(value: &Bound<'_, PyAny>) -> bool {
    value.is_instance_of::<PyFloat>() || is_int(value)
}

/// An int argument (bool refused), past `i128` saturated: the core's rules
/// refuse those anyway.
fn int_arg(call: &str, value: &Bound<'_, PyAny>, name: &str) -> PyResult<i128> {
    if !is_int(value) {
        return Err(arg_type_error(call, name, "an int", value));
    }
    Ok(saturated(value))
}

fn saturated(int: &Bound<'_, PyAny>) -> i128 {
    int.extract::<i128>().unwrap_or_else(|_| {
        if int.lt(0).unwrap_or(false) {
            i128::MIN
        } else {
            i128::MAX
        }
    })
}

/// A float argument: a float or an int (not bool) within the float range.
fn float_arg(value: &Bound<'_, PyAny>, name: &str) -> PyResult<f64> {
    if !is_real(value) {
        return Err(arg_type_error(CALL, name, "a float", value));
    }
    value.extract::<f64>().or_else(|_| {
        // An int past the float range: a JSON line's 400-digit "sum" is bad
        // input, not a crash (docs/api.md, Distribution). Its digits are
        // counted by str(), which refuses ints of over 4300 digits.
        let py = value.py();
        let magnitude = value.call_method0("__abs__")?;
        let digits = if magnitude.lt(PyInt::new(py, 10).pow(4000, py.None())?)? {
            Some(magnitude.str()?.len()?)
        } else {
            None
        };
        Err(arg_value_error(
            CALL,
            name,
            core::float_range_problem(digits),
        ))
    })
}

fn is_text(value: &Bound<'_, PyAny>) -> bool {
    value.is_instance_of::<PyString>() || value.is_instance_of::<PyBytes>()
}

/// Whether `value` is a `collections.abc.Iterable` and not text.
fn is_iterable(value: &Bound<'_, PyAny>) -> PyResult<bool> {
    if value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>() {
        return Ok(true);
    }
    Ok(!is_text(value) && value.is_instance(crate::py_objects::iterable_abc(value.py())?)?)
}

/// `reprlib.repr(value)`: cut short in depth and length, so that a value
/// nested 100,000 deep (read from a JSON line) gets its error message, not
/// a RecursionError.
fn short_repr(value: &Bound<'_, PyAny>) -> PyResult<String> {
    let repr = value.py().import("reprlib")?.getattr("repr")?;
    Ok(repr.call1((value,))?.str()?.to_string())
}

/// The `(index, count)` pairs of `positive` or `negative`: their types
/// checked here, their values by the core's `check_bucket` as each is read,
/// so that the first bad pair is the one reported.
fn buckets_arg(value: &Bound<'_, PyAny>, name: &'static str) -> PyResult<Vec<(i64, u64)>> {
    if !is_iterable(value)? {
        return Err(arg_type_error(
            CALL,
            name,
            "an iterable of (index, count) pairs",
            value,
        ));
    }
    let py = value.py();
    let must_hold = |what: InvalidPair| PyTypeError::new_err(arg_message(CALL, name, what));
    let mut out = Vec::new();
    let mut previous = None;
    for pair in value.try_iter()? {
        let pair = pair?;
        let exact = pair.is_exact_instance_of::<PyList>() || pair.is_exact_instance_of::<PyTuple>();
        let items = if exact && pair.len()? == 2 {
            pair
        } else if !is_iterable(&pair)? {
            return Err(must_hold(InvalidPair::NotPair {
                got: type_name(&pair),
            }));
        } else {
            let items = py.get_type::<PyTuple>().call1((pair,))?;
            if items.len()? != 2 {
                let problem = InvalidPair::Length {
                    got: short_repr(&items)?,
                };
                return Err(arg_value_error(CALL, name, problem));
            }
            items
        };
        let (index, count) = (items.get_item(0)?, items.get_item(1)?);
        if !is_int(&index) {
            let got = type_name(&index);
            return Err(must_hold(InvalidPair::Index { got }));
        }
        if !is_int(&count) {
            let got = type_name(&count);
            return Err(must_hold(InvalidPair::Count { got }));
        }
        let pair = core::check_bucket(name, previous, saturated(&index), saturated(&count))
            .map_err(invalid)?;
        previous = Some(pair.0);
        out.push(pair);
    }
    Ok(out)
}

/// A sum, min or max as `to_dict` writes it.
fn encode_float(py: Python<'_>, value: f64) -> PyResult<Bound<'_, PyAny>> {
    if value.is_finite() {
        return Ok(PyFloat::new(py, value).into_any());
    }
    // "nan", "inf" or "-inf", as Python writes them.
    let tagged = PyDict::new(py);
    tagged.set_item(FLOAT_TAG, python_repr(value))?;
    Ok(tagged.into_any())
}

/// `from_dict`'s sum, min or max: a `{"$float": ...}` tag read, anything
/// else left for the constructor's checks.
fn decode_float<'py>(value: Bound<'py, PyAny>, key: &'static str) -> PyResult<Bound<'py, PyAny>> {
    let py = value.py();
    let is_tag = value.is_instance(crate::py_objects::mapping_abc(py)?)?
        && value.len()? == 1
        && value.contains(FLOAT_TAG)?;
    if !is_tag {
        return Ok(value);
    }
    let text = value.get_item(FLOAT_TAG)?;
    let decoded = text
        .cast::<PyString>()
        .ok()
        .and_then(|t| non_finite(&t.to_string()));
    let Some(decoded) = decoded else {
        let got = short_repr(&text)?;
        return Err(arg_value_error(
            FROM_DICT,
            "d",
            InvalidDict::FloatTag { got, key },
        ));
    };
    Ok(PyFloat::new(py, decoded).into_any())
}

/// `Distribution(*, scale=6, count, sum, min, max, zero_count=0, ...)`'s
/// own argument errors, worded as CPython words a Python function's.
fn keyword_fields<'py>(
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<[Option<Bound<'py, PyAny>>; 11]> {
    if !args.is_empty() {
        return Err(PyTypeError::new_err(core::positional_message(args.len())));
    }
    let mut fields: [Option<Bound<'py, PyAny>>; 11] = Default::default();
    for (key, value) in kwargs.into_iter().flatten() {
        let key = key.cast_into::<PyString>()?;
        let Some(slot) = key.to_cow().ok().and_then(|k| core::field_index(&k)) else {
            let repr = key.repr()?;
            let message = core::unexpected_keyword_message(&repr.to_cow()?);
            return Err(PyTypeError::new_err(message));
        };
        fields[slot] = Some(value);
    }
    if let Some(message) = core::missing_message(|i| fields[i].is_some()) {
        return Err(PyTypeError::new_err(message));
    }
    Ok(fields)
}

#[pymethods]
impl PyDistribution {
    /// Parsed by hand (`keyword_fields`) so that an argument given as
    /// `None` is refused, not taken for its default.
    #[new]
    #[pyo3(
        signature = (*args, **kwargs),
        text_signature = "(*, scale=6, count, sum, min, max, zero_count=0, nan_count=0, \
                          positive_inf_count=0, negative_inf_count=0, positive=(), negative=())"
    )]
    fn new(args: &Bound<'_, PyTuple>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        Self::from_fields(&keyword_fields(args, kwargs)?)
    }

    #[getter]
    fn positive<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        self.side(py, 0)
    }
    #[getter]
    fn negative<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        self.side(py, 1)
    }

    #[staticmethod]
    fn bucket_bounds(index: &Bound<'_, PyAny>) -> PyResult<(f64, f64)> {
        const WHO: &str = "Distribution.bucket_bounds";
        let index = int_arg(WHO, index, "index")?;
        core::checked_bucket_bounds(index).map_err(|problem| arg_value_error(WHO, "index", problem))
    }

    fn quantile(&self, q: &Bound<'_, PyAny>) -> PyResult<f64> {
        const WHO: &str = "Distribution.quantile";
        if !is_real(q) {
            return Err(arg_type_error(WHO, "q", "a float", q));
        }
        // An int past the float range is past 1.
        let value = q.extract::<f64>().unwrap_or(f64::INFINITY);
        let repr = || q.repr().map(|r| r.to_string()).unwrap_or_default();
        let value = core::check_quantile(value, repr).map_err(|p| arg_value_error(WHO, "q", p))?;
        Ok(self.inner.quantile(value))
    }

    fn merge(&self, other: &Bound<'_, PyAny>) -> PyResult<Self> {
        const WHO: &str = "Distribution.merge";
        let Ok(theirs) = other.cast::<PyDistribution>() else {
            return Err(arg_type_error(WHO, "other", "a Distribution", other));
        };
        let merged = self.inner.merge(&theirs.get().inner).ok_or_else(|| {
            arg_value_error(WHO, "other", "has counts that pass 2**64 with this one's")
        })?;
        Ok(Self::from_core(Arc::new(merged)))
    }

    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        for (name, value) in FIELDS.into_iter().zip(self.values(py, true)?) {
            out.set_item(name, value)?;
        }
        Ok(out)
    }

    #[classmethod]
    fn from_dict(cls: &Bound<'_, PyType>, d: &Bound<'_, PyAny>) -> PyResult<Self> {
        let py = cls.py();
        let invalid = |problem: InvalidDict| arg_value_error(FROM_DICT, "d", problem);
        if !d.is_instance(crate::py_objects::mapping_abc(py)?)? {
            return Err(arg_type_error(FROM_DICT, "d", "a mapping", d));
        }
        for key in d.try_iter()? {
            let key = key?;
            let known = key
                .cast::<PyString>()
                .is_ok_and(|k| k.to_cow().is_ok_and(|k| FIELDS.contains(&k.as_ref())));
            if !known {
                return Err(invalid(InvalidDict::UnknownKey(key.repr()?.to_string())));
            }
        }
        for key in core::REQUIRED {
            if !d.contains(key)? {
                return Err(invalid(InvalidDict::MissingKey(key)));
            }
        }
        let mut fields: [Option<Bound<'_, PyAny>>; 11] = Default::default();
        for (slot, name) in fields.iter_mut().zip(FIELDS) {
            if d.contains(name)? {
                let value = d.get_item(name)?;
                *slot = Some(if core::is_float_field(name) {
                    decode_float(value, name)?
                } else {
                    value
                });
            }
        }
        Self::from_fields(&fields)
    }

    /// Equal when every field is; NaN sum/min/max equal NaN (and -0.0 only
    /// -0.0), so that a distribution equals its round trip. Anything but a
    /// Distribution fails the argument's extraction, which PyO3 answers
    /// with `NotImplemented`.
    fn __eq__(&self, other: &Bound<'_, Self>) -> bool {
        self.inner.same(&other.get().inner)
    }

    fn __setattr__(&self, name: &Bound<'_, PyAny>, _value: &Bound<'_, PyAny>) -> PyResult<()> {
        Err(immutable("set", name)?)
    }

    fn __delattr__(&self, name: &Bound<'_, PyAny>) -> PyResult<()> {
        Err(immutable("delete", name)?)
    }

    /// Pickled as `_core._unpickle_distribution(scale, count, ...)`, the
    /// fields in `FIELDS`' order (the order of the pickles written before
    /// the type was native, whose `torchmon._distribution._restore` is the
    /// same function).
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let unpickle = py
            .import("torchmon._core")?
            .getattr("_unpickle_distribution")?;
        Ok((unpickle, PyTuple::new(py, slf.get().values(py, false)?)?))
    }

    fn __repr__(&self) -> String {
        self.inner.to_string()
    }

    /// The buckets as an OpenTelemetry exponential histogram point holds
    /// them with `max_size = max_buckets` (`histogram::Buckets::exponential`):
    /// `(scale, positive offset, positive counts, negative offset, negative
    /// counts)`, at a scale of at most `max_scale`
    /// (`histogram::Buckets::exponential_at_most`).
    #[pyo3(signature = (max_buckets, max_scale = 6))]
    fn _exponential(
        &self,
        max_buckets: &Bound<'_, PyInt>,
        max_scale: i32,
    ) -> (i32, i32, Vec<u64>, i32, Vec<u64>) {
        let max_buckets = max_buckets.extract::<u64>().unwrap_or(u64::MAX);
        let e = self
            .inner
            .buckets
            .exponential_at_most(max_buckets, max_scale);
        let (positive, negative) = (e.positive, e.negative);
        (
            e.scale,
            positive.offset,
            positive.counts,
            negative.offset,
            negative.counts,
        )
    }
}

/// A pickled `Distribution`: its fields in `FIELDS`' order, checked by the
/// keyword constructor as any other.
#[pyfunction]
#[pyo3(signature = (*values))]
pub fn _unpickle_distribution<'py>(values: &Bound<'py, PyTuple>) -> PyResult<Bound<'py, PyAny>> {
    let py = values.py();
    let fields = PyDict::new(py);
    for (name, value) in FIELDS.into_iter().zip(values.iter()) {
        fields.set_item(name, value)?;
    }
    py.get_type::<PyDistribution>().call((), Some(&fields))
}
