//! Kubernetes' own control plane on loopback, for tests: etcd, kube-apiserver (RBAC,
//! service-account tokens, default admission), kube-controller-manager and kube-scheduler
//! of Kubernetes v1.34, built from their upstream Go modules by `.ci/deps.sh` into
//! `.deps/k8s/bin` (`harness/k8s-sim/controlplane`). Nothing here answers an API request:
//! every answer is the real API server's.
//!
//! Each [`ControlPlane`] has its own directory (certificates from `gen-pki`, etcd's data,
//! the components' logs) and its own ports; its processes die with it (dropped, or the
//! test process killed: they get SIGKILL when their parent dies).

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Where the control plane's binaries are: `$GPUSHARE_K8S_BIN`, else the workspace's
/// `.deps/k8s/bin`.
pub fn bin_dir() -> PathBuf {
    match std::env::var_os("GPUSHARE_K8S_BIN") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.deps/k8s/bin"),
    }
}

/// The Services' ClusterIP range: in the benchmarking range (RFC 2544), as every address
/// a test cluster uses.
pub const SERVICE_RANGE: &str = "198.18.1.0/24";

/// The `kubernetes` Service's ClusterIP (the range's first address), which the serving
/// certificate names: a pod on a real test node reaches the API server there.
pub const KUBERNETES_SERVICE_IP: &str = "198.18.1.1";

/// A running control plane; stopped when dropped.
#[derive(Debug)]
pub struct ControlPlane {
    dir: PathBuf,
    bin: PathBuf,
    /// The API server's URL, `https://127.0.0.1:PORT`.
    pub server: String,
    children: Vec<(String, Child)>,
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free loopback port: {e}"))
}

impl ControlPlane {
    /// Starts etcd, the API server, the controller manager and the scheduler with their
    /// state in `dir`, and waits until the API server is ready and the `default`
    /// namespace's service account exists (the controllers are working).
    ///
    /// A port found free can be taken by another process before a component binds it
    /// (tests start clusters side by side): a component that exits because its port is
    /// in use is started again with the others, on fresh ports in a fresh directory,
    /// up to three times.
    pub fn start(dir: &Path) -> Result<Self, String> {
        let mut last = String::new();
        for attempt in 1..=3 {
            let here = match attempt {
                1 => dir.to_path_buf(),
                n => dir.join(format!("start-{n}")),
            };
            match Self::start_in(&here) {
                Err(e) if e.contains("address already in use") => last = e,
                done => return done,
            }
        }
        Err(last)
    }

