//! The negotiation of a scrape (docs/sinks.md, "Prometheus 3"): which
//! exposition format and which metric-name escaping scheme a scraper's
//! `Accept` header asks for (`negotiate`), and the Content-Type that states
//! them. The exposition's own vocabulary, so that the formats (`text`,
//! `protobuf`) and every scrape path (the server of `serve()`, and
//! `PrometheusEventHandler.render()` through the binding) share it.

/// What a scraper asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Protobuf,
}

pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
pub const PROTOBUF_CONTENT_TYPE: &str =
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited";

/// A metric-name escaping scheme, as a scraper names it in its `Accept`
/// header (`escaping=allow-utf-8`, what Prometheus 3 asks for) and as the
/// response's Content-Type states it (docs/sinks.md, "Prometheus 3").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Escaping {
    /// Every character outside `[a-zA-Z0-9_:]` as `_`: torchmon's own
    /// names, also what a scrape naming no scheme gets.
    Underscores,
    /// The names with the Stat keys' own characters (`train.loss.mean`).
    AllowUtf8,
    /// `.` as `_dot_`, `_` as `__`, any other character outside the legacy
    /// set as `__`.
    Dots,
    /// A legacy name as it is; any other prefixed `U__`, with `_` as `__`
    /// and any other character outside the legacy set as `_<hex code>_`.
    Values,
}

impl Escaping {
    /// The scheme named by an `escaping=` value; `None` for an unknown one.
    pub fn parse(value: &str) -> Option<Escaping> {
        match value {
            "underscores" => Some(Escaping::Underscores),
            "allow-utf-8" => Some(Escaping::AllowUtf8),
            "dots" => Some(Escaping::Dots),
            "values" => Some(Escaping::Values),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Escaping::Underscores => "underscores",
            Escaping::AllowUtf8 => "allow-utf-8",
            Escaping::Dots => "dots",
            Escaping::Values => "values",
        }
    }
}

/// What a scrape gets (`negotiate`): the format, and the escaping scheme
/// the scraper named, if it named one torchmon knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Negotiated {
    pub format: Format,
    /// `None`: the names as Prometheus 2 gets them (`Escaping::Underscores`)
    /// under a Content-Type that names no scheme.
    pub escaping: Option<Escaping>,
}

impl From<Format> for Negotiated {
    /// `format` for a scraper that named no escaping scheme.
    fn from(format: Format) -> Negotiated {
        Negotiated {
            format,
            escaping: None,
        }
    }
}

impl Negotiated {
    /// The body's names: `escaping`, or torchmon's own.
    pub fn names(self) -> Escaping {
        self.escaping.unwrap_or(Escaping::Underscores)
    }

    /// The response's Content-Type: the format's, then the scheme used
    /// when the scraper named one.
    pub fn content_type(self) -> String {
        let base = match self.format {
            Format::Text => TEXT_CONTENT_TYPE,
            Format::Protobuf => PROTOBUF_CONTENT_TYPE,
        };
        match self.escaping {
            Some(escaping) => format!("{base}; escaping={}", escaping.as_str()),
            None => base.to_owned(),
        }
    }
}

/// Whether an `Accept` header prefers the delimited MetricFamily protobuf:
/// its quality is above 0 and at least that of every text format it names.
/// A header naming no known format gets text. The one negotiation of every
/// scrape path: the server's (`server`), and
/// `PrometheusEventHandler.render()`'s through the binding
/// (python/torchmon/handlers/prometheus.py).
pub fn accepts_protobuf(accept: &str) -> bool {
    negotiate(accept).format == Format::Protobuf
}

/// One entry of an `Accept` header, as far as the negotiation reads it.
struct AcceptEntry<'a> {
    quality: f64,
    /// The format the entry names, if torchmon serves it.
    format: Option<Format>,
    escaping: Option<&'a str>,
}

fn accept_entries(accept: &str) -> Vec<AcceptEntry<'_>> {
    let mut entries = Vec::new();
    for entry in accept.split(',') {
        let mut parts = entry.split(';').map(str::trim);
        let media_type = parts.next().unwrap_or("").to_ascii_lowercase();
        let (mut quality, mut proto, mut encoding, mut escaping) = (1.0f64, None, None, None);
        for param in parts {
            let (key, value) = param.split_once('=').unwrap_or((param, ""));
            let value = value.trim().trim_matches('"');
            match key.trim().to_ascii_lowercase().as_str() {
                "q" => quality = value.parse().unwrap_or(0.0),
                "proto" => proto = Some(value),
                "encoding" => encoding = Some(value),
                "escaping" => escaping = Some(value),
                _ => {}
            }
        }
        if quality.is_nan() {
            quality = 0.0;
        }
        let format = match media_type.as_str() {
            "application/vnd.google.protobuf"
                if proto == Some("io.prometheus.client.MetricFamily")
                    && encoding == Some("delimited") =>
            {
                Some(Format::Protobuf)
            }
            "text/plain" | "application/openmetrics-text" | "*/*" | "text/*" => Some(Format::Text),
            _ => None,
        };
        entries.push(AcceptEntry {
            quality,
            format,
            escaping,
        });
    }
    entries
}

