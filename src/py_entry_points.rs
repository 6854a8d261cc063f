//! Hand-written entry points for the calls of the hot path: `Stat.add`,
//! `log_event` (`METH_FASTCALL | METH_KEYWORDS` functions) and the
//! `Event(...)` constructor (a vectorcall on the type).
//!
//! PyO3's generated wrappers cost ~115 instructions per call here (its
//! trampoline, the generic argument extraction, the fastcall shim: measured
//! with callgrind, docs/performance.md), as many as the body of `Stat.add`
//! itself. These functions take the common call (one positional argument of
//! the expected type, and for `add` no window closing) straight to the core.
//! Any other call goes through PyO3's bookkeeping (`Python::attach`), with
//! these differences from a PyO3 wrapper:
//!
//! - `Stat.add` and `log_event` parse their arguments themselves
//!   ([`single_argument`]), so a wrong count or keyword gets the messages
//!   written there, in CPython's own wording for a Python function:
//!   `Stat.add() missing 1 required positional argument: 'v'`,
//!   `... takes 1 positional argument but 2 were given`,
//!   `... got an unexpected keyword argument 'x'`,
//!   `... got multiple values for argument 'v'` (pinned by
//!   tests/api/test_bad_input.py). A wrong value type is reported by the same
//!   bodies as elsewhere (`Stat::add_value`, `log_event_checked`).
//! - `Event(...)` with keywords or a wrong count is handed to
//!   `type.__call__`, so its errors are PyO3's (`Event.__new__() missing 2
//!   required positional arguments: ...`).

use std::ffi::CStr;
use std::panic::{AssertUnwindSafe, catch_unwind};

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::panic::PanicException;
use pyo3::prelude::*;
use pyo3::types::{PyFloat, PyString, PyTuple};

use crate::py_event::Event;
use crate::py_registry::{has_handlers, log_event_checked};
use crate::py_stat::Stat;

/// Installs `Stat.add` on the Stat type and `log_event` in the module.
pub fn install(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    let add = leak_method_def(
        c"add",
        stat_add,
        c"add($self, v)\n--\n\nAdds one sample to the current window.",
    );
    let stat_type = py.get_type::<Stat>();
    // SAFETY: `stat_type` is a live type object (the Stat class, kept alive by
    // the module) and `add` a leaked, hence 'static and never moved,
    // PyMethodDef; PyDescr_NewMethod returns a new reference or NULL with an
    // exception set, which `from_owned_ptr_or_err` turns into an error.
    let descriptor = unsafe {
        Bound::from_owned_ptr_or_err(py, ffi::PyDescr_NewMethod(stat_type.as_type_ptr(), add))?
    };
    stat_type.setattr("add", descriptor)?;

    let log = leak_method_def(
        c"log_event",
        log_event,
        c"log_event(event)\n--\n\nCalls every registered handler with `event`, in registration order.",
    );
    let module_name = module.name()?;
    // SAFETY: `log` is a leaked ('static) PyMethodDef; `module_name` is a live
    // str for the call; PyCFunction_NewEx returns a new reference or NULL
    // with an exception set.
    let function = unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            ffi::PyCFunction_NewEx(log, std::ptr::null_mut(), module_name.as_ptr()),
        )?
    };
    module.add("log_event", function)?;
    install_event_vectorcall(py);
    Ok(())
}

/// Makes `Event(name, timestamp, data)` a vectorcall. Without it CPython
/// calls a heap type through `type.__call__`, which packs the arguments into
/// a tuple, calls `__new__` (whose PyO3 wrapper unpacks them again) and then
/// `__init__`: 1,678 instructions per call against 1,172 this way (callgrind,
/// docs/performance.md).
fn install_event_vectorcall(py: Python<'_>) {
    #[cfg(not(Py_LIMITED_API))]
    {
        let event_type = py.get_type::<Event>();
        // SAFETY: `event_type` is the live Event type object, which PyO3
        // created as a heap type with the full (non-limited) PyTypeObject
        // layout; `tp_vectorcall` is the documented field CPython reads to
        // call the type object itself ("Vectorcall function to use for calls
        // of this type object", never inherited, so subclasses, of which
        // there are none, would be unaffected). It is written once, during
        // module initialisation, before any other code can see the type.
        unsafe {
            (*event_type.as_type_ptr()).tp_vectorcall = Some(event_new_vectorcall);
        }
    }
    #[cfg(Py_LIMITED_API)]
    let _ = py;
}