    fn start_in(dir: &Path) -> Result<Self, String> {
        let bin = bin_dir();
        for b in [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kubectl",
            "gen-pki",
        ] {
            if !bin.join(b).is_file() {
                return Err(format!(
                    "{} is missing: build the control plane with `make deps` (.ci/deps.sh)",
                    bin.join(b).display()
                ));
            }
        }
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        room_for_etcd(dir, ETCD_ROOM)?;
        let (etcd_port, peer_port, api_port) = (free_port()?, free_port()?, free_port()?);
        let server = format!("https://127.0.0.1:{api_port}");
        let pki = dir.join("pki");
        let out = Command::new(bin.join("gen-pki"))
            .args([
                "--dir",
                &pki.to_string_lossy(),
                "--server",
                &server,
                "--host",
                KUBERNETES_SERVICE_IP,
            ])
            .output()
            .map_err(|e| format!("running gen-pki: {e}"))?;
        if !out.status.success() {
            return Err(format!("gen-pki: {}", String::from_utf8_lossy(&out.stderr)));
        }
        let mut cp = Self {
            dir: dir.to_path_buf(),
            bin,
            server,
            children: Vec::new(),
        };
        let p = |name: &str| pki.join(name).to_string_lossy().into_owned();
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        cp.spawn(
            "etcd",
            &[
                "--name=test",
                &format!("--data-dir={}", dir.join("etcd").display()),
                &format!("--listen-client-urls={etcd_url}"),
                &format!("--advertise-client-urls={etcd_url}"),
                &format!("--listen-peer-urls={peer_url}"),
                &format!("--initial-advertise-peer-urls={peer_url}"),
                &format!("--initial-cluster=test={peer_url}"),
                "--unsafe-no-fsync=true",
            ],
        )?;
        cp.wait_for(Duration::from_secs(60), "etcd serving", "etcd", || {
            std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], etcd_port).into(), Duration::from_secs(1)).is_ok()
        })?;
        cp.spawn(
            "kube-apiserver",
            &[
                &format!("--etcd-servers={etcd_url}"),
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                &format!("--secure-port={api_port}"),
                &format!("--cert-dir={}", dir.join("apiserver").display()),
                &format!("--tls-cert-file={}", p("apiserver.crt")),
                &format!("--tls-private-key-file={}", p("apiserver.key")),
                &format!("--client-ca-file={}", p("ca.crt")),
                // As kubeadm sets a cluster up: a kubelet may touch only its own node and
                // the pods bound to it.
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                // As kubeadm's API server: NVIDIA's operands run privileged.
                "--allow-privileged=true",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                &format!("--service-account-key-file={}", p("sa.pub")),
                &format!("--service-account-signing-key-file={}", p("sa.key")),
                &format!("--service-cluster-ip-range={SERVICE_RANGE}"),
                "--profiling=false",
            ],
        )?;
        cp.wait_ready(Duration::from_secs(120))?;
        cp.spawn(
            "kube-controller-manager",
            &[
                &format!("--kubeconfig={}", p("controller-manager.kubeconfig")),
                "--leader-elect=false",
                "--secure-port=0",
                "--use-service-account-credentials=true",
                &format!("--service-account-private-key-file={}", p("sa.key")),
                &format!("--root-ca-file={}", p("ca.crt")),
                "--profiling=false",
            ],
        )?;
        cp.spawn(
            "kube-scheduler",
            &[
                &format!("--kubeconfig={}", p("scheduler.kubeconfig")),
                "--leader-elect=false",
                "--secure-port=0",
                "--profiling=false",
            ],
        )?;
        cp.wait_for(
            Duration::from_secs(120),
            "the default service account",
            "kube-controller-manager",
            || {
                cp.kubectl(&["get", "serviceaccount", "default", "-n", "default", "-o", "name"])
                    .status
                    .success()
            },
        )?;
        Ok(cp)
    }

    fn spawn(&mut self, name: &str, args: &[&str]) -> Result<(), String> {
        let log = std::fs::File::create(self.dir.join(format!("{name}.log")))
            .map_err(|e| format!("creating {name}.log: {e}"))?;
        let err = log.try_clone().map_err(|e| format!("{name}.log: {e}"))?;
        let mut cmd = Command::new(self.bin.join(name));
        cmd.args(args).stdin(Stdio::null()).stdout(log).stderr(err);
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of
        // the parent; it makes the component die with the test process.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| format!("starting {name}: {e}"))?;
        self.children.push((name.to_string(), child));
        Ok(())
    }

    /// Polls `done` every 200 ms until it holds; fails when a component has exited, with
    /// the tail of its log, or after `limit`, with the tails of `log`'s and etcd's logs.
    fn wait_for(&self, limit: Duration, what: &str, log: &str, mut done: impl FnMut() -> bool) -> Result<(), String> {
        let start = Instant::now();
        loop {
            if done() {
                return Ok(());
            }
            if let Some(name) = self.exited() {
                return Err(format!(
                    "{name} exited while waiting for {what}: {}",
                    self.log_tail(&name)
                ));
            }
            if start.elapsed() > limit {
                let mut text = format!(
                    "no {what} after {} s; {log}'s log: {}",
                    limit.as_secs(),
                    self.log_tail(log)
                );
                if log != "etcd" {
                    text.push_str(&format!("\netcd's log: {}", self.log_tail("etcd")));
                }
                return Err(text);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn wait_ready(&self, limit: Duration) -> Result<(), String> {
        self.wait_for(limit, "ready API server", "kube-apiserver", || {
            let out = self.kubectl(&["get", "--raw", "/readyz"]);
            out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok"
        })
    }

    /// The first component that has exited, if any (left unreaped: `Child::wait` in
    /// `drop` still reaps it).
    fn exited(&self) -> Option<String> {
        self.children
            .iter()
            .find_map(|(name, c)| has_exited(c.id()).then(|| name.clone()))
    }

    /// The last lines of a component's log.
    pub fn log_tail(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// The administrator's kubeconfig (group `system:masters`).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("pki/admin.kubeconfig")
    }

    /// A kubeconfig for the kubelet of node `name` (`system:node:NAME`, group
    /// `system:nodes`), signed by the cluster's CA.
    pub fn node_kubeconfig(&self, name: &str) -> Result<PathBuf, String> {
        let pki = self.dir.join("pki");
        let out = Command::new(self.bin.join("gen-pki"))
            .args([
                "--dir",
                &pki.to_string_lossy(),
                "--server",
                &self.server,
                "--node",
                name,
            ])
            .output()
            .map_err(|e| format!("running gen-pki: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "gen-pki --node {name}: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(pki.join(format!("node-{name}.kubeconfig")))
    }

    /// The API server's port on loopback.
    pub fn port(&self) -> u16 {
        self.server.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or(0)
    }

    /// Runs kubectl as the administrator.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new(self.bin.join("kubectl"))
            .arg(format!("--kubeconfig={}", self.admin_kubeconfig().display()))
            .args(args)
            .output()
            .unwrap_or_else(|e| Output {
                status: std::os::unix::process::ExitStatusExt::from_raw(127 << 8),
                stdout: Vec::new(),
                stderr: format!("cannot run kubectl: {e}").into_bytes(),
            })
    }

    /// The cluster CA's certificate (what a client of the API server trusts).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("pki/ca.crt")
    }

    /// A kubeconfig that authenticates as service account `name` of namespace `ns`
    /// with a token from the API server's TokenRequest (`kubectl create token`), so
    /// every answer to it, 403s included, is the API server's RBAC.
    pub fn service_account_kubeconfig(&self, ns: &str, name: &str) -> Result<PathBuf, String> {
        let out = self.kubectl(&["create", "token", name, "-n", ns, "--duration=2h"]);
        if !out.status.success() {
            return Err(format!(
                "kubectl create token {name} -n {ns}: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let ca = self.dir.join("pki/ca.crt");
        let path = self.dir.join(format!("{ns}-{name}.kubeconfig"));
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: {name}\n  user:\n    token: {token}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: {name}\n    namespace: {ns}\ncurrent-context: test\n",
            self.server,
            ca.display()
        );
        std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        Ok(path)
    }

    /// A kube-rs client from a kubeconfig file of this control plane.
    pub async fn client(&self, kubeconfig: &Path) -> Result<kube::Client, String> {
        let kc = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| e.to_string())?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(|e| e.to_string())?;
        kube::Client::try_from(config).map_err(|e| e.to_string())
    }
}

/// Whether our child `pid` has exited, without reaping it (waitid's WNOWAIT: waitpid
/// refuses that flag with EINVAL).
fn has_exited(pid: u32) -> bool {
    // SAFETY: a zeroed siginfo_t is a valid out-parameter; waitid with WNOHANG on our
    // own child's pid neither blocks nor reaps.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let r = libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        );
        r == 0 && info.si_pid() != 0
    }
}

/// etcd preallocates a 64 MiB write-ahead log and its database grows from there: with
/// less room than this its start fails, which the API server reports only as etcd
/// refusing connections.
const ETCD_ROOM: u64 = 256 << 20;

/// Refuses to start etcd in a directory whose file system has less than `need` bytes
/// free, naming both.
fn room_for_etcd(dir: &Path, need: u64) -> Result<(), String> {
    let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("{} has a NUL byte", dir.display()))?;
    // SAFETY: a zeroed statvfs is a valid out-parameter; `path` is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(format!(
            "statvfs {}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        ));
    }
    let free = st.f_bavail as u64 * st.f_frsize as u64;
    if free < need {
        return Err(format!(
            "only {} MiB free on the file system of {}: etcd needs at least {} MiB (set TMPDIR to a roomier place)",
            free >> 20,
            dir.display(),
            need >> 20
        ));
    }
    Ok(())
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // The scheduler and controllers first, etcd last.
        for (_, c) in self.children.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exited_child_is_seen_and_left_for_wait_to_reap() {
        let mut done = Command::new("true").spawn().expect("true");
        let mut running = Command::new("sleep").arg("30").spawn().expect("sleep");
        let start = Instant::now();
        while !has_exited(done.id()) {
            assert!(start.elapsed() < Duration::from_secs(10), "`true` never seen as exited");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!has_exited(running.id()));
        // Still unreaped: wait() gets its status.
        assert!(done.wait().expect("wait").success());
        running.kill().expect("kill");
        running.wait().expect("wait");
    }

    #[test]
    fn too_little_room_for_etcd_names_the_directory_and_the_room() {
        let dir = tempfile::tempdir().expect("tempdir");
        room_for_etcd(dir.path(), 1).expect("a byte fits");
        let err = room_for_etcd(dir.path(), u64::MAX).expect_err("no file system has that");
        assert!(err.contains(&dir.path().display().to_string()), "{err}");
        assert!(err.contains("MiB free") && err.contains("etcd needs"), "{err}");
    }
}
