//! The Prometheus text format 0.0.4, byte for byte what prometheus_client
//! writes for the same registry (python/torchmon/handlers/prometheus.py):
//! its escaping, its label order and its `floatToGoString` (`go_float`).

use super::negotiate::Escaping;
use super::{ClassicLayout, Exposition, Value, is_legacy_name};

/// The text exposition's label sets, rendered once: every label sorted by
/// name (`name="value"`, escaped), and for a histogram's buckets the labels
/// before and after `le` in that order (a constant label named `le` is
/// replaced by the bucket's, as prometheus_client does).
pub(super) struct TextLabels {
    /// Every constant label: a gauge's, and a histogram's `_count` and `_sum`.
    pub(super) plain: String,
    /// A histogram's `_bucket` label set per classic bound, `+Inf` last:
    /// the same for every histogram of the handler, so written once.
    pub(super) buckets: Vec<String>,
}

impl TextLabels {
    pub(super) fn new(labels: &[(String, String)], classic: Option<&ClassicLayout>) -> Self {
        let mut sorted: Vec<&(String, String)> = labels.iter().collect();
        sorted.sort();
        let join = |pairs: &mut dyn Iterator<Item = &&(String, String)>| {
            let mut text = String::new();
            for (name, value) in pairs {
                if !text.is_empty() {
                    text.push(',');
                }
                text.push_str(name);
                text.push_str("=\"");
                escape_label_value(value, &mut text);
                text.push('"');
            }
            text
        };
        let plain = join(&mut sorted.iter());
        let before_le = join(&mut sorted.iter().filter(|(name, _)| name.as_str() < "le"));
        let after_le = join(&mut sorted.iter().filter(|(name, _)| name.as_str() > "le"));
        let bounds = classic.map_or(&[][..], |layout| &layout.uppers[..]);
        let buckets = std::iter::once(0.0)
            .chain(bounds.iter().copied())
            .chain(std::iter::once(f64::INFINITY))
            .map(|le| {
                let mut labels = before_le.clone();
                if !labels.is_empty() {
                    labels.push(',');
                }
                labels.push_str("le=\"");
                go_float(le, &mut labels);
                labels.push('"');
                if !after_le.is_empty() {
                    labels.push(',');
                    labels.push_str(&after_le);
                }
                labels
            })
            .collect();
        TextLabels { plain, buckets }
    }
}

impl Exposition {
    /// Every metric family in the Prometheus text format 0.0.4, byte for
    /// byte what prometheus_client's `generate_latest` writes for the
    /// handler's registry (python/torchmon/handlers/prometheus.py): `HELP`
    /// and `TYPE` lines, labels sorted by name, values as its
    /// `floatToGoString`, a histogram's `_bucket` lines at the classic
    /// bounds, then `_count` and `_sum`.
    pub fn encode_text(&self, out: &mut String) {
        self.encode_text_as(out, Escaping::Underscores);
    }

    /// `encode_text` with the names `names` shows (`Escaping`): a name
    /// outside the legacy set (`AllowUtf8` only) is quoted, as the text
    /// format of Prometheus 3 and client_golang write it: `# HELP "a.b" ...`
    /// and `{"a.b_count",rank="0"} 3.0`.
    pub fn encode_text_as(&self, out: &mut String, names: Escaping) {
        let list = self.rendered();
        for family in list {
            let family = family.lock();
            let shown = family.shown_name(names);
            let name = shown.as_ref();
            // Suffixes (`_bucket`...) keep a name legacy or not.
            let legacy = is_legacy_name(name);
            out.push_str("# HELP ");
            push_name(out, name, legacy, "");
            out.push(' ');
            escape_help(&family.help, out);
            out.push_str("\n# TYPE ");
            push_name(out, name, legacy, "");
            match &family.value {
                Value::Gauge(value) => {
                    out.push_str(" gauge\n");
                    text_sample(out, name, legacy, "", &self.text_labels.plain, *value);
                }
                Value::Histogram(cumulative) => {
                    out.push_str(" histogram\n");
                    let count = cumulative.count() as f64;
                    let bounds = self
                        .classic
                        .as_ref()
                        .map(|layout| cumulative.classic(layout))
                        .unwrap_or_default();
                    // Without a layout only `+Inf`, the last label set.
                    let skip = self.text_labels.buckets.len() - 1 - bounds.len();
                    let counts = bounds.iter().map(|&(_, below)| below as f64);
                    for (labels, value) in self.text_labels.buckets[skip..]
                        .iter()
                        .zip(counts.chain(std::iter::once(count)))
                    {
                        text_sample(out, name, legacy, "_bucket", labels, value);
                    }
                    text_sample(out, name, legacy, "_count", &self.text_labels.plain, count);
                    text_sample(
                        out,
                        name,
                        legacy,
                        "_sum",
                        &self.text_labels.plain,
                        cumulative.sum,
                    );
                }
            }
        }
    }
}

