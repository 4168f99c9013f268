//! Streamed answers (`--stream`) end to end against `tests/fixtures/stream_server.py`,
//! an OpenAI-compatible server with known token timings (first token 30 ms after it
//! takes a request up, then one every 5 ms, one request at a time): every token metric
//! of the rows against the script, every request in `requests.jsonl`, `verify` equal
//! and naming a tampered request, the report's token tables, and a capacity search
//! decided by objectives on tokens; and gpushare-workload's own decoder (`llm --shape
//! tiny`, the CPU reference) swept the same way.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use gpushare_bench::results::requests::{REQUESTS_FILE, read_requests};
use gpushare_bench::results::store::read_cells;

const BENCH: &str = env!("CARGO_BIN_EXE_gpushare-bench");
const TTFT_S: f64 = 0.030;
const ITL_S: f64 = 0.005;

fn server() -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/stream_server.py");
    format!("python3 {} {{port}} 30 5", script.display())
}

fn run(command: &str, out: &Path, run_id: &str, api: &str, extra: &[&str]) -> Output {
    let path = if api == "chat" {
        "chat/completions"
    } else {
        "completions"
    };
    Command::new(BENCH)
        .args([
            command,
            "--device",
            "cpu",
            "--quiet",
            "--warmup",
            "1s",
            "--window",
            "1s",
            "--max-cell",
            if command == "capacity" { "8s" } else { "4s" },
            "--strategies",
            "time-slicing",
            "--workload-cmd",
            &server(),
            "--ready-path",
            "/health",
            "--request",
            &format!("http://127.0.0.1:{{port}}/v1/{path}"),
            "--stream",
            api,
            "--run-id",
            run_id,
        ])
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .expect("run")
}

fn ms(v: Option<f64>) -> f64 {
    v.expect("a value") * 1e3
}

/// `gpushare-bench COMMAND --device cpu ARGS --out OUT`, which must be refused with one
/// line that says `says` (exit code 2).
fn assert_refused(command: &str, out: &Path, args: &[&str], says: &str) {
    let o = Command::new(BENCH)
        .args([command, "--device", "cpu"])
        .args(args)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run");
    assert_said_no(&o, args, says);
}

/// `o` is a refusal (exit code 2) whose error says `says`.
fn assert_said_no(o: &Output, args: &[&str], says: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.contains(says), "{args:?}: {err}");
}

