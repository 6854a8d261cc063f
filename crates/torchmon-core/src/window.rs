//! The one rule for a window size (docs/api.md, "Window sizes"), without
//! Python: which types each API takes, how a size becomes whole
//! milliseconds, and which values are refused. The binding (`py_clock.rs`)
//! reads the Python value into a [`WindowArg`] and words the refusals as
//! argument errors.

use crate::clock;

/// `datetime.timedelta.max` in whole milliseconds (999,999,999 days and
/// 86,399,999 ms): the longest window a timedelta holds.
pub const TIMEDELTA_MAX_MS: i64 = 999_999_999 * 86_400_000 + 86_399_999;

/// Whose contract a window size follows: the one rule of docs/api.md
/// ("Window sizes"), in its two forms.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum WindowRule {
    /// `Stat`, torch.monitor's: a timedelta or a float (an int is a
    /// `TypeError`, as torch), up to int64 milliseconds, as torch.monitor 2.13.
    Torch,
    /// Every torchmon API that takes a window size: a timedelta or an int or
    /// float number of seconds, up to `timedelta.max` (they hold the window
    /// as a timedelta).
    Torchmon,
}

impl WindowRule {
    /// Whether an int number of seconds is a window size under this rule.
    pub fn takes_int(self) -> bool {
        self == WindowRule::Torchmon
    }

    /// What the `TypeError` for any other type says the size must be.
    pub fn expected(self) -> &'static str {
        match self {
            WindowRule::Torch => "a datetime.timedelta or a float number of seconds",
            WindowRule::Torchmon => "a datetime.timedelta or an int or float number of seconds",
        }
    }

    /// The largest window in milliseconds, and what that bound is.
    fn bound(self) -> (i64, &'static str) {
        match self {
            WindowRule::Torch => (i64::MAX, "int64"),
            WindowRule::Torchmon => (TIMEDELTA_MAX_MS, "datetime.timedelta.max"),
        }
    }
}

/// A window size whose type was checked (the type phase), before its value.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum WindowArg {
    Millis(i128),
    Seconds(f64),
    /// An int number of seconds beyond i128: past every bound, either way.
    HugeInt {
        negative: bool,
    },
}

impl WindowArg {
    /// A `datetime.timedelta`'s fields, truncated toward zero to whole
    /// milliseconds, like std::chrono::duration_cast.
    pub fn timedelta(days: i32, seconds: i32, microseconds: i32) -> Self {
        let micros = i128::from(days) * 86_400_000_000
            + i128::from(seconds) * 1_000_000
            + i128::from(microseconds);
        WindowArg::Millis(micros / 1000)
    }

    /// An int number of seconds (saturated: past every bound if it does).
    pub fn int_seconds(seconds: i128) -> Self {
        WindowArg::Millis(seconds.saturating_mul(1000))
    }
}

