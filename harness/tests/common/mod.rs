//! Helpers shared by the integration tests: the process tree under a pid.

#![allow(dead_code)] // each test binary uses a part

/// A live child process: pid and command name (at most 15 characters, as the kernel keeps it).
#[derive(Debug, Clone, PartialEq)]
pub struct Child {
    /// Process id.
    pub pid: u32,
    /// `comm`, e.g. "gpushare-worklo".
    pub name: String,
}

fn stat(pid: u32) -> Option<(String, char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name in field 2 may hold spaces and parentheses: split at the last ')'.
    let (head, rest) = stat.rsplit_once(')')?;
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    Some((head.split_once('(')?.1.to_string(), state, ppid))
}

/// Live (not zombie) children of `pid`.
pub fn children(pid: u32) -> Vec<Child> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Some((name, state, ppid)) = stat(p)
            && ppid == pid
            && state != 'Z'
        {
            out.push(Child { pid: p, name });
        }
    }
    out
}

/// Whether a process exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    stat(pid).is_some_and(|(_, state, _)| state != 'Z')
}
