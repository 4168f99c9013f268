//! A sweep over several GPUs of this machine at once (`--gpus`). Each GPU is a lane: its
//! own backend (pods, MPS daemon and telemetry of that GPU only) and metrics source,
//! running one cell at a time through the one-GPU sweep's loop
//! ([`run_cells`](crate::sweep::runner::run_cells)); lane 0 on the calling task, each
//! other on a thread and runtime of its own. Every strategy's cells stay on one GPU
//! ([`assign`]), so a cell never waits on another's daemon and a resume finds them where
//! they were. The lanes share the run directory (rows saved as each cell ends) and a
//! record of when each GPU was busy, from which every cell's row says how many other
//! GPUs ran a cell beside it
//! ([`others_busy`](crate::sweep::runner::others_busy)). Then the cell that ran beside
//! the most others ([`check_cell`]) is measured again with the other GPUs idle and saved
//! to `alone.jsonl`: the report sets the two side by side (the GPUs share the host's
//! CPUs, PCIe and power).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};

use crate::backend::{Backend, Lane, Prepared, Session};
use crate::client::source::RequestSource;
use crate::config::plan::MeasureSettings;
use crate::domain::{Arm, CellStatus, Source};
use crate::error::{BenchError, Result};
use crate::metrics::scrape::ScrapeSource;
use crate::metrics::{MetricsSource, PodSnapshot, Target};
use crate::results::record::{CellRecord, PlanRecord};
use crate::results::store::RunStore;
use crate::shutdown::Shutdown;
use crate::sweep::SweepOutcome;
use crate::sweep::progress::{Progress, cell_title};
use crate::sweep::runner::{CellRunner, SharedStore, finish, labels, outcome, run_cells};

/// The arms each of `lanes` GPUs runs, each list in plan order (pure). An arm `pinned`
/// to a lane (a resumed run's, whose rows name their GPU) stays there; the others go,
/// costliest first, to the lane with the least work so far (the longest-processing-time
/// rule; among equals the plan's order and the lower lane). `cost` is an arm's cells
/// still to measure, 0 for an arm that cannot run.
pub fn assign(
    arms: &[Arm],
    lanes: usize,
    cost: impl Fn(Arm) -> u64,
    pinned: impl Fn(Arm) -> Option<usize>,
) -> Vec<Vec<Arm>> {
    let lanes = lanes.max(1);
    let mut chosen: Vec<Option<usize>> = arms.iter().map(|a| pinned(*a).filter(|l| *l < lanes)).collect();
    let mut load = vec![0u64; lanes];
    for (i, l) in chosen.iter().enumerate() {
        if let Some(l) = l {
            load[*l] += cost(arms[i]);
        }
    }
    let mut free: Vec<usize> = (0..arms.len()).filter(|i| chosen[*i].is_none()).collect();
    free.sort_by_key(|i| (std::cmp::Reverse(cost(arms[*i])), *i));
    for i in free {
        let l = (0..lanes).min_by_key(|l| (load[*l], *l)).unwrap_or(0);
        load[l] += cost(arms[i]);
        chosen[i] = Some(l);
    }
    (0..lanes)
        .map(|l| {
            arms.iter()
                .zip(&chosen)
                .filter(|(_, c)| **c == Some(l))
                .map(|(a, _)| *a)
                .collect()
        })
        .collect()
}

/// The cell measured again alone (pure): of the measured (`ok`) cells that ran beside
/// another GPU's, the one beside the most on average; among equals the one with more
/// pods, then the first saved.
pub fn check_cell(rows: &[CellRecord]) -> Option<&CellRecord> {
    let beside = |r: &CellRecord| r.other_gpus_busy.filter(|b| *b > 0.0);
    let mut best: Option<&CellRecord> = None;
    for r in rows
        .iter()
        .filter(|r| r.is_aggregate() && r.status == CellStatus::Ok && r.gpu.is_some() && beside(r).is_some())
    {
        let key = |x: &CellRecord| (beside(x).unwrap_or(0.0), x.pods);
        if best.is_none_or(|b| key(r) > key(b)) {
            best = Some(r);
        }
    }
    best
}

/// Whether `a` and `b` are rows of the same cell.
fn same_cell(a: &CellRecord, b: &CellRecord) -> bool {
    a.repeat == b.repeat && a.arm() == b.arm() && a.pods == b.pods
}

