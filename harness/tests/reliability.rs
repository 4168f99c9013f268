//! Hostile use of the sweep on the CPU path, with real processes: SIGKILL and
//! SIGHUP of the harness leave nothing running and `--resume` completes the run once;
//! two resumes of one run cannot run together; a resume keeps the recorded backend; a
//! run where nothing could be measured exits non-zero, loudly even with `--quiet`;
//! huge durations, bad URLs and bad `overhead` flags are one line and exit 2.
//! Everything is bounded in time and talks to loopback only.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use gpushare_bench::results::store::{read_cells, read_run};

mod common;
use common::{alive, wait_exit, wait_for};

const BENCH: &str = env!("CARGO_BIN_EXE_gpushare-bench");

fn sweep(out: &Path, extra: &[&str]) -> Command {
    common::cpu_sweep(BENCH, out, extra)
}

/// Workload pods among a process's children.
fn pods_of(pid: u32) -> Vec<u32> {
    common::children(pid)
        .into_iter()
        .filter(|c| c.name.starts_with("gpushare-worklo"))
        .map(|c| c.pid)
        .collect()
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a process this test started.
    unsafe { libc::kill(pid as i32, sig) };
}

fn aggregates(out: &Path, id: &str) -> Vec<(u32, String)> {
    read_cells(&out.join(id).join("cells.jsonl"))
        .expect("cells")
        .iter()
        .filter(|c| c.is_aggregate())
        .map(|c| (c.pods, c.status.to_string()))
        .collect()
}

/// Starts a 2-cell sweep, waits until the 3-pod cell's pods run, and kills the harness
/// with `sig`; returns the pods that were running.
fn kill_mid_cell(out: &Path, id: &str, sig: i32) -> (Vec<u32>, Option<i32>, String) {
    let mut child = sweep(out, &["--pods", "1,3", "--max-cell", "4s", "--run-id", id])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let harness = child.id();
    wait_for("the 3-pod cell running", Duration::from_secs(90), || {
        pods_of(harness).len() == 3
    });
    let pods = pods_of(harness);
    signal(harness, sig);
    let code = wait_exit(&mut child, Duration::from_secs(15));
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        // The supervisor writes its line to the same stderr after the harness died.
        std::thread::sleep(Duration::from_millis(500));
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    (pods, code, err)
}

#[test]
fn sigkill_of_the_harness_leaves_nothing_running_and_resume_measures_each_cell_once() {
    let out = tempfile::tempdir().expect("tmp");
    let (pods, code, _) = kill_mid_cell(out.path(), "k", libc::SIGKILL);
    assert_eq!(code, None, "killed by a signal");
    wait_for("every pod gone after SIGKILL", Duration::from_secs(5), || {
        pods.iter().all(|p| !alive(*p))
    });
    wait_for("the supervisor marking the run", Duration::from_secs(5), || {
        read_run(&out.path().join("k/run.json")).is_ok_and(|r| r.state == "interrupted")
    });
    let journal = std::fs::read_to_string(out.path().join("k/processes.json")).expect("journal");
    assert!(journal.contains("\"group\""), "the pods were journaled: {journal}");

    let st = sweep(out.path(), &["--resume", "k"]).output().expect("resume");
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    assert_eq!(
        aggregates(out.path(), "k"),
        vec![(1, "ok".to_string()), (3, "ok".to_string())],
        "each cell once"
    );
    assert_eq!(read_run(&out.path().join("k/run.json")).expect("run").state, "complete");
    let journal: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("k/processes.json")).expect("journal"))
            .expect("json");
    assert_eq!(
        journal["entries"],
        serde_json::json!([]),
        "nothing left to watch after a clean end"
    );
}

#[test]
fn sighup_is_a_graceful_stop_with_exit_129() {
    let out = tempfile::tempdir().expect("tmp");
    let (pods, code, _) = kill_mid_cell(out.path(), "h", libc::SIGHUP);
    assert_eq!(code, Some(129));
    for p in pods {
        assert!(!alive(p), "pod {p} outlived the harness");
    }
    assert_eq!(
        read_run(&out.path().join("h/run.json")).expect("run").state,
        "interrupted"
    );
}

