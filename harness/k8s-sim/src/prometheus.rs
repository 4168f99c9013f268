//! Prometheus's own server (built from its Go module by `make deps`, with the Kubernetes
//! service discovery that Debian's package leaves out), discovering a test cluster's
//! workload pods through the real API server as kube-prometheus's Prometheus does: as
//! service account `monitoring/prometheus-k8s`, with a token from the API server and the
//! Role the harness's base manifests grant it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::cluster::TestCluster;

/// The server binary: `$GPUSHARE_PROMETHEUS_BIN`, else `.deps/prometheus/bin/prometheus`.
pub fn binary() -> PathBuf {
    match std::env::var_os("GPUSHARE_PROMETHEUS_BIN") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.deps/prometheus/bin/prometheus"),
    }
}

/// A running server; killed when dropped.
#[derive(Debug)]
pub struct DiscoveringPrometheus {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    log: PathBuf,
}

impl Drop for DiscoveringPrometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl DiscoveringPrometheus {
    /// Starts a server in `dir` that discovers the pods of `namespace` (role `pod`), keeps
    /// their port named `metrics` and labels their series `namespace` and `pod`, as a
    /// PodMonitor does, scraping every second.
    pub async fn start(c: &TestCluster, namespace: &str, dir: &Path) -> Result<Self, String> {
        let bin = binary();
        if !bin.is_file() {
            return Err(format!("{} missing: run `make deps`", bin.display()));
        }
        // kube-prometheus's service account (the namespace is the node's set-up).
        let _ = c.kubectl(&["create", "serviceaccount", "prometheus-k8s", "-n", "monitoring"]);
        let token = c.kubectl(&["create", "token", "prometheus-k8s", "-n", "monitoring", "--duration=1h"])?;
        let token_file = dir.join("prometheus-token");
        std::fs::write(&token_file, token.trim()).map_err(|e| format!("{}: {e}", token_file.display()))?;
        let config = format!(
            "global: {{scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}}\n\
             scrape_configs:\n\
             - job_name: gpushare-workload\n  \
               kubernetes_sd_configs:\n  \
               - role: pod\n    \
                 api_server: {server}\n    \
                 namespaces: {{names: [{namespace}]}}\n    \
                 tls_config: {{ca_file: {ca}}}\n    \
                 authorization: {{credentials_file: {token}}}\n  \
               relabel_configs:\n  \
               - {{source_labels: [__meta_kubernetes_pod_container_port_name], action: keep, regex: metrics}}\n  \
               - {{source_labels: [__meta_kubernetes_namespace], target_label: namespace}}\n  \
               - {{source_labels: [__meta_kubernetes_pod_name], target_label: pod}}\n",
            server = c.cp.server,
            ca = c.cp.ca_file().display(),
            token = token_file.display(),
        );
        let config_file = dir.join("prometheus.yml");
        std::fs::write(&config_file, config).map_err(|e| format!("{}: {e}", config_file.display()))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| format!("no free loopback port: {e}"))?;
        let log = dir.join("prometheus.log");
        let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| format!("{}: {e}", log.display()))?;
        let child = Command::new(&bin)
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("prometheus-data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", bin.display()))?;
        let mut server = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
        };
        for _ in 0..150 {
            if crate::node::process::http_ready("127.0.0.1", port, "/-/ready").await {
                return Ok(server);
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!("Prometheus exited ({status}):\n{}", server.log()));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(format!("Prometheus not ready in 30 s:\n{}", server.log()))
    }

    /// The server's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}
