//! The real `gpushare-workload` binary, spawned on the CPU: it serves metrics, turns
//! ready, counts inferences, stops cleanly on SIGTERM/SIGINT, and answers bad input
//! with one line and the contract's exit code.

use std::io::BufRead;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_gpushare-workload");

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A plain HTTP/1.0 GET; `None` while nothing listens.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

struct Workload {
    child: Child,
    port: u16,
}

impl Workload {
    fn spawn(extra: &[&str]) -> Self {
        Self::spawn_model("tiny", extra)
    }

    fn spawn_model(model: &str, extra: &[&str]) -> Self {
        Self::spawn_as("test-pod-0", model, extra)
    }

    fn spawn_as(pod: &str, model: &str, extra: &[&str]) -> Self {
        let port = free_port();
        let child = Command::new(BIN)
            .args([
                "--model",
                model,
                "--device",
                "cpu",
                "--listen",
                &format!("127.0.0.1:{port}"),
            ])
            .args(extra)
            .env("GPUSHARE_POD", pod)
            .env("GPUSHARE_STRATEGY", "time-slicing")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the workload");
        Self { child, port }
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some((200, _)) = get(self.port, "/healthz") {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("workload exited early: {status}");
            }
            assert!(Instant::now() < deadline, "/healthz never turned 200");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Hands stderr to a reader thread that sends each line as it comes; the channel
    /// closes when the process exits. (`wait_exit` then returns an empty stderr.)
    fn stderr_lines(&mut self) -> mpsc::Receiver<String> {
        let (tx, rx) = mpsc::channel();
        let stderr = self.child.stderr.take().expect("stderr is piped");
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        rx
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }

    fn wait_exit(mut self, limit: Duration) -> (i32, String) {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                let mut err = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                return (status.code().unwrap_or(-1), err);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("workload did not exit within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Workload {
    /// A test that fails half-way leaves no workload running (a yolos-small one would
    /// keep a core busy for minutes).
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn serves_counts_and_stops_cleanly_on_sigterm() {
    let mut w = Workload::spawn(&[]);
    w.wait_ready();
    let (status, first) = get(w.port, "/metrics").expect("metrics");
    assert_eq!(status, 200);
    assert!(
        first.contains(r#"pod="test-pod-0""#) && first.contains(r#"strategy="time-slicing""#),
        "{first}"
    );
    assert!(
        first.contains(r#"model="tiny""#) && first.contains(r#"device="cpu""#),
        "{first}"
    );
    assert_eq!(metric(&first, "workload_ready"), Some(1.0));
    let c1 = metric(&first, "inference_time_seconds_count").expect("count");
    std::thread::sleep(Duration::from_millis(300));
    let (_, second) = get(w.port, "/metrics").expect("metrics");
    let c2 = metric(&second, "inference_time_seconds_count").expect("count");
    let sum = metric(&second, "inference_time_seconds_sum").expect("sum");
    assert!(c2 > c1, "histogram count did not grow: {c1} → {c2}");
    assert!(
        sum > 0.0 && sum / c2 < 1.0,
        "mean latency {} s is implausible for tiny",
        sum / c2
    );
    w.signal(libc::SIGTERM);
    let (code, _) = w.wait_exit(Duration::from_secs(5));
    assert_eq!(code, 0, "SIGTERM must end the workload with exit code 0");
}

#[test]
fn sigint_is_a_clean_stop_too_and_poisson_paces_requests() {
    let mut w = Workload::spawn(&["--load", "poisson:40"]);
    w.wait_ready();
    let (_, a) = get(w.port, "/metrics").expect("metrics");
    std::thread::sleep(Duration::from_millis(1500));
    let (_, b) = get(w.port, "/metrics").expect("metrics");
    let n = metric(&b, "inference_time_seconds_count").unwrap_or(0.0)
        - metric(&a, "inference_time_seconds_count").unwrap_or(0.0);
    // 40/s for 1.5 s: 60 expected; a closed loop would run thousands.
    assert!((25.0..=110.0).contains(&n), "{n} inferences in 1.5 s at 40/s");
    w.signal(libc::SIGINT);
    assert_eq!(w.wait_exit(Duration::from_secs(5)).0, 0);
}

#[test]
fn sigterm_stops_a_long_cpu_inference_within_a_second() {
    // yolos-small on the CPU: one forward pass (3401 tokens, ~360 GFLOP on one thread)
    // takes minutes in a test build, and the first warm-up inference starts right after
    // the "warming up" line. Before the fix the process ignored SIGTERM until the
    // inference ended (and then ran the next warm-up one).
    let mut w = Workload::spawn_model("yolos-small", &[]);
    let lines = w.stderr_lines();
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !seen.iter().any(|l: &String| l.contains("warming up")) {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => seen.push(line),
            Err(e) => panic!("no \"warming up\" line ({e}); stderr so far: {seen:?}"),
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    // Still in the first warm-up inference: not ready, and alive.
    assert_eq!(get(w.port, "/healthz").map(|(s, _)| s), Some(503), "{seen:?}");
    let sent = Instant::now();
    w.signal(libc::SIGTERM);
    let (code, _) = w.wait_exit(Duration::from_secs(3));
    let took = sent.elapsed();
    // The reader thread sees end of file once the process is gone.
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(2)) {
        seen.push(line);
    }
    assert_eq!(code, 0, "SIGTERM mid-inference must be a clean stop: {seen:?}");
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert!(!seen.iter().any(|l| l.contains("panicked")), "{seen:?}");
    // The CPU pass stops by itself between blocks of rows (milliseconds), without the
    // watchdog that ends the process one second after the signal.
    assert!(
        !seen.iter().any(|l| l.contains("gpushare-workload: stopped")),
        "the CPU forward pass ignored the stop flag: {seen:?}"
    );
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

#[test]
fn grow_memory_takes_and_touches_more_while_serving() {
    let mut w = Workload::spawn(&["--grow-memory", "300ms:96MiB"]);
    w.wait_ready();
    let before = rss_kib(w.child.id());
    let deadline = Instant::now() + Duration::from_secs(10);
    while rss_kib(w.child.id()) < before + 90 * 1024 {
        assert!(Instant::now() < deadline, "RSS stayed at {} KiB", rss_kib(w.child.id()));
        std::thread::sleep(Duration::from_millis(50));
    }
    // Still serving afterwards.
    let (status, _) = get(w.port, "/metrics").expect("metrics");
    assert_eq!(status, 200);
    w.signal(libc::SIGTERM);
    assert_eq!(w.wait_exit(Duration::from_secs(5)).0, 0);
}

/// Starts a workload with `args`, waits until it is ready and then until it dies of a
/// signal on its own within 10 s: the signal and its stderr.
fn dies_of_its_own_signal(args: &[&str]) -> (Option<i32>, String) {
    use std::os::unix::process::ExitStatusExt;
    let mut w = Workload::spawn(args);
    w.wait_ready();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = w.child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "{args:?}: still running after the event's time"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    if let Some(mut e) = w.child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    (status.signal(), err)
}

#[test]
fn an_injected_fault_on_the_cpu_aborts_the_process_and_says_so() {
    let (signal, err) = dies_of_its_own_signal(&["--inject-fault-after", "300ms"]);
    assert_eq!(signal, Some(libc::SIGABRT), "{err}");
    assert!(err.contains("injecting a fault"), "{err}");
    assert!(err.contains("the CPU stand-in for a GPU fault"), "{err}");
}

#[test]
fn crash_after_kills_the_process_with_sigkill_mid_load() {
    let (signal, err) = dies_of_its_own_signal(&["--crash-after", "300ms"]);
    assert_eq!(signal, Some(libc::SIGKILL), "{err}");
    assert!(
        err.contains("killing this process with SIGKILL (--crash-after)"),
        "{err}"
    );
}

#[test]
fn pods_draw_their_own_arrivals_and_export_the_seed() {
    let seed_of = |w: &mut Workload| {
        w.wait_ready();
        let (_, text) = get(w.port, "/metrics").expect("metrics");
        let line = text
            .lines()
            .find(|l| l.starts_with("workload_info{"))
            .expect("workload_info")
            .to_string();
        let seed = line
            .split("load_seed=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .expect("load_seed label")
            .to_string();
        assert!(line.contains(r#"load="poisson:50""#), "{line}");
        seed
    };
    let mut a = Workload::spawn_as("pod-0", "tiny", &["--load", "poisson:50"]);
    let mut b = Workload::spawn_as("pod-1", "tiny", &["--load", "poisson:50"]);
    let mut c = Workload::spawn_as("pod-1", "tiny", &["--load", "poisson:50", "--load-seed", "5"]);
    let (sa, sb, sc) = (seed_of(&mut a), seed_of(&mut b), seed_of(&mut c));
    assert!(!sa.is_empty() && sa != sb, "pod-0 {sa}, pod-1 {sb}");
    assert_eq!(sc, "5", "an explicit --load-seed is used as given");
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run the workload")
}

fn one_line_error(out: &Output, code: i32, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.contains(" INFO ")).collect();
    assert_eq!(out.status.code(), Some(code), "stderr: {err}");
    assert_eq!(lines.len(), 1, "expected one error line, got: {err}");
    assert!(lines[0].contains(needle), "{needle:?} not in {err:?}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_arguments_get_one_line_and_exit_2() {
    one_line_error(
        &run(&["--model", "yolos", "--device", "cpu"]),
        2,
        "unknown model `yolos`",
    );
    one_line_error(&run(&["--precision", "fp16"]), 2, "unknown precision `fp16`");
    one_line_error(
        &run(&["--model", "tiny", "--device", "cpu", "--load", "poisson:-1"]),
        2,
        "poisson:-1",
    );
    one_line_error(
        &run(&["--model", "tiny", "--device", "cpu", "--precision", "bf16"]),
        2,
        "needs --device cuda",
    );
    one_line_error(&run(&["--model", "minilm-l6", "--device", "cpu"]), 2, "--weights");
    one_line_error(
        &run(&[
            "--model",
            "minilm-l6",
            "--device",
            "cpu",
            "--weights",
            "/nonexistent/dir",
        ]),
        2,
        "/nonexistent/dir",
    );
    one_line_error(&run(&["--reserve-memory", "lots"]), 2, "`lots`");
    one_line_error(
        &run(&["--add-latency", "5"]),
        2,
        "bad --add-latency `5`: give a unit: ns, us, ms or s",
    );
    one_line_error(&run(&["--add-latency", "1h"]), 2, "bad --add-latency `1h`");
    one_line_error(&run(&["--inject-fault-after", "5"]), 2, "bad --inject-fault-after `5`");
    one_line_error(&run(&["--crash-after", "soon"]), 2, "bad --crash-after `soon`");
    one_line_error(
        &run(&["--grow-memory", "8GiB"]),
        2,
        "bad --grow-memory `8GiB`: `8GiB` has no ':'",
    );
    one_line_error(
        &run(&["--model", "tiny", "--device", "cpu", "--listen", "nowhere"]),
        2,
        "IP:PORT",
    );
}

#[test]
fn a_port_in_use_is_named() {
    let held = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = held.local_addr().expect("addr").to_string();
    one_line_error(
        &run(&["--model", "tiny", "--device", "cpu", "--listen", &addr]),
        2,
        &format!("cannot listen on {addr}"),
    );
}

#[test]
fn cuda_without_a_gpu_exits_3_with_a_clear_message() {
    // SAFETY: dlopen probe only.
    let has_driver = !unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY) }.is_null();
    if has_driver {
        eprintln!("libcuda is present on this machine: the no-GPU path is checked in CI");
        return;
    }
    let port = free_port().to_string();
    let out = run(&[
        "--model",
        "tiny",
        "--device",
        "cuda",
        "--listen",
        &format!("127.0.0.1:{port}"),
    ]);
    one_line_error(&out, 3, "no NVIDIA driver");
}

#[test]
fn help_teaches_the_contract() {
    let out = run(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "inference_time_seconds",
        "poisson:RATE",
        "Exit codes",
        "--reserve-memory",
        "--inject-fault-after",
        "--grow-memory",
        "Exit codes: 0 clean stop",
        "5 a GPU fault",
        "bench",
    ] {
        assert!(text.contains(needle), "--help lacks {needle}");
    }
}
