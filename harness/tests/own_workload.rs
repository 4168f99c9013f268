//! A server of the user's own (`sweep --workload-cmd`), played by
//! `tests/fixtures/fake_server.py` (200 inferences/s of 4 ms, its histogram named by
//! `--metric`): a CPU sweep end to end with readiness by the first observation and the
//! pod's environment, and the errors a wrong server gets, each naming the pod, the URL
//! and the metric.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use gpushare_bench::domain::CellStatus;
use gpushare_bench::results::store::read_cells;

const BENCH: &str = env!("CARGO_BIN_EXE_gpushare-bench");

fn server(mode: &str) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_server.py");
    format!("python3 {} {{port}} my_latency_seconds {mode}", script.display())
}

fn sweep(out: &Path, run_id: &str, extra: &[&str]) -> Output {
    Command::new(BENCH)
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
            "--metric",
            "my_latency_seconds",
            "--run-id",
            run_id,
        ])
        .arg("--out")
        .arg(out)
        .args(extra)
        .env("FAKE_ENV_DIR", out)
        .output()
        .expect("run")
}

#[test]
fn a_server_of_ones_own_is_swept_like_the_workload() {
    let out = tempfile::tempdir().expect("tempdir");
    let cmd = server("ok");
    let o = sweep(
        out.path(),
        "own",
        &["--pods", "1,2", "--workload-cmd", &cmd, "--ready-path", "none"],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let cells = read_cells(&out.path().join("own/cells.jsonl")).expect("cells");
    let two = cells
        .iter()
        .find(|c| c.pods == 2 && c.is_aggregate())
        .expect("2-pod cell");
    assert_eq!(two.status, CellStatus::Ok, "{}", two.note);
    assert_eq!(two.model, "custom", "the rows say whose numbers they are");
    // 2 × 200/s of 4 ms (the histogram's sum over its count).
    let tput = two.throughput_per_s.expect("throughput");
    assert!((360.0..440.0).contains(&tput), "{tput}");
    assert!(two.mean_s.is_some_and(|m| (m - 0.004).abs() < 1e-6), "{:?}", two.mean_s);
    // Each pod got its name, strategy and port in its environment.
    let env = std::fs::read_to_string(out.path().join("pod-1")).expect("pod-1's environment");
    let fields: Vec<&str> = env.split_whitespace().collect();
    assert_eq!(fields[..2], ["pod-1", "time-slicing"], "{env}");
    assert!(fields[2].parse::<u16>().is_ok(), "{env}");
    let run = std::fs::read_to_string(out.path().join("own/run.json")).expect("run.json");
    assert!(run.contains("\"workload_cmd\"") && run.contains("\"metric\": \"my_latency_seconds\""));

    // A resume runs the recorded command only when it is given again.
    let resume = |extra: &[&str]| {
        Command::new(BENCH)
            .args(["sweep", "--quiet", "--resume", "own"])
            .arg("--out")
            .arg(out.path())
            .args(extra)
            .output()
            .expect("resume")
    };
    let o = resume(&[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("resume it with the same --workload-cmd"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = resume(&["--workload-cmd", &cmd]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn a_wrong_server_is_named_with_its_url_and_metric() {
    let out = tempfile::tempdir().expect("tempdir");
    // A gauge of that name: it will never be a histogram, so readiness stops at once.
    let gauge = server("gauge");
    let o = sweep(
        out.path(),
        "gauge",
        &["--pods", "1", "--workload-cmd", &gauge, "--ready-path", "none"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
    let cells = read_cells(&out.path().join("gauge/cells.jsonl")).expect("cells");
    let pod = cells.iter().find(|c| c.pod == "pod-0").expect("pod row");
    assert_eq!(pod.status, CellStatus::Failed);
    assert!(
        pod.note
            .starts_with("not ready: metrics from pod-0 at http://127.0.0.1:")
            && pod.note.contains("/metrics: my_latency_seconds is not a histogram"),
        "{}",
        pod.note
    );
    // No such histogram, ready by its own path: the measurement names what is missing.
    let missing = server("missing");
    let o = sweep(
        out.path(),
        "missing",
        &["--pods", "1", "--workload-cmd", &missing, "--ready-path", "/ready"],
    );
    assert_eq!(o.status.code(), Some(1));
    let cells = read_cells(&out.path().join("missing/cells.jsonl")).expect("cells");
    let pod = cells.iter().find(|c| c.pod == "pod-0").expect("pod row");
    assert!(
        pod.note.contains("metrics from pod-0 at http://127.0.0.1:")
            && pod
                .note
                .contains("/metrics: no my_latency_seconds histogram in its metrics"),
        "{}",
        pod.note
    );
}

#[test]
fn what_a_server_of_ones_own_cannot_do_yet_is_refused_with_one_line() {
    let out = tempfile::tempdir().expect("tempdir");
    let cmd = server("ok");
    for (args, says) in [
        (vec!["--workload-cmd", "python3 serve.py"], "put {port} where"),
        (
            vec!["--workload-cmd", &cmd, "--load", "poisson:10"],
            "makes its own requests",
        ),
        (
            vec![
                "--workload-cmd",
                &cmd,
                "--request",
                "http://127.0.0.1:{port}/i",
                "--prometheus",
                "spawn",
            ],
            "bad --prometheus `spawn`: with --request the harness times the requests itself",
        ),
        (
            vec!["--workload-cmd", &cmd, "--workload-arg=--x"],
            "put your server's arguments in the command",
        ),
        (
            vec!["--workload-cmd", &cmd, "--backend", "kubernetes", "--node", "n"],
            "on Kubernetes it runs in your server's image: give it with --image",
        ),
        (vec!["--ready-path", "healthz"], "an HTTP path such as /healthz"),
        (
            vec!["--request", "http://127.0.0.1:{port}/infer"],
            "bad --request `http://127.0.0.1:{port}/infer`: for a server of your own (--workload-cmd)",
        ),
        (
            vec!["--body", "req.json"],
            "bad --body `req.json`: the body of --request",
        ),
        (
            vec![
                "--workload-cmd",
                &cmd,
                "--request",
                "http://127.0.0.1:{port}/i",
                "--ready-path",
                "none",
            ],
            "bad --ready-path `none`: a server that waits for --request",
        ),
        (
            vec!["--workload-cmd", &cmd, "--request", "http://127.0.0.1:{port}/i"],
            "bad --metric `my_latency_seconds`: with --request the harness times the requests itself",
        ),
    ] {
        let o = sweep(out.path(), "refused", &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
    let k8s = [
        "sweep",
        "--workload-cmd",
        &cmd,
        "--backend",
        "kubernetes",
        "--node",
        "n",
    ];
    let with = |more: &[&'static str]| [&k8s[..], more].concat();
    for (args, says) in [
        (k8s.to_vec(), "give it with --image"),
        (
            with(&["--image", "me/server:1", "--ready-path", "none"]),
            "bad --ready-path `none`: on Kubernetes the kubelet's readiness probe decides",
        ),
        (
            with(&["--image", "me/server:1", "--request", "http://127.0.0.1:{port}/i"]),
            "bad --request `http://127.0.0.1:{port}/i`: the local backend's for now",
        ),
        (
            vec!["sweep", "--server-image", "me/server:1"],
            "bad --server-image `me/server:1`: the Kubernetes backend's",
        ),
        (with(&["--server-image", "me/server:1"]), "cannot be used with"),
        (vec!["capacity", "--workload-cmd", &cmd], "bad --workload-cmd"),
        (
            vec!["capacity", "--workload-cmd", &cmd, "--load", "poisson:10"],
            "capacity offers each pod a Poisson load: give --request for the harness to send it",
        ),
    ] {
        let o = Command::new(BENCH).args(&args).output().expect("run");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let o = Command::new(BENCH)
        .args(["sweep", "--device", "cpu", "--metric", "1bad"])
        .output()
        .expect("sweep");
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("bad --metric `1bad`: not a Prometheus metric name"));
    for (more, says) in [
        (
            vec!["--victim-rate", "20"],
            "bad --victim-rate `20`: the rate of the harness's requests to a server of your own: give --request URL",
        ),
        (
            vec!["--aggressor-image", "me/w:1"],
            "bad --aggressor-image `me/w:1`: for Kubernetes with a server of your own",
        ),
    ] {
        let o = Command::new(BENCH)
            .args(["isolation", "--device", "cpu", "--workload-cmd", &cmd])
            .args(&more)
            .arg("--out")
            .arg(out.path())
            .output()
            .expect("isolation");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{more:?}: {err}");
        assert!(err.contains(says), "{more:?}: {err}");
    }
    assert!(!out.path().join("refused").exists());
}

/// In isolation a server of one's own is the victim, here in its own loop (no
/// `--request`), and gpushare-workload the aggressors: their crash is gpushare-workload's
/// `--crash-after`, and the victim, read through its own histogram, serves on.
#[test]
fn a_server_of_ones_own_is_the_isolation_victim_beside_gpushare_workload() {
    let out = tempfile::tempdir().expect("tempdir");
    let o = Command::new(BENCH)
        .args([
            "isolation",
            "--device",
            "cpu",
            "--quiet",
            "--strategies",
            "time-slicing",
            "--scenarios",
            "crash",
            "--warmup",
            "1s",
            "--event-after",
            "2s",
            "--observe",
            "6s",
            "--run-id",
            "iso",
            "--workload-cmd",
            &server("ok"),
            "--metric",
            "my_latency_seconds",
            "--ready-path",
            "/ready",
        ])
        .arg("--workload-bin")
        .arg(common::workload_beside(BENCH))
        .arg("--out")
        .arg(out.path())
        .env("FAKE_ENV_DIR", out.path())
        .output()
        .expect("isolation");
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let dir = out.path().join("iso");
    let (run, records) = common::isolation_run(&dir);
    assert_eq!(records.len(), 2, "{records:?}");
    for r in &records {
        assert_eq!(r.victim_status, CellStatus::Ok, "{r:?}");
        // The fake server's own histogram: 200 inferences/s of 4 ms.
        assert!(r.victim_inferences.is_some_and(|n| n > 500), "{r:?}");
    }
    let crash = &records[1];
    assert!(crash.aggressor_outcome.contains("killed by signal 9"), "{crash:?}");
    // The victim was the user's server (it wrote its environment), the aggressor
    // gpushare-workload (its log is the workload's), on the aggressors' model.
    assert!(out.path().join("victim").is_file(), "the server ran as the victim");
    assert!(
        !out.path().join("aggressor-1").exists(),
        "the aggressor is not the server"
    );
    let log = std::fs::read_to_string(dir.join("logs/time-slicing-crash-aggressor-1.log")).expect("aggressor log");
    assert!(log.contains("tiny"), "{log}");
    assert_eq!(run.plan.model, "tiny", "the aggressors' model");
    let reports = common::report(BENCH, &dir, &out.path().join("reports"));
    let html = std::fs::read_to_string(reports.join("index.html")).expect("html");
    assert!(html.contains("under the load it makes itself"), "{html}");
    assert!(html.contains("The victim is a server of your own"), "{html}");
}

/// The shell dies with the harness (PDEATHSIG); its children are stopped by the
/// supervisor, through the group while the shell's zombie lasts and by `GPUSHARE_GROUP`
/// once it is reaped (that case alone: `process::supervisor`'s tests).
#[test]
fn sigkill_of_the_harness_stops_a_servers_children_too() {
    let out = tempfile::tempdir().expect("tempdir");
    // The shell starts a child of its own beside the server; both carry FAKE_ENV_DIR.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_server.py");
    let cmd = format!(
        "sleep 300 & python3 {} {{port}} my_latency_seconds ok",
        script.display()
    );
    let dir = out.path().to_str().expect("utf-8").to_string();
    let mut harness = Command::new(BENCH)
        .args([
            "sweep",
            "--device",
            "cpu",
            "--quiet",
            "--warmup",
            "30s",
            "--strategies",
            "time-slicing",
            "--pods",
            "2",
            "--metric",
            "my_latency_seconds",
            "--ready-path",
            "/ready",
            "--run-id",
            "killed",
            "--workload-cmd",
            &cmd,
            "--out",
            &dir,
        ])
        .env("FAKE_ENV_DIR", &dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("sweep");
    // The shells' children: a sleep and a server per pod (not the harness, its
    // supervisor or the shells, which carry FAKE_ENV_DIR too).
    let ours = || {
        gpushare_bench::process::procfs::live_with_env("FAKE_ENV_DIR", &dir)
            .into_iter()
            .filter(|p| {
                // By the program's own name (argv[0]), not its arguments: the
                // harness's command line holds the server's too.
                let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
                let argv0 = String::from_utf8_lossy(argv0);
                argv0 == "sleep" || argv0.ends_with("python3")
            })
            .collect::<Vec<u32>>()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while ours().len() < 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "the pods never started: {:?}",
            ours()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(harness.id() as i32, libc::SIGKILL) };
    let _ = harness.wait();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !ours().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "left running after SIGKILL of the harness: {:?}",
            ours()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn a_server_under_a_shell_gets_its_sigterm_grace() {
    let out = tempfile::tempdir().expect("tempdir");
    // `; true`: the shell cannot exec the server and dies of the SIGTERM at once; the
    // server takes a second to stop and marks that it did.
    let cmd = format!("{}; true", server("slow-stop"));
    let o = sweep(
        out.path(),
        "grace",
        &["--pods", "1", "--ready-path", "/ready", "--workload-cmd", &cmd],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        out.path().join("pod-0.stopped").exists(),
        "the server was killed within its grace"
    );
}

/// An equal-load run whose base failed (every request answered 404) is a measurement
/// that failed, not bad input: exit 1 with the cause, the closed sweep kept, and the
/// same on a resume, which cannot measure the base again.
#[test]
fn an_equal_load_run_whose_base_failed_exits_1_on_every_resume() {
    let out = tempfile::tempdir().expect("tempdir");
    let cmd = server("ok");
    let run = |args: &[&str]| {
        Command::new(BENCH)
            .args(args)
            .arg("--out")
            .arg(out.path())
            .args(["--workload-cmd", &cmd])
            .output()
            .expect("run")
    };
    let first = run(&[
        "equal-load",
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
        "--ready-path",
        "/ready",
        "--request",
        "http://127.0.0.1:{port}/nothing",
        "--levels",
        "50%",
        "--run-id",
        "base-failed",
    ]);
    let resumed = run(&["equal-load", "--resume", "base-failed"]);
    for o in [first, resumed] {
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains("measured no throughput") && err.contains("404"), "{err}");
        assert!(err.contains("the closed sweep is kept"), "{err}");
    }
    assert!(out.path().join("base-failed/closed/cells.jsonl").is_file());
    assert!(
        !out.path().join("base-failed/load-50pct").exists(),
        "no level was started"
    );
}
