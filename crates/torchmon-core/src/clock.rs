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

/// The real monotonic clock in nanoseconds (the durations of watchdog
/// sections).
#[inline]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: as in `monotonic_ms`.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
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

/// Smallest value an override may take: the sentinel is reserved.
pub const MIN_OVERRIDE_MS: i64 = 0;

/// `set_override_ms` for `_set_clock_ms`: a time below `MIN_OVERRIDE_MS` is
/// refused, with the message of its `ValueError`, and changes nothing.
pub fn set_checked_override_ms(ms: Option<i64>) -> Result<Option<i64>, String> {
    match ms {
        Some(ms) if ms < MIN_OVERRIDE_MS => Err(format!(
            "the test clock cannot be set before 0 ms (got {ms})"
        )),
        _ => Ok(set_override_ms(ms)),
    }
}

/// A window size given as a float number of seconds, in whole milliseconds:
/// the shortest decimal that reads back as `seconds` (the digits Python's
/// `repr` prints: `1.001`), times 1000, truncated toward zero. The float
/// itself is not multiplied: `1.001 * 1000.0` is `1000.9999999999999`,
/// which truncates to 1000 ms (what torch does, docs/compatibility.md).
/// `Stat` and `WaitCounter` both convert with this. `seconds` must be
/// finite; results beyond i128 saturate.
pub fn seconds_to_ms(seconds: f64) -> i128 {
    debug_assert!(seconds.is_finite(), "{seconds}");
    // `{:e}` writes the shortest digits that round-trip: "-1.001e0".
    let text = format!("{seconds:e}");
    let Some((mantissa, exponent)) = text.split_once('e') else {
        return 0;
    };
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (negative, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, mantissa),
    };
    let fraction_digits = mantissa.split_once('.').map_or(0, |(_, f)| f.len());
    // At most 17 significant digits: an i128 holds them.
    let digits: i128 = mantissa.replace('.', "").parse().unwrap_or(0);
    // milliseconds = digits * 10^shift
    let shift = exponent + 3 - fraction_digits as i32;
    let magnitude = if shift >= 0 {
        10i128
            .checked_pow(shift.unsigned_abs())
            .and_then(|scale| digits.checked_mul(scale))
            .unwrap_or(i128::MAX)
    } else {
        10i128
            .checked_pow(shift.unsigned_abs())
            .map_or(0, |scale| digits / scale)
    };
    if negative { -magnitude } else { magnitude }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_override_before_zero_is_refused_and_changes_nothing() {
        let before = OVERRIDE_MS.load(Ordering::Relaxed);
        assert_eq!(
            set_checked_override_ms(Some(-1)),
            Err("the test clock cannot be set before 0 ms (got -1)".to_owned())
        );
        assert_eq!(OVERRIDE_MS.load(Ordering::Relaxed), before);
    }

    #[test]
    fn seconds_to_ms_truncates_the_decimal_that_repr_shows() {
        let cases: [(f64, i128); 14] = [
            (1.001, 1001), // 1.001 * 1000.0 == 1000.9999999999999
            (4.35, 4350),  // 4.35 * 1000.0 == 4349.999999999999
            (0.0015, 1),
            (0.0019999, 1),
            (1.0009, 1000),
            (1.5, 1500),
            (60.0, 60_000),
            (0.0005, 0),
            (0.0, 0),
            (-0.0, 0),
            (-1.0, -1000),
            (-0.0015, -1),
            (5e-324, 0),
            (9_223_372_036_854_775.807, 9_223_372_036_854_776_000),
        ];
        for (seconds, ms) in cases {
            assert_eq!(seconds_to_ms(seconds), ms, "{seconds:?} s");
        }
        assert_eq!(seconds_to_ms(f64::MAX), i128::MAX);
        assert_eq!(seconds_to_ms(f64::MIN), -i128::MAX);
        assert_eq!(seconds_to_ms(1e35), 10i128.pow(38));
        assert_eq!(seconds_to_ms(1e36), i128::MAX);
    }

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
