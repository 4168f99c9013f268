//! The runner driven by the scripted backend and metrics source in paused tokio time:
//! every edge case of the core loop in milliseconds, with exact expected numbers.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::backend::Session;
use crate::backend::fake::{FakeBackend, PodScript};
use crate::config::options::SweepOptions;
use crate::config::plan::SweepPlan;
use crate::domain::{CellStatus, DeviceKind, Strategy};
use crate::error::Result;
use crate::results::record::{CellRecord, Environment, RunRecord};
use crate::results::store::RunStore;
use crate::shutdown::Shutdown;
use crate::sweep::SweepOutcome;
use crate::sweep::progress::Progress;
use crate::sweep::runner::run_with_source;
use crate::telemetry::NoTelemetry;

/// warm-up 2 s, windows of 1 s, at most 10 s per cell, 3 windows must agree.
fn plan(dir: &std::path::Path, strategies: &str, pods: &str) -> SweepPlan {
    let o: SweepOptions = toml::from_str(&format!(
        "strategies = \"{strategies}\"\npods = \"{pods}\"\nwarmup = \"2s\"\nwindow = \"1s\"\nmax_cell = \"10s\"\nready_timeout = \"30s\"\ndevice = \"cpu\"\nrun_id = \"fake\"\nout = \"{}\"\n",
        dir.display()
    ))
    .expect("options");
    SweepPlan::from_options(o).expect("plan")
}

fn session(plan: &SweepPlan, backend: FakeBackend, resume: bool) -> Session<FakeBackend> {
    let store = if resume {
        RunStore::open(&plan.out, "fake").expect("reopen")
    } else {
        RunStore::create(
            &plan.out,
            RunRecord::new("fake".into(), plan, DeviceKind::Cpu, Environment::default()),
        )
        .expect("create")
    };
    Session {
        backend,
        settings: store.run().plan.measure_settings(plan.measure.ready_timeout),
        metrics: store.run().plan.prometheus_setting(),
        store,
        telemetry: Arc::new(NoTelemetry),
        notes: Vec::new(),
        keep_alive: Vec::new(),
    }
}

/// Progress that records finished cells and can ask for a stop after the n-th.
#[derive(Default)]
struct Recorder {
    done: Mutex<Vec<String>>,
    stop_after: Option<(usize, Shutdown)>,
    messages: Mutex<Vec<String>>,
}

impl Progress for Recorder {
    fn sweep_start(&self, _: u64, _: u64, _: &str) {}
    fn cell_start(&self, _: &str) {}
    fn phase(&self, _: &str) {}
    fn window(&self, _: usize, _: f64, _: f64, _: bool) {}
    fn cell_done(&self, summary: &str, _failed: bool) {
        let mut d = self.done.lock().expect("lock");
        d.push(summary.to_string());
        if let Some((n, s)) = &self.stop_after
            && d.len() == *n
        {
            s.request(libc::SIGINT);
        }
    }
    fn message(&self, m: &str) {
        self.messages.lock().expect("lock").push(m.to_string());
    }
    fn finish(&self) {}
}

async fn sweep(
    plan: &SweepPlan,
    backend: &FakeBackend,
    resume: bool,
    progress: &Recorder,
    shutdown: &Shutdown,
) -> Result<SweepOutcome> {
    let metrics = backend.metrics();
    run_with_source(session(plan, backend.clone(), resume), &metrics, progress, shutdown).await
}

fn cells(plan: &SweepPlan) -> Vec<CellRecord> {
    crate::results::store::read_cells(&plan.out.join("fake/cells.jsonl")).expect("cells")
}

fn state(plan: &SweepPlan) -> String {
    crate::results::store::read_run(&plan.out.join("fake/run.json"))
        .expect("run")
        .state
}

fn agg(rows: &[CellRecord], s: Strategy, pods: u32) -> CellRecord {
    rows.iter()
        .find(|r| r.strategy == s && r.pods == pods && r.is_aggregate())
        .cloned()
        .expect("aggregate row")
}

fn log(b: &FakeBackend) -> Vec<String> {
    b.calls.lock().expect("calls").log.clone()
}

#[tokio::test(start_paused = true)]
async fn steady_pods_give_exact_numbers_and_every_cell_is_stopped() {
    let tmp = tempfile::tempdir().expect("tmp");
    let plan = plan(tmp.path(), "time-slicing", "1,3");
    let b = FakeBackend::new(|_, n| (0..n).map(|_| PodScript::steady(100.0, 0.004)).collect());
    let out = sweep(&plan, &b, false, &Recorder::default(), &Shutdown::new())
        .await
        .expect("sweep");
    assert_eq!(out.cells_run, 2);
    let rows = cells(&plan);
    let three = agg(&rows, Strategy::TimeSlicing, 3);
    assert_eq!(three.status, CellStatus::Ok);
    assert_eq!(three.windows, Some(3), "identical windows: stable after the minimum");
    assert_eq!(three.throughput_per_s, Some(300.0));
    assert!(
        three.mean_s.is_some_and(|m| (m - 0.004).abs() < 1e-12),
        "{:?}",
        three.mean_s
    );
    assert_eq!(three.fairness, Some(1.0));
    assert_eq!(three.speedup_vs_1pod, Some(3.0));
    assert_eq!(rows.iter().filter(|r| r.pods == 3 && !r.is_aggregate()).count(), 3);
    assert_eq!(
        log(&b),
        [
            "prepare time-slicing",
            "launch time-slicing 1",
            "metrics for pod-0",
            "metrics released",
            "stop",
            "launch time-slicing 3",
            "metrics for pod-0,pod-1,pod-2",
            "metrics released",
            "stop",
            "restore"
        ]
    );
    assert_eq!(state(&plan), "complete");
    assert_eq!(b.running(), 0);
}

