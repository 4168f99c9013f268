//! Pods whose container really runs: with [`ProcessSpec`] in the cluster's spec, the
//! kubelet starts a local process for each pod whose image the spec maps to a program,
//! with the pod's command and args as the kubelet passes them (`$(VAR)` expanded), its
//! environment, and its own IP on loopback. A pod's network namespace would let every
//! pod listen on `0.0.0.0:9400`; here the pods share one, so `0.0.0.0` in an argument
//! becomes the pod's own address (`127.N.x.y`, a /16 per node), which is what a process in a pod
//! listening on all its interfaces serves on. Termination sends SIGTERM to the process
//! group, the final delete SIGKILL; dropping the node kills every group it started, and
//! each process gets SIGKILL when the test process dies.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::PodKey;
use crate::spec::ProcessSpec;

/// The processes the kubelet started, by pod.
#[derive(Debug, Default)]
pub(super) struct Processes {
    running: BTreeMap<PodKey, Child>,
}

impl Drop for Processes {
    fn drop(&mut self) {
        for child in self.running.values_mut() {
            kill_group(child, libc::SIGKILL);
            let _ = child.wait();
        }
    }
}

fn kill_group(child: &Child, signal: i32) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) on the process group this agent made for the child
        // (`process_group(0)` in `start`); no memory is touched.
        unsafe {
            libc::kill(-pid, signal);
        }
    }
}

impl Processes {
    /// Starts the container of `pod` at `ip` when `spec` maps its image; Ok(false) when
    /// it does not (the pod stays simulated).
    pub(super) fn start(&mut self, spec: &ProcessSpec, key: &PodKey, pod: &Value, ip: &str) -> Result<bool, String> {
        let container = &pod["spec"]["containers"][0];
        let image = container["image"].as_str().unwrap_or_default();
        let Some(program) = spec.images.get(image) else {
            return Ok(false);
        };
        let (command, args) = crate::kubelet::command_and_args(pod);
        let mut argv: Vec<String> = if command.is_empty() {
            std::iter::once(program.to_string_lossy().into_owned())
                .chain(args)
                .collect()
        } else {
            command.into_iter().chain(args).collect()
        };
        for a in &mut argv {
            *a = a.replace("0.0.0.0", ip);
        }
        std::fs::create_dir_all(&spec.logs).map_err(|e| format!("{}: {e}", spec.logs.display()))?;
        let log_path = spec.logs.join(format!("{}.log", key.name));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("{}: {e}", log_path.display()))?;
        let err = log.try_clone().map_err(|e| format!("{}: {e}", log_path.display()))?;
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .env_clear()
            .envs(crate::kubelet::environment(pod, container))
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", std::env::temp_dir())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err);
        // Its own process group, so that termination reaches everything it started; and
        // it dies with the test process even when that is killed outright.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        // SAFETY: prctl(2) only sets this child's parent-death signal between fork and
        // exec; it allocates nothing and touches no shared state.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| format!("starting {}: {e}", argv[0]))?;
        if let Some(mut old) = self.running.insert(key.clone(), child) {
            kill_group(&old, libc::SIGKILL);
            let _ = old.wait();
        }
        Ok(true)
    }

    /// Whether the pod's container is a local process.
    pub(super) fn has(&self, key: &PodKey) -> bool {
        self.running.contains_key(key)
    }

    /// SIGTERM to the pod's process group (the pod is terminating).
    pub(super) fn terminate(&mut self, key: &PodKey) {
        if let Some(child) = self.running.get(key) {
            kill_group(child, libc::SIGTERM);
        }
    }

    /// SIGKILL to the pod's process group, and reaps it (the pod is gone).
    pub(super) fn kill(&mut self, key: &PodKey) {
        if let Some(mut child) = self.running.remove(key) {
            kill_group(&child, libc::SIGKILL);
            let _ = child.wait();
        }
    }

    /// Processes that have exited since the last call, with their exit codes (128 +
    /// the signal for one killed by a signal, as a container runtime reports it). They
    /// stay known (`has`) until restarted or killed.
    pub(super) fn exited(&mut self) -> Vec<(PodKey, i32)> {
        let mut out = Vec::new();
        for (key, child) in &mut self.running {
            if let Ok(Some(status)) = child.try_wait() {
                let code = status
                    .code()
                    .or_else(|| std::os::unix::process::ExitStatusExt::signal(&status).map(|s| 128 + s))
                    .unwrap_or(1);
                out.push((key.clone(), code));
            }
        }
        out
    }
}

/// The kubelet's HTTP readiness probe: GET `path` on `ip:port`, ready on a 2xx or 3xx
/// answer within a second (kubernetes v1.34.4 `pkg/probe/http/http.go` `DoHTTPProbe`:
/// `200 <= code < 400`; `pkg/apis/core/v1/defaults.go` `SetDefaults_Probe`: one-second
/// `timeoutSeconds`; both read).
pub(crate) async fn http_ready(ip: &str, port: u16, path: &str) -> bool {
    let attempt = async {
        let mut conn = tokio::net::TcpStream::connect((ip, port)).await.ok()?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: {ip}:{port}\r\nUser-Agent: kube-probe/1.34\r\n\r\n");
        conn.write_all(request.as_bytes()).await.ok()?;
        let mut head = [0u8; 16];
        let n = conn.read(&mut head).await.ok()?;
        let line = String::from_utf8_lossy(&head[..n]).into_owned();
        let code: u16 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some((200..400).contains(&code))
    };
    tokio::time::timeout(Duration::from_secs(1), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}
