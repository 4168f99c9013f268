//! JSON-lines files of records: one serde struct per line, written whole and read back
//! with errors that name the file and line.

use std::path::Path;

use serde::Serialize;

use crate::error::{BenchError, Result};

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
/// line that does not parse is an error naming the file and line.
pub fn read_jsonl<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<T>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(BenchError::RunDir {
                path: path.to_path_buf(),
                reason: e.to_string(),
            });
        }
    };
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str::<T>(l).map_err(|e| BenchError::RunDir {
                path: path.to_path_buf(),
                reason: format!("line {}: {e}", i + 1),
            })
        })
        .collect()
}