/// Value phase of the window rule: whole milliseconds, truncated (seconds:
/// the decimal that `repr` shows, `clock::seconds_to_ms`), finite, at least
/// 1 ms and at most the rule's bound. `Err` holds the problem, worded to
/// follow the argument's name (`must be finite, not NaN`), for a
/// `ValueError`.
pub fn window_ms(window: WindowArg, rule: WindowRule) -> Result<i64, String> {
    let millis = match window {
        WindowArg::Millis(ms) => ms,
        WindowArg::Seconds(s) => {
            if !s.is_finite() {
                return Err(format!("must be finite, not {s}"));
            }
            clock::seconds_to_ms(s)
        }
        WindowArg::HugeInt { negative: true } => {
            return Err(
                "must be at least 1 millisecond (got an int below -2**127 seconds)".to_owned(),
            );
        }
        // Past either bound: the "too large" below.
        WindowArg::HugeInt { negative: false } => i128::MAX,
    };
    if millis < 1 {
        return Err(format!(
            "must be at least 1 millisecond (got {millis} ms after truncation to whole milliseconds)"
        ));
    }
    let (bound, what) = rule.bound();
    if millis > i128::from(bound) {
        return Err(format!(
            "is too large (at most {bound} milliseconds, {what})"
        ));
    }
    Ok(millis as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use WindowRule::{Torch, Torchmon};

    #[test]
    fn timedelta_truncates_toward_zero() {
        assert_eq!(WindowArg::timedelta(0, 1, 999), WindowArg::Millis(1000));
        assert_eq!(
            WindowArg::timedelta(1, 0, 1500),
            WindowArg::Millis(86_400_001)
        );
        // timedelta(microseconds=-1) is days=-1, seconds=86399, microseconds=999999.
        assert_eq!(
            WindowArg::timedelta(-1, 86_399, 999_999),
            WindowArg::Millis(0)
        );
        assert_eq!(
            WindowArg::timedelta(999_999_999, 86_399, 999_999),
            WindowArg::Millis(i128::from(TIMEDELTA_MAX_MS))
        );
    }

    #[test]
    fn sizes_within_the_rule_are_whole_milliseconds() {
        assert_eq!(window_ms(WindowArg::Seconds(1.001), Torch), Ok(1001));
        assert_eq!(window_ms(WindowArg::Seconds(0.0015), Torchmon), Ok(1));
        assert_eq!(window_ms(WindowArg::Millis(1), Torch), Ok(1));
        assert_eq!(window_ms(WindowArg::int_seconds(60), Torchmon), Ok(60_000));
        assert_eq!(
            window_ms(WindowArg::int_seconds(i128::MAX), Torchmon),
            Err(format!(
                "is too large (at most {TIMEDELTA_MAX_MS} milliseconds, datetime.timedelta.max)"
            ))
        );
        assert_eq!(
            window_ms(WindowArg::Millis(i128::from(TIMEDELTA_MAX_MS)), Torchmon),
            Ok(TIMEDELTA_MAX_MS)
        );
        assert_eq!(
            window_ms(WindowArg::Millis(i128::from(i64::MAX)), Torch),
            Ok(i64::MAX)
        );
    }

    #[test]
    fn refusals_name_the_problem() {
        let refused = |window, rule| window_ms(window, rule).unwrap_err();
        assert_eq!(
            refused(WindowArg::Seconds(f64::NAN), Torch),
            "must be finite, not NaN"
        );
        assert_eq!(
            refused(WindowArg::Seconds(f64::NEG_INFINITY), Torchmon),
            "must be finite, not -inf"
        );
        assert_eq!(
            refused(WindowArg::Seconds(0.0009), Torch),
            "must be at least 1 millisecond (got 0 ms after truncation to whole milliseconds)"
        );
        assert_eq!(
            refused(WindowArg::Millis(-5), Torchmon),
            "must be at least 1 millisecond (got -5 ms after truncation to whole milliseconds)"
        );
        assert_eq!(
            refused(WindowArg::HugeInt { negative: true }, Torchmon),
            "must be at least 1 millisecond (got an int below -2**127 seconds)"
        );
        let huge = WindowArg::HugeInt { negative: false };
        assert_eq!(
            refused(huge, Torchmon),
            format!(
                "is too large (at most {TIMEDELTA_MAX_MS} milliseconds, datetime.timedelta.max)"
            )
        );
        assert_eq!(
            refused(
                WindowArg::Millis(i128::from(TIMEDELTA_MAX_MS) + 1),
                Torchmon
            ),
            format!(
                "is too large (at most {TIMEDELTA_MAX_MS} milliseconds, datetime.timedelta.max)"
            )
        );
        assert_eq!(
            refused(WindowArg::Millis(i128::from(i64::MAX) + 1), Torch),
            format!("is too large (at most {} milliseconds, int64)", i64::MAX)
        );
        assert_eq!(
            refused(WindowArg::Seconds(1e300), Torch),
            format!("is too large (at most {} milliseconds, int64)", i64::MAX)
        );
    }

    #[test]
    fn only_the_torchmon_rule_takes_an_int() {
        assert!(!Torch.takes_int());
        assert!(Torchmon.takes_int());
        assert_eq!(
            Torch.expected(),
            "a datetime.timedelta or a float number of seconds"
        );
        assert_eq!(
            Torchmon.expected(),
            "a datetime.timedelta or an int or float number of seconds"
        );
    }
}