#[tokio::test(start_paused = true)]
async fn exit_4_is_oom_a_crash_is_failed_and_pending_pods_are_an_outcome() {
    let tmp = tempfile::tempdir().expect("tmp");
    let plan = plan(tmp.path(), "exclusive,time-slicing,mps", "3");
    let b = FakeBackend::new(|s, n| {
        (0..n)
            .map(|i| {
                let mut p = PodScript::steady(50.0, 0.003);
                match (s, i) {
                    // Exclusive: one pod gets the GPU, the others wait.
                    (Strategy::Exclusive, 1 | 2) => p.pending = Some("no free nvidia.com/gpu".into()),
                    // Out of GPU memory in the middle of the second window.
                    (Strategy::TimeSlicing, 2) => p.exit = Some((Duration::from_millis(4500), 4)),
                    (Strategy::Mps, 0) => p.exit = Some((Duration::from_millis(4500), 1)),
                    _ => {}
                }
                p
            })
            .collect()
    });
    sweep(&plan, &b, false, &Recorder::default(), &Shutdown::new())
        .await
        .expect("sweep");
    let rows = cells(&plan);
    let ex = agg(&rows, Strategy::Exclusive, 3);
    assert_eq!(ex.status, CellStatus::Ok);
    assert!(ex.note.contains("1 of 3 pods ran; 2 pending"), "{}", ex.note);
    assert_eq!(ex.throughput_per_s, Some(50.0));
    let ts = agg(&rows, Strategy::TimeSlicing, 3);
    assert_eq!(ts.status, CellStatus::Oom);
    let oom_pod = rows
        .iter()
        .find(|r| r.strategy == Strategy::TimeSlicing && r.pod == "pod-2")
        .expect("pod-2");
    assert_eq!((oom_pod.status, oom_pod.exit_code), (CellStatus::Oom, Some(4)));
    let mps = agg(&rows, Strategy::Mps, 3);
    assert_eq!(mps.status, CellStatus::Failed);
    assert!(mps.note.contains("pod-0 failed"), "{}", mps.note);
    assert_eq!(b.running(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_counter_reset_marks_the_pod_not_the_cell_numbers() {
    let tmp = tempfile::tempdir().expect("tmp");
    let plan = plan(tmp.path(), "time-slicing", "2");
    let b = FakeBackend::new(|_, n| {
        (0..n)
            .map(|i| {
                let mut p = PodScript::steady(100.0, 0.002);
                if i == 1 {
                    p.restart_at = Some(Duration::from_millis(4500));
                }
                p
            })
            .collect()
    });
    sweep(&plan, &b, false, &Recorder::default(), &Shutdown::new())
        .await
        .expect("sweep");
    let rows = cells(&plan);
    let reset = rows.iter().find(|r| r.pod == "pod-1").expect("pod-1");
    assert_eq!(reset.status, CellStatus::Failed);
    assert!(reset.note.contains("counters went back"), "{}", reset.note);
    let a = agg(&rows, Strategy::TimeSlicing, 2);
    assert_eq!(a.status, CellStatus::Failed);
}

/// Pods that turn ready only after 25 s (a stop comes first).
fn slow_to_ready() -> FakeBackend {
    FakeBackend::new(|_, n| {
        (0..n)
            .map(|_| PodScript {
                ready_after: Duration::from_secs(25),
                ..PodScript::steady(10.0, 0.001)
            })
            .collect()
    })
}

#[tokio::test(start_paused = true)]
async fn interrupt_during_readiness_stops_pods_and_keeps_the_run() {
    let tmp = tempfile::tempdir().expect("tmp");
    let plan = plan(tmp.path(), "time-slicing", "1");
    let b = slow_to_ready();
    let shutdown = Shutdown::new();
    let s = shutdown.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        s.request(libc::SIGTERM);
    });
    let t = tokio::time::Instant::now();
    let e = sweep(&plan, &b, false, &Recorder::default(), &shutdown)
        .await
        .expect_err("interrupted");
    assert_eq!(e.exit_code(), 143);
    assert!(t.elapsed() < Duration::from_secs(6), "the wait ended at the signal");
    assert_eq!(
        log(&b),
        ["prepare time-slicing", "launch time-slicing 1", "stop", "restore"]
    );
    assert!(cells(&plan).is_empty());
    assert_eq!(state(&plan), "interrupted");
}

/// A run.json that cannot be updated at the end (a full disk; here its temporary name
/// taken by a directory) neither hides the sweep's own error nor is lost: the exit is
/// the signal's, the failed update a message, and the run reads as unfinished.
#[tokio::test(start_paused = true)]
async fn a_run_record_that_cannot_be_updated_does_not_hide_the_sweeps_error() {
    let tmp = tempfile::tempdir().expect("tmp");
    let plan = plan(tmp.path(), "time-slicing", "1");
    let b = slow_to_ready();
    let shutdown = Shutdown::new();
    let s = shutdown.clone();
    let blocker = plan.out.join("fake/run.json.tmp");
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        std::fs::create_dir_all(blocker.join("full")).expect("block run.json's update");
        s.request(libc::SIGTERM);
    });
    let progress = Recorder::default();
    let e = sweep(&plan, &b, false, &progress, &shutdown)
        .await
        .expect_err("interrupted");
    assert_eq!(e.exit_code(), 143, "{e}");
    let messages = progress.messages.lock().expect("lock").clone();
    assert!(
        messages.iter().any(|m| m.starts_with("run.json still says running: ")),
        "{messages:?}"
    );
    assert_eq!(state(&plan), "running");
    assert!(log(&b).ends_with(&["stop".to_string(), "restore".to_string()]));
}

#[tokio::test(start_paused = true)]
async fn interrupt_mid_window_keeps_finished_cells_only() {
    let tmp = tempfile::tempdir().expect("tmp");
    let plan = plan(tmp.path(), "time-slicing", "1,2");
    let b = FakeBackend::new(|_, n| (0..n).map(|_| PodScript::steady(100.0, 0.004)).collect());
    let shutdown = Shutdown::new();
    let s = shutdown.clone();
    // Cell 1 ends at ~6 s (1 s ready, 2 s warm-up, 3 windows); cell 2 is mid-window at 11.5 s.
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(11_500)).await;
        s.request(libc::SIGINT);
    });
    let e = sweep(&plan, &b, false, &Recorder::default(), &shutdown)
        .await
        .expect_err("interrupted");
    assert_eq!(e.exit_code(), 130);
    let rows = cells(&plan);
    assert_eq!(
        rows.iter().filter(|r| r.is_aggregate()).count(),
        1,
        "only the finished cell"
    );
    assert_eq!(agg(&rows, Strategy::TimeSlicing, 1).status, CellStatus::Ok);
    assert_eq!(log(&b).last().map(String::as_str), Some("restore"));
    assert_eq!(b.running(), 0);
}

#[tokio::test(start_paused = true)]
async fn interrupt_between_cells_then_resume_measures_each_cell_once() {
    let tmp = tempfile::tempdir().expect("tmp");
    let plan = plan(tmp.path(), "exclusive,time-slicing", "1,3");
    let scripts = |_: Strategy, n: u32| (0..n).map(|_| PodScript::steady(80.0, 0.005)).collect();
    let b = FakeBackend::new(scripts).without(Strategy::Exclusive);
    let shutdown = Shutdown::new();
    // Exclusive is unavailable (2 cells of reasons); stop right after the next cell.
    let progress = Recorder {
        stop_after: Some((3, shutdown.clone())),
        ..Recorder::default()
    };
    let e = sweep(&plan, &b, false, &progress, &shutdown)
        .await
        .expect_err("interrupted");
    assert!(e.is_interrupt());
    assert_eq!(
        log(&b),
        [
            "prepare exclusive",
            "prepare time-slicing",
            "launch time-slicing 1",
            "metrics for pod-0",
            "metrics released",
            "stop",
            "restore"
        ],
        "nothing was launched after the signal"
    );
    let first = cells(&plan);
    assert_eq!(first.iter().filter(|r| r.is_aggregate()).count(), 3);

    let b2 = FakeBackend::new(scripts).without(Strategy::Exclusive);
    let out = sweep(&plan, &b2, true, &Recorder::default(), &Shutdown::new())
        .await
        .expect("resume");
    assert_eq!(out.cells_run, 1, "only the missing cell");
    assert_eq!(
        log(&b2),
        [
            "prepare time-slicing",
            "launch time-slicing 3",
            "metrics for pod-0,pod-1,pod-2",
            "metrics released",
            "stop",
            "restore"
        ]
    );
    let rows = cells(&plan);
    for (s, n) in [
        (Strategy::Exclusive, 1),
        (Strategy::Exclusive, 3),
        (Strategy::TimeSlicing, 1),
        (Strategy::TimeSlicing, 3),
    ] {
        assert_eq!(
            rows.iter()
                .filter(|r| r.strategy == s && r.pods == n && r.is_aggregate())
                .count(),
            1,
            "{s} × {n}"
        );
    }
    assert_eq!(agg(&rows, Strategy::Exclusive, 3).status, CellStatus::Unavailable);
    assert_eq!(
        agg(&rows, Strategy::TimeSlicing, 3).speedup_vs_1pod,
        Some(3.0),
        "baseline from the first run"
    );
    assert_eq!(state(&plan), "complete");
}

#[tokio::test(start_paused = true)]
async fn a_measured_cell_is_kept_when_its_pods_will_not_stop() {
    let tmp = tempfile::tempdir().expect("tmp");
    let plan = plan(tmp.path(), "time-slicing", "1,2");
    let b = FakeBackend::new(|_, n| (0..n).map(|_| PodScript::steady(100.0, 0.004)).collect()).failing_stop();
    let e = sweep(&plan, &b, false, &Recorder::default(), &Shutdown::new())
        .await
        .expect_err("the stop failure ends the sweep");
    assert!(e.to_string().contains("still exist"), "{e}");
    let rows = cells(&plan);
    assert_eq!(
        agg(&rows, Strategy::TimeSlicing, 1).status,
        CellStatus::Ok,
        "the measured cell is on disk"
    );
    assert_eq!(
        rows.iter().filter(|r| r.is_aggregate()).count(),
        1,
        "nothing launched after it"
    );
    assert_eq!(state(&plan), "failed");
    assert_eq!(log(&b).last().map(String::as_str), Some("restore"));
}

