//! `gpushare-bench capacity` on the CPU with the `tiny` model and real processes: a
//! search that fits every count up to --max-pods, one that misses at the first count
//! and stops there, the report's capacity table and knee chart, the capacity export,
//! and the flags capacity refuses.

use std::path::Path;
use std::process::{Command, Output};

use gpushare_bench::results::store::{read_cells, read_run};

mod common;

const BENCH: &str = env!("CARGO_BIN_EXE_gpushare-bench");

fn capacity(out: &Path, run_id: &str, extra: &[&str]) -> Output {
    Command::new(BENCH)
        .args([
            "capacity",
            "--device",
            "cpu",
            "--quiet",
            "--warmup",
            "1s",
            "--window",
            "1s",
            "--strategies",
            "time-slicing",
            "--run-id",
            run_id,
        ])
        .arg("--out")
        .arg(out)
        .arg("--workload-bin")
        .arg(common::workload_beside(BENCH))
        .args(extra)
        .args(if extra.contains(&"--max-cell") {
            &[][..]
        } else {
            &["--max-cell", "4s"][..]
        })
        .output()
        .expect("run")
}

fn measured_counts(dir: &Path) -> Vec<u32> {
    let mut pods: Vec<u32> = read_cells(&dir.join("cells.jsonl"))
        .expect("cells")
        .iter()
        .filter(|c| c.is_aggregate())
        .map(|c| c.pods)
        .collect();
    pods.sort_unstable();
    pods
}

#[test]
fn a_search_measures_upwards_until_a_miss_and_reports_the_capacity() {
    let out = tempfile::tempdir().expect("tempdir");
    // 10 requests/s per pod and p90 within 5 s: both counts fit on two cores even while
    // other tests load them, shown at 95% confidence by the 29 or more requests, all
    // within, that each pod completes in the 6 s it may be measured (a p99 would need 299).
    let fits = capacity(
        out.path(),
        "fits",
        &[
            "--max-pods",
            "2",
            "--load",
            "poisson:10",
            "--slo",
            "p90=5s",
            "--max-cell",
            "6s",
        ],
    );
    let stdout = String::from_utf8_lossy(&fits.stdout);
    let stderr = String::from_utf8_lossy(&fits.stderr);
    assert_eq!(fits.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("Time-slicing: 2 pods fit; searched to 2"), "{stdout}");
    assert!(stderr.contains("CPU RUN"), "the CPU label must be loud: {stderr}");
    let dir = out.path().join("fits");
    assert_eq!(measured_counts(&dir), [1, 2]);
    let run = read_run(&dir.join("run.json")).expect("run.json");
    assert_eq!(run.kind.capacity().map(|c| c.max_pods), Some(2));
    assert_eq!(run.plan.pods, [1, 2]);

    // p99 within 1 µs: no request is that fast, so the first count misses clearly and
    // nothing more is measured.
    let misses = capacity(
        out.path(),
        "misses",
        &["--max-pods", "3", "--load", "poisson:20", "--slo", "p99=1us"],
    );
    let stdout = String::from_utf8_lossy(&misses.stdout);
    assert_eq!(
        misses.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&misses.stderr)
    );
    assert!(
        stdout.contains("Time-slicing: 0 pods fit; 1 misses: pod-0: 0.00% of ")
            && stdout.contains(" requests within 1us (needs 99%; 95% bounds 0.00%–"),
        "{stdout}"
    );
    assert_eq!(measured_counts(&out.path().join("misses")), [1]);

    // A finished search resumed measures nothing more; a sweep does not resume it.
    let again = Command::new(BENCH)
        .args(["capacity", "--quiet", "--resume", "misses", "--out"])
        .arg(out.path())
        .output()
        .expect("resume");
    let text = String::from_utf8_lossy(&again.stdout);
    assert_eq!(
        again.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert!(text.contains("Time-slicing: 0 pods fit; 1 misses"), "{text}");
    assert_eq!(measured_counts(&out.path().join("misses")), [1]);
    let wrong = common::cpu_sweep(BENCH, out.path(), &["--resume", "misses"])
        .output()
        .expect("sweep --resume");
    assert_eq!(wrong.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&wrong.stderr)
            .contains("a capacity run: continue it with `gpushare-bench capacity --resume`"),
        "{}",
        String::from_utf8_lossy(&wrong.stderr)
    );

    // The report leads with the capacity table and the knee chart.
    let reports = common::report(BENCH, &dir, &out.path().join("reports"));
    let md = std::fs::read_to_string(reports.join("summary.md")).expect("summary.md");
    let first_table = md
        .lines()
        .find(|l| l.starts_with("## ") && *l != "## The answer")
        .unwrap_or_default();
    assert!(
        md.contains("## The answer\n\n- Pods per GPU that meet p90=5s at 10 requests/s each"),
        "{md}"
    );
    assert!(
        first_table.starts_with("## Capacity: pods per GPU at 10 requests/s per pod, p90=5s"),
        "{first_table}"
    );
    assert!(md.contains("| Time-slicing | 2 | 20 |"), "{md}");
    assert!(md.contains("## SLO attainment, p90 (% of requests within 5s"), "{md}");
    let svg = std::fs::read_to_string(reports.join("capacity-knee.svg")).expect("knee chart");
    assert!(svg.contains("SLO p90=5s"), "the threshold line is labelled");
    let csv = std::fs::read_to_string(reports.join("capacity.csv")).expect("capacity.csv");
    assert!(
        csv.starts_with("run_id,strategy,offered_per_pod,slos,searched_to,pods_fit,"),
        "{csv}"
    );

    let export = Command::new(BENCH)
        .args(["export", "--format", "capacity"])
        .arg(&dir)
        .output()
        .expect("export");
    assert!(export.status.success());
    let text = String::from_utf8_lossy(&export.stdout);
    assert!(
        text.lines()
            .nth(1)
            .is_some_and(|l| l.contains("time-slicing,10,p90=5s,2,2,20,")),
        "{text}"
    );
}

