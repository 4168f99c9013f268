//! Hostile run directories and outputs against `report`, `export` and `compare` (issue
//! 11): tampered run.json and cells.jsonl are refused with one line naming the file and
//! the field, partial runs are marked, missing cells fail `compare`, and a full stdout
//! is an error, not a panic or a silent exit 0. Every case tampers with a copy of a
//! committed fixture in a temporary directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const BENCH: &str = env!("CARGO_BIN_EXE_gpushare-bench");

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// A copy of fixture `name` under `dir`, as `dir/<copy>`.
fn copy(name: &str, dir: &Path, copy: &str) -> PathBuf {
    let out = dir.join(copy);
    std::fs::create_dir_all(&out).expect("dir");
    for f in ["run.json", "cells.jsonl"] {
        std::fs::copy(fixture(name).join(f), out.join(f)).expect("copy");
    }
    out
}

/// Rewrites run.json through `f`.
fn tamper_run(run: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let path = run.join("run.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
    f(&mut v);
    std::fs::write(&path, serde_json::to_string_pretty(&v).expect("json")).expect("write");
}

/// Rewrites every row of cells.jsonl through `f` (rows it returns false for are dropped).
fn tamper_cells(run: &Path, mut f: impl FnMut(usize, &mut serde_json::Value) -> bool) {
    let path = run.join("cells.jsonl");
    let text = std::fs::read_to_string(&path).expect("read");
    let mut out = String::new();
    for (i, l) in text.lines().enumerate() {
        let mut v: serde_json::Value = serde_json::from_str(l).expect("row");
        if f(i + 1, &mut v) {
            out.push_str(&v.to_string());
            out.push('\n');
        }
    }
    std::fs::write(&path, out).expect("write");
}

fn bench(args: &[&str], dirs: &[&Path]) -> Output {
    let mut c = Command::new(BENCH);
    c.args(args);
    for d in dirs {
        c.arg(d);
    }
    c.output().expect("run gpushare-bench")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit 2 (bad input), nothing on stdout, exactly one line on stderr containing every
/// `want`.
fn assert_refused(o: &Output, wants: &[&str]) {
    assert_one_error(o, 2, wants);
}

/// Exit `code`, nothing on stdout, exactly one line on stderr containing every `want`.
fn assert_one_error(o: &Output, code: i32, wants: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "stderr: {err}");
    assert!(o.stdout.is_empty(), "stdout: {}", String::from_utf8_lossy(&o.stdout));
    assert_eq!(err.lines().count(), 1, "not one line: {err}");
    assert!(!err.contains("panicked"), "{err}");
    for w in wants {
        assert!(err.contains(w), "{w:?} not in {err:?}");
    }
}

#[test]
fn tampered_cells_are_refused_naming_file_line_and_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    type Tamper = fn(usize, &mut serde_json::Value) -> bool;
    let cases: [(&str, Tamper, &str); 5] = [
        (
            "negative",
            |n, v| {
                if n == 2 {
                    v["throughput_per_s"] = (-242.0).into();
                }
                true
            },
            "line 2: throughput_per_s = -242: must be a finite number ≥ 0",
        ),
        (
            "duplicate",
            // Line 3 becomes a second copy of line 2 (exclusive × 1 pods, aggregate).
            |n, v| {
                if n == 3 {
                    v["pods"] = 1.into();
                    v["pod"] = "all".into();
                }
                true
            },
            "line 3: duplicate row (strategy exclusive, pods 1, repeat 1, pod \"all\"), first on line 2",
        ),
        (
            "no-aggregate",
            |_, v| !(v["strategy"] == "mps" && v["pods"] == 5 && v["pod"] == "all"),
            "cell mps × 5 pods has pod rows but no aggregate row",
        ),
        (
            "outside-plan",
            |_, v| {
                if v["strategy"] == "exclusive" && v["pods"] == 1 {
                    v["pods"] = 2.into();
                }
                true
            },
            "line 1: pods 2 is not in run.json's plan (1, 3, 5, 7)",
        ),
        (
            "bad-json",
            |n, v| {
                if n == 4 {
                    v["status"] = "great".into();
                }
                true
            },
            "line 4: unknown variant `great`",
        ),
    ];
    for (name, f, want) in cases {
        let run = copy("h100-run", dir.path(), name);
        tamper_cells(&run, f);
        let file = format!("{name}/cells.jsonl");
        assert_refused(&bench(&["export", "--format", "csv"], &[&run]), &[&file, want]);
        let out = dir.path().join("reports");
        assert_refused(&bench(&["report", "--out"], &[&out, &run]), &[&file, want]);
        assert!(!out.exists(), "{name}: a report was written");
        assert_refused(&bench(&["compare"], &[&fixture("h100-run"), &run]), &[&file, want]);
    }
}

