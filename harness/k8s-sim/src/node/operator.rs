//! The GPU operator's operands on the node and the MIG manager, by their upstream rules
//! (versions as in UPSTREAM-RULES.md: GPU operator v25.10.1, k8s-device-plugin v0.18.1,
//! mig-parted v0.13.1). Their pods come from real DaemonSets; this is what runs in them.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::operand::{
    DEPLOY_LABELS, DEPLOY_PAUSED, MIG_LABEL, MIG_STATE, OPERATOR, Operand, OperandKind, PAUSED, PLUGIN_LABEL, Process,
    is_gfd_label,
};
use super::{Agent, Due, Write};
use crate::gpu::{self, PluginConfig, Sharing};
use crate::spec::Secs;

/// Where the MIG manager's run is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum MigRun {
    Idle,
    /// Waiting for operand pods to go (since when), for this layout.
    WaitOperands {
        layout: String,
        since: Secs,
        id: u64,
    },
    ModeChange {
        layout: String,
        id: u64,
    },
    Apply {
        layout: String,
        id: u64,
    },
}

const KINDS: [OperandKind; 3] = [OperandKind::Plugin, OperandKind::Gfd, OperandKind::Mps];

impl Agent {
    /// Reacts to a change of the node's labels as the informers do: config-managers and
    /// the MIG manager only on a change of their label's value (k8s-device-plugin v0.18.1
    /// `cmd/config-manager/main.go` `continuouslySyncConfigChanges`, mig-parted v0.13.1
    /// `cmd/nvidia-mig-manager/main.go` `ContinuouslySyncMigConfigChanges`).
    pub(super) fn labels_changed(&mut self, before: &BTreeMap<String, String>) {
        let plugin_changed = before.get(PLUGIN_LABEL) != self.labels.get(PLUGIN_LABEL);
        let mig_changed = before.get(MIG_LABEL) != self.labels.get(MIG_LABEL);
        if plugin_changed && self.config_managers_run() {
            let delay = self.spec.timings.informer;
            for o in self.operands.clone() {
                if !o.terminating && o.manager_error.is_none() {
                    self.at(delay, Due::ConfigManager(o.kind, o.pod.clone()));
                }
            }
        }
        if mig_changed && let Some(v) = self.labels.get(MIG_LABEL).filter(|v| !v.is_empty()).cloned() {
            let delay = self.spec.timings.informer;
            self.at(delay, Due::MigLabel(v));
        }
    }

    /// Whether the ClusterPolicy names a device-plugin config (gpu-operator v25.10.1
    /// `controllers/object_controls.go` `handleDevicePluginConfig`: otherwise the
    /// config-manager containers are removed from the operands).
    fn config_managers_run(&self) -> bool {
        !self.spec.plugin_config.0.is_empty()
    }