/// A lane's progress events, sent to the caller's [`Progress`] with its GPU named.
enum Event {
    CellStart(String),
    Phase(String),
    Window(usize, f64, f64, bool),
    CellDone(String, bool),
    Message(String),
}

/// The [`Progress`] of one lane: every event to the main task.
struct LaneProgress {
    gpu: u32,
    tx: UnboundedSender<(u32, Event)>,
}

impl LaneProgress {
    fn send(&self, e: Event) {
        // The receiver lives until every lane has ended.
        let _ = self.tx.send((self.gpu, e));
    }
}

impl Progress for LaneProgress {
    fn sweep_start(&self, _: u64, _: u64, _: &str) {}
    fn cell_start(&self, what: &str) {
        self.send(Event::CellStart(what.to_string()));
    }
    fn phase(&self, text: &str) {
        self.send(Event::Phase(text.to_string()));
    }
    fn window(&self, n: usize, throughput: f64, mean: f64, stable: bool) {
        self.send(Event::Window(n, throughput, mean, stable));
    }
    fn cell_done(&self, summary: &str, failed: bool) {
        self.send(Event::CellDone(summary.to_string(), failed));
    }
    fn message(&self, text: &str) {
        self.send(Event::Message(text.to_string()));
    }
    fn finish(&self) {}
}

/// Forwards one lane event to the user's progress, the GPU named.
fn forward(progress: &dyn Progress, gpu: u32, e: Event) {
    match e {
        Event::CellStart(w) => progress.cell_start(&format!("GPU {gpu}: {w}")),
        Event::Phase(t) => progress.phase(&format!("GPU {gpu}: {t}")),
        Event::Window(n, t, m, s) => progress.window(n, t, m, s),
        Event::CellDone(summary, failed) => progress.cell_done(&format!("GPU {gpu}: {summary}"), failed),
        Event::Message(t) => progress.message(&format!("GPU {gpu}: {t}")),
    }
}

/// The metrics source of a lane on this machine: each pod's `/metrics` scraped, or the
/// harness's own requests (`--request`).
pub enum DirectSource {
    /// The direct scrape.
    Scrape(ScrapeSource),
    /// The harness's requests.
    Requests(Box<RequestSource>),
}

impl DirectSource {
    /// The source a recorded plan names (a Prometheus is refused with `--gpus`).
    pub fn for_plan(plan: &PlanRecord) -> Result<Self> {
        match &plan.request {
            Some(r) => RequestSource::new(r, plan.load).map(|s| Self::Requests(Box::new(s))),
            None => Ok(Self::Scrape(ScrapeSource::default().reading(&plan.metric))),
        }
    }
}

impl MetricsSource for DirectSource {
    fn kind(&self) -> Source {
        match self {
            Self::Scrape(s) => s.kind(),
            Self::Requests(s) => s.kind(),
        }
    }
    async fn prepare(&self, targets: &[Target], shutdown: &Shutdown) -> Result<()> {
        match self {
            Self::Scrape(s) => s.prepare(targets, shutdown).await,
            Self::Requests(s) => s.prepare(targets, shutdown).await,
        }
    }
    async fn snapshot(&self, targets: &[Target]) -> Result<Vec<(String, Result<PodSnapshot>)>> {
        match self {
            Self::Scrape(s) => s.snapshot(targets).await,
            Self::Requests(s) => s.snapshot(targets).await,
        }
    }
    fn release(&self) {
        match self {
            Self::Scrape(s) => s.release(),
            Self::Requests(s) => s.release(),
        }
    }
}

/// How the lanes run: the recorded plan's measurement, each lane's source, and (tests)
/// a paused clock in every lane's runtime.
pub struct LaneSettings<F> {
    /// Warm-up, windows, limits.
    pub measure: MeasureSettings,
    /// A lane's metrics source, made on its thread.
    pub source: F,
    /// Lanes run in paused tokio time (tests with scripted backends).
    pub paused: bool,
}

/// What one lane's thread needs.
struct LaneContext<F> {
    index: usize,
    arms: Vec<Arm>,
    shared: Arc<SharedStore<RunStore>>,
    plan: PlanRecord,
    measure: MeasureSettings,
    source: Arc<F>,
    progress: LaneProgress,
    shutdown: Shutdown,
    paused: bool,
}

