//! The whole local pipeline on the CPU, with real processes: a sweep end to end, a pod
//! killed mid-cell, SIGINT to the harness (no process left behind, finished cells
//! kept), and --resume finishing the run with nothing lost or doubled.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpushare_bench::domain::{CellStatus, Strategy};
use gpushare_bench::results::record::CellRecord;
use gpushare_bench::results::store::{read_cells, read_run};

mod common;
use common::{alive, wait_for};

/// The workload pods among a harness's children (its process supervisor is one too).
fn children(pid: u32) -> Vec<u32> {
    common::children(pid)
        .into_iter()
        .filter(|c| c.name.starts_with("gpushare-worklo"))
        .map(|c| c.pid)
        .collect()
}

const BENCH: &str = env!("CARGO_BIN_EXE_gpushare-bench");

fn sweep(out: &Path, extra: &[&str]) -> Command {
    common::cpu_sweep(BENCH, out, extra)
}

/// The exit code of a harness that must exit on its own (not by a signal).
fn wait_exit(child: &mut Child, limit: Duration) -> i32 {
    common::wait_exit(child, limit).unwrap_or(-1)
}

fn aggregate(cells: &[CellRecord], pods: u32) -> &CellRecord {
    cells
        .iter()
        .find(|c| c.pods == pods && c.is_aggregate())
        .expect("aggregate row")
}

#[test]
fn cpu_sweep_end_to_end_writes_every_column() {
    let out = tempfile::tempdir().expect("tempdir");
    let st = sweep(
        out.path(),
        &[
            "--pods",
            "1,3",
            "--max-cell",
            "4s",
            "--run-id",
            "e2e",
            "--strategies",
            "time-slicing,mig",
        ],
    )
    .stderr(Stdio::piped())
    .output()
    .expect("run");
    let err = String::from_utf8_lossy(&st.stderr);
    assert!(st.status.success(), "{err}");
    assert!(err.contains("CPU RUN"), "the CPU label must be loud: {err}");
    let dir = out.path().join("e2e");
    // The sweep renders its report and says where, after the results.
    let stdout = String::from_utf8_lossy(&st.stdout);
    let last: Vec<&str> = stdout.lines().rev().take(2).collect();
    assert_eq!(
        last,
        [
            format!("report: {}", dir.join("report/index.html").display()),
            format!("results: {}", dir.display())
        ],
        "{stdout}"
    );
    assert!(dir.join("report/index.html").is_file());
    let csv = std::fs::read_to_string(dir.join("cells.csv")).expect("cells.csv");
    let header = csv.lines().next().unwrap_or_default();
    for col in [
        "run_id",
        "strategy",
        "pods",
        "pod",
        "status",
        "inferences",
        "throughput_per_s",
        "mean_s",
        "p50_s",
        "p90_s",
        "p99_s",
        "errors",
        "fairness",
        "gpu_util_pct",
        "gpu_mem_bytes",
        "power_w",
        "energy_j_per_inference",
        "source",
        "device",
        "note",
    ] {
        assert!(header.split(',').any(|h| h == col), "cells.csv lacks {col}: {header}");
    }
    let cells = read_cells(&dir.join("cells.jsonl")).expect("jsonl");
    // 1 + 3 pod rows + 2 aggregates for time-slicing, 2 unavailable aggregates for MIG.
    assert_eq!(cells.len(), 8, "{cells:#?}");
    for pods in [1, 3] {
        let a = aggregate(&cells, pods);
        assert_eq!(a.status, CellStatus::Ok, "{a:?}");
        assert_eq!(a.device.name(), "cpu");
        let (mean, p50, p99) = (a.mean_s.expect("mean"), a.p50_s.expect("p50"), a.p99_s.expect("p99"));
        assert!(mean > 0.0 && mean < 0.5, "tiny on a CPU: {mean} s");
        assert!(p50 <= p99);
        let per_pod: Vec<&CellRecord> = cells
            .iter()
            .filter(|c| c.pods == pods && !c.is_aggregate() && c.strategy == Strategy::TimeSlicing)
            .collect();
        assert_eq!(per_pod.len(), pods as usize);
        let sum: u64 = per_pod.iter().map(|c| c.inferences.expect("inferences")).sum();
        assert_eq!(a.inferences, Some(sum), "the aggregate is the sum of its pods");
        // One time base: the cell's inferences over its measured time, which is what the
        // pods' own rates add up to when they ran the whole cell (within scrape timing).
        let agg_tput = a.throughput_per_s.expect("tput");
        assert!((agg_tput - sum as f64 / a.duration_s.expect("duration")).abs() < 1e-6);
        let tput: f64 = per_pod.iter().map(|c| c.throughput_per_s.expect("tput")).sum();
        assert!((agg_tput - tput).abs() / tput < 0.05, "{agg_tput} vs {tput}");
        assert!(a.fairness.is_some_and(|f| f > 0.5 && f <= 1.0));
        // No GPU: telemetry is empty, not zero.
        assert_eq!((a.gpu_util_pct, a.power_w), (None, None));
    }
    assert_eq!(aggregate(&cells, 1).speedup_vs_1pod, Some(1.0));
    assert!(aggregate(&cells, 3).speedup_vs_1pod.is_some());
    let mig: Vec<&CellRecord> = cells.iter().filter(|c| c.strategy == Strategy::Mig).collect();
    assert!(
        mig.iter()
            .all(|c| c.status == CellStatus::Unavailable && c.note.contains("needs a GPU"))
    );
    let run = read_run(&dir.join("run.json")).expect("run.json");
    assert_eq!(run.state, "complete");
    assert!(run.label.as_deref().is_some_and(|l| l.contains("CPU")));
    assert_eq!(run.plan.model, "tiny");
}

