//! Exports of a run: one [`Exporter`] per format, each a pure function from the run's
//! records to bytes (snapshot-tested in `tests/report.rs`). CSV and JSON derive from the
//! record structs; Markdown is the report's tables. A partial run (run.json's `state`
//! not `complete`) is marked: the Markdown opens with a PARTIAL RUN line and the JSON
//! carries run.json, state included; CSV rows are the cells on disk, nothing more. An
//! isolation run exports its trial records (CSV, JSON) and its matrix (Markdown).

pub mod summary;

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

/// One row per pod per cell plus aggregate rows (spreadsheet-ready).
#[derive(Debug, Clone, Copy, Default)]
pub struct Csv;

impl Exporter for Csv {
    fn name(&self) -> &'static str {
        "csv"
    }
    fn export(&self, data: &RunData) -> Result<Vec<u8>> {
        if data.run.kind.isolation().is_some() {
            return crate::results::isolation::isolation_csv(&data.isolation);
        }
        cells_csv(&data.cells)
    }
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
        summary::csv(data)
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
        crate::capacity::record::csv(&crate::capacity::record::records(&data.run, &data.cells))
    }
}

/// The exporter of a format.
pub fn for_format(format: ExportFormat) -> Box<dyn Exporter> {
    match format {
        ExportFormat::Csv => Box::new(Csv),
        ExportFormat::Json => Box::new(Json),
        ExportFormat::Markdown => Box::new(Markdown),
        ExportFormat::Summary => Box::new(Summary),
        ExportFormat::Capacity => Box::new(Capacity),
    }
}
