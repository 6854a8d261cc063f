//! A double as its shortest decimal: the digits Rust's `{:e}` and Python's
//! `repr` both write (the fewest that read back as the value, the nearest
//! such when several are), as a number for the quantile rule (`shortest`)
//! and as the text Python's `repr` lays out (`python_repr`), so that the
//! core words its errors and reprs as the Python API shows floats.

/// `(digits, exponent)` with `|value| = digits * 10^exponent` written with
/// the fewest digits that read back as `value`.
pub fn shortest(value: f64) -> (u64, i32) {
    let text = format!("{:e}", value.abs());
    let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    // At most 17 significant digits: they fit a u64.
    let digits = format!("{whole}{fraction}").parse().unwrap_or(0);
    let exponent: i32 = exponent.parse().unwrap_or(0);
    (digits, exponent - fraction.len() as i32)
}

/// Python's `repr(value)`: `inf`, `-inf`, `nan` (whatever its sign); else
/// the shortest digits, in exponent notation (`1e+16`, `1.5e-05`: a sign
/// and at least two exponent digits) when the decimal exponent is below -4
/// or at least 16, else positional with at least one fractional digit
/// (`100.0`, `-0.0`).
pub fn python_repr(value: f64) -> String {
    if value.is_nan() {
        return "nan".to_owned();
    }
    let sign = if value.is_sign_negative() { "-" } else { "" };
    if value.is_infinite() {
        return format!("{sign}inf");
    }
    let (digits, exponent) = shortest(value);
    let digits = digits.to_string();
    let length = digits.len() as i32;
    // The exponent of the first digit: value = d.ddd * 10^scientific.
    let scientific = exponent + length - 1;
    if !(-4..16).contains(&scientific) {
        let (first, rest) = digits.split_at(1);
        let point = if rest.is_empty() { "" } else { "." };
        let exponent_sign = if scientific < 0 { '-' } else { '+' };
        let magnitude = scientific.abs();
        format!("{sign}{first}{point}{rest}e{exponent_sign}{magnitude:02}")
    } else if exponent >= 0 {
        format!("{sign}{digits}{}.0", "0".repeat(exponent as usize))
    } else if length + exponent > 0 {
        let (whole, fraction) = digits.split_at((length + exponent) as usize);
        format!("{sign}{whole}.{fraction}")
    } else {
        format!(
            "{sign}0.{}{digits}",
            "0".repeat(-(length + exponent) as usize)
        )
    }
}

/// The non-finite double `python_repr` writes as `text` ("nan", "inf" or
/// "-inf"), read back; `None` for any other text.
pub fn non_finite(text: &str) -> Option<f64> {
    match text {
        "nan" => Some(f64::NAN),
        "inf" => Some(f64::INFINITY),
        "-inf" => Some(f64::NEG_INFINITY),
        _ => None,
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn shortest_decimals_are_the_written_ones() {
        assert_eq!(shortest(0.1), (1, -1));
        assert_eq!(shortest(0.99), (99, -2));
        assert_eq!(shortest(1.0), (1, 0));
        assert_eq!(shortest(0.0), (0, 0));
        assert_eq!(shortest(5e-324), (5, -324));
        assert_eq!(shortest(0.1 + 0.2), (30000000000000004, -17));
    }

    /// Each line of the table is a double's bits (hex) and CPython's repr of
    /// it, printed by tools/gen_float_reprs.py: the switches to exponent
    /// notation, the extremes, zeros, non-finite values and random bits.
    #[test]
    fn python_reprs_are_cpythons() {
        let table = include_str!("../tests/data/python_float_reprs.txt");
        let mut lines = 0;
        for line in table.lines() {
            let (bits, expected) = line.split_once(' ').expect("a bits and a repr");
            let value = f64::from_bits(u64::from_str_radix(bits, 16).expect("hex bits"));
            assert_eq!(python_repr(value), expected, "bits {bits}");
            lines += 1;
        }
        assert!(lines > 600, "the table has {lines} lines");
    }

    #[test]
    fn non_finite_reads_back_what_python_repr_writes() {
        for value in [f64::NAN, -f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let read = non_finite(&python_repr(value)).expect("a non-finite text");
            assert!(read.is_nan() && value.is_nan() || read == value);
        }
        for text in ["NaN", "Infinity", "+inf", "1.0", ""] {
            assert_eq!(non_finite(text), None);
        }
    }
}