/// A plan with `--repeat`.
fn repeated(dir: &std::path::Path, strategies: &str, pods: &str, repeat: u32) -> SweepPlan {
    SweepPlan {
        repeat,
        ..plan(dir, strategies, pods)
    }
}

#[tokio::test(start_paused = true)]
async fn repeats_rotate_the_strategies_resume_midway_and_keep_their_own_baselines() {
    use std::sync::atomic::{AtomicU32, Ordering};
    let tmp = tempfile::tempdir().expect("tmp");
    let plan = repeated(tmp.path(), "exclusive,time-slicing,mps", "1,3", 3);
    // Every 1-pod launch makes pods faster from then on: a speed-up taken against
    // another repeat's 1-pod cell would not be exactly 3.
    let ones = Arc::new(AtomicU32::new(0));
    let scripts = {
        let ones = ones.clone();
        move |_: Strategy, n: u32| {
            let k = if n == 1 {
                ones.fetch_add(1, Ordering::SeqCst) + 1
            } else {
                ones.load(Ordering::SeqCst)
            };
            (0..n).map(|_| PodScript::steady(50.0 * f64::from(k), 0.004)).collect()
        }
    };
    let shutdown = Shutdown::new();
    let progress = Recorder {
        stop_after: Some((8, shutdown.clone())),
        ..Recorder::default()
    };
    let b = FakeBackend::new(scripts.clone());
    let e = sweep(&plan, &b, false, &progress, &shutdown)
        .await
        .expect_err("interrupted in repeat 2");
    assert!(e.is_interrupt());
    let prepared = |b: &FakeBackend| -> Vec<String> {
        log(b)
            .into_iter()
            .filter_map(|l| l.strip_prefix("prepare ").map(str::to_string))
            .collect()
    };
    // Repeat 1 in plan order, repeat 2 rotated by one; stopped after its
    // time-slicing × 3 cell (the 8th).
    assert_eq!(prepared(&b), ["exclusive", "time-slicing", "mps", "time-slicing"]);
    let first = cells(&plan);
    assert_eq!(first.iter().filter(|r| r.is_aggregate()).count(), 8);
    assert_eq!(state(&plan), "interrupted");

    let b2 = FakeBackend::new(scripts);
    let out = sweep(&plan, &b2, true, &Recorder::default(), &Shutdown::new())
        .await
        .expect("resume");
    assert_eq!(out.cells_run, 10, "18 cells, 8 on disk");
    // The rest of repeat 2 (mps, then exclusive), then repeat 3 rotated by two.
    assert_eq!(prepared(&b2), ["mps", "exclusive", "mps", "exclusive", "time-slicing"]);
    assert_eq!(
        log(&b2)
            .iter()
            .filter(|l| l.starts_with("launch"))
            .take(2)
            .cloned()
            .collect::<Vec<_>>(),
        ["launch mps 1", "launch mps 3"]
    );
    let rows = cells(&plan);
    for repeat in 1..=3 {
        for s in [Strategy::Exclusive, Strategy::TimeSlicing, Strategy::Mps] {
            let three: Vec<&CellRecord> = rows
                .iter()
                .filter(|r| r.repeat == repeat && r.strategy == s && r.pods == 3 && r.is_aggregate())
                .collect();
            assert_eq!(three.len(), 1, "{s} × 3, repeat {repeat}");
            assert_eq!(three[0].speedup_vs_1pod, Some(3.0), "{s} × 3, repeat {repeat}");
        }
    }
    assert_eq!(state(&plan), "complete");

    // The report combines the repeats: means with their interval.
    let data = crate::report::RunData::load(&plan.out.join("fake")).expect("load");
    let ts3 = data.aggregate(Strategy::TimeSlicing, 3).expect("cell");
    assert_eq!(ts3.repeat, crate::results::repeats::COMBINED);
    let i = data
        .interval(Strategy::TimeSlicing, 3, |r| r.throughput_per_s)
        .expect("interval");
    assert_eq!(i.n, 3);
    assert!((ts3.throughput_per_s.expect("throughput") - i.mean).abs() < 1e-9);
    assert!(i.half_width.is_some_and(|h| h > 0.0), "the repeats differ: {i:?}");
    let tables = crate::report::tables::all(&data);
    let tput = tables
        .tables
        .iter()
        .find(|t| t.title == "Aggregate throughput")
        .expect("table");
    assert!(
        tput.rows.iter().all(|(_, cells)| cells
            .iter()
            .all(|c| matches!(c, crate::report::tables::Cell::Value(v) if v.contains(" ± ")))),
        "{tput:?}"
    );
    assert!(tables.reading.iter().any(|r| r.contains("3 passes over the plan")));
}

#[tokio::test(start_paused = true)]
async fn each_pass_takes_its_speed_up_against_its_own_1_pod_cell() {
    use std::sync::atomic::{AtomicU32, Ordering};
    let tmp = tempfile::tempdir().expect("tmp");
    let plan = repeated(tmp.path(), "time-slicing", "1,2", 3);
    // Every launch serves faster than the one before: a 1-pod cell judged against an
    // earlier pass's reads above 1.
    let n = Arc::new(AtomicU32::new(0));
    let b = FakeBackend::new(move |_, pods| {
        let k = n.fetch_add(1, Ordering::SeqCst) + 1;
        (0..pods)
            .map(|_| PodScript::steady(50.0 * f64::from(k), 0.004))
            .collect()
    });
    sweep(&plan, &b, false, &Recorder::default(), &Shutdown::new())
        .await
        .expect("sweep");
    let rows = cells(&plan);
    for repeat in 1..=3 {
        let at = |p: u32| {
            rows.iter()
                .find(|r| r.is_aggregate() && r.repeat == repeat && r.pods == p)
                .expect("row")
        };
        assert_eq!(
            (at(1).speedup_vs_1pod, at(1).slowdown_vs_1pod),
            (Some(1.0), Some(1.0)),
            "pass {repeat}"
        );
        let want = at(2).throughput_per_s.zip(at(1).throughput_per_s).map(|(t, b)| t / b);
        assert_eq!(at(2).speedup_vs_1pod, want, "pass {repeat}");
    }
    let v = crate::report::verify::verify_dir(&plan.out.join("fake")).expect("verify");
    assert!(v.mismatches.is_empty(), "{:?}", v.mismatches);
}

#[tokio::test(start_paused = true)]
async fn a_precision_target_tries_a_failed_cell_again_and_names_it_when_not_within() {
    use std::sync::atomic::{AtomicU32, Ordering};
    let tmp = tempfile::tempdir().expect("tmp");
    let plan = targeted(tmp.path(), 2, "1%", None);
    // MPS × 2's first launch crashes mid-cell; every other launch serves steadily.
    let first = Arc::new(AtomicU32::new(0));
    let b = FakeBackend::new(move |s: Strategy, n: u32| {
        let crash = s == Strategy::Mps && n == 2 && first.fetch_add(1, Ordering::SeqCst) == 0;
        (0..n)
            .map(|_| PodScript {
                exit: crash.then_some((Duration::from_millis(4500), 1)),
                ..PodScript::steady(50.0, 0.004)
            })
            .collect()
    });
    let progress = Recorder::default();
    sweep(&plan, &b, false, &progress, &Shutdown::new())
        .await
        .expect("sweep");
    let last = progress
        .messages
        .lock()
        .expect("lock")
        .last()
        .cloned()
        .expect("a verdict");
    assert!(
        last.starts_with("not within ±1%: mps × 2 (fewer than two passes measured; 1 of 2 passes not ok)"),
        "{last}"
    );
    let rows = cells(&plan);
    let failed = rows
        .iter()
        .find(|r| r.is_aggregate() && r.strategy == Strategy::Mps && r.pods == 2 && r.repeat == 1)
        .expect("row");
    assert_ne!(failed.status, CellStatus::Ok);
}