#[test]
fn every_token_is_timed_kept_and_verified() {
    let out = tempfile::tempdir().expect("tempdir");
    let o = run(
        "sweep",
        out.path(),
        "tokens",
        "completions",
        &[
            "--pods",
            "1,2",
            "--prompt-tokens",
            "16-32",
            "--output-tokens",
            "10",
            "--slo",
            "ttft:p90=2s,itl:p90=1s",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let dir = out.path().join("tokens");
    let cells = read_cells(&dir.join("cells.jsonl")).expect("cells");
    let requests = read_requests(&dir).expect("requests.jsonl");
    for row in cells.iter().filter(|c| c.is_pod()) {
        let what = format!("{} × {}", row.pod, row.pods);
        let n = row.inferences.expect("requests");
        assert!(n >= 5, "{what}: {n}");
        // Exactly the tokens asked for, and one gap fewer per request.
        assert_eq!(row.output_tokens, Some(10 * n), "{what}");
        assert_eq!(row.itl_count, Some(9 * n), "{what}");
        assert_eq!(row.tpot_count, Some(n), "{what}");
        assert_eq!(row.errors, Some(0), "{what}");
        // The script's timings, from below exactly (the server sleeps them) and from
        // above with room for a busy host; quantiles are ±2.2% (their buckets).
        let ttft = ms(row.ttft_p50_s);
        assert!(
            (TTFT_S * 1e3 * 0.978..TTFT_S * 1e3 + 60.0).contains(&ttft),
            "{what}: ttft p50 {ttft} ms"
        );
        let itl = ms(row.itl_p50_s);
        assert!(
            (ITL_S * 1e3 * 0.9..ITL_S * 1e3 + 20.0).contains(&itl),
            "{what}: itl p50 {itl} ms"
        );
        let tpot = ms(row.tpot_mean_s);
        assert!(
            (ITL_S * 1e3 * 0.97..ITL_S * 1e3 + 20.0).contains(&tpot),
            "{what}: tpot {tpot} ms"
        );
        // End to end is the first token and nine gaps.
        let e2e = ms(row.mean_s);
        assert!(e2e >= (TTFT_S + 9.0 * ITL_S) * 1e3 * 0.99, "{what}: e2e {e2e} ms");
        // The tokens' rate is the requests' times ten.
        let (tokens, tput) = (
            row.output_tokens_per_s.expect("rate"),
            row.throughput_per_s.expect("rate"),
        );
        assert!(
            (tokens / tput - 10.0).abs() < 1e-9,
            "{what}: {tokens} tokens/s at {tput} requests/s"
        );
        // Every objective met by every request: goodput is the throughput.
        assert_eq!(row.slo_met, Some(true), "{what}: {}", row.note);
        assert_eq!(
            (row.ttft_slo_attainment, row.itl_slo_attainment),
            (Some(1.0), Some(1.0))
        );
        assert!((row.goodput_per_s.expect("goodput") - tput).abs() < 1e-9, "{what}");
        // Its requests, each as asked and as the server counted them.
        let mine: Vec<_> = requests
            .iter()
            .filter(|r| r.pods == row.pods && r.pod == row.pod)
            .map(|r| &r.request)
            .collect();
        assert_eq!(mine.len() as u64, n, "{what}: one line per request measured");
        for r in mine {
            assert_eq!(
                (r.error.as_deref(), r.output_tokens, r.max_tokens),
                (None, 10, Some(10))
            );
            assert!(r.tokens_from_usage);
            let asked = r.prompt_len.expect("prompt length");
            assert!((16..=32).contains(&asked), "{asked}");
            assert_eq!(
                r.prompt_tokens,
                Some(asked),
                "the server read the prompt the harness wrote"
            );
            assert_eq!(r.itl_s.len(), 9);
            assert!(r.ttft_s.expect("ttft") >= TTFT_S, "{r:?}");
        }
    }
    let two = cells
        .iter()
        .find(|c| c.pods == 2 && c.is_aggregate())
        .expect("2-pod cell");
    let pods_tokens: u64 = cells
        .iter()
        .filter(|c| c.pods == 2 && c.is_pod())
        .filter_map(|c| c.output_tokens)
        .sum();
    assert_eq!(two.output_tokens, Some(pods_tokens), "the GPU's tokens are its pods'");

    // verify recomputes every token column from requests.jsonl ...
    let verify = || Command::new(BENCH).arg("verify").arg(&dir).output().expect("verify");
    let v = verify();
    let said = String::from_utf8_lossy(&v.stdout).to_string() + &String::from_utf8_lossy(&v.stderr);
    assert_eq!(v.status.code(), Some(0), "{said}");
    assert!(said.contains("all equal"), "{said}");
    // ... and names a request changed after the fact.
    let path = dir.join(REQUESTS_FILE);
    let text = std::fs::read_to_string(&path).expect("requests");
    let first = text.lines().next().expect("a line");
    let mut line: serde_json::Value = serde_json::from_str(first).expect("json");
    line["request"]["ttft_s"] = serde_json::json!(9.0);
    std::fs::write(&path, text.replacen(first, &line.to_string(), 1)).expect("write");
    let v = verify();
    let said = String::from_utf8_lossy(&v.stdout).to_string() + &String::from_utf8_lossy(&v.stderr);
    assert_ne!(v.status.code(), Some(0), "{said}");
    assert!(said.contains("ttft_"), "{said}");
    std::fs::write(&path, text).expect("restore");

    // The report shows the token tables.
    let report = out.path().join("report");
    let r = Command::new(BENCH)
        .arg("report")
        .arg(&dir)
        .arg("--out")
        .arg(&report)
        .output()
        .expect("report");
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let page = std::fs::read_to_string(report.join("tokens/index.html")).expect("page");
    for title in [
        "Time to first token, p99",
        "Inter-token latency, p99",
        "Output tokens per second",
        "SLO attainment, time to first token",
    ] {
        assert!(page.contains(title), "{title}");
    }
}

#[test]
fn capacity_is_decided_by_the_objectives_on_tokens() {
    let out = tempfile::tempdir().expect("tempdir");
    // Chat, at 8 requests/s per pod of 75 ms each: both counts fit a p90 TTFT of 1 s and
    // a p90 gap of 50 ms (29 requests and their gaps, all within, show it at 95%; the
    // cell runs on to 8 s until they have).
    let capacity = |id: &str, slo: &str| {
        run(
            "capacity",
            out.path(),
            id,
            "chat",
            &[
                "--max-pods",
                "2",
                "--load",
                "poisson:8",
                "--prompt-tokens",
                "8",
                "--output-tokens",
                "10",
                "--slo",
                slo,
            ],
        )
    };
    let fits = capacity("fits", "ttft:p90=1s,itl:p90=50ms");
    let stdout = String::from_utf8_lossy(&fits.stdout);
    assert_eq!(
        fits.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&fits.stderr)
    );
    assert!(stdout.contains("Time-slicing: 2 pods fit; searched to 2"), "{stdout}");
    let csv = std::fs::read_to_string(out.path().join("fits/report/capacity.csv")).expect("capacity.csv");
    let header = csv.lines().next().expect("header");
    assert!(
        header.contains("ttft_p99_s") && header.contains("output_tokens_per_s"),
        "{header}"
    );

    // Gaps of 5 ms cannot meet 2 ms at p90: the first count misses, named by its metric.
    let misses = capacity("misses", "ttft:p90=1s,itl:p90=2ms");
    let stdout = String::from_utf8_lossy(&misses.stdout);
    assert_eq!(
        misses.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&misses.stderr)
    );
    assert!(stdout.contains("Time-slicing: 0 pods fit"), "{stdout}");
    assert!(
        stdout.contains("itl gaps of") && stdout.contains("requests within 2ms"),
        "{stdout}"
    );
}

