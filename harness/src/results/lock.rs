//! One sweep per run directory: an advisory lock (`File::try_lock`, `flock` on Linux) on `RUN_DIR/.lock`, held for
//! the whole sweep or resume, with the holder's pid written in the file so a second one
//! is refused with a line that names it. The kernel drops the lock when the holder dies,
//! however it dies, so a crash never leaves a run locked.

use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::error::{BenchError, Result};

/// A held lock; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct RunLock {
    _file: std::fs::File,
}

impl RunLock {
    /// Takes the lock of `run_dir`, or fails naming the process that holds it.
    pub fn acquire(run_dir: &Path) -> Result<Self> {
        let path = run_dir.join(".lock");
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| BenchError::Results {
                path: path.clone(),
                reason: format!("cannot open the run's lock file: {e}"),
            })?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(BenchError::Results {
                    path: path.clone(),
                    reason: format!("cannot lock the run's lock file: {e}"),
                });
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(BenchError::Results {
                    path: run_dir.to_path_buf(),
                    reason: format!(
                        "in use by another gpushare-bench (pid {}); wait for it to end, or stop it",
                        if holder.is_empty() { "unknown" } else { holder }
                    ),
                });
            }
        }
        let _ = file.set_len(0);
        let _ = file.rewind();
        let _ = writeln!(file, "{}", std::process::id());
        Ok(Self { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_first_ones_pid() {
        let dir = tempfile::tempdir().expect("tmp");
        let first = RunLock::acquire(dir.path()).expect("first");
        let e = RunLock::acquire(dir.path()).expect_err("second").to_string();
        assert!(e.contains(&format!("pid {}", std::process::id())), "{e}");
        drop(first);
        assert!(RunLock::acquire(dir.path()).is_ok(), "released on drop");
    }
}
