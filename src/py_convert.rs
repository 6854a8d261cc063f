//! Argument conversion shared by the bindings: strings, event data values,
//! numbers, and the recognition of torch tensors, which `Stat` hands to
//! torchmon._tensors. Every failure is a `TypeError`/`ValueError` naming the
//! argument.

use pyo3::exceptions::{PyOverflowError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyComplex, PyFloat, PyInt, PyString};

use crate::py_objects::{DTYPE, INDEX, KIND};
use torchmon_core::stat::NotASample as Reason;

/// The one format of an argument error, here and in the Python package
/// (python/torchmon/_errors.py): the call, the argument, then the argument
/// again as the subject of the problem, e.g. `Stat(window_size): window_size
/// must be finite, not NaN` (docs/api.md).
pub fn arg_message(call: &str, arg: &str, problem: impl std::fmt::Display) -> String {
    format!("{call}({arg}): {arg} {problem}")
}

/// `TypeError`: `{call}({arg}): {arg} must be {expected}, not {type of got}`.
pub fn arg_type_error(call: &str, arg: &str, expected: &str, got: &Bound<'_, PyAny>) -> PyErr {
    PyTypeError::new_err(arg_message(
        call,
        arg,
        format_args!("must be {expected}, not {}", type_name(got)),
    ))
}

/// `ValueError`: `{call}({arg}): {arg} {problem}`.
pub fn arg_value_error(call: &str, arg: &str, problem: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(arg_message(call, arg, problem))
}

/// Reports `err` to `sys.unraisablehook`, `context` (the hook's
/// `err_msg` follows it: "Exception ignored in: {context}") naming where it
/// was raised: for errors with no caller to raise them to.
pub fn write_unraisable(py: Python<'_>, err: PyErr, context: &str) {
    err.write_unraisable(py, Some(PyString::new(py, context).as_any()));
}

pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_owned())
}

/// An optional argument as passed (`None` when omitted), so that an explicit
/// `None` is reported as a wrong type rather than taken for the default (as
/// torch, checked in argument order).
pub struct Given(pub Option<Py<PyAny>>);

impl<'a, 'py> FromPyObject<'a, 'py> for Given {
    type Error = PyErr;

    fn extract(obj: pyo3::Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(Given(Some(obj.to_owned().unbind())))
    }
}

/// How a str with a lone surrogate (not encodable as UTF-8) is reported:
/// torch raises `RuntimeError` for an Event data value, `TypeError` elsewhere.
#[derive(Clone, Copy)]
pub enum Surrogates {
    TypeError,
    RuntimeError,
}

/// A string argument: `str` (subclasses become the base type), or
/// `bytes`/`bytearray` decoded as UTF-8. Returns `None` for other types so
/// that callers can try further conversions.
pub fn try_string<'py>(
    value: &Bound<'py, PyAny>,
    what: &str,
    surrogates: Surrogates,
) -> PyResult<Option<Bound<'py, PyString>>> {
    let py = value.py();
    if let Ok(s) = value.cast::<PyString>() {
        if let Err(err) = s.to_str() {
            let message = format!("{what} must be encodable as UTF-8 (it holds a lone surrogate)");
            let new_err = match surrogates {
                Surrogates::TypeError => PyTypeError::new_err(message),
                Surrogates::RuntimeError => PyRuntimeError::new_err(message),
            };
            new_err.set_cause(py, Some(err));
            return Err(new_err);
        }
        if s.is_exact_instance_of::<PyString>() {
            return Ok(Some(s.clone()));
        }
        // A str subclass keeps only its text, as the base type.
        return Ok(Some(PyString::new(py, s.to_str()?)));
    }
    let bytes: Option<Vec<u8>> = if let Ok(b) = value.cast::<PyBytes>() {
        Some(b.as_bytes().to_vec())
    } else if let Ok(b) = value.cast::<PyByteArray>() {
        Some(b.to_vec())
    } else {
        None
    };
    match bytes {
        None => Ok(None),
        Some(bytes) => match std::str::from_utf8(&bytes) {
            Ok(text) => Ok(Some(PyString::new(py, text))),
            Err(err) => Err(PyValueError::new_err(format!(
                "{what} must be valid UTF-8 ({err})"
            ))),
        },
    }
}

/// A required string argument (`TypeError` for anything but str/bytes).
pub fn string_arg<'py>(
    value: &Bound<'py, PyAny>,
    what: &str,
    surrogates: Surrogates,
) -> PyResult<Bound<'py, PyString>> {
    try_string(value, what, surrogates)?.ok_or_else(|| {
        PyTypeError::new_err(format!(
            "{what} must be a str (or UTF-8 bytes), not {}",
            type_name(value)
        ))
    })
}