#[test]
fn a_missing_cells_file_is_an_error_not_an_empty_report() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = copy("h100-run", dir.path(), "gone");
    std::fs::remove_file(run.join("cells.jsonl")).expect("rm");
    for format in ["csv", "json", "markdown"] {
        assert_refused(
            &bench(&["export", "--format", format], &[&run]),
            &["gone/cells.jsonl: no cells.jsonl: the run directory has run.json but no cells file"],
        );
    }
    assert_refused(
        &bench(&["report", "--out"], &[&dir.path().join("r"), &run]),
        &["no cells.jsonl"],
    );
}

#[test]
fn a_tampered_plan_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    type Tamper = fn(&mut serde_json::Value);
    let cases: [(&str, Tamper, &str); 9] = [
        (
            "warmup",
            |v| v["plan"]["warmup_s"] = (-5.0).into(),
            "plan.warmup_s: -5 is not a duration",
        ),
        (
            "cap",
            |v| v["plan"]["max_cell_s"] = 1e300.into(),
            "plan.max_cell_s: 1e300 is not a duration",
        ),
        (
            "pods",
            |v| v["plan"]["pods"] = serde_json::json!([0]),
            "plan.pods: 0 is outside 1 to 64",
        ),
        (
            "window",
            |v| v["plan"]["window_s"] = 0.into(),
            "plan.window_s: 0 s is shorter than 0.5 s",
        ),
        (
            "stable",
            |v| v["plan"]["stable_windows"] = 0.into(),
            "plan.stable_windows: 0",
        ),
        (
            "tolerance",
            |v| v["plan"]["tolerance"] = (-1).into(),
            "plan.tolerance: -1 is not a fraction",
        ),
        (
            "strategies",
            |v| v["plan"]["strategies"] = serde_json::json!([]),
            "plan.strategies: empty",
        ),
        (
            "runid",
            |v| v["run_id"] = "../../x".into(),
            "run_id: \"../../x\" is not a plain directory name",
        ),
        (
            "emptyid",
            |v| v["run_id"] = "".into(),
            "run_id: \"\" is not a plain directory name",
        ),
    ];
    for (name, f, want) in cases {
        let run = copy("h100-run", dir.path(), name);
        tamper_run(&run, f);
        let file = format!("{name}/run.json");
        assert_refused(&bench(&["export", "--format", "json"], &[&run]), &[&file, want]);
        assert_refused(
            &bench(&["report", "--out"], &[&dir.path().join("reports"), &run]),
            &[&file, want],
        );
    }
    assert!(!dir.path().join("reports").exists());
}

#[test]
fn an_empty_run_exports_the_csv_header_and_is_marked_partial() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = copy("cpu-run", dir.path(), "empty");
    std::fs::write(run.join("cells.jsonl"), "").expect("empty");
    tamper_run(&run, |v| {
        v["state"] = "running".into();
        v["finished_at"] = serde_json::Value::Null;
    });
    let out = bench(&["export", "--format", "csv"], &[&run]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.starts_with("run_id,strategy,pods,repeat,pod,status,inferences,throughput_per_s,"),
        "{text}"
    );
    let md = bench(&["export", "--format", "markdown"], &[&run]);
    assert!(
        String::from_utf8_lossy(&md.stdout)
            .contains("> **PARTIAL RUN: run.json says state \"running\", not \"complete\"; 0 of 8 cells are on disk")
    );
}

