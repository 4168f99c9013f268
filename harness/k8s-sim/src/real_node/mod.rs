//! A Kubernetes node made of the real components: the kubelet of the pinned Kubernetes
//! (built with the control plane by `.ci/deps.sh`), containerd and runc (Debian's
//! packages) and the CNI bridge plugin, which give each pod a network namespace and an
//! address. The pods are containers the kubelet starts through the runtime, from images
//! built here ([`image`]); nothing is pulled.
//!
//! The node lives in namespaces of its own, made by `unshare`: a PID namespace (when its
//! first process dies the kernel kills every process in it, container shims and
//! containers included), a mount namespace (every mount the kubelet, containerd and runc
//! make goes with it; the node's `/var/lib`, `/var/log` and `/run` are directories of the
//! test's own, bound over the machine's there only), and a network namespace with
//! addresses in the benchmarking range 198.18.0.0/15 alone: the node's InternalIP
//! [`NODE_IP`], pods in [`POD_RANGE`] behind the bridge, and the `kubernetes` Service's
//! ClusterIP. Nothing routes out of it; the kubelet and the pods reach the API server
//! through forwarders the test holds ([`netns`]). Its cgroups are removed when it ends
//! ([`cgroups`]). The machine's kernel settings are never changed: the kubelet checks
//! (`protectKernelDefaults`) the tunables it wants, which the node's mount namespace
//! shows as a prepared node has them.

mod cgroups;
pub mod device_plugin;
pub mod image;
mod netns;

use std::fs::File;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;
use tokio::task::JoinHandle;

use self::cgroups::NodeCgroup;
pub use self::image::Image;
use crate::control_plane::{ControlPlane, KUBERNETES_SERVICE_IP};

/// The node's InternalIP, on the loopback device of its network namespace.
pub const NODE_IP: &str = "198.18.0.2";

/// The pods' addresses (host-local IPAM behind the `cni0` bridge).
pub const POD_RANGE: &str = "198.19.0.0/24";

/// The sandbox ("pause") image: Kubernetes' own `build/pause/linux/pause.c` of the
/// pinned module, built by `.ci/deps.sh`.
pub const PAUSE_IMAGE: &str = "localhost/gpushare-test/pause:3.10.1";

/// Where NVIDIA's binaries and the mock NVML are: `$GPUSHARE_NVIDIA_DIR`, else the
/// workspace's `.deps/nvidia` (`bin/` and `lib/`, built by `.ci/deps.sh`).
pub fn nvidia_dir() -> PathBuf {
    match std::env::var_os("GPUSHARE_NVIDIA_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.deps/nvidia"),
    }
}

/// The mock `libnvidia-ml.so.1` (go-nvml's mock NVML server behind NVML's C ABI).
pub fn nvml_mock() -> PathBuf {
    nvidia_dir().join("lib/libnvidia-ml.so.1")
}

/// What to start.
#[derive(Debug, Clone)]
pub struct RealNodeSpec {
    /// The node's name (the kubelet's `--hostname-override`).
    pub name: String,
    /// Images to load into the runtime before the node is used, beside the pause image.
    pub images: Vec<Image>,
    /// The node's GPUs, by the mock NVML's model names (`H100_SXM5_80GB`,
    /// `H200_SXM5_141GB`): with any, the node has a driver root at `/run/nvidia/driver`
    /// whose `libnvidia-ml.so.1` is the mock, as a driver container installs it.
    pub gpus: Vec<String>,
}

impl Image {
    /// NVIDIA's device plugin, GPU feature discovery and config manager in `/usr/bin`
    /// ([`device_plugin::IMAGE`]).
    pub fn device_plugin() -> Self {
        let bin = nvidia_dir().join("bin");
        let files = ["nvidia-device-plugin", "gpu-feature-discovery", "config-manager"]
            .iter()
            .map(|b| (Path::new("/usr/bin").join(b), bin.join(b)))
            .collect();
        Self {
            name: device_plugin::IMAGE.to_string(),
            entrypoint: vec!["nvidia-device-plugin".into()],
            user: None,
            files,
        }
    }

