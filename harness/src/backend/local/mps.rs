//! A private MPS control daemon per cell: pipe and log directories inside the run
//! directory, started with `nvidia-cuda-mps-control -d` and always stopped with `quit`
//! (explicitly after the cell, and by the guard's Drop on every other exit path).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::backend::local::strategy::MpsDirs;
use crate::error::{BenchError, Result};
use crate::process::supervisor::{self, Entry};
use crate::shutdown::{EndsOn, Shutdown};

/// The variable that names a daemon's pipe directory (and so tells our daemons apart).
const PIPE_ENV: &str = "CUDA_MPS_PIPE_DIRECTORY";

/// Where MPS control binaries usually live besides PATH.
const MPS_LOCATIONS: [&str; 4] = [
    "/usr/local/nvidia/bin/nvidia-cuda-mps-control",
    "/usr/bin/nvidia-cuda-mps-control",
    "/usr/local/cuda/bin/nvidia-cuda-mps-control",
    "/usr/lib/nvidia/bin/nvidia-cuda-mps-control",
];

/// Finds `nvidia-cuda-mps-control` on PATH or in the driver's usual places.
pub fn find_control() -> Option<PathBuf> {
    crate::process::which("nvidia-cuda-mps-control", &MPS_LOCATIONS)
}

/// The pipe and log directories for a cell. Unix socket paths are limited to about
/// 108 bytes, so a deep run directory falls back to a short one under /tmp.
pub fn dirs_for(run_dir: &Path, cell: &str, gpu: Option<&str>) -> MpsDirs {
    let base = run_dir.join("mps").join(cell);
    let pipe = base.join("pipe");
    let pipe = if pipe.as_os_str().len() > 80 {
        // Named after the run directory, so two runs (or a run and its resume by another
        // harness that got the same pid) never share, or stop, each other's daemon.
        std::env::temp_dir().join(format!(
            "gpushare-mps-{:016x}-{cell}",
            fnv1a(run_dir.as_os_str().as_encoded_bytes())
        ))
    } else {
        pipe
    };
    MpsDirs {
        pipe: pipe.to_string_lossy().into_owned(),
        log: base.join("log").to_string_lossy().into_owned(),
        gpu: gpu.map(str::to_string),
    }
}

