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
    write_atomic_mode(path, bytes, 0o666)
}

/// [`write_atomic`] with the file's permission bits (less the umask): 0o600 for a file
/// only its owner may read.
pub fn write_atomic_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
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
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(|e| err(format!("cannot create {}: {e}", tmp.display())))?;
    let written = f
        .write_all(bytes)
        .map_err(|e| err(format!("cannot write: {e}")))
        .and_then(|()| f.sync_all().map_err(|e| err(format!("cannot sync: {e}"))))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| err(format!("cannot rename into place: {e}"))));
    // A full disk leaves no half-written temporary file behind.
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// The most bytes the harness reads from one file, by what the file is. A file past
/// its limit is refused, never read in part: no input can make the harness grow
/// without bound, and a device or a pipe is refused before a byte is read.
pub mod limits {
    /// A config file, a lengths file, a request body: written by hand or by a script.
    pub const INPUT: u64 = 16 << 20;
    /// A run's small records: `run.json`, `equal-load.json`, `bucket-layouts.json`,
    /// a journal, a host-noise summary.
    pub const RECORD: u64 = 64 << 20;
    /// A run's rows and raw measurements (`cells.jsonl`, `windows.jsonl`,
    /// `requests.jsonl`): a week of windows of 100 pods stays well inside it.
    pub const ROWS: u64 = 1 << 30;
}

/// Why a bounded read gave no text.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Nothing at the path.
    #[error("cannot read: no such file")]
    Missing,
    /// A directory, a device, a FIFO or a socket: only regular files are read.
    #[error("not a regular file (a {0}): give a file")]
    NotAFile(&'static str),
    /// Larger than the limit for its kind.
    #[error("{size} bytes, more than the {limit} bytes such a file may have")]
    TooLarge {
        /// Its size, or the bytes read before the limit was passed.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// Not UTF-8 text.
    #[error("not UTF-8 text (byte {at} starts an invalid sequence)")]
    NotText {
        /// The offset of the first bad byte.
        at: usize,
    },
    /// The operating system refused.
    #[error("cannot read: {0}")]
    Io(std::io::Error),
}

/// Reads a regular file of at most `limit` bytes. The file is opened without blocking
/// (a FIFO with no writer does not hold the harness in `open()`), checked to be a
/// regular file, and read no further than `limit` + 1 bytes, so a file that grows while
/// read is refused too.
pub fn read_bytes(path: &Path, limit: u64) -> std::result::Result<Vec<u8>, ReadError> {
    use std::io::Read;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ReadError::Missing,
            _ => ReadError::Io(e),
        })?;
    let meta = file.metadata().map_err(ReadError::Io)?;
    let kind = meta.file_type();
    if !kind.is_file() {
        use std::os::unix::fs::FileTypeExt;
        let what = if kind.is_dir() {
            "directory"
        } else if kind.is_fifo() {
            "FIFO"
        } else if kind.is_char_device() || kind.is_block_device() {
            "device"
        } else if kind.is_socket() {
            "socket"
        } else {
            "special file"
        };
        return Err(ReadError::NotAFile(what));
    }
    if meta.len() > limit {
        return Err(ReadError::TooLarge {
            size: meta.len(),
            limit,
        });
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(ReadError::Io)?;
    if bytes.len() as u64 > limit {
        return Err(ReadError::TooLarge {
            size: bytes.len() as u64,
            limit,
        });
    }
    Ok(bytes)
}

/// A run directory's file that could not be read, as the error the user sees: bad input
/// (exit 2) when it is the file's fault, an I/O failure (exit 1) when the system's.
pub fn unreadable(path: &Path, e: ReadError) -> BenchError {
    match e {
        ReadError::Io(e) => BenchError::Results {
            path: path.to_path_buf(),
            reason: format!("cannot read: {e}"),
        },
        e => BenchError::RunDir {
            path: path.to_path_buf(),
            reason: e.to_string(),
        },
    }
}

/// [`read_bytes`] as UTF-8 text.
pub fn read_text(path: &Path, limit: u64) -> std::result::Result<String, ReadError> {
    String::from_utf8(read_bytes(path, limit)?).map_err(|e| ReadError::NotText {
        at: e.utf8_error().valid_up_to(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bounded_read_refuses_what_is_not_a_small_regular_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ok = dir.path().join("ok.json");
        std::fs::write(&ok, "{}\n").expect("write");
        assert_eq!(read_text(&ok, 3).expect("read"), "{}\n");
        assert!(matches!(
            read_text(&ok, 2),
            Err(ReadError::TooLarge { size: 3, limit: 2 })
        ));
        assert!(matches!(
            read_text(&dir.path().join("none"), 9),
            Err(ReadError::Missing)
        ));
        assert!(matches!(
            read_text(dir.path(), 9),
            Err(ReadError::NotAFile("directory"))
        ));
        assert!(matches!(
            read_text(Path::new("/dev/zero"), 1 << 20),
            Err(ReadError::NotAFile("device"))
        ));
        // A FIFO with no writer: refused at once, not a wait in open().
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(read_text(&fifo, 9), Err(ReadError::NotAFile("FIFO"))));
        let latin = dir.path().join("latin1");
        std::fs::write(&latin, b"ab\xe9").expect("write");
        assert!(matches!(read_text(&latin, 9), Err(ReadError::NotText { at: 2 })));
    }
}