#[test]
fn open_loop_pods_draw_their_own_arrivals_and_the_rows_say_which() {
    // `--load total:60`: 60/s per cell, split over its pods. Each launch gets its own
    // seed (pods of a cell, and the same pod in the next cell), which the pod reports
    // and its row records.
    let out = tempfile::tempdir().expect("tempdir");
    let st = sweep(
        out.path(),
        &[
            "--pods",
            "1,2",
            "--max-cell",
            "3s",
            "--run-id",
            "open",
            "--load",
            "total:60",
            "--slo",
            "p50=1s,p99=2s",
        ],
    )
    .stderr(Stdio::piped())
    .output()
    .expect("run");
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let cells = read_cells(&out.path().join("open/cells.jsonl")).expect("jsonl");
    let seeds: Vec<u64> = cells
        .iter()
        .filter(|c| !c.is_aggregate())
        .map(|c| c.load_seed.unwrap_or_else(|| panic!("no load seed: {c:?}")))
        .collect();
    assert_eq!(seeds.len(), 3, "{cells:#?}");
    let mut unique = seeds.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), 3, "every launch its own arrivals: {seeds:?}");
    assert!(cells.iter().filter(|c| c.is_aggregate()).all(|c| c.load_seed.is_none()));
    for c in &cells {
        let (per_pod, cell) = if c.pods == 1 { (60.0, 60.0) } else { (30.0, 60.0) };
        let want = if c.is_aggregate() { cell } else { per_pod };
        assert_eq!(c.offered_per_s, Some(want), "{c:?}");
        // Judged against the SLOs unless a pod fell short of its load.
        if !c.note.contains("keep up") {
            let (p50, p99) = (c.slo_p50_attainment.expect("p50"), c.slo_p99_attainment.expect("p99"));
            assert_eq!(c.slo_met, Some(p50 >= 0.5 && p99 >= 0.99), "{c:?}");
            assert!(
                c.slo_attainment_bound.is_some_and(|b| (0.0..=1.0).contains(&b)),
                "{c:?}"
            );
            let goodput = c.goodput_per_s.expect("goodput");
            assert!(goodput <= c.throughput_per_s.expect("rate") + 1e-9, "{c:?}");
        }
        // Keeping up is judged on the backlog the workload reports (verify below
        // recomputes the judgement from the windows).
        if !c.is_aggregate() {
            assert!(c.backlog_growth.is_some(), "the workload reports its queue: {c:?}");
        }
    }
    let run = read_run(&out.path().join("open/run.json")).expect("run.json");
    assert_eq!(run.plan.load.to_string(), "total:60");
    verify_finds_every_tampered_number(&out.path().join("open"));
}