    /// A shell with `env`, `cat` and `sleep`, for a test's own containers.
    pub fn shell() -> Self {
        let files = [
            ("/bin/sh", "sh"),
            ("/usr/bin/env", "env"),
            ("/bin/cat", "cat"),
            ("/bin/sleep", "sleep"),
        ]
        .iter()
        .map(|(inside, name)| {
            (
                PathBuf::from(inside),
                on_path(name).unwrap_or_else(|| PathBuf::from(inside)),
            )
        })
        .collect();
        Self {
            name: SHELL_IMAGE.to_string(),
            entrypoint: vec!["/bin/sh".into()],
            user: None,
            files,
        }
    }
}

/// [`Image::shell`]'s name.
pub const SHELL_IMAGE: &str = "localhost/gpushare-test/shell:1";

/// A running node; everything it started ends, and its cgroups go, when it is dropped.
pub struct RealNode {
    /// The node's name.
    pub name: String,
    dir: PathBuf,
    unshare: Child,
    /// The host's PID of the node's first process (PID 1 in its namespace).
    init: u32,
    forwards: Vec<JoinHandle<()>>,
    cgroup: Option<NodeCgroup>,
}

impl std::fmt::Debug for RealNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RealNode({}, pid {})", self.name, self.init)
    }
}

/// The script the node's first process runs, inside its new namespaces.
const NODE_SCRIPT: &str = r#"set -eu
ip link set lo up
ip addr add "$NODE_IP/32" dev lo
# The kubernetes Service's ClusterIP: the test's forwarder answers it (no kube-proxy).
ip addr add "$SERVICE_IP/32" dev lo
mkdir -p "$NODE_DIR/var-lib" "$NODE_DIR/var-log" "$NODE_DIR/run" "$NODE_DIR/sys"
mount --bind "$NODE_DIR/var-lib" /var/lib
mount --bind "$NODE_DIR/var-log" /var/log
mount --bind "$NODE_DIR/run" /run
# Shared within the node (new peer groups, all in this namespace: unshare made every
# mount private first, so nothing propagates to the machine), as systemd leaves a node's
# mounts: the kubelet's HostToContainer and Bidirectional mounts need it.
mount --make-rshared /
# The kernel tunables the kubelet checks, as a prepared node has them (kubernetes
# v1.34.4 pkg/kubelet/cm/container_manager_linux.go setupKernelTunables): shown in this
# mount namespace only, never written to the machine's kernel.
for kv in vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1 \
          kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000; do
  k=${kv%%=*}; f="$NODE_DIR/sys/$(echo "$k" | tr / _)"
  echo "${kv#*=}" > "$f"
  mount --bind "$f" "/proc/sys/$k"
