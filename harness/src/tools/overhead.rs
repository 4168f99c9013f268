//! `gpushare-bench overhead`: what measuring costs. One workload pod runs alone while
//! phases alternate between no scraping (counters read at the phase's edges only) and
//! scraping `/metrics` every interval; the throughputs of the two kinds of phase are
//! compared against the spread between phases of the same kind.

use std::time::Duration;

use tokio::time::Instant;

use serde::Serialize;

use crate::backend::local::session::{check_busy, chosen_gpu, libcuda_present, resolve_device, short_device_name};
use crate::backend::local::{LocalBackend, WorkloadCommand, find_workload};
use crate::backend::{Backend, PodState};
use crate::config::cli::OverheadArgs;
use crate::config::plan::{default_run_id, device_precision, validate_run_id};
use crate::domain::{DeviceKind, Strategy};
use crate::error::{BenchError, Result};
use crate::metrics::Target;
use crate::metrics::scrape::ScrapeSource;
use crate::shutdown::Shutdown;
use crate::stats::relative_spread;

/// One phase.
#[derive(Debug, Clone, Serialize)]
pub struct OverheadPhase {
    /// Whether /metrics was scraped every interval during the phase.
    pub scraping: bool,
    /// Length, seconds.
    pub seconds: f64,
    /// Inferences completed.
    pub inferences: u64,
    /// Inferences per second.
    pub throughput_per_s: f64,
    /// Scrapes made during the phase.
    pub scrapes: u32,
}

/// The result, written to `overhead.json`.
#[derive(Debug, Clone, Serialize)]
pub struct OverheadResult {
    /// Model preset.
    pub model: String,
    /// cuda or cpu.
    pub device: String,
    /// Precision.
    pub precision: String,
    /// GPU name, if any.
    pub gpu: Option<String>,
    /// Scrape interval, seconds.
    pub interval_s: f64,
    /// Phases in the order run.
    pub phases: Vec<OverheadPhase>,
    /// Mean throughput without scraping.
    pub throughput_without: f64,
    /// Mean throughput with scraping.
    pub throughput_with: f64,
    /// (with − without) / without, percent.
    pub difference_pct: f64,
    /// Spread between no-scraping phases, percent.
    pub spread_without_pct: f64,
    /// Spread between scraping phases, percent.
    pub spread_with_pct: f64,
    /// When it ran.
    pub started_at: String,
}

/// Summarises phases (pure).
pub fn summarise(phases: &[OverheadPhase]) -> (f64, f64, f64, f64, f64) {
    let pick = |s: bool| {
        phases
            .iter()
            .filter(|p| p.scraping == s)
            .map(|p| p.throughput_per_s)
            .collect::<Vec<_>>()
    };
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let (without, with) = (pick(false), pick(true));
    let (a, b) = (mean(&without), mean(&with));
    (
        a,
        b,
        (b - a) / a * 100.0,
        relative_spread(&without) * 100.0,
        relative_spread(&with) * 100.0,
    )
}

/// Runs the measurement with a launched single pod.
pub async fn measure<B: Backend>(
    backend: &mut B,
    labels: (&str, DeviceKind, &str, Option<String>),
    warmup: Duration,
    phase: Duration,
    repeats: u32,
    interval: Duration,
    shutdown: &Shutdown,
) -> Result<OverheadResult> {
    let started_at = crate::clock::now_rfc3339();
    let pods = backend.wait_ready(Duration::from_secs(180), shutdown).await?;
    let pod = pods
        .first()
        .filter(|p| p.state == PodState::Running)
        .ok_or_else(|| BenchError::Spawn {
            pod: "pod-0".into(),
            reason: match pods.first().map(|p| &p.state) {
                Some(PodState::Exited { code, detail }) => format!(
                    "exited{} before it was ready: {detail}",
                    code.map(|c| format!(" with code {c}")).unwrap_or_default()
                ),
                Some(PodState::Pending(why)) => format!("pending: {why}"),
                _ => "did not become ready".into(),
            },
        })?;
    let target = Target {
        pod: pod.name.clone(),
        url: pod.metrics_url.clone().unwrap_or_default(),
    };
    let scraper = ScrapeSource::default();
    let sleep = |d| shutdown.sleep(d);
    sleep(warmup).await?;
    let mut phases = Vec::new();
    for i in 0..repeats * 2 {
        // Alternate, starting without scraping; a drifting GPU clock then biases neither.
        let scraping = i % 2 == 1;
        let start = scraper.scrape(&target).await?;
        let t0 = Instant::now();
        let mut scrapes = 0;
        if scraping {
            while t0.elapsed() + interval <= phase {
                sleep(interval).await?;
                scraper.scrape(&target).await?;
                scrapes += 1;
            }
            sleep(phase.saturating_sub(t0.elapsed())).await?;
        } else {
            sleep(phase).await?;
        }
        let end = scraper.scrape(&target).await?;
        let n = end.latency.count - start.latency.count;
        let secs = (end.at - start.at).as_secs_f64();
        phases.push(OverheadPhase {
            scraping,
            seconds: secs,
            inferences: n as u64,
            throughput_per_s: n / secs,
            scrapes,
        });
    }
    let (without, with, diff, sw, sv) = summarise(&phases);
    Ok(OverheadResult {
        model: labels.0.into(),
        device: labels.1.name().into(),
        precision: labels.2.into(),
        gpu: labels.3,
        interval_s: interval.as_secs_f64(),
        phases,
        throughput_without: without,
        throughput_with: with,
        difference_pct: diff,
        spread_without_pct: sw,
        spread_with_pct: sv,
        started_at,
    })
}