    /// Operand pods as the DaemonSet controller made them: a new pod starts its
    /// config-manager init container and main process; a deleted pod terminates.
    pub(super) fn sync_operands(&mut self, pods: &[Value]) {
        let ns = self.spec.operator_namespace.clone();
        let mut listed = Vec::new();
        for p in pods {
            if p["metadata"]["namespace"] != json!(ns) {
                continue;
            }
            let app = p["metadata"]["labels"]["app"].as_str().unwrap_or_default();
            let Some(kind) = KINDS.into_iter().find(|k| k.app() == app) else {
                continue;
            };
            let name = p["metadata"]["name"].as_str().unwrap_or_default().to_string();
            let uid = p["metadata"]["uid"].as_str().unwrap_or_default().to_string();
            listed.push(name.clone());
            let deleting = !p["metadata"]["deletionTimestamp"].is_null();
            match self.operand(kind, &name) {
                None if !deleting => {
                    self.operand_uids.insert(name.clone(), uid);
                    self.operands.push(Operand {
                        kind,
                        pod: name.clone(),
                        created: self.now,
                        linked: None,
                        manager_error: None,
                        manager_failures: 0,
                        process_failures: 0,
                        process: Process::Starting,
                        registered: false,
                        terminating: false,
                        restarts: 0,
                    });
                    self.note(format!("{} pod {name} started", kind.app()));
                    let start = self.spec.timings.operand_start;
                    if self.config_managers_run() {
                        self.at(start, Due::ConfigManager(kind, name.clone()));
                    } else {
                        // No config-manager: the process reads no config file.
                        if let Some(i) = self.operand(kind, &name) {
                            self.operands[i].linked = Some(String::new());
                        }
                        self.at(start, Due::Load(kind, name.clone()));
                    }
                    self.update_operand_pod(kind, &name);
                }
                None => {
                    // Deleted before it ran: the kubelet only removes it.
                    self.writes.push(Write::DeletePod {
                        ns: ns.clone(),
                        name,
                        uid,
                    });
                }
                Some(i) if deleting && !self.operands[i].terminating => {
                    self.operands[i].terminating = true;
                    self.operands[i].registered = false;
                    if kind == OperandKind::Plugin {
                        self.set_allocatable(BTreeMap::new());
                    }
                    self.note(format!("{} pod {name} terminating", kind.app()));
                    let stop = self.spec.timings.operand_stop;
                    self.at(stop, Due::OperandGone(kind, name));
                }
                Some(_) => {}
            }
        }
        self.operands.retain(|o| listed.contains(&o.pod));
    }

    /// An operand pod's containers are gone: the kubelet deletes it.
    pub(super) fn operand_gone(&mut self, kind: OperandKind, pod: &str) {
        if kind == OperandKind::Gfd {
            let d = self.spec.timings.gfd_relabel;
            self.at(d, Due::GfdLabelsGone);
        }
        if let Some(i) = self.operand(kind, pod) {
            self.operands.remove(i);
            self.note(format!("{} pod {pod} gone", kind.app()));
            if kind == OperandKind::Plugin {
                self.set_allocatable(BTreeMap::new());
            }
        }
        let uid = self.operand_uids.remove(pod).unwrap_or_default();
        self.writes.push(Write::DeletePod {
            ns: self.spec.operator_namespace.clone(),
            name: pod.to_string(),
            uid,
        });
    }

    fn operand(&self, kind: OperandKind, pod: &str) -> Option<usize> {
        self.operands.iter().position(|o| o.kind == kind && o.pod == pod)
    }

    /// The files an operand pod's `/available-configs` volume holds now: the ConfigMap as
    /// of one projection delay ago, or as of the pod's start (A5: a new pod mounts the
    /// current content; later changes arrive with the kubelet's sync).
    fn projected(&self, o: &Operand) -> BTreeMap<String, String> {
        let seen_at = (self.now - self.spec.timings.projection[o.kind.index()]).max(o.created);
        self.cm_history
            .iter()
            .rev()
            .find(|(t, _)| *t <= seen_at)
            .map(|(_, d)| d.clone())
            .unwrap_or_default()
    }