#[test]
fn a_partial_run_is_marked_by_report_and_export() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = copy("h100-run", dir.path(), "cut");
    tamper_run(&run, |v| v["state"] = "interrupted".into());
    tamper_cells(&run, |_, v| v["strategy"] != "mps");
    let banner = "PARTIAL RUN: run.json says state \"interrupted\", not \"complete\"; 12 of 16 cells are on disk, the others were never measured";
    let md = bench(&["export", "--format", "markdown"], &[&run]);
    assert!(md.status.success(), "{}", stderr(&md));
    assert!(String::from_utf8_lossy(&md.stdout).contains(&format!("> **{banner}**")));
    let json = bench(&["export", "--format", "json"], &[&run]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("json");
    assert_eq!(v["run"]["state"], "interrupted");
    assert_eq!(v["cells"].as_array().map(Vec::len), Some(64 - 20));
    let out = dir.path().join("reports");
    let o = bench(&["report", "--out"], &[&out, &run]);
    assert!(o.status.success(), "{}", stderr(&o));
    // Named for its directory (a copy of a run keeps its run.json's id).
    let html = std::fs::read_to_string(out.join("cut/index.html")).expect("index.html");
    assert!(html.contains(&format!(
        "<div class=\"banner partial\" role=\"alert\">{}</div>",
        banner.replace('"', "&quot;")
    )));
    // The complete fixture carries no such line (its golden files stay as they are).
    let md = bench(&["export", "--format", "markdown"], &[&fixture("h100-run")]);
    assert!(!String::from_utf8_lossy(&md.stdout).contains("PARTIAL"));
}

#[test]
fn compare_fails_on_cells_the_candidate_lacks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cand = copy("h100-run", dir.path(), "fewer");
    tamper_cells(&cand, |_, v| !(v["strategy"] == "time-slicing" && v["pods"] == 7));
    let o = bench(&["compare"], &[&fixture("h100-run"), &cand]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{text}");
    let flagged: Vec<&str> = text.lines().filter(|l| l.contains("missing")).collect();
    assert_eq!(flagged.len(), 1, "{text}");
    assert!(flagged[0].starts_with("Time-slicing     7"), "{}", flagged[0]);
    // MIG was measured in neither run: a dash, not "ok".
    let mig: Vec<&str> = text.lines().filter(|l| l.starts_with("MIG")).collect();
    assert_eq!(mig.len(), 4, "{text}");
    assert!(mig.iter().all(|l| l.ends_with("  —")), "{mig:?}");
}

#[test]
fn compare_accepts_thresholds_up_to_1000_percent() {
    let base = fixture("h100-run");
    for t in ["100%", "1000%", "0.5%"] {
        let o = bench(&["compare", "--threshold", t], &[&base, &base]);
        assert_eq!(o.status.code(), Some(0), "{t}: {}", stderr(&o));
    }
    for t in ["0%", "1001%", "-5%"] {
        let o = bench(&["compare", &format!("--threshold={t}")], &[&base, &base]);
        assert_eq!(o.status.code(), Some(2), "{t}: {}", stderr(&o));
        assert!(stderr(&o).contains("expected a percentage above 0% and at most 1000%"));
    }
}

#[test]
fn compare_refuses_runs_of_different_devices() {
    let o = bench(&["compare"], &[&fixture("h100-run"), &fixture("cpu-run")]);
    assert_refused(&o, &["cpu-run"]);
}

