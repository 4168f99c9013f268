//! The restore journal: what the node and the device-plugin ConfigMap looked like before
//! the harness changed them, and every change it made, written to the run directory
//! *before* each change. Restore (at the end of a sweep, on `--resume` after a kill,
//! and `gpushare-bench restore --node NODE`) works from this file, never from memory, and
//! undoes exactly what the harness changed: a label or key someone else changed since is
//! left alone and reported.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{BenchError, Result};
use crate::files::write_atomic;

/// The journal's file name in a run directory.
pub const FILE: &str = "kubernetes-journal.json";

/// One run's changes to one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Journal {
    /// The GPU node.
    pub node: String,
    /// The device-plugin ConfigMap, `namespace/name`.
    pub configmap: String,
    /// The namespace of the workload Deployment.
    pub workload_namespace: String,
    /// Node labels the harness may change, as they were before the first change
    /// (None: absent).
    pub original_labels: BTreeMap<String, Option<String>>,
    /// Every value the harness set on each label it changed, in order (each written
    /// before its patch: a kill between the two leaves an earlier value on the node).
    pub labels_set: BTreeMap<String, Vec<String>>,
    /// ConfigMap keys the harness added, with the content it added (keys that existed
    /// before are never added, changed or removed).
    pub keys_added: BTreeMap<String, String>,
    /// Whether the harness applied its workload Deployment (restore deletes it).
    #[serde(default)]
    pub deployment: bool,
    /// Other workload Deployments the harness applied (an isolation trial's victim and
    /// aggressors, by name): restore deletes each. Written only when there are some, so
    /// a sweep's journal stays readable by earlier versions (which refuse unknown
    /// fields); an isolation run's journal needs this version to restore.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub deployments: BTreeSet<String>,
    /// DRA claims and claim templates the harness created in the workload namespace
    /// (`resourceclaims/NAME`, `resourceclaimtemplates/NAME`): restore deletes each once
    /// the pods are gone. Written only when there are some, as `deployments`.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub claims: BTreeSet<String>,
    /// Whether everything above has been undone.
    pub restored: bool,
}

impl Journal {
    /// A journal for a node before any change.
    pub fn new(node: &str, configmap: &str, original_labels: BTreeMap<String, Option<String>>) -> Self {
        Self {
            node: node.into(),
            configmap: configmap.into(),
            workload_namespace: String::new(),
            original_labels,
            labels_set: BTreeMap::new(),
            keys_added: BTreeMap::new(),
            deployment: false,
            deployments: BTreeSet::new(),
            claims: BTreeSet::new(),
            restored: false,
        }
    }

    /// Whether the harness changed anything that is not yet undone.
    pub fn has_changes(&self) -> bool {
        !self.restored
            && (self.deployment
                || !self.deployments.is_empty()
                || !self.claims.is_empty()
                || !self.labels_set.is_empty()
                || !self.keys_added.is_empty())
    }

    /// Every workload Deployment the harness applied, by name (restore deletes each).
    pub fn workload_deployments(&self) -> Vec<String> {
        let sweep = self.deployment.then(|| super::objects::APP.to_string());
        sweep.into_iter().chain(self.deployments.iter().cloned()).collect()
    }
}

/// What restoring a label should do (pure): `Some(target)` to patch it to `target`
/// (None inside: remove), `None` to leave it; the string is a notice for the user. The
/// label goes back only while it holds a value the harness set.
pub fn label_action(
    original: Option<&str>,
    set: &[String],
    current: Option<&str>,
) -> (Option<Option<String>>, Option<String>) {
    if current == original {
        return (None, None);
    }
    if current.is_some_and(|c| set.iter().any(|s| s == c)) {
        return (Some(original.map(String::from)), None);
    }
    (
        None,
        Some(format!(
            "is {} now, neither the original {} nor a value the harness set ({}): someone else changed it; left alone",
            current.unwrap_or("(absent)"),
            original.unwrap_or("(absent)"),
            set.join(", ")
        )),
    )
}

/// The journal of run directory `dir` for `node` (None: nothing changed yet); refused
/// when the run used another node. Returns its path too.
pub fn attach(dir: &Path, node: &str) -> Result<(PathBuf, Option<Journal>)> {
    let path = path_in(dir);
    let j = read(&path)?;
    if let Some(j) = &j
        && j.node != node
    {
        return Err(BenchError::flag(
            "--node",
            node,
            format!("this run changed node {}; resume it with --node {}", j.node, j.node),
        ));
    }
    Ok((path, j))
}

/// The journal file of a run directory.
pub fn path_in(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

/// Reads a journal (None: the file does not exist).
pub fn read(path: &Path) -> Result<Option<Journal>> {
    let text = match crate::files::read_text(path, crate::files::limits::RECORD) {
        Ok(t) => t,
        Err(crate::files::ReadError::Missing) => return Ok(None),
        Err(e) => {
            return Err(BenchError::Results {
                path: path.to_path_buf(),
                reason: format!("the Kubernetes journal: {e}"),
            });
        }
    };
    serde_json::from_str(&text).map(Some).map_err(|e| BenchError::Results {
        path: path.to_path_buf(),
        reason: format!("not a Kubernetes journal: {e}"),
    })
}

/// Writes a journal atomically (write, then rename).
pub fn write(path: &Path, j: &Journal) -> Result<()> {
    let mut bytes = serde_json::to_vec_pretty(j).map_err(|e| BenchError::Results {
        path: path.to_path_buf(),
        reason: format!("cannot encode the journal: {e}"),
    })?;
    bytes.push(b'\n');
    write_atomic(path, &bytes)
}

/// The newest journal under `out` (one level of run directories) for `node` that still
/// has changes to undo.
pub fn find_open(out: &Path, node: &str) -> Result<Option<PathBuf>> {
    let entries = match std::fs::read_dir(out) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(BenchError::io(format!("reading {}", out.display()))(e)),
    };
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = Vec::new();
    for entry in entries.flatten() {
        let p = path_in(&entry.path());
        let Ok(meta) = std::fs::metadata(&p) else { continue };
        if let Ok(Some(j)) = read(&p)
            && j.node == node
            && j.has_changes()
        {
            found.push((meta.modified().unwrap_or(std::time::UNIX_EPOCH), p));
        }
    }
    found.sort();
    Ok(found.pop().map(|(_, p)| p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_is_put_back_only_if_it_still_holds_the_harness_value() {
        let set = ["b".to_string(), "c".to_string()];
        assert_eq!(label_action(Some("a"), &set, Some("b")), (Some(Some("a".into())), None));
        assert_eq!(label_action(Some("a"), &set, Some("c")), (Some(Some("a".into())), None));
        assert_eq!(label_action(None, &set, Some("b")), (Some(None), None));
        assert_eq!(label_action(Some("a"), &set, Some("a")), (None, None));
        let (act, note) = label_action(Some("a"), &set, Some("d"));
        assert_eq!(act, None);
        assert!(note.is_some_and(|n| n.contains("someone else")));
    }

    #[test]
    fn journals_round_trip_and_bad_ones_name_the_file() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = path_in(dir.path());
        assert_eq!(read(&p).ok(), Some(None));
        let mut j = Journal::new("n", "ns/cm", BTreeMap::from([("l".into(), None)]));
        j.keys_added.insert("k".into(), "v".into());
        write(&p, &j).expect("write");
        assert_eq!(read(&p).ok(), Some(Some(j)));
        std::fs::write(&p, "{").expect("write");
        let err = read(&p).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains(FILE) && err.contains("not a Kubernetes journal"), "{err}");
    }
}
