//! Records which commit the harness binary is built from (`git describe` at build
//! time), so a run's record names the code that made it even when the binary runs in
//! another checkout or none (the GPU machine gets the binaries carried over).

use std::path::Path;
use std::process::Command;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // Described again when HEAD moves, the index changes or a source file is edited.
    for p in [".git/HEAD", ".git/index"] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
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
}
