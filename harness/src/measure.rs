//! Measuring one cell: wait for readiness, warm up (discarded), then 5-second windows
//! until the last three agree within 5% on throughput and median latency, or the cap.
//! Every number comes from histogram deltas between snapshots: the mean exactly as
//! Δsum/Δcount, quantiles as Prometheus' histogram_quantile.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::backend::{Backend, Pod, PodState};
use crate::domain::{CellStatus, DeviceKind, Strategy};
use crate::error::{BenchError, Result};
use crate::gpu::{Sampler, Telemetry, TelemetrySummary};
use crate::progress::Progress;
use crate::record::{ALL_PODS, CellRecord, now_rfc3339};
use crate::scrape::{MetricsSource, PodSnapshot, Target};
use crate::stats::{Histogram, WindowStat, jain_index, relative_spread, stable};

/// How long and how finely a cell is measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeasureSettings {
    /// Longest wait for pods to become ready.
    pub ready_timeout: Duration,
    /// Discarded time after readiness.
    pub warmup: Duration,
    /// Window length.
    pub window: Duration,
    /// Measurement cap (after warm-up).
    pub max_cell: Duration,
    /// Windows that must agree; also the minimum number of windows.
    pub stable_windows: usize,
    /// Agreement tolerance (0.05 = 5%).
    pub tolerance: f64,
}

/// What the rows of a cell need besides measurements.
#[derive(Debug, Clone)]
pub struct CellLabels {
    /// Run id.
    pub run_id: String,
    /// Strategy.
    pub strategy: Strategy,
    /// Pods requested.
    pub pods: u32,
    /// Model preset.
    pub model: String,
    /// Precision.
    pub precision: String,
    /// cuda or cpu.
    pub device: DeviceKind,
}

/// A row with the cell's labels and nothing measured.
pub fn empty_row(
    l: &CellLabels,
    pod: &str,
    status: CellStatus,
    source: crate::domain::Source,
    note: String,
) -> CellRecord {
    CellRecord {
        run_id: l.run_id.clone(),
        strategy: l.strategy,
        pods: l.pods,
        pod: pod.to_string(),
        status,
        inferences: None,
        throughput_per_s: None,
        mean_s: None,
        p50_s: None,
        p90_s: None,
        p99_s: None,
        errors: None,
        fairness: None,
        gpu_util_pct: None,
        gpu_mem_bytes: None,
        power_w: None,
        energy_j_per_inference: None,
        source,
        device: l.device,
        note,
        speedup_vs_1pod: None,
        slowdown_vs_1pod: None,
        duration_s: None,
        windows: None,
        throughput_spread: None,
        p50_spread: None,
        exit_code: None,
        model: l.model.clone(),
        precision: l.precision.clone(),
        started_at: now_rfc3339(),
    }
}

/// A cell whose strategy cannot run: one aggregate row with the reason.
pub fn unavailable_rows(l: &CellLabels, source: crate::domain::Source, reason: &str) -> Vec<CellRecord> {
    vec![empty_row(
        l,
        ALL_PODS,
        CellStatus::Unavailable,
        source,
        reason.to_string(),
    )]
}

/// Per-pod bookkeeping during a cell.
#[derive(Debug)]
struct Tracked {
    first: Option<PodSnapshot>,
    last: Option<PodSnapshot>,
    state: PodState,
    problem: Option<String>,
}

fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

/// Status of a pod from its last state.
fn pod_status(state: &PodState, problem: &Option<String>) -> (CellStatus, Option<i32>, String) {
    match state {
        PodState::Pending(reason) => (CellStatus::Pending, None, reason.clone()),
        PodState::Exited { code: Some(4), detail } => {
            (CellStatus::Oom, Some(4), format!("out of GPU memory: {detail}"))
        }
        // Kubernetes killed the container for exceeding its memory limit.
        PodState::Exited { code, detail } if detail.starts_with("OOMKilled") => {
            (CellStatus::Oom, *code, detail.clone())
        }
        PodState::Exited { code, detail } => (CellStatus::Failed, *code, detail.clone()),
        PodState::Starting => (CellStatus::Failed, None, "never became ready".into()),
        PodState::Running => match problem {
            Some(p) => (CellStatus::Failed, None, p.clone()),
            None => (CellStatus::Ok, None, String::new()),
        },
    }
}

/// The aggregate status of a cell (see DESIGN.md: any OOM or failure shows, pending
/// alone is an expected outcome of the exclusive baseline).
pub fn aggregate_status(statuses: &[CellStatus]) -> CellStatus {
    if statuses.contains(&CellStatus::Oom) {
        CellStatus::Oom
    } else if statuses.contains(&CellStatus::Failed) {
        CellStatus::Failed
    } else if statuses.contains(&CellStatus::Ok) {
        CellStatus::Ok
    } else {
        CellStatus::Pending
    }
}

async fn sleep_or_cancel(d: Duration, cancel: &CancellationToken) -> Result<()> {
    tokio::select! {
        _ = cancel.cancelled() => Err(BenchError::Interrupted),
        _ = tokio::time::sleep(d) => Ok(()),
    }
}

