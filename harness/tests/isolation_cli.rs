//! `gpushare-bench isolation` end to end on the CPU: the scenarios through the
//! binary — the fault as a process abort there, labelled — stopped by SIGINT after two
//! trials and resumed, then the report's isolation matrix and the exports. The numbers
//! are a CPU run's: the test checks the pipeline and the outcomes, not the latencies.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{wait_exit, wait_for, workload_beside};

const BENCH: &str = env!("CARGO_BIN_EXE_gpushare-bench");

fn isolation(out: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(BENCH);
    c.args(["isolation", "--device", "cpu", "--quiet"])
        .arg("--out")
        .arg(out)
        .arg("--workload-bin")
        .arg(workload_beside(BENCH))
        .args(extra);
    c
}

fn records(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("isolation.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a record"))
        .collect()
}

fn find<'a>(r: &'a [serde_json::Value], strategy: &str, scenario: &str) -> &'a serde_json::Value {
    r.iter()
        .find(|x| x["strategy"] == strategy && x["scenario"] == scenario)
        .unwrap_or_else(|| panic!("no {strategy} {scenario} in {r:?}"))
}

#[test]
fn the_scenarios_run_through_the_binary_resume_after_sigint_and_render_a_matrix() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = tmp.path().join("results");
    let dir = out.join("iso");
    let flags = [
        "--run-id",
        "iso",
        "--strategies",
        "time-slicing,mps",
        "--aggressors",
        "1",
        "--warmup",
        "1s",
        "--event-after",
        "2s",
        "--observe",
        "6s",
    ];
    let mut child = isolation(&out, &flags).spawn().expect("spawn");
    wait_for("two trials on disk", Duration::from_secs(120), || {
        records(&dir).len() >= 2
    });
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    assert_eq!(wait_exit(&mut child, Duration::from_secs(30)), Some(130));
    let before = records(&dir);
    assert!(before.len() >= 2 && before.len() < 11, "{}", before.len());
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).expect("run.json")).expect("json");
    assert_eq!(run["state"], "interrupted");
    assert_eq!(run["isolation"]["scenarios"][0], "noisy-neighbour");
    // A sweep does not continue an isolation run.
    let wrong = common::cpu_sweep(BENCH, &out, &["--resume", "iso"])
        .output()
        .expect("sweep");
    assert_eq!(wrong.status.code(), Some(2), "{wrong:?}");
    assert!(
        String::from_utf8_lossy(&wrong.stderr)
            .contains("isolation run: continue it with `gpushare-bench isolation --resume`"),
        "{wrong:?}"
    );

    let resumed = isolation(&out, &["--resume", "iso"]).output().expect("resume");
    assert_eq!(resumed.status.code(), Some(0), "{resumed:?}");
    let all = records(&dir);
    // Per strategy: alone, noisy × 1, memory, fault, crash, and for MPS its victim
    // alone under a trial's limits; MPS unavailable on the CPU.
    assert_eq!(all.len(), 11, "{all:?}");
    assert_eq!(
        &all[..before.len()],
        &before[..],
        "the saved trials are kept as they were"
    );
    let alone = find(&all, "time-slicing", "alone");
    assert_eq!(alone["victim_status"], "ok");
    assert!(alone["victim_inferences"].as_u64().is_some_and(|n| n > 100), "{alone}");
    let noisy = find(&all, "time-slicing", "noisy-neighbour");
    assert!(noisy["p99_inflation"].as_f64().is_some_and(|x| x > 0.0), "{noisy}");
    assert!(
        noisy["slo_attainment"]
            .as_f64()
            .is_some_and(|x| (0.0..=1.0).contains(&x))
    );
    assert_eq!(
        (noisy["survivors"].as_u64(), noisy["started"].as_u64()),
        (Some(2), Some(2))
    );
    // The fault on the CPU: the aggressor aborts, labelled; the victim serves on.
    let fault = find(&all, "time-slicing", "fault");
    assert_eq!(fault["victim_status"], "ok", "{fault}");
    assert!(
        fault["aggressor_outcome"]
            .as_str()
            .is_some_and(|o| o.contains("the CPU stand-in for a GPU fault")),
        "{fault}"
    );
    assert_eq!(fault["recovery"], "not needed: the victim kept serving");
    assert_eq!(
        (fault["survivors"].as_u64(), fault["started"].as_u64()),
        (Some(1), Some(2))
    );
    let crash = find(&all, "time-slicing", "crash");
    assert!(
        crash["aggressor_outcome"]
            .as_str()
            .is_some_and(|o| o.contains("killed by signal 9")),
        "{crash}"
    );
    let memory = find(&all, "time-slicing", "memory-pressure");
    assert_eq!(
        memory["victim_status"], "ok",
        "64 MiB and 32 MiB of host memory: {memory}"
    );
    let mps = find(&all, "mps", "fault");
    assert_eq!(mps["victim_status"], "unavailable");
    assert!(mps["note"].as_str().is_some_and(|n| n.contains("needs a GPU")), "{mps}");
    // Every process the run started was stopped: its journal is empty.
    let journal = std::fs::read_to_string(dir.join("processes.json")).expect("journal");
    let parsed: serde_json::Value = serde_json::from_str(&journal).expect("json");
    assert_eq!(parsed["entries"], serde_json::json!([]), "{journal}");

    // The report: the matrix, the latency table, the event table and the chart.
    let reports = common::report(BENCH, &dir, &tmp.path().join("reports"));
    let html = std::fs::read_to_string(reports.join("index.html")).expect("html");
    for needle in [
        "Isolation matrix: the victim beside its aggressors",
        "noisy neighbour × 1 aggressor",
        "Victim latency",
        "After the event",
        "aggressor-1 killed by signal 9",
        "CPU run",
        "<th>Scenario</th>",
        "isolation-latency",
    ] {
        assert!(html.contains(needle), "{needle} missing from the report");
    }
    assert!(reports.join("isolation-latency.svg").is_file());
    assert!(reports.join("isolation.csv").is_file());
    // The exports.
    let export = |format: &str| {
        Command::new(BENCH)
            .args(["export", "--format", format])
            .arg(&dir)
            .output()
            .expect("export")
    };
    let csv = export("csv");
    assert!(csv.status.success());
    let text = String::from_utf8_lossy(&csv.stdout);
    assert!(
        text.starts_with("run_id,scenario,strategy,aggressors,victim_status"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 12);
    let json: serde_json::Value = serde_json::from_slice(&export("json").stdout).expect("json");
    assert_eq!(json["isolation"].as_array().map(Vec::len), Some(11));
    let md = String::from_utf8_lossy(&export("markdown").stdout).to_string();
    assert!(md.contains("## Isolation matrix"), "{md}");
    let summary = export("summary");
    assert_eq!(summary.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&summary.stderr).contains("an isolation run has no cells to summarise"));
}

#[test]
fn isolation_flags_are_checked_with_one_line_each() {
    let tmp = tempfile::tempdir().expect("tmp");
    for (args, want) in [
        (vec!["--pods", "3"], "bad --pods `3`: a sweep option"),
        (
            vec!["--scenarios", "noisy"],
            "bad --scenarios `noisy`: expected noisy-neighbour",
        ),
        (vec!["--aggressors", "64"], "bad --aggressors `64`: expected 1 to 63"),
        (vec!["--victim-rate", "0"], "bad --victim-rate `0`"),
        (
            vec!["--event-after", "5s"],
            "bad --event-after `5s`: expected a time after the warm-up",
        ),
        (vec!["--observe", "3s"], "bad --observe `3s`: expected more than 5 s"),
    ] {
        let o = isolation(tmp.path(), &args).output().expect("run");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
    assert_eq!(
        std::fs::read_dir(tmp.path()).expect("dir").count(),
        0,
        "nothing was created"
    );
}
