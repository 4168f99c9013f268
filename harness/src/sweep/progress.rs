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
        sweep.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} {prefix}  elapsed {elapsed}  eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        let cell = multi.add(ProgressBar::new_spinner());
        cell.set_style(
            ProgressStyle::with_template("{spinner} {prefix} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        cell.enable_steady_tick(Duration::from_millis(200));
        Self { multi, sweep, cell }
    }
}

impl Progress for Bars {
    fn sweep_start(&self, total: u64, done: u64, unit: &str) {
        self.sweep.set_prefix(unit.to_string());
        self.sweep.set_length(total);
        self.sweep.set_position(done);
        self.sweep.reset_eta();
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
}
