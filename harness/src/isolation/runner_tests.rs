//! The isolation runner driven by the scripted backend in paused tokio time.

use std::time::Duration;

use crate::backend::fake::{FakeBackend, PodScript};
use crate::domain::{CellStatus, Strategy};
use crate::isolation::plan::{IsolationSettings, Scenario, trials};
use crate::isolation::runner::{TrialSettings, run_trials};
use crate::results::isolation::IsolationRecord;
use crate::shutdown::Shutdown;
use crate::sweep::progress::Quiet;

fn settings() -> TrialSettings {
    TrialSettings {
        ready_timeout: Duration::from_secs(30),
        warmup: Duration::from_secs(3),
        event_after: Duration::from_secs(10),
        observe_after: Duration::from_secs(10),
        slo_s: None,
        victim_rate: Some(100.0),
        memory_total_bytes: Some(80 << 30),
    }
}

fn plan(strategies: Vec<Strategy>, scenarios: Vec<Scenario>) -> Vec<crate::isolation::plan::Trial> {
    trials(&IsolationSettings {
        scenarios,
        strategies,
        victim_rate: 100.0,
        noisy_aggressors: vec![1],
        event_after: Duration::from_secs(10),
        memory_total_bytes: Some(80 << 30),
        own_victim: false,
    })
    .expect("plan")
}

/// Alone, the victim answers in 4 ms; beside an aggressor in 8 ms. Under MPS the
/// aggressor's fault (at 10 s after readiness, 11 s after launch) takes the victim with
/// it; under time-slicing only the aggressor exits.
fn scripts(strategy: Strategy, n: u32) -> Vec<PodScript> {
    if n == 1 {
        return vec![PodScript::steady(100.0, 0.004)];
    }
    let fault = Some((Duration::from_secs(11), 5));
    let victim = PodScript {
        exit: if strategy == Strategy::Mps { fault } else { None },
        ..PodScript::steady(100.0, 0.008)
    };
    vec![
        victim,
        PodScript {
            exit: fault,
            ..PodScript::steady(100.0, 0.008)
        },
    ]
}

fn find<'a>(r: &'a [IsolationRecord], s: Strategy, scenario: &str) -> &'a IsolationRecord {
    r.iter()
        .find(|x| x.strategy == s && x.scenario == scenario)
        .expect("record")
}

/// Runs `trials` on `b` with `done` on disk; returns the outcome and every record given
/// to `save`, in order.
async fn run<B: crate::backend::Backend>(
    b: &mut B,
    metrics: &crate::backend::fake::ScriptedMetrics,
    trials: &[crate::isolation::plan::Trial],
    done: &[IsolationRecord],
    shutdown: &Shutdown,
) -> (crate::error::Result<Vec<IsolationRecord>>, Vec<IsolationRecord>) {
    let mut saved = Vec::new();
    let out = run_trials(b, metrics, trials, &settings(), "r", done, &Quiet, shutdown, |r| {
        saved.push(r.clone());
        Ok(())
    })
    .await;
    (out, saved)
}