/// Runs (or resumes) the sweep of `session` over its GPU (`first_gpu`) and those of
/// `more`, then measures one cell again alone, restores every GPU's backend and
/// records how the run ended.
pub async fn run<B, S, F>(
    session: Session<B>,
    first_gpu: u32,
    more: Vec<Lane<B>>,
    settings: LaneSettings<F>,
    progress: &dyn Progress,
    shutdown: &Shutdown,
) -> Result<SweepOutcome>
where
    B: Backend + Send + 'static,
    S: MetricsSource,
    F: Fn(&B, &PlanRecord) -> Result<S> + Send + Sync + 'static,
{
    let Session {
        backend,
        store,
        metrics,
        telemetry,
        settings: _,
        notes,
        keep_alive,
    } = session;
    for n in &notes {
        progress.message(n);
    }
    let lanes: Vec<Lane<B>> = std::iter::once(Lane {
        gpu: first_gpu,
        backend,
        telemetry,
    })
    .chain(more)
    .collect();
    let plan = store.run().plan.clone();
    let LaneSettings {
        measure,
        source,
        paused,
    } = settings;
    let source = Arc::new(source);
    let (mut lanes, mut store, result) =
        run_lanes(lanes, store, &plan, measure, &source, paused, progress, shutdown).await;
    // With every GPU idle again, the cell that ran beside the most others, alone.
    let result = match result {
        Ok(ran) if !shutdown.is_requested() => {
            alone_check(&mut lanes, &mut store, &measure, &*source, progress, shutdown)
                .await
                .map(|()| ran)
        }
        other => other,
    };
    let first = lanes.swap_remove(0);
    let session = Session {
        backend: first.backend,
        store,
        metrics,
        telemetry: first.telemetry,
        settings: measure,
        notes: Vec::new(),
        keep_alive,
    };
    finish(session, result, progress, shutdown).await.map(outcome)
}

