//! Records which commit the harness binary is built from (`git describe` at build
//! time), so a run's record names the code that made it even when the binary runs in
//! another checkout or none (the GPU machine gets the binaries carried over); and the
//! workload image it defaults to: `gpushare-workload:<version>`, under the registry of
//! `GPUSHARE_IMAGE_REGISTRY` when the build is given one (the release workflow's, whose
//! images carry that name).

use std::path::Path;
use std::process::Command;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // Described again when HEAD moves, the index changes or a source file is edited.
    // A commit moves the branch HEAD names, not HEAD itself. Only paths that exist are
    // watched: cargo takes a missing one as changed and would rerun this every build.
    let mut watched = vec![".git/HEAD".to_string(), ".git/index".into(), ".git/packed-refs".into()];
    if let Ok(head) = std::fs::read_to_string(root.join(".git/HEAD"))
        && let Some(branch) = head.trim().strip_prefix("ref: ")
    {
        watched.push(format!(".git/{branch}"));
    }
    for p in watched.iter().map(|p| root.join(p)).filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    println!("cargo:rerun-if-changed=src");
    let described = Command::new("git")
        .arg("-C")
        .arg(&root)
        .args(["describe", "--always", "--dirty", "--tags"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok());
    if let Some(rev) = described {
        println!("cargo:rustc-env=GPUSHARE_BUILD_REVISION={}", rev.trim());
    }
    println!("cargo:rerun-if-env-changed=GPUSHARE_IMAGE_REGISTRY");
    let version = env!("CARGO_PKG_VERSION");
    let image = match std::env::var("GPUSHARE_IMAGE_REGISTRY") {
        Ok(r) if !r.trim().is_empty() => {
            let r = r.trim().trim_end_matches('/');
            let fine = r
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-/:".contains(c));
            if !fine || r.contains("://") {
                panic!(
                    "GPUSHARE_IMAGE_REGISTRY={r:?} is not an image registry and path (lower case, e.g. ghcr.io/acme)"
                );
            }
            format!("{r}/gpushare-workload:{version}")
        }
        _ => format!("gpushare-workload:{version}"),
    };
    println!("cargo:rustc-env=GPUSHARE_DEFAULT_IMAGE={image}");
}