/// Measures the launched cell. `baseline` is the strategy's 1-pod aggregate row.
#[allow(clippy::too_many_arguments)]
pub async fn measure_cell<B: Backend, S: MetricsSource>(
    backend: &mut B,
    source: &S,
    telemetry: Arc<dyn Telemetry>,
    settings: &MeasureSettings,
    labels: &CellLabels,
    baseline: Option<&CellRecord>,
    progress: &dyn Progress,
    cancel: &CancellationToken,
) -> Result<Vec<CellRecord>> {
    progress.phase("starting pods");
    let pods: Vec<Pod> = backend.wait_ready(settings.ready_timeout, cancel).await?;
    let order: Vec<String> = pods.iter().map(|p| p.name.clone()).collect();
    let mut tracked: HashMap<String, Tracked> = pods
        .iter()
        .map(|p| {
            (
                p.name.clone(),
                Tracked {
                    first: None,
                    last: None,
                    state: p.state.clone(),
                    problem: None,
                },
            )
        })
        .collect();
    let targets: Vec<Target> = pods
        .iter()
        .filter(|p| p.state == PodState::Running)
        .filter_map(|p| {
            p.metrics_url.as_ref().map(|u| Target {
                pod: p.name.clone(),
                url: u.clone(),
            })
        })
        .collect();
    let started_at = now_rfc3339();
    if !targets.is_empty() {
        progress.phase("waiting for the metrics source");
        source.prepare(&targets).await?;
    }

    let mut windows: Vec<WindowStat> = Vec::new();
    let mut measured = Duration::ZERO;
    let mut summary = TelemetrySummary::default();
    if !targets.is_empty() {
        progress.phase(&format!("warm-up {} s", settings.warmup.as_secs()));
        sleep_or_cancel(settings.warmup, cancel).await?;
        let alive = |tracked: &HashMap<String, Tracked>| -> Vec<Target> {
            targets
                .iter()
                .filter(|t| {
                    tracked
                        .get(&t.pod)
                        .is_some_and(|x| x.state == PodState::Running && x.problem.is_none())
                })
                .cloned()
                .collect()
        };
        for (pod, snap) in source.snapshot(&alive(&tracked)).await? {
            if let Some(t) = tracked.get_mut(&pod) {
                match snap {
                    Ok(s) => {
                        t.first = Some(s.clone());
                        t.last = Some(s);
                    }
                    Err(e) => t.problem = Some(e.to_string()),
                }
            }
        }
        let sampler = Sampler::start(telemetry.clone());
        let t0 = Instant::now();
        loop {
            progress.phase(&format!("window {}", windows.len() + 1));
            sleep_or_cancel(settings.window, cancel).await?;
            for p in backend.poll().await {
                if let Some(t) = tracked.get_mut(&p.name)
                    && matches!(p.state, PodState::Exited { .. })
                {
                    t.state = p.state;
                }
            }
            let now_alive = alive(&tracked);
            let mut window_hist: Option<Histogram> = None;
            let mut window_tput = 0.0;
            for (pod, snap) in source.snapshot(&now_alive).await? {
                let Some(t) = tracked.get_mut(&pod) else { continue };
                match snap {
                    Ok(s) => {
                        let prev = t.last.as_ref();
                        match prev.and_then(|p| s.latency.delta(&p.latency).map(|d| (d, s.at - p.at))) {
                            Some((d, dt)) => {
                                window_tput += d.count / dt.as_secs_f64().max(1e-9);
                                match window_hist.as_mut() {
                                    Some(h) => {
                                        h.add(&d);
                                    }
                                    None => window_hist = Some(d),
                                }
                                t.last = Some(s);
                            }
                            None => t.problem = Some("its counters went back (the process restarted)".into()),
                        }
                    }
                    // A pod that stopped answering is judged at the next poll; if it is
                    // still running, its scrape problem is what we record.
                    Err(e) => t.problem = Some(e.to_string()),
                }
            }
            let p50 = window_hist.as_ref().map_or(f64::NAN, |h| h.quantile(0.5));
            windows.push(WindowStat {
                throughput: window_tput,
                p50,
            });
            let is_stable = stable(&windows, settings.stable_windows, settings.tolerance);
            progress.window(windows.len(), window_tput, p50, is_stable);
            measured = t0.elapsed();
            if (windows.len() >= settings.stable_windows && is_stable)
                || measured + settings.window > settings.max_cell + Duration::from_millis(500)
                || alive(&tracked).is_empty()
            {
                break;
            }
        }
        summary = sampler.finish(telemetry.clone()).await;
    }

    // Rows: one per requested pod, then the aggregate.
    let src = source.kind();
    let cell_secs = measured.as_secs_f64();
    let mut rows = Vec::new();
    let mut total: Option<Histogram> = None;
    let (mut total_tput, mut total_errors, mut total_inf) = (0.0, 0.0, 0u64);
    let mut effective = Vec::new();
    let mut statuses = Vec::new();
    for name in &order {
        let t = &tracked[name];
        let (status, exit_code, note) = pod_status(&t.state, &t.problem);
        statuses.push(status);
        let mut row = empty_row(labels, name, status, src, note);
        row.exit_code = exit_code;
        row.started_at = started_at.clone();
        let delta = match (&t.first, &t.last) {
            (Some(a), Some(b)) => b
                .latency
                .delta(&a.latency)
                .map(|d| (d, b.at - a.at, b.errors - a.errors)),
            _ => None,
        };
        match delta {
            Some((d, dt, errs)) if d.count > 0.0 => {
                let secs = dt.as_secs_f64();
                row.inferences = Some(d.count as u64);
                row.throughput_per_s = Some(d.count / secs);
                row.mean_s = finite(d.mean());
                row.p50_s = finite(d.quantile(0.5));
                row.p90_s = finite(d.quantile(0.9));
                row.p99_s = finite(d.quantile(0.99));
                row.errors = Some(errs.max(0.0) as u64);
                row.duration_s = Some(secs);
                total_tput += d.count / secs;
                total_errors += errs.max(0.0);
                total_inf += d.count as u64;
                effective.push(if cell_secs > 0.0 { d.count / cell_secs } else { 0.0 });
                match total.as_mut() {
                    Some(h) => {
                        h.add(&d);
                    }
                    None => total = Some(d),
                }
            }
            _ => effective.push(0.0),
        }
        rows.push(row);
    }
    let status = aggregate_status(&statuses);
    let ran = statuses.iter().filter(|s| **s == CellStatus::Ok).count();
    let mut notes = Vec::new();
    let pending = statuses.iter().filter(|s| **s == CellStatus::Pending).count();
    if pending > 0 {
        notes.push(format!("{ran} of {} pods ran; {pending} pending", labels.pods));
    }
    for r in rows
        .iter()
        .filter(|r| matches!(r.status, CellStatus::Failed | CellStatus::Oom))
    {
        notes.push(format!("{} {}: {}", r.pod, r.status, r.note));
    }
    if !windows.is_empty() && !stable(&windows, settings.stable_windows, settings.tolerance) {
        notes.push(format!(
            "did not settle within {} s (last {} windows differ by more than {}%)",
            settings.max_cell.as_secs(),
            settings.stable_windows,
            settings.tolerance * 100.0
        ));
    }
    let mut agg = empty_row(labels, ALL_PODS, status, src, notes.join("; "));
    agg.started_at = started_at;
    if let Some(h) = total.filter(|h| h.count > 0.0) {
        agg.inferences = Some(total_inf);
        agg.throughput_per_s = Some(total_tput);
        agg.mean_s = finite(h.mean());
        agg.p50_s = finite(h.quantile(0.5));
        agg.p90_s = finite(h.quantile(0.9));
        agg.p99_s = finite(h.quantile(0.99));
        agg.errors = Some(total_errors as u64);
        agg.fairness = jain_index(&effective);
        agg.duration_s = Some(cell_secs);
        agg.windows = Some(windows.len() as u32);
        let tputs: Vec<f64> = windows.iter().map(|w| w.throughput).collect();
        let p50s: Vec<f64> = windows.iter().map(|w| w.p50).collect();
        agg.throughput_spread = finite(relative_spread(&tputs));
        agg.p50_spread = finite(relative_spread(&p50s));
        agg.gpu_util_pct = summary.util_pct;
        agg.gpu_mem_bytes = summary.mem_bytes;
        agg.power_w = summary.power_w;
        agg.energy_j_per_inference = summary.energy_j.map(|e| e / total_inf.max(1) as f64);
        if let Some(base) = baseline {
            agg.speedup_vs_1pod = base.throughput_per_s.map(|b| total_tput / b);
            agg.slowdown_vs_1pod = match (agg.mean_s, base.mean_s) {
                (Some(m), Some(b)) if b > 0.0 => Some(m / b),
                _ => None,
            };
        } else if labels.pods == 1 {
            agg.speedup_vs_1pod = Some(1.0);
            agg.slowdown_vs_1pod = Some(1.0);
        }
    }
    rows.push(agg);
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregate_status_rules() {
        use CellStatus::*;
        assert_eq!(aggregate_status(&[Ok, Pending, Pending]), Ok);
        assert_eq!(aggregate_status(&[Ok, Oom, Failed]), Oom);
        assert_eq!(aggregate_status(&[Ok, Failed]), Failed);
        assert_eq!(aggregate_status(&[Pending]), Pending);
    }

    #[test]
    fn pod_status_maps_exit_code_4_to_oom() {
        let (s, code, note) = pod_status(
            &PodState::Exited {
                code: Some(4),
                detail: "x".into(),
            },
            &None,
        );
        assert_eq!((s, code), (CellStatus::Oom, Some(4)));
        assert!(note.contains("out of GPU memory"));
        let (s, code, _) = pod_status(
            &PodState::Exited {
                code: Some(1),
                detail: "x".into(),
            },
            &None,
        );
        assert_eq!((s, code), (CellStatus::Failed, Some(1)));
        assert_eq!(
            pod_status(&PodState::Running, &Some("scrape".into())).0,
            CellStatus::Failed
        );
    }
}