    /// The config-manager of an operand pod runs (at pod start as `config-manager-init`,
    /// then as the sidecar on each label change). k8s-device-plugin v0.18.1
    /// `cmd/config-manager/main.go`: `updateConfigName` (label → file in the mounted
    /// ConfigMap: `no configuration files available`, `specified config X does not
    /// exist`; empty label → `DEFAULT_CONFIG`, else fallback `empty` → /dev/null),
    /// `updateSymlink` (unchanged target: "Already configured", no signal), then SIGHUP.
    /// An error exits the container: it restarts with the kubelet's backoff.
    pub(super) fn config_manager(&mut self, kind: OperandKind, pod: &str) {
        let Some(i) = self.operand(kind, pod) else { return };
        if self.operands[i].terminating {
            return;
        }
        let label = self.label(PLUGIN_LABEL).unwrap_or_default();
        let init = self.operands[i].linked.is_none();
        if init && label.is_empty() && self.shared.lock().expect("node state").race_lost {
            // D5: the informer's first `Set("")` came before `Get`; the init container
            // waits for a label change that may never come (run again by one).
            self.note(format!(
                "{} config-manager-init in {pod}: Waiting for change to '{PLUGIN_LABEL}' label (v0.18.1 race lost: blocked until the label changes)",
                kind.app()
            ));
            self.update_operand_pod(kind, pod);
            return;
        }
        let files = self.projected(&self.operands[i]);
        let default = self.spec.plugin_config.1.clone();
        let chosen: Result<String, String> = if files.is_empty() {
            Err("no configuration files available".into())
        } else if !label.is_empty() {
            if files.contains_key(&label) {
                Ok(label.clone())
            } else {
                Err(format!("specified config {label} does not exist"))
            }
        } else if !default.is_empty() {
            if files.contains_key(&default) {
                Ok(default)
            } else {
                Err("specified config  does not exist".into())
            }
        } else {
            Ok(String::new())
        };
        match chosen {
            Err(e) => {
                let o = &mut self.operands[i];
                o.manager_failures += 1;
                o.manager_error = Some(e.clone());
                let n = o.manager_failures;
                let delay = self.backoff(n);
                self.note(format!(
                    "{} config-manager in {pod}: {e} (restart in {delay:.0} s)",
                    kind.app()
                ));
                self.at(delay, Due::ConfigManager(kind, pod.to_string()));
            }
            Ok(name) => {
                let o = &mut self.operands[i];
                o.manager_error = None;
                o.manager_failures = 0;
                let first = o.linked.is_none();
                let changed = o.linked.as_deref() != Some(name.as_str());
                o.linked = Some(name.clone());
                if changed && kind == OperandKind::Mps && !first {
                    // v0.18.1: the MPS pod's sidecar switches the link, then panics in
                    // `findPidToSignal` on a kernel thread's empty cmdline (hostPID), and
                    // after its restart finds "Already configured": the daemon keeps the
                    // config it started with until its pod is recreated (H10).
                    o.restarts += 1;
                    self.note(format!(
                        "{} config-manager in {pod}: Updating to config: {name}; panic: index out of range [0] with length 0 (daemon keeps its old config)",
                        kind.app()
                    ));
                } else if changed && !first && matches!(o.process, Process::Crashed(_)) {
                    // The link switches, then `findPidToSignal` finds no process: the
                    // sidecar exits and, restarted, finds "Already configured". The
                    // process takes the new file at its own crash-loop restart.
                    o.restarts += 1;
                    self.note(format!(
                        "{} config-manager in {pod}: Updating to config: {name}; error finding pid: no process found",
                        kind.app()
                    ));
                } else if changed {
                    self.note(format!(
                        "{} config-manager in {pod}: Updating to config: {name}",
                        kind.app()
                    ));
                    // SIGHUP (or the first start after config-manager-init).
                    self.at(0.0, Due::Load(kind, pod.to_string()));
                }
            }
        }
        self.update_operand_pod(kind, pod);
    }

    /// The kubelet's wait before starting a container that exited for the
    /// `failures`-th time in a row (UPSTREAM-RULES.md I2): none after the first exit,
    /// then the first back-off doubling to the cap, counted from the exit.
    pub(super) fn backoff(&self, failures: u32) -> Secs {
        let (base, cap) = self.spec.timings.backoff;
        match failures {
            0 | 1 => 0.0,
            n => (base * 2f64.powi((n - 2).min(16) as i32)).min(cap),
        }
    }

