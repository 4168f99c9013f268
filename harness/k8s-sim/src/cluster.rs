//! A test cluster: Kubernetes' own control plane ([`ControlPlane`]) with one GPU node
//! played through its API ([`GpuNode`]), set up as the docs tell users to set up theirs.

use std::path::{Path, PathBuf};

use kube::Client;

use crate::control_plane::ControlPlane;
use crate::node::GpuNode;
use crate::spec::ClusterSpec;

/// A running test cluster; everything stops when it is dropped.
pub struct TestCluster {
    /// The GPU node (dropped first: its agent stops before the control plane).
    pub node: GpuNode,
    /// The control plane.
    pub cp: ControlPlane,
    /// A cluster-admin client.
    pub admin: Client,
    _dir: Option<tempfile::TempDir>,
}

/// The repository's `manifests/` directory.
pub fn manifests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../manifests")
}

impl std::fmt::Debug for TestCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TestCluster({}, node {})", self.cp.server, self.node.name)
    }
}

impl TestCluster {
    /// Starts the control plane in a temporary directory and the node of `spec`, with
    /// node time running `speed` times the wall clock.
    pub async fn start(spec: ClusterSpec, speed: f64) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
        let cp = ControlPlane::start(dir.path())?;
        let admin = cp.client(&cp.admin_kubeconfig()).await?;
        let node = GpuNode::start(admin.clone(), spec, speed).await?;
        Ok(Self {
            node,
            cp,
            admin,
            _dir: Some(dir),
        })
    }

    /// Runs kubectl as the administrator; Err with its output when it fails.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        let out = self.cp.kubectl(args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() {
            Ok(text)
        } else {
            Err(format!("kubectl {}: {text}", args.join(" ")))
        }
    }

    /// `kubectl apply -k manifests/<dir>`, as the docs tell users to.
    pub fn apply_manifests(&self, dir: &str) -> Result<String, String> {
        let path = manifests_dir().join(dir);
        self.kubectl(&["apply", "-k", &path.to_string_lossy()])
    }

    /// Writes `files` (relative path, contents) to a temporary directory and runs
    /// `kubectl apply -k` on its `dir`: manifests as a user generated them for this
    /// cluster (`gpushare-bench manifests --node … --out …`).
    pub fn apply_files(&self, files: &[(String, String)], dir: &str) -> Result<String, String> {
        let tmp = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
        for (rel, text) in files {
            let path = tmp.path().join(rel);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
            }
            std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        self.kubectl(&["apply", "-k", &tmp.path().join(dir).to_string_lossy()])
    }

    /// `kubectl apply -f` of `objects` (as a `List`), as the administrator: what another
    /// team, or the user by hand, puts in the cluster.
    pub fn apply_objects(&self, objects: &[serde_json::Value]) -> Result<String, String> {
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects});
        let file = tempfile::Builder::new()
            .suffix(".json")
            .tempfile()
            .map_err(|e| format!("temporary file: {e}"))?;
        std::fs::write(file.path(), list.to_string()).map_err(|e| format!("{}: {e}", file.path().display()))?;
        self.kubectl(&["apply", "-f", &file.path().to_string_lossy()])
    }

    /// A client that authenticates as the harness's service account
    /// (`gpushare-bench/gpushare-bench`, bound by `manifests/base/rbac.yaml`).
    pub async fn harness_client(&self) -> Result<Client, String> {
        let kc = self.cp.service_account_kubeconfig("gpushare-bench", "gpushare-bench")?;
        self.cp.client(&kc).await
    }

    /// The node's log and the control plane's components' log tails, for a failing
    /// test's message.
    pub fn log(&self) -> String {
        let pods = self.kubectl(&["get", "pods", "-A", "-o", "wide"]).unwrap_or_else(|e| e);
        format!(
            "--- pods ---\n{pods}\n--- node ---\n{}\n--- kube-controller-manager ---\n{}\n--- kube-scheduler ---\n{}",
            self.node.log(),
            self.cp.log_tail("kube-controller-manager"),
            self.cp.log_tail("kube-scheduler")
        )
    }
}