/// FNV-1a, 64 bits: a short, stable name for a path.
/// Whether a journal's entry names one of this run's MPS daemons: by its pipe
/// directory, which only [`dirs_for`] of this run directory makes. A journal is a file
/// anyone can edit; an entry that names another variable or another daemon's directory
/// (the system's, another run's) is not the run's to stop.
pub fn is_runs_daemon(run_dir: &Path, entry: &Entry) -> bool {
    let Entry::Env { key, value, .. } = entry else {
        return false;
    };
    let own_tmp = std::env::temp_dir().join(format!(
        "gpushare-mps-{:016x}-",
        fnv1a(run_dir.as_os_str().as_encoded_bytes())
    ));
    let pipe = Path::new(value);
    key == PIPE_ENV
        && !value.contains("/../")
        && (pipe.starts_with(run_dir.join("mps")) || value.starts_with(&*own_tmp.to_string_lossy()))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A running MPS control daemon; `quit` is sent on drop if `stop` was not called.
#[derive(Debug)]
pub struct MpsDaemon {
    control: PathBuf,
    dirs: MpsDirs,
    running: bool,
    /// The length of server.log when this daemon started (the directory is reused).
    server_log_start: u64,
}

impl MpsDaemon {
    /// What this daemon's server logged of a client's fatal GPU error, in one line
    /// (None: nothing, or no log to read).
    pub fn fatal_error_note(&self) -> Option<String> {
        let text = std::fs::read(Path::new(&self.dirs.log).join("server.log")).ok()?;
        let start = usize::try_from(self.server_log_start)
            .unwrap_or(usize::MAX)
            .min(text.len());
        fatal_error_note(&String::from_utf8_lossy(&text[start..]))
    }

    /// Starts a daemon with private directories and waits (at most 10 s, less if a stop
    /// is asked for) for its control pipe.
    pub async fn start(control: &Path, dirs: &MpsDirs, shutdown: &Shutdown) -> Result<Self> {
        let server_log_start = std::fs::metadata(Path::new(&dirs.log).join("server.log")).map_or(0, |m| m.len());
        for d in [&dirs.pipe, &dirs.log] {
            std::fs::create_dir_all(d).map_err(|e| BenchError::Mps {
                what: format!("cannot create {d}"),
                source: Some(e),
            })?;
        }
        // Watched before it exists: a daemon is nobody's child once it has daemonised.
        supervisor::register(supervised(&dirs.pipe));
        let mut command = Command::new(control);
        command
            .arg("-d")
            .env(PIPE_ENV, &dirs.pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &dirs.log)
            .stdin(Stdio::null());
        // The daemon's server sees only the measured GPU (by UUID: NVIDIA's MPS guide
        // advises UUIDs, since indices are remapped for clients).
        if let Some(uuid) = &dirs.gpu {
            command.env("CUDA_VISIBLE_DEVICES", uuid);
        }
        let out = command.output().map_err(|e| BenchError::Mps {
            what: format!("cannot run {}", control.display()),
            source: Some(e),
        })?;
        if !out.status.success() {
            supervisor::clean_up(&[supervised(&dirs.pipe)], Duration::ZERO);
            supervisor::unregister(&supervised(&dirs.pipe));
            return Err(BenchError::mps(format!(
                "{} -d exited with {}: {}",
                control.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let daemon = Self {
            server_log_start,
            control: control.to_path_buf(),
            dirs: dirs.clone(),
            running: true,
        };
        let pipe = Path::new(&dirs.pipe).join("control");
        let mut wait = shutdown.poll(EndsOn::Request, Duration::from_millis(50), Duration::from_secs(10));
        while !pipe.exists() {
            // Dropping `daemon` on either error sends quit, in case it came up late.
            if !wait.keep_waiting().await? {
                return Err(BenchError::mps(format!(
                    "no control pipe at {} after 10 s",
                    pipe.display()
                )));
            }
        }
        Ok(daemon)
    }

    /// The directories clients must use.
    pub fn dirs(&self) -> &MpsDirs {
        &self.dirs
    }

    /// Sends `quit`, waits (at most 5 s) until no process of this daemon is left (the
    /// control daemon and its servers, found by their CUDA_MPS_PIPE_DIRECTORY), kills
    /// any that remain, and removes the pipe directory's sockets.
    pub fn stop(&mut self) -> Result<()> {
        self.stop_within(Duration::from_secs(5), &|| false)
    }

    /// [`MpsDaemon::stop`] with another grace period (zero on a forced stop: kill at once
    /// after `quit`).
    /// `forced` is polled while waiting: a second signal cuts the wait short.
    pub fn stop_within(&mut self, grace: Duration, forced: &dyn Fn() -> bool) -> Result<()> {
        if !self.running {
            return Ok(());
        }
        self.running = false;
        let mut child = Command::new(&self.control)
            .env(PIPE_ENV, &self.dirs.pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &self.dirs.log)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| BenchError::Mps {
                what: format!("cannot run {} to quit", self.control.display()),
                source: Some(e),
            })?;
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(b"quit\n");
        }
        // The client returns at once from a live daemon; a wedged one must not hang us.
        let client_deadline = Instant::now() + Duration::from_secs(2).max(grace);
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < client_deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
            let _ = child.wait();
        }
        let deadline = Instant::now() + grace;
        let mut left = daemon_pids(&self.dirs.pipe);
        while !left.is_empty() && Instant::now() < deadline && !forced() {
            std::thread::sleep(Duration::from_millis(50));
            left = daemon_pids(&self.dirs.pipe);
        }
        let mut result = Ok(());
        if !left.is_empty() {
            for pid in &left {
                // Processes found by this cell's private pipe directory: ours.
                crate::process::signal(*pid, libc::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(200));
            let still = daemon_pids(&self.dirs.pipe);
            if still.is_empty() {
                tracing::warn!(
                    "MPS daemon with pipe {} did not quit within {} s; killed {left:?}",
                    self.dirs.pipe,
                    grace.as_secs_f64()
                );
            } else {
                result = Err(BenchError::mps(format!(
                    "daemon processes {still:?} (pipe {}) survive SIGKILL",
                    self.dirs.pipe
                )));
            }
        }
        // The daemon leaves its sockets behind; they are no use to anyone.
        let _ = std::fs::remove_dir_all(&self.dirs.pipe);
        if result.is_ok() {
            supervisor::unregister(&supervised(&self.dirs.pipe));
        }
        result
    }
}

/// Processes whose environment names this pipe directory: our control daemon and the
/// MPS servers it started (clients are stopped before the daemon).
pub fn daemon_pids(pipe: &str) -> Vec<u32> {
    crate::process::procfs::live_with_env(PIPE_ENV, pipe)
}

/// The supervisor's entry for a daemon with this pipe directory.
fn supervised(pipe: &str) -> Entry {
    Entry::Env {
        key: PIPE_ENV.into(),
        value: pipe.to_string(),
        what: format!("MPS daemon (pipe {pipe})"),
    }
}

impl Drop for MpsDaemon {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::error!("{e}");
        }
    }
}

/// Reads an MPS server log for its handling of a client's fatal GPU error (pure):
/// lines such as "Client {PID: 1128, Context: 1} encountered a fatal GPU error.",
/// "... to be torn down" and "The following devices will be reset:" followed by the
/// device index, as the H100's MPS server (driver 580) writes them.
pub fn fatal_error_note(server_log: &str) -> Option<String> {
    let lines: Vec<&str> = server_log.lines().collect();
    let message = |l: &str| l.split_once("] ").map_or(l, |(_, m)| m).trim().to_string();
    let first = lines.iter().position(|l| l.contains("encountered a fatal GPU error"))?;
    let torn = lines[first..]
        .iter()
        .filter(|l| l.contains("on device") && l.contains("to be torn down"))
        .count();
    let reset = lines[first..]
        .iter()
        .position(|l| l.contains("The following devices will be reset"))
        .and_then(|i| lines.get(first + i + 1))
        .map(|l| message(l));
    let mut note = format!(
        "MPS server log: {} It tore down {torn} client context{}",
        message(lines[first]),
        if torn == 1 { "" } else { "s" }
    );
    if let Some(devices) = reset {
        note += &format!(" and logged that device {devices} will be reset (the server's own recovery)");
    }
    note.push('.');
    Some(note)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_journal_names_only_the_runs_own_daemons() {
        let run = Path::new("/r/run1");
        let env = |key: &str, value: String| Entry::Env {
            key: key.into(),
            value,
            what: "MPS daemon".into(),
        };
        let deep = Path::new("/r").join("d".repeat(90));
        for (run_dir, cell) in [(run, "mps-3p"), (deep.as_path(), "mps-7p")] {
            let d = dirs_for(run_dir, cell, None);
            assert!(is_runs_daemon(run_dir, &env(PIPE_ENV, d.pipe.clone())), "{}", d.pipe);
            assert!(
                !is_runs_daemon(Path::new("/r/run2"), &env(PIPE_ENV, d.pipe)),
                "another run's"
            );
        }
        for foreign in [
            env(PIPE_ENV, "/tmp/nvidia-mps".into()),
            env(PIPE_ENV, "/r/run1/mps/../../etc".into()),
            env("HOME", "/r/run1/mps/x".into()),
            env("HOME", "/root".into()),
        ] {
            assert!(!is_runs_daemon(run, &foreign), "{foreign:?}");
        }
    }

    #[test]
    fn dirs_stay_short_enough_for_unix_sockets() {
        let d = dirs_for(Path::new("/r/run1"), "mps-3p", None);
        assert_eq!(d.pipe, "/r/run1/mps/mps-3p/pipe");
        assert_eq!(d.log, "/r/run1/mps/mps-3p/log");
        let deep = "/a".repeat(60);
        let d = dirs_for(Path::new(&deep), "mps-7p", None);
        assert!(d.pipe.len() < 80 && d.pipe.contains("gpushare-mps-"), "{}", d.pipe);
    }

    /// A stand-in control binary: `-d` creates the pipe and leaves a background
    /// "daemon" that lives until `quit` removes the pipe (like the real one, it keeps
    /// CUDA_MPS_PIPE_DIRECTORY in its environment). A pipe directory named *stubborn* makes `quit` do nothing.
    fn fake_control(dir: &Path) -> PathBuf {
        let fake = dir.join("fake-mps-control");
        std::fs::write(
            &fake,
            "#!/bin/sh\nif [ \"$1\" = -d ]; then mkdir -p \"$CUDA_MPS_PIPE_DIRECTORY\"; touch \"$CUDA_MPS_PIPE_DIRECTORY/control\"; \
             (while [ -e \"$CUDA_MPS_PIPE_DIRECTORY/control\" ]; do sleep 0.05; done) </dev/null >/dev/null 2>&1 & exit 0; fi\n\
             read cmd; case \"$CUDA_MPS_PIPE_DIRECTORY\" in *stubborn*) exit 0;; esac; if [ \"$cmd\" = quit ]; then rm -f \"$CUDA_MPS_PIPE_DIRECTORY/control\"; fi\n",
        )
        .expect("write");
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
        fake
    }

    #[tokio::test]
    async fn start_and_stop_a_daemon_and_drop_stops_it_too() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let fake = fake_control(tmp.path());
        let dirs = dirs_for(tmp.path(), "c1", None);
        let mut d = MpsDaemon::start(&fake, &dirs, &Shutdown::new()).await.expect("start");
        assert!(
            !daemon_pids(&dirs.pipe).is_empty(),
            "the daemon carries our pipe directory"
        );
        d.stop().expect("stop");
        assert!(daemon_pids(&dirs.pipe).is_empty());
        assert!(!Path::new(&dirs.pipe).exists(), "sockets are cleaned up");
        let dirs2 = dirs_for(tmp.path(), "c2", None);
        {
            let _guard = MpsDaemon::start(&fake, &dirs2, &Shutdown::new()).await.expect("start");
            assert!(!daemon_pids(&dirs2.pipe).is_empty());
        }
        assert!(daemon_pids(&dirs2.pipe).is_empty(), "drop must stop the daemon");
    }

    #[tokio::test]
    async fn a_daemon_that_ignores_quit_is_killed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let fake = fake_control(tmp.path());
        let dirs = dirs_for(tmp.path(), "stubborn", None);
        let mut d = MpsDaemon::start(&fake, &dirs, &Shutdown::new()).await.expect("start");
        let t = Instant::now();
        d.stop().expect("killed, so stopped");
        assert!(t.elapsed() >= Duration::from_secs(5), "it waited for quit first");
        assert!(daemon_pids(&dirs.pipe).is_empty());
    }

    /// Lines of the server log of the H100 isolation run's MPS fault trial
    /// (results/20261122-h100-isolation/mps/mps-2p/log/server.log at commit 6358458).
    const FAULT_LOG: &str =
        "[2026-11-22 21:46:20.314 Server  1132] Status of client {PID: 1127, Context ID: 1} is ACTIVE
