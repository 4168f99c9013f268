//! What the user sees while a sweep runs: a sweep bar with ETA and a line for the cell
//! in progress (indicatif), or nothing but warnings with `--quiet`.

use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::domain::Arm;

/// Receives progress events.
pub trait Progress {
    /// A run of `total` `unit` (cells, trials) begins (`done` already on disk when
    /// resuming).
    fn sweep_start(&self, total: u64, done: u64, unit: &str);
    /// A cell (or trial) begins: what it is, e.g. "MPS × 3 pods (repeat 2 of 3)".
    fn cell_start(&self, what: &str);
    /// What the cell is doing.
    fn phase(&self, text: &str);
    /// A measurement window ended: its throughput and mean latency (seconds).
    fn window(&self, n: usize, throughput: f64, mean: f64, stable: bool);
    /// A cell ended with this one-line summary (`failed`: the cell could not be measured).
    fn cell_done(&self, summary: &str, failed: bool);
    /// Something the user should read.
    fn message(&self, text: &str);
    /// The sweep ended.
    fn finish(&self);
    /// How long one cell (or trial) may take by the plan, at least and at most (before
    /// [`sweep_start`](Self::sweep_start)): the ETA until a cell has finished.
    fn plan_per_item(&self, _least: Duration, _most: Duration) {}
}

/// The time a run's remaining items take: before any item finished in this session,
/// the plan's range per item (less what has already passed); after, the mean time of
/// those finished, less the time already spent on the current one. Empty when nothing
/// remains.
pub fn eta_text(
    remaining: u64,
    finished: u64,
    elapsed: Duration,
    last_done: Duration,
    plan: Option<(Duration, Duration)>,
) -> String {
    if remaining == 0 {
        return String::new();
    }
    let n = remaining as u32;
    if finished > 0 {
        let per = last_done / finished as u32;
        let into_current = elapsed.saturating_sub(last_done);
        return format!("eta ~{}", short_duration((per * n).saturating_sub(into_current)));
    }
    match plan {
        Some((least, most)) if least == most => {
            format!(
                "eta ~{} by the plan",
                short_duration((least * n).saturating_sub(elapsed))
            )
        }
        Some((least, most)) => format!(
            "eta {}–{} by the plan",
            short_duration((least * n).saturating_sub(elapsed)),
            short_duration((most * n).saturating_sub(elapsed))
        ),
        None => "eta after the first cell".to_string(),
    }
}

/// "45s", "4m05s", "1h02m".
pub fn short_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// What a sweep's cell is: "MPS × 3 pods", with " (repeat 2 of 3)" when the plan
/// repeats (`pass` is (repeat, of repeats)).
pub fn cell_title(arm: Arm, pods: u32, pass: Option<(u32, u32)>) -> String {
    format!(
        "{} × {pods} pod{}{}",
        arm.title(),
        if pods == 1 { "" } else { "s" },
        pass.map(|(r, n)| format!(" (repeat {r} of {n})")).unwrap_or_default()
    )
}

/// No output except messages and failed cells (to stderr); for CI and scripts.
#[derive(Debug, Default)]
pub struct Quiet;

impl Progress for Quiet {
    fn sweep_start(&self, _: u64, _: u64, _: &str) {}
    fn cell_start(&self, _: &str) {}
    fn phase(&self, _: &str) {}
    fn window(&self, _: usize, _: f64, _: f64, _: bool) {}
    fn cell_done(&self, summary: &str, failed: bool) {
        if failed {
            crate::errln!("{summary}");
        }
    }
    fn message(&self, text: &str) {
        crate::errln!("{text}");
    }
    fn finish(&self) {}
}

/// Plain lines on stderr (a log file, CI without --quiet): one when a cell starts and
/// one when it ends.
#[derive(Debug, Default)]
pub struct Lines;

impl Progress for Lines {
    fn sweep_start(&self, total: u64, done: u64, unit: &str) {
        crate::errln!("{total} {unit}, {done} already on disk");
    }
    fn cell_start(&self, what: &str) {
        crate::errln!("start: {what}");
    }
    fn phase(&self, _: &str) {}
    fn window(&self, _: usize, _: f64, _: f64, _: bool) {}
    fn cell_done(&self, summary: &str, _failed: bool) {
        crate::errln!("done: {summary}");
    }
    fn message(&self, text: &str) {
        crate::errln!("{text}");
    }
    fn finish(&self) {}
}