    /// The main process (re)loads its config: `cmd/nvidia-device-plugin/main.go`
    /// `startPlugins`/`loadConfig` (an invalid config exits 1: CrashLoopBackOff),
    /// `cmd/gpu-feature-discovery/main.go` `start`, `cmd/mps-control-daemon/main.go`
    /// `startDaemons` (not MPS: "skipping", no daemon).
    pub(super) fn load(&mut self, kind: OperandKind, pod: &str) {
        let Some(i) = self.operand(kind, pod) else { return };
        if self.operands[i].terminating {
            return;
        }
        let linked = self.operands[i].linked.clone().unwrap_or_default();
        let text = if linked.is_empty() {
            String::new()
        } else {
            self.projected(&self.operands[i])
                .get(&linked)
                .cloned()
                .unwrap_or_default()
        };
        let mig_enabled = self.gpu_state.mig.is_some();
        let strategy = self.spec.mig_strategy.clone();
        let parsed = gpu::parse_plugin_config(&text)
            .and_then(|c| gpu::check_against_gpus(&c, mig_enabled, &strategy).map(|()| c));
        if kind == OperandKind::Plugin {
            self.operands[i].registered = false;
            self.set_allocatable(BTreeMap::new());
        }
        match parsed {
            Err(e) => {
                let o = &mut self.operands[i];
                o.process_failures += 1;
                o.process = Process::Crashed(e.clone());
                let n = o.process_failures;
                let delay = self.backoff(n);
                self.note(format!("{} {pod} exited: {e} (restart in {delay:.0} s)", kind.app()));
                self.at(delay, Due::Load(kind, pod.to_string()));
                if kind == OperandKind::Gfd {
                    let d = self.spec.timings.gfd_relabel;
                    self.at(d, Due::GfdLabelsGone);
                }
            }
            Ok(c) => {
                let o = &mut self.operands[i];
                o.process_failures = 0;
                o.process = Process::Running(c.clone());
                let t = self.spec.timings.clone();
                match kind {
                    OperandKind::Plugin => self.at(t.plugin_restart, Due::Register(pod.to_string())),
                    OperandKind::Gfd => self.at(t.gfd_relabel, Due::Relabel(pod.to_string())),
                    OperandKind::Mps => {
                        let what = match c.sharing {
                            Sharing::Mps { replicas } => format!("MPS daemon enforcing {replicas} replicas"),
                            _ => "Sharing strategy is not MPS; skipping".into(),
                        };
                        self.note(format!("{pod}: {what}"));
                    }
                }
            }
        }
        self.update_operand_pod(kind, pod);
    }

    /// The MPS daemon's enforced replicas, when it is up and serving MPS
    /// (`cmd/mps-control-daemon/mps/daemon.go` `Start`: ready after start-up).
    pub(super) fn mps_enforced(&self) -> Option<u32> {
        self.operands
            .iter()
            .find_map(|o| match (&o.process, o.kind, o.terminating) {
                (Process::Running(c), OperandKind::Mps, false) => match c.sharing {
                    Sharing::Mps { replicas } => Some(replicas),
                    _ => None,
                },
                _ => None,
            })
    }

    pub(super) fn register_due(&mut self, pod: &str) {
        if let Some(i) = self.operand(OperandKind::Plugin, pod)
            && matches!(self.operands[i].process, Process::Running(_))
            && !self.operands[i].terminating
        {
            self.register(i);
        }
    }

    /// The plugin registers: with MPS only once the daemon answers (`internal/plugin/mps.go`
    /// `waitForDaemon`; else "Retrying in 30s").
    fn register(&mut self, i: usize) {
        let Process::Running(config) = self.operands[i].process.clone() else {
            return;
        };
        let pod = self.operands[i].pod.clone();
        if matches!(config.sharing, Sharing::Mps { .. }) && self.mps_enforced().is_none() {
            self.note(format!("device plugin {pod}: MPS daemon not healthy; Retrying in 30s"));
            let retry = self.spec.timings.mps_retry;
            self.at(retry, Due::Register(pod));
            return;
        }
        self.operands[i].registered = true;
        let strategy = self.spec.mig_strategy.clone();
        let adv = gpu::advertised(self.spec.gpus, &self.gpu_state, &config, &strategy);
        self.set_allocatable(adv);
    }

    /// The registered plugin's config (what `Allocate` runs with).
    pub(super) fn plugin_config(&self) -> Option<PluginConfig> {
        self.operands
            .iter()
            .find_map(|o| match (&o.process, o.kind, o.registered) {
                (Process::Running(c), OperandKind::Plugin, true) => Some(c.clone()),
                _ => None,
            })
    }

