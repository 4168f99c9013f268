//! Child processes the harness owns (workload pods, a private Prometheus, MPS daemons):
//! finding binaries, sending signals, and [`OwnedChild`], a guard that runs a child in
//! its own process group and stops the whole group on every exit path (explicitly with a
//! grace period, or by `Drop`); the kernel kills it if the harness dies
//! (`PR_SET_PDEATHSIG`), and the [`supervisor`] stops what is left even after SIGKILL.
//! It sits below `backend` and `metrics`, which both start processes.

pub mod procfs;
pub mod supervisor;

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::error::{BenchError, Result};
use crate::shutdown::Shutdown;

/// Finds `name` on PATH, else at the first of `also` that exists.
pub fn which(name: &str, also: &[&str]) -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| also.iter().map(PathBuf::from).find(|p| p.is_file()))
}

/// A free loopback port (the OS picks; the listener is closed before the caller binds).
pub fn free_port() -> Result<u16> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(BenchError::io("finding a free port"))
}

/// Sends `sig` to process `pid`; whether it was delivered.
pub fn signal(pid: u32, sig: i32) -> bool {
    let Ok(pid) = i32::try_from(pid) else { return false };
    // SAFETY: kill(2) takes plain integers and has no memory effects; callers pass pids of
    // processes they started (or found by their own markers) and have not reaped.
    unsafe { libc::kill(pid, sig) == 0 }
}

/// Sends `sig` to every process of group `pgid` (a child started by [`OwnedChild`] and
/// everything it started).
pub fn signal_group(pgid: u32, sig: i32) -> bool {
    match i32::try_from(pgid) {
        // SAFETY: as in `signal`; a negative target names a process group we created.
        Ok(g) if g > 1 => unsafe { libc::kill(-g, sig) == 0 },
        _ => false,
    }
}

/// A child in its own process group (a terminal's Ctrl-C reaches only the harness, which
/// then stops its children in order); the group is killed when the guard is dropped.
#[derive(Debug)]
pub struct OwnedChild {
    child: Option<Child>,
    pid: Option<u32>,
    entry: Option<supervisor::Entry>,
}

/// A value no other process group has, nor can guess from /proc: 128 random bits from
/// the kernel, this harness's pid and a count.
fn group_token() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut random = [0u8; 16];
    let filled = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut random))
        .is_ok();
    if !filled {
        // std's hasher keys come from the OS's random source too.
        use std::hash::BuildHasher;
        let keys = std::collections::hash_map::RandomState::new();
        random[..8].copy_from_slice(&keys.hash_one(n).to_le_bytes());
        random[8..].copy_from_slice(&keys.hash_one(std::process::id()).to_le_bytes());
    }
    let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
    format!("{hex}.{}.{n}", std::process::id())
}

