//! A parser for the Prometheus text exposition format (version 0.0.4, plus the parts
//! of OpenMetrics that appear in practice: `# EOF`, `# UNIT`, exemplars).
//!
//! Written here rather than taken from a crate: the one maintained-looking parser
//! (`prometheus-parse`) splits label sets with regexes on `,` and `}`, so a label value
//! such as `device_name="NVIDIA H100, 80GB"` or one with an escaped quote is misread,
//! and names with `:` are rejected. This one follows the format's grammar: escaped
//! label values, `NaN`/`±Inf`, optional timestamps, HELP/TYPE in any order, and other
//! exporters' families mixed in.

use std::collections::HashMap;

use crate::stats::Histogram;

/// The declared type of a metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    /// counter
    Counter,
    /// gauge
    Gauge,
    /// histogram
    Histogram,
    /// summary
    Summary,
    /// untyped or unknown
    Untyped,
}

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name, e.g. `inference_time_seconds_bucket`.
    pub name: String,
    /// Labels in the order they appeared.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
    /// Milliseconds since the epoch, when given.
    pub timestamp_ms: Option<i64>,
}

impl Sample {
    /// The value of a label.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// A parsed exposition.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exposition {
    /// Every sample, in order.
    pub samples: Vec<Sample>,
    /// `# TYPE` declarations by family name.
    pub types: HashMap<String, MetricType>,
    /// `# HELP` texts by family name (unescaped).
    pub help: HashMap<String, String>,
}

/// A syntax error: 1-based line and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub reason: String,
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Parses a float as Prometheus writes them (Go's ParseFloat: `NaN`, `+Inf`, `-Inf`, any case).
pub fn parse_value(s: &str) -> Option<f64> {
    match s.to_ascii_lowercase().as_str() {
        "nan" => Some(f64::NAN),
        "+inf" | "inf" => Some(f64::INFINITY),
        "-inf" => Some(f64::NEG_INFINITY),
        _ => s.parse().ok(),
    }
}

struct Cursor<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<char> {
        self.s[self.pos..].chars().next()
    }
    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }
    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(' ' | '\t')) {
            self.pos += 1;
        }
    }
    fn name(&mut self) -> Result<&'a str, String> {
        let start = self.pos;
        match self.peek() {
            Some(c) if is_name_start(c) => {
                self.bump();
            }
            Some(c) => return Err(format!("expected a name, found `{c}`")),
            None => return Err("expected a name, found the end of the line".into()),
        }
        while matches!(self.peek(), Some(c) if is_name_char(c)) {
            self.bump();
        }
        Ok(&self.s[start..self.pos])
    }
    fn token(&mut self) -> &'a str {
        let start = self.pos;
        while matches!(self.peek(), Some(c) if c != ' ' && c != '\t') {
            self.bump();
        }
        &self.s[start..self.pos]
    }
    fn quoted(&mut self) -> Result<String, String> {
        if self.bump() != Some('"') {
            return Err("label value must start with `\"`".into());
        }
        let mut out = String::new();
        loop {
            match self.bump() {
                None => return Err("unterminated label value".into()),
                Some('"') => return Ok(out),
                Some('\\') => match self.bump() {
                    Some('\\') => out.push('\\'),
                    Some('"') => out.push('"'),
                    Some('n') => out.push('\n'),
                    Some(c) => return Err(format!("unknown escape `\\{c}` in label value")),
                    None => return Err("unterminated escape in label value".into()),
                },
                Some(c) => out.push(c),
            }
        }
    }
}

