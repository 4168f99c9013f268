//! An isolation trial's pods on Kubernetes (pure): the victim runs as its own
//! Deployment, the aggressors (whose arguments are the same) as another, and each
//! Kubernetes pod is given the trial's name for it (`victim`, `aggressor-1`, …) the first
//! time it is seen, so a name keeps meaning the same pod while the trial lasts.
//!
//! A container that exits (a fault, a crash, out of memory) is restarted in its pod by
//! the kubelet (`restartPolicy: Always`, k8s-sim/UPSTREAM-RULES.md I2), so the pod keeps its
//! name; its state shows the exit until the runner asks for the pod again, and from
//! then on it is running once a new container is ready.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;

use super::base::{KubeSettings, kube_error, pod_state};
use super::objects::{self, METRICS_PORT};
use crate::backend::{Pod as CellPod, PodSpec, PodState};
use crate::error::{BenchError, Result};
use crate::shutdown::{EndsOn, Shutdown};

/// The trial launched on the node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrialCell {
    /// Its pods' specs, the victim first.
    pub specs: Vec<PodSpec>,
    /// Kubernetes pod name → the trial's name for it (given when first seen).
    pub names: BTreeMap<String, String>,
    /// Trial names started again after an exit, with the restart count of the first
    /// container started after it: that container is running once it is ready, and
    /// any exit from it on is an exit again.
    pub relaunched: BTreeMap<String, u32>,
}

/// One Deployment of a trial.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    /// Its role ([`objects::ROLES`]).
    pub role: &'static str,
    /// Its pods.
    pub replicas: u32,
    /// Their extra arguments.
    pub args: Vec<String>,
    /// They run gpushare-workload's image even where the run's pods are a server of
    /// the user's own ([`PodSpec::builtin`]).
    pub builtin: bool,
}

/// The Deployments a trial is made of (pure), the victim's first. The aggressors share
/// one Deployment, so their arguments (and what they run) must agree.
pub fn deployments(specs: &[PodSpec]) -> Result<Vec<Part>> {
    let Some((victim, aggressors)) = specs.split_first() else {
        return Err(BenchError::kube("internal: an isolation trial without pods"));
    };
    let mut out = vec![Part {
        role: objects::ROLES[0],
        replicas: 1,
        args: victim.args.clone(),
        builtin: victim.builtin,
    }];
    if let Some(first) = aggressors.first() {
        if let Some(other) = aggressors
            .iter()
            .find(|a| a.args != first.args || a.builtin != first.builtin)
        {
            return Err(BenchError::Spawn {
                pod: other.name.clone(),
                reason: format!(
                    "the Kubernetes backend runs a trial's aggressors as one Deployment, so their arguments must be the same ({} has {:?}, {} has {:?})",
                    first.name, first.args, other.name, other.args
                ),
            });
        }
        out.push(Part {
            role: objects::ROLES[1],
            replicas: aggressors.len() as u32,
            args: first.args.clone(),
            builtin: first.builtin,
        });
    }
    Ok(out)
}

fn role_of(pod: &Pod) -> Option<&str> {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(objects::ROLE_LABEL))
        .map(String::as_str)
}

fn failed(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")
}

/// The pod's container: its restart count and whether it runs now.
fn container(pod: &Pod) -> (u32, bool) {
    let cs = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|v| v.first());
    let restarts = cs.map_or(0, |c| u32::try_from(c.restart_count).unwrap_or(0));
    let running = cs.and_then(|c| c.state.as_ref()).is_some_and(|s| s.running.is_some());
    (restarts, running)
}

fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The restart count of the first container started after an exit was seen (pure):
/// the running one if the kubelet has restarted it already, else the next.
pub fn next_container(pod: &Pod) -> u32 {
    let (restarts, running) = container(pod);
    if running { restarts } else { restarts + 1 }
}

/// A restarted pod's state (pure): the container counted from `first` is running once
/// ready; an exit of it or of a later one is an exit again (with its code); an older
/// container still shown is a start under way.
fn state_after_restart(pod: &Pod, first: u32) -> PodState {
    match container(pod) {
        (n, true) if n == first => {
            if ready(pod) {
                PodState::Running
            } else {
                PodState::Starting
            }
        }
        (n, _) if n >= first => pod_state(pod),
        _ => PodState::Starting,
    }
}

