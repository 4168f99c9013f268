//! What the GPUs are and what they do: the inventory read once per run ([`inventory`],
//! [`nvml`]), the host ([`host`]), and telemetry sampled during measurements (NVML
//! locally, [`dcgm`] exporter series on Kubernetes). Read only: nothing here changes a
//! GPU setting.

pub mod dcgm;
pub mod environment;
pub mod host;
pub mod inventory;
pub mod nvml;

use std::sync::Arc;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

pub use inventory::{GpuInfo, GpuInventory, MigDevice};
pub use nvml::NvmlTelemetry;

/// One telemetry reading of the device: a record of a cell's raw GPU samples
/// (`raw-windows.jsonl`), from which `verify` recomputes the cell's GPU columns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSample {
    /// Seconds from the start of the measurement (0 until the sampler places it).
    #[serde(default)]
    pub at_s: f64,
    /// GPU utilisation, percent.
    pub util_pct: f64,
    /// Device memory in use, bytes.
    pub mem_used_bytes: u64,
    /// Board power, watts.
    pub power_w: f64,
    /// Energy counter since driver load, millijoules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub energy_mj: Option<u64>,
    /// Why the clocks are below their maximum now: NVML's clock event reasons, a bit mask
    /// (`nvmlClocksEventReason*`; None: not read, as from the DCGM exporter's default
    /// series).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_reasons: Option<u64>,
    /// SM clock, MHz.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_clock_mhz: Option<f64>,
    /// Memory clock, MHz.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_clock_mhz: Option<f64>,
    /// GPU temperature, °C.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temp_c: Option<f64>,
}

/// NVML's clock event reasons that slow a busy GPU for its own protection, with their
/// names (nvml.h `nvmlClocksEventReason*`: HwSlowdown, SwThermalSlowdown,
/// HwThermalSlowdown, HwPowerBrakeSlowdown). Idle, application-clock, sync-boost and
/// display reasons are settings or no load, not throttling.
pub const SLOWDOWN_REASONS: [(u64, &str); 4] = [
    (0x8, "hardware slowdown"),
    (0x20, "software thermal slowdown"),
    (0x40, "hardware thermal slowdown"),
    (0x80, "hardware power brake"),
];

/// NVML's `nvmlClocksEventReasonSwPowerCap`: the clocks are held at the board's power
/// limit. A GPU at full load often runs there; it is recorded, not flagged.
pub const POWER_CAP_REASON: u64 = 0x4;

/// What limited the clocks over a measurement's samples that read it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ClockLimits {
    /// Samples that read the reasons.
    pub samples: u32,
    /// Of which with a slowdown ([`SLOWDOWN_REASONS`]).
    pub slowed: u32,
    /// Of which at the power cap.
    pub power_capped: u32,
    /// Every slowdown reason seen, as a mask.
    pub reasons: u64,
}

impl ClockLimits {
    /// From samples' reason masks (pure).
    pub fn of(masks: impl IntoIterator<Item = u64>) -> Self {
        let slowdown: u64 = SLOWDOWN_REASONS.iter().map(|(bit, _)| bit).sum();
        let mut c = ClockLimits::default();
        for m in masks {
            c.samples += 1;
            if m & slowdown != 0 {
                c.slowed += 1;
                c.reasons |= m & slowdown;
            }
            if m & POWER_CAP_REASON != 0 {
                c.power_capped += 1;
            }
        }
        c
    }

    /// `none`, or the reasons seen and in how many samples:
    /// `hardware thermal slowdown in 12 of 30 samples`.
    pub fn describe(&self) -> String {
        if self.slowed == 0 {
            return "none".into();
        }
        let names: Vec<&str> = SLOWDOWN_REASONS
            .iter()
            .filter(|(bit, _)| self.reasons & bit != 0)
            .map(|(_, name)| *name)
            .collect();
        format!("{} in {} of {} samples", names.join(", "), self.slowed, self.samples)
    }
}

/// Reads device telemetry (NVML on GPU 0, or nothing).
pub trait Telemetry: Send + Sync {
    /// One reading, or None when there is no GPU to read.
    fn sample(&self) -> Option<GpuSample>;
}

