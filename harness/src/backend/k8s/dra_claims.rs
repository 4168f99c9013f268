//! Sharing one GPU through Dynamic Resource Allocation (`--sharing-api dra`): the
//! ResourceClaims a cell's pods reference and the NVIDIA DRA driver's opaque `GpuConfig`
//! in them (pure).
//!
//! The driver's config types are written from its Go API,
//! kubernetes-sigs/dra-driver-nvidia-gpu `api/nvidia.com/resource/v1beta1/`
//! (`gpuconfig.go`, `sharing.go`, `api.go`) at tag v0.4.1 (764900e78337); `main`
//! (95932046, 0.5.0-dev) has the same group, kinds, strategies and intervals. The claim
//! shapes are Kubernetes `resource.k8s.io/v1` (GA in 1.34).
//!
//! - exclusive: a ResourceClaimTemplate, so each pod gets a claim, and so a GPU, of its
//!   own (no `GpuConfig`: the driver applies no sharing);
//! - time-slicing and MPS: one ResourceClaim every pod of the cell references, so the
//!   scheduler allocates one GPU once and every pod shares it. Time-slicing with no
//!   `--timeslice` carries no config (the driver then changes nothing and the GPU's
//!   contexts are time-sliced as they are, which needs no feature gate); with one, a
//!   `GpuConfig` `TimeSlicing` with that interval (gate `TimeSlicingSettings`). MPS
//!   always carries a `GpuConfig` `MPS` (gate `MPSSupport`) with the thread percentage
//!   and pinned-memory limit the device-plugin path gives each of N pods.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub use crate::config::plan::DraSettings;
pub use crate::domain::TimeSliceInterval;
use crate::domain::{Arm, Strategy};

/// The driver's name, in ResourceSlices and in a claim's opaque config.
pub const DRIVER: &str = "gpu.nvidia.com";
/// The DeviceClass of whole GPUs the driver's chart installs (selector
/// `device.attributes['gpu.nvidia.com'].type == 'gpu'`).
pub const GPU_CLASS: &str = "gpu.nvidia.com";
/// The DeviceClass of MIG devices.
pub const MIG_CLASS: &str = "mig.nvidia.com";
/// `apiVersion` of the driver's opaque configs.
pub const CONFIG_API_VERSION: &str = "resource.nvidia.com/v1beta1";
/// `apiVersion` of claims, templates, DeviceClasses and ResourceSlices.
pub const RESOURCE_API: &str = "resource.k8s.io/v1";
/// The request name inside every claim and the claim's name inside the pod.
pub const REQUEST: &str = "gpu";
/// The driver release the types and rules were read from.
pub const DRIVER_VERSION_READ: &str = "v0.4.1";
/// The scheduler's reason for a pod whose claim finds no free device (J4: the DRA
/// plugin's Filter, `pkg/scheduler/framework/plugins/dynamicresources/`), in the pod's
/// `PodScheduled` condition: `0/1 nodes are available: 1 cannot allocate all claims.`
pub const NO_FREE_DEVICE: &str = "cannot allocate all claims";

/// The driver's `GpuConfig` (`gpuconfig.go`); unknown fields are refused by its strict
/// decoder, so the harness writes only these.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuConfig {
    /// `resource.nvidia.com/v1beta1`.
    pub api_version: String,
    /// `GpuConfig`.
    pub kind: String,
    /// None: no sharing settings (the driver's default config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<GpuSharing>,
}

/// `GpuSharing` (`sharing.go`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuSharing {
    /// `TimeSlicing` or `MPS`.
    pub strategy: SharingStrategy,
    /// Only with `TimeSlicing` (the driver refuses it beside `MPS` when applying).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slicing_config: Option<TimeSlicingConfig>,
    /// Only with `MPS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_config: Option<MpsConfig>,
}

/// `GpuSharingStrategy` (`sharing.go`: `TimeSlicingStrategy`, `MpsStrategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SharingStrategy {
    /// `TimeSlicing`.
    TimeSlicing,
    /// `MPS`.
    #[serde(rename = "MPS")]
    Mps,
}

/// `TimeSlicingConfig` (`sharing.go`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TimeSlicingConfig {
    /// Always written: the driver's `Validate` dereferences a missing interval.
    #[serde(with = "driver_interval")]
    pub interval: TimeSliceInterval,
}

/// `TimeSliceInterval` (`sharing.go`) as the driver spells it in a config
/// (`Default`, `Short`, `Medium`, `Long`); the harness's records spell it as the flag.
mod driver_interval {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::domain::TimeSliceInterval;