/// A plan with `--target` (and `--budget`), at most `repeat` passes.
fn targeted(dir: &std::path::Path, repeat: u32, target: &str, budget: Option<&str>) -> SweepPlan {
    let mut p = repeated(dir, "time-slicing,mps", "1,2", repeat);
    p.target = Some(crate::config::plan::parse_target(target).expect("target"));
    p.budget = budget.map(|b| b.parse::<crate::config::values::Span>().expect("budget").duration);
    p
}

/// Every cell serves the same every pass, but MPS × 2, whose pods alternate between 50
/// and 60 requests/s from one pass to the next.
fn one_noisy_strategy() -> FakeBackend {
    use std::sync::atomic::{AtomicU32, Ordering};
    let launches: Arc<[AtomicU32; 3]> = Arc::new(Default::default());
    FakeBackend::new(move |s: Strategy, n: u32| {
        let rate = match s {
            Strategy::Mps if n == 2 => {
                let k = launches[n.min(2) as usize].fetch_add(1, Ordering::SeqCst);
                50.0 + 10.0 * f64::from(k % 2)
            }
            _ => 50.0,
        };
        (0..n).map(|_| PodScript::steady(rate, 0.004)).collect()
    })
}

#[tokio::test(start_paused = true)]
async fn a_precision_target_gives_passes_only_to_the_cells_still_wide_and_names_them() {
    let tmp = tempfile::tempdir().expect("tmp");
    let plan = targeted(tmp.path(), 4, "1%", None);
    let progress = Recorder::default();
    let out = sweep(&plan, &one_noisy_strategy(), false, &progress, &Shutdown::new())
        .await
        .expect("sweep");
    // Two passes of all four cells, then two more of MPS × 2, each with its own 1-pod
    // cell to take its speed-up against.
    assert_eq!(out.cells_run, 12);
    let rows = cells(&plan);
    let passes = |s: Strategy, p: u32| {
        rows.iter()
            .filter(|r| r.strategy == s && r.pods == p && r.is_aggregate())
            .count()
    };
    assert_eq!(
        [
            passes(Strategy::TimeSlicing, 1),
            passes(Strategy::TimeSlicing, 2),
            passes(Strategy::Mps, 1),
            passes(Strategy::Mps, 2)
        ],
        [2, 2, 4, 4]
    );
    // Every pass's speed-ups are against its own 1-pod cell: 1 pod is 1, 2 pods the
    // ratio to that pass's 1 pod.
    for r in rows.iter().filter(|r| r.is_aggregate() && r.strategy == Strategy::Mps) {
        let base = rows
            .iter()
            .find(|b| b.is_aggregate() && b.strategy == Strategy::Mps && b.pods == 1 && b.repeat == r.repeat)
            .expect("the pass's 1-pod cell");
        let want = r.throughput_per_s.zip(base.throughput_per_s).map(|(t, b)| t / b);
        assert_eq!(r.speedup_vs_1pod, want, "{} pods, pass {}", r.pods, r.repeat);
    }
    let messages = progress.messages.lock().expect("lock").clone();
    assert!(
        messages
            .iter()
            .any(|m| m == "pass 3 (at most 4): 1 cell wider than ±1%"),
        "{messages:?}"
    );
    let last = messages.last().expect("a verdict");
    assert!(last.starts_with("not within ±1%: mps × 2 (±"), "{last}");
    assert!(!last.contains("time-slicing") && !last.contains("mps × 1"), "{last}");
    assert_eq!(state(&plan), "complete");
    let run = crate::results::store::read_run(&plan.out.join("fake/run.json")).expect("run");
    assert_eq!((run.plan.target, run.plan.repeat), (Some(0.01), 4));
}

#[tokio::test(start_paused = true)]
async fn a_budget_stops_the_sweep_before_the_next_cell() {
    let tmp = tempfile::tempdir().expect("tmp");
    // A cell takes at least its 2 s warm-up and three 1 s windows.
    let plan = targeted(tmp.path(), 4, "1%", Some("8s"));
    let progress = Recorder::default();
    let out = sweep(&plan, &one_noisy_strategy(), false, &progress, &Shutdown::new())
        .await
        .expect("sweep");
    assert!((1..4).contains(&out.cells_run), "{}", out.cells_run);
    let messages = progress.messages.lock().expect("lock").clone();
    assert!(
        messages
            .iter()
            .any(|m| m == "the budget of 8 s is spent: no further cell"),
        "{messages:?}"
    );
    assert!(
        messages.last().is_some_and(|m| m.starts_with("not within ±1%")),
        "{messages:?}"
    );
    // A resume (its budget counted again from the resume) goes on where the budget
    // stopped: the cells not yet measured twice, then MPS × 2's further passes.
    let first = out.cells_run;
    let more = Recorder::default();
    let resumed = sweep(&plan, &one_noisy_strategy(), true, &more, &Shutdown::new())
        .await
        .expect("resume");
    assert!(resumed.cells_run >= 1, "{}", resumed.cells_run);
    let rows = cells(&plan);
    assert_eq!(
        rows.iter().filter(|r| r.is_aggregate()).count(),
        first + resumed.cells_run,
        "no cell measured twice in one pass"
    );
    assert_eq!(state(&plan), "complete");
}

/// A capacity run of `strategies` at 100 requests/s per pod, p99 ≤ `slo`, up to 5 pods.
fn capacity_plan(dir: &std::path::Path, strategies: &str, slo: &str) -> SweepPlan {
    let mut p = plan(dir, strategies, "1");
    p.load = crate::config::values::Load::PerPod(100.0);
    p.slos = vec![slo.parse().expect("slo")];
    p.pods = (1..=5).collect();
    p.kind = crate::config::plan::RunKind::Capacity(crate::config::plan::CapacityPlan { max_pods: 5 });
    p
}

async fn capacity(
    plan: &SweepPlan,
    backend: &FakeBackend,
    resume: bool,
    progress: &Recorder,
    shutdown: &Shutdown,
) -> Result<usize> {
    let metrics = backend.metrics();
    let session = session(plan, backend.clone(), resume);
    let search = &mut crate::capacity::command::Search;
    crate::sweep::runner::run_work_with_source(session, search, &metrics, progress, shutdown)
        .await
        .map(|f| f.ran)
}

/// Every pod serves its 100/s; latency grows 1.5 ms per pod (time-slicing) or 1 ms
/// (MPS), so with the scripted buckets (…, 2, 5, 10 ms) p99 ≤ 5 ms holds up to 3 pods
/// under time-slicing (4.5 ms) and to the limit under MPS.
fn growing() -> FakeBackend {
    FakeBackend::new(|s, n| {
        let per_pod = if s == Strategy::Mps { 0.001 } else { 0.0015 };
        (0..n)
            .map(|_| PodScript::steady(100.0, per_pod * f64::from(n)))
            .collect()
    })
    .without(Strategy::Mig)
}