#[test]
fn streamed_settings_without_a_stream_are_refused_with_one_line() {
    let out = tempfile::tempdir().expect("tempdir");
    let cmd = server();
    for (args, says) in [
        (
            vec!["--workload-cmd", &cmd, "--slo", "ttft:p99=1s"],
            "bad --slo `ttft:p99=1s`: an objective on tokens needs streamed answers",
        ),
        (
            vec!["--workload-cmd", &cmd, "--stream", "chat"],
            "bad --stream `chat`: streams the answers of --request",
        ),
        (
            vec!["--output-tokens", "64"],
            "bad --output-tokens `64`: a setting of streamed requests",
        ),
        (
            vec!["--prompt-tokens", "0"],
            "bad --prompt-tokens `0`: 0 tokens: give 1 to",
        ),
        (
            vec![
                "--workload-cmd",
                &cmd,
                "--request",
                "http://127.0.0.1:{port}/v1/completions",
                "--stream",
                "completions",
                "--slo",
                "ttft:p99=1s,ttft:p90=2s",
            ],
            "bad --slo `ttft:p90=2s`: one objective on ttft",
        ),
        (
            vec![
                "--workload-cmd",
                &cmd,
                "--request",
                "http://127.0.0.1:{port}/v1/completions",
                "--stream",
                "completions",
                "--output-tokens",
                "1",
                "--slo",
                "itl:p99=1s",
            ],
            "bad --slo `itl:p99=1s`: answers of one token have no gap between tokens",
        ),
    ] {
        assert_refused("sweep", out.path(), &args, says);
    }
}

#[test]
fn the_servers_own_histograms_are_read_beside_the_clients_view() {
    let out = tempfile::tempdir().expect("tempdir");
    let server_flags = [
        "--pods",
        "1",
        "--output-tokens",
        "8",
        "--server-ttft-metric",
        "vllm:time_to_first_token_seconds",
        "--server-itl-metric",
        "vllm:inter_token_latency_seconds",
    ];
    let o = run("sweep", out.path(), "server", "completions", &server_flags);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let dir = out.path().join("server");
    let cells = read_cells(&dir.join("cells.jsonl")).expect("cells");
    for row in &cells {
        // One pod alone, closed loop: the server's first token 30 ms after it takes a
        // request up, in vLLM's bucket from 20 to 40 ms; its 5 ms gaps in the first
        // bucket, up to 10 ms.
        let p50 = row.server_ttft_p50_s.expect("server ttft");
        assert!((0.02..=0.04).contains(&p50), "{}: {p50}", row.pod);
        assert!(row.server_itl_p50_s.expect("server itl") <= 0.01, "{row:?}");
        // The server counts the requests whose first token it sent between the two
        // reads; the client those that ended: they differ by the one in flight at most.
        let (server, client) = (row.server_ttft_count.expect("count"), row.inferences.expect("requests"));
        assert!(server.abs_diff(client) <= 1, "{}: {server} vs {client}", row.pod);
        let gaps = row.server_itl_count.expect("gaps");
        assert!(
            gaps.abs_diff(server * 7) <= 7,
            "{}: {gaps} gaps of {server} requests",
            row.pod
        );
    }
    let v = Command::new(BENCH).arg("verify").arg(&dir).output().expect("verify");
    assert_eq!(v.status.code(), Some(0), "{}", String::from_utf8_lossy(&v.stderr));
    let reports = common::report(BENCH, &dir, &out.path().join("reports"));
    let md = std::fs::read_to_string(reports.join("summary.md")).expect("summary.md");
    assert!(
        md.contains("## Time to first token, p50, the server's own histogram"),
        "{md}"
    );

    for (flags, says) in [
        (
            vec!["--server-ttft-metric", "vllm:time_to_first_token_seconds"],
            "--server-ttft-metric",
        ),
        (
            vec!["--stream", "completions", "--server-itl-metric", "vllm itl"],
            "a Prometheus metric name",
        ),
    ] {
        let cmd = server();
        let args = [
            &[
                "--workload-cmd",
                &cmd,
                "--request",
                "http://127.0.0.1:{port}/v1/completions",
            ][..],
            &flags,
        ]
        .concat();
        assert_refused("sweep", out.path(), &args, says);
    }
}