    pub fn serialize<S: Serializer>(t: &TimeSliceInterval, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(t.driver_name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<TimeSliceInterval, D::Error> {
        let text = String::deserialize(d)?;
        TimeSliceInterval::ALL
            .into_iter()
            .find(|t| t.driver_name() == text)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown time-slice interval {text:?}")))
    }
}

/// `MpsConfig` (`sharing.go`): limits the driver's per-claim MPS control daemon sets as
/// its defaults for every client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MpsConfig {
    /// `set_default_active_thread_percentage` (0 to 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_active_thread_percentage: Option<u32>,
    /// `set_default_device_pinned_mem_limit` for every GPU of the claim (a Kubernetes
    /// quantity, e.g. `26Gi`; the driver rounds it down to whole MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_pinned_device_memory_limit: Option<String>,
}

/// How a cell's pods get their GPU through claims.
#[derive(Debug, Clone, PartialEq)]
pub enum CellClaims {
    /// A ResourceClaimTemplate: one claim, and one GPU, per pod.
    PerPod,
    /// A ResourceClaimTemplate: one claim per pod for a MIG device of the driver's
    /// `mig.nvidia.com` class, of this profile (None: not known yet, e.g. in a dry run).
    /// No config: the driver refuses a `GpuConfig` on a MIG device.
    Mig(Option<String>),
    /// One ResourceClaim all the cell's pods reference, with this config (None: none).
    Shared(Option<GpuConfig>),
}

/// The `GpuConfig` with these sharing settings.
fn gpu_config(sharing: GpuSharing) -> GpuConfig {
    GpuConfig {
        api_version: CONFIG_API_VERSION.into(),
        kind: "GpuConfig".into(),
        sharing: Some(sharing),
    }
}

/// A memory amount as a quantity in whole MiB (`26624Mi`).
pub fn mebibytes(bytes: u64) -> String {
    format!("{}Mi", bytes >> 20)
}

/// What the node's ResourceSlices say that a cell's claims depend on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeDevices {
    /// The whole GPU's memory (for MPS's default pinned-memory limit).
    pub memory_bytes: Option<u64>,
    /// The MIG profile MIG cells ask for: the node's most common one.
    pub mig_profile: Option<String>,
}

/// The claims of a cell of `pods` pods of `arm` (its strategy, and time-slicing's
/// interval) on a node whose slices publish `node`.
pub fn cell_claims(arm: impl Into<Arm>, pods: u32, node: &NodeDevices) -> CellClaims {
    let arm = arm.into();
    let gpu_memory_bytes = node.memory_bytes;
    // The device plugin's replicas for the cell: 100/replicas of the SMs and memory each.
    let replicas = super::objects::sharing_replicas(pods);
    match arm.strategy {
        Strategy::Exclusive => CellClaims::PerPod,
        Strategy::Mig => CellClaims::Mig(node.mig_profile.clone()),
        Strategy::TimeSlicing => CellClaims::Shared(arm.timeslice.map(|interval| {
            gpu_config(GpuSharing {
                strategy: SharingStrategy::TimeSlicing,
                time_slicing_config: Some(TimeSlicingConfig { interval }),
                mps_config: None,
            })
        })),
        Strategy::Mps => CellClaims::Shared(Some(gpu_config(GpuSharing {
            strategy: SharingStrategy::Mps,
            time_slicing_config: None,
            mps_config: Some(MpsConfig {
                default_active_thread_percentage: Some(arm.mps.threads.percent(replicas)),
                default_pinned_device_memory_limit: arm
                    .mps
                    .memory
                    .mebibytes(replicas, gpu_memory_bytes)
                    .map(|m| mebibytes(m << 20)),
            }),
        }))),
    }
}

/// The name of a cell's claim or claim template (`gpushare-mps-3`,
/// `gpushare-time-slicing-short-3`).
pub fn claim_name(arm: impl Into<Arm>, pods: u32) -> String {
    format!("gpushare-{}-{pods}", arm.into().name())
}

/// The CEL selector of a MIG device of `profile`, as the driver's quickstart writes it
/// (`demo/specs/quickstart/v1/gpu-test4.yaml` at v0.4.1; the attribute is set in
/// `cmd/gpu-kubelet-plugin/mig.go` `CommonAttributesMig`).
pub fn mig_selector(profile: &str) -> String {
    format!("device.attributes['{DRIVER}'].profile == '{profile}'")
}

