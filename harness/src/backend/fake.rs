//! A scripted backend and metrics source for fast, deterministic tests of the runner
//! (in paused tokio time; see `sweep/runner_tests.rs`), in the manner of hyperfine's
//! `MockExecutor`: each pod of a cell follows a [`PodScript`] (when it is ready, its
//! rate and latency, whether it is pending, exits with a code, or restarts), and the
//! metrics source computes each pod's cumulative histogram from the clock, so every
//! number the runner records can be predicted exactly.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Backend, Pod, PodSpec, PodState, Prepared};
use crate::domain::{Source, Strategy};
use crate::error::{BenchError, Result};
use crate::metrics::{MetricsSource, PodSnapshot, Target};
use crate::shutdown::{EndsOn, Shutdown};
use crate::stats::Histogram;

/// What one pod of a cell does, measured from the cell's launch.
#[derive(Debug, Clone, PartialEq)]
pub struct PodScript {
    /// Time from launch to ready.
    pub ready_after: Duration,
    /// Inferences per second once ready.
    pub rate: f64,
    /// The latency of every inference, seconds.
    pub latency: f64,
    /// Never scheduled, with this reason.
    pub pending: Option<String>,
    /// Exits on its own at this time with this code.
    pub exit: Option<(Duration, i32)>,
    /// Restarts (its counters start again from zero) at this time.
    pub restart_at: Option<Duration>,
    /// Its backlog (requests waiting), where it reports one: this many when ready,
    /// growing by the second number per second after.
    pub backlog: Option<(f64, f64)>,
    /// A warm-up: until this time after launch every inference takes twice `latency`.
    pub slow_until: Option<Duration>,
}

impl PodScript {
    /// A pod ready after 1 s, serving `rate` inferences/s of `latency` seconds.
    pub fn steady(rate: f64, latency: f64) -> Self {
        Self {
            ready_after: Duration::from_secs(1),
            rate,
            latency,
            pending: None,
            exit: None,
            restart_at: None,
            backlog: None,
            slow_until: None,
        }
    }
}

/// The bucket bounds of the scripted histograms.
const BOUNDS: [f64; 5] = [0.001, 0.002, 0.005, 0.01, f64::INFINITY];

#[derive(Debug, Default)]
struct World {
    launched_at: Option<Instant>,
    pods: Vec<(String, PodScript)>,
    stopped: bool,
}

/// What the fake backend was asked to do, in order (for assertions).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Calls {
    /// `prepare`, `launch 3`, `stop`, `restore`, ...
    pub log: Vec<String>,
}

/// A backend whose pods follow scripts; shares its world with [`ScriptedMetrics`].
#[derive(Clone)]
pub struct FakeBackend {
    world: Arc<Mutex<World>>,
    scripts: Arc<dyn Fn(Strategy, u32) -> Vec<PodScript> + Send + Sync>,
    unavailable: Vec<Strategy>,
    failing_stop: bool,
    /// Everything the runner asked for.
    pub calls: Arc<Mutex<Calls>>,
}

impl std::fmt::Debug for FakeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeBackend").field("calls", &self.calls).finish()
    }
}

impl FakeBackend {
    /// A backend whose cells run the pods `scripts` gives for (strategy, pods).
    pub fn new(scripts: impl Fn(Strategy, u32) -> Vec<PodScript> + Send + Sync + 'static) -> Self {
        Self {
            world: Arc::new(Mutex::new(World::default())),
            scripts: Arc::new(scripts),
            unavailable: Vec::new(),
            failing_stop: false,
            calls: Arc::new(Mutex::new(Calls::default())),
        }
    }

    /// `strategy` is reported unavailable.
    pub fn without(mut self, strategy: Strategy) -> Self {
        self.unavailable.push(strategy);
        self
    }

    /// `stop_pods` stops the pods but reports an error (a Deployment that would not go).
    pub fn failing_stop(mut self) -> Self {
        self.failing_stop = true;
        self
    }

    /// The metrics source that reads this backend's pods.
    pub fn metrics(&self) -> ScriptedMetrics {
        ScriptedMetrics {
            world: self.world.clone(),
            calls: self.calls.clone(),
        }
    }

    fn log(&self, what: String) {
        if let Ok(mut c) = self.calls.lock() {
            c.log.push(what);
        }
    }

