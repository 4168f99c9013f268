//! What `/proc` says about a process: its state, process group and start time (clock
//! ticks after boot, which with the pid identifies a process for good), and which live
//! processes carry a given environment entry. Linux only, read only.

/// A process as `/proc/PID/stat` describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// State letter: R, S, D, Z, T, ...
    pub state: char,
    /// Parent pid.
    pub ppid: u32,
    /// Process group.
    pub pgrp: u32,
    /// Start time after boot, clock ticks.
    pub start_ticks: u64,
}

/// Parses the text of `/proc/PID/stat` (pure). The command name (field 2) may hold
/// spaces and parentheses, so fields are counted after the last ')'.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let (_, rest) = text.rsplit_once(')')?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) pgrp(5) session(6) ... starttime(22).
    Some(ProcStat {
        state: f.first()?.chars().next()?,
        ppid: f.get(1)?.parse().ok()?,
        pgrp: f.get(2)?.parse().ok()?,
        start_ticks: f.get(19)?.parse().ok()?,
    })
}

/// The stat of a live process (None when it is gone).
pub fn stat(pid: u32) -> Option<ProcStat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Whether `pid` runs (exists and is not a zombie).
pub fn is_live(pid: u32) -> bool {
    stat(pid).is_some_and(|s| s.state != 'Z')
}

fn pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
}

/// The variable every process group the harness starts carries in its environment,
/// with a value of its own (`OwnedChild::spawn`).
pub const GROUP_TOKEN: &str = "GPUSHARE_GROUP";

/// Live processes of a group the harness started at `start` (clock ticks after boot)
/// with `GPUSHARE_GROUP=token` in its environment: every process (not this one) that
/// carries the token and started no earlier, in the group or out of it (a child that
/// called `setsid` is still found). A pid, a group id and a start time can all be read
/// from /proc and written into a journal, so they prove nothing; a group recorded
/// without a token owns nothing.
pub fn live_group_members(start: u64, token: Option<&str>) -> Vec<u32> {
    let Some(t) = token.filter(|t| !t.is_empty()) else {
        return Vec::new();
    };
    let me = std::process::id();
    let needle = format!("{GROUP_TOKEN}={t}");
    pids()
        .filter(|&p| p != me)
        .filter(|&p| stat(p).is_some_and(|s| s.state != 'Z' && s.start_ticks >= start))
        .filter(|&p| has_env(p, &needle))
        .collect()
}

/// Whether the environment `pid` started with holds `key=value` exactly.
fn has_env(pid: u32, needle: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .is_ok_and(|env| env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()))
}

/// Live processes (not this one) whose environment holds `key=value` exactly.
pub fn live_with_env(key: &str, value: &str) -> Vec<u32> {
    let needle = format!("{key}={value}");
    let me = std::process::id();
    pids()
        .filter(|&p| p != me)
        .filter(|&p| has_env(p, &needle))
        .filter(|&p| is_live(p))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_survive_odd_names() {
        let text = "4242 (a (weird) name) S 17 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        let s = parse_stat(text).expect("parses");
        assert_eq!((s.state, s.ppid, s.pgrp, s.start_ticks), ('S', 17, 4242, 987654));
        assert_eq!(parse_stat("garbage"), None);
        let me = stat(std::process::id()).expect("this process");
        assert!(me.start_ticks > 0 && me.state != 'Z');
    }
}
