//! The test node's cgroup: one directory of its own in every cgroup hierarchy of this
//! machine (v1's per-controller hierarchies, or v2's unified one), the kubelet's
//! `cgroupRoot`, under which the kubelet makes `kubepods` and runc each container's.
//! Removed, deepest first, once the node's processes are gone; one left by a test that
//! died (its process is gone) is removed by the next node that starts.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Every directory this machine mounts a cgroup hierarchy at.
fn hierarchies() -> Vec<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && (f[2] == "cgroup" || f[2] == "cgroup2")).then(|| PathBuf::from(f[1]))
        })
        .collect()
}

/// The prefix of every test node's cgroup name; the rest is the test process's pid and
/// a counter.
const PREFIX: &str = "gpushare-node-";

/// A node's cgroup in every hierarchy; removed when dropped.
#[derive(Debug)]
pub struct NodeCgroup {
    /// The name, `gpushare-node-PID-N` (the kubelet's `cgroupRoot` is `/NAME`).
    pub name: String,
}

impl NodeCgroup {
    /// Makes the cgroup in every hierarchy, after removing those of test processes that
    /// are gone.
    pub fn create() -> Result<Self, String> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        remove_stale();
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("{PREFIX}{}-{n}", std::process::id());
        let roots = hierarchies();
        if roots.is_empty() {
            return Err("no cgroup hierarchy is mounted: the kubelet needs cgroups".into());
        }
        for root in roots {
            let dir = root.join(&name);
            std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
            // cgroup v2: the kubelet's and runc's cgroups below need the controllers
            // handed down from ours (best effort: one the machine's root does not hand
            // to ours stays off; the machine's own cgroups are never changed).
            let control = dir.join("cgroup.subtree_control");
            if control.is_file() {
                for c in ["+cpu", "+cpuset", "+memory", "+pids", "+io", "+hugetlb"] {
                    let _ = std::fs::write(&control, c);
                }
            }
        }
        Ok(Self { name })
    }

    /// Removes the cgroup's directories, deepest first, retrying while the last
    /// processes leave (at most `limit`); Err names what stayed.
    pub fn remove(&self, limit: Duration) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let left: Vec<PathBuf> = hierarchies()
                .into_iter()
                .map(|r| r.join(&self.name))
                .filter(|d| remove_tree(d).is_err())
                .collect();
            if left.is_empty() {
                return Ok(());
            }
            if start.elapsed() > limit {
                return Err(format!("cgroups still in use: {left:?}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for NodeCgroup {
    fn drop(&mut self) {
        let _ = self.remove(Duration::from_secs(10));
    }
}

/// Removes `dir` and the cgroups under it, deepest first (a cgroup directory is removed
/// with rmdir once it holds no process and no child); Ok when nothing is left.
fn remove_tree(dir: &Path) -> std::io::Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = remove_tree(&e.path());
            }
        }
    }
    std::fs::remove_dir(dir)
}

/// Removes the node cgroups of test processes that no longer run.
fn remove_stale() {
    for root in hierarchies() {
        let Ok(entries) = std::fs::read_dir(&root) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(pid) = name
                .strip_prefix(PREFIX)
                .and_then(|rest| rest.split('-').next())
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = remove_tree(&e.path());
            }
        }
    }
}
