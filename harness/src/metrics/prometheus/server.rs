//! A private Prometheus server for `--prometheus spawn`: storage in the run directory,
//! loopback only, every pod scraped each second; stopped on every exit path.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::error::{BenchError, Result};
use crate::metrics::Target;
use crate::metrics::http::{http_client, http_get};
use crate::metrics::prometheus::query::instance_of;
use crate::process::{self, OwnedChild};
use crate::shutdown::{EndsOn, Shutdown};

/// The `prometheus` binary, from PATH or Debian's location.
pub fn find_binary() -> Option<PathBuf> {
    process::which("prometheus", &["/usr/bin/prometheus"])
}

/// The configuration of a private server: every pod scraped each second, targets from
/// a file the harness rewrites per cell (pure).
pub fn server_config(targets_file: &Path) -> String {
    // A JSON string is a valid YAML double-quoted scalar: quotes, backslashes and control
    // characters in the run directory's path stay inside the string.
    let quoted = serde_json::to_string(&targets_file.to_string_lossy()).unwrap_or_else(|_| "\"\"".into());
    format!(
        "# Written by gpushare-bench for one run.\nglobal:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: gpushare-workload\n    metrics_path: /metrics\n    file_sd_configs:\n      - files: [{quoted}]\n        refresh_interval: 1s\n"
    )
}

/// A private Prometheus server: storage in the run directory, loopback only.
#[derive(Debug)]
pub struct PrometheusServer {
    child: OwnedChild,
    /// http://127.0.0.1:PORT
    pub url: String,
    targets_file: PathBuf,
}

impl PrometheusServer {
    /// Starts the server and waits until it is ready.
    pub async fn start(run_dir: &Path, shutdown: &Shutdown) -> Result<Self> {
        let bin = find_binary().ok_or_else(|| BenchError::Prometheus {
            url: "spawn".into(),
            reason: "no `prometheus` binary on PATH (`apt-get install prometheus`, or use --prometheus off)".into(),
        })?;
        let dir = run_dir.join("prometheus");
        std::fs::create_dir_all(dir.join("data")).map_err(BenchError::io(format!("creating {}", dir.display())))?;
        let targets_file = dir.join("targets.json");
        crate::files::write_atomic(&targets_file, b"[]\n")?;
        let config = dir.join("prometheus.yml");
        crate::files::write_atomic(&config, server_config(&targets_file).as_bytes())?;
        let port = process::free_port()?;
        let url = format!("http://127.0.0.1:{port}");
        let log_path = run_dir.join("logs").join("prometheus.log");
        std::fs::create_dir_all(run_dir.join("logs")).map_err(BenchError::io("creating logs/"))?;
        let log =
            std::fs::File::create(&log_path).map_err(BenchError::io(format!("creating {}", log_path.display())))?;
        let log2 = log.try_clone().map_err(BenchError::io("duplicating a log handle"))?;
        let mut cmd = tokio::process::Command::new(&bin);
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--storage.tsdb.retention.time=2d")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2));
        let child = OwnedChild::spawn(&mut cmd, &bin.display().to_string()).map_err(|e| BenchError::Prometheus {
            url: url.clone(),
            reason: e.to_string(),
        })?;
        let mut server = Self {
            child,
            url,
            targets_file,
        };
        let http = http_client();
        let mut wait = shutdown.poll(EndsOn::Request, Duration::from_millis(200), Duration::from_secs(30));
        loop {
            if let Ok((200, _)) = http_get(&http, &format!("{}/-/ready", server.url), Duration::from_secs(1)).await {
                return Ok(server);
            }
            let exited = server.child.try_wait().is_some();
            if exited || wait.next().await.is_err() {
                let tail = std::fs::read_to_string(&log_path).unwrap_or_default();
                let last = tail.lines().last().unwrap_or("").to_string();
                server.stop(shutdown).await;
                if shutdown.is_requested() {
                    return Err(shutdown.interrupted());
                }
                return Err(BenchError::Prometheus {
                    url: server.url.clone(),
                    reason: format!("did not become ready (see {}): {last}", log_path.display()),
                });
            }
        }
    }

    /// Points the server at a cell's pods.
    pub fn set_targets(&self, targets: &[Target]) -> Result<()> {
        let list: Vec<String> = targets.iter().map(|t| instance_of(&t.url)).collect();
        let json = serde_json::json!([{ "targets": list, "labels": {} }]);
        crate::files::write_atomic(&self.targets_file, json.to_string().as_bytes())
    }

    /// Stops the server: SIGTERM, then SIGKILL after 5 s (at once on a forced stop).
    pub async fn stop(&mut self, shutdown: &Shutdown) {
        self.child.stop(Duration::from_secs(5), shutdown).await;
    }
}