#[test]
fn lengths_from_a_trace_file_are_sent_and_kept() {
    let out = tempfile::tempdir().expect("tempdir");
    let trace = out.path().join("trace.txt");
    std::fs::write(&trace, "# prompt output\n24 4\n40,2\n").expect("trace");
    let trace = trace.display().to_string();
    let o = run(
        "sweep",
        out.path(),
        "trace",
        "completions",
        &["--pods", "1", "--lengths", &trace],
    );
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let dir = out.path().join("trace");
    let mut seen = std::collections::BTreeSet::new();
    for r in read_requests(&dir).expect("requests") {
        let pair = (r.request.prompt_tokens.expect("usage"), r.request.output_tokens);
        assert!([(24, 4), (40, 2)].contains(&pair), "{pair:?}");
        seen.insert(pair);
    }
    assert_eq!(seen.len(), 2, "both lines are drawn: {seen:?}");
    let run_json = std::fs::read_to_string(dir.join("run.json")).expect("run.json");
    assert!(
        run_json.contains("\"lengths\": [") && run_json.contains(&trace),
        "{run_json}"
    );
    let v = Command::new(BENCH).arg("verify").arg(&dir).output().expect("verify");
    assert_eq!(v.status.code(), Some(0), "{}", String::from_utf8_lossy(&v.stderr));

    let bad = out.path().join("bad.txt");
    std::fs::write(&bad, "24 4\n40\n").expect("bad");
    for (flags, says) in [
        (
            vec!["--lengths".to_string(), bad.display().to_string()],
            "line 2: `40`: give two token counts".to_string(),
        ),
        (
            vec!["--lengths".into(), trace.clone(), "--prompt-tokens".into(), "8".into()],
            "drop --prompt-tokens and --output-tokens".into(),
        ),
    ] {
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let o = run("sweep", out.path(), "refused", "completions", &flags);
        assert_said_no(&o, &flags, &says);
    }
}

#[test]
fn gpushare_workloads_decoder_is_swept_through_its_streaming_api() {
    let out = tempfile::tempdir().expect("tempdir");
    let workload = common::workload_beside(BENCH);
    let cmd = format!(
        "{} llm --shape tiny --device cpu --listen 127.0.0.1:{{port}}",
        workload.display()
    );
    let o = Command::new(BENCH)
        .args([
            "sweep",
            "--device",
            "cpu",
            "--quiet",
            "--warmup",
            "1s",
            "--window",
            "1s",
            "--max-cell",
            "3s",
            "--strategies",
            "time-slicing",
            "--pods",
            "1,2",
            "--workload-cmd",
            &cmd,
            "--request",
            "http://127.0.0.1:{port}/v1/chat/completions",
            "--stream",
            "chat",
            "--prompt-tokens",
            "24",
            "--output-tokens",
            "8",
            "--load",
            "poisson:20",
            "--slo",
            "ttft:p90=1s,itl:p90=1s",
            "--run-id",
            "decoder",
        ])
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("sweep");
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let dir = out.path().join("decoder");
    let cells = read_cells(&dir.join("cells.jsonl")).expect("cells");
    for row in cells.iter().filter(|c| c.is_pod()) {
        let n = row.inferences.expect("requests");
        assert!(n >= 20, "{}: {n}", row.pod);
        assert_eq!(
            (row.output_tokens, row.errors),
            (Some(8 * n), Some(0)),
            "{}: {}",
            row.pod,
            row.note
        );
        assert_eq!(row.slo_met, Some(true), "{}: {}", row.pod, row.note);
    }
    for r in read_requests(&dir).expect("requests") {
        // The server counted the harness's 24 words and made the 8 tokens asked.
        assert_eq!(
            (r.request.prompt_tokens, r.request.output_tokens),
            (Some(24), 8),
            "{r:?}"
        );
        assert_eq!(
            r.request.itl_s.len(),
            8,
            "a role-only first event, then 8 tokens: {r:?}"
        );
    }
    let v = Command::new(BENCH).arg("verify").arg(&dir).output().expect("verify");
    assert_eq!(v.status.code(), Some(0), "{}", String::from_utf8_lossy(&v.stderr));
}

#[test]
fn isolation_refuses_what_it_cannot_judge_on_tokens() {
    let out = tempfile::tempdir().expect("tempdir");
    let cmd = server();
    for (args, says) in [
        (
            vec!["--slo", "ttft:p99=1s"],
            "bad --slo `ttft:p99=1s`: isolation judges the victim's request latency",
        ),
        (
            vec!["--stream", "chat"],
            "bad --stream `chat`: isolation does not stream answers yet",
        ),
    ] {
        let args = [&["--workload-cmd", &cmd][..], &args].concat();
        assert_refused("isolation", out.path(), &args, says);
    }
}