#[tokio::test(start_paused = true)]
async fn capacity_walks_up_to_the_first_miss_and_resume_replays_the_search_from_disk() {
    let tmp = tempfile::tempdir().expect("tmp");
    let plan = capacity_plan(tmp.path(), "exclusive,time-slicing,mps,mig", "p99=5ms");
    let b = growing();
    // Stopped after three cells: exclusive × 1, time-slicing × 1 and × 2.
    let shutdown = Shutdown::new();
    let progress = Recorder {
        stop_after: Some((3, shutdown.clone())),
        ..Recorder::default()
    };
    let err = capacity(&plan, &b, false, &progress, &shutdown)
        .await
        .expect_err("stopped");
    assert!(err.is_interrupt(), "{err}");
    assert_eq!(cells(&plan).iter().filter(|c| c.is_aggregate()).count(), 3);

    let ran = capacity(&plan, &b, true, &Recorder::default(), &Shutdown::new())
        .await
        .expect("resumed");
    // time-slicing × 3 and × 4 (the miss), MPS × 1 to 5, MIG × 1 (unavailable).
    assert_eq!(ran, 8);
    let launches: Vec<String> = log(&b).into_iter().filter(|l| l.starts_with("launch")).collect();
    assert_eq!(
        launches,
        [
            "launch exclusive 1 --load poisson:100",
            "launch time-slicing 1 --load poisson:100",
            "launch time-slicing 2 --load poisson:100",
            "launch time-slicing 3 --load poisson:100",
            "launch time-slicing 4 --load poisson:100",
            "launch mps 1 --load poisson:100",
            "launch mps 2 --load poisson:100",
            "launch mps 3 --load poisson:100",
            "launch mps 4 --load poisson:100",
            "launch mps 5 --load poisson:100",
        ],
        "nothing measured twice, nothing past a miss"
    );
    let run = crate::results::store::read_run(&plan.out.join("fake/run.json")).expect("run");
    let table = crate::capacity::record::records(&run, &cells(&plan));
    let fit: Vec<(Strategy, Option<u32>, Option<u32>)> = table
        .iter()
        .map(|r| (r.strategy, r.pods_fit, r.first_miss_pods))
        .collect();
    assert_eq!(
        fit,
        [
            (Strategy::Exclusive, Some(1), None),
            (Strategy::TimeSlicing, Some(3), Some(4)),
            (Strategy::Mps, Some(5), None),
            (Strategy::Mig, None, None),
        ]
    );
    let ts = &table[1];
    assert_eq!(ts.walk, "1 fits, 2 fits, 3 fits, 4 misses");
    assert_eq!(
        ts.first_miss,
        "misses: 4 of 4 pods miss, the worst pod-0: 0.00% of 300 requests within 5ms (needs 99%; 95% bounds 0.00%–0.99%)"
    );
    assert_eq!((ts.offered_per_s, ts.goodput_per_s), (Some(300.0), Some(300.0)));
    assert!(table.iter().all(|r| r.finished));
    // Every measured cell, resumed or not, kept its windows; its rows recompute from them.
    let v = crate::report::verify::verify_dir(&plan.out.join("fake")).expect("verify");
    assert_eq!((v.cells, v.mismatches.len()), (10, 0), "{:?}", v.mismatches);
    assert_eq!(state(&plan), "complete");
    assert_eq!(b.running(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_threshold_inside_a_bucket_is_marginal_and_two_marginal_misses_end_the_walk() {
    let tmp = tempfile::tempdir().expect("tmp");
    // 8 ms lies inside the (5, 10] ms bucket that holds every request from 4 pods on.
    let plan = capacity_plan(tmp.path(), "time-slicing", "p99=8ms");
    let b = growing();
    capacity(&plan, &b, false, &Recorder::default(), &Shutdown::new())
        .await
        .expect("capacity");
    let run = crate::results::store::read_run(&plan.out.join("fake/run.json")).expect("run");
    let table = crate::capacity::record::records(&run, &cells(&plan));
    assert_eq!(table[0].walk, "1 fits, 2 fits, 3 fits, 4 marginal, 5 marginal");
    assert_eq!(table[0].pods_fit, Some(3));
    // An undecided cell runs on to --max-cell (10 s here, 1,000 requests a pod), where
    // the 3 s of a decided one gave 300; its pods' rows say why.
    let four: Vec<CellRecord> = cells(&plan).into_iter().filter(|c| c.pods == 4 && c.is_pod()).collect();
    assert!(four.iter().all(|c| c.inferences == Some(1000)), "{four:#?}");
    assert!(
        four.iter()
            .all(|c| c.note.contains("p99=8ms undecided at 95% after 1000 requests")),
        "{four:#?}"
    );
    assert!(
        table[0].first_miss.starts_with(
            "marginal: pod-0: 60.00% of 1000 requests within 8ms (needs 99%; 95% bounds 0.00%–100.00%); pod-1"
        ),
        "{}",
        table[0].first_miss
    );
}

/// A sweep over two fake GPUs, 0 and 3, through `sweep::lanes` (lanes in paused time).
async fn sweep_on_two_gpus(
    plan: &SweepPlan,
    gpu0: &FakeBackend,
    gpu3: &FakeBackend,
    resume: bool,
    progress: &Recorder,
    shutdown: &Shutdown,
) -> Result<SweepOutcome> {
    use crate::sweep::lanes::{LaneSettings, run};
    let session = session(plan, gpu0.clone(), resume);
    let more = vec![crate::backend::Lane {
        gpu: 3,
        backend: gpu3.clone(),
        telemetry: Arc::new(NoTelemetry),
    }];
    let settings = LaneSettings {
        measure: session.settings,
        source: |b: &FakeBackend, _: &crate::results::record::PlanRecord| Ok(b.metrics()),
        paused: true,
    };
    run(session, 0, more, settings, progress, shutdown).await
}

fn two_gpu_plan(dir: &std::path::Path, strategies: &str) -> SweepPlan {
    use crate::telemetry::inventory::GpuSelector;
    let mut plan = plan(dir, strategies, "1,3");
    plan.local_mut().gpus = vec![GpuSelector::Index(0), GpuSelector::Index(3)];
    plan
}

fn steady(_: Strategy, n: u32) -> Vec<PodScript> {
    (0..n).map(|_| PodScript::steady(100.0, 0.004)).collect()
}

#[tokio::test(start_paused = true)]
async fn two_gpus_measure_their_own_strategies_and_every_cell_once() {
    let tmp = tempfile::tempdir().expect("tmp");
    let plan = two_gpu_plan(tmp.path(), "exclusive,time-slicing,mps");
    let (gpu0, gpu3) = (FakeBackend::new(steady), FakeBackend::new(steady));
    let out = sweep_on_two_gpus(&plan, &gpu0, &gpu3, false, &Recorder::default(), &Shutdown::new())
        .await
        .expect("sweep");
    assert_eq!((out.cells_run, out.measured, out.failed), (6, 6, 0));
    let rows = cells(&plan);
    assert_eq!(rows.iter().filter(|r| r.is_aggregate()).count(), 6, "every cell once");
    // Two cells each: exclusive and MPS on GPU 0, time-slicing on GPU 3.
    for r in &rows {
        let want = if r.strategy == Strategy::TimeSlicing { 3 } else { 0 };
        assert_eq!(r.gpu, Some(want), "{} × {} {}", r.strategy, r.pods, r.pod);
        if r.is_aggregate() {
            assert!(
                r.other_gpus_busy.is_some_and(|b| (0.0..=1.0).contains(&b)),
                "{:?}",
                r.other_gpus_busy
            );
        } else {
            assert_eq!(r.other_gpus_busy, None, "per-pod rows leave it empty");
        }
    }
    let three = agg(&rows, Strategy::TimeSlicing, 3);
    assert_eq!(
        (three.throughput_per_s, three.speedup_vs_1pod),
        (Some(300.0), Some(3.0))
    );
    // Each GPU's backend launched only its own strategies and was restored.
    let launches =
        |b: &FakeBackend| -> Vec<String> { log(b).into_iter().filter(|l| l.starts_with("launch")).collect() };
    let g3 = launches(&gpu3);
    assert_eq!(g3[..2], ["launch time-slicing 1", "launch time-slicing 3"]);
    let g0 = launches(&gpu0);
    assert_eq!(
        g0[..4],
        [
            "launch exclusive 1",
            "launch exclusive 3",
            "launch mps 1",
            "launch mps 3"
        ]
    );
    assert!(log(&gpu3).contains(&"restore".to_string()) && log(&gpu0).contains(&"restore".to_string()));
    assert_eq!(gpu0.running() + gpu3.running(), 0);
    // The cell beside the most others measured again alone, on its GPU (when any cell
    // overlapped another GPU's in real time; the next test makes sure of one).
    let store = crate::results::store::read_alone(&plan.out.join("fake"), &read_plan(&plan)).expect("alone");
    match crate::sweep::lanes::check_cell(&rows) {
        Some(c) => {
            let a: Vec<&CellRecord> = store.iter().filter(|r| r.is_aggregate()).collect();
            assert_eq!(a.len(), 1);
            assert_eq!((a[0].arm(), a[0].pods, a[0].gpu), (c.arm(), c.pods, c.gpu));
            assert_eq!(a[0].other_gpus_busy, Some(0.0));
            assert_eq!(g0.len() + g3.len(), 7, "six cells and the one again");
        }
        None => assert!(store.is_empty()),
    }
    assert_eq!(state(&plan), "complete");
}

fn read_plan(plan: &SweepPlan) -> crate::results::record::PlanRecord {
    crate::results::store::read_run(&plan.out.join("fake/run.json"))
        .expect("run")
        .plan
}

#[tokio::test(start_paused = true)]
async fn a_resumed_two_gpu_run_keeps_strategies_on_their_gpus_and_measures_the_check_alone() {
    let tmp = tempfile::tempdir().expect("tmp");
    let plan = two_gpu_plan(tmp.path(), "exclusive,time-slicing,mps");
    let (gpu0, gpu3) = (FakeBackend::new(steady), FakeBackend::new(steady));
    let shutdown = Shutdown::new();
    let stop = Recorder {
        stop_after: Some((2, shutdown.clone())),
        ..Recorder::default()
    };
    let e = sweep_on_two_gpus(&plan, &gpu0, &gpu3, false, &stop, &shutdown)
        .await
        .expect_err("interrupted");
    assert!(e.is_interrupt(), "{e}");
    assert_eq!(state(&plan), "interrupted");
    let before = cells(&plan);
    let saved = before.iter().filter(|r| r.is_aggregate()).count();
    assert!(
        (2..6).contains(&saved),
        "{saved} cells saved before the stop took effect"
    );
    // Make the saved cells say they ran beside the other GPU, and time-slicing on GPU 0
    // (where a fresh plan would not put it): the resume must follow the rows.
    let mut rows = before.clone();
    for r in &mut rows {
        r.gpu = Some(if r.strategy == Strategy::TimeSlicing { 0 } else { 3 });
        if r.is_aggregate() {
            r.other_gpus_busy = Some(if r.strategy == Strategy::TimeSlicing { 0.6 } else { 0.2 });
        }
    }
    std::fs::write(
        plan.out.join("fake/cells.jsonl"),
        crate::results::record::cells_jsonl(&rows),
    )
    .expect("rewrite");
    let (gpu0, gpu3) = (FakeBackend::new(steady), FakeBackend::new(steady));
    let out = sweep_on_two_gpus(&plan, &gpu0, &gpu3, true, &Recorder::default(), &Shutdown::new())
        .await
        .expect("resumed");
    assert_eq!(out.cells_run, 6 - saved);
    let rows = cells(&plan);
    assert_eq!(rows.iter().filter(|r| r.is_aggregate()).count(), 6);
    let gpu_of = |s: Strategy| -> Vec<Option<u32>> {
        let mut g: Vec<_> = rows.iter().filter(|r| r.strategy == s).map(|r| r.gpu).collect();
        g.dedup();
        g
    };
    for s in [Strategy::Exclusive, Strategy::TimeSlicing, Strategy::Mps] {
        assert_eq!(gpu_of(s).len(), 1, "{s}: {:?}", gpu_of(s));
    }
    if before.iter().any(|r| r.strategy == Strategy::TimeSlicing) {
        assert_eq!(gpu_of(Strategy::TimeSlicing), [Some(0)], "kept where its rows are");
    }
    // The time-slicing 3-pod cell (beside 0.6) or another saved cell is the one measured
    // again: whichever check_cell picks from the rows, once, on its GPU.
    let check = crate::sweep::lanes::check_cell(&rows)
        .cloned()
        .expect("a saved cell ran beside the other GPU");
    let alone = crate::results::store::read_alone(&plan.out.join("fake"), &read_plan(&plan)).expect("alone");
    let a: Vec<&CellRecord> = alone.iter().filter(|r| r.is_aggregate()).collect();
    assert_eq!(a.len(), 1);
    assert_eq!((a[0].arm(), a[0].pods, a[0].gpu), (check.arm(), check.pods, check.gpu));
    // Every scripted pod serves 100/s, alone as beside the others.
    assert_eq!(a[0].throughput_per_s, Some(f64::from(check.pods) * 100.0));
    let on = if check.gpu == Some(0) { &gpu0 } else { &gpu3 };
    let last_launch = log(on)
        .into_iter()
        .rev()
        .find(|l| l.starts_with("launch"))
        .expect("launch");
    assert_eq!(last_launch, format!("launch {} {}", check.strategy.name(), check.pods));
    // The report sets the two side by side and names each strategy's GPU.
    let data = crate::report::RunData::load(&plan.out.join("fake")).expect("load");
    let t = crate::report::tables::all(&data);
    assert!(
        t.reading
            .iter()
            .any(|r| r.contains("The cells ran on 2 GPUs at once (--gpus)")),
        "{:?}",
        t.reading
    );
    assert!(
        t.reading
            .iter()
            .any(|r| r.starts_with("Beside the other GPUs and alone: ")),
        "{:?}",
        t.reading
    );
    assert!(
        t.warnings.is_empty(),
        "identical scripts: no change beyond the noise: {:?}",
        t.warnings
    );
    // A second resume has nothing left: the check is not measured twice.
    let out = sweep_on_two_gpus(&plan, &gpu0, &gpu3, true, &Recorder::default(), &Shutdown::new())
        .await
        .expect("nothing left");
    assert_eq!(out.cells_run, 0);
    let again = crate::results::store::read_alone(&plan.out.join("fake"), &read_plan(&plan)).expect("alone");
    assert_eq!(again.len(), alone.len());
}

#[test]
fn a_cell_counts_the_other_gpus_busy_beside_it() {
    use crate::sweep::runner::others_busy;
    // Alone, fully beside one, half beside another and a quarter beside a third.
    assert_eq!(others_busy((0.0, 10.0), &[]), Some(0.0));
    assert_eq!(others_busy((0.0, 10.0), &[(-5.0, 20.0)]), Some(1.0));
    let v = others_busy((0.0, 10.0), &[(5.0, 30.0), (-1.0, 2.5), (12.0, 14.0)]).expect("v");
    assert!((v - 0.75).abs() < 1e-12, "{v}");
    assert_eq!(others_busy((3.0, 3.0), &[(0.0, 9.0)]), None);
}

#[tokio::test(start_paused = true)]
async fn a_pod_whose_backlog_grows_fell_behind_whatever_its_rate_and_verify_rechecks_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut plan = plan(tmp.path(), "time-slicing", "2");
    plan.load = crate::config::values::Load::PerPod(100.0);
    // Both serve their 100/s; pod-1's queue grows by 20 requests a second all the same
    // (as a server whose rate counts requests it accepts but cannot finish would).
    let b = FakeBackend::new(|_, n| {
        (0..n)
            .map(|i| PodScript {
                backlog: Some(if i == 1 { (5.0, 20.0) } else { (3.0, 0.0) }),
                ..PodScript::steady(100.0, 0.001)
            })
            .collect()
    });
    sweep(&plan, &b, false, &Recorder::default(), &Shutdown::new())
        .await
        .expect("sweep");
    let rows = cells(&plan);
    let pod = |name: &str| rows.iter().find(|c| c.pod == name).expect("pod row");
    assert_eq!(pod("pod-0").backlog_growth, Some(0.0));
    assert!(!pod("pod-0").note.contains("keep up"), "{:?}", pod("pod-0"));
    let behind = pod("pod-1");
    let growth = behind.backlog_growth.expect("growth");
    let secs = behind.duration_s.expect("duration");
    assert!((growth - 20.0 * secs).abs() < 1e-6, "{growth} over {secs} s");
    assert!(
        // 5 at ready, 45 after the 2-s warm-up, 20 more a second while measured.
        behind.note.contains("its backlog grew from 45 to 105 requests") && behind.note.contains("could not keep up"),
        "{behind:?}"
    );
    assert_eq!(behind.slo_met, None, "no attainment for a pod that fell behind");
    let agg = rows.iter().find(|c| c.is_aggregate()).expect("aggregate");
    assert!(agg.flags().iter().any(|f| f.contains("could not keep up")), "{agg:?}");
    // The windows hold the backlog, and verify reaches the same judgement from them.
    let v = crate::report::verify::verify_dir(&plan.out.join("fake")).expect("verify");
    assert!(v.mismatches.is_empty(), "{:?}", v.mismatches);
    let raw = crate::results::raw::read_raw(&plan.out.join("fake")).expect("windows");
    let series = raw[0].series.iter().find(|s| s.pod == "pod-1").expect("pod-1 windows");
    assert_eq!(series.backlog().len(), series.windows.len() + 1);
}

/// A stream of NVML readings played back, one a reading, the last one again once the
/// stream has run out.
struct Replayed {
    samples: Vec<crate::telemetry::GpuSample>,
    next: Mutex<usize>,
}

impl crate::telemetry::Telemetry for Replayed {
    fn sample(&self) -> Option<crate::telemetry::GpuSample> {
        let mut i = self.next.lock().expect("lock");
        let s = self.samples.get((*i).min(self.samples.len().checked_sub(1)?)).copied();
        *i += 1;
        s
    }
}

/// A stream of NVML readings recorded by the sampler through a busy cell: MPS × 6 pods
/// on an H200 at 125 requests/s each (568–613 W, SM clock 1,980 MHz, memory 3,201 MHz,
/// 54–57 °C, no clock event reason), as `windows.jsonl` of
/// `results/20261127-h200-capacity-mps-threads` keeps it.
fn recorded_gpu_samples() -> Vec<crate::telemetry::GpuSample> {
    #[derive(serde::Deserialize)]
    struct Fixture {
        samples: Vec<crate::telemetry::GpuSample>,
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nvml/h200-mps-6-pods.json");
    let text = std::fs::read_to_string(&path).expect("fixture");
    let f: Fixture = serde_json::from_str(&text).expect("samples");
    assert!(f.samples.len() >= 10, "a stream through a whole cell");
    f.samples
}

#[tokio::test(start_paused = true)]
async fn a_cell_measured_while_the_gpu_slowed_itself_is_flagged_and_its_samples_recheck() {
    let busy = recorded_gpu_samples();
    assert!(
        busy.iter().all(|s| s.clock_reasons == Some(0)),
        "the recorded GPU never slowed"
    );
    // The same recorded stream with NVML's hardware thermal slowdown (0x40) set in the
    // second and third samples and the SM clock cut to 1,000 MHz there, as a hot GPU
    // shows: no GPU of the reference runs slowed itself, so the slowdown is planted.
    let mut hot = busy.clone();
    for s in &mut hot[1..3] {
        s.clock_reasons = s.clock_reasons.map(|r| r | 0x40);
        s.sm_clock_mhz = Some(1000.0);
    }
    let mut rows_of = Vec::new();
    for (samples, name) in [(busy.clone(), "busy"), (hot, "thermal slowdown")] {
        let tmp = tempfile::tempdir().expect("tmp");
        let plan = plan(tmp.path(), "mps", "1");
        let b = FakeBackend::new(|_, n| (0..n).map(|_| PodScript::steady(100.0, 0.004)).collect());
        let mut s = session(&plan, b.clone(), false);
        s.telemetry = Arc::new(Replayed {
            samples,
            next: Mutex::new(0),
        });
        run_with_source(s, &b.metrics(), &Recorder::default(), &Shutdown::new())
            .await
            .expect("sweep");
        let rows = cells(&plan);
        let one = agg(&rows, Strategy::Mps, 1);
        // The samples are kept beside the windows, and every GPU column recomputes.
        let raw = crate::results::raw::read_raw(&plan.out.join("fake")).expect("raw");
        // One at the start, one a second of the 3 s measured, one at the end.
        assert!(raw[0].gpu_samples.len() >= 4, "{name}: {:?}", raw[0].gpu_samples);
        assert!(raw[0].gpu_samples.windows(2).all(|w| w[0].at_s <= w[1].at_s));
        let v = crate::report::verify::verify_dir(&plan.out.join("fake")).expect("verify");
        assert!(v.mismatches.is_empty(), "{name}: {:?}", v.mismatches);
        let data = crate::report::RunData::load(&plan.out.join("fake")).expect("run data");
        rows_of.push((one, data.flags(Strategy::Mps, 1)));
    }
    let (cool, cool_flags) = &rows_of[0];
    assert_eq!(cool.clock_slowdown.as_deref(), Some("none"));
    assert_eq!(cool.throttled_share, Some(0.0));
    assert!(cool_flags.is_empty(), "{cool_flags:?}");
    assert!(cool.sm_clock_mhz.is_some() && cool.temp_max_c.is_some() && cool.mem_clock_mhz.is_some());
    let (hot, hot_flags) = &rows_of[1];
    let slowdown = hot.clock_slowdown.as_deref().expect("read");
    assert!(slowdown.starts_with("hardware thermal slowdown in 2 of "), "{slowdown}");
    assert!(hot.throttled_share.is_some_and(|s| s > 0.0));
    assert_eq!(hot.sm_clock_min_mhz, Some(1000.0));
    assert!(hot.sm_clock_mhz < cool.sm_clock_mhz);
    assert_eq!(hot_flags, &[format!("throttled: {slowdown}")]);
}

#[tokio::test(start_paused = true)]
async fn verify_names_a_gpu_column_that_its_samples_do_not_give() {
    let tmp = tempfile::tempdir().expect("tmp");
    let plan = plan(tmp.path(), "mps", "1");
    let b = FakeBackend::new(|_, n| (0..n).map(|_| PodScript::steady(100.0, 0.004)).collect());
    let mut s = session(&plan, b.clone(), false);
    s.telemetry = Arc::new(Replayed {
        samples: recorded_gpu_samples(),
        next: Mutex::new(0),
    });
    run_with_source(s, &b.metrics(), &Recorder::default(), &Shutdown::new())
        .await
        .expect("sweep");
    let path = plan.out.join("fake/cells.jsonl");
    let text = std::fs::read_to_string(&path).expect("cells");
    let mut lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).expect("row")).collect();
    let agg = lines.iter_mut().find(|r| r["pod"] == "all").expect("aggregate");
    agg["temp_max_c"] = serde_json::json!(20.0);
    agg["clock_slowdown"] = serde_json::json!("hardware slowdown in 1 of 9 samples");
    let edited: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    std::fs::write(&path, edited.join("\n") + "\n").expect("write");
    let v = crate::report::verify::verify_dir(&plan.out.join("fake")).expect("verify");
    // Both against the samples, and cells.csv (left as the sweep wrote it) against the
    // edited rows.
    assert_eq!(v.mismatches.len(), 4, "{:?}", v.mismatches);
    assert!(
        v.mismatches[0].contains("temp_max_c is 20 in cells.jsonl"),
        "{:?}",
        v.mismatches
    );
    assert!(v.mismatches[1].contains("clock_slowdown"), "{:?}", v.mismatches);
    assert!(
        v.mismatches[2..].iter().all(|m| m.starts_with("cells.csv line 3: ")),
        "{:?}",
        v.mismatches
    );
}

#[tokio::test(start_paused = true)]
async fn each_mps_limit_is_an_arm_with_its_own_rows_baseline_and_report_rows() {
    let tmp = tempfile::tempdir().expect("tmp");
    let o: SweepOptions = toml::from_str(&format!(
        "strategies = \"time-slicing,mps\"\npods = \"1,2\"\nmps_threads = \"auto,100\"\nmps_memory = \"none\"\nwarmup = \"2s\"\nwindow = \"1s\"\nmax_cell = \"10s\"\nready_timeout = \"30s\"\ndevice = \"cpu\"\nrun_id = \"fake\"\nout = \"{}\"\n",
        tmp.path().display()
    ))
    .expect("options");
    let plan = SweepPlan::from_options(o).expect("plan");
    let b = FakeBackend::new(|s, n| {
        let ms = if s == Strategy::Mps { 0.003 } else { 0.004 };
        (0..n).map(|_| PodScript::steady(100.0, ms)).collect()
    });
    let out = sweep(&plan, &b, false, &Recorder::default(), &Shutdown::new())
        .await
        .expect("sweep");
    assert_eq!(out.cells_run, 6, "time-slicing and two MPS arms × 2 counts");
    let prepared: Vec<String> = log(&b).into_iter().filter(|l| l.starts_with("prepare")).collect();
    assert_eq!(
        prepared,
        [
            "prepare time-slicing",
            "prepare mps-memory-none",
            "prepare mps-threads100-memory-none"
        ]
    );
    let rows = cells(&plan);
    let capped: Vec<&CellRecord> = rows
        .iter()
        .filter(|r| r.mps_threads.is_none() && r.strategy == Strategy::Mps)
        .collect();
    let full: Vec<&CellRecord> = rows
        .iter()
        .filter(|r| r.mps_threads == Some(crate::domain::MpsThreads::Percent(100)))
        .collect();
    assert_eq!(
        (capped.len(), full.len()),
        (5, 5),
        "pod rows and aggregates of 1 and 2 pods"
    );
    assert!(
        rows.iter()
            .filter(|r| r.strategy == Strategy::Mps)
            .all(|r| r.mps_memory == Some(crate::domain::MpsMemory::Unlimited))
    );
    // Each arm's 2-pod cell is judged against its own 1-pod cell.
    let two = full
        .iter()
        .find(|r| r.pods == 2 && r.is_aggregate())
        .expect("aggregate");
    assert_eq!(two.speedup_vs_1pod.map(|s| (s * 100.0).round()), Some(200.0));
    let data = crate::report::RunData::load(&plan.out.join("fake")).expect("run data");
    let titles: Vec<String> = data.arms().into_iter().map(crate::domain::Arm::title).collect();
    assert_eq!(
        titles,
        [
            "Time-slicing",
            "MPS (memory unpinned)",
            "MPS (100% of the SMs, memory unpinned)"
        ]
    );
    let report = crate::report::render(&data).expect("report");
    assert!(report.html.contains("MPS (100% of the SMs, memory unpinned)"));
    let v = crate::report::verify::verify_dir(&plan.out.join("fake")).expect("verify");
    assert_eq!((v.cells, v.mismatches.len()), (6, 0), "{:?}", v.mismatches);
}

#[tokio::test(start_paused = true)]
async fn a_capacity_search_of_two_mps_limits_searches_each_and_its_csv_and_report_render() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mut plan = capacity_plan(tmp.path(), "exclusive,mps", "p99=5ms");
    plan.mps_threads = vec![crate::domain::MpsThreads::Auto, crate::domain::MpsThreads::Percent(100)];
    let b = growing();
    capacity(&plan, &b, false, &Recorder::default(), &Shutdown::new())
        .await
        .expect("capacity");
    let run = crate::results::store::read_run(&plan.out.join("fake/run.json")).expect("run");
    let table = crate::capacity::record::records(&run, &cells(&plan));
    let arms: Vec<String> = table.iter().map(|r| r.arm().name()).collect();
    assert_eq!(arms, ["exclusive", "mps", "mps-threads100"]);
    // Every record has the limit columns (a CSV's header is its first record's), and
    // the report, which writes capacity.csv, renders.
    let data = crate::report::RunData::load(&plan.out.join("fake")).expect("run data");
    let report = crate::report::render(&data).expect("report");
    assert!(report.html.contains("MPS (100% of the SMs)"));
    let csv = &report
        .csv
        .iter()
        .find(|(name, _)| name == "capacity.csv")
        .expect("capacity.csv")
        .1;
    let text = String::from_utf8(csv.clone()).expect("utf-8");
    assert!(
        text.lines()
            .next()
            .is_some_and(|h| h.contains("mps_threads,mps_memory")),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.starts_with("mps,") || l.contains(",mps,")),
        "{text}"
    );
    assert!(text.contains(",100,"), "{text}");
}