/// `verify` recomputes the run's rows from its windows, and fails on a copy whose row,
/// or whose windows, were changed after the run, naming what differs.
fn verify_finds_every_tampered_number(dir: &Path) {
    let verify = |d: &Path| Command::new(BENCH).arg("verify").arg(d).output().expect("verify");
    let o = verify(dir);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        stdout.contains("numbers of 2 cells recomputed from their windows, all equal"),
        "{stdout}"
    );
    let copy = tempfile::tempdir().expect("tempdir");
    let tampered = |file: &str, edit: &dyn Fn(&mut serde_json::Value)| {
        let to = copy.path().join(file.replace('.', "-"));
        std::fs::create_dir_all(&to).expect("mkdir");
        for f in ["run.json", "cells.jsonl", "windows.jsonl", "bucket-layouts.json"] {
            std::fs::copy(dir.join(f), to.join(f)).expect("copy");
        }
        let text = std::fs::read_to_string(to.join(file)).expect("read");
        let mut lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("json line"))
            .collect();
        edit(&mut lines[0]);
        let out: String = lines.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(to.join(file), out).expect("write");
        verify(&to)
    };
    // The first pod's p99, 1% off.
    let o = tampered("cells.jsonl", &|row| {
        let p99 = row["p99_s"].as_f64().expect("p99");
        row["p99_s"] = serde_json::json!(p99 * 1.01);
    });
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("× 1 (repeat 1), pod-0: p99_s is "), "{stdout}");
    // One request more in the first window of the first cell.
    let o = tampered("windows.jsonl", &|cell| {
        let w = &mut cell["series"][0]["windows"][0];
        w["count"] = serde_json::json!(w["count"].as_f64().expect("count") + 1.0);
        let c = &mut w["counts"][0];
        *c = serde_json::json!(c.as_f64().expect("requests") + 1.0);
    });
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("× 1 (repeat 1), pod-0: inferences is ") && stdout.contains("from windows.jsonl"),
        "{stdout}"
    );
    // Without windows there is nothing to verify from: a clear refusal.
    let bare = copy.path().join("bare");
    std::fs::create_dir_all(&bare).expect("mkdir");
    for f in ["run.json", "cells.jsonl"] {
        std::fs::copy(dir.join(f), bare.join(f)).expect("copy");
    }
    let o = verify(&bare);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("windows.jsonl: missing: nothing to verify from"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn a_pod_killed_mid_cell_is_recorded_and_the_sweep_goes_on() {
    let out = tempfile::tempdir().expect("tempdir");
    let mut child = sweep(out.path(), &["--pods", "3,1", "--max-cell", "8s", "--run-id", "kill"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let harness = child.id();
    wait_for("3 running pods", Duration::from_secs(60), || {
        children(harness).len() == 3
    });
    // Let the cell's warm-up pass, then kill one pod the hard way.
    std::thread::sleep(Duration::from_secs(3));
    let victim = children(harness)[0];
    // SAFETY: kill(2) on a process of this test's own tree.
    unsafe { libc::kill(victim as i32, libc::SIGKILL) };
    assert_eq!(
        wait_exit(&mut child, Duration::from_secs(90)),
        3,
        "the sweep finishes, partial: one cell failed"
    );
    let cells = read_cells(&out.path().join("kill/cells.jsonl")).expect("jsonl");
    let three: Vec<&CellRecord> = cells.iter().filter(|c| c.pods == 3 && !c.is_aggregate()).collect();
    let failed: Vec<&&CellRecord> = three.iter().filter(|c| c.status == CellStatus::Failed).collect();
    assert_eq!(failed.len(), 1, "{three:#?}");
    assert!(
        failed[0].note.contains("signal 9") || failed[0].note.contains("SIGKILL"),
        "{:?}",
        failed[0].note
    );
    assert_eq!(three.iter().filter(|c| c.status == CellStatus::Ok).count(), 2);
    assert_eq!(aggregate(&cells, 3).status, CellStatus::Failed);
    assert_eq!(aggregate(&cells, 1).status, CellStatus::Ok, "the next cell still ran");
}

#[test]
fn sigint_stops_everything_keeps_finished_cells_and_resume_completes() {
    let out = tempfile::tempdir().expect("tempdir");
    let mut child = sweep(out.path(), &["--pods", "1,3", "--max-cell", "3s", "--run-id", "int"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let harness = child.id();
    let cells_file = out.path().join("int/cells.jsonl");
    wait_for("the 1-pod cell on disk and 3 pods up", Duration::from_secs(90), || {
        read_cells(&cells_file).map(|c| c.len() == 2).unwrap_or(false) && children(harness).len() == 3
    });
    let pods = children(harness);
    let t = Instant::now();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(harness as i32, libc::SIGINT) };
    assert_eq!(wait_exit(&mut child, Duration::from_secs(10)), 130);
    assert!(t.elapsed() < Duration::from_secs(5), "stopping took {:?}", t.elapsed());
    for p in pods {
        assert!(!alive(p), "pod process {p} outlived the harness");
    }
    let before = read_cells(&cells_file).expect("jsonl");
    assert_eq!(before.len(), 2, "exactly the finished 1-pod cell is kept");
    assert_eq!(
        read_run(&out.path().join("int/run.json")).expect("run").state,
        "interrupted"
    );

    let st = sweep(out.path(), &["--resume", "int"]).output().expect("resume");
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let after = read_cells(&cells_file).expect("jsonl");
    assert_eq!(after.len(), 2 + 4, "the 3-pod cell is added once");
    assert_eq!(&after[..2], &before[..], "finished rows are untouched");
    assert_eq!(after.iter().filter(|c| c.is_aggregate()).count(), 2);
    assert_eq!(
        read_run(&out.path().join("int/run.json")).expect("run").state,
        "complete"
    );
    // Resuming a complete run is a no-op.
    assert!(
        sweep(out.path(), &["--resume", "int"])
            .output()
            .expect("again")
            .status
            .success()
    );
    assert_eq!(read_cells(&cells_file).expect("jsonl").len(), 6);
}

#[test]
fn bad_flags_get_one_line_and_exit_2() {
    for (args, needle) in [
        (vec!["sweep", "--pods", "1,x"], "bad --pods `x`"),
        (vec!["sweep", "--strategies", "fast"], "bad --strategies `fast`"),
        (vec!["sweep", "--config", "/nonexistent.toml"], "/nonexistent.toml"),
        (vec!["sweep", "--window", "5 parsecs"], "bad --window"),
        (vec!["sweep", "--run-id", "../up"], "bad --run-id"),
        (vec!["sweep", "--frobnicate"], "--frobnicate"),
        (vec!["sweep", "--load", "total:0"], "bad --load `total:0`"),
        (vec!["sweep", "--load", "burst:5"], "unknown load `burst`"),
        (
            vec!["sweep", "--load", "poisson:5", "--workload-arg=--load=closed"],
            "give it with --load only",
        ),
        (vec!["isolation", "--load", "poisson:5"], "a sweep option"),
        (vec!["sweep", "--slo", "p95=10ms"], "unknown percentile `p95`"),
        (vec!["sweep", "--slo", "25ms"], "name the percentile"),
        (
            vec!["isolation", "--slo", "20ms,30ms"],
            "one latency target for the victim",
        ),
    ] {
        let out = Command::new(BENCH).args(&args).output().expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn a_mistyped_command_line_keeps_claps_tip_and_valid_values() {
    for (args, first, help) in [
        (
            vec!["swep"],
            "unrecognized subcommand 'swep'",
            "tip: a similar subcommand exists: 'sweep'",
        ),
        (
            vec!["sweep", "--strategy", "mps"],
            "unexpected argument '--strategy' found",
            "tip: a similar argument exists: '--strategies'",
        ),
        (
            vec!["export", "--format", "xlsx", "runs/x"],
            "invalid value 'xlsx' for '--format <FORMAT>'",
            "[possible values: csv, pods, json, markdown, summary, capacity]",
        ),
    ] {
        let out = Command::new(BENCH).args(&args).output().expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(lines.len(), 2, "{args:?}: {err}");
        assert!(
            lines[0].starts_with(&format!("gpushare-bench: {first}")),
            "{args:?}: {err}"
        );
        assert_eq!(lines[1].trim(), help, "{args:?}: {err}");
    }
}

#[test]
fn without_a_gpu_a_strategy_is_unavailable_never_replaced_and_dry_run_refuses_as_the_run_does() {
    // This machine has no GPU (as CI): --device auto is the CPU smoke pipeline.
    let out = tempfile::tempdir().expect("tmp");
    let o = Command::new(BENCH)
        .args([
            "sweep",
            "--quiet",
            "--no-report",
            "--strategies",
            "mps",
            "--pods",
            "1",
            "--run-id",
            "mps",
        ])
        .arg("--out")
        .arg(out.path())
        .arg("--workload-bin")
        .arg(common::workload_beside(BENCH))
        .output()
        .expect("sweep");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "nothing could be measured: {err}");
    let cells = read_cells(&out.path().join("mps/cells.jsonl")).expect("cells");
    assert_eq!(cells.len(), 1, "{cells:?}");
    assert_eq!(
        (cells[0].strategy, cells[0].status),
        (Strategy::Mps, CellStatus::Unavailable)
    );
    assert!(cells[0].note.contains("MPS needs a GPU"), "{}", cells[0].note);
    // --dry-run refuses --device cuda here as the run does.
    let plan = Command::new(BENCH)
        .args(["sweep", "--dry-run", "--device", "cuda"])
        .output()
        .expect("dry run");
    let err = String::from_utf8_lossy(&plan.stderr);
    assert_eq!(plan.status.code(), Some(2), "{err}");
    assert!(err.contains("bad --device `cuda`: no usable NVIDIA GPU here"), "{err}");
    assert!(plan.stdout.is_empty());
}