    pub(super) fn gfd_tick(&mut self) {
        if let Some(o) = self
            .operands
            .iter()
            .find(|o| o.kind == OperandKind::Gfd && !o.terminating)
        {
            let pod = o.pod.clone();
            self.relabel(&pod);
        }
        let every = self.spec.timings.gfd_interval;
        self.at(every, Due::GfdTick);
    }

    /// NFD drops GFD's labels after GFD exited (it removes its features.d file).
    pub(super) fn gfd_labels_gone(&mut self) {
        let gfd_running = self
            .operands
            .iter()
            .any(|o| o.kind == OperandKind::Gfd && !o.terminating && matches!(o.process, Process::Running(_)));
        if gfd_running {
            return;
        }
        let gone: Vec<String> = self.labels.keys().filter(|k| is_gfd_label(k)).cloned().collect();
        if !gone.is_empty() {
            self.note("NFD: GFD's labels removed (GFD is not running)".into());
            let changes: Vec<(&str, Option<String>)> = gone.iter().map(|k| (k.as_str(), None)).collect();
            self.set_labels("nfd-master", &changes);
        }
    }

    /// GFD writes its labels through NFD, which replaces GFD's whole set.
    pub(super) fn relabel(&mut self, pod: &str) {
        let config =
            self.operands
                .iter()
                .find_map(|o| match (&o.process, o.kind == OperandKind::Gfd && o.pod == pod) {
                    (Process::Running(c), true) => Some(c.clone()),
                    _ => None,
                });
        let Some(config) = config else { return };
        let strategy = self.spec.mig_strategy.clone();
        let labels = gpu::gfd_labels(&self.spec.gpu, self.spec.gpus, &self.gpu_state, &config, &strategy);
        let mut changes: Vec<(String, Option<String>)> = Vec::new();
        for k in self.labels.keys() {
            if is_gfd_label(k) && !labels.contains_key(k) {
                changes.push((k.clone(), None));
            }
        }
        for (k, v) in &labels {
            if self.labels.get(k) != Some(v) {
                changes.push((k.clone(), Some(v.clone())));
            }
        }
        if changes.is_empty() {
            return;
        }
        self.note(format!(
            "GFD labels: {}",
            changes
                .iter()
                .map(|(k, v)| format!(
                    "{}={}",
                    k.trim_start_matches("nvidia.com/"),
                    v.as_deref().unwrap_or("-")
                ))
                .collect::<Vec<_>>()
                .join(" ")
        ));
        let refs: Vec<(&str, Option<String>)> = changes.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        self.set_labels("nfd-master", &refs);
    }

    /// The operator's node labels: the deploy labels when absent, and `mig.config`
    /// `all-disabled` on MIG-capable nodes that have none (gpu-operator v25.10.1
    /// `controllers/state_manager.go`); then its periodic reconcile and GFD's.
    pub(super) fn operator_reconcile(&mut self) {
        let mut changes: Vec<(&str, Option<String>)> = Vec::new();
        let mig_capable = !self.spec.gpu.mig_profiles.is_empty();
        for k in DEPLOY_LABELS {
            if k.ends_with("mig-manager") && !mig_capable {
                continue;
            }
            if !self.labels.contains_key(k) {
                changes.push((k, Some("true".into())));
            }
        }
        if mig_capable && self.labels.get(MIG_LABEL).is_none_or(String::is_empty) {
            changes.push((MIG_LABEL, Some("all-disabled".into())));
        }
        if !changes.is_empty() {
            self.set_labels(OPERATOR, &changes);
        }
        if self
            .due
            .iter()
            .all(|std::cmp::Reverse((_, _, e))| *e != Due::OperatorTick)
        {
            let every = self.spec.timings.operator_reconcile;
            self.at(every, Due::OperatorTick);
            let every = self.spec.timings.gfd_interval;
            self.at(every, Due::GfdTick);
        }
    }

