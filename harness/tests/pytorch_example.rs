//! The PyTorch example server (`workload/examples/pytorch/server.py`) swept by the
//! harness in CI, where there is no torch and no GPU: `tests/fixtures/fake_torch/`
//! stands in for torch and transformers with a 4 ms forward pass, and the metrics come
//! from the real prometheus_client (installed by `.ci/deps.sh` into `.deps/py`). What
//! this proves is the example's serving, readiness by `/healthz`, and that the
//! harness reads prometheus_client's exposition (`_created` series, float counts, its
//! label order); what the GPU does is the GPU run's (`results/`).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gpushare_bench::config::values::Load;
use gpushare_bench::domain::{CellStatus, Source};
use gpushare_bench::results::store::read_cells;

const BENCH: &str = env!("CARGO_BIN_EXE_gpushare-bench");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn python_path() -> String {
    let deps = repo().join(".deps/py");
    assert!(
        deps.join("prometheus_client").is_dir(),
        "{} has no prometheus_client: run `make deps`",
        deps.display()
    );
    let fake = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_torch");
    format!("{}:{}", deps.display(), fake.display())
}

#[test]
fn the_pytorch_example_is_swept_with_its_own_readiness_and_histogram() {
    let out = tempfile::tempdir().expect("tempdir");
    let o = run(
        "sweep",
        out.path(),
        "torch",
        "loop",
        &["--pods", "1,2", "--max-cell", "3s"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let cells = read_cells(&out.path().join("torch/cells.jsonl")).expect("cells");
    for pods in [1, 2] {
        let cell = cells
            .iter()
            .find(|c| c.pods == pods && c.is_aggregate())
            .expect("cell row");
        assert_eq!(cell.status, CellStatus::Ok, "{}", cell.note);
        // Each pod runs 4 ms inferences back to back (plus Python's own time per
        // inference): at most 250/s per pod, and not far below it.
        let tput = cell.throughput_per_s.expect("throughput");
        let per_pod = tput / f64::from(pods);
        assert!((150.0..=250.0).contains(&per_pod), "{pods} pods: {tput}/s");
        let mean = cell.mean_s.expect("mean");
        assert!((0.004..0.0065).contains(&mean), "{pods} pods: mean {mean}");
        // The quantiles come from the 737 schema-5 buckets: p50 within a bucket (2.2%)
        // of the forward pass's 4 ms and above it.
        let p50 = cell.p50_s.expect("p50");
        assert!((0.0039..0.0065).contains(&p50), "{pods} pods: p50 {p50}");
        assert_eq!(cell.errors, Some(0), "{pods} pods");
    }
    let log = std::fs::read_to_string(out.path().join("torch/logs/time-slicing-2p-pod-1.log")).expect("pod-1's log");
    assert!(
        log.contains("pod-1: yolos-small bf16 on cpu, torch 0.0-fake, mode loop"),
        "{log}"
    );
}

/// `gpushare-bench COMMAND` (sweep or capacity) on the CPU, time-slicing, 1 s warm-up
/// and windows, with the example server in `mode` (loop or requests) as every pod.
fn run(command: &str, out: &Path, run_id: &str, mode: &str, extra: &[&str]) -> Output {
    let server = repo().join("workload/examples/pytorch/server.py");
    let cmd = format!(
        "python3 {} --port {{port}} --device cpu --precision bf16 --warmup 5 --mode {mode}",
        server.display()
    );
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
            "--strategies",
            "time-slicing",
            "--workload-cmd",
            &cmd,
        ])
        // `resume:ID` resumes run ID with the same command line (no --run-id then).
        .args(match run_id.strip_prefix("resume:") {
            Some(id) => ["--resume", id],
            None => ["--run-id", run_id],
        })
        .arg("--out")
        .arg(out)
        .args(extra)
        .env("PYTHONPATH", python_path())
        .env("FAKE_TORCH_MS", "4")
        .output()
        .expect("run")
}

/// A sweep of the example waiting for requests, 3 s cells.
fn sweep_requests(out: &Path, run_id: &str, extra: &[&str]) -> Output {
    run(
        "sweep",
        out,
        run_id,
        "requests",
        &[&["--max-cell", "3s"], extra].concat(),
    )
}

