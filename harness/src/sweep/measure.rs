//! Measuring one launched cell: wait for readiness, warm up (discarded), then windows
//! until the last few agree on throughput and mean latency, or the cap. Every wait
//! ends at a stop request. The rows come from [`crate::sweep::cell::cell_rows`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Backend, Pod, PodState};
use crate::clock::now_rfc3339;
use crate::config::plan::MeasureSettings;
use crate::error::Result;
use crate::metrics::{MetricsSource, Target};
use crate::results::raw::{CellWindows, RawCell, RawPod, RawServer, WarmupProbe};
use crate::results::record::CellRecord;
use crate::results::requests::RequestLine;
use crate::shutdown::Shutdown;
use crate::stats::stability::WARMUP_PROBE;
use crate::stats::{Histogram, WindowStat, stable, steady};
use crate::sweep::cell::{CellLabels, Measured, SloHistograms, Tracked, cell_rows, fell_behind, undecided_slos};
use crate::sweep::progress::Progress;
use crate::telemetry::{Sampler, Telemetry, TelemetrySummary, summarise};

/// The histograms a pod's objectives are judged on between two snapshots: latency's
/// increment `d`, and each token metric's where the answers are streamed.
fn slo_histograms(a: &crate::metrics::PodSnapshot, b: &crate::metrics::PodSnapshot, d: Histogram) -> SloHistograms {
    let tokens = match (&a.tokens, &b.tokens) {
        (Some(x), Some(y)) => (|| {
            Some(crate::metrics::requests::TokenHistograms {
                ttft: y.ttft.delta(&x.ttft)?,
                itl: y.itl.delta(&x.itl)?,
                tpot: y.tpot.delta(&x.tpot)?,
            })
        })(),
        _ => None,
    };
    SloHistograms { latency: d, tokens }
}

/// The warm-up after readiness. Fixed (`--fixed-warmup`, and every run read from
/// Prometheus, whose recorded plan says so): `settings.warmup`. Steady: a probe of every
/// pod each [`WARMUP_PROBE`] until [`steady`] says the pods' sums agree, at most
/// `settings.warmup`. Returns how long it took and the probes (the run keeps them as the
/// rule's evidence); a pod that cannot be read is left out of a probe and judged later.
async fn warm_up<S: MetricsSource>(
    source: &S,
    targets: &[Target],
    settings: &MeasureSettings,
    progress: &dyn Progress,
    shutdown: &Shutdown,
) -> Result<(Duration, Vec<WarmupProbe>)> {
    let start = Instant::now();
    if !settings.steady_warmup {
        progress.phase(&format!("warm-up {} s", settings.warmup.as_secs()));
        shutdown.sleep(settings.warmup).await?;
        return Ok((start.elapsed(), Vec::new()));
    }
    progress.phase(&format!(
        "warm-up until steady, at most {} s",
        settings.warmup.as_secs()
    ));
    let mut last: HashMap<String, crate::metrics::PodSnapshot> = HashMap::new();
    let mut stats: Vec<WindowStat> = Vec::new();
    let mut probes = Vec::new();
    loop {
        // Each pod's increment since the last probe, summed.
        let mut throughput = 0.0;
        let mut sum: Option<Histogram> = None;
        // A probe that cannot finish within the warm-up's cap ends the warm-up there.
        let cap = settings
            .warmup
            .saturating_sub(start.elapsed())
            .max(Duration::from_millis(200));
        let Ok(snaps) = tokio::time::timeout(cap, shutdown.guard(source.snapshot(targets))).await else {
            break;
        };
        for (pod, snap) in snaps? {
            let Ok(snap) = snap else { continue };
            if let Some(prev) = last.get(&pod)
                && let Some(d) = snap.latency.delta(&prev.latency)
            {
                throughput += d.count / (snap.at - prev.at).as_secs_f64().max(1e-9);
                Histogram::pool(&mut sum, d);
            }
            last.insert(pod, snap);
        }
        if let Some(h) = sum {
            let mean = h.mean();
            stats.push(WindowStat {
                throughput,
                mean,
                p50: f64::NAN,
            });
            probes.push(WarmupProbe {
                at_s: start.elapsed().as_secs_f64(),
                throughput,
                mean_s: Some(mean).filter(|m| m.is_finite()),
            });
            if steady(&stats) {
                break;
            }
        }
        let left = settings.warmup.saturating_sub(start.elapsed());
        if left < WARMUP_PROBE {
            shutdown.sleep(left).await?;
            break;
        }
        shutdown.sleep(WARMUP_PROBE).await?;
    }
    Ok((start.elapsed(), probes))
}

