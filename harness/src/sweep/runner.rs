//! The generic runner: for each strategy, prepare it; for each pod count, launch the
//! cell, measure it, stop its pods and save its rows before the next cell starts;
//! restore at the end and on every failure path. A stop request ends every wait at
//! once; the pods (and any MPS daemon) are stopped and every finished cell is kept.

use std::borrow::BorrowMut;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::backend::{Backend, Prepared, Session};
use crate::client::source::RequestSource;
use crate::clock::now_rfc3339;
use crate::config::plan::{MeasureSettings, PrometheusSetting};
use crate::domain::{Arm, CellStatus};
use crate::error::{BenchError, Result};
use crate::metrics::MetricsSource;
use crate::metrics::prometheus::PrometheusSource;
use crate::metrics::scrape::ScrapeSource;
use crate::results::record::{CellRecord, Unavailable};
use crate::results::store::RunStore;
use crate::shutdown::Shutdown;
use crate::sweep::SweepOutcome;
use crate::sweep::cell::{CellLabels, add_note, cell_summary, failed_rows, unavailable_rows};
use crate::sweep::measure::measure_cell;
use crate::sweep::progress::{Progress, cell_title};
use crate::telemetry::Telemetry;

/// What a run does with its session once the metrics source is up: a sweep measures
/// its cells, an isolation run its trials. Returns how many it ran in this invocation.
#[allow(async_fn_in_trait)] // used generically on one task; no Send bounds needed
pub trait Work<B: Backend> {
    /// Runs the work; every finished part is saved in `session.store` as it ends.
    async fn run<S: MetricsSource>(
        &mut self,
        session: &mut Session<B>,
        source: &S,
        progress: &dyn Progress,
        shutdown: &Shutdown,
    ) -> Result<usize>;
}

/// A sweep's work: every cell of the recorded plan not yet on disk.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cells;

impl<B: Backend> Work<B> for Cells {
    async fn run<S: MetricsSource>(
        &mut self,
        session: &mut Session<B>,
        source: &S,
        progress: &dyn Progress,
        shutdown: &Shutdown,
    ) -> Result<usize> {
        let run = session.store.run();
        if run.kind != crate::config::plan::RunKind::Sweep {
            return Err(BenchError::flag("--resume", &run.run_id, run.kind.resume_hint()));
        }
        sweep_cells(
            &mut session.backend,
            source,
            session.telemetry.clone(),
            &session.settings,
            &mut session.store,
            progress,
            shutdown,
        )
        .await
    }
}

/// A run that ended: its store (still locked, run.json final) and how many parts this
/// invocation ran.
#[derive(Debug)]
pub struct Finished {
    /// The run directory.
    pub store: RunStore,
    /// Cells or trials run in this invocation.
    pub ran: usize,
}

/// Runs a session's cells with the metrics source its setting names, then restores the
/// backend and records how the run ended, whatever happened; returns the run's outcome.
pub async fn run<B: Backend>(
    session: Session<B>,
    progress: &dyn Progress,
    shutdown: &Shutdown,
) -> Result<SweepOutcome> {
    run_work(session, &mut Cells, progress, shutdown).await.map(outcome)
}

