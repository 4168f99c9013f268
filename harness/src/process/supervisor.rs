//! Nothing the harness starts outlives it, even when it is killed with SIGKILL.
//!
//! Three layers, each sufficient for its case:
//! 1. Children are started with `PR_SET_PDEATHSIG = SIGKILL` ([`super::OwnedChild`]):
//!    the kernel kills a pod or Prometheus the moment the harness dies.
//! 2. A supervisor: the harness binary in its hidden `reap` mode, in a session of its own
//!    (a terminal's Ctrl-C and hang-up do not reach it), reading what to watch on a pipe.
//!    Every process group and MPS pipe directory is [`register`]ed with it while it
//!    lives. When the pipe closes without `done` (the harness died, by any signal), it
//!    stops everything still registered: this catches MPS daemons, which daemonise and so
//!    are nobody's child, and grandchildren.
//! 3. A journal in the run directory (`processes.json`) with the same entries and each
//!    group leader's start time; `--resume` reads it and stops what a dead harness and
//!    supervisor left. A process counts as ours only if its environment carries the
//!    group's random token (groups), or names the run's private MPS pipe directory.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::procfs;

/// Something the harness started that must not outlive it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Entry {
    /// A process group we created (a pod, a Prometheus server): its leader's pid and
    /// start time; ours only while a leader with exactly that start time lives.
    Group {
        /// The group id (the leader's pid).
        pgid: u32,
        /// The leader's start time, clock ticks after boot.
        start_ticks: u64,
        /// What it is, for messages.
        what: String,
        /// The value of `GPUSHARE_GROUP` in the group's environment: random, and what
        /// proves a process ours (a pid and a start time anyone can read).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<String>,
    },
    /// Processes whose environment holds `key=value` (an MPS daemon and its servers,
    /// found by their private pipe directory).
    Env {
        /// Variable name.
        key: String,
        /// Its value.
        value: String,
        /// What it is, for messages.
        what: String,
    },
}

impl Entry {
    /// Live processes this entry provably owns.
    pub fn live(&self) -> Vec<u32> {
        match self {
            Entry::Group { start_ticks, token, .. } => procfs::live_group_members(*start_ticks, token.as_deref()),
            Entry::Env { key, value, .. } => procfs::live_with_env(key, value),
        }
    }

    fn what(&self) -> &str {
        match self {
            Entry::Group { what, .. } | Entry::Env { what, .. } => what,
        }
    }
}

/// Where a journal was written: this boot of this machine, and the run directory's
/// device and inode. A process is provably the run's only where the journal that names
/// it was written for this very directory on this boot: a copy of a run (`cp -a`, even
/// to the same path) is another inode, so its journal proves nothing here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Writer {
    /// `/proc/sys/kernel/random/boot_id` when written.
    pub boot_id: String,
    /// The run directory's device.
    pub dev: u64,
    /// The run directory's inode.
    pub ino: u64,
}

impl Writer {
    /// The writer a journal in `run_dir` has now (None: the directory or the boot id
    /// cannot be read).
    pub fn of(run_dir: &Path) -> Option<Self> {
        use std::os::unix::fs::MetadataExt;
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let m = std::fs::metadata(run_dir).ok()?;
        Some(Self {
            boot_id: boot_id.trim().to_string(),
            dev: m.dev(),
            ino: m.ino(),
        })
    }
}

/// `processes.json`: who wrote it, and what it watches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournalFile {
    /// Where it was written (None: unknown, nothing in it is provably ours).
    pub writer: Option<Writer>,
    /// The processes and daemons watched.
    pub entries: Vec<Entry>,
}

/// What a run's journal leaves to stop: its entries when they are provably this run
/// directory's, else none and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Left {
    /// Entries to stop.
    pub entries: Vec<Entry>,
    /// Why entries were not taken as ours (a copied run, another boot, an old journal).
    pub foreign: Option<&'static str>,
}

#[derive(Debug, Default)]
struct Registry {
    entries: Vec<Entry>,
    supervisor: Option<ChildStdin>,
    journal: Option<PathBuf>,
    writer: Option<Writer>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    entries: Vec::new(),
    supervisor: None,
    journal: None,
    writer: None,
});

/// The journal file of a run directory.
pub fn journal_path(run_dir: &Path) -> PathBuf {
    run_dir.join("processes.json")
}

fn with_registry(f: impl FnOnce(&mut Registry)) {
    match REGISTRY.lock() {
        Ok(mut r) => f(&mut r),
        Err(poisoned) => f(&mut poisoned.into_inner()),
    }
}

