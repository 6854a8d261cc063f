//! `GilCell`: a Python handle that is read and replaced only while attached
//! to Python, without atomic read-modify-write instructions on GIL builds.

#[cfg(Py_GIL_DISABLED)]
use parking_lot::Mutex;
use pyo3::prelude::*;

/// A value whose copy is a new reference: taking one runs no Python code.
pub trait CloneRef {
    fn clone_ref(&self, py: Python<'_>) -> Self;
}

impl<T> CloneRef for Py<T> {
    #[inline]
    fn clone_ref(&self, py: Python<'_>) -> Self {
        Py::clone_ref(self, py)
    }
}

impl<T> CloneRef for Option<Py<T>> {
    #[inline]
    fn clone_ref(&self, py: Python<'_>) -> Self {
        self.as_ref().map(|value| value.clone_ref(py))
    }
}

/// On GIL builds the GIL is the lock: `get` and `replace` take a `Python`
/// token and run no Python code while they hold the value (a `Py_INCREF` or a
/// `mem::replace`), so no other thread and no reentrant call can reach it
/// meanwhile. Free-threaded builds use a real lock. `replace` returns the old
/// value, to be dropped by the caller after the access: a drop may run
/// Python code (a `__del__`) that reads this cell.
pub struct GilCell<T> {
    #[cfg(not(Py_GIL_DISABLED))]
    value: std::cell::UnsafeCell<T>,
    #[cfg(Py_GIL_DISABLED)]
    value: Mutex<T>,
}

// SAFETY: `T` is `Send`, so the value may be used from whichever thread
// holds the GIL. Sharing the cell is sound because on GIL builds every access
// goes through `get`/`replace`, which require a `Python` token (the calling
// thread holds the GIL, which one thread holds at a time) and run no Python
// code while the value is borrowed (`CloneRef` is a reference-count
// increment; `mem::replace` moves), so two accesses never overlap.
#[cfg(not(Py_GIL_DISABLED))]
unsafe impl<T: Send> Sync for GilCell<T> {}

impl<T: CloneRef> GilCell<T> {
    pub const fn new(value: T) -> Self {
        GilCell {
            #[cfg(not(Py_GIL_DISABLED))]
            value: std::cell::UnsafeCell::new(value),
            #[cfg(Py_GIL_DISABLED)]
            value: Mutex::new(value),
        }
    }

    /// A new reference to the value.
    #[inline]
    pub fn get(&self, py: Python<'_>) -> T {
        #[cfg(not(Py_GIL_DISABLED))]
        {
            // SAFETY: see `unsafe impl Sync`: `py` proves the GIL is held, and
            // while this shared borrow lives only `clone_ref` runs, which
            // increments a reference count and neither runs Python code nor
            // touches this cell.
            let value = unsafe { &*self.value.get() };
            value.clone_ref(py)
        }
        #[cfg(Py_GIL_DISABLED)]
        {
            self.value.lock().clone_ref(py)
        }
    }

    /// Puts `value` in the cell and returns the old one (drop it after).
    #[inline]
    pub fn replace(&self, _py: Python<'_>, value: T) -> T {
        #[cfg(not(Py_GIL_DISABLED))]
        {
            // SAFETY: as in `get`: the GIL is held (`_py`), and while this
            // exclusive borrow lives only `mem::replace` runs; the old value
            // is dropped by the caller, after the borrow ended.
            let slot = unsafe { &mut *self.value.get() };
            std::mem::replace(slot, value)
        }
        #[cfg(Py_GIL_DISABLED)]
        {
            std::mem::replace(&mut *self.value.lock(), value)
        }
    }

    /// Puts `value` in the cell and drops the old one once the cell is left.
    #[inline]
    pub fn set(&self, py: Python<'_>, value: T) {
        drop(self.replace(py, value));
    }
}
