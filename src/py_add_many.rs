//! `Stat.add_many`'s values read in bulk: a one-dimensional buffer of
//! float64/float32 or (un)signed integers read in place, or any iterable of
//! numbers converted first, so that a bad one adds nothing (docs/api.md,
//! `Stat.add_many`; docs/performance.md).

use pyo3::buffer::{Element, ElementType, PyUntypedBuffer};
use pyo3::prelude::*;

use crate::py_convert::{arg_type_error, arg_value_error, sample};
use torchmon_core::stat::{Closed, Stat as CoreStat};

/// `add_many` over a buffer whose items it can read as numbers; `None` for
/// other item types (bool, float16, structs, big-endian), which are iterated.
pub(crate) fn add_buffer(
    core: &CoreStat,
    py: Python<'_>,
    buffer: &PyUntypedBuffer,
) -> PyResult<Option<Closed>> {
    if buffer.dimensions() != 1 {
        return Err(arg_value_error(
            "Stat.add_many",
            "values",
            format_args!(
                "must be one-dimensional, not a {}-dimensional buffer",
                buffer.dimensions()
            ),
        ));
    }
    if !native_byte_order(buffer.format().to_bytes()) {
        return Ok(None);
    }
    let now = core.now_ms();
    match ElementType::from_format(buffer.format()) {
        ElementType::Float { bytes: 8 } => add_typed::<f64>(core, py, buffer, now),
        ElementType::Float { bytes: 4 } => add_typed::<f32>(core, py, buffer, now),
        ElementType::SignedInteger { bytes: 8 } => {
            // Rounded to nearest, ties to even: what float(int) does.
            add_typed::<i64>(core, py, buffer, now)
        }
        ElementType::SignedInteger { bytes: 4 } => add_typed::<i32>(core, py, buffer, now),
        ElementType::SignedInteger { bytes: 2 } => add_typed::<i16>(core, py, buffer, now),
        ElementType::SignedInteger { bytes: 1 } => add_typed::<i8>(core, py, buffer, now),
        ElementType::UnsignedInteger { bytes: 8 } => add_typed::<u64>(core, py, buffer, now),
        ElementType::UnsignedInteger { bytes: 4 } => add_typed::<u32>(core, py, buffer, now),
        ElementType::UnsignedInteger { bytes: 2 } => add_typed::<u16>(core, py, buffer, now),
        ElementType::UnsignedInteger { bytes: 1 } => add_typed::<u8>(core, py, buffer, now),
        _ => Ok(None),
    }
}

/// Whether a struct-module format's items are in this machine's byte order.
/// Checked here because PyO3 0.30.1's own check (`Element::is_compatible_format`)
/// takes `>` for native on little-endian machines and would read big-endian
/// data as if it were native.
fn native_byte_order(format: &[u8]) -> bool {
    match format.first() {
        Some(b'@' | b'=') => true,
        Some(b'<') => cfg!(target_endian = "little"),
        Some(b'>' | b'!') => cfg!(target_endian = "big"),
        _ => true,
    }
}

/// A buffer item type `add_many` reads, and its conversion to a sample.
trait BufferItem: Element + Copy {
    fn to_f64(self) -> f64;
}

macro_rules! lossless_items {
    ($($t:ty),*) => {$(
        impl BufferItem for $t {
            #[inline(always)]
            fn to_f64(self) -> f64 {
                f64::from(self)
            }
        }
    )*};
}
lossless_items!(f64, f32, i32, i16, i8, u32, u16, u8);

impl BufferItem for i64 {
    #[inline(always)]
    fn to_f64(self) -> f64 {
        // Rounded to nearest, ties to even: what float(int) does.
        self as f64
    }
}

impl BufferItem for u64 {
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
}

/// Reads the buffer as `T` (in place when C-contiguous, else through a copy);
/// `None` when its format is not exactly `T` (e.g. byte-swapped).
fn add_typed<T: BufferItem>(
    core: &CoreStat,
    py: Python<'_>,
    buffer: &PyUntypedBuffer,
    now: i64,
) -> PyResult<Option<Closed>> {
    let Ok(typed) = buffer.as_typed::<T>() else {
        return Ok(None);
    };
    // Free-threaded builds always copy (in C, PyBuffer_ToContiguous): a
    // Python thread may write the buffer while it is read.
    let in_place = typed
        .as_slice_ptr()
        .filter(|items| cfg!(not(Py_GIL_DISABLED)) && items.cast::<T>().as_ptr().is_aligned());
    let closed = match in_place {
        Some(items) if items.is_empty() => Closed::default(),
        Some(items) => {
            let (first, len) = (items.cast::<T>().as_ptr().cast_const(), items.len());
            let read = |index: usize| {
                let index = index.min(len - 1);
                // SAFETY: `first` points at `len > 0` items of `T` (as the
                // exporter described them; `as_typed` checked the format and
                // item size), C-contiguous, aligned (checked above), valid
                // and in place until `buffer` is released after this function
                // returns (PEP 3118's contract), and `index < len` (clamped
                // above). Every bit pattern is a valid `T`. No writer runs
                // meanwhile: we hold the GIL (a GIL build, see above), which
                // excludes every Python-level writer; a native thread writing
                // the buffer without the GIL would race with every consumer
                // of the buffer protocol (numpy's own reductions included),
                // and is outside what any reader can exclude. The read is
                // volatile so the compiler does not merge or reorder it.
                unsafe { first.add(index).read_volatile() }
            };
            core.add_many_at(len, |index| read(index).to_f64(), now)
        }
        None => {
            let copy = typed.to_vec(py)?;
            core.add_many_at(copy.len(), |index| copy[index].to_f64(), now)
        }
    };
    Ok(Some(closed))
}

/// `add_many` over any iterable: every value is converted first, so that a
/// bad one adds nothing.
pub(crate) fn add_iterable(core: &CoreStat, values: &Bound<'_, PyAny>) -> PyResult<Closed> {
    let iterator = values.try_iter().map_err(|_| {
        arg_type_error(
            "Stat.add_many",
            "values",
            "a buffer or an iterable of real numbers",
            values,
        )
    })?;
    // `len()` is only a hint: a hostile `__len__` (10**12) would make the
    // reservation abort the process (tests/robustness/test_hostile_input.py).
    const RESERVE_AT_MOST: usize = 1 << 16;
    let mut samples = Vec::with_capacity(values.len().unwrap_or(0).min(RESERVE_AT_MOST));
    for (index, value) in iterator.enumerate() {
        let value = value?;
        let converted = sample(&value).map_err(|err| {
            err.into_error(&value, &format!("Stat.add_many(values): values[{index}]"))
        })?;
        samples.push(converted);
    }
    Ok(core.add_many_at(samples.len(), |index| samples[index], core.now_ms()))
}
