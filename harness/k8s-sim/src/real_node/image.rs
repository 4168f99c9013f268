//! OCI images built here from the machine's own binaries, for the test node's container
//! runtime: nothing is pulled. An image is one uncompressed layer holding each binary
//! and the shared libraries it loads (as `ldd` lists them), written as an OCI image
//! layout archive (image-spec v1.1 `image-layout.md`: `oci-layout`, `index.json` and
//! `blobs/sha256/`) that `ctr images import` reads, the image's name in the index
//! entry's `io.containerd.image.name` annotation (containerd v1.6
//! `images/archive/importer.go`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

/// An image to build: its name, what it runs, and the host files it holds.
#[derive(Debug, Clone)]
pub struct Image {
    /// The name the runtime knows it by, e.g. `localhost/gpushare-test/pause:3.10.1`.
    pub name: String,
    /// The container's entrypoint.
    pub entrypoint: Vec<String>,
    /// The user it runs as (`UID` or `UID:GID`), as a Dockerfile's `USER`.
    pub user: Option<String>,
    /// (path in the image, path on this machine): binaries get their shared libraries.
    pub files: Vec<(PathBuf, PathBuf)>,
}

impl Image {
    /// An image of one program at `/NAME` in it, run as its entrypoint.
    pub fn of_program(name: &str, program: &Path) -> Self {
        let file = program
            .file_name()
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("program"));
        let inside = Path::new("/").join(file);
        Self {
            name: name.to_string(),
            entrypoint: vec![inside.to_string_lossy().into_owned()],
            user: None,
            files: vec![(inside, program.to_path_buf())],
        }
    }

    /// Writes the image's OCI layout archive to `out`.
    pub fn write_archive(&self, out: &Path) -> Result<(), String> {
        let layer = self.layer()?;
        let layer_digest = sha256(&layer);
        let mut config = json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Entrypoint": self.entrypoint,
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            },
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        });
        if let Some(user) = &self.user {
            config["config"]["User"] = json!(user);
        }
        let config = config.to_string().into_bytes();
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": sha256(&config),
                "size": config.len(),
            },
            "layers": [{
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": layer_digest,
                "size": layer.len(),
            }],
        })
        .to_string()
        .into_bytes();
        let tag = self.name.rsplit_once(':').map_or("latest", |(_, t)| t);
        let index = json!({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": sha256(&manifest),
                "size": manifest.len(),
                "annotations": {
                    "io.containerd.image.name": self.name,
                    "org.opencontainers.image.ref.name": tag,
                },
            }],
        })
        .to_string()
        .into_bytes();
        let file = std::fs::File::create(out).map_err(|e| format!("creating {}: {e}", out.display()))?;
        let mut archive = tar::Builder::new(file);
        let mut add = |path: String, data: &[u8]| {
            let mut h = tar::Header::new_ustar();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            archive
                .append_data(&mut h, path, data)
                .map_err(|e| format!("writing {}: {e}", out.display()))
        };
        add("oci-layout".into(), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        for blob in [&layer, &config, &manifest] {
            add(format!("blobs/sha256/{}", hex(blob)), blob)?;
        }
        add("index.json".into(), &index)?;
        archive
            .into_inner()
            .map_err(|e| format!("writing {}: {e}", out.display()))?;
        Ok(())
    }

    /// The layer: every file with its parent directories, binaries with the libraries
    /// they load at the paths the dynamic loader looks in.
    fn layer(&self) -> Result<Vec<u8>, String> {
        let mut entries: Vec<(PathBuf, PathBuf)> = Vec::new();
        for (inside, host) in &self.files {
            entries.push((inside.clone(), host.clone()));
            for lib in shared_libraries(host)? {
                entries.push((lib.clone(), lib));
            }
        }
        let mut dirs = BTreeSet::new();
        for (inside, _) in &entries {
            for a in inside.ancestors().skip(1) {
                if a != Path::new("/") && !a.as_os_str().is_empty() {
                    dirs.insert(a.to_path_buf());
                }
            }
        }
        let mut layer = tar::Builder::new(Vec::new());
        let rel = |p: &Path| p.strip_prefix("/").unwrap_or(p).to_path_buf();
        for d in &dirs {
            let mut h = tar::Header::new_ustar();
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
            h.set_size(0);
            layer
                .append_data(&mut h, rel(d), std::io::empty())
                .map_err(|e| format!("layer: {e}"))?;
        }
        let mut seen = BTreeSet::new();
        for (inside, host) in &entries {
            if !seen.insert(inside.clone()) {
                continue;
            }
            let data = std::fs::read(host).map_err(|e| format!("reading {}: {e}", host.display()))?;
            let mut h = tar::Header::new_ustar();
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o755);
            h.set_size(data.len() as u64);
            layer
                .append_data(&mut h, rel(inside), &data[..])
                .map_err(|e| format!("layer: {e}"))?;
        }
        layer.into_inner().map_err(|e| format!("layer: {e}"))
    }
}

/// The shared libraries `binary` loads (its dynamic loader included), resolved as this
/// machine's loader resolves them; none for a static binary or a script.
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>, String> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|e| format!("running ldd on {}: {e}", binary.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        // "not a dynamic executable": nothing to add.
        return Ok(Vec::new());
    }
    let mut libs = Vec::new();
    for line in text.lines() {
        if line.contains("not found") {
            return Err(format!("{}: a library is missing: {}", binary.display(), line.trim()));
        }
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
        // "/lib64/ld-linux-x86-64.so.2 (0x...)"; linux-vdso has no file.
        let path = match line.split_once("=>") {
            Some((_, right)) => right.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    Ok(libs)
}

fn hex(data: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, data)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn sha256(data: &[u8]) -> String {
    format!("sha256:{}", hex(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_archive_names_the_image_and_every_blob_matches_its_digest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let image = Image::of_program("localhost/test/true:1", Path::new("/bin/true"));
        let out = dir.path().join("true.tar");
        image.write_archive(&out).expect("archive");
        let mut archive = tar::Archive::new(std::fs::File::open(&out).expect("open"));
        let mut blobs = std::collections::BTreeMap::new();
        let mut index = None;
        for e in archive.entries().expect("entries") {
            let mut e = e.expect("entry");
            let path = e.path().expect("path").to_string_lossy().into_owned();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut data).expect("read");
            if let Some(d) = path.strip_prefix("blobs/sha256/") {
                assert_eq!(hex(&data), d, "{path}");
                blobs.insert(d.to_string(), data);
            } else if path == "index.json" {
                index = Some(serde_json::from_slice::<serde_json::Value>(&data).expect("json"));
            }
        }
        let index = index.expect("index.json");
        let m = &index["manifests"][0];
        assert_eq!(m["annotations"]["io.containerd.image.name"], "localhost/test/true:1");
        let digest = m["digest"].as_str().expect("digest").trim_start_matches("sha256:");
        let manifest: serde_json::Value = serde_json::from_slice(&blobs[digest]).expect("manifest");
        let layer = manifest["layers"][0]["digest"].as_str().expect("layer");
        let layer = &blobs[layer.trim_start_matches("sha256:")];
        let names: Vec<String> = tar::Archive::new(&layer[..])
            .entries()
            .expect("layer")
            .map(|e| e.expect("entry").path().expect("path").to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().any(|n| n == "true"), "{names:?}");
        assert!(names.iter().any(|n| n.contains("libc.so")), "its libraries: {names:?}");
    }
}