impl OwnedChild {
    /// Spawns `cmd` in a new process group. `what` names the child in the error.
    ///
    /// PDEATHSIG fires when the *thread* that forked dies, not the process: spawn only
    /// from the main thread or a runtime worker (they live as long as the harness), never
    /// from `spawn_blocking`, whose idle threads exit and would take the child with them.
    pub fn spawn(cmd: &mut Command, what: &str) -> Result<Self> {
        // SAFETY: the closure runs in the child between fork and exec and only calls
        // async-signal-safe functions (getppid, prctl, _exit) on plain integers.
        let parent = std::process::id() as libc::pid_t;
        unsafe {
            cmd.pre_exec(move || {
                // Killed by the kernel the moment the harness dies, even by SIGKILL.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                // The harness may have died before prctl: then nobody would stop us.
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let token = group_token();
        let child = cmd
            .process_group(0)
            .kill_on_drop(true)
            .env(procfs::GROUP_TOKEN, &token)
            .spawn()
            .map_err(BenchError::io(format!("starting {what}")))?;
        let pid = child.id();
        let entry = pid.and_then(|p| {
            procfs::stat(p).map(|s| supervisor::Entry::Group {
                pgid: p,
                start_ticks: s.start_ticks,
                what: what.to_string(),
                token: Some(token),
            })
        });
        if let Some(e) = &entry {
            supervisor::register(e.clone());
        }
        Ok(Self {
            child: Some(child),
            pid,
            entry,
        })
    }

    fn forget(&mut self) {
        if let Some(e) = self.entry.take() {
            supervisor::unregister(&e);
        }
    }

    /// The child's pid (also its process group), while it has not been reaped.
    pub fn id(&self) -> Option<u32> {
        self.child.as_ref().and(self.pid)
    }

    /// The exit status if the child has exited (it is reaped then).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok().flatten()?;
        self.child = None;
        // Anything the child left in its group goes too.
        if let Some(pid) = self.pid {
            signal_group(pid, libc::SIGKILL);
        }
        self.forget();
        Some(status)
    }

    /// Sends SIGKILL to the child's group, without waiting (it is reaped by
    /// [`try_wait`](Self::try_wait)).
    pub fn kill(&self) {
        if let Some(pid) = self.id() {
            signal_group(pid, libc::SIGKILL);
        }
    }

    /// Sends SIGTERM to the child's group, without waiting.
    pub fn terminate(&self) {
        if let Some(pid) = self.id() {
            signal_group(pid, libc::SIGTERM);
        }
    }

    /// Stops the child: SIGTERM to its group and to whatever carries its token, up to
    /// `grace` for them to exit (cut short by a forced stop), then SIGKILL. A shell that
    /// exits at once leaves its server the rest of the grace. Returns the child's exit
    /// status, and whether it had to be killed.
    pub async fn stop(&mut self, grace: Duration, shutdown: &Shutdown) -> Option<(ExitStatus, bool)> {
        let mut child = self.child.take()?;
        let deadline = tokio::time::Instant::now() + grace;
        self.signal_all(libc::SIGTERM);
        let waited = tokio::select! {
            r = tokio::time::timeout(grace, child.wait()) => r.ok().and_then(|r| r.ok()),
            _ = shutdown.forced() => None,
        };
        if let Some(status) = waited {
            // What the child started (a shell's server) may still be stopping: it gets
            // what is left of the grace, then anything left goes too (and the stop
            // counts as a kill).
            let gone = tokio::select! {
                g = self.gone_within(deadline.saturating_duration_since(tokio::time::Instant::now())) => g,
                _ = shutdown.forced() => false,
            };
            self.signal_all(libc::SIGKILL);
            tokio::select! {
                () = self.forget_once_gone(GROUP_EXIT) => {}
                _ = shutdown.forced() => {}
            }
            return Some((status, !gone));
        }
        self.signal_all(libc::SIGKILL);
        let _ = child.start_kill();
        let r = child.wait().await.ok().map(|s| (s, true));
        // A forced stop does not wait: what is left stays the supervisor's.
        tokio::select! {
            () = self.forget_once_gone(GROUP_EXIT) => {}
            _ = shutdown.forced() => {}
        }
        r
    }

    /// The live processes that are provably the child's: its group's, and any that left
    /// the group (`setsid`) but carry its token.
    fn members(&self) -> Vec<u32> {
        match &self.entry {
            Some(supervisor::Entry::Group { start_ticks, token, .. }) => {
                procfs::live_group_members(*start_ticks, token.as_deref())
            }
            _ => Vec::new(),
        }
    }

    /// Sends `sig` to the child's group and to every member that left it.
    fn signal_all(&self, sig: i32) {
        if let Some(pid) = self.pid {
            signal_group(pid, sig);
        }
        for p in self.members() {
            signal(p, sig);
        }
    }

    /// Waits until none of the child's processes lives, at most `limit`; whether they
    /// are gone.
    async fn gone_within(&self, limit: Duration) -> bool {
        let mut wait = crate::shutdown::Poll::unstoppable(Duration::from_millis(20), limit);
        while !self.members().is_empty() {
            if wait.next().await.is_err() {
                return false;
            }
        }
        true
    }

    /// Waits until no process of the child's lives, at most `limit`, then forgets the
    /// group. A killed process is not gone at once: a shell's server outlives the shell
    /// by the time it takes to die, and a CUDA process releases its GPU memory on the way
    /// out, which the next cell must not share. A group still alive after that stays
    /// registered, so the supervisor stops it when the harness ends.
    async fn forget_once_gone(&mut self, limit: Duration) {
        if self.gone_within(limit).await {
            self.forget();
        }
    }
}

/// How long a killed group may take to be gone before [`OwnedChild::stop`] returns.
pub const GROUP_EXIT: Duration = Duration::from_secs(10);

impl Drop for OwnedChild {
    fn drop(&mut self) {
        if self.child.is_some()
            && let Some(pid) = self.pid
        {
            signal_group(pid, libc::SIGKILL);
        }
        self.forget();
    }
}

/// The last line of a log that reads as an error (the workload prints one).
pub fn last_error_line(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .rev()
        .find(|l| l.starts_with("gpushare-workload:") || l.contains("ERROR") || l.contains("panicked"))
        .map(|l| l.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Live (not zombie) processes of a group; killed orphans may stay zombies where
    /// PID 1 does not reap, and kill(2) still "finds" those.
    fn live_in_group(pgid: u32) -> usize {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
            .filter(|stat| {
                stat.rsplit_once(')').is_some_and(|(_, rest)| {
                    let f: Vec<&str> = rest.split_whitespace().collect();
                    f.first() != Some(&"Z") && f.get(2) == Some(&pgid.to_string().as_str())
                })
            })
            .count()
    }

    #[tokio::test]
    async fn stop_ends_the_whole_group_and_drop_kills_it() {
        // A shell that ignores SIGTERM and starts a grandchild: both must go.
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg("trap '' TERM; sleep 60 & wait");
        let mut c = OwnedChild::spawn(&mut cmd, "test shell").expect("spawn");
        let pid = c.id().expect("pid");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let t = std::time::Instant::now();
        let (_, killed) = c
            .stop(Duration::from_millis(300), &Shutdown::new())
            .await
            .expect("status");
        assert!(killed, "it ignored SIGTERM, so it was killed");
        assert!(t.elapsed() < Duration::from_secs(3));
        // stop returns once the group is gone, not when it was sent SIGKILL.
        assert_eq!(live_in_group(pid), 0, "no process of the group is left");

        let mut cmd = Command::new("sleep");
        cmd.arg("60");
        let c = OwnedChild::spawn(&mut cmd, "sleep").expect("spawn");
        let pid = c.id().expect("pid");
        drop(c);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let zombie_or_gone = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with('Z')))
            .unwrap_or(true);
        assert!(zombie_or_gone, "drop kills the child");
    }

    #[tokio::test]
    async fn a_server_under_a_shell_gets_its_grace_and_one_that_left_the_group_is_stopped() {
        let dir = tempfile::tempdir().expect("tmp");
        let done = dir.path().join("stopped-cleanly");
        // The outer shell dies of SIGTERM at once; the server under it needs 0.5 s to
        // stop, and a helper has left the group with setsid.
        let ready = dir.path().join("trap-set");
        let server = format!(
            "trap 'sleep 0.5; touch {}; exit 0' TERM; touch {}; while true; do sleep 0.05; done",
            done.display(),
            ready.display()
        );
        let script = format!("setsid sleep 60 & sh -c \"{server}\"; true");
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(&script);
        let mut c = OwnedChild::spawn(&mut cmd, "shell and server").expect("spawn");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        // Stop only once the server's trap is set and the helper has left the group.
        let leader = c.id().expect("pid");
        let started = |m: &[u32]| {
            ready.exists()
                && m.len() >= 3
                && m.iter()
                    .any(|&p| p != leader && procfs::stat(p).is_some_and(|s| s.pgrp == p))
        };
        while !started(&c.members()) {
            assert!(std::time::Instant::now() < deadline, "{:?}", c.members());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let members = c.members();
        let (_, killed) = c.stop(Duration::from_secs(5), &Shutdown::new()).await.expect("status");
        assert!(!killed, "the shell exited on SIGTERM");
        assert!(done.exists(), "the server was killed before its 0.5 s stop");
        for p in members {
            assert!(!procfs::is_live(p), "{p} outlived stop");
        }
    }

    #[tokio::test]
    async fn a_group_is_forgotten_only_once_it_is_gone() {
        // A member that outlives the call to stop (as a CUDA server does while it
        // releases the GPU): the wait ends when it ends.
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg("sleep 0.4 & wait");
        let mut c = OwnedChild::spawn(&mut cmd, "short group").expect("spawn");
        let pid = c.id().expect("pid");
        let t = std::time::Instant::now();
        c.forget_once_gone(Duration::from_secs(5)).await;
        assert!(t.elapsed() >= Duration::from_millis(300), "{:?}", t.elapsed());
        assert_eq!(live_in_group(pid), 0);
        assert!(c.entry.is_none(), "gone, so no longer the supervisor's");

        // One that does not end in time stays registered, for the supervisor.
        let mut cmd = Command::new("sleep");
        cmd.arg("60");
        let mut c = OwnedChild::spawn(&mut cmd, "long group").expect("spawn");
        // The kernel shows a new program's environment a moment after exec returned.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while c.members().is_empty() {
            assert!(std::time::Instant::now() < deadline, "the sleep never showed its token");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let t = std::time::Instant::now();
        c.forget_once_gone(Duration::from_millis(200)).await;
        assert!(t.elapsed() < Duration::from_secs(2));
        assert!(c.entry.is_some(), "still alive, so still registered");
    }

    #[test]
    fn which_finds_sh_and_falls_back() {
        assert!(which("sh", &[]).is_some());
        assert_eq!(
            which("no-such-binary-xyz", &["/bin/sh"]),
            Some(PathBuf::from("/bin/sh"))
        );
        assert_eq!(which("no-such-binary-xyz", &["/nope"]), None);
    }
}