done
containerd --config "$NODE_DIR/containerd.toml" > "$NODE_DIR/containerd.log" 2>&1 &
i=0
while [ ! -S "$NODE_DIR/containerd.sock" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
"$KUBELET" --config="$NODE_DIR/kubelet.yaml" --kubeconfig="$KUBECONFIG" \
  --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" -v=2 > "$NODE_DIR/kubelet.log" 2>&1 &
wait
"#;

/// Where a program is: the first of `candidates` that is a file.
fn first_file(candidates: &[&str]) -> Option<PathBuf> {
    candidates.iter().map(PathBuf::from).find(|p| p.is_file())
}

/// `name` on PATH (or in /usr/sbin and /sbin, where Debian puts runc).
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The programs a node needs, or one error naming every one that is missing.
struct Programs {
    kubelet: PathBuf,
    pause: PathBuf,
    containerd: PathBuf,
    ctr: PathBuf,
    cni: PathBuf,
}

impl Programs {
    fn find() -> Result<Self, String> {
        let bin = crate::control_plane::bin_dir();
        let mut missing = Vec::new();
        let mut need = |p: Option<PathBuf>, what: &str| {
            if p.is_none() {
                missing.push(what.to_string());
            }
            p.unwrap_or_default()
        };
        let kubelet = need(
            Some(bin.join("kubelet")).filter(|p| p.is_file()),
            "kubelet (.deps/k8s/bin)",
        );
        let pause = need(Some(bin.join("pause")).filter(|p| p.is_file()), "pause (.deps/k8s/bin)");
        let containerd = need(on_path("containerd"), "containerd");
        let _runc = need(on_path("runc"), "runc");
        let ctr = need(on_path("ctr"), "ctr");
        let _unshare = need(on_path("unshare"), "unshare");
        let _ip = need(on_path("ip"), "ip (iproute2)");
        let cni = need(
            first_file(&["/usr/lib/cni/bridge", "/opt/cni/bin/bridge"]).and_then(|p| p.parent().map(Path::to_path_buf)),
            "the CNI plugins (bridge, host-local, loopback)",
        );
        if !missing.is_empty() {
            return Err(format!(
                "a real test node needs {}: install them with `make deps` (.ci/deps.sh)",
                missing.join(", ")
            ));
        }
        Ok(Self {
            kubelet,
            pause,
            containerd,
            ctr,
            cni,
        })
    }
}

impl RealNode {
    /// Starts the node in `dir` against `cp`, loads the pause image and `spec.images`
    /// into its runtime, and returns once the kubelet has registered the node and it is
    /// Ready.
    pub async fn start(cp: &ControlPlane, admin: &Client, spec: RealNodeSpec, dir: &Path) -> Result<Self, String> {
        let programs = Programs::find()?;
        std::fs::create_dir_all(dir.join("cni")).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let kubeconfig = cp.node_kubeconfig(&spec.name)?;
        if !spec.gpus.is_empty() {
            install_driver_root(dir, &spec)?;
        }
        let cgroup = NodeCgroup::create()?;
        write_configs(dir, &programs, &cgroup.name, &cp.ca_file())?;
        let log = File::create(dir.join("node.log")).map_err(|e| format!("node.log: {e}"))?;
        let err = log.try_clone().map_err(|e| format!("node.log: {e}"))?;
        let mut cmd = Command::new("unshare");
        cmd.args([
            "--pid",
            "--fork",
            "--kill-child",
            "--mount",
            "--net",
            "--propagation",
            "private",
            "--mount-proc",
            "/bin/sh",
            "-c",
            NODE_SCRIPT,
        ])
        .env("NODE_DIR", dir)
        .env("NODE_NAME", &spec.name)
        .env("NODE_IP", NODE_IP)
        .env("SERVICE_IP", KUBERNETES_SERVICE_IP)
        .env("KUBELET", &programs.kubelet)
        .env("KUBECONFIG", &kubeconfig)
        .env("PATH", path_with(&programs.containerd))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err);
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of
        // the parent: unshare dies with the test process, and its --kill-child takes the
        // node's namespace with it.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let unshare = cmd.spawn().map_err(|e| format!("starting unshare: {e}"))?;
        let mut node = Self {
            name: spec.name.clone(),
            dir: dir.to_path_buf(),
            init: 0,
            unshare,
            forwards: Vec::new(),
            cgroup: Some(cgroup),
        };
        node.init = node.wait_for_init()?;
        let netns = File::open(format!("/proc/{}/ns/net", node.init))
            .map_err(|e| format!("the node's network namespace: {e}"))?;
        let api: SocketAddr = ([127, 0, 0, 1], cp.port()).into();
        for inside in [api, format!("{KUBERNETES_SERVICE_IP}:443").parse().expect("an address")] {
            let listener = netns::listen_in(&netns, inside, Duration::from_secs(20))
                .map_err(|e| format!("{e}\n{}", node.log()))?;
            node.forwards.push(netns::forward(listener, api)?);
        }
        node.wait_until("containerd's socket", Duration::from_secs(60), || {
            dir.join("containerd.sock").exists()
        })
        .await?;
        let mut images = vec![Image::of_program(PAUSE_IMAGE, &programs.pause)];
        images.extend(spec.images.iter().cloned());
        for image in &images {
            node.load(&programs.ctr, image)?;
        }
        node.wait_ready(admin).await?;
        Ok(node)
    }

    /// Builds `image` and imports it into the runtime's `k8s.io` namespace (the CRI's).
    fn load(&self, ctr: &Path, image: &Image) -> Result<(), String> {
        let file = self.dir.join(format!(
            "image-{}.tar",
            image.name.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
        ));
        image.write_archive(&file)?;
        let out = Command::new(ctr)
            .arg("--address")
            .arg(self.dir.join("containerd.sock"))
            .args(["-n", "k8s.io", "images", "import", "--snapshotter", "native"])
            .arg(&file)
            .output()
            .map_err(|e| format!("running ctr: {e}"))?;
        let _ = std::fs::remove_file(&file);
        if !out.status.success() {
            return Err(format!(
                "importing {}: {}{}",
                image.name,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(())
    }

    /// The host's PID of the node's first process (unshare's child).
    fn wait_for_init(&mut self) -> Result<u32, String> {
        let pid = self.unshare.id();
        let children = format!("/proc/{pid}/task/{pid}/children");
        let start = Instant::now();
        loop {
            let text = std::fs::read_to_string(&children).unwrap_or_default();
            if let Some(child) = text.split_whitespace().next().and_then(|c| c.parse().ok()) {
                return Ok(child);
            }
            if let Ok(Some(status)) = self.unshare.try_wait() {
                return Err(format!("unshare exited ({status}): {}", self.log()));
            }
            if start.elapsed() > Duration::from_secs(10) {
                return Err(format!("unshare started no process in 10 s: {}", self.log()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Polls `done` every 100 ms for at most `limit` (the forwarders run meanwhile); fails
    /// early when the node's first process has exited.
    async fn wait_until(&mut self, what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Result<(), String> {
        let start = Instant::now();
        loop {
            if done() {
                return Ok(());
            }
            if let Ok(Some(status)) = self.unshare.try_wait() {
                return Err(format!("the node ended ({status}) before {what}:\n{}", self.log()));
            }
            if start.elapsed() > limit {
                return Err(format!("no {what} after {} s:\n{}", limit.as_secs(), self.log()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn wait_ready(&mut self, admin: &Client) -> Result<(), String> {
        let nodes: Api<Node> = Api::all(admin.clone());
        let start = Instant::now();
        loop {
            if let Ok(Some(n)) = nodes.get_opt(&self.name).await {
                let ready = n
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                if ready {
                    return Ok(());
                }
            }
            if let Ok(Some(status)) = self.unshare.try_wait() {
                return Err(format!(
                    "the node ended ({status}) before it was Ready:\n{}",
                    self.log()
                ));
            }
            if start.elapsed() > Duration::from_secs(90) {
                return Err(format!("node {} not Ready after 90 s:\n{}", self.name, self.log()));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The host's PID of the node's first process.
    pub fn init_pid(&self) -> u32 {
        self.init
    }

    /// The node's directory (its logs, configs, and what is bound over `/var/lib`,
    /// `/var/log` and `/run` inside it).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The kubelet's log.
    pub fn kubelet_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("kubelet.log")).unwrap_or_default()
    }

    /// The tails of the node's script, containerd's and the kubelet's logs.
    pub fn log(&self) -> String {
        let tail = |name: &str| {
            let text = std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(20)..].join("\n")
        };
        format!(
            "--- node ---\n{}\n--- containerd ---\n{}\n--- kubelet ---\n{}",
            tail("node.log"),
            tail("containerd.log"),
            tail("kubelet.log")
        )
    }

    /// Stops the node: its namespaces' processes killed, its mounts and network gone
    /// with them, its cgroups removed. Err names what could not be cleaned up.
    pub fn stop(&mut self) -> Result<(), String> {
        for f in self.forwards.drain(..) {
            f.abort();
        }
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
        if self.init != 0 {
            let proc = PathBuf::from(format!("/proc/{}", self.init));
            let start = Instant::now();
            while proc.exists() && start.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(50));
            }
            if proc.exists() {
                return Err(format!("the node's first process {} outlived 10 s", self.init));
            }
        }
        match self.cgroup.take() {
            Some(c) => c.remove(Duration::from_secs(10)),
            None => Ok(()),
        }
    }

    /// The name of the node's cgroup (the kubelet's `cgroupRoot` without its `/`).
    pub fn cgroup_name(&self) -> Option<&str> {
        self.cgroup.as_ref().map(|c| c.name.as_str())
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// A control plane with one node of real components, in one directory: what a test
/// starts. The node stops before the control plane.
pub struct RealCluster {
    /// The node (dropped first).
    pub node: RealNode,
    /// The control plane.
    pub cp: ControlPlane,
    /// A cluster-admin client.
    pub admin: Client,
    dir: PathBuf,
}

impl RealCluster {
    /// Starts the control plane in `dir/cp` and the node of `spec` in `dir/node`.
    pub async fn start(dir: &Path, spec: RealNodeSpec) -> Result<Self, String> {
        let cp = ControlPlane::start(&dir.join("cp"))?;
        let admin = cp.client(&cp.admin_kubeconfig()).await?;
        let node = RealNode::start(&cp, &admin, spec, &dir.join("node")).await?;
        Ok(Self {
            node,
            cp,
            admin,
            dir: dir.to_path_buf(),
        })
    }

    /// `kubectl apply -f` of `objects` (as a `List`), as the administrator.
    pub fn apply(&self, objects: Vec<serde_json::Value>) -> Result<(), String> {
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects});
        let file = self.dir.join("apply.json");
        std::fs::write(&file, list.to_string()).map_err(|e| format!("{}: {e}", file.display()))?;
        let out = self.cp.kubectl(&["apply", "-f", &file.to_string_lossy()]);
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("kubectl apply: {}", String::from_utf8_lossy(&out.stderr)))
        }
    }
}

/// The node's driver root (`/run/nvidia/driver` inside it): the mock NVML and its
/// `nvml-mock.json` (the node's name, from which the GPUs' UUIDs come, and its GPUs).
fn install_driver_root(dir: &Path, spec: &RealNodeSpec) -> Result<(), String> {
    let lib = dir.join("run/nvidia/driver/usr/lib64");
    std::fs::create_dir_all(&lib).map_err(|e| format!("creating {}: {e}", lib.display()))?;
    let mock = nvml_mock();
    std::fs::copy(&mock, lib.join("libnvidia-ml.so.1")).map_err(|e| {
        format!(
            "copying {}: {e} (build it with `make deps`, .ci/deps.sh)",
            mock.display()
        )
    })?;
    let config = serde_json::json!({"node": spec.name, "gpus": spec.gpus});
    std::fs::write(lib.join("nvml-mock.json"), config.to_string()).map_err(|e| format!("nvml-mock.json: {e}"))
}

/// PATH for the node: containerd's directory first (its shim is beside it), then the
/// test's own, then where Debian puts runc.
fn path_with(containerd: &Path) -> std::ffi::OsString {
    let mut dirs: Vec<PathBuf> = containerd.parent().map(Path::to_path_buf).into_iter().collect();
    if let Some(p) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&p));
    }
    dirs.extend(["/usr/sbin", "/sbin"].map(PathBuf::from));
    std::env::join_paths(dirs).unwrap_or_default()
}

/// containerd's, the CNI network's and the kubelet's configuration files in `dir`.
fn write_configs(dir: &Path, programs: &Programs, cgroup: &str, ca: &Path) -> Result<(), String> {
    let d = dir.display();
    // containerd v1.6 (config version 2): its state, socket and runc's root in the
    // node's directory; the native snapshotter (no overlay mounts needed); the CRI's
    // sandbox image built here; the `nvidia` handler the GPU operator's RuntimeClass names
    // is plain runc (the NVIDIA container runtime needs a driver). restrict_oom_score_adj: this machine refuses a negative
    // oom_score_adj even to root (the kubelet's own -999 fails too and it carries on),
    // so a container gets no lower score than containerd's, as on a rootless node.
    let containerd = format!(
        r#"version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"
[grpc]
  address = "{d}/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  enable_selinux = false
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni}"
    conf_dir = "{d}/cni"
"#,
        cni = programs.cni.display()
    );
    // The pods' network: a bridge with host-local addresses in POD_RANGE, the bridge the
    // pods' gateway (the node's namespace, where the ClusterIP is answered).
    let cni = serde_json::json!({
        "cniVersion": "0.4.0",
        "name": "gpushare-pods",
        "plugins": [{
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": true,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": POD_RANGE}]],
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        }],
    });
    // The kubelet: client certificates only (no anonymous access), its server on the
    // node's loopback, cgroupfs under the node's own cgroup, swap allowed (this machine
    // may have it), the kernel's defaults checked, not changed; eviction thresholds low
    // enough that a busy test machine's disk does not evict the test's pods.
    let kubelet = format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: AlwaysAllow}}
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup}
failSwapOn: false
protectKernelDefaults: true
containerRuntimeEndpoint: unix://{d}/containerd.sock
address: 127.0.0.1
port: 10250
readOnlyPort: 0
healthzPort: 0
resolvConf: ""
evictionHard: {{memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
"#,
        ca = ca.display()
    );
    for (name, text) in [
        ("containerd.toml", containerd),
        ("cni/10-pods.conflist", cni.to_string()),
        ("kubelet.yaml", kubelet),
    ] {
        std::fs::write(dir.join(name), text).map_err(|e| format!("writing {name}: {e}"))?;
    }
    Ok(())
}