/// Progress bars on the terminal (plain lines when stderr is not a terminal).
#[derive(Debug)]
pub struct Bars {
    multi: MultiProgress,
    sweep: ProgressBar,
    cell: ProgressBar,
    eta: std::sync::Arc<std::sync::Mutex<EtaState>>,
}

/// What the sweep bar's ETA is computed from, besides the bar's own position and clock.
#[derive(Debug, Default, Clone, Copy)]
struct EtaState {
    /// Items already on disk when the run began.
    start_pos: u64,
    /// The bar's elapsed time when the last item finished.
    last_done: Duration,
    /// The plan's time per item, at least and at most.
    plan: Option<(Duration, Duration)>,
}

impl Default for Bars {
    fn default() -> Self {
        Self::new()
    }
}

impl Bars {
    /// Bars on stderr.
    pub fn new() -> Self {
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
        let sweep = multi.add(ProgressBar::new(0));
        let eta = std::sync::Arc::new(std::sync::Mutex::new(EtaState::default()));
        let shared = eta.clone();
        let plan_eta = move |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
            let e = shared.lock().map(|e| *e).unwrap_or_default();
            let remaining = state.len().unwrap_or(0).saturating_sub(state.pos());
            let finished = state.pos().saturating_sub(e.start_pos);
            let _ = w.write_str(&eta_text(remaining, finished, state.elapsed(), e.last_done, e.plan));
        };
        sweep.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} {prefix}  elapsed {elapsed}  {plan_eta}")
                .map(|s| s.with_key("plan_eta", plan_eta))
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        // The clock and the ETA move every second, not only when a cell ends.
        sweep.enable_steady_tick(Duration::from_secs(1));
        let cell = multi.add(ProgressBar::new_spinner());
        cell.set_style(
            ProgressStyle::with_template("{spinner} {prefix} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        cell.enable_steady_tick(Duration::from_millis(200));
        Self {
            multi,
            sweep,
            cell,
            eta,
        }
    }
}

impl Progress for Bars {
    fn sweep_start(&self, total: u64, done: u64, unit: &str) {
        self.sweep.set_prefix(unit.to_string());
        self.sweep.set_length(total);
        self.sweep.set_position(done);
        self.sweep.reset_elapsed();
        if let Ok(mut e) = self.eta.lock() {
            e.start_pos = done;
            e.last_done = Duration::ZERO;
        }
    }
    fn cell_start(&self, what: &str) {
        self.cell.set_prefix(format!("{what}:"));
        self.cell.set_message("");
    }
    fn phase(&self, text: &str) {
        self.cell.set_message(text.to_string());
    }
    fn window(&self, n: usize, throughput: f64, mean: f64, stable: bool) {
        self.cell.set_message(format!(
            "window {n}: {throughput:.1} inf/s, mean {:.2} ms{}",
            mean * 1e3,
            if stable { ", stable" } else { "" }
        ));
    }
    fn cell_done(&self, summary: &str, _failed: bool) {
        if let Ok(mut e) = self.eta.lock() {
            e.last_done = self.sweep.elapsed();
        }
        self.sweep.inc(1);
        let _ = self.multi.println(summary);
    }
    fn message(&self, text: &str) {
        let _ = self.multi.println(text);
    }
    fn finish(&self) {
        self.cell.finish_and_clear();
        self.sweep.finish();
    }
    fn plan_per_item(&self, least: Duration, most: Duration) {
        if let Ok(mut e) = self.eta.lock() {
            e.plan = Some((least, most));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_eta_comes_from_the_plan_until_a_cell_has_finished() {
        let s = Duration::from_secs;
        let plan = Some((s(25), s(40)));
        // 12 cells ahead, 10 s in: 12 × 25 − 10 to 12 × 40 − 10.
        assert_eq!(eta_text(12, 0, s(10), s(0), plan), "eta 4m50s–7m50s by the plan");
        assert_eq!(eta_text(12, 0, s(10), s(0), None), "eta after the first cell");
        assert_eq!(
            eta_text(3, 0, s(0), s(0), Some((s(30), s(30)))),
            "eta ~1m30s by the plan"
        );
        // Two cells finished at 60 s (30 s each), 10 s into the third: 10 × 30 − 10.
        assert_eq!(eta_text(10, 2, s(70), s(60), plan), "eta ~4m50s");
        assert_eq!(eta_text(0, 12, s(400), s(400), plan), "");
        assert_eq!(short_duration(s(3725)), "1h02m");
    }
}