#[test]
fn the_harness_sends_the_requests_to_a_server_that_waits_for_them() {
    let out = tempfile::tempdir().expect("tempdir");
    let body = out.path().join("image.json");
    std::fs::write(&body, br#"{"image": "random"}"#).expect("body");
    let body = body.display().to_string();
    // Closed loop: one request at a time per pod, each a 4 ms inference.
    let o = sweep_requests(
        out.path(),
        "closed",
        &[
            "--pods",
            "1,2",
            "--request",
            "http://127.0.0.1:{port}/infer",
            "--body",
            &body,
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let run = std::fs::read_to_string(out.path().join("closed/run.json")).expect("run.json");
    assert!(
        run.contains("\"request\"") && run.contains("\"body_bytes\": 19"),
        "{run}"
    );
    let cells = read_cells(&out.path().join("closed/cells.jsonl")).expect("cells");
    for pods in [1, 2] {
        let cell = cells.iter().find(|c| c.pods == pods && c.is_aggregate()).expect("cell");
        assert_eq!(cell.status, CellStatus::Ok, "{}", cell.note);
        assert_eq!(cell.source, Source::Client, "the rows say who timed the requests");
        let per_pod = cell.throughput_per_s.expect("throughput") / f64::from(pods);
        assert!((100.0..=250.0).contains(&per_pod), "{pods} pods: {per_pod}/s per pod");
        // The harness's time: the 4 ms inference plus HTTP and Python on both sides.
        let mean = cell.mean_s.expect("mean");
        assert!((0.004..0.010).contains(&mean), "{pods} pods: mean {mean}");
        assert_eq!(cell.errors, Some(0));
    }

    // Poisson arrivals at 40/s per pod, far below what a pod serves: the throughput is
    // the offered rate, and every pod row records its arrivals' seed.
    let o = sweep_requests(
        out.path(),
        "open",
        &[
            "--pods",
            "2",
            "--load",
            "poisson:40",
            "--request",
            "http://127.0.0.1:{port}/infer",
            "--body",
            &body,
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let cells = read_cells(&out.path().join("open/cells.jsonl")).expect("cells");
    let cell = cells.iter().find(|c| c.is_aggregate()).expect("cell");
    assert_eq!(cell.status, CellStatus::Ok, "{}", cell.note);
    let tput = cell.throughput_per_s.expect("throughput");
    // 80/s offered; over ≥ 3 s the count is Poisson, sd √240/3 ≈ 5/s.
    assert!((55.0..105.0).contains(&tput), "{tput}");
    let seeds: Vec<_> = cells
        .iter()
        .filter(|c| !c.is_aggregate())
        .map(|c| c.load_seed)
        .collect();
    assert_eq!(seeds.len(), 2);
    assert!(seeds.iter().all(Option::is_some) && seeds[0] != seeds[1], "{seeds:?}");

    // Requests the server refuses (404): counted as errors, in the cell's row too, and
    // no latency is made up. Nothing completed: the cell failed, saying why, and the
    // sweep exits 1 (no cell measured).
    let o = sweep_requests(
        out.path(),
        "refused",
        &["--pods", "1", "--request", "http://127.0.0.1:{port}/nowhere"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
    let cells = read_cells(&out.path().join("refused/cells.jsonl")).expect("cells");
    let cell = cells.iter().find(|c| c.is_aggregate()).expect("cell");
    assert_eq!(cell.status, CellStatus::Failed, "{}", cell.note);
    assert!(cell.mean_s.is_none() && cell.throughput_per_s.is_none(), "{cell:?}");
    assert!(cell.errors.is_some_and(|e| e > 50), "{:?}", cell.errors);
    let pod = cells.iter().find(|c| !c.is_aggregate()).expect("pod row");
    assert!(pod.errors.is_some_and(|e| e > 50), "{:?} {}", pod.errors, pod.note);
    assert!(
        pod.note.starts_with("completed no request while measured; ") && pod.note.contains("the last: HTTP 404"),
        "{}",
        pod.note
    );
    assert!(cell.note.contains(" failed: completed no request"), "{}", cell.note);
}

#[test]
fn capacity_searches_a_server_of_ones_own_through_the_harnesss_requests() {
    let out = tempfile::tempdir().expect("tempdir");
    // 20 requests/s per pod of 4 ms each, p90 within 100 ms: both counts fit, shown at
    // 95% by the fifty or more requests each pod completes (each pod is its own
    // process, sleeping in its stand-in forward pass). The rate leaves each Python
    // server room to keep up while this binary's other tests load the two cores.
    let flags = [
        "--max-cell",
        "4s",
        "--max-pods",
        "2",
        "--load",
        "poisson:20",
        "--slo",
        "p90=100ms",
        "--request",
        "http://127.0.0.1:{port}/infer",
    ];
    let o = run("capacity", out.path(), "cap", "requests", &flags);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("Time-slicing: 2 pods fit"), "{stdout}");
    let cells = read_cells(&out.path().join("cap/cells.jsonl")).expect("cells");
    assert!(cells.iter().all(|c| c.source == Source::Client && c.model == "custom"));
    assert_eq!(cells.iter().filter(|c| c.is_aggregate()).count(), 2);

    // As if it had been interrupted before its 2-pod cell: the command it was started
    // with, plus --resume (and without --run-id), resumes it.
    let dir = out.path().join("cap");
    let run_json = std::fs::read_to_string(dir.join("run.json")).expect("run.json");
    std::fs::write(
        dir.join("run.json"),
        run_json.replace("\"state\": \"complete\"", "\"state\": \"interrupted\""),
    )
    .expect("run.json");
    let lines = std::fs::read_to_string(dir.join("cells.jsonl")).expect("cells");
    let kept: String = lines
        .lines()
        .filter(|l| !l.contains("\"pods\":2,"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(dir.join("cells.jsonl"), kept).expect("cells");
    let o = run("capacity", out.path(), "resume:cap", "requests", &flags);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("Time-slicing: 2 pods fit"), "{stdout}");
    let cells = read_cells(&dir.join("cells.jsonl")).expect("cells");
    assert_eq!(
        cells.iter().filter(|c| c.is_aggregate()).count(),
        2,
        "the 2-pod cell again"
    );
}

/// The example waiting for requests is an isolation victim: the harness sends it the
/// Poisson load of `--victim-rate` (and only it: the aggressor is gpushare-workload,
/// in its own closed loop) and times every answer.
#[test]
fn isolation_sends_the_victim_rate_to_the_example_beside_a_gpushare_workload_aggressor() {
    let out = tempfile::tempdir().expect("tempdir");
    let server = repo().join("workload/examples/pytorch/server.py");
    let cmd = format!(
        "python3 {} --port {{port}} --device cpu --precision bf16 --warmup 5 --mode requests",
        server.display()
    );
    let o = Command::new(BENCH)
        .args([
            "isolation",
            "--device",
            "cpu",
            "--quiet",
            "--strategies",
            "time-slicing",
            "--scenarios",
            "noisy-neighbour",
            "--aggressors",
            "1",
            "--victim-rate",
            "40",
            "--warmup",
            "1s",
            "--event-after",
            "2s",
            "--observe",
            "6s",
            "--run-id",
            "iso",
            "--workload-cmd",
            &cmd,
            "--request",
            "http://127.0.0.1:{port}/infer",
        ])
        .arg("--workload-bin")
        .arg(common::workload_beside(BENCH))
        .arg("--out")
        .arg(out.path())
        .env("PYTHONPATH", python_path())
        .env("FAKE_TORCH_MS", "4")
        .output()
        .expect("isolation");
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let dir = out.path().join("iso");
    let (run, records) = common::isolation_run(&dir);
    assert_eq!(records.len(), 2, "{records:?}");
    for r in &records {
        assert_eq!(r.victim_status, CellStatus::Ok, "{r:?}");
        // 40 requests/s for the 7 s after the warm-up: about 280 (Poisson).
        let n = r.victim_inferences.unwrap_or(0);
        assert!((150..450).contains(&n), "{n}: {r:?}");
        // Each answer is a 4 ms stand-in inference plus HTTP.
        let mean = r.victim_mean_s.unwrap_or(0.0);
        assert!((0.0039..0.05).contains(&mean), "{mean}: {r:?}");
    }
    assert_eq!(run.plan.load, Load::PerPod(40.0), "the victim's requests");
    assert_eq!(run.plan.source, Source::Client);
    // The aggressor ran gpushare-workload, not the example.
    let aggressor = std::fs::read_to_string(dir.join("logs/time-slicing-noisy-1-aggressor-1.log")).expect("log");
    assert!(!aggressor.contains("yolos-small bf16"), "{aggressor}");
    let victim = std::fs::read_to_string(dir.join("logs/time-slicing-noisy-1-victim.log")).expect("log");
    assert!(victim.contains("mode requests"), "{victim}");
}

#[test]
fn the_example_teaches_its_endpoints_and_modes_without_torch() {
    // Its --help works where torch is not installed (the import waits for the model).
    let server = repo().join("workload/examples/pytorch/server.py");
    let o = Command::new("python3")
        .arg(&server)
        .arg("--help")
        .env("PYTHONPATH", repo().join(".deps/py"))
        .output()
        .expect("help");
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(
        help.contains("--mode {loop,requests}") && help.contains("POST /infer"),
        "{help}"
    );
}

#[test]
fn the_llm_example_streams_every_token_the_harness_asks_for() {
    // The decoder's steps are the stand-in's 3 ms each: a prompt's prefill and each
    // later token one step, served one request at a time.
    let out = tempfile::tempdir().expect("tempdir");
    let server = repo().join("workload/examples/pytorch/llm_server.py");
    let cmd = format!(
        "python3 {} --port {{port}} --device cpu --shape tiny --warmup 1",
        server.display()
    );
    for (api, path) in [("completions", "completions"), ("chat", "chat/completions")] {
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
                "1",
                "--workload-cmd",
                &cmd,
                "--request",
                &format!("http://127.0.0.1:{{port}}/v1/{path}"),
                "--stream",
                api,
                "--prompt-tokens",
                "12",
                "--output-tokens",
                "5",
                "--run-id",
                api,
            ])
            .arg("--out")
            .arg(out.path())
            .env("PYTHONPATH", python_path())
            .env("FAKE_TORCH_MS", "3")
            .output()
            .expect("sweep");
        assert_eq!(
            o.status.code(),
            Some(0),
            "{api}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let dir = out.path().join(api);
        let cells = read_cells(&dir.join("cells.jsonl")).expect("cells");
        let pod = cells.iter().find(|c| c.is_pod()).expect("a pod row");
        assert_eq!(pod.status, CellStatus::Ok, "{api}: {}", pod.note);
        let n = pod.inferences.expect("requests");
        assert!(n >= 10, "{api}: {n}");
        assert_eq!(pod.output_tokens, Some(5 * n), "{api}");
        assert_eq!(pod.errors, Some(0), "{api}");
        let ttft = pod.ttft_p50_s.expect("ttft");
        assert!((0.0029..0.05).contains(&ttft), "{api}: ttft {ttft}");
        let tpot = pod.tpot_mean_s.expect("tpot");
        assert!((0.0029..0.05).contains(&tpot), "{api}: tpot {tpot}");
        let requests = gpushare_bench::results::requests::read_requests(&dir).expect("requests");
        assert_eq!(requests.len() as u64, n, "{api}");
        for r in &requests {
            // The server counted the harness's prompt: ids for completions, words for chat.
            assert_eq!(
                (r.request.prompt_tokens, r.request.output_tokens),
                (Some(12), 5),
                "{api}: {r:?}"
            );
        }
        let log = std::fs::read_to_string(dir.join("logs/time-slicing-1p-pod-0.log")).expect("pod-0's log");
        assert!(log.contains("Llama-style decoder tiny"), "{log}");
    }
    // Its --help works without torch.
    let o = Command::new("python3")
        .arg(&server)
        .arg("--help")
        .output()
        .expect("help");
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("POST /v1/completions"));
}
