//! Helpers shared by the integration tests: the process tree under a pid.

#![allow(dead_code)] // each test binary uses a part

/// A live child process: pid and command name (at most 15 characters, as the kernel keeps it).
#[derive(Debug, Clone, PartialEq)]
pub struct Child {
    /// Process id.
    pub pid: u32,
    /// `comm`, e.g. "gpushare-worklo".
    pub name: String,
}

fn stat(pid: u32) -> Option<(String, char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name in field 2 may hold spaces and parentheses: split at the last ')'.
    let (head, rest) = stat.rsplit_once(')')?;
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    Some((head.split_once('(')?.1.to_string(), state, ppid))
}

/// Live (not zombie) children of `pid`.
pub fn children(pid: u32) -> Vec<Child> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Some((name, state, ppid)) = stat(p)
            && ppid == pid
            && state != 'Z'
        {
            out.push(Child { pid: p, name });
        }
    }
    out
}

/// Whether a process exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    stat(pid).is_some_and(|(_, state, _)| state != 'Z')
}

/// The gpushare-bench binary under test (the test binaries' `CARGO_BIN_EXE_` path is
/// passed in: `env!` is per test crate).
pub fn workload_beside(bench: &str) -> std::path::PathBuf {
    let p = std::path::Path::new(bench).with_file_name("gpushare-workload");
    assert!(
        p.is_file(),
        "{} is missing: build the workspace first (`make test` does)",
        p.display()
    );
    p
}

/// A finished isolation run's run.json and records, read by the project's own readers.
pub fn isolation_run(
    dir: &std::path::Path,
) -> (
    gpushare_bench::results::record::RunRecord,
    Vec<gpushare_bench::results::isolation::IsolationRecord>,
) {
    use gpushare_bench::results::store::{read_isolation, read_run};
    let run = read_run(&dir.join("run.json")).expect("run.json");
    let records = read_isolation(&dir.join("isolation.jsonl"), &run).expect("isolation.jsonl");
    (run, records)
}

/// `gpushare-bench report DIR --out OUT`, which must succeed; the report's directory
/// (`OUT/<run-id>`).
pub fn report(bench: &str, dir: &std::path::Path, out: &std::path::Path) -> std::path::PathBuf {
    let r = std::process::Command::new(bench)
        .arg("report")
        .arg(dir)
        .arg("--out")
        .arg(out)
        .output()
        .expect("report");
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    out.join(dir.file_name().expect("a run directory's name"))
}

/// A CPU sweep command with short settings, into `out`; time-slicing unless `extra`
/// names strategies or resumes.
pub fn cpu_sweep(bench: &str, out: &std::path::Path, extra: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new(bench);
    c.args([
        "sweep", "--device", "cpu", "--quiet", "--warmup", "1s", "--window", "1s",
    ])
    .arg("--out")
    .arg(out)
    .arg("--workload-bin")
    .arg(workload_beside(bench))
    .args(extra);
    if !extra.contains(&"--strategies") && !extra.contains(&"--resume") {
        c.args(["--strategies", "time-slicing"]);
    }
    c
}

/// Polls `f` every 100 ms until it holds; fails the test after `limit`.
pub fn wait_for(what: &str, limit: std::time::Duration, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + limit;
    while !f() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Waits for a child's exit code (None: killed by a signal); kills it and fails the test
/// after `limit`.
pub fn wait_exit(child: &mut std::process::Child, limit: std::time::Duration) -> Option<i32> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().expect("wait") {
            return s.code();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the harness did not exit within {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
