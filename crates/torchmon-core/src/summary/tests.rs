use super::line::{Value, is_isoformat, parse};
use super::series::{Series, fsum};
use super::*;

const TS: &str = "2025-01-02T03:04:05.000006";

fn line(data: &str) -> Vec<u8> {
    format!("{{\"name\":\"torch.monitor.Stat\",\"timestamp\":\"{TS}\",\"data\":{data}}}\n")
        .into_bytes()
}

#[test]
fn a_sink_line_is_read() {
    let raw = line(r#"{"loss.mean":0.5,"loss.count":3,"tag":"x","ok":true,"n":{"$float":"-inf"}}"#);
    let record = parse(&raw).unwrap();
    assert_eq!(record.name, "torch.monitor.Stat");
    let data: Vec<(&str, Value)> = record.data.iter().map(|(k, v)| (&**k, *v)).collect();
    assert_eq!(
        data,
        [
            ("loss.mean", Value::Number(0.5)),
            ("loss.count", Value::Number(3.0)),
            ("tag", Value::Other),
            ("ok", Value::Other),
            ("n", Value::Number(f64::NEG_INFINITY)),
        ]
    );
    assert_eq!(record.distribution, None);
}

#[test]
fn what_python_reads_otherwise_is_left_to_it() {
    // json.loads reads each of these differently from serde_json, or the
    // Python reader refuses the line: none may be read here.
    for data in [
        r#"{"a":NaN}"#,
        r#"{"a":Infinity}"#,
        r#"{"a":-0}"#,
        r#"{"a":-0.0}"#,
        r#"{"a":9223372036854775808}"#,
        r#"{"a":-9223372036854775809}"#,
        r#"{"a":123456789012345678901234567890}"#,
        r#"{"a":1e400}"#,
        r#"{"a":1,"a":2}"#,
        r#"{"a":[1]}"#,
        r#"{"a":null}"#,
        r#"{"a":{"$float":"NaN"}}"#,
        r#"{"a":{"$float":"nan","b":1}}"#,
        r#"{"a":"\ud800"}"#,
        r#"[]"#,
    ] {
        assert!(!parse(&line(data)).is_ok_and(|r| r.sure), "{data}");
    }
    for raw in [
        r#"{"name":"x","timestamp":"2025-01-02T03:04:05","data":{},"extra":1}"#,
        r#"{"name":"x","name":"y","timestamp":"2025-01-02T03:04:05","data":{}}"#,
        r#"{"name":"x","timestamp":"2025-01-02T03:04:05","fold":2,"data":{}}"#,
        r#"{"name":"x","timestamp":"2025-01-02T03:04:05","fold":true,"data":{}}"#,
        r#"{"name":"x","timestamp":"2025-02-29T03:04:05","data":{}}"#,
        r#"{"name":"x","data":{}}"#,
        r#"{"name":1,"timestamp":"2025-01-02T03:04:05","data":{}}"#,
        r#"{"name":"x","timestamp":"2025-01-02T03:04:05","data":{}} x"#,
    ] {
        assert!(!parse(raw.as_bytes()).is_ok_and(|r| r.sure), "{raw}");
    }
    // Ints whose float is below 2**63 are read for sure.
    let raw = line(r#"{"a":-9223372036854774784,"b":9223372036854774784}"#);
    let record = parse(&raw).unwrap();
    assert!(record.sure);
    assert_eq!(record.data[0].1, Value::Number(-9223372036854774784.0));
    assert_eq!(record.data[1].1, Value::Number(9223372036854774784.0));
    // What the sink writes, read without a doubt once Python read it.
    let raw = line(r#"{"a":-0.0,"b":1e+19}"#).to_vec();
    let record = parse(&raw).unwrap();
    assert!(!record.sure);
    assert_eq!(record.data[1].1, Value::Number(1e19));
}

#[test]
fn floats_are_correctly_rounded() {
    // Halfway cases that a fast, inexact parser gets wrong.
    let raw = line(r#"{"a":2.2250738585072011e-308,"b":9007199254740993.0,"c":0.1}"#);
    let record = parse(&raw).unwrap();
    let values: Vec<f64> = record
        .data
        .iter()
        .map(|(_, v)| match v {
            Value::Number(x) => *x,
            Value::Other => panic!(),
        })
        .collect();
    assert_eq!(
        values,
        ["2.2250738585072011e-308", "9007199254740993.0", "0.1"].map(|t| t.parse::<f64>().unwrap())
    );
}

#[test]
fn isoformat_subset() {
    for ok in [
        "2025-01-02T03:04:05",
        "2024-02-29T23:59:59.999999",
        "0001-01-01T00:00:00+05:30",
        "9999-12-31T00:00:00-23:59",
    ] {
        assert!(is_isoformat(ok.as_bytes()), "{ok}");
    }
    for bad in [
        "2025-02-29T00:00:00",
        "1900-02-29T00:00:00",
        "0000-01-01T00:00:00",
        "2025-13-01T00:00:00",
        "2025-01-01T24:00:00",
        "2025-01-01T00:00:00.123",
        "2025-01-01T00:00:00+24:00",
        "2025-01-01T00:00:00Z",
        "2025-01-01 00:00:00",
        "2025-01-01T00:00:00+05:30:00",
    ] {
        assert!(!is_isoformat(bad.as_bytes()), "{bad}");
    }
}

#[test]
fn fsum_is_cpythons() {
    assert_eq!(
        fsum([1e-16, 1.0, 1e16].into_iter()),
        Some(1.0000000000000002e16)
    );
    assert_eq!(fsum([0.1; 10].into_iter()), Some(1.0));
    assert_eq!(fsum([1e308, 1e308].into_iter()), None);
    assert!(
        fsum([f64::INFINITY, f64::NEG_INFINITY].into_iter())
            .unwrap()
            .is_nan()
    );
}

#[test]
fn series_mean_min_max_and_trend() {
    let mut s = Series::default();
    for v in [1.0, f64::NAN, 3.0, 1e308, 1e308] {
        s.add(v);
    }
    // The sum overflows; the mean does not (the Python code's figure).
    assert_eq!(s.mean(), 5e307);
    assert_eq!((s.n, s.low, s.high), (4, 1.0, 1e308));
    let mut s = Series::default();
    s.add(f64::INFINITY);
    s.add(f64::NEG_INFINITY);
    assert!(s.mean().is_nan());
    // 48 windows: 24 runs of 2.
    let mut s = Series::default();
    for i in 0..48 {
        s.add(f64::from(i));
    }
    let bars: Vec<char> = "_.-=+*#@".chars().collect();
    assert_eq!(s.trend.draw(&bars), "___...---===+++***###@@@");
}

#[test]
fn every_aggregation_suffix_is_split_off() {
    for row in crate::aggregation::TABLE {
        let key = format!("train.loss.{}", row.key_suffix);
        assert_eq!(split_stat_key(&key), ("train.loss", row.key_suffix));
    }
    assert_eq!(split_stat_key("train.loss"), ("train.loss", ""));
}

type Calls = Vec<(Vec<u8>, u64)>;

fn table<'a>(summary: &'a Summary, name: &str) -> Vec<Vec<Cell<'a>>> {
    summary.table(name, &['x']).unwrap()
}

fn text(s: &str) -> Cell<'_> {
    Cell::Text(s.into())
}

fn feed_all(summary: &mut Summary, blocks: &[&[u8]]) -> (Result<u64, FeedError<()>>, Calls) {
    let mut calls = Vec::new();
    let mut fallback = |line: &[u8], lineno: u64| -> Result<Option<Vec<u8>>, ()> {
        calls.push((line.to_vec(), lineno));
        Ok(None)
    };
    summary.start_file("0");
    for block in blocks {
        if let Err(e) = summary.feed(block, &mut fallback) {
            return (Err(e), calls);
        }
    }
    let records = summary.finish_file(&mut fallback);
    (records, calls)
}

#[test]
fn lines_split_across_blocks_blank_bad_and_unfinished() {
    let good = line(r#"{"a.mean":1.0}"#);
    let mut log = good.clone();
    log.extend_from_slice(b" \t\r\n");
    log.extend_from_slice(b"{bad}\n");
    log.extend_from_slice(&good);
    log.extend_from_slice(&good[..good.len() - 1]); // a whole event without its newline
    let mut summary = Summary::new(1 << 20, false);
    let blocks: Vec<&[u8]> = log.chunks(7).collect();
    let (records, calls) = feed_all(&mut summary, &blocks);
    assert_eq!(records, Ok(3));
    assert_eq!(calls, [(b"{bad}\n".to_vec(), 3)]);
    let rows = table(&summary, "stats");
    assert_eq!(rows[0][..3], [text("a"), text("mean"), Cell::Int(3)]);
    // An unfinished line that is no event goes to the fallback as such.
    let mut summary = Summary::new(1 << 20, false);
    let (records, calls) = feed_all(&mut summary, &[&good, b"{\"na"]);
    assert_eq!((records, calls), (Ok(1), vec![(b"{\"na".to_vec(), 2)]));
}

#[test]
fn the_line_limit_counts_the_newline() {
    let good = line(r#"{"a.mean":1.0}"#);
    let mut summary = Summary::new(good.len(), false);
    assert_eq!(feed_all(&mut summary, &[&good, &good]).0, Ok(2));
    let mut summary = Summary::new(good.len() - 1, false);
    assert_eq!(
        feed_all(&mut summary, &[&good]).0,
        Err(FeedError::LineTooLong(1))
    );
    // Refused while still unfinished, without waiting for its end.
    let mut summary = Summary::new(10, false);
    let (result, _) = feed_all(&mut summary, &[b"\n", b"0123456789", b"0"]);
    assert_eq!(result, Err(FeedError::LineTooLong(2)));
}

#[test]
fn windows_others_and_ranks() {
    let mut summary = Summary::new(1 << 20, true);
    let other = b"{\"name\":\"epoch\",\"timestamp\":\"2025-01-02T03:04:05\",\"data\":{\"n\":1}}\n";
    for (label, value) in [("0", "1.0"), ("1", "3.0")] {
        let mut log = line(&format!(r#"{{"s.p50":{value},"s.count":2}}"#));
        log.extend_from_slice(other);
        let mut fallback = |_: &[u8], _: u64| -> Result<Option<Vec<u8>>, ()> { Ok(None) };
        summary.start_file(label);
        summary.feed(&log, &mut fallback).unwrap();
        assert_eq!(summary.finish_file(&mut fallback), Ok(2));
    }
    let rows = table(&summary, "stats");
    assert_eq!(rows.len(), 2);
    assert_eq!(
        rows[0][2..5],
        [Cell::Int(2), Cell::Float(3.0), Cell::Float(2.0)]
    );
    let others = table(&summary, "others");
    assert_eq!(
        others,
        [vec![text("epoch"), Cell::Int(2), Cell::Bytes(other)]]
    );
    let ranks = table(&summary, "ranks");
    assert_eq!(
        ranks[1][1..4],
        [text("count"), Cell::Int(2), Cell::Float(4.0)]
    );
    assert_eq!(ranks[0][3], Cell::Nothing); // p50s do not add up
    assert_eq!((&ranks[0][5], &ranks[0][7]), (&text("0"), &text("1")));
    let scores: Vec<Cell<'_>> = table(&summary, "stragglers")
        .into_iter()
        .map(|r| r[3].clone())
        .collect();
    assert_eq!(scores, [Cell::Float(1.0), Cell::Float(1.0 / 3.0)]);
    assert_eq!(summary.table("nothing", &[]), None);
}

fn dist_line(distribution: &str) -> Vec<u8> {
    format!(
        "{{\"name\":\"torch.monitor.Stat\",\"timestamp\":\"{TS}\",\"data\":{{\"t.p50\":1.0}},\
         \"distribution\":{distribution}}}\n"
    )
    .into_bytes()
}

#[test]
fn stored_distributions_are_checked_and_merged() {
    // 1.0 is the top of bucket -1; 2.0 of bucket 63.
    let valid = r#"{"scale":6,"count":2,"sum":3.0,"min":1.0,"max":2.0,"zero_count":0,"nan_count":0,"positive_inf_count":0,"negative_inf_count":0,"positive":[[-1,1],[63,1]],"negative":[]}"#;
    let invalid = [
        valid.replace(r#""count":2"#, r#""count":3"#),
        valid.replace(r#""scale":6"#, r#""scale":5"#),
        valid.replace(r#""min":1.0"#, r#""min":1.5"#),
        valid.replace(r#"[[-1,1],[63,1]]"#, r#"[[63,1],[-1,1]]"#),
        valid.replace(r#","sum":3.0"#, ""),
    ];
    let mut log = dist_line(valid);
    log.extend_from_slice(&dist_line(valid));
    for d in &invalid {
        log.extend_from_slice(&dist_line(d));
    }
    log.extend_from_slice(&dist_line("null"));
    let mut summary = Summary::new(1 << 20, false);
    let (records, calls) = feed_all(&mut summary, &[&log]);
    assert_eq!(records, Ok(3));
    assert_eq!(
        calls.iter().map(|c| c.1).collect::<Vec<_>>(),
        [3, 4, 5, 6, 7]
    );
    let rows = table(&summary, "quantiles");
    let expected = [text("t"), Cell::Int(2), Cell::Int(4)]
        .into_iter()
        .chain([1.0, 2.0, 2.0, 2.0].map(Cell::Float));
    assert_eq!(rows, [expected.collect::<Vec<_>>()]);
}

#[test]
fn counts_past_u64_stop_the_reading() {
    let zeros = r#"{"count":10000000000000000000,"sum":0.0,"min":0.0,"max":0.0,"zero_count":10000000000000000000}"#;
    let mut summary = Summary::new(1 << 20, false);
    let (result, calls) = feed_all(&mut summary, &[&dist_line(zeros), &dist_line(zeros)]);
    assert_eq!(
        (result, calls.len()),
        (Err(FeedError::CountsOverflow(2)), 0)
    );
}
