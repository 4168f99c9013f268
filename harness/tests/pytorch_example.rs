//! The PyTorch example server (`workload/examples/pytorch/server.py`) swept by the
//! harness in CI, where there is no torch and no GPU: `tests/fixtures/fake_torch/`
//! stands in for torch and transformers with a 4 ms forward pass, and the metrics come
//! from the real prometheus_client (installed by `.ci/deps.sh` into `.deps/py`). What
//! this proves is the example's serving, readiness by `/healthz`, and that the
//! harness reads prometheus_client's exposition (`_created` series, float counts, its
//! label order); what the GPU does is the GPU run's (`results/`).

use std::path::{Path, PathBuf};
use std::process::Command;

use gpushare_bench::domain::CellStatus;
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
    let server = repo().join("workload/examples/pytorch/server.py");
    let cmd = format!(
        "python3 {} --port {{port}} --device cpu --precision bf16 --warmup 5",
        server.display()
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
            "--run-id",
            "torch",
            "--workload-cmd",
            &cmd,
        ])
        .arg("--out")
        .arg(out.path())
        .env("PYTHONPATH", python_path())
        .env("FAKE_TORCH_MS", "4")
        .output()
        .expect("run");
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
