//! The long soak (`make soak`, not in CI: about 20 minutes): 100 sweeps of
//! 2 cells on the CPU, each hit by a random signal (SIGINT, SIGTERM, SIGHUP or SIGKILL)
//! at a random moment, then resumed. After each: no process of ours left, and every cell
//! on disk exactly once. The seed is printed so a failure can be replayed
//! (`GPUSHARE_SOAK_SEED=N`); `GPUSHARE_SOAK_RUNS` changes the count.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpushare_bench::results::store::read_cells;

mod common;

const BENCH: &str = env!("CARGO_BIN_EXE_gpushare-bench");

/// xorshift64*: a small seeded generator, so a run can be replayed from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The environment entry every process of this soak inherits (harness, supervisor, pods),
/// so leftovers are found exactly, whatever else runs on the machine.
const TAG: &str = "GPUSHARE_SOAK_TAG";

fn ours_alive(tag: &str) -> Vec<String> {
    gpushare_bench::process::procfs::live_with_env(TAG, tag)
        .into_iter()
        .map(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            format!("{pid} {}", comm.trim())
        })
        .collect()
}

fn sweep(out: &Path, tag: &str, args: &[&str]) -> Command {
    let mut c = Command::new(BENCH);
    c.env(TAG, tag);
    c.args([
        "sweep", "--device", "cpu", "--quiet", "--warmup", "1s", "--window", "1s",
    ])
    .args(["--max-cell", "3s", "--out"])
    .arg(out)
    .arg("--workload-bin")
    .arg(Path::new(BENCH).with_file_name("gpushare-workload"))
    .args(args)
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    c
}

#[test]
#[ignore = "long soak: make soak"]
fn a_hundred_sweeps_killed_at_random_leave_nothing_and_resume_exactly() {
    let runs: u64 = std::env::var("GPUSHARE_SOAK_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let seed: u64 = std::env::var("GPUSHARE_SOAK_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        });
    eprintln!("soak: {runs} runs, GPUSHARE_SOAK_SEED={seed}");
    let mut rng = Rng(seed);
    let out = tempfile::tempdir().expect("tmp");
    let signals = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGKILL];
    let tag = format!("{seed}-{}", std::process::id());
    for i in 0..runs {
        let id = format!("soak-{i}");
        let mut child = sweep(
            out.path(),
            &tag,
            &["--strategies", "time-slicing", "--pods", "1,2", "--run-id", &id],
        )
        .spawn()
        .expect("spawn");
        // A random moment across the whole run (start-up, readiness, warm-up, windows,
        // between cells, restore): a 2-cell run takes about 10 s.
        let at = Duration::from_millis(rng.below(11_000));
        let sig = signals[rng.below(signals.len() as u64) as usize];
        std::thread::sleep(at);
        // SAFETY: kill(2) on the harness this test started.
        unsafe { libc::kill(child.id() as i32, sig) };
        let _ = child.wait();
        let t = Instant::now();
        loop {
            let left = ours_alive(&tag);
            if left.is_empty() {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "run {i} (signal {sig} at {at:?}, seed {seed}): still running: {left:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        if out.path().join(&id).join("run.json").is_file() {
            let st = sweep(out.path(), &tag, &["--resume", &id]).status().expect("resume");
            assert!(
                st.success(),
                "run {i} (signal {sig} at {at:?}, seed {seed}): resume failed: {st}"
            );
            let cells = read_cells(&out.path().join(&id).join("cells.jsonl")).expect("cells");
            let aggs: Vec<u32> = cells.iter().filter(|c| c.is_aggregate()).map(|c| c.pods).collect();
            assert_eq!(
                aggs,
                vec![1, 2],
                "run {i} (signal {sig} at {at:?}, seed {seed}): cells {aggs:?}"
            );
            assert_eq!(cells.len(), 2 + 3, "run {i}: rows {}", cells.len());
        }
        // The supervisor exits right after its harness said goodbye: give it a moment.
        let t = Instant::now();
        while !ours_alive(&tag).is_empty() && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            ours_alive(&tag).is_empty(),
            "run {i}: left after resume: {:?}",
            ours_alive(&tag)
        );
    }
}