/// A plan of `time-slicing × 2` with a 10-s warm-up, fixed or until steady.
fn warmup_plan(dir: &std::path::Path, fixed: bool) -> SweepPlan {
    let o: SweepOptions = toml::from_str(&format!(
        "strategies = \"time-slicing\"\npods = \"2\"\nwarmup = \"10s\"\nfixed_warmup = {fixed}\nwindow = \"1s\"\nmax_cell = \"10s\"\nready_timeout = \"30s\"\ndevice = \"cpu\"\nrun_id = \"fake\"\nout = \"{}\"\n",
        dir.display()
    ))
    .expect("options");
    SweepPlan::from_options(o).expect("plan")
}

#[tokio::test(start_paused = true)]
async fn a_warm_up_ends_three_steady_probes_after_the_pods_settle_and_its_phases_are_recorded() {
    // Ready after 1 s; every inference twice as slow until 2.5 s after launch.
    let slow = || {
        FakeBackend::new(|_, n| {
            (0..n)
                .map(|_| PodScript {
                    slow_until: Some(Duration::from_millis(2500)),
                    ..PodScript::steady(100.0, 0.004)
                })
                .collect()
        })
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let plan = warmup_plan(tmp.path(), false);
    sweep(&plan, &slow(), false, &Recorder::default(), &Shutdown::new())
        .await
        .expect("sweep");
    let row = agg(&cells(&plan), Strategy::TimeSlicing, 2);
    // Probes at 2 s (slow), 3 s (half slow), 4, 5 and 6 s (settled): steady at the
    // third settled one, 5 s after readiness.
    assert_eq!(row.warmup_s, Some(5.0));
    assert_eq!(row.pods_ready_s, Some(1.0));
    assert!(row.stop_s.is_some_and(|s| s >= 0.0), "{:?}", row.stop_s);
    assert!(
        row.mean_s.is_some_and(|m| (m - 0.004).abs() < 1e-12),
        "no slow inference is measured: {:?}",
        row.mean_s
    );
    let raw = crate::results::raw::read_raw(&plan.out.join("fake")).expect("raw");
    let probes: Vec<(f64, f64)> = raw[0]
        .warmup
        .iter()
        .map(|p| (p.at_s, p.mean_s.unwrap_or(f64::NAN)))
        .collect();
    assert_eq!(probes.len(), 5, "{probes:?}");
    assert_eq!(probes[0], (1.0, 0.008));
    assert!(
        probes[2..].iter().all(|&(_, m)| (m - 0.004).abs() < 1e-12),
        "{probes:?}"
    );
    let run = crate::results::store::read_run(&plan.out.join("fake/run.json")).expect("run");
    assert!(run.plan.warmup_steady);
    let data = crate::report::RunData::load(&plan.out.join("fake")).expect("load");
    let spent = crate::report::tables::time_spent(&data.run, &data.cells).expect("phases");
    assert!(
        spent.starts_with("starting pods 1s · warm-up 5s · windows 3s · ") && spent.ends_with("over 1 measured cells"),
        "{spent}"
    );

    // --fixed-warmup waits the whole 10 s and keeps no probes.
    let tmp = tempfile::tempdir().expect("tmp");
    let plan = warmup_plan(tmp.path(), true);
    sweep(&plan, &slow(), false, &Recorder::default(), &Shutdown::new())
        .await
        .expect("sweep");
    assert_eq!(agg(&cells(&plan), Strategy::TimeSlicing, 2).warmup_s, Some(10.0));
    let raw = crate::results::raw::read_raw(&plan.out.join("fake")).expect("raw");
    assert!(raw[0].warmup.is_empty());
    let run = crate::results::store::read_run(&plan.out.join("fake/run.json")).expect("run");
    assert!(!run.plan.warmup_steady);

    // A load too light to fill a probe (a request every 2 s) is never steady: the whole
    // 10 s, its probes kept.
    let tmp = tempfile::tempdir().expect("tmp");
    let plan = warmup_plan(tmp.path(), false);
    let sparse = FakeBackend::new(|_, n| (0..n).map(|_| PodScript::steady(0.5, 0.004)).collect());
    sweep(&plan, &sparse, false, &Recorder::default(), &Shutdown::new())
        .await
        .expect("sweep");
    assert_eq!(agg(&cells(&plan), Strategy::TimeSlicing, 2).warmup_s, Some(10.0));
    let raw = crate::results::raw::read_raw(&plan.out.join("fake")).expect("raw");
    assert!(raw[0].warmup.len() >= 8, "{:?}", raw[0].warmup);
}