/// One request for a whole GPU of the driver's class.
fn devices(config: Option<&GpuConfig>) -> Value {
    let mut d = json!({
        "requests": [{ "name": REQUEST, "exactly": { "deviceClassName": GPU_CLASS, "allocationMode": "ExactCount", "count": 1 } }]
    });
    if let Some(c) = config {
        d["config"] = json!([{ "requests": [REQUEST], "opaque": { "driver": DRIVER, "parameters": c } }]);
    }
    d
}

fn labels(arm: Arm, pods: u32) -> Value {
    json!({
        super::objects::APP_LABEL: super::objects::APP,
        super::objects::CELL_LABEL: format!("{}-{pods}", arm.name()),
        "app.kubernetes.io/part-of": "gpushare-bench"
    })
}

/// The cell's claim object: a ResourceClaimTemplate (per pod) or a ResourceClaim
/// (shared), named [`claim_name`].
pub fn claim_object(ns: &str, arm: impl Into<Arm>, pods: u32, claims: &CellClaims) -> Value {
    let arm = arm.into();
    let metadata = json!({ "name": claim_name(arm, pods), "namespace": ns, "labels": labels(arm, pods) });
    match claims {
        CellClaims::PerPod => json!({
            "apiVersion": RESOURCE_API,
            "kind": "ResourceClaimTemplate",
            "metadata": metadata,
            "spec": { "spec": { "devices": devices(None) } }
        }),
        CellClaims::Mig(profile) => {
            let mut request = json!({ "name": REQUEST, "exactly": { "deviceClassName": MIG_CLASS, "allocationMode": "ExactCount", "count": 1 } });
            if let Some(p) = profile {
                request["exactly"]["selectors"] = json!([{ "cel": { "expression": mig_selector(p) } }]);
            }
            json!({
                "apiVersion": RESOURCE_API,
                "kind": "ResourceClaimTemplate",
                "metadata": metadata,
                "spec": { "spec": { "devices": { "requests": [request] } } }
            })
        }
        CellClaims::Shared(config) => json!({
            "apiVersion": RESOURCE_API,
            "kind": "ResourceClaim",
            "metadata": metadata,
            "spec": { "devices": devices(config.as_ref()) }
        }),
    }
}

/// Turns a workload Deployment's pods to the cell's claim: `spec.resourceClaims` names
/// it (the template or the shared claim), the container uses it, the device plugin's
/// extended resource is no longer requested, and the pods' cell label names the arm.
pub fn use_claim(deployment: &mut Value, arm: impl Into<Arm>, pods: u32, claims: &CellClaims) {
    let arm = arm.into();
    let name = claim_name(arm, pods);
    // The pods' cell label names the arm, as the claim's does (`time-slicing-short-3`).
    deployment["spec"]["template"]["metadata"]["labels"][super::objects::CELL_LABEL] =
        json!(format!("{}-{pods}", arm.name()));
    let pod = &mut deployment["spec"]["template"]["spec"];
    pod["resourceClaims"] = match claims {
        CellClaims::PerPod | CellClaims::Mig(_) => json!([{ "name": REQUEST, "resourceClaimTemplateName": name }]),
        CellClaims::Shared(_) => json!([{ "name": REQUEST, "resourceClaimName": name }]),
    };
    let resources = &mut pod["containers"][0]["resources"];
    for part in ["requests", "limits"] {
        if let Some(map) = resources[part].as_object_mut() {
            map.retain(|k, _| !k.starts_with("nvidia.com/"));
        }
    }
    resources["claims"] = json!([{ "name": REQUEST }]);
}

/// The MPS limits a shared MPS claim gives each of its `pods` clients, in the words of
/// an isolation record's `mps_split` (None: not an MPS claim).
pub fn mps_split(claims: &CellClaims, pods: u32) -> Option<String> {
    let CellClaims::Shared(Some(GpuConfig {
        sharing: Some(GpuSharing {
            mps_config: Some(m), ..
        }),
        ..
    })) = claims
    else {
        return None;
    };
    let threads = m
        .default_active_thread_percentage
        .map_or_else(|| "the driver's default share".into(), |p| format!("{p}%"));
    let memory = m
        .default_pinned_device_memory_limit
        .as_deref()
        .map_or_else(|| "no pinned-memory limit".into(), |l| format!("{l} pinned"));
    Some(format!(
        "{threads} of the SMs and {memory} per client ({pods} client{}, the claim's GpuConfig)",
        if pods == 1 { "" } else { "s" }
    ))
}

