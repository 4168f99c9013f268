//! Isolation groundwork on the CPU: the local backend launches an isolation
//! trial's pods as planned — each with its own name and workload arguments — and can
//! start one again. The fault scenario on the CPU is a process abort (SIGABRT), labelled so by
//! the workload; the victim keeps serving.

use std::path::Path;
use std::time::{Duration, Instant};

use gpushare_bench::backend::local::{LocalBackend, WorkloadCommand};
use gpushare_bench::backend::{Backend, Pod, PodSpec, PodState};
use gpushare_bench::domain::{DeviceKind, Strategy};
use gpushare_bench::isolation::plan::{IsolationSettings, Role, Scenario, trials};
use gpushare_bench::shutdown::Shutdown;
use gpushare_bench::telemetry::GpuInventory;

const BENCH: &str = env!("CARGO_BIN_EXE_gpushare-bench");

fn backend(dir: &Path) -> LocalBackend {
    let binary = Path::new(BENCH).with_file_name("gpushare-workload");
    assert!(binary.is_file(), "build the workspace first (`make test` does)");
    std::fs::create_dir_all(dir.join("logs")).expect("logs");
    let workload = WorkloadCommand::builtin(
        binary,
        ["--model", "tiny", "--device", "cpu", "--precision", "fp32"]
            .map(String::from)
            .to_vec(),
    );
    LocalBackend::new(workload, DeviceKind::Cpu, GpuInventory::default(), dir, None)
}

/// The pods of one planned CPU trial, as the backend takes them.
fn specs(scenario: Scenario) -> Vec<PodSpec> {
    let plan = trials(&IsolationSettings {
        scenarios: vec![scenario],
        strategies: vec![Strategy::TimeSlicing],
        victim_rate: 50.0,
        noisy_aggressors: vec![1],
        event_after: Duration::from_millis(700),
        memory_total_bytes: None,
        own_victim: false,
    })
    .expect("plan");
    let trial = plan.iter().find(|t| t.scenario == Some(scenario)).expect("trial");
    trial
        .pods
        .iter()
        .map(|p| PodSpec {
            name: p.name.clone(),
            args: p.args.clone(),
            group: scenario.name().into(),
            builtin: p.role == Role::Aggressor,
        })
        .collect()
}

async fn until(b: &mut LocalBackend, what: &str, f: impl Fn(&[Pod]) -> bool) -> Vec<Pod> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pods = b.poll().await;
        if f(&pods) {
            return pods;
        }
        assert!(Instant::now() < deadline, "{what}: {pods:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn state<'a>(pods: &'a [Pod], name: &str) -> &'a PodState {
    &pods.iter().find(|p| p.name == name).expect("pod").state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_fault_trial_runs_its_pods_as_planned_and_the_victim_survives() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut b = backend(dir.path());
    let shutdown = Shutdown::new();
    let launched = b
        .launch_pods(Strategy::TimeSlicing, &specs(Scenario::Fault), &shutdown)
        .await
        .expect("launch");
    let names: Vec<&str> = launched.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["victim", "aggressor-1"]);
    let ready = b.wait_ready(Duration::from_secs(60), &shutdown).await.expect("ready");
    assert!(ready.iter().all(|p| p.state == PodState::Running), "{ready:?}");
    let pods = until(&mut b, "the aggressor's fault", |p| {
        matches!(state(p, "aggressor-1"), PodState::Exited { .. })
    })
    .await;
    match state(&pods, "aggressor-1") {
        PodState::Exited { code, detail } => {
            assert_eq!(*code, None, "a signal, not an exit code");
            assert!(detail.contains("CPU stand-in for a GPU fault"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    // The victim serves on, under its own arguments (an open loop at 50/s).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pods = b.poll().await;
    assert_eq!(*state(&pods, "victim"), PodState::Running);
    let log = std::fs::read_to_string(dir.path().join("logs/time-slicing-fault-victim.log")).expect("victim log");
    assert!(!log.contains("aborting"), "{log}");
    let args = std::fs::read_to_string(dir.path().join("logs/time-slicing-fault-aggressor-1.log")).expect("log");
    assert!(args.contains("injecting a fault"), "{args}");
    // Started again with its name and arguments, to a log of its own.
    b.relaunch_pod("aggressor-1", &shutdown).await.expect("relaunch");
    let ready = b.wait_ready(Duration::from_secs(60), &shutdown).await.expect("ready");
    assert_eq!(*state(&ready, "aggressor-1"), PodState::Running, "{ready:?}");
    assert!(dir.path().join("logs/time-slicing-fault-aggressor-1.2.log").is_file());
    assert!(
        b.relaunch_pod("aggressor-1", &shutdown).await.is_err(),
        "a running pod is not started twice"
    );
    assert!(b.relaunch_pod("nobody", &shutdown).await.is_err());
    assert_eq!(*state(&b.poll().await, "victim"), PodState::Running);
    b.stop_pods(&shutdown).await.expect("stop");
    b.restore(&shutdown).await.expect("restore");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_memory_trial_passes_each_pod_its_growth() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut b = backend(dir.path());
    let shutdown = Shutdown::new();
    let specs = specs(Scenario::MemoryPressure);
    assert_eq!(specs[1].args, ["--grow-memory", &format!("700ms:{}", 64u64 << 20)]);
    b.launch_pods(Strategy::TimeSlicing, &specs, &shutdown)
        .await
        .expect("launch");
    let ready = b.wait_ready(Duration::from_secs(60), &shutdown).await.expect("ready");
    assert!(ready.iter().all(|p| p.state == PodState::Running), "{ready:?}");
    // Both grow (host memory on the CPU) and keep serving.
    let deadline = Instant::now() + Duration::from_secs(20);
    for pod in ["victim", "aggressor-1"] {
        let log = dir.path().join(format!("logs/time-slicing-memory-pressure-{pod}.log"));
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("taking more memory")
        {
            assert!(Instant::now() < deadline, "{pod} never grew");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let pods = b.poll().await;
    assert!(pods.iter().all(|p| p.state == PodState::Running), "{pods:?}");
    b.stop_pods(&shutdown).await.expect("stop");
    b.restore(&shutdown).await.expect("restore");
}