/// `Event(name, timestamp, data)` called on the Event type.
#[cfg(not(Py_LIMITED_API))]
unsafe extern "C" fn event_new_vectorcall(
    callable: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargsf: usize,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    guarded(|| {
        // SAFETY: CPython calls a vectorcall function attached, with
        // `callable` (the Event type) and the `nargs` positional pointers
        // followed by one per name in `kwnames` valid for the call.
        let py = unsafe { Python::assume_attached() };
        // SAFETY: `nargsf` is what CPython passed: a count with flag bits.
        let nargs = unsafe { ffi::PyVectorcall_NARGS(nargsf) };
        if nargs == 3 && kwnames.is_null() {
            // SAFETY: three positional arguments (checked), borrowed for the call.
            let arg = |index: usize| unsafe { Borrowed::from_ptr(py, *args.add(index)) };
            let event = Event::new(&arg(0), &arg(1), &arg(2))?;
            return Ok(Py::new(py, event)?.into_ptr());
        }
        // Keywords or a wrong count: `type.__call__` as without this
        // function, so the errors are PyO3's usual ones.
        Python::attach(|py| {
            let positional = usize::try_from(nargs).unwrap_or(0);
            // SAFETY: `args` holds `positional` valid borrowed pointers (it
            // may be NULL only when there are none), then one per keyword.
            let arg = |index: usize| unsafe { Bound::from_borrowed_ptr(py, *args.add(index)) };
            let tuple = PyTuple::new(py, (0..positional).map(arg))?;
            let kwargs = pyo3::types::PyDict::new(py);
            // SAFETY: a non-NULL `kwnames` is a tuple of str valid for the call.
            if let Some(names) = unsafe { Bound::from_borrowed_ptr_or_opt(py, kwnames) } {
                for (offset, name) in names.cast_into::<PyTuple>()?.iter().enumerate() {
                    kwargs.set_item(name, arg(positional + offset))?;
                }
            }
            // SAFETY: PyType_Type is CPython's static `type` object, whose
            // `tp_call` (type_call) is always set; `callable` is the Event
            // type, a valid type object, and `tuple`/`kwargs` live for the
            // call. It returns a new reference or NULL with an error set.
            unsafe {
                let type_call = (*std::ptr::addr_of_mut!(ffi::PyType_Type))
                    .tp_call
                    .ok_or_else(|| PyTypeError::new_err("type objects are not callable"))?;
                Bound::from_owned_ptr_or_err(
                    py,
                    type_call(callable, tuple.as_ptr(), kwargs.as_ptr()),
                )
                .map(Bound::into_ptr)
            }
        })
    })
}

/// A `PyMethodDef` that lives as long as the process: CPython keeps a
/// pointer to it in every function or descriptor made from it.
fn leak_method_def(
    name: &'static CStr,
    function: ffi::PyCFunctionFastWithKeywords,
    doc: &'static CStr,
) -> *mut ffi::PyMethodDef {
    Box::into_raw(Box::new(ffi::PyMethodDef {
        ml_name: name.as_ptr(),
        ml_meth: ffi::PyMethodDefPointer {
            PyCFunctionFastWithKeywords: function,
        },
        ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
        ml_doc: doc.as_ptr(),
    }))
}

/// Runs `body` with panics turned into a `PanicException` (none may unwind
/// into CPython) and errors set as the current exception; NULL on failure.
#[inline(always)]
fn guarded(body: impl FnOnce() -> PyResult<*mut ffi::PyObject>) -> *mut ffi::PyObject {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(result)) => result,
        Ok(Err(err)) => Python::attach(|py| {
            err.restore(py);
            std::ptr::null_mut()
        }),
        Err(panic) => Python::attach(|py| {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a Rust panic in torchmon".to_owned());
            PanicException::new_err(message).restore(py);
            std::ptr::null_mut()
        }),
    }
}

