//! `make bench-peer`'s comparison script (workload/scripts/compare_peer.py), run with
//! python3 on hand-written JSON lines: the ratios it prints, the spread over PyTorch's
//! rounds, the CUDA-graph and max-autotune columns, the ratio to the fastest runner, files from
//! before the graph runner, and bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/compare_peer.py")
}

fn compare(ours: &str, theirs: &str) -> Output {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (a, b) = (dir.path().join("ours.jsonl"), dir.path().join("pytorch.jsonl"));
    std::fs::write(&a, ours).expect("write ours.jsonl");
    std::fs::write(&b, theirs).expect("write pytorch.jsonl");
    Command::new("python3")
        .arg(script())
        .arg(&a)
        .arg(&b)
        .output()
        .expect("python3 runs")
}

const OURS: &str = r#"{"model":"yolos-small","device":"cuda","device_name":"NVIDIA H100 80GB HBM3","precision":"bf16","batch":1,"mean_ms":1.2}
{"model":"yolos-small","device":"cuda","device_name":"NVIDIA H100 80GB HBM3","precision":"tf32","batch":1,"mean_ms":2.0}
"#;

/// Columns `skip..skip + take` of the printout's row that starts with `precision`.
fn columns(text: &str, precision: &str, skip: usize, take: usize) -> String {
    text.lines()
        .find(|l| l.starts_with(precision))
        .unwrap_or_else(|| panic!("no {precision} row in\n{text}"))
        .split_whitespace()
        .skip(skip)
        .take(take)
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn ratios_rounds_and_the_graphed_column() {
    let theirs = r#"{"runner":"pytorch-eager","model":"yolos-small","precision":"bf16","batch":1,"mean_ms":4.0,"round_means_ms":[3.0,4.0,6.0]}
{"runner":"pytorch-cuda-graph","model":"yolos-small","precision":"bf16","batch":1,"mean_ms":2.4,"round_means_ms":[2.4]}
{"runner":"pytorch-eager","model":"yolos-small","precision":"tf32","batch":1,"mean_ms":10.0,"round_means_ms":[10.0]}
{"runner":"pytorch-cuda-graph","model":"yolos-small","precision":"tf32","batch":1,"error":"operation not permitted when stream is capturing"}
"#;
    let out = compare(OURS, theirs);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("UTF-8 output");
    let row = |p: &str| columns(&text, p, 0, 7);
    // bf16: 1.2 / 4.0; rounds 1.2/6.0 .. 1.2/3.0; graphed 1.2 / 2.4.
    assert_eq!(row("bf16"), "bf16 1.200 4.000 0.300 0.200-0.400 2.400 0.500");
    assert_eq!(row("tf32"), "tf32 2.000 10.000 0.200 0.200-0.200 - -");
    assert!(
        text.contains("pytorch-cuda-graph tf32: operation not permitted"),
        "{text}"
    );
}

#[test]
fn a_file_from_before_the_graph_runner_still_compares() {
    let theirs = r#"{"runner":"pytorch-eager","model":"yolos-small","precision":"bf16","batch":1,"iters":200,"mean_ms":4.137}
"#;
    let out = compare(OURS, theirs);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("UTF-8 output");
    assert!(
        text.lines().any(|l| l.split_whitespace().collect::<Vec<_>>()
            == [
                "bf16", "1.200", "4.137", "0.290", "-", "-", "-", "-", "-", "eager", "0.290", "NVIDIA", "H100", "80GB",
                "HBM3"
            ]),
        "{text}"
    );
    assert!(!text.contains("tf32"), "tf32 has no PyTorch line: {text}");
}

#[test]
fn a_line_that_is_not_json_is_one_error_naming_file_and_line() {
    let out = compare(OURS, "{\"runner\":\"pytorch-eager\"}\nnot json\n");
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).expect("UTF-8 errors");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("pytorch.jsonl line 2: not JSON"), "{err}");
}

#[test]
fn a_record_without_its_time_is_one_error_and_a_lone_graph_error_is_shown() {
    let out = compare(
        r#"{"model":"yolos-small","precision":"bf16","batch":1,"device_name":"x"}"#,
        r#"{"runner":"pytorch-eager","model":"yolos-small","precision":"bf16","batch":1,"mean_ms":4.0}"#,
    );
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).expect("UTF-8 errors");
    assert_eq!(err.trim(), "compare_peer: a record lacks the field 'mean_ms'");
    let out = compare(
        OURS,
        r#"{"runner":"pytorch-cuda-graph","model":"yolos-small","precision":"bf16","batch":1,"error":"capture failed"}"#,
    );
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("UTF-8 output");
    assert!(text.contains("pytorch-cuda-graph bf16: capture failed"), "{text}");
}

#[test]
fn the_max_autotune_column_and_the_ratio_to_the_fastest_runner() {
    let theirs = r#"{"runner":"pytorch-eager","model":"yolos-small","precision":"bf16","batch":1,"mean_ms":4.0,"round_means_ms":[4.0]}
{"runner":"pytorch-cuda-graph","model":"yolos-small","precision":"bf16","batch":1,"mean_ms":2.4}
{"runner":"pytorch-max-autotune","model":"yolos-small","precision":"bf16","batch":1,"mean_ms":1.6,"compile_s":93.25}
{"runner":"pytorch-eager","model":"yolos-small","precision":"tf32","batch":1,"mean_ms":10.0}
{"runner":"pytorch-cuda-graph","model":"yolos-small","precision":"tf32","batch":1,"mean_ms":8.0}
{"runner":"pytorch-max-autotune","model":"yolos-small","precision":"tf32","batch":1,"error":"InductorError: no kernel"}
"#;
    let out = compare(OURS, theirs);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("UTF-8 output");
    let row = |p: &str| columns(&text, p, 7, 4);
    // bf16: max-autotune 1.6 (1.2 / 1.6) is the fastest; tf32: the graph (2.0 / 8.0), autotune failed.
    assert_eq!(row("bf16"), "1.600 0.750 max-autotune 0.750");
    assert_eq!(row("tf32"), "- - cuda-graph 0.250");
    assert!(text.contains("pytorch-max-autotune bf16: compiled in 93.2 s"), "{text}");
    assert!(
        text.contains("pytorch-max-autotune tf32: InductorError: no kernel"),
        "{text}"
    );
}
