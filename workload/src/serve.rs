//! Serving: bind the metrics endpoint, build the engine, warm up, then infer in a closed
//! or open loop until SIGTERM/SIGINT. The engine runs on the calling thread; HTTP and
//! signal handling run on a small tokio runtime beside it.
//!
//! A stop signal sets the stop flag, which the loops check between inferences and the
//! CPU forward pass checks between blocks of rows (it then abandons the inference, which
//! is not recorded). Whatever the engine is doing, the process ends within
//! [`STOP_GRACE`] of the signal with exit code 0: if the engine thread has not returned
//! by then (a model still loading, a GPU pass that does not come back), a watchdog
//! prints one line and ends the process at once.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::backend::Engine;
use crate::cli::ServeArgs;
use crate::error::{Result, WorkloadError};
use crate::load::{ArrivalSchedule, LoadPattern};
use crate::metrics::{Identity, WorkloadMetrics};
use crate::server;

/// How long after SIGTERM/SIGINT the engine thread may take to return before the
/// watchdog ends the process (the harness waits 4 s before SIGKILL).
pub const STOP_GRACE: Duration = Duration::from_secs(1);

/// What the engine thread is doing, for the watchdog's line.
const PHASE_LOADING: u8 = 0;
const PHASE_INFERRING: u8 = 1;
const PHASE_DONE: u8 = 2;
/// The watchdog has committed to ending the process.
const PHASE_EXITING: u8 = 3;

/// Runs the workload until a stop signal; `Ok` means a clean stop (exit code 0).
pub fn run(args: &ServeArgs) -> Result<()> {
    let plan = args.model.plan(args.reserve_memory)?;
    let listener = server::bind(&args.listen)?;
    let identity = Identity::from_env();
    let metrics = Arc::new(WorkloadMetrics::new(&identity)?);
    let stop = Arc::new(AtomicBool::new(false));
    let phase = Arc::new(AtomicU8::new(PHASE_LOADING));

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .thread_name("gpushare-http")
        .build()
        .map_err(|source| WorkloadError::Io {
            what: "starting the runtime".into(),
            source,
        })?;
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let server = runtime.spawn(server::serve(listener, metrics.clone(), shutdown_rx));
    {
        let (stop, phase) = (stop.clone(), phase.clone());
        runtime.spawn(async move {
            let signal = wait_for_signal().await;
            stop.store(true, Ordering::SeqCst);
            tracing::info!(signal, "stopping");
            tokio::time::sleep(STOP_GRACE).await;
            // Whoever moves `phase` first decides: a run that finished (with its own exit
            // code, e.g. 4) is not overwritten with 0, and a watchdog that committed to
            // exit is not raced by the engine thread's return.
            let doing = loop {
                let now = phase.load(Ordering::SeqCst);
                let doing = match now {
                    PHASE_LOADING => "while loading the model",
                    PHASE_INFERRING => "during an inference",
                    _ => return,
                };
                if phase
                    .compare_exchange(now, PHASE_EXITING, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
                {
                    break doing;
                }
            };
            eprintln!("gpushare-workload: stopped {doing} ({signal})");
            // `_exit`, not `exit`: the engine thread is still inside the model (maybe in
            // a CUDA library call), and running atexit handlers and library destructors
            // under it could hang or crash. The kernel frees memory, sockets and the GPU
            // context; nothing of the unfinished inference was recorded.
            // SAFETY: ends the process; no Rust state is observed afterwards.
            unsafe { libc::_exit(crate::error::exit::OK) }
        });
    }

    tracing::info!(model = %plan.preset, device = %plan.device, precision = %plan.precision, listen = %args.listen,
        pod = %identity.pod, strategy = %identity.strategy, "loading");
    let result = Engine::build(&plan).and_then(|mut engine| {
        // Not over a watchdog that already committed to exit.
        let _ = phase.compare_exchange(PHASE_LOADING, PHASE_INFERRING, Ordering::SeqCst, Ordering::SeqCst);
        engine.set_cancel(stop.clone());
        let load_seed = args
            .load_seed
            .unwrap_or_else(|| crate::load::arrival_seed(plan.seed, &identity.pod));
        metrics.set_info(plan.preset, plan.precision, engine.info(), (&args.load.0, load_seed));
        metrics.gpu_memory_used.set(engine.gpu_memory_used() as i64);
        tracing::info!(inferences = args.warmup, "warming up");
        for _ in 0..args.warmup {
            if stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            engine.infer()?;
        }
        metrics.ready.set(1);
        tracing::info!(device_name = %engine.info().name, gflop = engine.flops() / 1e9, "ready");
        let mut events = Events::new(args);
        match args.load.0 {
            LoadPattern::Closed => closed_loop(&mut engine, &metrics, &stop, args.add_latency, &mut events),
            LoadPattern::Poisson { rate } => open_loop(
                &mut engine,
                &metrics,
                &stop,
                OpenLoop {
                    rate,
                    seed: load_seed,
                    max_queue: args.max_queue,
                    add_latency: args.add_latency,
                },
                &mut events,
            ),
        }
    });
    if phase.swap(PHASE_DONE, Ordering::SeqCst) == PHASE_EXITING {
        // The watchdog is ending the process (exit 0 after a stop signal): wait for it.
        loop {
            std::thread::park();
        }
    }
    // An inference abandoned for a stop signal is a clean stop.
    let result = match result {
        Err(WorkloadError::Cancelled) => Ok(()),
        other => other,
    };
    if let Err(e) = &result {
        metrics.errors.with_label_values(&["failed"]).inc();
        metrics.ready.set(0);
        tracing::debug!(error = %e, "stopping after an error");
    }
    let _ = shutdown_tx.send(true);
    let _ = runtime.block_on(server);
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

/// Waits for SIGTERM or SIGINT and names it.
async fn wait_for_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            }
        }
        // Without signal handlers the process still dies on SIGTERM, just not cleanly.
        _ => std::future::pending().await,
    }
}