    /// The operand pod's status as the kubelet reports it.
    fn update_operand_pod(&mut self, kind: OperandKind, pod: &str) {
        let Some(i) = self.operand(kind, pod) else { return };
        let o = self.operands[i].clone();
        let (phase, ready, waiting) = match (&o.manager_error, &o.process) {
            (Some(e), _) if o.linked.is_none() => ("Pending", false, Some(("Init:CrashLoopBackOff", e.clone()))),
            (Some(e), _) => ("Running", false, Some(("CrashLoopBackOff", e.clone()))),
            (None, Process::Crashed(e)) => ("Running", false, Some(("CrashLoopBackOff", e.clone()))),
            (None, Process::Running(_)) => ("Running", true, None),
            (None, Process::Starting) => ("Pending", false, None),
        };
        let restarts = o.process_failures + o.manager_failures + o.restarts;
        let state = match waiting {
            Some((reason, message)) => json!({"waiting": {"reason": reason, "message": message}}),
            None if phase == "Running" => json!({"running": {"startedAt": super::setup::rfc3339_now()}}),
            None => json!({"waiting": {"reason": "PodInitializing"}}),
        };
        let status = json!({
            "phase": phase,
            "hostIP": "127.0.0.1",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": if ready { "True" } else { "False" }}
            ],
            "containerStatuses": [{"name": kind.container(), "image": "nvcr.io/nvidia/k8s-device-plugin:v0.18.1",
                                   "imageID": "", "ready": ready, "restartCount": restarts, "state": state}]
        });
        self.writes.push(Write::PodStatus {
            ns: self.spec.operator_namespace.clone(),
            name: pod.to_string(),
            status,
        });
    }

    // ----- MIG manager (mig-parted v0.13.1 pkg/mig/reconfigure/reconfigure.go `Run`) -----

    /// `nvidia-mig-parted assert`: every GPU matching the layout's device filter is in
    /// the layout (a layout no GPU matches fails the assert, F4).
    fn mig_asserts(&self, layout: &str) -> bool {
        let Some((filter, profile)) = gpu::mig_layout(layout) else {
            return false;
        };
        if !filter.is_empty() && !filter.contains(&self.spec.gpu.pci_device_id) {
            return false;
        }
        self.gpu_state.mig.as_ref().map(|(p, _)| p.as_str()) == profile
    }

    /// The MIG manager's loop handles one label value at a time: a value that arrives
    /// during a run waits for it (`main.go`: `migConfig.Get()` then `reconfigure`), and
    /// the latest value is what runs next.
    pub(super) fn mig_start(&mut self, layout: String) {
        if self.mig != MigRun::Idle {
            self.mig_queued = true;
            return;
        }
        if self.label(MIG_LABEL).as_deref() != Some(layout.as_str()) {
            return; // superseded
        }
        // `assert --valid-config`: the name must exist in the mig-parted config.
        if gpu::mig_layout(&layout).is_none() {
            self.note(format!("mig-manager: {layout} is not in the mig-parted config: failed"));
            self.set_labels("nvidia-mig-manager", &[(MIG_STATE, Some("failed".into()))]);
            return;
        }
        // Already applied: success at once, no `pending` (step 3).
        if self.mig_asserts(&layout) {
            self.set_labels("nvidia-mig-manager", &[(MIG_STATE, Some("success".into()))]);
            return;
        }
        self.mig_seq += 1;
        let id = self.mig_seq;
        // Step 6 comes after validation and persisting: until then the old state shows.
        let d = self.spec.timings.mig_validate;
        self.mig = MigRun::WaitOperands {
            layout,
            since: self.now + d,
            id,
        };
        self.at(d, Due::MigStep(id));
    }

    /// A run ended: the value that arrived meanwhile is next.
    fn mig_done(&mut self) {
        self.mig = MigRun::Idle;
        if std::mem::take(&mut self.mig_queued)
            && let Some(v) = self.label(MIG_LABEL).filter(|v| !v.is_empty())
        {
            self.at(0.0, Due::MigLabel(v));
        }
    }

    pub(super) fn mig_step(&mut self, id: u64) {
        match self.mig.clone() {
            MigRun::WaitOperands { layout, since, id: run } if run == id => {
                if self.label(MIG_STATE).as_deref() != Some("pending") {
                    self.note(format!("mig-manager: applying {layout}: pending"));
                    let mut changes: Vec<(&str, Option<String>)> = vec![(MIG_STATE, Some("pending".into()))];
                    for k in DEPLOY_PAUSED {
                        if self.label(k).as_deref() != Some("false") {
                            changes.push((k, Some(PAUSED.into())));
                        }
                    }
                    self.set_labels("nvidia-mig-manager", &changes);
                }
                let gone = !self
                    .operands
                    .iter()
                    .any(|o| matches!(o.kind, OperandKind::Plugin | OperandKind::Gfd));
                if gone {
                    self.mig = MigRun::ModeChange { layout, id };
                    self.at(0.0, Due::MigStep(id));
                } else if self.now - since > 300.0 {
                    // Timeout: returns without a state; the node stays pending, paused.
                    self.note(
                        "mig-manager: operand pods did not go within 5 min; giving up (state stays pending)".into(),
                    );
                    self.mig = MigRun::Idle;
                } else {
                    self.at(1.0, Due::MigStep(id));
                }
            }
            MigRun::ModeChange { layout, id: run } if run == id => {
                let busy = self.pods.values().any(|p| p.device.is_some());
                let (_, profile) = gpu::mig_layout(&layout).unwrap_or_default();
                let want_enabled = profile.is_some();
                if want_enabled != self.gpu_state.mig.is_some() && busy {
                    // The mode change fails on a GPU in use (F3); without reboot the
                    // run goes on to apply, which fails too.
                    self.mig_fail(&format!("{layout}: GPU in use by workload pods"));
                    return;
                }
                let d = if want_enabled != self.gpu_state.mig.is_some() {
                    self.spec.timings.mig_mode
                } else {
                    0.0
                };
                self.mig = MigRun::Apply { layout, id };
                self.at(d, Due::MigStep(id));
            }
            MigRun::Apply { layout, id: run } if run == id => {
                let (filter, profile) = gpu::mig_layout(&layout).unwrap_or_default();
                let matches = filter.is_empty() || filter.contains(&self.spec.gpu.pci_device_id);
                if matches {
                    match profile {
                        None => self.gpu_state.mig = None,
                        Some(p) => {
                            let Some(count) = self
                                .spec
                                .gpu
                                .mig_profiles
                                .iter()
                                .find(|(name, _)| name == p)
                                .map(|(_, c)| *c)
                            else {
                                self.mig_fail(&format!(
                                    "error setting MIGConfig: profile {p} is not supported by this GPU"
                                ));
                                return;
                            };
                            self.gpu_state.mig = Some((p.to_string(), count));
                        }
                    }
                }
                // F4: no matching entry → nothing applied, yet success.
                self.note(format!(
                    "mig-manager: {layout} applied (GPUs now {:?}): success",
                    self.gpu_state.mig
                ));
                let mut changes: Vec<(&str, Option<String>)> = Vec::new();
                for k in DEPLOY_PAUSED {
                    if self.label(k).as_deref() == Some(PAUSED) {
                        changes.push((k, Some("true".into())));
                    }
                }
                changes.push((MIG_STATE, Some("success".into())));
                self.mig_no_restart = true;
                self.set_labels("nvidia-mig-manager", &changes);
                self.mig_done();
            }
            _ => {}
        }
    }

    fn mig_fail(&mut self, why: &str) {
        self.note(format!("mig-manager: {why}: failed"));
        let mut changes: Vec<(&str, Option<String>)> = Vec::new();
        if !self.mig_no_restart {
            for k in DEPLOY_PAUSED {
                if self.label(k).as_deref() == Some(PAUSED) {
                    changes.push((k, Some("true".into())));
                }
            }
        }
        changes.push((MIG_STATE, Some("failed".into())));
        self.set_labels("nvidia-mig-manager", &changes);
        self.mig_done();
    }
}
