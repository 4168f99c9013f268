//! The nightly workflow's compare step, run as GitHub Actions runs it, fails the job when
//! `compare` reports a regression. GitHub runs a step with `shell: bash` as
//! `bash --noprofile --norc -eo pipefail {0}` and one without a shell as `bash -e {0}`
//! (docs: "jobs.<job_id>.steps[*].shell"), so a `| tee` hides the exit code unless the
//! step names bash.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn compare_step() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.github/workflows/nightly-perf.yml");
    let text = std::fs::read_to_string(&path).expect("nightly-perf.yml");
    let wf: Value = serde_yaml_ng::from_str(&text).expect("YAML");
    wf["jobs"]["sweep"]["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .find(|s| s["run"].as_str().is_some_and(|r| r.contains(" compare ")))
        .cloned()
        .expect("a step that runs compare")
}

/// Runs the step's script the way the runner would, with `gpushare-bench` replaced by a
/// stand-in that exits `code`; returns the step's exit code.
fn run_step(step: &Value, code: i32) -> i32 {
    let dir = tempfile::tempdir().expect("tmp");
    let bin = dir.path().join("target/release");
    std::fs::create_dir_all(&bin).expect("bin dir");
    let fake = bin.join("gpushare-bench");
    std::fs::write(
        &fake,
        format!("#!/bin/sh\necho \"exclusive × 5: mean +9.8% (noise 0.4%)\"\nexit {code}\n"),
    )
    .expect("stand-in");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    std::fs::create_dir_all(dir.path().join("runs/nightly-1")).expect("run dir");
    let script = dir.path().join("step.sh");
    std::fs::write(&script, step["run"].as_str().expect("run")).expect("script");
    let args: Vec<&str> = match step["shell"].as_str() {
        Some("bash") => vec!["--noprofile", "--norc", "-eo", "pipefail"],
        None => vec!["-e"],
        Some(other) => panic!("shell {other} is not modelled here"),
    };
    let status = Command::new("bash")
        .args(&args)
        .arg(&script)
        .current_dir(dir.path())
        .env("BASELINE", "results/baseline")
        .env("THRESHOLD", "5%")
        .env("RUN_ID", "nightly-1")
        .status()
        .expect("bash");
    assert!(
        std::fs::read_to_string(dir.path().join("runs/nightly-1/compare.txt")).is_ok_and(|t| t.contains("mean +9.8%")),
        "the step keeps compare's output"
    );
    status.code().unwrap_or(-1)
}

#[test]
fn a_regression_fails_the_nightly_compare_step() {
    let step = compare_step();
    assert_ne!(run_step(&step, 1), 0, "compare exited 1, the step must fail: {step}");
    assert_eq!(run_step(&step, 0), 0);
}

#[test]
fn the_nightly_sweeps_to_a_precision_target_against_a_committed_repeated_baseline() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.github/workflows/nightly-perf.yml");
    let wf: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&path).expect("workflow")).expect("YAML");
    let steps = wf["jobs"]["sweep"]["steps"].as_array().expect("steps");
    let sweep = steps
        .iter()
        .filter_map(|s| s["run"].as_str())
        .find(|r| r.contains("make bench-all"))
        .expect("the sweep step");
    assert!(sweep.contains("--target 1%") && sweep.contains("--budget"), "{sweep}");
    let baseline = wf["jobs"]["sweep"]["env"]["BASELINE"].as_str().expect("BASELINE");
    let default = baseline
        .split("|| '")
        .nth(1)
        .and_then(|s| s.split('\'').next())
        .expect("a default baseline");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(default);
    let data = gpushare_bench::report::RunData::load(&dir).expect("the committed baseline loads");
    assert!(data.run.plan.repeat >= 2, "{default}: a baseline without intervals");
    assert!(data.run.is_complete(), "{default}: {}", data.run.state);
}