    /// Starts a cell of pods with these names, following the scripts for their count.
    fn start_cell(&self, strategy: Strategy, names: Vec<String>) -> Vec<Pod> {
        let scripts = (self.scripts)(strategy, names.len() as u32);
        {
            let mut w = self.world.lock().expect("world");
            w.launched_at = Some(Instant::now());
            w.stopped = false;
            w.pods = names.into_iter().zip(scripts).collect();
        }
        self.pods_now()
    }

    /// Whether any pod of the current cell is running now.
    pub fn running(&self) -> usize {
        let w = self.world.lock().expect("world");
        let now = Instant::now();
        match w.launched_at {
            Some(t0) if !w.stopped => w
                .pods
                .iter()
                .filter(|(_, s)| state(s, t0, now) == PodState::Running)
                .count(),
            _ => 0,
        }
    }

    fn pods_now(&self) -> Vec<Pod> {
        let w = self.world.lock().expect("world");
        let now = Instant::now();
        let Some(t0) = w.launched_at else { return Vec::new() };
        w.pods
            .iter()
            .map(|(name, s)| Pod {
                name: name.clone(),
                metrics_url: s.pending.is_none().then(|| format!("fake://{name}")),
                state: state(s, t0, now),
            })
            .collect()
    }
}

fn state(s: &PodScript, t0: Instant, now: Instant) -> PodState {
    if let Some(r) = &s.pending {
        return PodState::Pending(r.clone());
    }
    match s.exit {
        Some((at, code)) if now >= t0 + at => PodState::Exited {
            code: Some(code),
            detail: format!("scripted exit {code}"),
        },
        _ if now >= t0 + s.ready_after => PodState::Running,
        _ => PodState::Starting,
    }
}

impl Backend for FakeBackend {
    fn name(&self) -> &'static str {
        "fake"
    }

    async fn prepare(&mut self, arm: crate::domain::Arm, _shutdown: &Shutdown) -> Result<Prepared> {
        // The log names the arm (a plain strategy's name is the strategy's).
        let strategy = arm.strategy;
        self.log(format!("prepare {arm}"));
        Ok(if self.unavailable.contains(&strategy) {
            Prepared::Unavailable(format!("{strategy} is scripted unavailable"))
        } else {
            Prepared::Ready
        })
    }

    async fn launch(
        &mut self,
        strategy: Strategy,
        pods: u32,
        args: &[String],
        _shutdown: &Shutdown,
    ) -> Result<Vec<Pod>> {
        if args.is_empty() {
            self.log(format!("launch {strategy} {pods}"));
        } else {
            self.log(format!("launch {strategy} {pods} {}", args.join(" ")));
        }
        Ok(self.start_cell(strategy, (0..pods).map(|i| format!("pod-{i}")).collect()))
    }

    async fn launch_pods(&mut self, strategy: Strategy, specs: &[PodSpec], _shutdown: &Shutdown) -> Result<Vec<Pod>> {
        self.log(format!(
            "launch {strategy} {}",
            specs.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(",")
        ));
        let pods = self.start_cell(strategy, specs.iter().map(|s| s.name.clone()).collect());
        // `--crash-after D`: the workload kills itself with SIGKILL D after its readiness.
        let mut w = self.world.lock().expect("world");
        for (spec, (_, script)) in specs.iter().zip(w.pods.iter_mut()) {
            let after = spec.args.iter().position(|a| a == "--crash-after").and_then(|i| {
                let ms = spec.args.get(i + 1)?.strip_suffix("ms")?;
                ms.parse().ok().map(Duration::from_millis)
            });
            if let Some(after) = after {
                script.exit = Some((script.ready_after + after, 137));
            }
        }
        Ok(pods)
    }

    fn set_mps_limits(&mut self, limits: crate::domain::MpsLimits) -> std::result::Result<(), String> {
        if !limits.is_auto() {
            let arm = crate::domain::Arm {
                mps: limits,
                ..crate::domain::Arm::of(Strategy::Mps)
            };
            self.log(format!("limits {arm}"));
        }
        Ok(())
    }

    async fn relaunch_pod(&mut self, name: &str, _shutdown: &Shutdown) -> Result<()> {
        self.log(format!("relaunch {name}"));
        let mut w = self.world.lock().expect("world");
        let since = w.launched_at.map(|t0| Instant::now() - t0);
        match (since, w.pods.iter_mut().find(|(n, _)| n == name)) {
            (Some(since), Some((_, s))) => {
                // A new process: ready a second from now, serving as before.
                *s = PodScript {
                    ready_after: since + Duration::from_secs(1),
                    exit: None,
                    restart_at: None,
                    ..s.clone()
                };
                Ok(())
            }
            _ => Err(BenchError::Spawn {
                pod: name.into(),
                reason: "no such pod".into(),
            }),
        }
    }

    async fn wait_ready(&mut self, timeout: Duration, shutdown: &Shutdown) -> Result<Vec<Pod>> {
        let mut wait = shutdown.poll(EndsOn::Request, Duration::from_millis(100), timeout);
        loop {
            let pods = self.pods_now();
            if pods.iter().all(|p| p.state != PodState::Starting) {
                return Ok(pods);
            }
            if !wait.keep_waiting().await? {
                return Ok(pods);
            }
        }
    }

    async fn poll(&mut self) -> Vec<Pod> {
        self.pods_now()
    }

    async fn stop_pods(&mut self, _shutdown: &Shutdown) -> Result<Vec<Pod>> {
        self.log("stop".into());
        let before = self.pods_now();
        let mut w = self.world.lock().expect("world");
        w.stopped = true;
        w.pods.clear();
        if self.failing_stop {
            return Err(BenchError::kube("2 workload pods still exist 120 s after deletion"));
        }
        Ok(before)
    }

    async fn restore(&mut self, _shutdown: &Shutdown) -> Result<()> {
        self.log("restore".into());
        let mut w = self.world.lock().expect("world");
        w.stopped = true;
        w.pods.clear();
        Ok(())
    }
}

