//! A hostile pass over every file a run directory holds, in the spirit of a fuzzer:
//! seeded mutations of committed runs' files (bytes flipped, lines cut, duplicated or
//! dropped, numbers made huge, negative, fractional or not numbers, deep nesting) are
//! read by the same code `verify`, `report` and `compare` run. Each must come back with
//! a result or an error, never a panic, within a bounded time. The seed is printed with
//! any failure, so a finding replays.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpushare_bench::client::SplitMix;
use gpushare_bench::report::{RunData, render, verify::verify_dir};

/// Mutations per file kind: enough to reach every reader's error paths several times.
const ROUNDS: u64 = 60;
/// The longest any one mutated run may take to read, verify and render.
const LIMIT: Duration = Duration::from_secs(20);

fn committed(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../results").join(name)
}

fn copy_run(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("dir");
    for e in std::fs::read_dir(from).expect("run") {
        let e = e.expect("entry");
        if e.file_type().expect("type").is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
        }
    }
}

/// Numbers a hostile file puts where a number belongs.
const HOSTILE_NUMBERS: [&str; 9] = [
    "1e20",
    "1e308",
    "-1",
    "-0.5",
    "0.5",
    "18446744073709551616",
    "1000000000",
    "NaN",
    "\"x\"",
];

/// One seeded mutation of `text`.
fn mutate(text: &str, rng: &mut SplitMix) -> Vec<u8> {
    let mut bytes = text.as_bytes().to_vec();
    let lines: Vec<&str> = text.lines().collect();
    let pick = |rng: &mut SplitMix, n: usize| (rng.next_u64() % n.max(1) as u64) as usize;
    match rng.next_u64() % 7 {
        // A number replaced by a hostile one.
        0 | 1 => {
            let starts: Vec<usize> = (1..bytes.len())
                .filter(|&i| bytes[i].is_ascii_digit() && matches!(bytes[i - 1], b':' | b'[' | b','))
                .collect();
            if let Some(&at) = starts.get(pick(rng, starts.len())) {
                let end = (at..bytes.len())
                    .find(|&i| !(bytes[i].is_ascii_digit() || matches!(bytes[i], b'.' | b'e' | b'E' | b'-' | b'+')))
                    .unwrap_or(bytes.len());
                let with = HOSTILE_NUMBERS[pick(rng, HOSTILE_NUMBERS.len())];
                bytes.splice(at..end, with.bytes());
            }
        }
        // A byte flipped.
        2 => {
            let at = pick(rng, bytes.len());
            if let Some(b) = bytes.get_mut(at) {
                *b ^= 1 << (rng.next_u64() % 8);
            }
        }
        // Cut short.
        3 => bytes.truncate(pick(rng, bytes.len())),
        // A line twice, or a line dropped.
        4 | 5 => {
            if !lines.is_empty() {
                let i = pick(rng, lines.len());
                let mut out: Vec<&str> = lines.clone();
                if rng.next_u64().is_multiple_of(2) {
                    out.insert(i, lines[i]);
                } else {
                    out.remove(i);
                }
                bytes = (out.join("\n") + "\n").into_bytes();
            }
        }
        // Deep nesting where a value belongs.
        _ => {
            let deep = "[".repeat(100_000);
            let at = pick(rng, bytes.len());
            bytes.splice(at..at, deep.bytes());
        }
    }
    bytes
}

/// Reads, verifies and renders the run in `dir` on a thread of its own: Err with what
/// went wrong when it panicked or outlasted [`LIMIT`].
fn read_all(dir: &Path) -> Result<(), String> {
    let dir = dir.to_path_buf();
    let handle = std::thread::Builder::new()
        .stack_size(8 << 20)
        .spawn(move || {
            let _ = verify_dir(&dir);
            if let Ok(data) = RunData::load(&dir) {
                let _ = render(&data);
            }
        })
        .expect("thread");
    let start = Instant::now();
    while !handle.is_finished() {
        if start.elapsed() > LIMIT {
            return Err(format!("still reading after {LIMIT:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    handle.join().map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic".into())
    })
}

#[test]
fn mutated_run_files_give_an_answer_or_an_error_never_a_panic_or_a_hang() {
    let runs = [
        (
            "20261127-h200-sweep-raw",
            [
                "windows.jsonl",
                "cells.jsonl",
                "run.json",
                "bucket-layouts.json",
                "cells.csv",
            ],
        ),
        (
            "20261128-h100-llm-itl-ours",
            [
                "requests.jsonl",
                "windows.jsonl",
                "cells.jsonl",
                "run.json",
                "bucket-layouts.json",
            ],
        ),
    ];
    let mut findings = Vec::new();
    for (run, files) in runs {
        for (k, file) in files.iter().enumerate() {
            let text = std::fs::read_to_string(committed(run).join(file)).expect("committed file");
            for round in 0..ROUNDS {
                let seed = (k as u64) << 32 | round;
                let mut rng = SplitMix::new(seed);
                let tmp = tempfile::tempdir().expect("tempdir");
                let dir = tmp.path().join("run");
                copy_run(&committed(run), &dir);
                std::fs::write(dir.join(file), mutate(&text, &mut rng)).expect("write");
                if let Err(why) = read_all(&dir) {
                    findings.push(format!("{run}/{file}, seed {seed}: {why}"));
                }
            }
        }
    }
    assert!(findings.is_empty(), "{findings:#?}");
}