#[tokio::test(start_paused = true)]
async fn a_fault_next_door_is_recorded_per_strategy_against_the_victim_alone() {
    let mut b = FakeBackend::new(scripts).without(Strategy::Mig);
    let metrics = b.metrics();
    let trials = plan(
        vec![Strategy::TimeSlicing, Strategy::Mps, Strategy::Mig],
        vec![Scenario::Fault],
    );
    let (records, saved) = run(&mut b, &metrics, &trials, &[], &Shutdown::new()).await;
    let records = records.expect("trials");
    assert_eq!(saved.len(), 7, "every record saved as it came");
    let alone = find(&records, Strategy::TimeSlicing, "alone");
    assert_eq!(alone.victim_status, CellStatus::Ok);
    // 4 ms sits in the (2, 5] ms bucket, 8 ms in (5, 10]: p99 9.95 over 4.97 ms.
    let ts = find(&records, Strategy::TimeSlicing, "fault");
    assert_eq!(ts.victim_status, CellStatus::Ok, "{ts:?}");
    assert!((ts.p99_inflation.expect("inflation") - 0.00995 / 0.00497).abs() < 1e-9);
    assert!((ts.mean_inflation.expect("inflation") - 2.0).abs() < 1e-9);
    assert_eq!((ts.survivors, ts.started), (1, 2));
    assert_eq!(ts.aggressor_outcome, "aggressor-1 exit 5: scripted exit 5");
    let mps = find(&records, Strategy::Mps, "fault");
    assert_eq!((mps.victim_status, mps.victim_exit_code), (CellStatus::Failed, Some(5)));
    assert_eq!((mps.survivors, mps.started), (0, 2));
    assert!(
        mps.victim_inferences.is_some_and(|n| n > 0),
        "what it served before the fault counts"
    );
    // Seen within a 250 ms poll of 11 s, started again, ready a second later (the fake
    // is polled every 100 ms while it starts).
    let r = mps.recovery_s.expect("recovery");
    assert!((1.0..=1.1).contains(&r), "{r}");
    assert!(
        mps.recovery.starts_with("a new victim was warm and ready 1.0 s after"),
        "{}",
        mps.recovery
    );
    assert_eq!(
        (ts.recovery_s, ts.recovery.as_str()),
        (None, "not needed: the victim kept serving")
    );
    assert_eq!(
        mps.mps_split.as_deref(),
        Some("50% of the SMs and 40960 MiB pinned per client (2 clients)")
    );
    let mig = find(&records, Strategy::Mig, "fault");
    assert_eq!(mig.victim_status, CellStatus::Unavailable);
    assert_eq!(mig.note, "mig is scripted unavailable");
    let log = b.calls.lock().expect("calls").log.clone();
    assert_eq!(
        log.iter()
            .filter(|l| l.starts_with("launch"))
            .cloned()
            .collect::<Vec<_>>(),
        [
            "launch time-slicing victim",
            "launch time-slicing victim,aggressor-1",
            "launch mps victim",
            "launch mps victim",
            "launch mps victim,aggressor-1"
        ]
    );
    // MPS's victim alone again, under the limits the fault trial gives it: the backend
    // was told them before that launch and the split again after.
    let capped = find(&records, Strategy::Mps, crate::isolation::plan::CAPPED);
    assert_eq!((capped.aggressors, capped.victim_status), (1, CellStatus::Ok));
    assert_eq!(
        capped.mps_split.as_deref(),
        Some("50% of the SMs and 40960 MiB pinned, alone: each client's share with 2 clients")
    );
    assert_eq!(
        log.iter().filter(|l| l.starts_with("limits ")).collect::<Vec<_>>(),
        ["limits mps-threads50-memory40960mi"]
    );
    let ratio = mps.p99_over_capped.expect("the neighbours' part");
    assert!((ratio - mps.victim_p99_s.expect("p99") / capped.victim_p99_s.expect("p99")).abs() < 1e-12);
    // The metrics source follows the victim alone, and lets go of it before the
    // trial's pods stop.
    let around: Vec<&str> = log
        .iter()
        .map(String::as_str)
        .filter(|l| l.starts_with("metrics") || *l == "stop")
        .take(3)
        .collect();
    assert_eq!(around, ["metrics for victim", "metrics released", "stop"]);
    assert_eq!(
        log.iter().filter(|l| *l == "metrics for victim").count(),
        5,
        "each measured trial: {log:?}"
    );
    assert_eq!(log.iter().filter(|l| *l == "relaunch victim").count(), 1, "{log:?}");
    assert_eq!(log.iter().filter(|l| *l == "stop").count(), 5, "{log:?}");
    // Resumed with the first three records on disk, only the last trial runs again.
    let mut again = FakeBackend::new(scripts).without(Strategy::Mig);
    let metrics = again.metrics();
    let resumed = run(&mut again, &metrics, &trials, &records[..4], &Shutdown::new())
        .await
        .0
        .expect("resumed");
    assert_eq!(resumed.len(), 7);
    let launches: Vec<String> = again
        .calls
        .lock()
        .expect("calls")
        .log
        .iter()
        .filter(|l| l.starts_with("launch"))
        .cloned()
        .collect();
    assert_eq!(launches, ["launch mps victim,aggressor-1"]);
    assert_eq!(resumed[4].recovery_s, mps.recovery_s, "the same trial, the same result");
    // The matrix reads it plainly.
    let m = crate::report::isolation_matrix::matrix(&records);
    let fault = &m.table.rows[0].1;
    use crate::report::outcome::Outcome;
    assert!(
        matches!(&fault[1], crate::report::tables::Cell::Rated(v, Outcome::Failed) if v.starts_with("victim failed (exit 5)") && v.ends_with("0/2 serving")),
        "{fault:?}"
    );
    assert!(matches!(&fault[0], crate::report::tables::Cell::Rated(v, _) if v.ends_with("1/2 serving")));
}

#[tokio::test(start_paused = true)]
async fn a_crash_is_the_aggressors_own_sigkill_and_the_victim_serves_on() {
    let mut b = FakeBackend::new(|_, n| (0..n).map(|_| PodScript::steady(100.0, 0.004)).collect());
    let metrics = b.metrics();
    let trials = plan(vec![Strategy::TimeSlicing], vec![Scenario::Crash]);
    let records = run(&mut b, &metrics, &trials, &[], &Shutdown::new())
        .await
        .0
        .expect("trials");
    let crash = find(&records, Strategy::TimeSlicing, "crash");
    assert_eq!(crash.victim_status, CellStatus::Ok);
    assert_eq!(crash.aggressor_outcome, "aggressor-1 exit 137: scripted exit 137");
    assert_eq!((crash.survivors, crash.started), (1, 2));
    // Followed from the warm-up's end to 10 s after the crash: 17 s at 100/s.
    assert_eq!(crash.victim_inferences, Some(1700));
    assert_eq!(crash.slo_attainment, Some(1.0));
}