/// Needs main.rs to call `compare::compare_runs` and print its notices (see the module
/// doc of `report::compare`); until then the binary refuses with "shares no cell".
#[test]
fn compare_refusal_names_both_values_and_a_partial_candidate_is_noticed() {
    let o = bench(&["compare"], &[&fixture("h100-run"), &fixture("cpu-run")]);
    assert_refused(
        &o,
        &[
            "cpu-run/run.json: cannot compare with baseline ",
            "model yolos-small (baseline) vs tiny (candidate)",
            "device cuda (baseline) vs cpu (candidate)",
        ],
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let cand = copy("h100-run", dir.path(), "broken");
    tamper_run(&cand, |v| v["state"] = "interrupted".into());
    let o = bench(&["compare"], &[&fixture("h100-run"), &cand]);
    assert_eq!(o.status.code(), Some(0), "nothing missing, nothing worse");
    assert!(
        stderr(&o).contains("broken is a partial run (state \"interrupted\""),
        "{}",
        stderr(&o)
    );
}

/// Runs the binary with stdout opened on /dev/full.
fn to_dev_full(args: &[&str], dirs: &[&Path]) -> Output {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let mut c = Command::new(BENCH);
    c.args(args);
    for d in dirs {
        c.arg(d);
    }
    c.stdout(Stdio::from(full)).stderr(Stdio::piped());
    c.output().expect("run gpushare-bench")
}

#[test]
fn a_full_stdout_is_one_error_line_not_a_panic_or_exit_0() {
    let run = fixture("h100-run");
    for format in ["csv", "json", "markdown", "summary"] {
        let o = to_dev_full(&["export", "--format", format], &[&run]);
        assert_one_error(&o, 1, &["writing to stdout", "No space left on device"]);
    }
    // compare's notices (this fixture records no quantile resolution) come first, on
    // lines of their own; the error is the one line after them.
    let mut o = to_dev_full(&["compare"], &[&run, &run]);
    let err = stderr(&o);
    let notices = err
        .lines()
        .filter(|l| l.starts_with("gpushare-bench: p99 changes are not judged"))
        .count();
    assert_eq!(notices, 2, "{err}");
    o.stderr = err
        .lines()
        .filter(|l| !l.starts_with("gpushare-bench: p99 changes are not judged"))
        .map(|l| format!("{l}\n"))
        .collect::<String>()
        .into_bytes();
    assert_one_error(&o, 1, &["writing to stdout", "No space left on device"]);
}

#[test]
fn links_in_a_run_directory_are_refused_and_nothing_is_written_through_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&outside).expect("outside");
    let victim = outside.join("precious.txt");
    std::fs::write(&victim, "keep me").expect("victim");
    // A report directory that is a link: `report` refuses it and writes nothing there.
    let run = copy("cpu-run", dir.path(), "linked");
    std::os::unix::fs::symlink(&outside, run.join("report")).expect("link");
    let o = bench(&["report"], &[&run]);
    assert_refused(&o, &["linked/report: a symbolic link"]);
    assert!(
        !outside.join("index.html").exists(),
        "a report was written through the link"
    );
    // A `.lock` and a `logs` that are links: a resume refuses the directory before it
    // locks, writes or starts anything.
    let run = copy("cpu-run", dir.path(), "locked");
    std::os::unix::fs::symlink(&victim, run.join(".lock")).expect("link");
    let o = Command::new(BENCH)
        .args(["sweep", "--device", "cpu", "--resume", "locked", "--out"])
        .arg(dir.path())
        .output()
        .expect("resume");
    assert_refused(&o, &["locked/.lock: a symbolic link"]);
    assert_eq!(std::fs::read_to_string(&victim).expect("victim"), "keep me");
}

#[test]
fn a_deleted_isolation_file_and_out_of_plan_records_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = dir.path().join("iso");
    std::fs::create_dir_all(&run).expect("dir");
    for f in ["run.json", "cells.jsonl"] {
        std::fs::copy(fixture("h100-isolation").join(f), run.join(f)).expect("copy");
    }
    let o = bench(&["report"], &[&run]);
    assert_refused(&o, &["iso/isolation.jsonl: missing"]);
    let text = std::fs::read_to_string(fixture("h100-isolation").join("isolation.jsonl")).expect("records");
    for (field, value, says) in [
        (
            "slo_attainment",
            serde_json::json!(3.5),
            "slo_attainment 3.5 is above 1",
        ),
        (
            "aggressors",
            serde_json::json!(5),
            "aggressors 5 is not in run.json's isolation plan",
        ),
    ] {
        let mut done = false;
        let tampered: String = text
            .lines()
            .map(|l| {
                let mut v: serde_json::Value = serde_json::from_str(l).expect("record");
                if !done && v["scenario"] == "noisy-neighbour" {
                    v[field] = value.clone();
                    done = true;
                }
                format!("{v}\n")
            })
            .collect();
        std::fs::write(run.join("isolation.jsonl"), tampered).expect("write");
        let o = bench(&["report"], &[&run]);
        assert_refused(&o, &["isolation.jsonl: line ", says]);
    }
}