/// The single argument of a call of `function(parameter)`, given
/// positionally or by keyword, with Python's own messages for anything else.
///
/// # Safety
/// `args` holds `nargs` positional argument pointers followed by one per
/// name in `kwnames` (NULL or a tuple of str), all valid for the call, as
/// CPython passes them to a `METH_FASTCALL | METH_KEYWORDS` function.
unsafe fn single_argument<'py>(
    py: Python<'py>,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
    function: &str,
    parameter: &str,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: a NULL kwnames means no keywords; else it is a borrowed tuple
    // valid for the call (this function's contract).
    let keywords = unsafe { Bound::from_borrowed_ptr_or_opt(py, kwnames) }
        .map(|names| names.cast_into::<PyTuple>())
        .transpose()?;
    let positional = usize::try_from(nargs).unwrap_or(0);
    // SAFETY: `args` holds one valid pointer per positional argument and per
    // keyword name (the contract); `index` is one of those.
    let arg = |index: usize| unsafe { Bound::from_borrowed_ptr(py, *args.add(index)) };
    if positional > 1 {
        return Err(PyTypeError::new_err(format!(
            "{function}() takes 1 positional argument but {positional} were given"
        )));
    }
    let mut found = (positional == 1).then(|| arg(0));
    if let Some(names) = keywords {
        for (offset, name) in names.iter().enumerate() {
            let name = name.cast_into::<PyString>()?;
            if name.to_str()? != parameter {
                return Err(PyTypeError::new_err(format!(
                    "{function}() got an unexpected keyword argument '{name}'"
                )));
            }
            if found.is_some() {
                return Err(PyTypeError::new_err(format!(
                    "{function}() got multiple values for argument '{parameter}'"
                )));
            }
            found = Some(arg(positional + offset));
        }
    }
    found.ok_or_else(|| {
        PyTypeError::new_err(format!(
            "{function}() missing 1 required positional argument: '{parameter}'"
        ))
    })
}

/// `Stat.add(v)`.
unsafe extern "C" fn stat_add(
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    guarded(|| {
        // SAFETY: CPython calls this method with the calling thread attached
        // (holding the GIL on GIL builds); `slf` is the instance, a borrowed
        // reference valid for the call, and so are the `nargs` argument
        // pointers when `kwnames` is NULL.
        let py = unsafe { Python::assume_attached() };
        // SAFETY: as above, `slf` is a valid borrowed reference for the call,
        // and it is a Stat: CPython calls a method descriptor's function only
        // after checking that `self` is an instance of the descriptor's type
        // (`descr_check` in Objects/descrobject.c, on every call route:
        // bound method, `Stat.add(obj, v)`, `__get__`), and Stat cannot be
        // subclassed.
        let slf = unsafe { Borrowed::from_ptr(py, slf) };
        // SAFETY: see the previous comment.
        let stat = unsafe { slf.cast_unchecked::<Stat>() };
        if nargs == 1 && kwnames.is_null() {
            // SAFETY: one positional argument, no keywords (checked).
            let v = unsafe { Borrowed::from_ptr(py, *args) };
            if let Ok(v) = v.cast_exact::<PyFloat>() {
                let closed = stat.get().record(v.value());
                if closed.is_empty() {
                    return Ok(py.None().into_ptr());
                }
                // The rest runs Python code: with PyO3's bookkeeping.
                return Python::attach(|py| stat.get().emit_closed(py, &closed))
                    .map(|()| py.None().into_ptr());
            }
        }
        Python::attach(|py| {
            // SAFETY: `args`/`nargs`/`kwnames` are what CPython passed.
            let v = unsafe { single_argument(py, args, nargs, kwnames, "Stat.add", "v") }?;
            Stat::add_value(&stat, py, &v).map(|()| py.None().into_ptr())
        })
    })
}

/// `log_event(event)`.
unsafe extern "C" fn log_event(
    _module: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    guarded(|| {
        // SAFETY: CPython calls this function attached, with `nargs` valid
        // borrowed argument pointers when `kwnames` is NULL.
        let py = unsafe { Python::assume_attached() };
        if nargs == 1 && kwnames.is_null() {
            // SAFETY: one positional argument, no keywords (checked).
            let event = unsafe { Borrowed::from_ptr(py, *args) };
            if event.cast::<Event>().is_ok() {
                if !has_handlers() {
                    return Ok(py.None().into_ptr());
                }
                // Already attached: no `Python::attach` (a thread-local
                // count and a pool check) and no argument parsing.
                return log_event_checked(&event).map(|()| py.None().into_ptr());
            }
        }
        Python::attach(|py| {
            // SAFETY: `args`/`nargs`/`kwnames` are what CPython passed.
            let event = unsafe { single_argument(py, args, nargs, kwnames, "log_event", "event") }?;
            log_event_checked(&event).map(|()| py.None().into_ptr())
        })
    })
}
