//! Files the harness writes whole: a reader sees the old content or the new, never half;
//! and never through a symbolic link, so that no write lands outside a run directory.

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::error::{BenchError, Result};

/// Refuses a directory the harness is about to write in when it is, or holds, a
/// symbolic link (up to four levels down): a link would carry a write elsewhere (a
/// `.lock` onto another file, `logs/` into another directory). A directory that does not
/// exist yet is fine.
pub fn refuse_links(dir: &Path) -> Result<()> {
    fn walk(p: &Path, depth: u32) -> Result<()> {
        let meta = match std::fs::symlink_metadata(p) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => {
                return Err(BenchError::Results {
                    path: p.to_path_buf(),
                    reason: format!("cannot read: {e}"),
                });
            }
        };
        if meta.file_type().is_symlink() {
            return Err(BenchError::RunDir {
                path: p.to_path_buf(),
                reason: "a symbolic link: a run directory holds only its own files and directories, and the harness follows no link in one (remove it)".into(),
            });
        }
        if meta.is_dir() && depth > 0 {
            let entries = std::fs::read_dir(p).map_err(|e| BenchError::Results {
                path: p.to_path_buf(),
                reason: format!("cannot list: {e}"),
            })?;
            for entry in entries.flatten() {
                walk(&entry.path(), depth - 1)?;
            }
        }
        Ok(())
    }
    walk(dir, 4)
}

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
    // A leftover (or planted) temporary file goes first; the new one is opened without
    // following a link.
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(|e| err(format!("cannot create {}: {e}", tmp.display())))?;
    f.write_all(bytes).map_err(|e| err(format!("cannot write: {e}")))?;
    f.sync_all().map_err(|e| err(format!("cannot sync: {e}")))?;
    std::fs::rename(&tmp, path).map_err(|e| err(format!("cannot rename into place: {e}")))
}