/// Runs `work` in a session with the metrics source its setting names (a private
/// Prometheus is stopped before the run ends), then [`finish`]es the run.
pub async fn run_work<B: Backend, W: Work<B>>(
    mut session: Session<B>,
    work: &mut W,
    progress: &dyn Progress,
    shutdown: &Shutdown,
) -> Result<Finished> {
    for n in &session.notes {
        progress.message(n);
    }
    match session.metrics.clone() {
        PrometheusSetting::Off => {
            let plan = &session.store.run().plan;
            if let Some(request) = plan.request.clone() {
                // The harness sends the requests and times them (`--request`).
                let source = match RequestSource::new(&request, plan.load) {
                    Ok(s) => s,
                    Err(e) => return finish(session, Err(e), progress, shutdown).await,
                };
                let result = work.run(&mut session, &source, progress, shutdown).await;
                source.release();
                return finish(session, result, progress, shutdown).await;
            }
            let scrape = ScrapeSource::default().reading(&plan.metric);
            let result = work.run(&mut session, &scrape, progress, shutdown).await;
            finish(session, result, progress, shutdown).await
        }
        PrometheusSetting::Spawn => {
            let mut source = match PrometheusSource::spawn(session.store.dir(), shutdown).await {
                Ok(s) => s
                    .reading(&session.store.run().plan.metric)
                    .waiting_up_to(session.settings.ready_timeout),
                Err(e) => return finish(session, Err(e), progress, shutdown).await,
            };
            progress.message(&format!("Prometheus: private server at {}", source.client().base()));
            let result = work.run(&mut session, &source, progress, shutdown).await;
            // The server stops while the run is still locked and journaled.
            source.stop(shutdown).await;
            finish(session, result, progress, shutdown).await
        }
        PrometheusSetting::Url(url) => {
            let source = PrometheusSource::connect(&url)
                .reading(&session.store.run().plan.metric)
                .waiting_up_to(session.settings.ready_timeout);
            let result = work.run(&mut session, &source, progress, shutdown).await;
            finish(session, result, progress, shutdown).await
        }
    }
}

/// [`run`] with a given metrics source (tests drive the runner with scripted ones).
pub async fn run_with_source<B: Backend, S: MetricsSource>(
    session: Session<B>,
    source: &S,
    progress: &dyn Progress,
    shutdown: &Shutdown,
) -> Result<SweepOutcome> {
    run_work_with_source(session, &mut Cells, source, progress, shutdown)
        .await
        .map(outcome)
}

/// [`run_work`] with a given metrics source.
pub async fn run_work_with_source<B: Backend, W: Work<B>, S: MetricsSource>(
    mut session: Session<B>,
    work: &mut W,
    source: &S,
    progress: &dyn Progress,
    shutdown: &Shutdown,
) -> Result<Finished> {
    for n in &session.notes {
        progress.message(n);
    }
    let result = work.run(&mut session, source, progress, shutdown).await;
    finish(session, result, progress, shutdown).await
}

/// A sweep's outcome from its finished store.
pub(crate) fn outcome(f: Finished) -> SweepOutcome {
    SweepOutcome::of(f.store.dir(), f.store.run().label.clone(), f.store.cells(), f.ran)
}

/// Restores the backend and records how the run ended.
pub(crate) async fn finish<B: Backend>(
    session: Session<B>,
    result: Result<usize>,
    progress: &dyn Progress,
    shutdown: &Shutdown,
) -> Result<Finished> {
    let Session {
        mut backend,
        mut store,
        keep_alive,
        ..
    } = session;
    let restored = backend.restore(shutdown).await;
    drop(keep_alive);
    // Everything this run started is stopped: the journal is final while the run is
    // still locked, and nothing written after the lock is released touches it.
    crate::process::supervisor::detach_journal();
    let interrupted = matches!(&result, Err(e) if e.is_interrupt());
    let recorded = store.update_run(|r| {
        r.state = match (&result, interrupted) {
            (Ok(_), _) => "complete".into(),
            (Err(_), true) => "interrupted".into(),
            (Err(_), false) => "failed".into(),
        };
        r.finished_at = Some(now_rfc3339());
    });
    if result.is_err() {
        // The sweep's error is what the exit reports; a failed restore or a run.json that
        // could not be updated (a full disk) must not be lost, nor hide it. The report
        // names a run.json left `running` a partial run.
        if let Err(r) = &restored {
            progress.message(&format!(
                "restoring failed too, the machine or node may still be changed: {r}"
            ));
        }
        if let Err(e) = &recorded {
            progress.message(&format!("run.json still says running: {e}"));
        }
    }
    progress.finish();
    let ran = result?;
    restored?;
    recorded?;
    Ok(Finished { store, ran })
}