/// numpy's scalar kind for `value` (`'b'`, `'i'`, `'u'`, `'f'`, ...), found by
/// duck typing so the core never imports numpy.
fn numpy_kind(value: &Bound<'_, PyAny>) -> Option<char> {
    let py = value.py();
    let module = value.get_type().module().ok()?;
    if module.to_str().ok()? != "numpy" {
        return None;
    }
    let kind = value
        .getattr(DTYPE.get(py))
        .ok()?
        .getattr(KIND.get(py))
        .ok()?;
    kind.extract::<String>().ok()?.chars().next()
}

fn int64_value<'py>(value: &Bound<'py, PyAny>, what: &str) -> PyResult<Bound<'py, PyAny>> {
    let py = value.py();
    let index = value.call_method0(INDEX.get(py)).map_err(|err| {
        let new_err = PyTypeError::new_err(format!("{what}: cannot read the integer"));
        new_err.set_cause(py, Some(err));
        new_err
    })?;
    match index.extract::<i64>() {
        Ok(v) => Ok(v.into_pyobject(py)?.into_any()),
        Err(_) => Err(PyValueError::new_err(format!(
            "{what} is out of the int64 range"
        ))),
    }
}

/// Whether `value` is already what `data_value` would make of it: an exact
/// float, bool, int in the int64 range or UTF-8-encodable str. Runs no
/// Python code, so it is safe while iterating a dict.
#[inline]
pub fn is_normalised_value(value: &Bound<'_, PyAny>) -> bool {
    if value.is_exact_instance_of::<PyFloat>() || value.is_exact_instance_of::<PyBool>() {
        return true;
    }
    if value.is_exact_instance_of::<PyInt>() {
        return value.extract::<i64>().is_ok();
    }
    is_plain_str(value)
}

/// An exact str that encodes as UTF-8 (no lone surrogates).
#[inline]
pub fn is_plain_str(value: &Bound<'_, PyAny>) -> bool {
    let Ok(s) = value.cast_exact::<PyString>() else {
        return false;
    };
    // An ASCII string is valid UTF-8: no call to build or look up its
    // UTF-8 form (the common case for keys and values).
    // (pyo3 reads the state bits up to 3.13; later versions take to_str.)
    #[cfg(not(any(Py_LIMITED_API, PyPy, GraalPy, Py_3_14)))]
    {
        // Before 3.12 a legacy string may not be "ready"; its ascii bit
        // means nothing until it is.
        #[cfg(not(Py_3_12))]
        // SAFETY: `s` is a live str; this reads its state bits.
        let ready = unsafe { pyo3::ffi::PyUnicode_IS_READY(s.as_ptr()) } != 0;
        #[cfg(Py_3_12)]
        let ready = true;
        // SAFETY: `s` is a live, ready exact str; PyUnicode_IS_ASCII reads
        // its state bits.
        if ready && unsafe { pyo3::ffi::PyUnicode_IS_ASCII(s.as_ptr()) } != 0 {
            return true;
        }
    }
    s.to_str().is_ok()
}

/// An Event data value, normalised to exact `str`, `int` (int64), `float`
/// or `bool`.
pub fn data_value<'py>(value: &Bound<'py, PyAny>, key: &str) -> PyResult<Bound<'py, PyAny>> {
    if is_normalised_value(value) {
        return Ok(value.clone());
    }
    let py = value.py();
    if value.is_exact_instance_of::<PyFloat>()
        || value.is_exact_instance_of::<PyBool>()
        || value.is_exact_instance_of::<PyString>()
    {
        if let Ok(s) = value.cast::<PyString>()
            && s.to_str().is_err()
        {
            // Let try_string raise the documented error.
            return string_value(value, key);
        }
        return Ok(value.clone());
    }
    if value.is_instance_of::<PyBool>() {
        return Ok(PyBool::new(py, value.is_truthy()?).to_owned().into_any());
    }
    if value.is_instance_of::<PyInt>() {
        return int64_value(value, &format!("Event data value for key {key:?}"));
    }
    if let Ok(f) = value.cast::<PyFloat>() {
        return Ok(PyFloat::new(py, f.value()).into_any());
    }
    if value.is_instance_of::<PyString>()
        || value.is_instance_of::<PyBytes>()
        || value.is_instance_of::<PyByteArray>()
    {
        return string_value(value, key);
    }
    match numpy_kind(value) {
        Some('b') => Ok(PyBool::new(py, value.is_truthy()?).to_owned().into_any()),
        Some('i' | 'u') => int64_value(value, &format!("Event data value for key {key:?}")),
        Some('f') => Ok(PyFloat::new(py, value.extract::<f64>()?).into_any()),
        _ => Err(PyTypeError::new_err(format!(
            "Event data value for key {key:?} must be str, int, float or bool, not {}",
            type_name(value)
        ))),
    }
}