#[test]
fn html_in_a_label_or_a_note_is_text_in_the_markdown_summary() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = copy("cpu-run", dir.path(), "html");
    tamper_run(&run, |v| v["label"] = "CPU RUN <script>alert(1)</script>".into());
    let o = bench(&["export", "--format", "markdown"], &[&run]);
    let md = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(md.contains("CPU RUN &lt;script&gt;alert(1)&lt;/script&gt;"), "{md}");
    assert!(!md.contains("<script>"), "{md}");
}

/// A copy of the committed run `name` (its every file) under `dir`.
fn copy_committed(name: &str, dir: &Path) -> PathBuf {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../results").join(name);
    let out = dir.join(name);
    std::fs::create_dir_all(&out).expect("dir");
    for e in std::fs::read_dir(&from).expect("committed run") {
        let e = e.expect("entry");
        std::fs::copy(e.path(), out.join(e.file_name())).expect("copy");
    }
    out
}

/// Rewrites the first line of a JSON-lines file through `f`; `twice` writes it twice.
fn tamper_first_line(path: &Path, twice: bool, f: impl FnOnce(&mut serde_json::Value)) {
    let text = std::fs::read_to_string(path).expect("read");
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let mut v: serde_json::Value = serde_json::from_str(&lines[0]).expect("line");
    f(&mut v);
    lines[0] = v.to_string();
    if twice {
        lines.insert(0, lines[0].clone());
    }
    std::fs::write(path, lines.join("\n") + "\n").expect("write");
}

