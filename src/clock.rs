//! The monotonic millisecond clock that Stat windows read, and its test override.
//!
//! Windows are aligned to `CLOCK_MONOTONIC` (what C++ `steady_clock` and
//! Python's `time.monotonic()` read on Linux), so two Stats with the same
//! window size share boundaries with each other and with torch.monitor.

use std::sync::atomic::{AtomicI64, Ordering};

/// Marks "no override": the real clock is read.
const REAL_CLOCK: i64 = i64::MIN;

/// When not `REAL_CLOCK`, the time in milliseconds that every Stat sees.
/// Reading it costs the hot path one relaxed load.
static OVERRIDE_MS: AtomicI64 = AtomicI64::new(REAL_CLOCK);

/// Milliseconds on the monotonic clock, or the override when one is set.
#[inline]
pub fn now_ms() -> i64 {
    let overridden = OVERRIDE_MS.load(Ordering::Relaxed);
    if overridden != REAL_CLOCK {
        return overridden;
    }
    monotonic_ms()
}

/// The real monotonic clock in whole milliseconds (truncated, as torch does).
#[inline]
pub fn monotonic_ms() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, exclusively borrowed timespec for the duration of
    // the call, and CLOCK_MONOTONIC is supported on every Linux kernel, so the
    // call only writes into `ts`. A failure (impossible for this clock) leaves
    // it zeroed, which is still a valid reading.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec * 1000 + ts.tv_nsec / 1_000_000
}

/// Makes every Stat read `ms` instead of the real clock (`None` restores it).
/// Returns the previous override, so callers can nest and restore.
pub fn set_override_ms(ms: Option<i64>) -> Option<i64> {
    let previous = OVERRIDE_MS.swap(ms.unwrap_or(REAL_CLOCK), Ordering::Relaxed);
    (previous != REAL_CLOCK).then_some(previous)
}

/// The current override, if any.
pub fn override_ms() -> Option<i64> {
    let current = OVERRIDE_MS.load(Ordering::Relaxed);
    (current != REAL_CLOCK).then_some(current)
}

/// Smallest value an override may take: the sentinel is reserved.
pub const MIN_OVERRIDE_MS: i64 = 0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_clock_is_monotonic_and_close_to_std() {
        let a = monotonic_ms();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let b = monotonic_ms();
        assert!(b >= a + 5, "{a} then {b}");
    }
}