fn string_value<'py>(value: &Bound<'py, PyAny>, key: &str) -> PyResult<Bound<'py, PyAny>> {
    Ok(string_arg(
        value,
        &format!("Event data value for key {key:?}"),
        Surrogates::RuntimeError,
    )?
    .into_any())
}

/// A sample for `Stat.add`: what `float(v)` accepts the way pybind11 does.
/// On failure, [`NotASample::into_error`] makes the caller's `TypeError`.
#[inline]
pub fn sample(value: &Bound<'_, PyAny>) -> Result<f64, NotASample> {
    if let Ok(f) = value.cast_exact::<PyFloat>() {
        return Ok(f.value());
    }
    sample_slow(value)
}

#[cold]
fn sample_slow(value: &Bound<'_, PyAny>) -> Result<f64, NotASample> {
    if value.is_instance_of::<PyInt>() {
        return value.extract::<f64>().map_err(|err| {
            if err.is_instance_of::<PyOverflowError>(value.py()) {
                NotASample::IntTooLarge(err)
            } else {
                NotASample::NotANumber(Some(err))
            }
        });
    }
    if let Ok(f) = value.cast::<PyFloat>() {
        // A float subclass (numpy.float64): float() reads the value, as here.
        return Ok(f.value());
    }
    if value.is_instance_of::<PyString>()
        || value.is_instance_of::<PyBytes>()
        || value.is_instance_of::<PyByteArray>()
    {
        return Err(NotASample::NotANumber(None));
    }
    // numpy's complex scalars have a `__float__` that warns and drops the
    // imaginary part; a complex tensor and `complex` are TypeErrors
    // (docs/api.md, `Stat.add`), and so are they. Checked here, not with
    // `complex` (which numpy.complex128 subclasses), so that the other
    // widths are caught too.
    if crate::py_objects::is_numpy_complex(value) {
        return Err(NotASample::Complex);
    }
    value.extract::<f64>().map_err(|err| {
        if value.is_instance_of::<PyComplex>() {
            NotASample::Complex // `complex` has no __float__
        } else {
            NotASample::NotANumber(Some(err))
        }
    })
}

/// Why [`sample`] refused a value.
pub enum NotASample {
    /// Not a real number; the error `float()` conversion raised, if any.
    NotANumber(Option<PyErr>),
    /// An int beyond the float range (the `OverflowError` of `float()`).
    IntTooLarge(PyErr),
    /// A complex number.
    Complex,
}

impl NotASample {
    /// The `TypeError` (as torch raises for each; the core's wording) about
    /// `value`; `subject` names it: `Stat.add(v): v`.
    pub fn into_error(self, value: &Bound<'_, PyAny>, subject: &str) -> PyErr {
        let (reason, cause) = match self {
            NotASample::NotANumber(cause) => (Reason::NotANumber, cause),
            NotASample::IntTooLarge(cause) => (Reason::IntTooLarge, Some(cause)),
            NotASample::Complex => (Reason::Complex, None),
        };
        let err = PyTypeError::new_err(reason.message(subject, &type_name(value)));
        err.set_cause(value.py(), cause);
        err
    }
}

/// torch.Tensor and the functions of torchmon._tensors that record tensors,
/// set once torch is imported (docs/guide.md, "Recording tensors and
/// torch.compile").
pub struct TensorSupport {
    tensor_type: Py<PyAny>,
    pub add: Py<PyAny>,
    pub add_many: Py<PyAny>,
}

static TENSOR_SUPPORT: PyOnceLock<TensorSupport> = PyOnceLock::new();

/// The tensor handlers when `v` is a torch tensor.
#[inline]
pub fn tensor_support<'a>(
    py: Python<'a>,
    v: &Bound<'_, PyAny>,
) -> PyResult<Option<&'a TensorSupport>> {
    match TENSOR_SUPPORT.get(py) {
        Some(support) if v.is_instance(support.tensor_type.bind(py))? => Ok(Some(support)),
        _ => Ok(None),
    }
}

/// Called once by torchmon._tensors when torch is imported: from then on
/// `Stat.add` and `Stat.add_many` hand tensors to `add` / `add_many`
/// (called with the Stat and the tensor). Later calls change nothing.
#[pyfunction]
pub fn _install_tensor_support(
    py: Python<'_>,
    tensor_type: Py<PyAny>,
    add: Py<PyAny>,
    add_many: Py<PyAny>,
) -> bool {
    // `set`, not `get_or_init`, which detaches from the GIL (py_objects).
    TENSOR_SUPPORT
        .set(
            py,
            TensorSupport {
                tensor_type,
                add,
                add_many,
            },
        )
        .is_ok()
}