/// No GPU: no numbers (cells get empty telemetry columns, not zeros).
#[derive(Debug, Default)]
pub struct NoTelemetry;

impl Telemetry for NoTelemetry {
    fn sample(&self) -> Option<GpuSample> {
        None
    }
}

/// The least, mean and greatest of a quantity over a measurement's samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gauge {
    /// Least.
    pub min: f64,
    /// Mean.
    pub mean: f64,
    /// Greatest.
    pub max: f64,
}

impl Gauge {
    /// Of the values (None when there are none).
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Gauge> {
        let (mut n, mut sum, mut min, mut max) = (0usize, 0.0, f64::INFINITY, f64::NEG_INFINITY);
        for v in values.into_iter().filter(|v| v.is_finite()) {
            n += 1;
            sum += v;
            min = min.min(v);
            max = max.max(v);
        }
        (n > 0).then(|| Gauge {
            min,
            mean: sum / n as f64,
            max,
        })
    }
}

/// Telemetry summarised over a measurement.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TelemetrySummary {
    /// Mean utilisation.
    pub util_pct: Option<f64>,
    /// Peak memory in use.
    pub mem_bytes: Option<u64>,
    /// Mean power.
    pub power_w: Option<f64>,
    /// Energy over the measurement, joules (from the energy counter).
    pub energy_j: Option<f64>,
    /// What limited the clocks (None: no sample read it).
    pub clocks: Option<ClockLimits>,
    /// SM clock, MHz (None: no sample read it).
    pub sm_clock_mhz: Option<Gauge>,
    /// Memory clock, MHz.
    pub mem_clock_mhz: Option<Gauge>,
    /// GPU temperature, °C.
    pub temp_c: Option<Gauge>,
}

/// Summarises samples taken once a second (pure).
pub fn summarise(samples: &[GpuSample]) -> TelemetrySummary {
    if samples.is_empty() {
        return TelemetrySummary::default();
    }
    let n = samples.len() as f64;
    let energy_j = match (
        samples.first().and_then(|s| s.energy_mj),
        samples.last().and_then(|s| s.energy_mj),
    ) {
        (Some(a), Some(b)) if b >= a && samples.len() > 1 => Some((b - a) as f64 / 1000.0),
        _ => None,
    };
    TelemetrySummary {
        util_pct: Some(samples.iter().map(|s| s.util_pct).sum::<f64>() / n),
        mem_bytes: samples.iter().map(|s| s.mem_used_bytes).max(),
        power_w: Some(samples.iter().map(|s| s.power_w).sum::<f64>() / n),
        energy_j,
        clocks: Some(ClockLimits::of(samples.iter().filter_map(|s| s.clock_reasons))).filter(|c| c.samples > 0),
        sm_clock_mhz: Gauge::of(samples.iter().filter_map(|s| s.sm_clock_mhz)),
        mem_clock_mhz: Gauge::of(samples.iter().filter_map(|s| s.mem_clock_mhz)),
        temp_c: Gauge::of(samples.iter().filter_map(|s| s.temp_c)),
    }
}

