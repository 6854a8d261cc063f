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

/// Windows at least this long read the coarse clock: its lag (one to two
/// ticks; 3.5-7.5 ms measured on these VMs with a 4 ms tick) is then under
/// 1 % of a window, and it costs a fifth of the fine clock here (see
/// benches/stat_add.rs, group "clock", and docs/performance.md).
pub const COARSE_CLOCK_MIN_WINDOW_MS: i64 = 1000;

/// What a Stat with windows of `window_ms` reads: the override when set,
/// else the coarse clock for long windows and the fine one for short ones.
#[inline(always)]
pub fn now_ms_for_window(window_ms: i64) -> i64 {
    let overridden = OVERRIDE_MS.load(Ordering::Relaxed);
    if overridden != REAL_CLOCK {
        return overridden;
    }
    if window_ms >= COARSE_CLOCK_MIN_WINDOW_MS {
        monotonic_coarse_ms()
    } else {
        monotonic_ms()
    }
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

/// The coarse monotonic clock (`CLOCK_MONOTONIC_COARSE`) in whole
/// milliseconds: the time of the last scheduler tick, read from the vDSO
/// without touching the clocksource. It is never ahead of `monotonic_ms` and
/// lags it by about a tick (`coarse_resolution_ns`); on a VM the kernel
/// updates it late, so up to two ticks are normal.
#[inline(always)]
pub fn monotonic_coarse_ms() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: as in `monotonic_ms`; CLOCK_MONOTONIC_COARSE exists since Linux
    // 2.6.32 and only writes into the exclusively borrowed `ts`.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts);
    }
    ts.tv_sec * 1000 + ts.tv_nsec / 1_000_000
}

/// The tick of the coarse clock in nanoseconds (its worst-case lag).
pub fn coarse_resolution_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, exclusively borrowed timespec; clock_getres
    // only writes into it.
    unsafe {
        libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut ts);
    }
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
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

    #[test]
    fn coarse_clock_is_never_ahead_and_typically_lags_under_two_ticks() {
        let tick_ms = (coarse_resolution_ns() + 999_999) / 1_000_000;
        assert!((1..=100).contains(&tick_ms), "tick {tick_ms} ms");
        let mut lags: Vec<i64> = (0..1000)
            .map(|_| {
                // Bracketed by two fine readings, so preemption cannot make
                // the coarse clock look ahead.
                let before = monotonic_ms();
                let coarse = monotonic_coarse_ms();
                let after = monotonic_ms();
                assert!(coarse <= after, "coarse {coarse} ahead of fine {after}");
                before - coarse
            })
            .collect();
        // Ticks come late on a loaded VM (lags of 3.5-7.5 ms seen with a
        // 4 ms tick), so only the typical lag is bounded, by two ticks.
        lags.sort_unstable();
        let median = lags[lags.len() / 2];
        assert!(
            median <= 2 * tick_ms + 1,
            "median lag {median} ms, tick {tick_ms} ms"
        );
    }
}
