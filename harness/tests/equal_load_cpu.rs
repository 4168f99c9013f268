//! `gpushare-bench equal-load` on the CPU with the `tiny` model and real processes: the
//! closed sweep sets the base, each level's sweep is offered its share of it, the report
//! sets them side by side, `verify` rechecks every sweep, a resume measures only what is
//! missing, and the flags the mode refuses.

use std::path::Path;
use std::process::{Command, Output};

use gpushare_bench::config::values::Load;
use gpushare_bench::results::equal_load::EqualLoadRecord;
use gpushare_bench::results::store::{read_cells, read_run};

mod common;

const BENCH: &str = env!("CARGO_BIN_EXE_gpushare-bench");

fn bench(args: &[&str], out: &Path) -> Output {
    Command::new(BENCH)
        .args(args)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run")
}

fn equal_load(out: &Path, run_id: &str, extra: &[&str]) -> Output {
    let workload = common::workload_beside(BENCH);
    let mut args = vec![
        "equal-load",
        "--device",
        "cpu",
        "--model",
        "tiny",
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
        run_id,
        "--workload-bin",
        workload.to_str().expect("utf-8 path"),
    ];
    args.extend_from_slice(extra);
    bench(&args, out)
}

fn record(dir: &Path) -> EqualLoadRecord {
    serde_json::from_str(&std::fs::read_to_string(dir.join("equal-load.json")).expect("record")).expect("json")
}

/// Keeps the rows of `file` (JSON lines) that `keep` accepts.
fn filter_lines(file: &Path, keep: impl Fn(&serde_json::Value) -> bool) {
    let text = std::fs::read_to_string(file).expect("read");
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| keep(&serde_json::from_str(l).expect("json line")))
        .collect();
    std::fs::write(file, kept.join("\n") + "\n").expect("write");
}