/// Host-side work of `d` after an inference: a busy wait, as pre- and post-processing
/// keep a CPU busy, and exact where a sleep would overshoot by the timer slack (≈50 µs).
/// Waits longer than 2 ms sleep most of the way first.
pub fn host_work(d: Duration) {
    if d.is_zero() {
        return;
    }
    let end = Instant::now() + d;
    if d > Duration::from_millis(2) {
        std::thread::sleep(d - Duration::from_millis(1));
    }
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

/// What the serving loop does besides inferring, at times counted from readiness:
/// `--grow-memory` steps, `--inject-fault-after` and `--crash-after`.
struct Events {
    start: Instant,
    fault_after: Option<Duration>,
    crash_after: Option<Duration>,
    grow: Vec<(Duration, u64)>,
    next_grow: usize,
}

impl Events {
    fn new(args: &ServeArgs) -> Self {
        Self {
            start: Instant::now(),
            fault_after: args.inject_fault_after,
            crash_after: args.crash_after,
            grow: args.grow_memory.clone().map(|g| g.0).unwrap_or_default(),
            next_grow: 0,
        }
    }

    /// Runs what is due: memory steps (an error when memory runs out), then the fault
    /// (always an error: it ends serving).
    fn due(&mut self, engine: &mut Engine, metrics: &WorkloadMetrics) -> Result<()> {
        // Nothing scheduled (the usual case): no clock read in the inference loop.
        if self.fault_after.is_none() && self.crash_after.is_none() && self.next_grow == self.grow.len() {
            return Ok(());
        }
        let now = self.start.elapsed();
        while let Some(&(at, bytes)) = self.grow.get(self.next_grow)
            && at <= now
        {
            tracing::warn!(bytes, "taking more memory (--grow-memory)");
            engine.grow(bytes)?;
            metrics.gpu_memory_used.set(engine.gpu_memory_used() as i64);
            self.next_grow += 1;
        }
        if self.fault_after.is_some_and(|f| f <= now) {
            tracing::warn!("injecting a fault (--inject-fault-after)");
            return Err(engine.inject_fault());
        }
        if self.crash_after.is_some_and(|c| c <= now) {
            return Err(crash());
        }
        Ok(())
    }
}

/// `--crash-after`: SIGKILL to this process. It returns only when the kernel ignored
/// the signal, which it does for its PID namespace's init (`kernel/signal.c`: a signal
/// from inside the namespace to an init without a handler is dropped).
fn crash() -> WorkloadError {
    tracing::warn!("killing this process with SIGKILL (--crash-after)");
    // SAFETY: kill(2) with this process's own id and a constant signal touches no memory.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    std::thread::sleep(Duration::from_millis(200));
    WorkloadError::CrashIgnored(std::process::id())
}

fn closed_loop(
    engine: &mut Engine,
    metrics: &WorkloadMetrics,
    stop: &AtomicBool,
    add: Duration,
    events: &mut Events,
) -> Result<()> {
    while !stop.load(Ordering::Relaxed) {
        events.due(engine, metrics)?;
        let t0 = Instant::now();
        engine.infer()?;
        host_work(add);
        metrics.inference_time.observe(t0.elapsed().as_secs_f64());
    }
    Ok(())
}

/// An open loop's settings.
struct OpenLoop {
    /// Arrivals per second.
    rate: f64,
    /// Seed of the arrival schedule.
    seed: u64,
    /// Most requests waiting.
    max_queue: usize,
    /// Host-side work per inference.
    add_latency: Duration,
}

/// Poisson arrivals; one engine serves them first come, first served. Latency runs from
/// a request's scheduled arrival to its completion, so it includes queueing.
fn open_loop(
    engine: &mut Engine,
    metrics: &WorkloadMetrics,
    stop: &AtomicBool,
    o: OpenLoop,
    events: &mut Events,
) -> Result<()> {
    let OpenLoop {
        rate,
        seed,
        max_queue,
        add_latency,
    } = o;
    let start = Instant::now();
    let mut schedule = ArrivalSchedule::new(rate, seed);
    let mut queue: VecDeque<f64> = VecDeque::new();
    let dropped = metrics.errors.with_label_values(&["dropped"]);
    while !stop.load(Ordering::Relaxed) {
        events.due(engine, metrics)?;
        let now = start.elapsed().as_secs_f64();
        while schedule.peek() <= now {
            let t = schedule.pop();
            if queue.len() >= max_queue {
                dropped.inc();
            } else {
                queue.push_back(t);
            }
        }
        metrics.queue_depth.set(queue.len() as i64);
        match queue.pop_front() {
            Some(arrival) => {
                engine.infer()?;
                host_work(add_latency);
                metrics.inference_time.observe(start.elapsed().as_secs_f64() - arrival);
            }
            None => {
                // Sleep until the next arrival, waking at least every 50 ms to see a stop.
                let wait = (schedule.peek() - start.elapsed().as_secs_f64()).clamp(0.0, 0.05);
                std::thread::sleep(Duration::from_secs_f64(wait));
            }
        }
    }
    Ok(())
}