fn unescape_help(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some('\\') => out.push('\\'),
                Some(o) => {
                    out.push('\\');
                    out.push(o);
                }
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let mut c = Cursor { s: line, pos: 0 };
    let name = c.name()?.to_string();
    c.skip_ws();
    let mut labels = Vec::new();
    if c.peek() == Some('{') {
        c.bump();
        loop {
            c.skip_ws();
            if c.peek() == Some('}') {
                c.bump();
                break;
            }
            let key = c.name()?.to_string();
            c.skip_ws();
            if c.bump() != Some('=') {
                return Err(format!("expected `=` after label `{key}`"));
            }
            c.skip_ws();
            let value = c.quoted()?;
            if labels.iter().any(|(k, _)| *k == key) {
                return Err(format!("label `{key}` appears twice"));
            }
            labels.push((key, value));
            c.skip_ws();
            match c.bump() {
                Some(',') => continue,
                Some('}') => break,
                Some(o) => return Err(format!("expected `,` or `}}` in labels, found `{o}`")),
                None => return Err("unterminated label set".into()),
            }
        }
    }
    c.skip_ws();
    let value_text = c.token();
    if value_text.is_empty() {
        return Err(format!("sample `{name}` has no value"));
    }
    let value = parse_value(value_text).ok_or_else(|| format!("`{value_text}` is not a number"))?;
    c.skip_ws();
    let mut timestamp_ms = None;
    match c.peek() {
        None | Some('#') => {} // end, or an OpenMetrics exemplar we do not use
        Some(_) => {
            let ts = c.token();
            // OpenMetrics timestamps are float seconds; the 0.0.4 format's are integer ms.
            timestamp_ms = Some(match ts.parse::<i64>() {
                Ok(ms) => ms,
                Err(_) => match ts.parse::<f64>() {
                    Ok(secs) if secs.is_finite() => (secs * 1000.0).round() as i64,
                    _ => return Err(format!("`{ts}` is not a timestamp")),
                },
            });
            c.skip_ws();
            if !matches!(c.peek(), None | Some('#')) {
                return Err(format!("unexpected text after the timestamp: `{}`", &line[c.pos..]));
            }
        }
    }
    Ok(Sample {
        name,
        labels,
        value,
        timestamp_ms,
    })
}

/// Parses a whole exposition.
pub fn parse(text: &str) -> Result<Exposition, ParseError> {
    let mut exp = Exposition::default();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim_end_matches('\r').trim_start();
        let err = |reason: String| ParseError { line: i + 1, reason };
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let rest = rest.trim_start();
            let mut parts = rest.splitn(3, [' ', '\t']);
            match parts.next() {
                Some("TYPE") => {
                    let name = parts.next().ok_or_else(|| err("TYPE without a metric name".into()))?;
                    let kind = match parts.next().map(str::trim) {
                        Some("counter") => MetricType::Counter,
                        Some("gauge") => MetricType::Gauge,
                        Some("histogram") => MetricType::Histogram,
                        Some("summary") => MetricType::Summary,
                        Some("untyped" | "unknown" | "gaugehistogram" | "stateset" | "info") => MetricType::Untyped,
                        other => return Err(err(format!("unknown metric type {other:?} for `{name}`"))),
                    };
                    exp.types.insert(name.to_string(), kind);
                }
                Some("HELP") => {
                    let name = parts.next().ok_or_else(|| err("HELP without a metric name".into()))?;
                    exp.help
                        .insert(name.to_string(), unescape_help(parts.next().unwrap_or("")));
                }
                _ => {} // any other comment, `# EOF`, `# UNIT`
            }
            continue;
        }
        exp.samples.push(parse_sample(line).map_err(err)?);
    }
    Ok(exp)
}

/// Why a histogram could not be read from an exposition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HistogramError {
    /// No `_bucket` series with the requested labels.
    Missing,
    /// Buckets are there but malformed (no +Inf, bad `le`).
    Malformed(String),
}