/// `gpushare-bench ARGS DIR`, killed after `secs`: a run that hangs fails the test.
fn bench_within(args: &[&str], dir: &Path, secs: u64) -> Output {
    let mut child = Command::new(BENCH)
        .args(args)
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let start = std::time::Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed().as_secs() > secs {
            let _ = child.kill();
            panic!("{args:?} {} still running after {secs} s", dir.display());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

#[test]
fn tampered_raw_windows_are_refused_at_once_naming_the_file_and_field() {
    type Edit = fn(&mut serde_json::Value);
    let cases: [(&str, bool, Edit, &[&str]); 6] = [
        (
            "count 1e20",
            false,
            |v| v["series"][0]["windows"][0]["count"] = 1e20.into(),
            &["line 1", "count is 100000000000000000000"],
        ),
        (
            "count 1e308",
            false,
            |v| v["series"][0]["windows"][0]["count"] = 1e308.into(),
            &["line 1", "count"],
        ),
        (
            "a billion windows",
            false,
            |v| v["windows"] = 1_000_000_000u64.into(),
            &["windows is 1000000000"],
        ),
        (
            "negative errors",
            false,
            |v| v["series"][0]["windows"][1]["errors"] = (-3.0).into(),
            &["window 2: errors is -3"],
        ),
        (
            "windows out of order",
            false,
            |v| v["series"][0]["windows"][1]["window"] = 1.into(),
            &["out of order"],
        ),
        (
            "a line twice",
            true,
            |_| {},
            &["two lines for exclusive × 1 (repeat 1)"],
        ),
    ];
    for (what, twice, edit, wants) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        let run = copy_committed("20261127-h200-sweep-raw", dir.path());
        tamper_first_line(&run.join("windows.jsonl"), twice, edit);
        let o = bench_within(&["verify"], &run, 20);
        let mut wants = wants.to_vec();
        wants.push("windows.jsonl");
        assert_refused(&o, &wants);
        eprintln!("{what}: {}", stderr(&o).trim());
    }
    // A bucket bound below zero, or bounds out of order.
    let dir = tempfile::tempdir().expect("tempdir");
    let run = copy_committed("20261127-h200-sweep-raw", dir.path());
    let path = run.join("bucket-layouts.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
    v["layouts"][0][0] = (-1.0).into();
    std::fs::write(&path, v.to_string()).expect("write");
    assert_refused(
        &bench_within(&["verify"], &run, 20),
        &["bucket-layouts.json", "layout 0", "increasing"],
    );
    // No layouts at all: bad input, not "3 of 0 numbers differ".
    std::fs::remove_file(&path).expect("rm");
    assert_refused(
        &bench_within(&["verify"], &run, 20),
        &["bucket-layouts.json", "counts in layout 0, and the file is missing"],
    );
}

#[test]
fn tampered_requests_are_refused_naming_the_file_and_field() {
    type Edit = fn(&mut serde_json::Value);
    let cases: [(Edit, &[&str]); 3] = [
        (
            |v| v["request"]["e2e_s"] = 0.001.into(),
            &["e2e_s 0.001 is before its first token"],
        ),
        (|v| v["request"]["arrival_s"] = (-2.0).into(), &["arrival_s is -2"]),
        (
            |v| v["request"]["output_tokens"] = (1u64 << 40).into(),
            &["token count"],
        ),
    ];
    for (edit, wants) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        let run = copy_committed("20261128-h100-llm-itl-ours", dir.path());
        tamper_first_line(&run.join("requests.jsonl"), false, edit);
        let mut wants = wants.to_vec();
        wants.extend(["requests.jsonl", "line 1"]);
        assert_refused(&bench_within(&["verify"], &run, 20), &wants);
    }
}

#[test]
fn files_that_are_not_small_regular_files_are_refused_not_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = copy_committed("20261127-h200-sweep-raw", dir.path());
    // Raw windows of 2 GiB (a sparse file): refused by their size, not read.
    let f = std::fs::File::create(run.join("windows.jsonl")).expect("create");
    f.set_len(2 << 30).expect("sparse");
    let o = bench_within(&["verify"], &run, 20);
    assert_refused(&o, &["windows.jsonl", "2147483648 bytes, more than the 1073741824"]);
    // A FIFO with no writer as the config and as the lengths: refused at once.
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let o = bench_within(&["sweep", "--device", "cpu", "--config"], &fifo, 20);
    assert_refused(&o, &["fifo", "not a regular file (a FIFO)"]);
    let o = bench_within(
        &[
            "capacity",
            "--device",
            "cpu",
            "--workload-cmd",
            "true {port}",
            "--request",
            "http://127.0.0.1:{port}/v1/completions",
            "--stream",
            "completions",
            "--load",
            "poisson:1",
            "--slo",
            "ttft:p90=1s",
            "--lengths",
        ],
        Path::new("/dev/zero"),
        20,
    );
    assert_refused(&o, &["--lengths", "/dev/zero", "not a regular file (a device)"]);
}

#[test]
fn compare_of_runs_whose_cells_all_failed_is_refused_not_passed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = copy("h100-run", dir.path(), "all-failed");
    tamper_cells(&run, |_, v| {
        if v["status"] == "ok" {
            v["status"] = "failed".into();
        }
        true
    });
    let o = bench(&["compare"], &[&run, &run]);
    assert_refused(&o, &["measured none of its", "no change can be judged"]);
}

/// Copies the directory tree `from` to `to`.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("dir");
    for e in std::fs::read_dir(from).expect("dir") {
        let e = e.expect("entry");
        if e.file_type().expect("type").is_dir() {
            copy_tree(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
        }
    }
}

/// Rewrites a JSON file through `f`.
fn edit_json(path: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("json");
    f(&mut v);
    std::fs::write(path, serde_json::to_string_pretty(&v).expect("json")).expect("write");
}

fn committed(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../results").join(name)
}