/// Every lane's cells, lane 0's on this task and the others' each on a thread of its
/// own; the lanes and the store back (a lane whose thread panicked is missing), and the
/// first error (an interrupt only when nothing else went wrong).
#[allow(clippy::too_many_arguments)]
async fn run_lanes<B, S, F>(
    mut lanes: Vec<Lane<B>>,
    store: RunStore,
    plan: &PlanRecord,
    measure: MeasureSettings,
    source: &Arc<F>,
    paused: bool,
    progress: &dyn Progress,
    shutdown: &Shutdown,
) -> (Vec<Lane<B>>, RunStore, Result<usize>)
where
    B: Backend + Send + 'static,
    S: MetricsSource,
    F: Fn(&B, &PlanRecord) -> Result<S> + Send + Sync + 'static,
{
    let repeats = plan.repeat.max(1);
    let arms = plan.arms();
    // An arm that cannot run costs nothing; one with rows stays on their GPU.
    let mut cost = Vec::new();
    for &arm in &arms {
        let runs = match lanes[0].backend.prepare(arm, shutdown).await {
            Ok(Prepared::Ready) => 1,
            Ok(Prepared::Unavailable(_)) => 0,
            Err(e) => return (lanes, store, Err(e)),
        };
        let missing = (1..=repeats)
            .flat_map(|r| plan.pods.iter().map(move |p| (r, *p)))
            .filter(|(r, p)| !store.has_cell(*r, arm, *p))
            .count() as u64;
        cost.push(missing * runs);
    }
    let gpus: Vec<u32> = lanes.iter().map(|l| l.gpu).collect();
    let pinned = |arm: Arm| {
        let gpu = store.cells().iter().find(|c| c.arm() == arm).and_then(|c| c.gpu)?;
        gpus.iter().position(|g| *g == gpu)
    };
    let cost_of = |arm: Arm| arms.iter().position(|a| *a == arm).map_or(0, |i| cost[i]);
    let plan_of_lanes = assign(&arms, lanes.len(), cost_of, pinned);
    for (gpu, arms) in gpus.iter().zip(&plan_of_lanes) {
        let names: Vec<String> = arms.iter().map(|a| a.title()).collect();
        let names = if names.is_empty() {
            "nothing to measure".to_string()
        } else {
            names.join(", ")
        };
        progress.message(&format!("GPU {gpu}: {names}"));
    }
    let total = (arms.len() * plan.pods.len()) as u64 * u64::from(repeats);
    let done = store.cells().iter().filter(|c| c.is_aggregate()).count() as u64;
    // The GPUs measure side by side, so the bar's cells end about one per busy GPU at a time.
    let busy = plan_of_lanes.iter().filter(|a| !a.is_empty()).count().max(1) as u32;
    let (least, most) = measure.cell_time();
    progress.plan_per_item(least / busy, most / busy);
    progress.sweep_start(total, done, "cells");

    let shared = Arc::new(SharedStore::new(store, lanes.len()));
    let (tx, mut rx) = unbounded_channel();
    let context = |index: usize, gpu: u32, arms: Vec<Arm>| LaneContext {
        index,
        arms,
        shared: shared.clone(),
        plan: plan.clone(),
        measure,
        source: source.clone(),
        progress: LaneProgress { gpu, tx: tx.clone() },
        shutdown: shutdown.clone(),
        paused,
    };
    let mut plans = plan_of_lanes.into_iter();
    let mut first = lanes.remove(0);
    let first_ctx = context(0, first.gpu, plans.next().unwrap_or_default());
    let mut threads = Vec::new();
    let mut results = Vec::new();
    for (i, (lane, arms)) in lanes.drain(..).zip(plans).enumerate() {
        let ctx = context(i + 1, lane.gpu, arms);
        let gpu = lane.gpu;
        match std::thread::Builder::new()
            .name(format!("gpu-{gpu}"))
            .spawn(move || lane_thread(lane, ctx))
        {
            Ok(h) => threads.push((gpu, h)),
            Err(e) => {
                shared.abort.store(true, Ordering::SeqCst);
                results.push(Err(BenchError::io(format!("starting the thread of GPU {gpu}"))(e)));
            }
        }
    }
    drop(tx);
    // Lane 0 here, while every lane's events reach the user until the last has ended.
    let first_result = async {
        let ctx = first_ctx;
        lane_work(&mut first, &ctx).await
    };
    let forwarding = async {
        while let Some((gpu, e)) = rx.recv().await {
            forward(progress, gpu, e);
        }
    };
    let (first_result, ()) = tokio::join!(first_result, forwarding);
    results.insert(0, first_result);
    let mut lanes = vec![first];
    for (gpu, h) in threads {
        // Every lane has ended: its events stopped when it dropped its sender.
        match h.join() {
            Ok((lane, r)) => {
                lanes.push(lane);
                results.push(r);
            }
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                results.push(Err(BenchError::Results {
                    path: std::path::PathBuf::from(format!("GPU {gpu}")),
                    reason: format!(
                        "its lane stopped on an internal error ({what}); its pods were stopped as it unwound, the cells saved before it are kept, and --resume measures the rest"
                    ),
                }));
            }
        }
    }
    let store = Arc::into_inner(shared)
        .expect("every lane has ended, so none holds the store")
        .into_inner();
    (lanes, store, first_error(results))
}

/// The lanes' cells in total, or the first error that is not an interrupt (else the
/// interrupt).
fn first_error(results: Vec<Result<usize>>) -> Result<usize> {
    let mut ran = 0;
    let mut interrupt = None;
    for r in results {
        match r {
            Ok(n) => ran += n,
            Err(e) if e.is_interrupt() => interrupt = interrupt.or(Some(e)),
            Err(e) => return Err(e),
        }
    }
    interrupt.map_or(Ok(ran), Err)
}

/// A lane on its own thread and runtime (paused in tests); the lane back with its result.
/// Its pods are forked from this thread, whose death is what their PDEATHSIG follows
/// (`process::OwnedChild::spawn`): it lives until they are stopped, and dies with the
/// harness on any signal.
fn lane_thread<B, S, F>(mut lane: Lane<B>, ctx: LaneContext<F>) -> (Lane<B>, Result<usize>)
where
    B: Backend,
    S: MetricsSource,
    F: Fn(&B, &PlanRecord) -> Result<S>,
{
    // A lane that panics makes the others stop after their cell, as one that fails.
    struct AbortOnPanic<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for AbortOnPanic<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                self.0.store(true, Ordering::SeqCst);
            }
        }
    }
    let _abort = AbortOnPanic(&ctx.shared.abort);
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_all();
    #[cfg(test)]
    if ctx.paused {
        builder.start_paused(true);
    }
    let _ = ctx.paused;
    let result = match builder.build() {
        Ok(rt) => rt.block_on(lane_work(&mut lane, &ctx)),
        Err(e) => {
            ctx.shared.abort.store(true, Ordering::SeqCst);
            Err(BenchError::io(format!("starting the runtime of GPU {}", lane.gpu))(e))
        }
    };
    (lane, result)
}