#[test]
fn capacity_refuses_what_it_cannot_search_with_one_line() {
    let out = tempfile::tempdir().expect("tempdir");
    for (args, says) in [
        (
            vec!["--load", "poisson:20"],
            "capacity needs a latency objective, e.g. --slo p99=25ms",
        ),
        (vec!["--slo", "p99=5ms"], "capacity needs an open-loop load per pod"),
        (vec!["--load", "total:100", "--slo", "p99=5ms"], "give the rate per pod"),
        (
            vec!["--load", "poisson:20", "--slo", "p99=5ms", "--pods", "1,3"],
            "walks pod counts from 1 to --max-pods",
        ),
        (
            vec!["--load", "poisson:20", "--slo", "p99=5ms", "--max-pods", "0"],
            "bad --max-pods `0`",
        ),
        (
            vec!["--load", "poisson:20", "--slo", "p99=5ms", "--repeat", "2"],
            "a sweep option",
        ),
    ] {
        let o = capacity(out.path(), "refused", &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
    assert!(
        !out.path().join("refused").exists(),
        "nothing is created for refused flags"
    );
    let config = out.path().join("sweep.toml");
    // Sweep options in the file (pod counts, a precision target, a budget): refused as
    // the flags are.
    for (line, want) in [
        ("pods = \"1,3\"\n", "pods = 1,3: a sweep option"),
        ("target = \"1%\"\n", "target = 1%: a sweep option"),
        ("budget = \"10m\"\n", "budget = 10m: a sweep option"),
    ] {
        std::fs::write(&config, line).expect("config");
        let args = [
            "--load",
            "poisson:20",
            "--slo",
            "p99=5ms",
            "--config",
            config.to_str().expect("utf-8"),
        ];
        let o = capacity(out.path(), "refused", &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains(want), "{err}");
    }
    let sweep_run = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/h100-run");
    let o = Command::new(BENCH)
        .args(["export", "--format", "capacity"])
        .arg(&sweep_run)
        .output()
        .expect("export");
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a capacity run"));
}