/// Measures the launched cell. `baseline` is the strategy's 1-pod aggregate row;
/// `launched_at`, when its launch began (the aggregate row's `pods_ready_s` counts from it).
#[allow(clippy::too_many_arguments)]
pub async fn measure_cell<B: Backend, S: MetricsSource>(
    backend: &mut B,
    source: &S,
    telemetry: Arc<dyn Telemetry>,
    settings: &MeasureSettings,
    labels: &CellLabels,
    baseline: Option<&CellRecord>,
    launched_at: Instant,
    progress: &dyn Progress,
    shutdown: &Shutdown,
) -> Result<(Vec<CellRecord>, Option<CellWindows>)> {
    progress.phase("starting pods");
    let pods: Vec<Pod> = backend.wait_ready(settings.ready_timeout, shutdown).await?;
    let ready_s = launched_at.elapsed().as_secs_f64();
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
                    backlog: Vec::new(),
                    streamed: None,
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
    let _release = crate::metrics::Release(source);
    if !targets.is_empty() {
        progress.phase("waiting for the metrics source");
        source.prepare(&targets, shutdown).await?;
    }

    let mut windows: Vec<WindowStat> = Vec::new();
    let mut measured = Duration::ZERO;
    let mut summary = TelemetrySummary::default();
    let mut raw_cell = None;
    let mut warmup_took: Option<Duration> = None;
    if !targets.is_empty() {
        let (took, warmup_probes) = warm_up(source, &targets, settings, progress, shutdown).await?;
        warmup_took = Some(took);
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
        for (pod, snap) in shutdown.guard(source.snapshot(&alive(&tracked))).await? {
            if let Some(t) = tracked.get_mut(&pod) {
                match snap {
                    Ok(s) => {
                        t.backlog.extend(s.backlog);
                        t.first = Some(s.clone());
                        t.last = Some(s);
                    }
                    Err(e) => t.problem = Some(e.to_string()),
                }
            }
        }
        let sampler = Sampler::start(telemetry.clone());
        let t0 = Instant::now();
        // Each pod's increments per window: the run's raw data (`windows.jsonl`).
        let mut raw: HashMap<String, (RawPod, Vec<f64>)> = tracked
            .iter()
            .filter_map(|(name, t)| {
                let first = t.first.as_ref()?;
                let bounds = RawPod::bounds_of(&first.latency);
                Some((name.clone(), (RawPod::new(name, first.backlog), bounds)))
            })
            .collect();
        loop {
            progress.phase(&format!("window {}", windows.len() + 1));
            shutdown.sleep(settings.window).await?;
            let polled = tokio::select! {
                pods = backend.poll() => pods,
                _ = shutdown.cancelled() => return Err(shutdown.interrupted()),
            };
            for p in polled {
                if let Some(t) = tracked.get_mut(&p.name)
                    && matches!(p.state, PodState::Exited { .. })
                {
                    t.state = p.state;
                }
            }
            let now_alive = alive(&tracked);
            let mut window_hist: Option<Histogram> = None;
            let mut window_tput = 0.0;
            for (pod, snap) in shutdown.guard(source.snapshot(&now_alive)).await? {
                let Some(t) = tracked.get_mut(&pod) else { continue };
                match snap {
                    Ok(s) => {
                        let prev = t.last.as_ref();
                        match prev.and_then(|p| s.latency.delta(&p.latency).map(|d| (d, s.at - p.at, p.errors))) {
                            Some((d, dt, errors_before)) => {
                                window_tput += d.count / dt.as_secs_f64().max(1e-9);
                                if let (Some((series, _)), Some(first)) = (raw.get_mut(&pod), t.first.as_ref()) {
                                    let at = (s.at - first.at).as_secs_f64();
                                    series.push(windows.len() as u32 + 1, at, &d, s.errors - errors_before, s.backlog);
                                }
                                t.backlog.extend(s.backlog);
                                Histogram::pool(&mut window_hist, d);
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
            let mean = window_hist.as_ref().map_or(f64::NAN, |h| h.mean());
            windows.push(WindowStat {
                throughput: window_tput,
                mean,
                p50,
            });
            let is_stable = stable(&windows, settings.stable_windows, settings.tolerance);
            progress.window(windows.len(), window_tput, mean, is_stable);
            measured = t0.elapsed();
            // With SLOs, a settled cell also needs the requests that decide each pod's
            // attainment at 95% (a p99 at least 299); a pod behind its offered load is
            // not judged on attainment, so it waits for nothing.
            let decided = || {
                now_alive.iter().all(|target| {
                    tracked.get(&target.pod).is_none_or(|t| match (&t.first, &t.last) {
                        (Some(a), Some(b)) => b.latency.delta(&a.latency).is_none_or(|d| {
                            let hs = slo_histograms(a, b, d.clone());
                            let secs = (b.at - a.at).as_secs_f64();
                            let behind = labels.offered_per_pod.is_some_and(|o| {
                                let errors = (b.errors - a.errors).max(0.0);
                                fell_behind(o, d.count / secs.max(1e-9), secs, &t.backlog, errors).is_some()
                            });
                            behind || undecided_slos(&hs, &labels.slos).is_empty()
                        }),
                        _ => true,
                    })
                })
            };
            if (windows.len() >= settings.stable_windows && is_stable && decided())
                || measured + settings.window > settings.max_cell + Duration::from_millis(500)
                || alive(&tracked).is_empty()
            {
                break;
            }
        }
        // Streamed answers: the requests each pod ended while measured.
        for (name, t) in tracked.iter_mut() {
            if let (Some(a), Some(b)) = (&t.first, &t.last)
                && let (Some(from), Some(to)) = (a.streamed, b.streamed)
            {
                t.streamed = Some(source.streamed(name, from, to));
            }
        }
        // The streaming server's own histograms over the same measurement.
        for (name, (pod, _)) in raw.iter_mut() {
            pod.server = tracked
                .get(name)
                .and_then(crate::sweep::cell::server_delta)
                .map(|d| RawServer::of(&d));
        }
        let gpu_samples = sampler.finish(telemetry.clone()).await;
        summary = summarise(&gpu_samples);
        let (series, bounds): (Vec<RawPod>, Vec<Vec<f64>>) = order.iter().filter_map(|name| raw.remove(name)).unzip();
        let requests = order
            .iter()
            .filter_map(|name| Some((name, tracked.get(name)?.streamed.as_ref()?)))
            .flat_map(|(name, records)| {
                records
                    .iter()
                    .map(|r| RequestLine::new(labels.repeat, labels.arm, labels.pods, name, r.clone()))
            })
            .collect();
        raw_cell = Some(CellWindows {
            cell: RawCell {
                repeat: labels.repeat,
                strategy: labels.arm.strategy,
                timeslice: labels.arm.timeslice,
                mps_threads: Some(labels.arm.mps.threads).filter(|t| *t != crate::domain::MpsThreads::Auto),
                mps_memory: Some(labels.arm.mps.memory).filter(|m| *m != crate::domain::MpsMemory::Auto),
                pods: labels.pods,
                measured_s: measured.as_secs_f64(),
                windows: windows.len() as u32,
                series,
                gpu_samples,
                warmup: warmup_probes,
            },
            bounds,
            requests,
        });
    }

    let measured = Measured {
        order,
        tracked,
        windows,
        measured,
        summary,
        started_at,
    };
    let mut rows = cell_rows(&measured, labels, source.kind(), settings, baseline);
    for r in rows.iter_mut().filter(|r| r.is_aggregate()) {
        r.pods_ready_s = Some(ready_s);
        r.warmup_s = warmup_took.map(|took| took.as_secs_f64());
    }
    Ok((rows, raw_cell))
}