/// The format of a scrape (protobuf when the `Accept` header's quality for
/// it is above 0 and at least that of every text format it names, else
/// text) and its escaping scheme, read as client_golang reads it: the
/// entries by falling quality, up to the first naming the chosen format,
/// the last known `escaping=` among them wins; an unknown one is ignored.
/// The one negotiation of every scrape path: the server's
/// (`server`), and `PrometheusEventHandler.render()`'s through
/// the binding.
pub fn negotiate(accept: &str) -> Negotiated {
    let mut entries = accept_entries(accept);
    let best = |format: Format| {
        (entries.iter())
            .filter(|entry| entry.format == Some(format))
            .fold(0.0f64, |best, entry| best.max(entry.quality))
    };
    let protobuf = best(Format::Protobuf);
    let format = if protobuf > 0.0 && protobuf >= best(Format::Text) {
        Format::Protobuf
    } else {
        Format::Text
    };
    // Stable: entries of equal quality keep the header's order.
    entries.sort_by(|a, b| b.quality.total_cmp(&a.quality));
    let mut escaping = None;
    for entry in entries.iter().filter(|entry| entry.quality > 0.0) {
        if let Some(scheme) = entry.escaping.and_then(Escaping::parse) {
            escaping = Some(scheme);
        }
        if entry.format == Some(format) {
            break;
        }
    }
    Negotiated { format, escaping }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_negotiation() {
        let prometheus = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        assert!(accepts_protobuf(prometheus));
        assert!(!accepts_protobuf(""));
        assert!(!accepts_protobuf("text/plain"));
        assert!(!accepts_protobuf("application/json, image/png"));
        assert!(!accepts_protobuf(
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=text"
        ));
        assert!(!accepts_protobuf(
            "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.2,text/plain;q=0.5"
        ));
    }

    #[test]
    fn prometheus_3_accept_headers_and_escaping() {
        // What Prometheus 3.5 sends with native histograms, and without.
        let native = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.6,application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1";
        let text = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        assert!(accepts_protobuf(native));
        assert!(!accepts_protobuf(text));
        // A scheme changes no format.
        for escaping in [
            "allow-utf-8",
            "underscores",
            "dots",
            "values",
            "nonsense",
            "",
        ] {
            let protobuf = format!(
                "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;escaping={escaping};q=0.6,text/plain;version=0.0.4;q=0.2"
            );
            assert!(accepts_protobuf(&protobuf), "{protobuf}");
            let plain = format!("text/plain;version=0.0.4;escaping={escaping}");
            assert!(!accepts_protobuf(&plain), "{plain}");
        }
        // As client_golang: the entries down to the first of the chosen
        // format; Prometheus 3's text scrape names allow-utf-8 on its first.
        let utf8 = Some(Escaping::AllowUtf8);
        assert_eq!(negotiate(text).escaping, utf8);
        assert_eq!(negotiate(native).escaping, None);
        assert_eq!(negotiate(native).format, Format::Protobuf);
        let negotiated = |accept: &str| {
            let n = negotiate(accept);
            (n.format, n.escaping)
        };
        assert_eq!(
            negotiated("text/plain;escaping=dots;q=0.5,text/plain;escaping=values;q=0.9"),
            (Format::Text, Some(Escaping::Values))
        );
        // An unknown scheme is ignored, a known one before it kept.
        assert_eq!(
            negotiated("text/plain;escaping=nonsense"),
            (Format::Text, None)
        );
        assert_eq!(
            negotiated("application/json;escaping=dots,text/plain;escaping=nonsense;q=0.5"),
            (Format::Text, Some(Escaping::Dots))
        );
        // Entries of quality 0 are refused, their scheme too.
        assert_eq!(
            negotiated("text/plain;escaping=dots;q=0,*/*"),
            (Format::Text, None)
        );
        assert_eq!(
            negotiate("text/plain;escaping=underscores").content_type(),
            format!("{TEXT_CONTENT_TYPE}; escaping=underscores")
        );
        assert_eq!(negotiate("").content_type(), TEXT_CONTENT_TYPE);
        assert_eq!(negotiate(native).content_type(), PROTOBUF_CONTENT_TYPE);
        for scheme in [
            Escaping::Underscores,
            Escaping::AllowUtf8,
            Escaping::Dots,
            Escaping::Values,
        ] {
            assert_eq!(Escaping::parse(scheme.as_str()), Some(scheme));
        }
    }
}