/// What a cell's claim gives each pod, for its row's note.
pub fn describe(claims: &CellClaims) -> String {
    match claims {
        CellClaims::PerPod => "DRA: a claim (and a GPU) per pod, no sharing config".into(),
        CellClaims::Mig(Some(p)) => format!("DRA: a claim per pod for a MIG device of profile {p} (class {MIG_CLASS})"),
        CellClaims::Mig(None) => format!(
            "DRA: a claim per pod for a MIG device (class {MIG_CLASS}) of the profile the node's ResourceSlices publish most of"
        ),
        CellClaims::Shared(None) => {
            "DRA: one shared claim, no GpuConfig (the GPU's contexts time-sliced as the node has it)".into()
        }
        CellClaims::Shared(Some(c)) => match c.sharing.as_ref() {
            Some(GpuSharing {
                time_slicing_config: Some(t),
                ..
            }) => format!(
                "DRA: one shared claim, GpuConfig TimeSlicing interval {}",
                t.interval.driver_name()
            ),
            Some(GpuSharing {
                mps_config: Some(m), ..
            }) => format!(
                "DRA: one shared claim, GpuConfig MPS ({}% of the threads, pinned memory {} per client)",
                m.default_active_thread_percentage
                    .map_or_else(|| "default".into(), |p| p.to_string()),
                m.default_pinned_device_memory_limit.as_deref().unwrap_or("unlimited")
            ),
            _ => "DRA: one shared claim".into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_is_a_claim_per_pod_for_a_mig_device_of_the_nodes_profile() {
        let node = NodeDevices {
            mig_profile: Some("1g.10gb".into()),
            ..NodeDevices::default()
        };
        let claims = cell_claims(Strategy::Mig, 7, &node);
        assert_eq!(claims, CellClaims::Mig(Some("1g.10gb".into())));
        let t = claim_object("ns", Strategy::Mig, 7, &claims);
        assert_eq!(t["kind"], "ResourceClaimTemplate");
        assert_eq!(
            t["spec"]["spec"]["devices"],
            json!({"requests": [{"name": "gpu", "exactly": {"deviceClassName": "mig.nvidia.com", "allocationMode": "ExactCount", "count": 1,
                "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}}]}}]}),
            "the driver's quickstart form (gpu-test4.yaml), no config"
        );
        assert!(describe(&claims).contains("MIG device of profile 1g.10gb"));
    }

    #[test]
    fn exclusive_is_a_claim_per_pod_and_sharing_one_claim_for_all() {
        assert_eq!(
            cell_claims(Strategy::Exclusive, 3, &NodeDevices::default()),
            CellClaims::PerPod
        );
        assert_eq!(
            cell_claims(Strategy::TimeSlicing, 3, &NodeDevices::default()),
            CellClaims::Shared(None)
        );
        let t = claim_object("ns", Strategy::Exclusive, 1, &CellClaims::PerPod);
        assert_eq!(t["kind"], "ResourceClaimTemplate");
        assert_eq!(t["metadata"]["name"], "gpushare-exclusive-1");
        assert_eq!(
            t["spec"]["spec"]["devices"]["requests"][0],
            json!({"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}})
        );
        assert!(t["spec"]["spec"]["devices"]["config"].is_null());
    }

    #[test]
    fn gpu_config_is_the_drivers_shape() {
        // The driver's own examples (demo/specs/quickstart/v1/gpu-test5.yaml; README's
        // MPS example), as JSON.
        let long = Arm {
            timeslice: Some(TimeSliceInterval::Long),
            ..Arm::of(Strategy::TimeSlicing)
        };
        let CellClaims::Shared(Some(c)) = cell_claims(long, 3, &NodeDevices::default()) else {
            panic!("a config")
        };
        assert_eq!(
            serde_json::to_value(&c).expect("json"),
            json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                   "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}})
        );
        // MPS defaults to the device plugin's split: 100/replicas and memory/replicas,
        // replicas at least 2.
        let gib80 = 80u64 << 30;
        let mem = NodeDevices {
            memory_bytes: Some(gib80),
            ..NodeDevices::default()
        };
        let one = cell_claims(Strategy::Mps, 1, &mem);
        let three = cell_claims(Strategy::Mps, 3, &mem);
        let obj = claim_object("ns", Strategy::Mps, 3, &three);
        assert_eq!(obj["kind"], "ResourceClaim");
        assert_eq!(
            obj["spec"]["devices"]["config"][0],
            json!({"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 33,
                            "defaultPinnedDeviceMemoryLimit": "27306Mi"}}}}})
        );
        let CellClaims::Shared(Some(c1)) = one else {
            panic!("a config")
        };
        let m = c1.sharing.and_then(|s| s.mps_config).expect("mps");
        assert_eq!(m.default_active_thread_percentage, Some(50));
        assert_eq!(m.default_pinned_device_memory_limit.as_deref(), Some("40960Mi"));
        // The arm's limits win; an unknown memory leaves auto's limit out, as does none.
        let arm = |threads, memory| crate::domain::Arm {
            mps: crate::domain::MpsLimits { threads, memory },
            ..crate::domain::Arm::of(Strategy::Mps)
        };
        let limits = |a, node: &NodeDevices| {
            let CellClaims::Shared(Some(c)) = cell_claims(a, 7, node) else {
                panic!("a config")
            };
            let m = c.sharing.and_then(|s| s.mps_config).expect("mps");
            (m.default_active_thread_percentage, m.default_pinned_device_memory_limit)
        };
        use crate::domain::{MpsMemory, MpsThreads};
        assert_eq!(
            limits(arm(MpsThreads::Percent(20), MpsMemory::Auto), &NodeDevices::default()),
            (Some(20), None)
        );
        assert_eq!(
            limits(arm(MpsThreads::Percent(100), MpsMemory::Unlimited), &mem),
            (Some(100), None)
        );
        assert_eq!(
            limits(arm(MpsThreads::Auto, MpsMemory::Mebibytes(20480)), &mem),
            (Some(14), Some("20480Mi".into()))
        );
        // The driver's strict decoder refuses unknown fields; so do these types.
        let e = serde_json::from_value::<GpuConfig>(json!({"apiVersion": "a", "kind": "GpuConfig", "sharng": {}}))
            .expect_err("unknown field");
        assert!(e.to_string().contains("unknown field `sharng`"), "{e}");
    }

    #[test]
    fn pods_reference_the_cells_claim_instead_of_the_extended_resource() {
        let spec = super::super::objects::WorkloadSpec {
            namespace: "ns".into(),
            image: "img".into(),
            node: "gpu-1".into(),
            args: Vec::new(),
            tolerations: Vec::new(),
            pull_secrets: Vec::new(),
            server: None,
        };
        let mut d = super::super::objects::deployment(&spec, Strategy::Mps, 3, "nvidia.com/gpu", &[]);
        let shared = cell_claims(Strategy::Mps, 3, &NodeDevices::default());
        use_claim(&mut d, Strategy::Mps, 3, &shared);
        let pod = &d["spec"]["template"]["spec"];
        assert_eq!(
            pod["resourceClaims"],
            json!([{"name": "gpu", "resourceClaimName": "gpushare-mps-3"}])
        );
        let r = &pod["containers"][0]["resources"];
        assert_eq!(r["claims"], json!([{"name": "gpu"}]));
        assert!(r["limits"].get("nvidia.com/gpu").is_none() && r["requests"].get("nvidia.com/gpu").is_none());
        assert_eq!(r["requests"]["cpu"], "1", "the rest of the requests stay");
        let mut e = super::super::objects::deployment(&spec, Strategy::Exclusive, 2, "nvidia.com/gpu", &[]);
        use_claim(&mut e, Strategy::Exclusive, 2, &CellClaims::PerPod);
        assert_eq!(
            e["spec"]["template"]["spec"]["resourceClaims"],
            json!([{"name": "gpu", "resourceClaimTemplateName": "gpushare-exclusive-2"}])
        );
    }

    #[test]
    fn each_interval_is_its_own_claim_spelled_as_the_driver_spells_it() {
        let short = Arm {
            timeslice: Some(TimeSliceInterval::Short),
            ..Arm::of(Strategy::TimeSlicing)
        };
        let claims = cell_claims(short, 3, &NodeDevices::default());
        assert_eq!(
            describe(&claims),
            "DRA: one shared claim, GpuConfig TimeSlicing interval Short"
        );
        let obj = claim_object("ns", short, 3, &claims);
        assert_eq!(obj["metadata"]["name"], "gpushare-time-slicing-short-3");
        assert_eq!(
            obj["spec"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"]["timeSlicingConfig"],
            json!({"interval": "Short"})
        );
        // The driver's spelling reads back; the flag's does not.
        let back: TimeSlicingConfig = serde_json::from_value(json!({"interval": "Medium"})).expect("driver's spelling");
        assert_eq!(back.interval, TimeSliceInterval::Medium);
        assert!(serde_json::from_value::<TimeSlicingConfig>(json!({"interval": "medium"})).is_err());
    }
}