[2026-11-22 21:46:36.243 Server  1132] Client {PID: 1128, Context: 1} encountered a fatal GPU error.
[2026-11-22 21:46:36.243 Server  1132] Server is handling a fatal GPU error.
[2026-11-22 21:46:36.243 Server  1132] Client {PID: 1128, Context ID: 1} on device 0 to be torn down
[2026-11-22 21:46:36.243 Server  1132] Client {PID: 1127, Context ID: 1} on device 0 to be torn down
[2026-11-22 21:46:36.243 Server  1132] All clients belonging to error trigging process 1128 will be torn down
[2026-11-22 21:46:36.243 Server  1132] The following devices will be reset:
[2026-11-22 21:46:36.243 Server  1132] 0
[2026-11-22 21:46:36.372 Server  1132] Destroy server context on device 0 (NVIDIA H100 80GB HBM3)
";

    #[test]
    fn a_fatal_gpu_error_in_the_server_log_is_one_line() {
        assert_eq!(
            fatal_error_note(FAULT_LOG).as_deref(),
            Some(
                "MPS server log: Client {PID: 1128, Context: 1} encountered a fatal GPU error. It tore down 2 client contexts and logged that device 0 will be reset (the server's own recovery)."
            )
        );
        assert_eq!(
            fatal_error_note(&FAULT_LOG[..FAULT_LOG.find("[2026-11-22 21:46:36").unwrap_or(0)]),
            None
        );
        assert_eq!(fatal_error_note(""), None);
    }
}
