//! Exports of a run: one [`Exporter`] per format, each a pure function from the run's
//! records to bytes (snapshot-tested in `tests/report.rs`). CSV and JSON derive from the
//! record structs, the CSV through [`tidy`] (shares as fractions, numbers rounded to what
//! they resolve, the GPU's name); per-cell and per-pod rows are separate formats, so a
//! column's sum is never counted twice; Markdown is the report's tables. A partial run (run.json's `state`
//! not `complete`) is marked: the Markdown opens with a PARTIAL RUN line and the JSON
//! carries run.json, state included; CSV rows are the cells on disk, nothing more. An
//! isolation run exports its trial records (CSV, JSON) and its matrix (Markdown).

pub mod summary;
pub mod tidy;

use crate::config::cli::ExportFormat;
use crate::error::{BenchError, Result};
use crate::report::RunData;
use crate::results::record::cells_csv;

/// Turns a run into one format's bytes.
pub trait Exporter {
    /// The format's name.
    fn name(&self) -> &'static str;
    /// The bytes (pure).
    fn export(&self, data: &RunData) -> Result<Vec<u8>>;
}

/// One row per cell and repeat: the cells' totals (spreadsheet-ready); an isolation
/// run's trials.
#[derive(Debug, Clone, Copy, Default)]
pub struct Csv;

impl Exporter for Csv {
    fn name(&self) -> &'static str {
        "csv"
    }
    fn export(&self, data: &RunData) -> Result<Vec<u8>> {
        if data.run.kind.isolation().is_some() {
            let raw = crate::results::isolation::isolation_csv(&data.isolation)?;
            return tidy::tidy(&raw, &data.gpu_names(), "isolation.csv");
        }
        cells(data)
    }
}

/// One row per pod of each cell and repeat (CSV).
#[derive(Debug, Clone, Copy, Default)]
pub struct Pods;

impl Exporter for Pods {
    fn name(&self) -> &'static str {
        "pods"
    }
    fn export(&self, data: &RunData) -> Result<Vec<u8>> {
        if data.run.kind.isolation().is_some() {
            return Err(BenchError::flag(
                "--format",
                "pods",
                "an isolation run has one victim per trial: its records are --format csv",
            ));
        }
        pods(data)
    }
}

/// cells.csv of a report: the aggregate rows, one per cell and repeat.
pub fn cells(data: &RunData) -> Result<Vec<u8>> {
    let rows: Vec<_> = data.cells.iter().filter(|c| c.is_aggregate()).cloned().collect();
    tidy::tidy(&cells_csv(&rows)?, &data.gpu_names(), "cells.csv")
}

/// pods.csv of a report: the per-pod rows.
pub fn pods(data: &RunData) -> Result<Vec<u8>> {
    let rows: Vec<_> = data.cells.iter().filter(|c| c.is_pod()).cloned().collect();
    tidy::tidy(&cells_csv(&rows)?, &data.gpu_names(), "pods.csv")
}

/// `{"run": run.json, "cells": [...]}`, pretty-printed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl Exporter for Json {
    fn name(&self) -> &'static str {
        "json"
    }
    fn export(&self, data: &RunData) -> Result<Vec<u8>> {
        // Built as a JSON value, as since the first release: keys come out sorted.
        let value = if data.run.kind.isolation().is_some() {
            serde_json::json!({ "run": data.run, "isolation": data.isolation })
        } else {
            serde_json::json!({ "run": data.run, "cells": data.cells })
        };
        let mut out = serde_json::to_vec_pretty(&value).map_err(|e| BenchError::Results {
            path: "export.json".into(),
            reason: e.to_string(),
        })?;
        out.push(b'\n');
        Ok(out)
    }
}

/// The report's tables as Markdown.
#[derive(Debug, Clone, Copy, Default)]
pub struct Markdown;

impl Exporter for Markdown {
    fn name(&self) -> &'static str {
        "markdown"
    }
    fn export(&self, data: &RunData) -> Result<Vec<u8>> {
        Ok(crate::report::tables::markdown(data, &crate::report::run_tables(data)).into_bytes())
    }
}

/// One row per cell, repeats combined: means and 95% intervals (CSV).
#[derive(Debug, Clone, Copy, Default)]
pub struct Summary;

impl Exporter for Summary {
    fn name(&self) -> &'static str {
        "summary"
    }
    fn export(&self, data: &RunData) -> Result<Vec<u8>> {
        if data.run.kind.isolation().is_some() {
            return Err(BenchError::flag(
                "--format",
                "summary",
                "an isolation run has no cells to summarise: its records are one row per trial already (--format csv)",
            ));
        }
        tidy::tidy(&summary::csv(data)?, &data.gpu_names(), "summary.csv")
    }
}

/// A capacity run's table: one row per strategy (CSV).
#[derive(Debug, Clone, Copy, Default)]
pub struct Capacity;

impl Exporter for Capacity {
    fn name(&self) -> &'static str {
        "capacity"
    }
    fn export(&self, data: &RunData) -> Result<Vec<u8>> {
        if data.run.kind.capacity().is_none() {
            return Err(BenchError::flag(
                "--format",
                "capacity",
                "not a capacity run: `gpushare-bench capacity` makes one",
            ));
        }
        let raw = crate::capacity::record::csv(&crate::capacity::record::records(&data.run, &data.cells))?;
        tidy::tidy(&raw, &data.gpu_names(), "capacity.csv")
    }
}

/// The exporter of a format.
pub fn for_format(format: ExportFormat) -> Box<dyn Exporter> {
    match format {
        ExportFormat::Csv => Box::new(Csv),
        ExportFormat::Pods => Box::new(Pods),
        ExportFormat::Json => Box::new(Json),
        ExportFormat::Markdown => Box::new(Markdown),
        ExportFormat::Summary => Box::new(Summary),
        ExportFormat::Capacity => Box::new(Capacity),
    }
}