/// `name` and `suffix`, in double quotes (escaped as a label value) unless
/// they make a legacy name (`legacy`).
fn push_name(out: &mut String, name: &str, legacy: bool, suffix: &str) {
    if legacy {
        out.push_str(name);
        out.push_str(suffix);
    } else {
        out.push('"');
        escape_label_value(name, out);
        escape_label_value(suffix, out);
        out.push('"');
    }
}

/// One sample line: `name` and `suffix`, the label set in braces unless
/// it is empty, and the value as floatToGoString writes it. A quoted name
/// goes inside the braces, first.
fn text_sample(out: &mut String, name: &str, legacy: bool, suffix: &str, labels: &str, value: f64) {
    if legacy {
        out.push_str(name);
        out.push_str(suffix);
        if !labels.is_empty() {
            out.push('{');
            out.push_str(labels);
            out.push('}');
        }
    } else {
        out.push('{');
        push_name(out, name, false, suffix);
        if !labels.is_empty() {
            out.push(',');
            out.push_str(labels);
        }
        out.push('}');
    }
    out.push(' ');
    // Most values are counts: a whole number below 10**6 is its digits
    // and ".0" in floatToGoString too, without go_float's formatting.
    if value.fract() == 0.0 && (0.0..1e6).contains(&value) && value.is_sign_positive() {
        use std::fmt::Write;
        let _ = write!(out, "{}.0", value as u32);
    } else {
        go_float(value, out);
    }
    out.push('\n');
}