async fn sweep_cells<B: Backend, S: MetricsSource>(
    backend: &mut B,
    source: &S,
    telemetry: Arc<dyn Telemetry>,
    settings: &MeasureSettings,
    store: &mut RunStore,
    progress: &dyn Progress,
    shutdown: &Shutdown,
) -> Result<usize> {
    let plan = store.run().plan.clone();
    let arms = plan.arms();
    let total = (arms.len() * plan.pods.len()) as u64 * u64::from(plan.repeat.max(1));
    let done = store.cells().iter().filter(|c| c.is_aggregate()).count() as u64;
    let (least, most) = settings.cell_time();
    progress.plan_per_item(least, most);
    progress.sweep_start(total, done, "cells");
    let mut cells = CellRunner {
        backend,
        source,
        telemetry,
        settings,
        progress,
        shutdown,
    };
    run_cells(&mut cells, &arms, &SharedStore::new(store, 1), None).await
}

/// The cells of `arms` not yet on disk, pass by pass (each pass's arms rotated), every
/// cell's rows saved as it ends: a sweep's whole plan on one GPU, or one GPU's share of
/// a `--gpus` sweep (`lane`: its index among the lanes and its GPU, which the rows
/// record with how many other GPUs were busy beside each cell). A stop request ends it
/// before the next arm or cell; another lane's failure after the cell running.
pub(crate) async fn run_cells<B: Backend, S: MetricsSource, T: BorrowMut<RunStore>>(
    cells: &mut CellRunner<'_, B, S>,
    arms: &[Arm],
    shared: &SharedStore<T>,
    lane: Option<(usize, u32)>,
) -> Result<usize> {
    let plan = shared.with(|s| s.run().plan.clone());
    let repeats = plan.repeat.max(1);
    let shutdown = cells.shutdown;
    let missing = |repeat: u32, arm: Arm| -> Vec<u32> {
        shared.with(|s| {
            plan.pods
                .iter()
                .copied()
                .filter(|p| !s.has_cell(repeat, arm, *p))
                .collect()
        })
    };
    // A precision target: after two passes, a cell is measured again only while its
    // interval is wider than the target; the budget stops the sweep before a cell.
    let started = tokio::time::Instant::now();
    let budget = plan.budget_s.map(Duration::from_secs_f64);
    // Whether the budget is spent (said once, where the sweep stops).
    let spent = |progress: &dyn Progress| -> bool {
        let Some(b) = budget.filter(|b| started.elapsed() >= *b) else {
            return false;
        };
        progress.message(&format!(
            "the budget of {} s is spent: no further cell",
            b.as_secs_f64().round()
        ));
        true
    };
    let unsettled = |repeat: u32, arm: Arm, pods: u32| -> bool {
        match plan.target {
            Some(target) if repeat > 2 => shared.with(|s| {
                let rows: Vec<&CellRecord> = (1..repeat).filter_map(|r| s.aggregate(r, arm, pods)).collect();
                !crate::results::repeats::settled(&rows, target)
            }),
            _ => true,
        }
    };
    let mut ran = 0;
    'passes: for repeat in 1..=repeats {
        let order = rotated(arms, repeat);
        // The cells a pass measures; each pass's speed-ups are against its own 1-pod
        // cell, so a pass that measures any cell of an arm measures its 1-pod cell too,
        // first (settled or not).
        let mut count = 0;
        let wanted: Vec<(Arm, Vec<u32>)> = order
            .iter()
            .map(|a| {
                let left = missing(repeat, *a);
                let mut pods: Vec<u32> = left.iter().copied().filter(|p| unsettled(repeat, *a, *p)).collect();
                count += pods.len();
                if !pods.is_empty() && left.contains(&1) && !pods.contains(&1) {
                    pods.push(1);
                }
                pods.sort_by_key(|&p| p != 1);
                (*a, pods)
            })
            .collect();
        if count == 0 {
            continue;
        }
        if let Some(target) = plan.target {
            cells.progress.message(&format!(
                "pass {repeat} (at most {repeats}): {count} cell{} {}",
                if count == 1 { "" } else { "s" },
                if repeat <= 2 {
                    "(every cell gets two)".to_string()
                } else {
                    format!("wider than ±{}", percent(target))
                }
            ));
        } else if repeats > 1 {
            cells.progress.message(&format!(
                "repeat {repeat} of {repeats}: {}",
                order.iter().map(|a| a.name()).collect::<Vec<_>>().join(", ")
            ));
        }
        for (arm, to_measure) in wanted {
            if shutdown.is_requested() {
                return Err(shutdown.interrupted());
            }
            if to_measure.is_empty() {
                continue;
            }
            if spent(cells.progress) {
                break 'passes;
            }
            let prepared = cells.prepare_arm(arm).await?;
            if let Prepared::Unavailable(reason) = &prepared {
                shared.with(|s| record_unavailable(s, arm, reason))?;
            }
            for pods in to_measure {
                if shared.abort.load(Ordering::SeqCst) {
                    return Ok(ran);
                }
                if spent(cells.progress) {
                    break 'passes;
                }
                let (labels, load, baseline) = shared.with(|s| {
                    let labels = labels(s, arm, pods, repeat);
                    // `total:RATE` is split over every pod of the cell, on all its GPUs.
                    let load = s.run().plan.load.workload_args(labels.pods * labels.gpus);
                    // This pass's own 1-pod cell (measured first in every pass).
                    let baseline = s.aggregate(repeat, arm, 1).cloned();
                    (labels, load, baseline)
                });
                let title = cell_title(arm, pods, (repeats > 1).then_some((repeat, repeats)));
                let start = lane.map(|(i, _)| shared.busy(i));
                let measured = cells
                    .measure(&prepared, &labels, &title, &load, baseline.as_ref())
                    .await;
                let beside = lane.zip(start).and_then(|((i, _), t)| shared.idle(i, t));
                let mut measured = measured?;
                if let Some((_, gpu)) = lane {
                    for r in &mut measured.rows {
                        r.gpu = Some(gpu);
                        if r.is_aggregate() && prepared == Prepared::Ready {
                            r.other_gpus_busy = beside;
                        }
                    }
                }
                shared.with(|s| s.save_cell_with(std::mem::take(&mut measured.rows), measured.raw.take()))?;
                measured.after_save(shutdown)?;
                ran += 1;
            }
        }
    }
    if let Some(target) = plan.target {
        let wide = shared.with(|s| wider_than(s, arms, &plan.pods, target));
        cells.progress.message(&if wide.is_empty() {
            format!(
                "every cell is within ±{} (95% interval on mean latency and throughput)",
                percent(target)
            )
        } else {
            format!(
                "not within ±{}: {}",
                percent(target),
                wide.iter()
                    .map(|(name, why)| format!("{name} ({why})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        });
    }
    Ok(ran)
}

/// A share as a percentage for people: `1%`, `0.35%`.
pub(crate) fn percent(share: f64) -> String {
    let p = share * 100.0;
    if p >= 10.0 {
        format!("{p:.0}%")
    } else if p >= 1.0 {
        format!("{p:.1}%").replace(".0%", "%")
    } else {
        format!("{p:.2}%")
    }
}

/// The cells of `arms` whose `ok` passes do not pin mean latency and throughput within
/// `target` (an unavailable strategy is left out: its row says why), each with why: its
/// widest relative half-width, or too few passes, and its passes that were not `ok`.
pub(crate) fn wider_than(store: &RunStore, arms: &[Arm], pods: &[u32], target: f64) -> Vec<(String, String)> {
    use crate::results::repeats::{Precision, precision};
    let repeats = store.run().plan.repeat;
    let mut out = Vec::new();
    for arm in arms {
        for &p in pods {
            let rows: Vec<&CellRecord> = (1..=repeats).filter_map(|r| store.aggregate(r, *arm, p)).collect();
            let why = match precision(&rows, target) {
                Precision::Settled => continue,
                Precision::GaveUp { failed, passes } => format!("{failed} of {passes} passes not ok: given up"),
                Precision::Open { widest, failed } => {
                    let mut why =
                        widest.map_or("fewer than two passes measured".into(), |w| format!("±{}", percent(w)));
                    if failed > 0 {
                        why += &format!("; {failed} of {} passes not ok", rows.len());
                    }
                    why
                }
            };
            out.push((format!("{} × {p}", arm.name()), why));
        }
    }
    out
}

/// How many other GPUs ran a cell, on average, over `own` (pure): the summed overlap of
/// their busy intervals with it, over its length (seconds from one origin). None for an
/// empty interval.
pub fn others_busy(own: (f64, f64), others: &[(f64, f64)]) -> Option<f64> {
    let (a, b) = own;
    if !(b - a).is_finite() || b <= a {
        return None;
    }
    let overlap: f64 = others.iter().map(|&(c, d)| (b.min(d) - a.max(c)).max(0.0)).sum();
    Some(overlap / (b - a))
}

/// When one GPU ran cells: those done and the one running (seconds from one origin).
#[derive(Debug, Clone, Default)]
struct GpuBusy {
    done: Vec<(f64, f64)>,
    running: Option<f64>,
}

/// The run's store as a sweep's cells see it: behind a lock, so that the GPUs of a
/// `--gpus` run share it, with when each GPU was busy (seconds from one origin: finished
/// cells, and the one running) and whether a GPU's lane failed (the others then stop
/// after their cell). `T` is the store or a borrow of it.
pub(crate) struct SharedStore<T> {
    store: Mutex<T>,
    busy: Mutex<Vec<GpuBusy>>,
    /// A lane failed.
    pub abort: AtomicBool,
    origin: std::time::Instant,
}

impl<T: BorrowMut<RunStore>> SharedStore<T> {
    /// The store shared by `lanes` GPUs.
    pub fn new(store: T, lanes: usize) -> Self {
        Self {
            store: Mutex::new(store),
            busy: Mutex::new(vec![GpuBusy::default(); lanes]),
            abort: AtomicBool::new(false),
            origin: std::time::Instant::now(),
        }
    }

    /// `f` with the store, locked for its duration only (never across a wait).
    pub fn with<R>(&self, f: impl FnOnce(&mut RunStore) -> R) -> R {
        let mut guard = self.store.lock().unwrap_or_else(PoisonError::into_inner);
        f((*guard).borrow_mut())
    }

    /// The store back.
    pub fn into_inner(self) -> T {
        self.store.into_inner().unwrap_or_else(PoisonError::into_inner)
    }

    /// Lane `lane` starts a cell; returns its start.
    fn busy(&self, lane: usize) -> f64 {
        let t = self.origin.elapsed().as_secs_f64();
        if let Some(l) = self.busy.lock().unwrap_or_else(PoisonError::into_inner).get_mut(lane) {
            l.running = Some(t);
        }
        t
    }

    /// Lane `lane`'s cell since `start` ended: how many other GPUs ran a cell beside it.
    fn idle(&self, lane: usize, start: f64) -> Option<f64> {
        let t = self.origin.elapsed().as_secs_f64();
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(l) = busy.get_mut(lane) {
            l.running = None;
            l.done.push((start, t));
        }
        let others: Vec<(f64, f64)> = busy
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != lane)
            .flat_map(|(_, l)| l.done.iter().copied().chain(l.running.map(|s| (s, t))))
            .collect();
        others_busy((start, t), &others)
    }
}

/// The labels of a cell of the run in `store`.
pub(crate) fn labels(store: &RunStore, arm: Arm, pods: u32, repeat: u32) -> CellLabels {
    let run = store.run();
    let plan = &run.plan;
    let gpus = run.environment.gpus_filled.unwrap_or(1).max(1);
    CellLabels {
        run_id: run.run_id.clone(),
        arm,
        pods,
        gpus,
        repeat,
        model: plan.model.clone(),
        precision: plan.precision.clone(),
        device: plan.device,
        // `total:RATE` is shared by every pod of the cell, on all its GPUs.
        offered_per_pod: plan.load.per_pod_rate(pods * gpus),
        slos: plan.slos.clone(),
    }
}

/// What measuring one cell needs: the sweep's and the capacity search's cells go
/// through it alike.
pub(crate) struct CellRunner<'a, B, S> {
    /// The backend.
    pub backend: &'a mut B,
    /// Where the pods' metrics come from.
    pub source: &'a S,
    /// GPU telemetry.
    pub telemetry: Arc<dyn Telemetry>,
    /// Warm-up, windows, limits.
    pub settings: &'a MeasureSettings,
    /// What the user sees.
    pub progress: &'a dyn Progress,
    /// Stop requests.
    pub shutdown: &'a Shutdown,
}

impl<B: Backend, S: MetricsSource> CellRunner<'_, B, S> {
    /// Prepares an arm; a strategy that cannot run here is said and recorded in run.json.
    pub async fn prepare(&mut self, arm: Arm, store: &mut RunStore) -> Result<Prepared> {
        let prepared = self.prepare_arm(arm).await?;
        if let Prepared::Unavailable(reason) = &prepared {
            record_unavailable(store, arm, reason)?;
        }
        Ok(prepared)
    }

    /// Prepares an arm and says when its strategy cannot run here (not yet recorded).
    pub async fn prepare_arm(&mut self, arm: Arm) -> Result<Prepared> {
        let prepared = self.backend.prepare(arm, self.shutdown).await?;
        if let Prepared::Unavailable(reason) = &prepared {
            self.progress.message(&format!("{} unavailable: {reason}", arm.title()));
        }
        Ok(prepared)
    }

    /// Launches, measures and stops one cell of a prepared strategy and saves its rows
    /// (an unavailable strategy's cell gets its rows without launching anything). A
    /// cell that cannot start is saved as failed; an interrupt, a lost metrics source
    /// or a failure to stop the pods ends the run, after a measured cell is saved.
    pub async fn run(
        &mut self,
        store: &mut RunStore,
        prepared: &Prepared,
        labels: &CellLabels,
        title: &str,
    ) -> Result<()> {
        let load = store.run().plan.load.workload_args(labels.pods * labels.gpus);
        let baseline = store.aggregate(labels.repeat, labels.arm, 1).cloned();
        let mut measured = self.measure(prepared, labels, title, &load, baseline.as_ref()).await?;
        store.save_cell_with(std::mem::take(&mut measured.rows), measured.raw.take())?;
        measured.after_save(self.shutdown)
    }

    /// [`run`](Self::run) without the store: the cell's pods get `load` as arguments,
    /// `baseline` is its strategy's 1-pod aggregate row; the rows come back to be saved.
    pub async fn measure(
        &mut self,
        prepared: &Prepared,
        labels: &CellLabels,
        title: &str,
        load: &[String],
        baseline: Option<&CellRecord>,
    ) -> Result<MeasuredCell> {
        let pods = labels.pods;
        let shutdown = self.shutdown;
        // A stop asked for between cells launches nothing more.
        if shutdown.is_requested() {
            return Err(shutdown.interrupted());
        }
        self.progress.cell_start(title);
        let kind = self.source.kind();
        // A failure to stop the cell's pods ends the run, but only after the cell's rows
        // are on disk: a measured cell is never lost.
        let mut stop_error = None;
        let mut raw = None;
        let rows = match prepared {
            Prepared::Unavailable(reason) => unavailable_rows(labels, kind, reason),
            Prepared::Ready => {
                let launched_at = tokio::time::Instant::now();
                let launched = self.backend.launch(labels.arm.strategy, pods, load, shutdown).await;
                let measured = match launched {
                    Ok(_) => {
                        measure_cell(
                            self.backend,
                            self.source,
                            self.telemetry.clone(),
                            self.settings,
                            labels,
                            baseline,
                            launched_at,
                            self.progress,
                            shutdown,
                        )
                        .await
                    }
                    Err(e) => Err(e),
                };
                // Pods stop before anything else happens, whatever the outcome.
                let stopping = tokio::time::Instant::now();
                let stopped = self.backend.stop_pods(shutdown).await;
                let stop_s = stopping.elapsed().as_secs_f64();
                match measured {
                    Ok((mut rows, windows)) => {
                        stop_error = stopped.err();
                        raw = windows;
                        for r in rows.iter_mut().filter(|r| r.is_aggregate()) {
                            r.stop_s = Some(stop_s);
                        }
                        rows
                    }
                    Err(e) if e.is_interrupt() => {
                        if let Err(se) = stopped {
                            tracing::warn!("stopping the cell's pods after the interrupt: {se}");
                        }
                        return Err(e);
                    }
                    // Without its metrics source nothing more can be measured.
                    Err(e @ BenchError::Prometheus { .. }) => return Err(e),
                    // A cell that could not start is an outcome, not the end of the run.
                    Err(e) => {
                        stop_error = stopped.err();
                        failed_rows(labels, kind, &e.to_string())
                    }
                }
            }
        };
        let mut rows = rows;
        if *prepared == Prepared::Ready
            && let Some(setup) = self.backend.cell_setup()
        {
            for r in rows.iter_mut().filter(|r| r.is_aggregate()) {
                r.switch_s = setup.switch_s;
                r.mig_reconfigure_s = setup.mig_reconfigure_s;
                r.pods_ready_s = setup.pods_ready_s.or(r.pods_ready_s);
                if let Some(n) = &setup.note {
                    add_note(&mut r.note, n);
                }
            }
        }
        let failed = rows.iter().any(|r| r.is_aggregate() && r.status == CellStatus::Failed);
        self.progress.cell_done(&cell_summary(&rows), failed);
        Ok(MeasuredCell { rows, raw, stop_error })
    }
}

/// Records in run.json that an arm's strategy cannot run here (once per strategy).
pub(crate) fn record_unavailable(store: &mut RunStore, arm: Arm, reason: &str) -> Result<()> {
    let strategy = arm.strategy;
    store.update_run(|r| {
        if !r.unavailable.iter().any(|u| u.strategy == strategy) {
            r.unavailable.push(Unavailable {
                strategy,
                reason: reason.to_string(),
            });
        }
    })
}

/// A cell's rows, measured and not yet saved, and what ends the run once they are.
#[derive(Debug)]
pub(crate) struct MeasuredCell {
    /// The cell's rows.
    pub rows: Vec<CellRecord>,
    /// The windows they came from (none for a cell that measured nothing).
    pub raw: Option<crate::results::raw::CellWindows>,
    /// The pods could not be stopped: the run ends, after the rows are saved.
    pub stop_error: Option<BenchError>,
}

impl MeasuredCell {
    /// What the run does once the rows are saved: go on, or end with the stop error
    /// (an interrupt when a forced stop cut the pods' clean-up short).
    pub fn after_save(self, shutdown: &Shutdown) -> Result<()> {
        match self.stop_error {
            None => Ok(()),
            Some(_) if shutdown.is_requested() => Err(shutdown.interrupted()),
            Some(e) => Err(e),
        }
    }
}

/// The arms (or strategies) of pass `repeat` (from 1): the plan's order rotated left by
/// `repeat − 1`, so that over the passes every arm runs early and late, and slow drift
/// (heat, power caps, other tenants) does not line up with one of them.
pub fn rotated<T: Clone>(arms: &[T], repeat: u32) -> Vec<T> {
    let mut v = arms.to_vec();
    if !v.is_empty() {
        let k = (repeat.saturating_sub(1) as usize) % v.len();
        v.rotate_left(k);
    }
    v
}
