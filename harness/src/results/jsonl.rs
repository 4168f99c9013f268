//! JSON-lines files of records: one serde struct per line, written whole and read back
//! with errors that name the file and line.

use std::path::Path;

use serde::Serialize;

use crate::error::{BenchError, Result};

/// The most requests (or errors) one window of one pod may count, and the most a
/// histogram's bucket may hold: a million a second for eleven days.
pub const MAX_COUNT: f64 = 1e12;
/// The longest time a record may hold, seconds (a year).
pub const MAX_SECONDS: f64 = 3.2e7;

/// A count read back: a whole number from 0 to [`MAX_COUNT`].
pub(crate) fn check_count(what: &str, v: f64) -> std::result::Result<(), String> {
    if v.is_finite() && (0.0..=MAX_COUNT).contains(&v) && v.fract() == 0.0 {
        Ok(())
    } else {
        Err(format!("{what} is {v}: a count is a whole number from 0 to 10^12"))
    }
}

/// A time or a duration read back: finite, from 0 to [`MAX_SECONDS`].
pub(crate) fn check_seconds(what: &str, v: f64) -> std::result::Result<(), String> {
    if v.is_finite() && (0.0..=MAX_SECONDS).contains(&v) {
        Ok(())
    } else {
        Err(format!("{what} is {v}: seconds from 0 to a year"))
    }
}

/// Records as JSON lines (pure).
pub fn to_jsonl<T: Serialize>(records: &[T]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in records {
        // Structs of numbers, strings and enums always serialize.
        if let Ok(line) = serde_json::to_vec(r) {
            out.extend(line);
            out.push(b'\n');
        }
    }
    out
}

/// Reads a JSON-lines file of records (missing: none); blank lines are skipped, and a
/// line that does not parse, or that `check` refuses, is an error naming the file and
/// line. The file is read within [`crate::files::limits::ROWS`].
pub fn read_jsonl<T: serde::de::DeserializeOwned>(
    path: &Path,
    check: impl Fn(&T) -> std::result::Result<(), String>,
) -> Result<Vec<T>> {
    let text = match crate::files::read_text(path, crate::files::limits::ROWS) {
        Ok(t) => t,
        Err(crate::files::ReadError::Missing) => return Ok(Vec::new()),
        Err(e) => return Err(crate::files::unreadable(path, e)),
    };
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let bad = |reason: String| BenchError::RunDir {
                path: path.to_path_buf(),
                reason: format!("line {}: {reason}", i + 1),
            };
            let record = serde_json::from_str::<T>(l).map_err(|e| bad(e.to_string()))?;
            check(&record).map_err(bad)?;
            Ok(record)
        })
        .collect()
}
