//! The Prometheus path: the HTTP API [`client`] (typed answers, retries), the PromQL
//! builders ([`query`], pure), the metrics [`source`] that reads raw series at their
//! scrape times, and a private [`server`] for `--prometheus spawn`.

pub mod client;
pub mod query;
pub mod server;
pub mod source;

pub use client::{PromClient, RangeSeries, TargetHealth, VectorSample};
pub use query::instance_of;
pub use server::PrometheusServer;
pub use source::{PrometheusSource, Series, snapshots_from_series};

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::time::Instant;

    #[test]
    fn encodes_queries() {
        assert_eq!(
            client::query_string(&[("query", "sum(rate(x{a=\"b\"}[5m]))"), ("time", "1.5")]),
            "query=sum%28rate%28x%7Ba%3D%22b%22%7D%5B5m%5D%29%29&time=1.5"
        );
        assert_eq!(instance_of("http://127.0.0.1:9400/metrics"), "127.0.0.1:9400");
    }

    #[test]
    fn api_answers_become_data_or_clear_errors() {
        let ok = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"pod":"p"},"value":[1700000000.5,"NaN"]},{"metric":{},"value":[1700000000.5,"0.25"]}]}}"#;
        let v = client::parse_vector(200, ok).expect("vector");
        assert_eq!(v.len(), 2);
        assert!(v[0].value.is_nan());
        assert_eq!(v[0].metric.get("pod").map(String::as_str), Some("p"));
        assert_eq!((v[1].time, v[1].value), (1700000000.5, 0.25));
        let bad =
            r#"{"status":"error","errorType":"bad_data","error":"invalid parameter \"query\": 1:5: parse error"}"#;
        assert_eq!(
            client::parse_vector(400, bad).err().as_deref(),
            Some("HTTP 400: bad_data: invalid parameter \"query\": 1:5: parse error")
        );
        assert!(
            client::parse_vector(502, "<html>bad gateway</html>")
                .err()
                .unwrap_or_default()
                .contains("not a Prometheus API answer")
        );
        let scalar = r#"{"status":"success","data":{"resultType":"scalar","result":[1700000000,"3"]}}"#;
        assert_eq!(client::parse_vector(200, scalar).expect("scalar")[0].value, 3.0);
        let matrix = r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert_eq!(
            client::parse_vector(200, matrix).err().as_deref(),
            Some("expected an instant vector, got a matrix")
        );
        assert!(client::parse_matrix(200, matrix).expect("matrix").is_empty());
        let garbled = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"x"]}]}}"#;
        assert!(
            client::parse_vector(200, garbled)
                .err()
                .unwrap_or_default()
                .contains("not a number")
        );
        let targets = r#"{"status":"success","data":{"activeTargets":[{"scrapeUrl":"http://a/metrics","health":"up","lastError":""}],"droppedTargets":[]}}"#;
        assert_eq!(client::parse_targets(200, targets).expect("targets")[0].health, "up");
    }

    #[test]
    fn snapshots_group_by_instance_and_date_by_scrape_time() {
        let s = |inst: &str, le: Option<&str>, v: f64| VectorSample {
            metric: [("instance".to_string(), inst.to_string())]
                .into_iter()
                .chain(le.map(|l| ("le".to_string(), l.to_string())))
                .collect(),
            time: 100.0,
            value: v,
        };
        let now = Instant::now();
        let mut info = s("a:1", None, 1.0);
        info.metric.insert("load_seed".into(), "42".into());
        let mut closed = s("b:2", None, 1.0);
        closed.metric.insert("load_seed".into(), String::new());
        let series = Series {
            buckets: &[
                s("a:1", Some("0.1"), 3.0),
                s("a:1", Some("+Inf"), 4.0),
                s("b:2", Some("+Inf"), 9.0),
                s("b:2", Some("0.1"), 1.0),
            ],
            sums: &[s("a:1", None, 0.2), s("b:2", None, 1.5)],
            counts: &[s("a:1", None, 4.0), s("b:2", None, 9.0)],
            times: &[s("a:1", None, 98.0)],
            errors: &[s("a:1", None, 1.0), s("a:1", None, 2.0)],
            info: &[info, closed],
            backlog: &[s("a:1", None, 12.0)],
        };
        let snaps = snapshots_from_series(series, 100.0, now);
        let a = snaps["a:1"].as_ref().expect("a:1");
        assert_eq!(a.latency.buckets, vec![(0.1, 3.0), (f64::INFINITY, 4.0)]);
        assert_eq!((a.latency.sum, a.latency.count, a.errors), (0.2, 4.0, 3.0));
        assert_eq!(now - a.at, Duration::from_secs(2), "dated by the scrape, 2 s ago");
        assert_eq!(a.load_seed, Some(42));
        assert_eq!(a.backlog, Some(12.0));
        // b:2 has no scrape time: an error, not a snapshot dated by the query.
        let b = snaps["b:2"].as_ref().expect_err("b:2 has no scrape time");
        assert!(b.contains("no scrape time"), "{b}");
        let mut with_time = series;
        let times = [s("a:1", None, 98.0), s("b:2", None, 99.0)];
        with_time.times = &times;
        let snaps = snapshots_from_series(with_time, 100.0, now);
        let b = snaps["b:2"].as_ref().expect("b:2 with its scrape time");
        assert_eq!(b.latency.buckets[0], (0.1, 1.0));
        assert_eq!(b.load_seed, None);
        assert_eq!(b.backlog, None, "b:2 reports no backlog");
    }

    #[test]
    fn one_query_splits_by_metric_name() {
        let s = |name: &str, v: f64| VectorSample {
            metric: [("__name__".to_string(), name.to_string())].into_iter().collect(),
            time: 100.0,
            value: v,
        };
        let names = ["b", "s", "c", "t", "e", "i"].map(String::from);
        let all = vec![
            s("c", 4.0),
            s("b", 1.0),
            s("other", 9.0),
            s("b", 3.0),
            s("t", 98.0),
            s("i", 1.0),
        ];
        let [b, sums, c, t, e, i] = source::split_by_name(all, &names);
        assert_eq!(b.iter().map(|x| x.value).collect::<Vec<_>>(), vec![1.0, 3.0]);
        assert_eq!(
            (sums.len(), c[0].value, t[0].value, e.len(), i.len()),
            (0, 4.0, 98.0, 0, 1)
        );
    }

    #[test]
    fn config_scrapes_every_second_from_a_file() {
        let odd = server::server_config(std::path::Path::new("/r/a\"b\\c/targets.json"));
        assert!(odd.contains(r#"files: ["/r/a\"b\\c/targets.json"]"#), "{odd}");
        let c = server::server_config(std::path::Path::new("/r/prometheus/targets.json"));
        assert!(c.contains("scrape_interval: 1s") && c.contains("files: [\"/r/prometheus/targets.json\"]"));
    }
}