fn tell(r: &mut Registry, line: &str) {
    if let Some(pipe) = r.supervisor.as_mut()
        && pipe.write_all(format!("{line}\n").as_bytes()).is_err()
    {
        tracing::warn!("the process supervisor is gone; children are still killed with the harness (PDEATHSIG)");
        r.supervisor = None;
    }
}

/// Writes the journal atomically (a reader never sees half a file), readable by its
/// owner alone: its tokens are what proves a process the run's.
pub fn write_journal_file(path: &Path, journal: &JournalFile) -> bool {
    serde_json::to_vec_pretty(journal)
        .ok()
        .is_some_and(|bytes| crate::files::write_atomic_mode(path, &bytes, 0o600).is_ok())
}

fn write_journal(r: &Registry) {
    if let Some(path) = &r.journal {
        let journal = JournalFile {
            writer: r.writer.clone(),
            entries: r.entries.clone(),
        };
        if !write_journal_file(path, &journal) {
            tracing::warn!("cannot write {}", path.display());
        }
    }
}

/// Watches `entry` until [`unregister`]: the supervisor and the journal learn it.
pub fn register(entry: Entry) {
    with_registry(|r| {
        if let Ok(json) = serde_json::to_string(&entry) {
            tell(r, &format!("+{json}"));
        }
        r.entries.push(entry);
        write_journal(r);
    });
}

/// Stops watching `entry` (it was stopped cleanly).
pub fn unregister(entry: &Entry) {
    with_registry(|r| {
        if let Some(i) = r.entries.iter().position(|e| e == entry) {
            r.entries.remove(i);
            if let Ok(json) = serde_json::to_string(entry) {
                tell(r, &format!("-{json}"));
            }
            write_journal(r);
        }
    });
}

/// Keeps the journal in `run_dir` from now on (after any left-overs were cleaned up), and
/// tells the supervisor which run to mark `interrupted` if the harness dies.
pub fn journal_to(run_dir: &Path) {
    with_registry(|r| {
        r.journal = Some(journal_path(run_dir));
        r.writer = Writer::of(run_dir);
        if let Ok(json) = serde_json::to_string(&run_dir.to_string_lossy()) {
            tell(r, &format!("run{json}"));
        }
        write_journal(r);
    });
}

/// Stops keeping the journal (the run is over; its directory is about to be unlocked).
pub fn detach_journal() {
    with_registry(|r| {
        write_journal(r);
        r.journal = None;
    });
}

/// Starts the supervisor (the harness binary in `reap` mode). Without one, children
/// still die with the harness through PDEATHSIG; MPS daemons would be left to `--resume`.
pub fn start() -> std::io::Result<()> {
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.arg("reap")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    // SAFETY: setsid(2) is async-signal-safe; the child gets a session of its own so a
    // terminal's signals to the harness's process group do not reach it.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let stdin = child.stdin.take();
    // The supervisor reaps itself when it exits; it is not waited for.
    std::mem::forget(child);
    with_registry(|r| r.supervisor = stdin);
    Ok(())
}

/// Tells the supervisor the harness is ending cleanly (call after everything stopped).
pub fn done() {
    with_registry(|r| {
        tell(r, "done");
        r.supervisor = None;
        r.entries.clear();
        write_journal(r);
    });
}

