//! Files the harness writes whole: a reader sees the old content or the new, never half.

use std::path::Path;

use crate::error::{BenchError, Result};

/// Writes `bytes` to `path` atomically (temporary file in the same directory, fsync, rename).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let tmp = path.with_extension(format!(
        "{}.tmp",
        path.extension().and_then(|e| e.to_str()).unwrap_or("")
    ));
    let err = |reason: String| BenchError::Results {
        path: path.to_path_buf(),
        reason,
    };
    let mut f = std::fs::File::create(&tmp).map_err(|e| err(format!("cannot create {}: {e}", tmp.display())))?;
    f.write_all(bytes).map_err(|e| err(format!("cannot write: {e}")))?;
    f.sync_all().map_err(|e| err(format!("cannot sync: {e}")))?;
    std::fs::rename(&tmp, path).map_err(|e| err(format!("cannot rename into place: {e}")))
}
