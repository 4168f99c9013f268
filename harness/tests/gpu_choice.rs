//! `--gpu`, `--gpus` and `--allow-busy-gpu` where there is no GPU to choose (CI): each wrong use
//! is one line and exit 2, and leaves no run directory. The choice itself, on fixtures
//! of 2- and 8-GPU hosts, is tested beside the code (`telemetry::inventory`,
//! `backend::local::strategy`, `tools::doctor`).

use std::process::{Command, Output};

const BENCH: &str = env!("CARGO_BIN_EXE_gpushare-bench");

fn run(out: &std::path::Path, args: &[&str]) -> Output {
    Command::new(BENCH)
        .args(args)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run")
}

#[test]
fn a_gpu_choice_that_cannot_hold_is_refused_with_one_line() {
    let out = tempfile::tempdir().expect("tempdir");
    for (args, says) in [
        (
            vec!["sweep", "--device", "cpu", "--gpu", "1"],
            "bad --gpu `1`: a GPU for a --device cpu run: drop one of them",
        ),
        (
            vec![
                "sweep",
                "--backend",
                "kubernetes",
                "--node",
                "gpu-1",
                "--gpu",
                "GPU-8ea0",
            ],
            "bad --gpu `GPU-8ea0`: picks a GPU of this machine for the local backend",
        ),
        (
            vec![
                "sweep",
                "--backend",
                "kubernetes",
                "--node",
                "gpu-1",
                "--allow-busy-gpu",
            ],
            "bad --allow-busy-gpu ``: is for the local backend",
        ),
        (
            vec!["overhead", "--device", "cpu", "--gpu", "0"],
            "bad --gpu `0`: this run has no GPU",
        ),
        (
            vec!["sweep", "--device", "cpu", "--gpus", "0,1"],
            "bad --gpus `0,1`: GPUs for a --device cpu run: drop one of them",
        ),
        (
            vec!["sweep", "--gpus", "1,1"],
            "bad --gpus `1`: name at least two GPUs, e.g. 0,1 (one GPU is --gpu)",
        ),
        (
            vec!["sweep", "--backend", "kubernetes", "--node", "gpu-1", "--gpus", "0,1"],
            "bad --gpus `0,1`: spreads cells over this machine's GPUs (the local backend)",
        ),
        (
            vec!["sweep", "--gpus", "0,GPU-8ea0", "--prometheus", "spawn"],
            "bad --gpus `0,GPU-8ea0`: reads every pod's /metrics directly; a Prometheus (--prometheus spawn) serves one cell at a time",
        ),
        (
            vec!["capacity", "--gpus", "0,1", "--load", "poisson:10", "--slo", "p99=25ms"],
            "bad --gpus `0,1`: spreads a sweep's cells over several GPUs; capacity measures one GPU: pick it with --gpu",
        ),
        (
            vec!["isolation", "--gpus", "0,1"],
            "bad --gpus `0,1`: spreads a sweep's cells over several GPUs; isolation measures one GPU",
        ),
    ] {
        let o = run(out.path(), &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
    // A MIG device or a name is not a GPU: clap's usage error, exit 2, naming the value.
    for (value, says) in [
        ("MIG-1d2c3b4a", "is a MIG device, not a GPU"),
        ("h100", "neither a GPU index"),
    ] {
        let o = run(out.path(), &["sweep", "--device", "cpu", "--gpu", value]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{value}: {err}");
        assert!(err.contains(says), "{value}: {err}");
    }
    // GPU 99 is on no machine: one line, with or without a GPU here (CI has none:
    // --device auto finds none to spread over).
    let o = run(out.path(), &["sweep", "--gpus", "0,99"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.starts_with("gpushare-bench: bad --gpus `"), "{err}");
    assert!(
        err.contains("this run has no GPU") || err.contains("there is no GPU 99"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // --gpu and --gpus together: clap's usage error.
    let o = run(out.path(), &["sweep", "--gpu", "0", "--gpus", "0,1"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("cannot be used with"), "{err}");
    // The config file takes the same values, and a refusal names its line.
    std::fs::write(out.path().join("gpus.toml"), "device = \"cpu\"\ngpus = [0, 1]\n").expect("write");
    let o = run(
        out.path(),
        &[
            "sweep",
            "--config",
            out.path().join("gpus.toml").to_str().expect("utf-8"),
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("gpus.toml: line 2 (`gpus = [0, 1]`): gpus `0,1`: GPUs for a --device cpu run"),
        "{err}"
    );
    std::fs::remove_file(out.path().join("gpus.toml")).expect("rm");
    let cfg = out.path().join("bench.toml");
    std::fs::write(&cfg, "device = \"cpu\"\ngpu = 3\n").expect("write");
    let o = run(out.path(), &["sweep", "--config", cfg.to_str().expect("utf-8")]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("bench.toml: line 2 (`gpu = 3`): gpu `3`"), "{err}");
    assert_eq!(
        std::fs::read_dir(out.path()).expect("out").count(),
        1,
        "only the config file: no run directory was made"
    );
}
