//! PromQL for the metrics contract, built by pure functions. The reference study's
//! query is kept verbatim: it must keep working against our workload's metrics.

/// The reference study's query: mean seconds per inference over the last 2 minutes.
pub const REFERENCE_STUDY_MEAN: &str =
    "avg(sum(rate(inference_time_seconds_sum[2m])) / sum(rate(inference_time_seconds_count[2m])))";

/// Escapes a label value for a PromQL string literal.
pub fn escape_value(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Escapes regex metacharacters (RE2) in a literal.
pub fn escape_regex(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A label selector: exact matchers and, optionally, a label that must be one of a set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selector {
    /// `label="value"` matchers.
    pub equal: Vec<(String, String)>,
    /// `label=~"a|b|c"`: the label and its allowed values.
    pub one_of: Option<(String, Vec<String>)>,
}

impl Selector {
    /// `{a="x",b=~"p|q"}` (empty braces when empty).
    pub fn render(&self) -> String {
        let mut parts: Vec<String> = self
            .equal
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape_value(v)))
            .collect();
        if let Some((k, vals)) = &self.one_of {
            let alt: Vec<String> = vals.iter().map(|v| escape_regex(v)).collect();
            parts.push(format!("{k}=~\"{}\"", escape_value(&alt.join("|"))));
        }
        format!("{{{}}}", parts.join(","))
    }
}

/// How results are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grouping {
    /// One series for the whole cell.
    Cell,
    /// One series per pod.
    Pod,
}

fn by(g: Grouping, extra: &str) -> String {
    match (g, extra) {
        (Grouping::Cell, "") => String::new(),
        (Grouping::Cell, e) => format!(" by ({e})"),
        (Grouping::Pod, "") => " by (pod)".into(),
        (Grouping::Pod, e) => format!(" by (pod, {e})"),
    }
}

/// Mean seconds per inference over `window` (e.g. "30s"): Σrate(sum) / Σrate(count).
pub fn mean(sel: &Selector, window: &str, g: Grouping) -> String {
    let s = sel.render();
    format!(
        "sum{b}(rate(inference_time_seconds_sum{s}[{window}])) / sum{b}(rate(inference_time_seconds_count{s}[{window}]))",
        b = by(g, "")
    )
}

/// The q-quantile over `window` from the summed buckets.
pub fn quantile(q: f64, sel: &Selector, window: &str, g: Grouping) -> String {
    format!(
        "histogram_quantile({q}, sum{b}(rate(inference_time_seconds_bucket{s}[{window}])))",
        b = by(g, "le"),
        s = sel.render()
    )
}

/// Inferences per second over `window`.
pub fn throughput(sel: &Selector, window: &str, g: Grouping) -> String {
    format!(
        "sum{}(rate(inference_time_seconds_count{}[{window}]))",
        by(g, ""),
        sel.render()
    )
}

/// Failed or dropped inferences over `window`.
pub fn errors(sel: &Selector, window: &str, g: Grouping) -> String {
    format!(
        "sum{}(increase(inference_errors_total{}[{window}]))",
        by(g, ""),
        sel.render()
    )
}

/// The raw cumulative series of one metric (instant query), for exact deltas.
pub fn raw(metric: &str, sel: &Selector) -> String {
    format!("{metric}{}", sel.render())
}

/// The raw series of several metrics and the scrape time of one, in **one** query: what a
/// single evaluation sees, and Prometheus's head isolation lets one query see a scrape
/// whole or not at all. (Separate queries, even at one evaluation time, can straddle a
/// scrape being ingested, whose samples carry its start time.) The scrape times come back
/// as series named `time_name` (`timestamp` drops the metric name; `label_replace` sets
/// it). `or` matches on every label but the name unless told otherwise, which would drop
/// each time series beside its count's: `on(__name__)` matches on the name alone, which
/// no left-hand series shares (promql/engine.go, `VectorOr` and `signatureFunc`).
pub fn raw_with_time(metrics: &[&str], timed: &str, time_name: &str, sel: &Selector) -> String {
    let names: Vec<String> = metrics.iter().map(|m| escape_regex(m)).collect();
    let inner = sel.render();
    let inner = &inner[1..inner.len() - 1];
    let sep = if inner.is_empty() { "" } else { "," };
    format!(
        "{{__name__=~\"{}\"{sep}{inner}}} or on(__name__) label_replace(timestamp({timed}{}), \"__name__\", \"{}\", \"\", \"\")",
        escape_value(&names.join("|")),
        sel.render(),
        escape_value(time_name)
    )
}

/// When each series of a metric was last scraped (seconds since the epoch).
pub fn sample_time(metric: &str, sel: &Selector) -> String {
    format!("timestamp({metric}{})", sel.render())
}

/// `host:port` of a metrics URL: what Prometheus puts in the `instance` label.
pub fn instance_of(url: &str) -> String {
    url.split("://")
        .nth(1)
        .unwrap_or(url)
        .split('/')
        .next()
        .unwrap_or_default()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel() -> Selector {
        Selector {
            equal: vec![("strategy".into(), "mps".into())],
            one_of: Some(("pod".into(), vec!["pod-0".into(), "pod-1".into()])),
        }
    }

    #[test]
    fn builds_the_queries() {
        assert_eq!(sel().render(), r#"{strategy="mps",pod=~"pod-0|pod-1"}"#);
        assert_eq!(
            mean(&sel(), "30s", Grouping::Cell),
            r#"sum(rate(inference_time_seconds_sum{strategy="mps",pod=~"pod-0|pod-1"}[30s])) / sum(rate(inference_time_seconds_count{strategy="mps",pod=~"pod-0|pod-1"}[30s]))"#
        );
        assert_eq!(
            quantile(0.99, &sel(), "1m", Grouping::Pod),
            r#"histogram_quantile(0.99, sum by (pod, le)(rate(inference_time_seconds_bucket{strategy="mps",pod=~"pod-0|pod-1"}[1m])))"#
        );
        assert_eq!(
            throughput(&Selector::default(), "5s", Grouping::Pod),
            "sum by (pod)(rate(inference_time_seconds_count{}[5s]))"
        );
        assert_eq!(
            errors(&Selector::default(), "5s", Grouping::Cell),
            "sum(increase(inference_errors_total{}[5s]))"
        );
        assert_eq!(sample_time("up", &Selector::default()), "timestamp(up{})");
        assert_eq!(
            raw_with_time(&["m_bucket", "m_count", "a.b"], "m_count", "m_count_scraped", &sel()),
            r#"{__name__=~"m_bucket|m_count|a\\.b",strategy="mps",pod=~"pod-0|pod-1"} or on(__name__) label_replace(timestamp(m_count{strategy="mps",pod=~"pod-0|pod-1"}), "__name__", "m_count_scraped", "", "")"#
        );
        assert_eq!(
            raw_with_time(&["x"], "x", "t", &Selector::default()),
            r#"{__name__=~"x"} or on(__name__) label_replace(timestamp(x{}), "__name__", "t", "", "")"#
        );
    }

    #[test]
    fn escapes_values_and_regexes() {
        let s = Selector {
            equal: vec![("pod".into(), "a\"b\\c".into())],
            one_of: Some(("instance".into(), vec!["127.0.0.1:9400".into(), "x|y".into()])),
        };
        assert_eq!(s.render(), r#"{pod="a\"b\\c",instance=~"127\\.0\\.0\\.1:9400|x\\|y"}"#);
    }
}