/// Metrics computed from the scripts and the (paused) clock.
#[derive(Debug, Clone)]
pub struct ScriptedMetrics {
    world: Arc<Mutex<World>>,
    /// Logs `metrics for POD,POD` (prepare) and `metrics released` into the backend's calls.
    calls: Arc<Mutex<Calls>>,
}

/// A pod's cumulative histogram `t` after launch (pure).
pub fn histogram_at(s: &PodScript, since_launch: Duration) -> Histogram {
    let start = match s.restart_at {
        Some(r) if since_launch >= r => r.max(s.ready_after),
        _ => s.ready_after,
    };
    let served = |until: Duration| (until.saturating_sub(start).as_secs_f64() * s.rate).floor();
    let count = served(since_launch);
    let slow = s.slow_until.map_or(0.0, |u| served(u.min(since_launch)));
    let fast = count - slow;
    let within = |b: f64| (if s.latency <= b { fast } else { 0.0 }) + (if 2.0 * s.latency <= b { slow } else { 0.0 });
    Histogram {
        buckets: BOUNDS.iter().map(|&b| (b, within(b))).collect(),
        sum: fast * s.latency + slow * 2.0 * s.latency,
        count,
    }
}

impl MetricsSource for ScriptedMetrics {
    fn kind(&self) -> Source {
        Source::Scrape
    }

    async fn prepare(&self, targets: &[Target], _shutdown: &Shutdown) -> Result<()> {
        let names: Vec<&str> = targets.iter().map(|t| t.pod.as_str()).collect();
        if let Ok(mut c) = self.calls.lock() {
            c.log.push(format!("metrics for {}", names.join(",")));
        }
        Ok(())
    }

    fn release(&self) {
        if let Ok(mut c) = self.calls.lock() {
            c.log.push("metrics released".into());
        }
    }

    async fn snapshot(&self, targets: &[Target]) -> Result<Vec<(String, Result<PodSnapshot>)>> {
        let w = self.world.lock().expect("world");
        let now = Instant::now();
        let by_name: HashMap<&str, &PodScript> = w.pods.iter().map(|(n, s)| (n.as_str(), s)).collect();
        Ok(targets
            .iter()
            .map(|t| {
                let snap = match (w.launched_at, by_name.get(t.pod.as_str())) {
                    (Some(t0), Some(s)) if state(s, t0, now) == PodState::Running => Ok(PodSnapshot {
                        at: now,
                        latency: histogram_at(s, now - t0),
                        errors: 0.0,
                        backlog: s.backlog.map(|(at_ready, per_s)| {
                            at_ready + per_s * (now - t0).saturating_sub(s.ready_after).as_secs_f64()
                        }),
                        load_seed: None,
                        device_uuid: None,
                        last_error: None,
                        streamed: None,
                        tokens: None,
                        server: None,
                    }),
                    _ => Err(BenchError::Scrape {
                        pod: t.pod.clone(),
                        url: t.url.clone(),
                        reason: "connection refused".into(),
                    }),
                };
                (t.pod.clone(), snap)
            })
            .collect())
    }
}