/// One part's Deployment of a trial of `pods` pods under `arm` (pure): its name, the
/// object (what it runs: the run's pods, or gpushare-workload beside a server of the
/// user's own), and how to name it in an error.
pub fn part_deployment(
    s: &KubeSettings,
    arm: crate::domain::Arm,
    resource: &str,
    part: &Part,
    pods: u32,
) -> (String, serde_json::Value, String) {
    let runs = if part.builtin {
        s.builtin_workload()
    } else {
        s.workload.clone()
    };
    let object = objects::role_deployment(
        &runs,
        arm.strategy,
        resource,
        part.role,
        part.replicas,
        pods,
        &part.args,
    );
    let what = format!(
        "{} × {} in a trial of {pods} under {}",
        part.role,
        part.replicas,
        arm.name()
    );
    (objects::role_deployment_name(part.role), object, what)
}

/// Marks the trial's pod `name` as started again (pure): the kubelet restarts an exited
/// container in its pod and a ReplicaSet replaces a failed pod (k8s-sim/UPSTREAM-RULES.md I2),
/// so from now on the pod counts as running only once a container of it is ready again.
pub fn relaunch(trial: Option<&mut TrialCell>, name: &str, pods: &[Pod]) -> Result<()> {
    let Some(t) = trial.filter(|t| t.specs.iter().any(|s| s.name == name)) else {
        return Err(BenchError::Spawn {
            pod: name.into(),
            reason: "it is not a pod of the running isolation trial".into(),
        });
    };
    t.name_pods(pods);
    let next = t.pod_of(name, pods).map_or(0, next_container);
    t.relaunched.insert(name.to_string(), next);
    Ok(())
}

impl TrialCell {
    /// A trial of these pods.
    pub fn new(specs: &[PodSpec]) -> Self {
        Self {
            specs: specs.to_vec(),
            ..Self::default()
        }
    }

    /// Gives each pod not yet named a trial name: a victim pod is the victim (a
    /// replacement takes over), an aggressor pod the first aggressor name that has no
    /// live pod (a replacement of a failed one takes its name); a pod left over stays
    /// nameless. `pods` are the trial's pods, not terminating.
    pub fn name_pods(&mut self, pods: &[Pod]) {
        let mut sorted: Vec<&Pod> = pods.iter().collect();
        sorted.sort_by(|a, b| {
            (&a.metadata.creation_timestamp, &a.metadata.name).cmp(&(&b.metadata.creation_timestamp, &b.metadata.name))
        });
        for pod in sorted {
            let Some(k8s) = pod.metadata.name.clone() else { continue };
            if self.names.contains_key(&k8s) {
                continue;
            }
            let name = match role_of(pod) {
                Some(r) if r == objects::ROLES[0] => self.specs.first().map(|s| s.name.clone()),
                Some(r) if r == objects::ROLES[1] => self.specs.iter().skip(1).map(|s| s.name.clone()).find(|n| {
                    !pods
                        .iter()
                        .any(|p| !failed(p) && p.metadata.name.as_ref().and_then(|k| self.names.get(k)) == Some(n))
                }),
                _ => None,
            };
            if let Some(name) = name {
                self.names.insert(k8s, name);
            }
        }
    }

    /// The pod playing `name` now: its newest pod that has not failed, else its newest.
    pub fn pod_of<'a>(&self, name: &str, pods: &'a [Pod]) -> Option<&'a Pod> {
        let mine: Vec<&Pod> = pods
            .iter()
            .filter(|p| {
                p.metadata
                    .name
                    .as_ref()
                    .and_then(|k| self.names.get(k))
                    .map(String::as_str)
                    == Some(name)
            })
            .collect();
        let newest = |v: &[&'a Pod]| v.iter().max_by_key(|p| p.metadata.creation_timestamp.clone()).copied();
        let live: Vec<&Pod> = mine.iter().copied().filter(|p| !failed(p)).collect();
        newest(&live).or_else(|| newest(&mine))
    }

    /// The trial's pods as the runner sees them, one per spec in order (pure).
    pub fn cell_pods(&self, pods: &[Pod]) -> Vec<CellPod> {
        self.specs
            .iter()
            .map(|spec| {
                let pod = self.pod_of(&spec.name, pods);
                let metrics_url = pod
                    .and_then(|p| p.status.as_ref())
                    .and_then(|s| s.pod_ip.as_ref())
                    .map(|ip| format!("http://{ip}:{METRICS_PORT}/metrics"));
                let state = match pod {
                    None => PodState::Starting,
                    Some(p) => match self.relaunched.get(&spec.name) {
                        Some(&first) if !failed(p) => state_after_restart(p, first),
                        _ => pod_state(p),
                    },
                };
                CellPod {
                    name: spec.name.clone(),
                    metrics_url,
                    state,
                }
            })
            .collect()
    }
}