#[test]
fn a_resume_finds_what_a_dead_run_left_and_stops_only_that() {
    // A journal naming a live process of ours (a stand-in "pod" that outlived its
    // harness, with its group's token) and processes that are not ours: one named by its
    // exact pid and start time (anyone can read both from /proc), one with a token it
    // does not carry, and a daemon entry that names a variable every process has.
    let out = tempfile::tempdir().expect("tmp");
    let st = sweep(out.path(), &["--pods", "1", "--max-cell", "3s", "--run-id", "left"])
        .output()
        .expect("sweep");
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let token = format!("{}.orphan", std::process::id());
    let spawn = |token: Option<&str>| {
        use std::os::unix::process::CommandExt;
        let mut c = Command::new("sleep");
        c.arg("60").process_group(0);
        if let Some(t) = token {
            c.env(gpushare_bench::process::procfs::GROUP_TOKEN, t);
        }
        c.spawn().expect("sleep")
    };
    let mut orphan = spawn(Some(&token));
    let mut bystander = spawn(None);
    let ticks = |pid: u32| gpushare_bench::process::procfs::stat(pid).expect("stat").start_ticks;
    let writer = gpushare_bench::process::supervisor::Writer::of(&out.path().join("left")).expect("writer");
    let journal = serde_json::json!({"writer": writer, "entries": [
        {"kind": "group", "pgid": orphan.id(), "start_ticks": ticks(orphan.id()), "what": "pod-0 of the dead run", "token": token},
        {"kind": "group", "pgid": bystander.id(), "start_ticks": ticks(bystander.id()), "what": "a foreign pid"},
        {"kind": "group", "pgid": bystander.id(), "start_ticks": ticks(bystander.id()), "what": "a forged token", "token": "x"},
        {"kind": "env", "key": "PATH", "value": std::env::var("PATH").unwrap_or_default(), "what": "every process"},
    ]});
    std::fs::write(out.path().join("left/processes.json"), journal.to_string()).expect("journal");
    let st = Command::new(BENCH)
        .args(["sweep", "--quiet", "--resume", "left", "--out"])
        .arg(out.path())
        .output()
        .expect("resume");
    let err = String::from_utf8_lossy(&st.stderr);
    assert!(st.status.success(), "{err}");
    assert!(err.contains("pod-0 of the dead run"), "{err}");
    for not_ours in ["a foreign pid", "a forged token", "every process"] {
        assert!(!err.contains(not_ours), "{not_ours}: {err}");
    }
    let _ = orphan.wait();
    assert!(
        alive(bystander.id()),
        "a process that is not provably ours is never killed"
    );
    let _ = bystander.kill();
    let _ = bystander.wait();
}

#[test]
fn a_closed_pipe_or_a_full_device_loses_lines_never_the_run() {
    // stderr on a full device, stdout a pipe closed before the run prints to it: the run
    // still measures its cell, finishes and exits 0.
    let out = tempfile::tempdir().expect("tmp");
    let mut child = Command::new(BENCH)
        .args([
            "sweep",
            "--device",
            "cpu",
            "--warmup",
            "1s",
            "--window",
            "1s",
            "--max-cell",
            "3s",
        ])
        .args([
            "--pods",
            "1",
            "--strategies",
            "time-slicing",
            "--run-id",
            "full",
            "--out",
        ])
        .arg(out.path())
        .arg("--workload-bin")
        .arg(common::workload_beside(BENCH))
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create("/dev/full").expect("/dev/full"))
        .spawn()
        .expect("sweep");
    drop(child.stdout.take());
    assert_eq!(wait_exit(&mut child, Duration::from_secs(120)), Some(0));
    let run = read_run(&out.path().join("full/run.json")).expect("run.json");
    assert_eq!(run.state, "complete");
    assert_eq!(aggregates(out.path(), "full").len(), 1, "the cell is on disk");
}