/// A lane's cells with its own metrics source; its backend restored at the end. A lane
/// that fails makes the others stop after their cell.
async fn lane_work<B, S, F>(lane: &mut Lane<B>, ctx: &LaneContext<F>) -> Result<usize>
where
    B: Backend,
    S: MetricsSource,
    F: Fn(&B, &PlanRecord) -> Result<S>,
{
    let result = match (ctx.source)(&lane.backend, &ctx.plan) {
        Ok(source) => {
            let mut cells = CellRunner {
                backend: &mut lane.backend,
                source: &source,
                telemetry: lane.telemetry.clone(),
                settings: &ctx.measure,
                progress: &ctx.progress,
                shutdown: &ctx.shutdown,
            };
            run_cells(&mut cells, &ctx.arms, &ctx.shared, Some((ctx.index, lane.gpu))).await
        }
        Err(e) => Err(e),
    };
    if result.is_err() {
        ctx.shared.abort.store(true, Ordering::SeqCst);
    }
    let restored = lane.backend.restore(&ctx.shutdown).await;
    match (result, restored) {
        (Ok(n), Ok(())) => Ok(n),
        (Err(e), _) | (Ok(_), Err(e)) => Err(e),
    }
}

/// Measures [`check_cell`] again on its GPU with the others idle, into `alone.jsonl`
/// (once: a resumed run that has it measures nothing more).
async fn alone_check<B, S, F>(
    lanes: &mut [Lane<B>],
    store: &mut RunStore,
    measure: &MeasureSettings,
    source: &F,
    progress: &dyn Progress,
    shutdown: &Shutdown,
) -> Result<()>
where
    B: Backend,
    S: MetricsSource,
    F: Fn(&B, &PlanRecord) -> Result<S>,
{
    let Some(row) = check_cell(store.cells()).cloned() else {
        progress.message("no cell ran beside another GPU's: none to measure again alone");
        return Ok(());
    };
    if store.alone().iter().any(|a| same_cell(a, &row)) {
        return Ok(());
    }
    let Some(lane) = lanes.iter_mut().find(|l| Some(l.gpu) == row.gpu) else {
        progress.message(&format!(
            "the GPU that measured {} × {} (GPU {:?}) is not among this run's: none measured again alone",
            row.arm().title(),
            row.pods,
            row.gpu
        ));
        return Ok(());
    };
    let (arm, pods, repeat) = (row.arm(), row.pods, row.repeat);
    let plan = store.run().plan.clone();
    let source = source(&lane.backend, &plan)?;
    let prepared = lane.backend.prepare(arm, shutdown).await?;
    let repeats = plan.repeat.max(1);
    let title = format!(
        "{} again on GPU {}, the other GPUs idle",
        cell_title(arm, pods, (repeats > 1).then_some((repeat, repeats))),
        lane.gpu
    );
    let gpu = lane.gpu;
    let mut cells = CellRunner {
        backend: &mut lane.backend,
        source: &source,
        telemetry: lane.telemetry.clone(),
        settings: measure,
        progress,
        shutdown,
    };
    let labels = labels(store, arm, pods, repeat);
    let load = plan.load.workload_args(pods);
    let baseline = store.aggregate(repeat, arm, 1).cloned();
    let mut measured = cells
        .measure(&prepared, &labels, &title, &load, baseline.as_ref())
        .await?;
    // A check that could not be measured is not kept: a resume tries it again.
    if let Some(a) = measured
        .rows
        .iter()
        .find(|r| r.is_aggregate() && r.status != CellStatus::Ok)
    {
        progress.message(&format!(
            "the cell measured again alone came out {}: {}; nothing kept, --resume tries it again",
            a.status, a.note
        ));
        return measured.after_save(shutdown);
    }
    for r in &mut measured.rows {
        r.gpu = Some(gpu);
        if r.is_aggregate() {
            r.other_gpus_busy = Some(0.0);
        }
    }
    store.save_alone(std::mem::take(&mut measured.rows))?;
    measured.after_save(shutdown)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Strategy;

    fn arms(names: &str) -> Vec<Arm> {
        names
            .split(',')
            .map(|n| Arm::of(n.parse::<Strategy>().expect("strategy")))
            .collect()
    }

    fn names(lanes: &[Vec<Arm>]) -> Vec<String> {
        lanes
            .iter()
            .map(|l| l.iter().map(|a| a.strategy.name()).collect::<Vec<_>>().join(","))
            .collect()
    }

    #[test]
    fn strategies_spread_over_the_gpus_by_their_cells_to_measure() {
        let all = arms("exclusive,time-slicing,mps,mig");
        let four = |_: Arm| 4;
        let none = |_: Arm| None;
        // The default sweep on two GPUs: two strategies each, in plan order.
        assert_eq!(
            names(&assign(&all, 2, four, none)),
            ["exclusive,mps", "time-slicing,mig"]
        );
        // MIG cannot run here: it costs nothing, so the two busy lanes are balanced.
        let no_mig = |a: Arm| if a.strategy == Strategy::Mig { 0 } else { 4 };
        assert_eq!(
            names(&assign(&all, 2, no_mig, none)),
            ["exclusive,mps", "time-slicing,mig"]
        );
        assert_eq!(
            names(&assign(&all, 3, no_mig, none)),
            ["exclusive,mig", "time-slicing", "mps"]
        );
        // Eight GPUs: one strategy each, the rest idle.
        let eight = assign(&all, 8, four, none);
        assert_eq!(eight.len(), 8);
        assert_eq!(names(&eight[..5]), ["exclusive", "time-slicing", "mps", "mig", ""]);
        // Uneven work: the costliest first, each to the least loaded GPU.
        let cost = |a: Arm| match a.strategy {
            Strategy::Exclusive => 2,
            Strategy::TimeSlicing => 8,
            Strategy::Mps => 5,
            Strategy::Mig => 4,
        };
        // Time-slicing (8), MPS (5), MIG (4), exclusive (2): loads 10 and 9.
        assert_eq!(
            names(&assign(&all, 2, cost, none)),
            ["exclusive,time-slicing", "mps,mig"]
        );
        // A resumed run keeps each strategy on the GPU its rows name.
        let pinned = |a: Arm| (a.strategy == Strategy::Exclusive).then_some(1);
        assert_eq!(
            names(&assign(&all, 2, four, pinned)),
            ["time-slicing,mps", "exclusive,mig"]
        );
        // One lane: the plan as it is.
        assert_eq!(names(&assign(&all, 1, four, none)), ["exclusive,time-slicing,mps,mig"]);
    }

    #[test]
    fn the_cell_measured_again_is_the_one_beside_the_most_others() {
        let row = |s: Strategy, pods: u32, status: CellStatus, beside: Option<f64>| CellRecord {
            gpu: Some(1),
            other_gpus_busy: beside,
            ..CellRecord::unmeasured(
                s,
                pods,
                crate::results::record::ALL_PODS,
                status,
                Source::Scrape,
                crate::domain::DeviceKind::Cuda,
            )
        };
        let rows = vec![
            row(Strategy::Exclusive, 1, CellStatus::Ok, Some(0.9)),
            row(Strategy::Mps, 3, CellStatus::Ok, Some(0.9)),
            row(Strategy::Mps, 7, CellStatus::Failed, Some(1.0)),
            row(Strategy::TimeSlicing, 5, CellStatus::Ok, Some(0.4)),
        ];
        let c = check_cell(&rows).expect("a cell");
        assert_eq!(
            (c.strategy, c.pods),
            (Strategy::Mps, 3),
            "failed cells are not measured again"
        );
        let alone: Vec<CellRecord> = rows
            .iter()
            .map(|r| CellRecord {
                other_gpus_busy: Some(0.0),
                ..r.clone()
            })
            .collect();
        assert!(check_cell(&alone).is_none(), "nothing ran beside another GPU");
        assert!(check_cell(&[]).is_none());
    }
}