/// The strategy the overhead pod runs under (alone on the GPU).
pub const STRATEGY: Strategy = Strategy::TimeSlicing;

/// Runs `gpushare-bench overhead`: one pod alone, phases with and without scraping;
/// writes `<out>/<run-id>/overhead.json` and returns the result and that path.
pub async fn run(args: &OverheadArgs, shutdown: &Shutdown) -> Result<(OverheadResult, std::path::PathBuf)> {
    let (phase, interval, warmup) = (args.phase.duration, args.interval.duration, args.warmup.duration);
    if interval < Duration::from_millis(100) {
        return Err(BenchError::flag(
            "--interval",
            &args.interval.text,
            "scrape at most every 100ms",
        ));
    }
    if args.repeats == 0 {
        return Err(BenchError::flag("--repeats", "0", "give at least 1 pair of phases"));
    }
    if phase < interval * 2 {
        return Err(BenchError::flag(
            "--phase",
            &args.phase.text,
            format!(
                "each phase needs at least two scrape intervals (--interval {})",
                args.interval.text
            ),
        ));
    }
    let probed = crate::telemetry::nvml::probe();
    let device = resolve_device(args.device, &probed, libcuda_present())?;
    let inventory = match device {
        DeviceKind::Cuda => {
            let (inventory, _) = chosen_gpu(&probed, args.gpu.as_ref())?;
            check_busy(inventory.gpus.first(), args.allow_busy_gpu)?;
            inventory
        }
        DeviceKind::Cpu if args.gpu.is_some() => {
            return Err(BenchError::flag(
                "--gpu",
                &args.gpu.as_ref().map(ToString::to_string).unwrap_or_default(),
                "this run has no GPU (--device cpu, or no usable GPU with --device auto)",
            ));
        }
        DeviceKind::Cpu => probed,
    };
    let precision = device_precision(device == DeviceKind::Cpu, args.precision)?;
    let gpu_name = inventory
        .gpus
        .first()
        .map(|g| g.name.clone())
        .filter(|_| device == DeviceKind::Cuda);
    let short = short_device_name(device, &inventory);
    let id = args
        .run_id
        .clone()
        .unwrap_or_else(|| format!("overhead-{}", default_run_id(&crate::clock::now_rfc3339(), &short)));
    validate_run_id(&id)?;
    let dir = args.out.join(&id);
    std::fs::create_dir_all(dir.join("logs")).map_err(BenchError::io(format!("creating {}", dir.display())))?;
    let command = WorkloadCommand::builtin(
        find_workload(args.workload_bin.as_deref())?,
        vec![
            "--model".into(),
            args.model.name().into(),
            "--device".into(),
            device.name().into(),
            "--precision".into(),
            precision.name().into(),
        ],
    );
    let mut backend = LocalBackend::new(command, device, inventory, &dir, None);
    crate::errln!(
        "overhead: {} phases of {} each, alternating no scraping / scraping every {}",
        args.repeats * 2,
        args.phase,
        args.interval
    );
    let launched = backend.launch(STRATEGY, 1, &[], shutdown).await;
    let result = match launched {
        Ok(_) => {
            measure(
                &mut backend,
                (args.model.name(), device, precision.name(), gpu_name),
                warmup,
                phase,
                args.repeats,
                interval,
                shutdown,
            )
            .await
        }
        Err(e) => Err(e),
    };
    backend.restore(shutdown).await?;
    let result = result?;
    let json = serde_json::to_vec_pretty(&result).map_err(|e| BenchError::Results {
        path: dir.join("overhead.json"),
        reason: e.to_string(),
    })?;
    let path = dir.join("overhead.json");
    crate::files::write_atomic(&path, &json)?;
    Ok((result, path))
}

/// The terminal summary of an overhead run (pure).
pub fn render(r: &OverheadResult) -> String {
    let mut out = String::new();
    for p in &r.phases {
        out += &format!(
            "{:<14} {:>7.1} s {:>9} inferences {:>9.2} inf/s\n",
            if p.scraping {
                format!("scraping {}/s", fmt_rate(r.interval_s))
            } else {
                "no scraping".to_string()
            },
            p.seconds,
            p.inferences,
            p.throughput_per_s
        );
    }
    out += &format!(
        "without scraping {:.2} inf/s (spread {:.2}%), with {:.2} inf/s (spread {:.2}%): difference {:+.2}%\n",
        r.throughput_without, r.spread_without_pct, r.throughput_with, r.spread_with_pct, r.difference_pct
    );
    out
}

/// Scrapes per second for an interval, as few digits as it needs ("1", "0.5", "2").
fn fmt_rate(interval_s: f64) -> String {
    let rate = 1.0 / interval_s;
    let text = format!("{rate:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_by_hand() {
        let p = |scraping, t| OverheadPhase {
            scraping,
            seconds: 1.0,
            inferences: t as u64,
            throughput_per_s: t,
            scrapes: 0,
        };
        let (a, b, d, sa, sb) = summarise(&[p(false, 100.0), p(true, 99.0), p(false, 102.0), p(true, 99.0)]);
        assert_eq!((a, b), (101.0, 99.0));
        assert!((d + 1.980198).abs() < 1e-5);
        assert!((sa - 200.0 / 101.0).abs() < 1e-9);
        assert_eq!(sb, 0.0);
    }
}