#[test]
fn two_resumes_of_one_run_cannot_run_together() {
    let out = tempfile::tempdir().expect("tmp");
    let (_, _, _) = kill_mid_cell(out.path(), "two", libc::SIGINT);
    let mut first = sweep(out.path(), &["--resume", "two"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("first");
    wait_for("the first resume running pods", Duration::from_secs(60), || {
        !pods_of(first.id()).is_empty()
    });
    let second = sweep(out.path(), &["--resume", "two"]).output().expect("second");
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success());
    assert!(err.contains(&format!("pid {}", first.id())), "names the holder: {err}");
    assert_eq!(wait_exit(&mut first, Duration::from_secs(90)), Some(0));
    assert_eq!(aggregates(out.path(), "two").len(), 2, "each cell once");
}

#[test]
fn a_resume_keeps_the_recorded_backend() {
    let out = tempfile::tempdir().expect("tmp");
    let st = sweep(out.path(), &["--pods", "1", "--max-cell", "3s", "--run-id", "kube"])
        .output()
        .expect("sweep");
    assert!(st.status.success());
    let path = out.path().join("kube/run.json");
    let text = std::fs::read_to_string(&path).expect("run.json");
    std::fs::write(
        &path,
        text.replace("\"backend\": \"local\"", "\"backend\": \"kubernetes\""),
    )
    .expect("tamper");
    let st = sweep(out.path(), &["--resume", "kube"]).output().expect("resume");
    let err = String::from_utf8_lossy(&st.stderr);
    assert_eq!(st.status.code(), Some(2), "{err}");
    assert!(err.contains("--backend kubernetes --node"), "{err}");
}

#[test]
fn nothing_measured_is_exit_1_and_said_even_with_quiet() {
    let out = tempfile::tempdir().expect("tmp");
    let st: Output = Command::new(BENCH)
        .args(["sweep", "--device", "cpu", "--quiet", "--strategies", "time-slicing"])
        .args(["--pods", "1,2", "--warmup", "1s", "--window", "1s", "--max-cell", "3s"])
        .args(["--workload-bin", "/bin/false", "--run-id", "f", "--out"])
        .arg(out.path())
        .output()
        .expect("sweep");
    let err = String::from_utf8_lossy(&st.stderr);
    assert_eq!(st.status.code(), Some(1), "{err}");
    assert!(err.contains("no cell could be measured"), "{err}");
    assert!(
        err.contains("failed"),
        "the failed cells reach stderr with --quiet: {err}"
    );
}

#[test]
fn hostile_values_are_one_line_and_exit_2() {
    let out = tempfile::tempdir().expect("tmp");
    let o = out.path().to_string_lossy().to_string();
    let long_id = "a".repeat(128);
    for (args, needle) in [
        (vec!["sweep", "--warmup", "18446744073709551615s"], "bad --warmup"),
        (vec!["sweep", "--max-cell", "500000000000y"], "bad --max-cell"),
        (vec!["sweep", "--window", "7000000000000000000s"], "bad --window"),
        (vec!["sweep", "--prometheus", "http://"], "bad --prometheus `http://`"),
        (vec!["sweep", "--device", "gpu"], "bad --device `gpu`"),
        (vec!["sweep", "--repeat", "0"], "bad --repeat `0`: expected 1 to 100"),
        (vec!["sweep", "--repeat", "many"], "--repeat"),
        (vec!["overhead", "--precision", "int8"], "bad --precision `int8`"),
        (vec!["overhead", "--interval", "500000000000y"], "bad --interval"),
        (
            vec!["overhead", "--device", "cpu", "--precision", "bf16", "--out", &o],
            "fp32 only",
        ),
        (
            vec!["overhead", "--device", "cpu", "--interval", "0s", "--out", &o],
            "bad --interval `0s`",
        ),
        (
            vec![
                "overhead",
                "--device",
                "cpu",
                "--phase",
                "3s",
                "--repeats",
                "0",
                "--out",
                &o,
            ],
            "bad --repeats `0`",
        ),
        (vec!["sweep", "--run-id", &long_id], "128 characters: at most 100"),
        (
            vec!["sweep", "--workload-bin", &o],
            "a directory: give the gpushare-workload binary itself",
        ),
        (
            vec!["sweep", "--load", "poisson:1e-300"],
            "requests per pod in a window",
        ),
        (
            vec!["sweep", "--node", "gpu-1"],
            "bad --node `gpu-1`: a setting of the Kubernetes backend",
        ),
    ] {
        let st = Command::new(BENCH).args(&args).output().expect("run");
        let err = String::from_utf8_lossy(&st.stderr);
        assert_eq!(st.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // No subcommand: the help, and exit 2 (a command line that does nothing).
    let st = Command::new(BENCH).output().expect("run");
    assert_eq!(st.status.code(), Some(2));
}

#[test]
fn sigkill_with_a_spawned_prometheus_leaves_neither_it_nor_the_pods() {
    let out = tempfile::tempdir().expect("tmp");
    let mut child = sweep(
        out.path(),
        &[
            "--pods",
            "2",
            "--max-cell",
            "4s",
            "--run-id",
            "kp",
            "--prometheus",
            "spawn",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("spawn");
    let harness = child.id();
    let mut kids = Vec::new();
    wait_for("Prometheus and 2 pods", Duration::from_secs(90), || {
        kids = common::children(harness);
        kids.iter().any(|c| c.name == "prometheus")
            && kids.iter().filter(|c| c.name.starts_with("gpushare-worklo")).count() == 2
    });
    signal(harness, libc::SIGKILL);
    let _ = wait_exit(&mut child, Duration::from_secs(5));
    let watched: Vec<u32> = kids
        .iter()
        .filter(|c| c.name == "prometheus" || c.name.starts_with("gpushare-worklo"))
        .map(|c| c.pid)
        .collect();
    wait_for("Prometheus and the pods gone", Duration::from_secs(5), || {
        watched.iter().all(|p| !alive(*p))
    });
}