#[tokio::test(start_paused = true)]
async fn a_stop_request_mid_trial_stops_the_pods_and_keeps_the_saved_records() {
    let mut b = FakeBackend::new(|_, n| (0..n).map(|_| PodScript::steady(100.0, 0.004)).collect());
    let metrics = b.metrics();
    let trials = plan(vec![Strategy::TimeSlicing], vec![Scenario::Crash]);
    let shutdown = Shutdown::new();
    let stopper = shutdown.clone();
    tokio::spawn(async move {
        // The alone trial takes 21 s from launch; stop 5 s into the crash trial.
        tokio::time::sleep(Duration::from_secs(26)).await;
        stopper.request(libc::SIGINT);
    });
    let (e, saved) = run(&mut b, &metrics, &trials, &[], &shutdown).await;
    let e = e.expect_err("interrupted");
    assert!(e.is_interrupt());
    let names: Vec<&str> = saved.iter().map(|r| r.scenario.as_str()).collect();
    assert_eq!(names, ["alone"]);
    assert_eq!(b.running(), 0, "the crash trial's pods were stopped");
}

#[tokio::test(start_paused = true)]
async fn a_measured_trial_is_saved_before_a_failed_stop_ends_the_run() {
    let mut b = FakeBackend::new(|_, n| (0..n).map(|_| PodScript::steady(100.0, 0.004)).collect()).failing_stop();
    let metrics = b.metrics();
    let trials = plan(vec![Strategy::TimeSlicing], vec![Scenario::Crash]);
    let (e, saved) = run(&mut b, &metrics, &trials, &[], &Shutdown::new()).await;
    let e = e.expect_err("the stop failed");
    assert!(e.to_string().contains("still exist"), "{e}");
    let saved: Vec<(&str, CellStatus)> = saved.iter().map(|r| (r.scenario.as_str(), r.victim_status)).collect();
    assert_eq!(
        saved,
        [("alone", CellStatus::Ok)],
        "measured, then saved, then the error"
    );
}

#[tokio::test(start_paused = true)]
async fn a_trial_that_cannot_launch_is_a_failed_record_and_the_run_goes_on() {
    // A backend whose launches of more than one pod fail (a port already taken).
    #[derive(Clone)]
    struct NoLaunch(FakeBackend);
    impl crate::backend::Backend for NoLaunch {
        fn name(&self) -> &'static str {
            "no-launch"
        }
        async fn prepare(
            &mut self,
            s: crate::domain::Arm,
            sd: &Shutdown,
        ) -> crate::error::Result<crate::backend::Prepared> {
            self.0.prepare(s, sd).await
        }
        async fn launch(
            &mut self,
            s: Strategy,
            n: u32,
            args: &[String],
            sd: &Shutdown,
        ) -> crate::error::Result<Vec<crate::backend::Pod>> {
            self.0.launch(s, n, args, sd).await
        }
        async fn launch_pods(
            &mut self,
            s: Strategy,
            specs: &[crate::backend::PodSpec],
            sd: &Shutdown,
        ) -> crate::error::Result<Vec<crate::backend::Pod>> {
            if specs.len() > 1 {
                return Err(crate::error::BenchError::Spawn {
                    pod: "aggressor-1".into(),
                    reason: "port 9001 is taken".into(),
                });
            }
            self.0.launch_pods(s, specs, sd).await
        }
        async fn wait_ready(&mut self, t: Duration, sd: &Shutdown) -> crate::error::Result<Vec<crate::backend::Pod>> {
            self.0.wait_ready(t, sd).await
        }
        async fn poll(&mut self) -> Vec<crate::backend::Pod> {
            self.0.poll().await
        }
        async fn stop_pods(&mut self, sd: &Shutdown) -> crate::error::Result<Vec<crate::backend::Pod>> {
            self.0.stop_pods(sd).await
        }
        async fn restore(&mut self, sd: &Shutdown) -> crate::error::Result<()> {
            self.0.restore(sd).await
        }
    }
    let fake = FakeBackend::new(|_, n| (0..n).map(|_| PodScript::steady(100.0, 0.004)).collect());
    let metrics = fake.metrics();
    let mut b = NoLaunch(fake.clone());
    let trials = plan(vec![Strategy::TimeSlicing], vec![Scenario::Crash, Scenario::Fault]);
    let records = run(&mut b, &metrics, &trials, &[], &Shutdown::new())
        .await
        .0
        .expect("the run goes on");
    assert_eq!(records.len(), 3);
    let crash = find(&records, Strategy::TimeSlicing, "crash");
    assert_eq!(crash.victim_status, CellStatus::Failed);
    assert!(crash.note.contains("port 9001 is taken"), "{}", crash.note);
    assert_eq!(
        find(&records, Strategy::TimeSlicing, "fault").victim_status,
        CellStatus::Failed
    );
    let log = fake.calls.lock().expect("calls").log.clone();
    assert_eq!(
        log.iter().filter(|l| *l == "stop").count(),
        3,
        "every trial's pods stopped: {log:?}"
    );
}