/// Stops what `entries` still own: SIGTERM, up to `grace` to exit, then SIGKILL.
/// Returns a description of each entry that had live processes.
pub fn clean_up(entries: &[Entry], grace: Duration) -> Vec<String> {
    let mut stopped = Vec::new();
    let mut victims: Vec<u32> = Vec::new();
    for e in entries {
        let live = e.live();
        if !live.is_empty() {
            stopped.push(format!("{} (pids {live:?})", e.what()));
            victims.extend(live);
        }
    }
    for &p in &victims {
        super::signal(p, libc::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    while victims.iter().any(|&p| procfs::is_live(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    for &p in victims.iter().filter(|&&p| procfs::is_live(p)) {
        super::signal(p, libc::SIGKILL);
    }
    stopped
}

/// Reads a run's journal (missing: nothing was left). Its entries count only when it
/// was written for this directory on this boot ([`Writer`]).
pub fn read_journal(run_dir: &Path) -> Result<Left, String> {
    let path = journal_path(run_dir);
    let text = match crate::files::read_text(&path, crate::files::limits::RECORD) {
        Ok(text) => text,
        Err(crate::files::ReadError::Missing) => {
            return Ok(Left {
                entries: Vec::new(),
                foreign: None,
            });
        }
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let none = |why| Left {
        entries: Vec::new(),
        foreign: Some(why),
    };
    let here = Writer::of(run_dir);
    match serde_json::from_str::<JournalFile>(&text) {
        Ok(JournalFile {
            writer: Some(w),
            entries,
        }) if Some(&w) == here.as_ref() => Ok(Left { entries, foreign: None }),
        // Nothing watched: nothing to prove.
        Ok(JournalFile { entries, .. }) if entries.is_empty() => Ok(Left { entries, foreign: None }),
        Ok(JournalFile { writer: Some(w), .. }) if here.as_ref().is_some_and(|h| h.boot_id == w.boot_id) => Ok(none(
            "its process journal was written for another directory (a copy of a run?): nothing of it was stopped",
        )),
        Ok(_) => Ok(none(
            "its process journal was written before a reboot or on another machine: nothing of it was stopped",
        )),
        // A bare list (an older build's) says neither machine nor directory.
        Err(_) if serde_json::from_str::<Vec<Entry>>(&text).is_ok() => Ok(none(
            "its process journal, an older build's, says not where it was written: nothing of it was stopped",
        )),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// The supervisor's loop (`gpushare-bench reap`): follow the entries on stdin; on `done`
/// exit quietly; on end of input (the harness died) stop what is left.
pub fn reap_main(input: impl BufRead) -> i32 {
    let mut entries: Vec<Entry> = Vec::new();
    let mut run_dir: Option<PathBuf> = None;
    for line in input.lines() {
        let Ok(line) = line else { break };
        if line == "done" {
            return 0;
        }
        if let Some(json) = line.strip_prefix("run") {
            run_dir = serde_json::from_str::<String>(json).ok().map(PathBuf::from);
            continue;
        }
        let (op, json) = line.split_at(line.len().min(1));
        let Ok(entry) = serde_json::from_str::<Entry>(json) else {
            continue;
        };
        match op {
            "+" => entries.push(entry),
            "-" => entries.retain(|e| *e != entry),
            _ => {}
        }
    }
    let stopped = clean_up(&entries, Duration::from_secs(3));
    if !stopped.is_empty() {
        crate::errln!(
            "gpushare-bench: the harness died; its supervisor stopped {}",
            stopped.join(", ")
        );
    }
    if let Some(dir) = run_dir {
        mark_interrupted(&dir);
    }
    0
}

/// Marks a run whose harness died `interrupted` (it still says `running`), so reports and
/// `compare` see a partial run; `--resume` continues it. Only `state` and `finished_at`
/// change; a run.json that does not parse is left as it is.
fn mark_interrupted(run_dir: &Path) {
    let path = run_dir.join("run.json");
    let Ok(text) = crate::files::read_text(&path, crate::files::limits::RECORD) else {
        return;
    };
    // Plain JSON, not the record type: this module sits below `results`.
    let Ok(serde_json::Value::Object(mut run)) = serde_json::from_str::<serde_json::Value>(&text) else {
        return;
    };
    if run.get("state").and_then(serde_json::Value::as_str) != Some("running") {
        return;
    }
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    run.insert("state".into(), "interrupted".into());
    run.insert("finished_at".into(), now.into());
    if let Ok(bytes) = serde_json::to_vec_pretty(&run) {
        let _ = crate::files::write_atomic(&path, &bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_journal_proves_processes_only_in_the_directory_it_was_written_for() {
        use std::os::unix::fs::PermissionsExt;
        let (a, b) = (tempfile::tempdir().expect("a"), tempfile::tempdir().expect("b"));
        let entry = Entry::Group {
            pgid: 1,
            start_ticks: 1,
            what: "pod-0".into(),
            token: Some("t".into()),
        };
        let journal = JournalFile {
            writer: Writer::of(a.path()),
            entries: vec![entry.clone()],
        };
        assert!(write_journal_file(&journal_path(a.path()), &journal));
        let mode = std::fs::metadata(journal_path(a.path()))
            .expect("journal")
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "readable by its owner alone: {mode:o}");
        assert_eq!(read_journal(a.path()).expect("read").entries, [entry]);
        // A copy of the run (its journal with it): nothing of it is ours here.
        std::fs::copy(journal_path(a.path()), journal_path(b.path())).expect("copy");
        let left = read_journal(b.path()).expect("read");
        assert!(left.entries.is_empty());
        assert!(
            left.foreign.is_some_and(|w| w.contains("another directory")),
            "{left:?}"
        );
        // An older build's bare list proves nothing either.
        std::fs::write(
            journal_path(b.path()),
            serde_json::to_vec(&journal.entries).expect("json"),
        )
        .expect("write");
        let left = read_journal(b.path()).expect("read");
        assert!(left.entries.is_empty() && left.foreign.is_some_and(|w| w.contains("older build")));
    }

    /// A process in a group of its own, carrying `token` as the harness's children do.
    fn leader(token: &str) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        Command::new("sleep")
            .arg("60")
            .env(procfs::GROUP_TOKEN, token)
            .process_group(0)
            .spawn()
            .expect("sleep")
    }

    fn line(op: char, e: &Entry) -> String {
        format!("{op}{}\n", serde_json::to_string(e).expect("json"))
    }

    fn wait_until(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn the_supervisor_stops_what_is_registered_when_its_input_ends() {
        use std::os::unix::process::ExitStatusExt;
        let token = format!("t1.{}", std::process::id());
        let mut child = leader(&token);
        let pid = child.id();
        let start = procfs::stat(pid).expect("stat").start_ticks;
        let group = |start_ticks: u64, token: Option<&str>| Entry::Group {
            pgid: pid,
            start_ticks,
            what: "pod-0".into(),
            token: token.map(String::from),
        };
        // The kernel shows a new program's environment a moment after exec returned.
        wait_until("the leader never showed its token", || {
            group(start, Some(&token)).live() == vec![pid]
        });
        assert!(
            group(start + 1_000_000, Some(&token)).live().is_empty(),
            "a process that started before the record is not ours"
        );
        assert!(
            group(start, None).live().is_empty(),
            "the pid and start time anyone can read prove nothing"
        );
        let stale = group(start, Some("another"));
        let input = line('+', &group(start, Some(&token))) + &line('+', &stale) + &line('-', &stale);
        reap_main(input.as_bytes());
        let status = child.wait().expect("wait");
        assert_eq!(status.signal(), Some(libc::SIGTERM), "stopped by the supervisor");

        let mut other = leader(&token);
        let g = group(0, Some(&token));
        reap_main((line('+', &g) + "done\n").as_bytes());
        assert!(procfs::is_live(other.id()), "after done the supervisor stops nothing");
        let _ = other.kill();
        let _ = other.wait();
    }

    #[test]
    fn a_process_that_is_not_ours_survives_a_journal_that_names_it() {
        use std::os::unix::process::CommandExt;
        // A user's own process, in a session of its own, with no token of ours.
        let mut foreign = Command::new("sleep").arg("60").process_group(0).spawn().expect("sleep");
        let pid = foreign.id();
        let start = procfs::stat(pid).expect("stat").start_ticks;
        let forged =
            [None, Some(String::new()), Some(format!("{}.0.0", std::process::id()))].map(|token| Entry::Group {
                pgid: pid,
                start_ticks: start,
                what: "fake".into(),
                token,
            });
        let stopped = clean_up(&forged, Duration::from_millis(100));
        assert!(stopped.is_empty(), "{stopped:?}");
        assert!(
            procfs::is_live(pid),
            "a journal's pid and start time stopped a process not ours"
        );
        let _ = foreign.kill();
        let _ = foreign.wait();
    }

    #[test]
    fn a_shells_children_are_ours_by_their_token_even_out_of_the_group() {
        use std::os::unix::process::CommandExt;
        let token = format!("t2.{}", std::process::id());
        // The second sleep leaves the group (and the session) with setsid.
        let mut sh = Command::new("sh")
            .args(["-c", "sleep 60 & setsid sleep 61 & wait"])
            .env(procfs::GROUP_TOKEN, &token)
            .process_group(0)
            .spawn()
            .expect("sh");
        let pgid = sh.id();
        let start = procfs::stat(pgid).expect("stat").start_ticks;
        let entry = |token: Option<&str>| Entry::Group {
            pgid,
            start_ticks: start,
            what: "pod-0".into(),
            token: token.map(String::from),
        };
        // Both sleeps are running and the second has left the group: before that, a forked
        // shell or `setsid` still starting up would be counted in the group.
        wait_until("sh never started both sleeps", || {
            let live = entry(Some(&token)).live();
            live.len() == 3
                && live.iter().any(|&p| procfs::stat(p).is_some_and(|s| s.pgrp != pgid))
                && live.iter().all(|&p| {
                    p == pgid || std::fs::read(format!("/proc/{p}/comm")).is_ok_and(|c| c.starts_with(b"sleep"))
                })
        });
        // The shell dies as it would with the harness (PDEATHSIG): its sleeps live on.
        let _ = sh.kill();
        let _ = sh.wait();
        assert!(
            entry(None).live().is_empty(),
            "without a token nothing is provably ours"
        );
        assert!(
            entry(Some("another")).live().is_empty(),
            "another token is another group"
        );
        let left = entry(Some(&token)).live();
        assert_eq!(left.len(), 2, "both sleeps, by their token: {left:?}");
        assert!(
            left.iter().any(|&p| procfs::stat(p).is_some_and(|s| s.pgrp != pgid)),
            "the one that left the group is found too"
        );
        reap_main(line('+', &entry(Some(&token))).as_bytes());
        wait_until("the supervisor left a sleep running", || {
            left.iter().all(|&p| !procfs::is_live(p))
        });
    }
}