#[test]
fn levels_are_shares_of_one_pod_alone_and_the_report_sets_them_side_by_side() {
    let out = tempfile::tempdir().expect("tempdir");
    let workload = common::workload_beside(BENCH);
    let workload = workload.to_str().expect("utf-8 path");

    // 0.1% of one pod's capacity on two cores is far below one request per pod and
    // window: refused by its level once the base is measured, the closed sweep kept.
    let o = equal_load(out.path(), "eq", &["--levels", "0.1%", "--slo", "p99=5s"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("bad --levels `0.1%`: at the measured base of"),
        "{stderr}"
    );
    let dir = out.path().join("eq");
    let base = record(&dir).base.expect("the base is kept");
    assert!(read_run(&dir.join("closed/run.json")).expect("closed").is_complete());
    assert!(!dir.join("load-0.1pct").exists(), "nothing measured at a refused level");

    // A resume with other levels measures them at the recorded base; the binary is
    // given again (the record names none).
    let o = bench(
        &[
            "equal-load",
            "--resume",
            "eq",
            "--levels",
            "50%",
            "--quiet",
            "--workload-bin",
            workload,
        ],
        out.path(),
    );
    let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stderr.contains("CPU RUN"), "the CPU label must be loud: {stderr}");
    let rec = record(&dir);
    assert_eq!(rec.base.as_ref(), Some(&base));
    assert!(rec.finished_at.is_some() && rec.options.workload_bin.is_none());

    // The base is the closed sweep's one pod alone (time-slicing on the CPU).
    let closed = read_cells(&dir.join("closed/cells.jsonl")).expect("closed cells");
    let alone = closed
        .iter()
        .find(|c| c.is_aggregate() && c.pods == 1)
        .and_then(|c| c.throughput_per_s)
        .expect("1 pod measured");
    assert_eq!(base.per_s, alone);

    // The level's sweep is offered half of it in all, split over each cell's pods.
    let level = read_run(&dir.join("load-50pct/run.json")).expect("level run");
    assert_eq!(level.plan.load, Load::Total(base.per_s * 0.5));
    let cells = read_cells(&dir.join("load-50pct/cells.jsonl")).expect("level cells");
    for pods in [1, 2] {
        let agg = cells
            .iter()
            .find(|c| c.is_aggregate() && c.pods == pods)
            .expect("aggregate");
        let offered = agg.offered_per_s.expect("offered");
        assert!(
            (offered - base.per_s * 0.5).abs() < 1e-6 * offered,
            "{pods} pods: {offered}"
        );
    }

    // The report: the run's page with a column per sweep, each sweep's own report,
    // the CSV with every sweep's rows and the GPU's (here the CPU's) name.
    let report = dir.join("report");
    let page = std::fs::read_to_string(report.join("index.html")).expect("index");
    assert!(page.contains("closed loop") && page.contains("50%: "), "columns");
    assert!(page.contains("p99 latency at equal load") && page.contains("SLO attainment at equal load"));
    assert!(page.contains("CPU RUN"), "the label");
    assert!(report.join("closed/index.html").is_file() && report.join("load-50pct/index.html").is_file());
    let csv = std::fs::read_to_string(report.join("equal-load.csv")).expect("csv");
    let header = csv.lines().next().expect("header");
    assert!(
        header.starts_with("sweep,level_percent,offered_total_per_s,") && header.ends_with(",gpu_name"),
        "{header}"
    );
    assert_eq!(
        csv.lines().filter(|l| l.starts_with("load-50pct,50,")).count(),
        2,
        "{csv}"
    );
    assert_eq!(csv.lines().filter(|l| l.starts_with("closed,,,")).count(), 2, "{csv}");
    assert!(csv.lines().skip(1).all(|l| l.contains(",CPU: ")), "{csv}");

    // verify rechecks every sweep's rows from their windows.
    let v = Command::new(BENCH).arg("verify").arg(&dir).output().expect("verify");
    assert_eq!(v.status.code(), Some(0), "{}", String::from_utf8_lossy(&v.stdout));
    assert!(String::from_utf8_lossy(&v.stdout).contains("of 4 cells recomputed"));

    // A sweep's own commands refuse the run's directory with a pointer to its sweeps.
    let e = Command::new(BENCH)
        .args(["export", "--format", "csv"])
        .arg(&dir)
        .output()
        .expect("export");
    assert_eq!(e.status.code(), Some(2), "{}", String::from_utf8_lossy(&e.stderr));
    assert!(String::from_utf8_lossy(&e.stderr).contains("an equal-load run"));

    // A finished run is not resumed.
    let again = bench(&["equal-load", "--resume", "eq"], out.path());
    assert_ne!(again.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&again.stderr).contains("complete"));

    // A level sweep interrupted after its first cell: the resume measures the rest of
    // it, and nothing else.
    let level_dir = dir.join("load-50pct");
    filter_lines(&level_dir.join("cells.jsonl"), |r| r["pods"] == 1);
    filter_lines(&level_dir.join("windows.jsonl"), |r| r["pods"] == 1);
    let mut run_json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(level_dir.join("run.json")).expect("run.json")).expect("json");
    run_json["state"] = "interrupted".into();
    std::fs::write(level_dir.join("run.json"), run_json.to_string()).expect("write");
    let mut unfinished = rec.clone();
    unfinished.finished_at = None;
    std::fs::write(
        dir.join("equal-load.json"),
        serde_json::to_string_pretty(&unfinished).expect("json"),
    )
    .expect("write");
    let closed_before = std::fs::read(dir.join("closed/cells.jsonl")).expect("closed");
    let one_pod = std::fs::read_to_string(level_dir.join("cells.jsonl")).expect("level");
    // The record names no binary: it is given again.
    let resumed = bench(
        &[
            "equal-load",
            "--resume",
            "eq",
            "--quiet",
            "--no-report",
            "--workload-bin",
            workload,
        ],
        out.path(),
    );
    assert_eq!(
        resumed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    assert_eq!(
        std::fs::read(dir.join("closed/cells.jsonl")).expect("closed"),
        closed_before
    );
    let after = std::fs::read_to_string(level_dir.join("cells.jsonl")).expect("level again");
    assert!(after.starts_with(&one_pod), "the measured cell is kept as it was");
    let cells = read_cells(&level_dir.join("cells.jsonl")).expect("cells");
    assert!(
        cells.iter().any(|c| c.is_aggregate() && c.pods == 2),
        "the rest measured"
    );
    assert!(read_run(&level_dir.join("run.json")).expect("run").is_complete());
    assert!(record(&dir).finished_at.is_some());
}

#[test]
fn the_mode_refuses_what_it_cannot_measure() {
    let out = tempfile::tempdir().expect("tempdir");
    for (extra, says) in [
        (&["--load", "total:100"][..], "sets each sweep's load itself"),
        (&["--pods", "2,3"][..], "include 1"),
        (&["--strategies", "mps"][..], "include exclusive"),
        (&["--levels", "50"][..], "a percentage"),
        (&["--levels", "0%"][..], "at least 0.1%"),
        (&["--levels", ","][..], "at least one level"),
    ] {
        let mut args = vec!["equal-load", "--device", "cpu", "--model", "tiny"];
        args.extend_from_slice(extra);
        let o = bench(&args, out.path());
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.contains(says), "{extra:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    }
    assert!(
        std::fs::read_dir(out.path()).expect("out").next().is_none(),
        "nothing is made for a refused run"
    );
    let o = bench(&["equal-load", "--resume", "nothing-here"], out.path());
    assert_ne!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not an equal-load run"));
    let o = bench(&["equal-load", "--resume", "x", "--pods", "1"], out.path());
    assert!(String::from_utf8_lossy(&o.stderr).contains("keeps the options it recorded"));
}