/// An isolation trial's pods in `pods`' namespace, not terminating.
pub async fn trial_pods(pods: &Api<Pod>) -> Result<Vec<Pod>> {
    let selector = format!("{}={},{}", objects::APP_LABEL, objects::APP, objects::ROLE_LABEL);
    let mut list = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| kube_error("listing the trial's pods", e))?
        .items;
    list.retain(|p| p.metadata.deletion_timestamp.is_none());
    Ok(list)
}

/// The trial's pods by the trial's names (each Kubernetes pod named when first seen).
pub async fn trial_cell_pods(pods: &Api<Pod>, t: &mut TrialCell) -> Result<Vec<CellPod>> {
    let list = trial_pods(pods).await?;
    t.name_pods(&list);
    Ok(t.cell_pods(&list))
}

/// Waits until the victim's pod is bound to the node, or cannot be (unschedulable,
/// rejected), at most `limit`: the scheduler takes pods of equal priority in the order
/// they entered its queue, which is not the order the ReplicaSets create them
/// (k8s-sim/UPSTREAM-RULES.md I1), so the aggressors are applied only after this.
pub async fn wait_victim_bound(pods: &Api<Pod>, s: &KubeSettings, limit: Duration, shutdown: &Shutdown) -> Result<()> {
    let mut wait = shutdown.poll(EndsOn::Request, s.poll, limit);
    loop {
        let list = shutdown.guard(trial_pods(pods)).await?;
        let decided = list.iter().any(|p| {
            let bound = p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
            bound || matches!(pod_state(p), PodState::Pending(_) | PodState::Exited { .. })
        });
        if decided {
            return Ok(());
        }
        if !wait.keep_waiting().await? {
            return Err(BenchError::Spawn {
                pod: "victim".into(),
                reason: format!(
                    "its pod was not bound to node {} within {} s, so the aggressors were not started (the scheduler could give them the GPU first)",
                    s.node,
                    limit.as_secs()
                ),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec(name: &str, args: &[&str]) -> PodSpec {
        PodSpec {
            name: name.into(),
            args: args.iter().map(|a| (*a).to_string()).collect(),
            group: "fault".into(),
            builtin: name != "victim",
        }
    }

    fn pod(name: &str, role: &str, created: &str, status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": { "name": name, "creationTimestamp": created, "labels": { objects::ROLE_LABEL: role } },
            "status": status
        }))
        .expect("pod")
    }

    fn running(ip: &str) -> serde_json::Value {
        json!({ "phase": "Running", "podIP": ip,
                "conditions": [{ "type": "Ready", "status": "True" }],
                "containerStatuses": [{ "name": "workload", "image": "x", "imageID": "", "ready": true, "restartCount": 0,
                                        "state": { "running": {} } }] })
    }

    #[test]
    fn the_aggressors_share_a_deployment_only_when_their_arguments_agree() {
        let specs = [
            spec("victim", &["--load", "poisson:50"]),
            spec("aggressor-1", &[]),
            spec("aggressor-2", &[]),
        ];
        let d = deployments(&specs).expect("deployments");
        let seen: Vec<_> = d
            .iter()
            .map(|p| (p.role, p.replicas, p.args.clone(), p.builtin))
            .collect();
        assert_eq!(
            seen,
            [
                ("victim", 1, vec!["--load".to_string(), "poisson:50".to_string()], false),
                ("aggressor", 2, Vec::<String>::new(), true)
            ]
        );
        assert_eq!(deployments(&specs[..1]).expect("alone").len(), 1);
        let odd = [
            spec("victim", &[]),
            spec("aggressor-1", &[]),
            spec("aggressor-2", &["--x"]),
        ];
        let err = deployments(&odd).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("aggressor-2") && err.contains("one Deployment"), "{err}");
        assert!(deployments(&[]).is_err());
    }

    #[test]
    fn names_stay_with_their_pods_and_a_replacement_takes_over_a_failed_one() {
        let specs = [spec("victim", &[]), spec("aggressor-1", &[]), spec("aggressor-2", &[])];
        let mut t = TrialCell::new(&specs);
        let pods = vec![
            pod(
                "w-aggressor-b",
                "aggressor",
                "2026-01-01T00:00:01Z",
                running("198.19.0.3"),
            ),
            pod(
                "w-aggressor-a",
                "aggressor",
                "2026-01-01T00:00:02Z",
                running("198.19.0.4"),
            ),
            pod("w-victim-x", "victim", "2026-01-01T00:00:00Z", running("198.19.0.2")),
        ];
        t.name_pods(&pods);
        let cell = t.cell_pods(&pods);
        let names: Vec<&str> = cell.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["victim", "aggressor-1", "aggressor-2"]);
        // The first created aggressor is aggressor-1, whatever the names' order.
        assert_eq!(cell[1].metrics_url.as_deref(), Some("http://198.19.0.3:9400/metrics"));
        assert!(cell.iter().all(|p| p.state == PodState::Running));
        // The second aggressor's pod failed and its ReplicaSet replaced it: the new pod
        // takes its name; the first keeps its own.
        let mut gone = pods[1].clone();
        gone.status.as_mut().expect("status").phase = Some("Failed".into());
        let after = vec![
            pods[0].clone(),
            gone,
            pods[2].clone(),
            pod(
                "w-aggressor-c",
                "aggressor",
                "2026-01-01T00:01:00Z",
                running("198.19.0.5"),
            ),
        ];
        t.name_pods(&after);
        let cell = t.cell_pods(&after);
        assert_eq!(cell[1].metrics_url.as_deref(), Some("http://198.19.0.3:9400/metrics"));
        assert_eq!(cell[2].metrics_url.as_deref(), Some("http://198.19.0.5:9400/metrics"));
        assert!(cell.iter().all(|p| p.state == PodState::Running), "{cell:?}");
    }

    /// The victim's pod, not ready, after its container exited with code 5: its
    /// container's restart count and state, and whether the exit is its last state.
    fn victim_after_exit(restarts: u32, state: serde_json::Value, last_exit: bool) -> Pod {
        let mut cs = json!({ "name": "workload", "image": "x", "imageID": "", "ready": false,
                             "restartCount": restarts, "state": state });
        if last_exit {
            cs["lastState"] = json!({ "terminated": { "exitCode": 5, "reason": "Error" } });
        }
        let status = json!({ "phase": "Running", "podIP": "198.19.0.2",
                             "conditions": [{ "type": "Ready", "status": "False" }],
                             "containerStatuses": [cs] });
        pod("w-victim-x", "victim", "2026-01-01T00:00:00Z", status)
    }

    #[test]
    fn a_restarted_victim_is_exited_until_started_again_then_running_once_ready() {
        let specs = [spec("victim", &[])];
        let mut t = TrialCell::new(&specs);
        let restarting = victim_after_exit(1, json!({ "running": {} }), true);
        let pods = vec![restarting.clone()];
        t.name_pods(&pods);
        assert!(matches!(
            t.cell_pods(&pods)[0].state,
            PodState::Exited { code: Some(5), .. }
        ));
        // Restarted already (running, restart 1): that container is the new one.
        assert_eq!(next_container(&restarting), 1);
        t.relaunched.insert("victim".into(), 1);
        assert_eq!(t.cell_pods(&pods)[0].state, PodState::Starting);
        let mut ready = restarting.clone();
        let status = ready.status.as_mut().expect("status");
        status.conditions.as_mut().expect("conditions")[0].status = "True".into();
        assert_eq!(t.cell_pods(std::slice::from_ref(&ready))[0].state, PodState::Running);
        // The new container exits too: an exit again, with its code, not a start.
        let again = victim_after_exit(1, json!({ "waiting": { "reason": "CrashLoopBackOff" } }), true);
        assert!(matches!(
            t.cell_pods(&[again])[0].state,
            PodState::Exited { code: Some(5), .. }
        ));
        // Seen before the kubelet restarted it (terminated, restart 0): the next one counts.
        let exited = victim_after_exit(0, json!({ "terminated": { "exitCode": 5, "reason": "Error" } }), false);
        assert_eq!(next_container(&exited), 1);
        assert_eq!(t.cell_pods(&[exited])[0].state, PodState::Starting);
    }

    #[test]
    fn a_victim_rejected_at_admission_is_replaced_by_its_replicaset() {
        let specs = [spec("victim", &[])];
        let mut t = TrialCell::new(&specs);
        let rejected = pod(
            "w-victim-a",
            "victim",
            "2026-01-01T00:00:00Z",
            json!({ "phase": "Failed", "reason": "UnexpectedAdmissionError", "message": "Allocate failed" }),
        );
        t.name_pods(std::slice::from_ref(&rejected));
        assert!(matches!(
            &t.cell_pods(std::slice::from_ref(&rejected))[0].state,
            PodState::Exited { code: None, detail } if detail.starts_with("UnexpectedAdmissionError")
        ));
        let pods = vec![
            rejected,
            pod("w-victim-b", "victim", "2026-01-01T00:00:05Z", running("198.19.0.9")),
        ];
        t.name_pods(&pods);
        let cell = t.cell_pods(&pods);
        assert_eq!(cell[0].state, PodState::Running);
        assert_eq!(cell[0].metrics_url.as_deref(), Some("http://198.19.0.9:9400/metrics"));
    }
}