#[test]
fn a_tampered_equal_load_run_is_refused_naming_the_part() {
    type Edit = fn(&Path);
    let cases: [(&str, Edit, &[&str]); 7] = [
        (
            "closed/ removed",
            |r| std::fs::remove_dir_all(r.join("closed")).expect("rm"),
            &["load-50pct/ is there but closed/ is not"],
        ),
        (
            "a level removed",
            |r| std::fs::remove_dir_all(r.join("load-50pct")).expect("rm"),
            &["load-90pct/ is there but load-50pct/ is not"],
        ),
        (
            "a level replaced by another",
            |r| {
                std::fs::remove_dir_all(r.join("load-90pct")).expect("rm");
                copy_tree(&r.join("load-50pct"), &r.join("load-90pct"));
            },
            &["load-90pct/run.json: run_id \"load-50pct\" is not \"load-90pct\""],
        ),
        (
            "a level replaced by a foreign run",
            |r| {
                std::fs::remove_dir_all(r.join("load-90pct")).expect("rm");
                copy_tree(&committed("20261127-h200-sweep-raw"), &r.join("load-90pct"));
                edit_json(&r.join("load-90pct/run.json"), |v| v["run_id"] = "load-90pct".into());
            },
            &["load-90pct/run.json: load"],
        ),
        (
            "base.per_s edited",
            |r| edit_json(&r.join("equal-load.json"), |v| v["base"]["per_s"] = 1000.0.into()),
            &["base is time-slicing × 1 at 1000/s"],
        ),
        (
            "base.strategy edited",
            |r| edit_json(&r.join("equal-load.json"), |v| v["base"]["strategy"] = "mps".into()),
            &["base is mps × 1", "closed/ measured time-slicing × 1"],
        ),
        (
            "options.pods edited",
            |r| edit_json(&r.join("equal-load.json"), |v| v["options"]["pods"] = "1,3".into()),
            &["options.pods is 1,3"],
        ),
    ];
    for (what, edit, wants) in cases {
        for cmd in ["verify", "report"] {
            let d = tempfile::tempdir().expect("tempdir");
            let run = d.path().join("eq");
            copy_tree(&committed("20261127-h200-equal-load"), &run);
            edit(&run);
            let o = bench_within(&[cmd], &run, 60);
            let mut wants = wants.to_vec();
            wants.push("equal-load.json");
            eprintln!("{what}, {cmd}: {}", stderr(&o).trim());
            assert_refused(&o, &wants);
        }
    }
    // Untouched, it verifies.
    let d = tempfile::tempdir().expect("tempdir");
    let run = d.path().join("eq");
    copy_tree(&committed("20261127-h200-equal-load"), &run);
    let o = bench_within(&["verify"], &run, 60);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn verify_names_an_edited_status_and_an_edited_csv() {
    // An aggregate row turned from ok to failed: its pods say ok.
    let dir = tempfile::tempdir().expect("tempdir");
    let run = copy_committed("20261127-h200-sweep-raw", dir.path());
    tamper_first_line(&run.join("cells.jsonl"), false, |v| {
        assert_eq!(v["pod"], "pod-0", "the first row is a pod's");
        v["status"] = "failed".into();
    });
    let o = bench_within(&["verify"], &run, 30);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("pod-0: status failed without a note saying why"), "{out}");
    assert!(
        out.contains("all pods: status is ok in cells.jsonl, failed from its pods' rows"),
        "{out}"
    );
    // A number of cells.csv edited by hand.
    let dir = tempfile::tempdir().expect("tempdir");
    let run = copy_committed("20261127-h200-sweep-raw", dir.path());
    let csv = std::fs::read_to_string(run.join("cells.csv")).expect("csv");
    let mut lines: Vec<String> = csv.lines().map(str::to_string).collect();
    let header: Vec<&str> = lines[0].split(',').collect();
    let col = header.iter().position(|h| *h == "throughput_per_s").expect("column");
    let mut fields: Vec<String> = lines[1].split(',').map(str::to_string).collect();
    fields[col] = "1234.5".into();
    lines[1] = fields.join(",");
    std::fs::write(run.join("cells.csv"), lines.join("\n") + "\n").expect("write");
    let o = bench_within(&["verify"], &run, 30);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("cells.csv line 2: throughput_per_s is \"1234.5\""),
        "{out}"
    );
}
