//! manifests/ is what the Kubernetes backend applies: the committed files equal what
//! the harness's object builders generate (regenerate with `make manifests`).

use std::path::Path;

#[test]
fn committed_manifests_match_the_generated_ones() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests");
    let n = gpushare_bench::backend::k8s::manifests::write(
        &dir,
        gpushare_bench::backend::k8s::manifests::DEFAULT_IMAGE,
        gpushare_bench::backend::k8s::manifests::NODE_PLACEHOLDER,
        true,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(n >= 18);
}

#[test]
fn a_drifted_file_is_named() {
    let tmp = tempfile::tempdir().expect("tempdir");
    gpushare_bench::backend::k8s::manifests::write(tmp.path(), "img:1", "gpu-1", false).expect("write");
    std::fs::write(tmp.path().join("base/service.yaml"), "edited by hand\n").expect("edit");
    let err = gpushare_bench::backend::k8s::manifests::write(tmp.path(), "img:1", "gpu-1", true)
        .expect_err("drift")
        .to_string();
    assert!(
        err.contains("base/service.yaml") && err.contains("gpushare-bench manifests"),
        "{err}"
    );
}
