//! The kubelet for pods the scheduler bound to the node (operand pods aside): admission
//! through the device plugin's `Allocate` or the DRA driver's prepare, container start
//! and readiness, what a workload container does on its own flags, exits and restarts
//! with back-off, and termination ending in the kubelet's final delete.

use serde_json::{Value, json};

use super::operand::{OperandKind, WorkloadAct, arg_duration};
use super::{Agent, Due, PodKey, PodRun, Write};
use crate::gpu::Sharing;
use crate::spec::PodFacts;

const OPERAND_APPS: [OperandKind; 3] = [OperandKind::Plugin, OperandKind::Gfd, OperandKind::Mps];

fn set_condition(status: &mut Value, kind: &str, on: bool) {
    let Some(conditions) = status["conditions"].as_array_mut() else {
        return;
    };
    for c in conditions.iter_mut() {
        if c["type"] == json!(kind) {
            c["status"] = json!(if on { "True" } else { "False" });
        }
    }
}

fn container_name(pod: &Value) -> String {
    pod["spec"]["containers"][0]["name"]
        .as_str()
        .unwrap_or("main")
        .to_string()
}

fn image(pod: &Value) -> String {
    pod["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The GPU resource a pod's first container asks for, and how many.
fn gpu_request(pod: &Value) -> Option<(String, u64)> {
    pod["spec"]["containers"][0]["resources"]["limits"]
        .as_object()
        .and_then(|m| m.iter().find(|(k, _)| k.starts_with("nvidia.com/")))
        .map(|(k, v)| {
            let n = v
                .as_u64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                .unwrap_or(1);
            (k.clone(), n)
        })
}

impl Agent {
    /// Follows the node's pods: admits new ones, terminates deleted ones, forgets gone ones.
    pub(super) async fn sync_pods(&mut self, pods: &[Value]) -> Result<(), String> {
        let mut listed = Vec::new();
        for p in pods {
            let ns = p["metadata"]["namespace"].as_str().unwrap_or_default().to_string();
            let app = p["metadata"]["labels"]["app"].as_str().unwrap_or_default();
            if ns == self.spec.operator_namespace && OPERAND_APPS.iter().any(|k| k.app() == app) {
                continue;
            }
            let key = PodKey {
                ns,
                name: p["metadata"]["name"].as_str().unwrap_or_default().to_string(),
            };
            let uid = p["metadata"]["uid"].as_str().unwrap_or_default().to_string();
            listed.push(key.clone());
            if self.gone.contains(&uid) {
                continue; // deleted; waiting for its finalizers
            }
            let deleting = !p["metadata"]["deletionTimestamp"].is_null();
            let known = self.pods.get(&key).map(|r| (r.uid == uid, r.terminating));
            match known {
                None | Some((false, _)) if !deleting => self.admit(&key, p).await?,
                None | Some((false, _)) => {
                    // Never started here: nothing to stop.
                    self.gone.insert(uid.clone());
                    self.writes.push(Write::DeletePod {
                        ns: key.ns.clone(),
                        name: key.name.clone(),
                        uid,
                    });
                }
                Some((true, false)) if deleting => {
                    let grace = p["metadata"]["deletionGracePeriodSeconds"].as_f64().unwrap_or(30.0);
                    let stop = self.spec.timings.pod_stop.min(grace);
                    if let Some(run) = self.pods.get_mut(&key) {
                        run.terminating = true;
                    }
                    self.processes.terminate(&key);
                    self.at(stop, Due::PodGone(key.clone()));
                }
                Some(_) => {}
            }
        }
        let vanished: Vec<PodKey> = self.pods.keys().filter(|k| !listed.contains(k)).cloned().collect();
        for k in &vanished {
            self.processes.kill(k);
        }
        self.pods.retain(|k, _| listed.contains(k));
        Ok(())
    }

    /// A new pod: the device plugin's `Allocate` or the DRA driver's prepare, then its
    /// container starts.
    async fn admit(&mut self, key: &PodKey, pod: &Value) -> Result<(), String> {
        let phase = pod["status"]["phase"].as_str().unwrap_or_default();
        if matches!(phase, "Failed" | "Succeeded") {
            return Ok(());
        }
        let claims = pod["spec"]["resourceClaims"].as_array().is_some_and(|c| !c.is_empty());
        if claims {
            return self.admit_with_claims(key, pod).await;
        }
        let mut facts = None;
        let mut device = None;
        if let Some((resource, want)) = gpu_request(pod) {
            // Admission: the plugin's `Allocate` (k8s-device-plugin v0.18.1
            // `internal/rm/rm.go` `ValidateRequest`: more than one shared device →
            // UnexpectedAdmissionError, pod Failed, never retried: kubelet `rejectPod`, H13).
            let config = self.plugin_config();
            let rejected = match &config {
                None => Some(format!(
                    "Pod was rejected: Allocate failed due to no healthy devices present; cannot allocate unhealthy devices {resource}, which is unexpected"
                )),
                Some(c) => {
                    let strict = match c.sharing {
                        Sharing::Mps { .. } => true,
                        Sharing::TimeSlicing { fail_gt_one, .. } => fail_gt_one,
                        Sharing::None => false,
                    };
                    (strict && want > 1).then(|| {
                        format!(
                            "Pod was rejected: Allocate failed due to rpc error: code = Unknown desc = invalid allocation request for \"{resource}\": invalid request: maximum request size for shared resources is 1; found {want}, which is unexpected"
                        )
                    })
                }
            };
            if let Some(message) = rejected {
                self.note(format!("kubelet: {}/{}: {message}", key.ns, key.name));
                self.pods.insert(
                    key.clone(),
                    PodRun {
                        uid: pod["metadata"]["uid"].as_str().unwrap_or_default().into(),
                        pod: pod.clone(),
                        status: json!({"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": message}),
                        dirty: true,
                        device: None,
                        terminating: false,
                    },
                );
                return Ok(());
            }
            // The GPU with the fewest replicas in use (k8s-device-plugin v0.20.0
            // `internal/rm/allocate.go` `greedyAlloc`, policy `distributed`, the default;
            // v0.14 to v0.19 `distributedAlloc`); among ties the lowest index (B10).
            let per_gpu = |g: u32| {
                self.pods
                    .values()
                    .filter(|r| r.device.as_ref().is_some_and(|d| d.1 == g))
                    .count()
            };
            let gpu = (0..self.spec.gpus).min_by_key(|g| per_gpu(*g)).unwrap_or(0);
            device = Some((resource, gpu));
            let mig = self.gpu_state.mig.is_some();
            facts = Some(PodFacts {
                gpu: Some(gpu),
                device_uuid: (!mig).then(|| crate::spec::gpu_uuid(gpu)),
                plugin_replicas: config.as_ref().map(crate::gpu::PluginConfig::replicas),
                mps_enforced: match config.as_ref().map(|c| &c.sharing) {
                    Some(Sharing::Mps { .. }) => self.mps_enforced(),
                    _ => None,
                },
                mig,
                ..self.base_facts(pod)
            });
        }
        self.start_pod(key, pod, device, facts);
        Ok(())
    }

    fn base_facts(&self, pod: &Value) -> PodFacts {
        let label = |l: &str| pod["metadata"]["labels"][l].as_str().unwrap_or_default().to_string();
        let (command, args) = crate::kubelet::command_and_args(pod);
        let gpu_resources = pod["spec"]["containers"][0]["resources"]["limits"]
            .as_object()
            .map(|m| m.keys().filter(|k| k.starts_with("nvidia.com/")).cloned().collect())
            .unwrap_or_default();
        PodFacts {
            gpu_resources,
            cell: label("gpushare.dev/cell"),
            role: label("gpushare.dev/role"),
            image: image(pod),
            command,
            args,
            ..PodFacts::default()
        }
    }

    /// The container runs (not ready yet) and the pod has an IP on loopback.
    fn start_pod(&mut self, key: &PodKey, pod: &Value, device: Option<(String, u32)>, facts: Option<PodFacts>) {
        self.ips += 1;
        // Simulated pods get cluster-network addresses; pods that run a process get one
        // on loopback, where it listens: in a /16 of the node's own, so that the
        // processes of clusters running side by side in one test process (240 nodes
        // before the /16s repeat) never bind the same address.
        let net = if self.spec.processes.is_some() {
            format!("127.{}", self.loopback_net())
        } else {
            "198.19".to_string()
        };
        let ip = format!("{net}.{}.{}", self.ips / 250, 2 + self.ips % 250);
        let status = json!({
            "phase": "Running",
            "reason": null, "message": null,
            "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": ip, "podIPs": [{"ip": ip}],
            "startTime": super::setup::rfc3339_now(),
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": "False"},
                {"type": "Ready", "status": "False"}
            ],
            "containerStatuses": [{"name": container_name(pod), "image": image(pod), "imageID": "", "ready": false,
                                   "restartCount": 0, "started": true,
                                   "state": {"running": {"startedAt": super::setup::rfc3339_now()}}}]
        });
        if let Some(f) = facts {
            self.shared
                .lock()
                .expect("node state")
                .facts
                .insert(key.name.clone(), f);
        }
        let gpu = device.is_some();
        self.pods.insert(
            key.clone(),
            PodRun {
                uid: pod["metadata"]["uid"].as_str().unwrap_or_default().into(),
                pod: pod.clone(),
                status,
                dirty: true,
                device,
                terminating: false,
            },
        );
        self.start_process(key, pod, &ip);
        // Pods without a GPU (the operator, its other operands) are ready at once.
        let d = if gpu { self.spec.timings.pod_ready } else { 0.0 };
        self.at(d, Due::PodReady(key.clone(), 0));
    }

    /// Starts the pod's container as a local process when the spec maps its image; a
    /// process that cannot start is a container that exits at once (the runtime's
    /// `StartError`, exit code 128).
    fn start_process(&mut self, key: &PodKey, pod: &Value, ip: &str) {
        let Some(spec) = self.spec.processes.clone() else {
            return;
        };
        if let Err(e) = self.processes.start(&spec, key, pod, ip) {
            self.note(format!("pod {}: {e}", key.name));
            self.container_exit(key, 128, &e);
        }
    }

    /// Containers whose process has exited: the kubelet sees the exit.
    pub(super) fn reap_processes(&mut self) {
        for (key, code) in self.processes.exited() {
            let terminating = self.pods.get(&key).is_none_or(|r| r.terminating);
            if !terminating {
                self.container_exit(&key, code, "the process exited");
            }
        }
    }

    /// The pod's HTTP readiness probe passes (always, for a simulated container).
    async fn probe_ready(&self, key: &PodKey) -> bool {
        if !self.processes.has(key) {
            return true;
        }
        let Some(run) = self.pods.get(key) else { return false };
        let probe = &run.pod["spec"]["containers"][0]["readinessProbe"]["httpGet"];
        let Some(path) = probe["path"].as_str() else {
            return true;
        };
        // A named port is the container's port of that name.
        let container = &run.pod["spec"]["containers"][0];
        let port = probe["port"]
            .as_u64()
            .or_else(|| {
                let name = probe["port"].as_str()?;
                container["ports"].as_array()?.iter().find(|p| p["name"] == name)?["containerPort"].as_u64()
            })
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or(0);
        let ip = run.status["podIP"].as_str().unwrap_or_default().to_string();
        super::process::http_ready(&ip, port, path).await
    }

    /// A pod whose GPU comes through claims, which the scheduler allocated and reserved
    /// for it: the kubelet prepares them (J5, J6): the driver checks each claim's
    /// `GpuConfig`; on an error the pod stays in ContainerCreating with a
    /// `FailedPrepareDynamicResources` event, otherwise its container starts.
    async fn admit_with_claims(&mut self, key: &PodKey, pod: &Value) -> Result<(), String> {
        let gates = self.spec.dra.clone().unwrap_or_default();
        let claims = super::setup::claims_api(&self.client, &key.ns);
        let mut failure = None;
        let mut sharing = None;
        let mut device = None;
        let mut mig_device = false;
        let mut claim_name = String::new();
        for rc in pod["spec"]["resourceClaims"].as_array().into_iter().flatten() {
            let pod_claim = rc["name"].as_str().unwrap_or_default();
            let name = match rc["resourceClaimName"].as_str() {
                Some(n) => n.to_string(),
                None => match pod["status"]["resourceClaimStatuses"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|s| s["name"] == json!(pod_claim))
                    .and_then(|s| s["resourceClaimName"].as_str())
                {
                    Some(n) => n.to_string(),
                    None => return Ok(()), // not bound with its claims yet: next pass
                },
            };
            let Some(claim) = claims
                .get_opt(&name)
                .await
                .map_err(|e| format!("reading claim {name}: {e}"))?
            else {
                return Ok(());
            };
            let claim = serde_json::to_value(claim).map_err(|e| e.to_string())?;
            let a = claim["status"]["allocation"].clone();
            let reserved = claim["status"]["reservedFor"]
                .as_array()
                .is_some_and(|r| r.iter().any(|r| r["uid"] == pod["metadata"]["uid"]));
            if a.is_null() || !reserved {
                return Ok(());
            }
            claim_name = name.clone();
            // `gpu-<minor>`, or `gpu-<minor>-mig-…` (J8).
            let dev = a["devices"]["results"][0]["device"].as_str().unwrap_or_default();
            mig_device = dev.contains("-mig-");
            device = dev
                .strip_prefix("gpu-")
                .and_then(|i| i.split('-').next())
                .and_then(|i| i.parse::<u32>().ok());
            let request = a["devices"]["results"][0]["request"].as_str().unwrap_or_default();
            let cuid = claim["metadata"]["uid"].as_str().unwrap_or_default().to_string();
            let prepared = match crate::dra::config_for(&a, request) {
                Some(params) => crate::dra::prepare_config(params, &gates, &cuid),
                None => Ok(None),
            };
            match prepared {
                Ok(s) => sharing = s,
                Err(e) => failure = Some(crate::dra::prepare_failed_event(&key.ns, &name, &cuid, &e)),
            }
        }
        let gpu = device.unwrap_or(0);
        if let Some(message) = failure {
            self.note(format!("kubelet: {message}"));
            self.writes.push(Write::Event {
                ns: key.ns.clone(),
                pod: key.name.clone(),
                reason: "FailedPrepareDynamicResources".into(),
                message,
            });
            self.pods.insert(
                key.clone(),
                PodRun {
                    uid: pod["metadata"]["uid"].as_str().unwrap_or_default().into(),
                    pod: pod.clone(),
                    status: json!({
                        "phase": "Pending",
                        "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
                        "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
                        "containerStatuses": [{"name": container_name(pod), "image": image(pod), "imageID": "", "ready": false,
                                               "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}]
                    }),
                    dirty: true,
                    device: Some((String::new(), gpu)),
                    terminating: false,
                },
            );
            return Ok(());
        }
        match &sharing {
            Some(crate::dra::Sharing::Mps { .. }) => {
                self.exclusive_process.insert(gpu);
            }
            Some(crate::dra::Sharing::TimeSlicing(_)) => {
                self.exclusive_process.remove(&gpu);
            }
            None => {}
        }
        let mps = match &sharing {
            Some(crate::dra::Sharing::Mps { thread_percentage, .. }) => {
                Some(100 / thread_percentage.unwrap_or(100).max(1))
            }
            _ => None,
        };
        let facts = PodFacts {
            gpu: Some(gpu),
            mps_enforced: mps,
            mig: mig_device,
            claim: claim_name,
            dra_sharing: sharing,
            ..self.base_facts(pod)
        };
        self.start_pod(key, pod, Some((String::new(), gpu)), Some(facts));
        Ok(())
    }

    fn facts_of(&self, key: &PodKey) -> PodFacts {
        self.shared
            .lock()
            .expect("node state")
            .facts
            .get(&key.name)
            .cloned()
            .unwrap_or_default()
    }

    /// The container's start number (its restart count) and whether it runs now.
    fn container(&self, key: &PodKey) -> Option<(u32, bool)> {
        let cs = &self.pods.get(key)?.status["containerStatuses"][0];
        let start = cs["restartCount"].as_u64().unwrap_or(0) as u32;
        Some((start, !cs["state"]["running"].is_null()))
    }

    fn is_ready(&self, key: &PodKey) -> bool {
        self.pods
            .get(key)
            .is_some_and(|r| r.status["containerStatuses"][0]["ready"] == json!(true))
    }

    pub(super) async fn pod_ready(&mut self, key: &PodKey, start: u32) {
        if self.container(key) != Some((start, true)) || self.pods.get(key).is_some_and(|r| r.terminating) {
            return;
        }
        if !self.probe_ready(key).await {
            // The kubelet probes again after `periodSeconds` (here a tenth of a second
            // of wall-clock time).
            let again = self.speed * 0.1;
            self.at(again, Due::PodReady(key.clone(), start));
            return;
        }
        // A GPU in EXCLUSIVE_PROCESS takes one CUDA context (MPS clients go through the
        // MPS server's): a second plain process on it fails to create its own.
        let facts = self.facts_of(key);
        let plain = !matches!(facts.dra_sharing, Some(crate::dra::Sharing::Mps { .. }));
        let holders: Vec<PodKey> = self
            .pods
            .iter()
            .filter(|(k, r)| *k != key && r.device.as_ref().map(|d| d.1) == facts.gpu && facts.gpu.is_some())
            .map(|(k, _)| k.clone())
            .collect();
        if plain
            && facts.gpu.is_some_and(|g| self.exclusive_process.contains(&g))
            && holders
                .iter()
                .any(|k| self.container(k).is_some_and(|(_, running)| running) && self.is_ready(k))
        {
            self.container_exit(
                key,
                3,
                "CUDA_ERROR_DEVICES_UNAVAILABLE: the GPU is in compute mode EXCLUSIVE_PROCESS and another process holds it",
            );
            return;
        }
        let Some(run) = self.pods.get_mut(key) else { return };
        set_condition(&mut run.status, "ContainersReady", true);
        set_condition(&mut run.status, "Ready", true);
        run.status["containerStatuses"][0]["ready"] = json!(true);
        run.dirty = true;
        let args = run.pod["spec"]["containers"][0]["args"].clone();
        if self.processes.has(key) {
            return; // a real process faults or crashes on its own
        }
        // The workload counts its events from readiness, in each container anew.
        for (flag, act) in [
            ("--inject-fault-after", WorkloadAct::Fault),
            ("--crash-after", WorkloadAct::Crash),
        ] {
            if let Some(after) = arg_duration(&args, flag) {
                let after = after * self.spec.workload_time_scale;
                self.at(after, Due::Workload(key.clone(), start, act));
            }
        }
    }

    /// A workload container faults or kills itself.
    ///
    /// - A fault under MPS reaches every client on that GPU of the MPS server, of which
    ///   there is one per node (k8s-device-plugin v0.20.0 `cmd/mps-control-daemon/mps/manager.go`,
    ///   read): each exits with the workload's code 5 (NVIDIA's MPS documentation, "Error
    ///   containment": a fatal exception is reported to all clients of the server; not
    ///   source). Elsewhere only the faulting container exits. The GPU stays healthy: the
    ///   device plugin ignores the illegal-address Xids (`internal/rm/health.go`, read).
    /// - `--crash-after` SIGKILLs the process: exit 137, unless the process is its PID
    ///   namespace's init (no `shareProcessNamespace`), where the kernel drops the signal
    ///   and the workload exits 1 instead (Linux `kernel/signal.c` `sig_task_ignored`
    ///   with `SIGNAL_UNKILLABLE`; the workload's own `--crash-after` says so).
    pub(super) fn workload_act(&mut self, key: &PodKey, start: u32, act: WorkloadAct) {
        if self.container(key) != Some((start, true)) {
            return;
        }
        match act {
            WorkloadAct::Crash => {
                let shared = self
                    .pods
                    .get(key)
                    .is_some_and(|r| r.pod["spec"]["shareProcessNamespace"] == json!(true));
                if shared {
                    self.container_exit(key, 137, "killed by SIGKILL (--crash-after)");
                } else {
                    self.container_exit(
                        key,
                        1,
                        "--crash-after: SIGKILL was ignored: this process is its PID namespace's init",
                    );
                }
            }
            WorkloadAct::Fault => {
                let facts = self.facts_of(key);
                let mut hit = vec![key.clone()];
                if facts.mps_enforced.is_some() {
                    let all = self.shared.lock().expect("node state").facts.clone();
                    let clients: Vec<PodKey> = self
                        .pods
                        .iter()
                        .filter(|(k, r)| {
                            *k != key
                                && r.device.as_ref().map(|d| d.1) == facts.gpu
                                && all.get(&k.name).is_some_and(|f| f.mps_enforced.is_some())
                        })
                        .map(|(k, _)| k.clone())
                        .collect();
                    hit.extend(
                        clients
                            .into_iter()
                            .filter(|k| self.container(k).is_some_and(|(_, r)| r)),
                    );
                    self.note(format!(
                        "MPS: a fatal fault in {} ends every client of the server: {}",
                        key.name,
                        hit.iter().map(|k| k.name.as_str()).collect::<Vec<_>>().join(", ")
                    ));
                }
                for k in hit {
                    self.container_exit(&k, 5, "a GPU fault lost the CUDA context");
                }
            }
        }
    }

    /// A workload container exits: the pod is not ready, its container terminated, and
    /// the kubelet starts it again (`restartPolicy: Always`): at once after its first
    /// exit, then after 10 s doubling to 300 s from the exit (kubernetes
    /// `pkg/kubelet/kuberuntime/kuberuntime_manager.go` `doBackOff`, UPSTREAM-RULES.md I2).
    fn container_exit(&mut self, key: &PodKey, code: i32, message: &str) {
        let Some((start, true)) = self.container(key) else {
            return;
        };
        let delay = self.backoff(start + 1);
        let Some(run) = self.pods.get_mut(key) else { return };
        set_condition(&mut run.status, "ContainersReady", false);
        set_condition(&mut run.status, "Ready", false);
        let cs = &mut run.status["containerStatuses"][0];
        cs["ready"] = json!(false);
        // No message: the pod sets no terminationMessagePolicy and the workload writes no
        // /dev/termination-log.
        cs["state"] =
            json!({"terminated": {"exitCode": code, "reason": "Error", "finishedAt": super::setup::rfc3339_now()}});
        if delay > 0.0 {
            cs["lastState"] = cs["state"].clone();
            cs["state"] = json!({"waiting": {"reason": "CrashLoopBackOff", "message": format!("back-off {delay}s restarting failed container")}});
        }
        run.dirty = true;
        self.note(format!(
            "pod {}: container exited with code {code} ({message})",
            key.name
        ));
        self.at(delay, Due::Restart(key.clone(), start + 1));
    }

    pub(super) fn restart_container(&mut self, key: &PodKey, start: u32) {
        let Some(run) = self.pods.get_mut(key) else { return };
        if run.terminating || run.status["phase"] != json!("Running") {
            return;
        }
        let cs = &mut run.status["containerStatuses"][0];
        if cs["restartCount"].as_u64() != Some(u64::from(start - 1)) {
            return;
        }
        if !cs["state"]["terminated"].is_null() {
            cs["lastState"] = cs["state"].clone();
        }
        cs["state"] = json!({"running": {"startedAt": super::setup::rfc3339_now()}});
        cs["restartCount"] = json!(start);
        run.dirty = true;
        let mapped = self
            .spec
            .processes
            .as_ref()
            .is_some_and(|p| p.images.contains_key(&image(&run.pod)));
        if mapped {
            let (pod, ip) = (
                run.pod.clone(),
                run.status["podIP"].as_str().unwrap_or_default().to_string(),
            );
            self.start_process(key, &pod, &ip);
        }
        let d = self.spec.timings.pod_ready;
        self.at(d, Due::PodReady(key.clone(), start));
    }

    /// A terminating pod's containers have stopped: the kubelet reports the pod terminal
    /// (`Succeeded`: all containers exited on SIGTERM; the kubelet's `getPhase` in
    /// `pkg/kubelet/kubelet_pods.go` was not read, the phase is assumed), unprepares its
    /// claims and deletes it. The phase matters: the resourceclaim controller releases a
    /// claim only from a pod that is done (`pkg/controller/resourceclaim/controller.go`
    /// `isPodDone`: a terminal phase, or deleted and never scheduled; read at a release
    /// still on `resource/v1alpha2`), and the v1.34.4 controller the tests run keeps a
    /// DRA pod deleted in the foreground until then.
    pub(super) fn pod_gone(&mut self, key: &PodKey) {
        self.processes.kill(key);
        let Some(mut run) = self.pods.remove(key) else { return };
        self.gone.insert(run.uid.clone());
        let name = container_name(&run.pod);
        run.status["phase"] = json!("Succeeded");
        set_condition(&mut run.status, "ContainersReady", false);
        set_condition(&mut run.status, "Ready", false);
        run.status["containerStatuses"] = json!([{"name": name, "image": image(&run.pod), "imageID": "", "ready": false,
            "restartCount": run.status["containerStatuses"][0]["restartCount"].clone(), "started": false,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": super::setup::rfc3339_now()}}}]);
        self.writes.push(Write::PodStatus {
            ns: key.ns.clone(),
            name: key.name.clone(),
            status: run.status.clone(),
        });
        // Unprepare: with TimeSlicingSettings on, the driver resets the GPU's compute
        // mode and time slice to their defaults once no pod holds the claim (J5).
        let facts = self.facts_of(key);
        if self.spec.dra.as_ref().is_some_and(|g| g.time_slicing)
            && !facts.claim.is_empty()
            && let Some(gpu) = facts.gpu
        {
            let all = self.shared.lock().expect("node state").facts.clone();
            let still = self
                .pods
                .keys()
                .any(|k| all.get(&k.name).is_some_and(|f| f.claim == facts.claim));
            if !still {
                self.exclusive_process.remove(&gpu);
            }
        }
        self.writes.push(Write::DeletePod {
            ns: key.ns.clone(),
            name: key.name.clone(),
            uid: run.uid,
        });
    }

    /// Reports the status of every pod whose status changed.
    pub(super) fn write_pod_statuses(&mut self) {
        let mut out = Vec::new();
        for (k, r) in &mut self.pods {
            if std::mem::take(&mut r.dirty) && !r.terminating {
                out.push(Write::PodStatus {
                    ns: k.ns.clone(),
                    name: k.name.clone(),
                    status: r.status.clone(),
                });
            }
        }
        self.writes.extend(out);
    }
}