/// A `HELP` text as prometheus_client escapes it: backslash and newline.
fn escape_help(text: &str, out: &mut String) {
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// A label value as prometheus_client escapes it: backslash, newline and
/// double quote.
fn escape_label_value(text: &str, out: &mut String) {
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

/// `x` as prometheus_client's `floatToGoString` writes it: `+Inf`, `-Inf`,
/// `NaN`, otherwise Python's `repr(x)` (the shortest digits that read back
/// as `x`; positional for a decimal exponent from -4 to 15, `3.0`, `1e-05`,
/// `1.5e+16`), except that a positive number with more than 6 digits before
/// the point is written with an exponent as Go does (`1.234567e+06`).
pub fn go_float(x: f64, out: &mut String) {
    use std::fmt::Write;
    if x.is_nan() {
        out.push_str("NaN");
        return;
    }
    if x.is_infinite() {
        out.push_str(if x > 0.0 { "+Inf" } else { "-Inf" });
        return;
    }
    // `{:e}` gives as many digits as the shortest round trip needs:
    // "-1.2345e-5". When two such strings are equally close to `x`, Python
    // picks the even last digit; `{:.Ne}` rounds `x` exactly, half to even,
    // to that many digits, which is Python's string when it reads back as
    // `x`. Below a power of two the doubles are twice as dense, and the
    // closest string may not read back; the shortest one is then the only
    // one of its length that does, Python's too.
    let mut scientific = String::with_capacity(32);
    let _ = write!(scientific, "{x:e}");
    let shortest = scientific
        .split_once('e')
        .map_or(0, |(mantissa, _)| mantissa.trim_start_matches('-').len());
    let decimals = shortest.saturating_sub(2); // "d" or "d.ddd"
    let mut rounded = String::with_capacity(32);
    let _ = write!(rounded, "{x:.decimals$e}");
    if rounded.parse::<f64>() == Ok(x) {
        scientific = rounded;
    }
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (negative, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    // Python's decimal point position: the value is 0.<digits> * 10**point.
    let point = exponent + 1;
    if negative {
        out.push('-');
    }
    if !(-4 < point && point <= 16) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(
            out,
            "e{}{:02}",
            if exponent < 0 { '-' } else { '+' },
            exponent.abs()
        );
        return;
    }
    if point <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-point) as usize));
        out.push_str(&digits);
        return;
    }
    let point = point as usize;
    if !negative && point > 6 {
        // floatToGoString: the repr's digits with the point after the first,
        // trailing zeros and point dropped, and the exponent of the repr's point.
        let mut all = digits.clone();
        if all.len() < point {
            all.extend(std::iter::repeat_n('0', point - all.len()));
        }
        let mut mantissa = format!("{}.{}", &all[..1], &all[1..]);
        // Python also strips the ".0" the repr ends an integral value with.
        let trimmed = mantissa.trim_end_matches(['0', '.']).len();
        mantissa.truncate(trimmed);
        out.push_str(&mantissa);
        let _ = write!(out, "e+{:02}", point - 1);
        return;
    }
    if digits.len() <= point {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', point - digits.len()));
        out.push_str(".0");
    } else {
        out.push_str(&digits[..point]);
        out.push('.');
        out.push_str(&digits[point..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_are_written_as_prometheus_client_writes_them() {
        // Expected: prometheus_client.utils.floatToGoString (tests/sinks/
        // test_prometheus_text.py compares many more against it).
        for (x, expected) in [
            (3.0, "3.0"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (0.1, "0.1"),
            (123456.5, "123456.5"),
            (1234567.0, "1.234567e+06"),
            (1e15, "1e+15"),
            (1234567890123456.0, "1.234567890123456e+15"),
            (1e16, "1e+16"),
            (-1234567.0, "-1234567.0"),
            (-1e16, "-1e+16"),
            (2.5e-300, "2.5e-300"),
            // Halfway between two 17-digit strings: Python's even one.
            (1_760_485_316_806_258.0 + 0.25, "1.7604853168062582e+15"),
            // 2**-97: the closest 16 digits (...094) read back as the double below.
            (2f64.powi(-97), "6.310887241768095e-30"),
            (f64::INFINITY, "+Inf"),
            (f64::NEG_INFINITY, "-Inf"),
            (f64::NAN, "NaN"),
        ] {
            let mut out = String::new();
            go_float(x, &mut out);
            assert_eq!(out, expected, "{x:e}");
        }
    }

    #[test]
    fn text_labels_are_sorted_and_escaped_with_le_among_them() {
        let layout = ClassicLayout {
            shift: 6,
            first: 0,
            uppers: vec![2.0],
        };
        let labels = vec![
            ("rank".to_owned(), "0".to_owned()),
            ("job".to_owned(), "a\"b\\c\nd".to_owned()),
        ];
        let e = Exposition::new(labels, 160, Some(layout), false);
        e.declare("g", "help \\ and\nline", false).unwrap();
        e.declare("h", "hist", true).unwrap();
        e.set_gauge("g", 1.5);
        e.update_histogram("h", |c| c.add_window(3.0, 1, 0, 0, [(0, 2)], []));
        let mut text = String::new();
        e.encode_text(&mut text);
        let labels = r#"job="a\"b\\c\nd",rank="0""#;
        assert_eq!(
            text,
            format!(
                "# HELP g help \\\\ and\\nline\n# TYPE g gauge\ng{{{labels}}} 1.5\n\
                 # HELP h hist\n# TYPE h histogram\n\
                 h_bucket{{job=\"a\\\"b\\\\c\\nd\",le=\"0.0\",rank=\"0\"}} 1.0\n\
                 h_bucket{{job=\"a\\\"b\\\\c\\nd\",le=\"2.0\",rank=\"0\"}} 3.0\n\
                 h_bucket{{job=\"a\\\"b\\\\c\\nd\",le=\"+Inf\",rank=\"0\"}} 3.0\n\
                 h_count{{{labels}}} 3.0\nh_sum{{{labels}}} 3.0\n"
            )
        );
    }

    #[test]
    fn names_follow_the_escaping_scheme_and_utf8_ones_are_quoted() {
        let e = Exposition::new(vec![("rank".to_owned(), "0".to_owned())], 160, None, false);
        e.declare_as("train_loss_mean", "train.loss.mean", "g", false)
            .unwrap();
        e.declare_as("t_h_histogram", "t.h_histogram", "h", true)
            .unwrap();
        e.declare("plain", "p", false).unwrap();
        e.set_gauge("train_loss_mean", 0.25);
        e.update_histogram("t_h_histogram", |c| {
            c.add_window(3.0, 1, 0, 0, [(0, 2)], [])
        });
        let text = |names| {
            let mut text = String::new();
            e.encode_text_as(&mut text, names);
            text
        };
        // Prometheus 2's body, byte for byte.
        let mut legacy = String::new();
        e.encode_text(&mut legacy);
        assert_eq!(text(Escaping::Underscores), legacy);
        assert!(legacy.contains("train_loss_mean{rank=\"0\"} 0.25\n"));
        assert_eq!(
            text(Escaping::AllowUtf8),
            "# HELP \"train.loss.mean\" g\n# TYPE \"train.loss.mean\" gauge\n\
             {\"train.loss.mean\",rank=\"0\"} 0.25\n\
             # HELP \"t.h_histogram\" h\n# TYPE \"t.h_histogram\" histogram\n\
             {\"t.h_histogram_bucket\",le=\"+Inf\",rank=\"0\"} 3.0\n\
             {\"t.h_histogram_count\",rank=\"0\"} 3.0\n\
             {\"t.h_histogram_sum\",rank=\"0\"} 3.0\n\
             # HELP plain p\n# TYPE plain gauge\nplain{rank=\"0\"} 0.0\n"
        );
        let dots = text(Escaping::Dots);
        assert!(
            dots.contains("train_dot_loss_dot_mean{rank=\"0\"} 0.25\n"),
            "{dots}"
        );
        assert!(
            dots.contains("t_dot_h__histogram_count{rank=\"0\"} 3.0\n"),
            "{dots}"
        );
        let values = text(Escaping::Values);
        assert!(
            values.contains("U__train_2e_loss_2e_mean{rank=\"0\"} 0.25\n"),
            "{values}"
        );
        assert!(values.contains("\nplain{rank=\"0\"} 0.0\n"), "{values}");
    }

    #[test]
    fn a_quoted_name_is_escaped_as_a_label_value() {
        let mut out = String::new();
        text_sample(&mut out, "a\"b\\c", false, "_sum", "", 1.0);
        assert_eq!(out, "{\"a\\\"b\\\\c_sum\"} 1.0\n");
    }
}