/// Samples telemetry every second on a background task until dropped or finished.
pub struct Sampler {
    samples: Arc<Mutex<Vec<GpuSample>>>,
    start: tokio::time::Instant,
    stop: tokio_util::sync::CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Sampler {
    /// Starts sampling now (one reading at once, then every second).
    pub fn start(telemetry: Arc<dyn Telemetry>) -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = tokio_util::sync::CancellationToken::new();
        let start = tokio::time::Instant::now();
        let task = {
            let (samples, stop) = (samples.clone(), stop.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tick.tick() => {
                            let t = telemetry.clone();
                            if let Ok(Some(mut s)) = tokio::task::spawn_blocking(move || t.sample()).await
                                && let Ok(mut v) = samples.lock() {
                                    s.at_s = start.elapsed().as_secs_f64();
                                    v.push(s);
                                }
                        }
                    }
                }
            })
        };
        Self {
            samples,
            start,
            stop,
            task: Some(task),
        }
    }

    /// Stops (taking one last reading, on a blocking thread like the others: a
    /// telemetry source may block on network I/O) and returns the samples, in order.
    pub async fn finish(mut self, telemetry: Arc<dyn Telemetry>) -> Vec<GpuSample> {
        self.stop.cancel();
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
        let mut v = self.samples.lock().map(|v| v.clone()).unwrap_or_default();
        if let Ok(Some(mut s)) = tokio::task::spawn_blocking(move || telemetry.sample()).await {
            s.at_s = self.start.elapsed().as_secs_f64();
            v.push(s);
        }
        v
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summarises_samples() {
        let s = |u, m, p, e| GpuSample {
            util_pct: u,
            mem_used_bytes: m,
            power_w: p,
            energy_mj: e,
            ..GpuSample::default()
        };
        let sum = summarise(&[s(50.0, 10, 100.0, Some(1_000)), s(100.0, 30, 300.0, Some(5_000))]);
        assert_eq!(sum.util_pct, Some(75.0));
        assert_eq!(sum.mem_bytes, Some(30));
        assert_eq!(sum.power_w, Some(200.0));
        assert_eq!(sum.energy_j, Some(4.0));
        assert_eq!(summarise(&[]), TelemetrySummary::default());
        // One sample: no energy difference to take.
        assert_eq!(summarise(&[s(1.0, 1, 1.0, Some(9))]).energy_j, None);
        assert_eq!(sum.clocks, None, "no sample read the clock reasons");
    }

    #[test]
    fn clocks_and_temperature_are_summarised_over_the_samples_that_read_them() {
        let s = |sm: Option<f64>, mem, t| GpuSample {
            sm_clock_mhz: sm,
            mem_clock_mhz: mem,
            temp_c: t,
            ..GpuSample::default()
        };
        let sum = summarise(&[
            s(Some(1980.0), Some(2619.0), Some(40.0)),
            s(Some(1755.0), None, Some(52.0)),
            s(None, Some(2619.0), Some(46.0)),
        ]);
        assert_eq!(
            sum.sm_clock_mhz,
            Some(Gauge {
                min: 1755.0,
                mean: 1867.5,
                max: 1980.0
            })
        );
        assert_eq!(sum.mem_clock_mhz.map(|g| (g.min, g.max)), Some((2619.0, 2619.0)));
        assert_eq!(sum.temp_c.map(|g| (g.min, g.mean, g.max)), Some((40.0, 46.0, 52.0)));
        assert_eq!(
            summarise(&[s(None, None, None)]).sm_clock_mhz,
            None,
            "not read: empty, not 0"
        );
        assert_eq!(Gauge::of([f64::NAN]), None);
    }

    #[test]
    fn a_sample_round_trips_and_an_unknown_field_is_refused() {
        let s = GpuSample {
            at_s: 1.5,
            util_pct: 100.0,
            mem_used_bytes: 3 << 30,
            power_w: 566.2,
            energy_mj: Some(12_345),
            clock_reasons: Some(0x4),
            sm_clock_mhz: Some(1980.0),
            mem_clock_mhz: Some(2619.0),
            temp_c: Some(61.0),
        };
        let text = serde_json::to_string(&s).expect("json");
        assert_eq!(serde_json::from_str::<GpuSample>(&text).expect("back"), s);
        let bare = r#"{"util_pct":1,"mem_used_bytes":2,"power_w":3}"#;
        assert_eq!(
            serde_json::from_str::<GpuSample>(bare).expect("optional fields").temp_c,
            None
        );
        assert!(serde_json::from_str::<GpuSample>(r#"{"util_pct":1,"mem_used_bytes":2,"power_w":3,"fan":1}"#).is_err());
    }

    #[test]
    fn clock_slowdowns_are_named_and_the_power_cap_only_counted() {
        // Idle (0x1) and the power cap (0x4) are no slowdown; HW thermal (0x40) is.
        let c = ClockLimits::of([0x1, 0x4, 0x4 | 0x40, 0x40, 0x0]);
        assert_eq!((c.samples, c.slowed, c.power_capped), (5, 2, 2));
        assert_eq!(c.describe(), "hardware thermal slowdown in 2 of 5 samples");
        assert_eq!(ClockLimits::of([0x4, 0x0]).describe(), "none");
        let both = ClockLimits::of([0x20, 0x80]);
        assert_eq!(
            both.describe(),
            "software thermal slowdown, hardware power brake in 2 of 2 samples"
        );
    }
}