/// Reads histogram `name` from an exposition, summing every series whose labels
/// include all of `matchers` (one pod's scrape has exactly one).
pub fn histogram(exp: &Exposition, name: &str, matchers: &[(&str, &str)]) -> Result<Histogram, HistogramError> {
    let bucket_name = format!("{name}_bucket");
    let (sum_name, count_name) = (format!("{name}_sum"), format!("{name}_count"));
    let matches = |s: &Sample| matchers.iter().all(|(k, v)| s.label(k) == Some(*v));
    let mut by_le: Vec<(f64, f64)> = Vec::new();
    let (mut sum, mut count, mut seen) = (0.0, 0.0, false);
    for s in exp.samples.iter().filter(|s| matches(s)) {
        if s.name == bucket_name {
            let le = s
                .label("le")
                .ok_or_else(|| HistogramError::Malformed(format!("{bucket_name} without `le`")))?;
            let bound = parse_value(le)
                .filter(|b| !b.is_nan())
                .ok_or_else(|| HistogramError::Malformed(format!("`le=\"{le}\"` is not a number")))?;
            match by_le.iter_mut().find(|(b, _)| *b == bound) {
                Some(slot) => slot.1 += s.value,
                None => by_le.push((bound, s.value)),
            }
            seen = true;
        } else if s.name == sum_name {
            sum += s.value;
        } else if s.name == count_name {
            count += s.value;
        }
    }
    if !seen {
        return Err(HistogramError::Missing);
    }
    by_le.sort_by(|a, b| a.0.total_cmp(&b.0));
    if by_le.last().map(|b| b.0) != Some(f64::INFINITY) {
        return Err(HistogramError::Malformed(format!(
            "{bucket_name} has no le=\"+Inf\" bucket"
        )));
    }
    // Counts are cumulative observations: finite, not negative, never fewer at a higher
    // bound (else every quantile read from them is made up).
    let shown = |b: f64| {
        if b == f64::INFINITY {
            "+Inf".to_string()
        } else {
            b.to_string()
        }
    };
    if let Some((le, c)) = by_le.iter().find(|(_, c)| !(c.is_finite() && *c >= 0.0)) {
        return Err(HistogramError::Malformed(format!(
            "{bucket_name}{{le=\"{}\"}} is {c}: a count is a finite number ≥ 0",
            shown(*le)
        )));
    }
    if let Some(w) = by_le.windows(2).find(|w| w[1].1 < w[0].1) {
        return Err(HistogramError::Malformed(format!(
            "{bucket_name}{{le=\"{}\"}} is {} but le=\"{}\" below it is {}: buckets count cumulatively",
            shown(w[1].0),
            w[1].1,
            shown(w[0].0),
            w[0].1
        )));
    }
    if !(count.is_finite() && count >= 0.0 && sum.is_finite()) {
        return Err(HistogramError::Malformed(format!(
            "{count_name} {count} or {sum_name} {sum} is not a finite count and sum"
        )));
    }
    Ok(Histogram {
        buckets: by_le,
        sum,
        count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_that_do_not_count_cumulatively_are_malformed() {
        let read = |text: &str| histogram(&parse(text).expect("parses"), "h", &[]);
        let ok = "h_bucket{le=\"0.1\"} 2\nh_bucket{le=\"+Inf\"} 3\nh_sum 0.5\nh_count 3\n";
        assert!(read(ok).is_ok());
        for (text, says) in [
            (
                "h_bucket{le=\"0.001\"} 5\nh_bucket{le=\"0.1\"} 2\nh_bucket{le=\"+Inf\"} 5\nh_sum 0.5\nh_count 5\n",
                "h_bucket{le=\"0.1\"} is 2 but le=\"0.001\" below it is 5",
            ),
            (
                "h_bucket{le=\"0.1\"} -2\nh_bucket{le=\"+Inf\"} 3\nh_sum 0.5\nh_count 3\n",
                "h_bucket{le=\"0.1\"} is -2: a count is a finite number ≥ 0",
            ),
            (
                "h_bucket{le=\"0.1\"} 1\nh_bucket{le=\"+Inf\"} +Inf\nh_sum 0.5\nh_count 3\n",
                "h_bucket{le=\"+Inf\"} is inf",
            ),
            (
                "h_bucket{le=\"0.1\"} 1\nh_bucket{le=\"+Inf\"} 3\nh_sum NaN\nh_count 3\n",
                "is not a finite count and sum",
            ),
        ] {
            match read(text) {
                Err(HistogramError::Malformed(r)) => assert!(r.contains(says), "{says:?} not in {r:?}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn parses_the_tricky_parts_of_the_format() {
        let text = "# HELP x_total A \\\\ help\\nline\n\
                    # TYPE x_total counter\n\
                    x_total{a=\"b, c\",d=\"say \\\"hi\\\"\",e=\"{}\\\\\"} 3 1700000000000\n\
                    \n\
                    # some comment\n\
                    up 1\n\
                    g{} NaN\n\
                    h_bucket{le=\"+Inf\"} +Inf\n\
                    neg -Inf\n\
                    sci 1.5e-3\n\
                    ns:rule:rate5m{job=\"j\",} 7\n\
                    om_total 2 # {trace_id=\"x\"} 1\n\
                    # EOF\n";
        let e = parse(text).expect("valid");
        assert_eq!(e.samples.len(), 8);
        let x = &e.samples[0];
        assert_eq!(x.label("a"), Some("b, c"));
        assert_eq!(x.label("d"), Some("say \"hi\""));
        assert_eq!(x.label("e"), Some("{}\\"));
        assert_eq!(x.value, 3.0);
        assert_eq!(x.timestamp_ms, Some(1_700_000_000_000));
        assert_eq!(e.types.get("x_total"), Some(&MetricType::Counter));
        assert_eq!(e.help.get("x_total").map(String::as_str), Some("A \\ help\nline"));
        assert!(e.samples[2].value.is_nan());
        assert_eq!(e.samples[3].value, f64::INFINITY);
        assert_eq!(e.samples[4].value, f64::NEG_INFINITY);
        assert_eq!(e.samples[5].value, 0.0015);
        assert_eq!(e.samples[6].name, "ns:rule:rate5m");
        assert_eq!(e.samples[7].value, 2.0);
    }

    #[test]
    fn errors_name_the_line_and_the_problem() {
        let cases = [
            ("ok 1\nbad{a=\"x\" 1\n", 2, "expected `,` or `}`"),
            ("m{a=\"x} 1\n", 1, "unterminated"),
            ("m{a=\"\\q\"} 1\n", 1, "unknown escape"),
            ("m 1 2 3\n", 1, "unexpected text"),
            ("m abc\n", 1, "not a number"),
            ("m\n", 1, "has no value"),
            ("9m 1\n", 1, "expected a name"),
            ("m{a=\"1\",a=\"2\"} 1\n", 1, "twice"),
            ("# TYPE m weird\n", 1, "unknown metric type"),
        ];
        for (text, line, needle) in cases {
            let e = parse(text).expect_err(text);
            assert_eq!(e.line, line, "{text}");
            assert!(e.reason.contains(needle), "{text}: {}", e.reason);
        }
    }

    #[test]
    fn reads_real_exporter_output() {
        // node_exporter / Go client style output, as another exporter on the same port
        // or a federated Prometheus would give.
        let text = r#"# HELP go_gc_duration_seconds A summary of the pause duration of garbage collection cycles.
# TYPE go_gc_duration_seconds summary
go_gc_duration_seconds{quantile="0"} 2.7e-05
go_gc_duration_seconds{quantile="1"} 0.000443
go_gc_duration_seconds_sum 0.0123
go_gc_duration_seconds_count 42
# HELP node_filesystem_avail_bytes Filesystem space available.
# TYPE node_filesystem_avail_bytes gauge
node_filesystem_avail_bytes{device="/dev/sda1",fstype="ext4",mountpoint="/"} 1.23456789e+10
"#;
        let e = parse(text).expect("valid");
        assert_eq!(e.samples.len(), 5);
        assert_eq!(e.types.get("go_gc_duration_seconds"), Some(&MetricType::Summary));
        assert_eq!(e.samples[4].label("mountpoint"), Some("/"));
    }

    #[test]
    fn reads_one_pod_out_of_an_exposition() {
        let text = "# TYPE t histogram\n\
            t_bucket{pod=\"a\",le=\"0.5\"} 1\nt_bucket{pod=\"a\",le=\"+Inf\"} 3\nt_sum{pod=\"a\"} 2.5\nt_count{pod=\"a\"} 3\n\
            t_bucket{pod=\"b\",le=\"0.5\"} 7\nt_bucket{pod=\"b\",le=\"+Inf\"} 9\nt_sum{pod=\"b\"} 4\nt_count{pod=\"b\"} 9\n";
        let exp = parse(text).expect("valid");
        let a = histogram(&exp, "t", &[("pod", "a")]).expect("a");
        assert_eq!(a.buckets, vec![(0.5, 1.0), (f64::INFINITY, 3.0)]);
        assert_eq!((a.sum, a.count), (2.5, 3.0));
        let both = histogram(&exp, "t", &[]).expect("sum of both");
        assert_eq!(both.count, 12.0);
        assert_eq!(histogram(&exp, "nope", &[]), Err(HistogramError::Missing));
        let no_inf = parse("t_bucket{le=\"1\"} 1\n").expect("valid");
        assert!(matches!(
            histogram(&no_inf, "t", &[]),
            Err(HistogramError::Malformed(_))
        ));
    }
}
