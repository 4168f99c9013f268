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

use crate::domain::Strategy;

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
    pub interval: TimeSliceInterval,
}

/// `TimeSliceInterval` (`sharing.go`): the driver runs `nvidia-smi compute-policy
/// --set-timeslice` with 0 to 3 for these on the claim's GPU at prepare and back to 0
/// at unprepare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TimeSliceInterval {
    /// `Default` (0).
    Default,
    /// `Short` (1).
    Short,
    /// `Medium` (2).
    Medium,
    /// `Long` (3).
    Long,
}

impl TimeSliceInterval {
    /// Every interval, shortest setting first as the driver numbers them.
    pub const ALL: [TimeSliceInterval; 4] = [Self::Default, Self::Short, Self::Medium, Self::Long];

    /// The flag's spelling (`default`, `short`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::Short => "short",
            Self::Medium => "medium",
            Self::Long => "long",
        }
    }
}

impl std::str::FromStr for TimeSliceInterval {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|i| i.name() == s)
            .ok_or_else(|| "expected default, short, medium or long (the DRA driver's time-slice intervals)".into())
    }
}

impl std::fmt::Display for TimeSliceInterval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
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

/// What a DRA sweep may set beyond the strategy (`--timeslice`, `--mps-thread-percentage`,
/// `--mps-memory-limit`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DraSettings {
    /// Time-slicing's interval (None: a shared claim without config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeslice: Option<TimeSliceInterval>,
    /// MPS: each client's share of the SMs, percent (None: 100 / the device plugin's
    /// replicas for the cell, as `--sharing-api device-plugin` gives).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_thread_percentage: Option<u32>,
    /// MPS: each client's pinned device memory, a quantity (None: the GPU's memory /
    /// the replicas, when the ResourceSlice publishes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_memory_limit: Option<String>,
}

/// How a cell's pods get their GPU through claims.
#[derive(Debug, Clone, PartialEq)]
pub enum CellClaims {
    /// A ResourceClaimTemplate: one claim, and one GPU, per pod.
    PerPod,
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

/// The claims of a cell of `pods` pods under `strategy`; `gpu_memory_bytes` is the
/// GPU's memory as its ResourceSlice publishes it (for MPS's default memory limit).
/// MIG is not planned here (the driver's MIG devices need a class and layout of their
/// own).
pub fn cell_claims(strategy: Strategy, pods: u32, s: &DraSettings, gpu_memory_bytes: Option<u64>) -> CellClaims {
    // The device plugin's replicas for the cell: 100/replicas of the SMs and memory each.
    let replicas = super::objects::sharing_replicas(pods);
    match strategy {
        Strategy::Exclusive | Strategy::Mig => CellClaims::PerPod,
        Strategy::TimeSlicing => CellClaims::Shared(s.timeslice.map(|interval| {
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
                default_active_thread_percentage: Some(s.mps_thread_percentage.unwrap_or(100 / replicas)),
                default_pinned_device_memory_limit: s
                    .mps_memory_limit
                    .clone()
                    .or_else(|| gpu_memory_bytes.map(|b| mebibytes(b / u64::from(replicas)))),
            }),
        }))),
    }
}

/// The name of a cell's claim or claim template (`gpushare-mps-3`).
pub fn claim_name(strategy: Strategy, pods: u32) -> String {
    format!("gpushare-{}-{pods}", strategy.name())
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

fn labels(strategy: Strategy, pods: u32) -> Value {
    json!({
        super::objects::APP_LABEL: super::objects::APP,
        super::objects::CELL_LABEL: format!("{}-{pods}", strategy.name()),
        "app.kubernetes.io/part-of": "gpushare-bench"
    })
}

/// The cell's claim object: a ResourceClaimTemplate (per pod) or a ResourceClaim
/// (shared), named [`claim_name`].
pub fn claim_object(ns: &str, strategy: Strategy, pods: u32, claims: &CellClaims) -> Value {
    let metadata = json!({ "name": claim_name(strategy, pods), "namespace": ns, "labels": labels(strategy, pods) });
    match claims {
        CellClaims::PerPod => json!({
            "apiVersion": RESOURCE_API,
            "kind": "ResourceClaimTemplate",
            "metadata": metadata,
            "spec": { "spec": { "devices": devices(None) } }
        }),
        CellClaims::Shared(config) => json!({
            "apiVersion": RESOURCE_API,
            "kind": "ResourceClaim",
            "metadata": metadata,
            "spec": { "devices": devices(config.as_ref()) }
        }),
    }
}

/// Turns a workload Deployment's pods to the cell's claim: `spec.resourceClaims` names
/// it (the template or the shared claim), the container uses it, and the device
/// plugin's extended resource is no longer requested.
pub fn use_claim(deployment: &mut Value, strategy: Strategy, pods: u32, claims: &CellClaims) {
    let name = claim_name(strategy, pods);
    let pod = &mut deployment["spec"]["template"]["spec"];
    pod["resourceClaims"] = match claims {
        CellClaims::PerPod => json!([{ "name": REQUEST, "resourceClaimTemplateName": name }]),
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

/// What a cell's claim gives each pod, for its row's note.
pub fn describe(claims: &CellClaims) -> String {
    match claims {
        CellClaims::PerPod => "DRA: a claim (and a GPU) per pod, no sharing config".into(),
        CellClaims::Shared(None) => {
            "DRA: one shared claim, no GpuConfig (the GPU's contexts time-sliced as the node has it)".into()
        }
        CellClaims::Shared(Some(c)) => match c.sharing.as_ref() {
            Some(GpuSharing {
                time_slicing_config: Some(t),
                ..
            }) => format!("DRA: one shared claim, GpuConfig TimeSlicing interval {:?}", t.interval),
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
    fn exclusive_is_a_claim_per_pod_and_sharing_one_claim_for_all() {
        let s = DraSettings::default();
        assert_eq!(cell_claims(Strategy::Exclusive, 3, &s, None), CellClaims::PerPod);
        assert_eq!(
            cell_claims(Strategy::TimeSlicing, 3, &s, None),
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
        let ts = DraSettings {
            timeslice: Some(TimeSliceInterval::Long),
            ..DraSettings::default()
        };
        let CellClaims::Shared(Some(c)) = cell_claims(Strategy::TimeSlicing, 3, &ts, None) else {
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
        let one = cell_claims(Strategy::Mps, 1, &DraSettings::default(), Some(gib80));
        let three = cell_claims(Strategy::Mps, 3, &DraSettings::default(), Some(gib80));
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
        // Flags win; an unknown memory leaves the limit out.
        let set = DraSettings {
            mps_thread_percentage: Some(20),
            ..DraSettings::default()
        };
        let CellClaims::Shared(Some(c)) = cell_claims(Strategy::Mps, 7, &set, None) else {
            panic!("a config")
        };
        let m = c.sharing.and_then(|s| s.mps_config).expect("mps");
        assert_eq!(
            (m.default_active_thread_percentage, m.default_pinned_device_memory_limit),
            (Some(20), None)
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
        let shared = cell_claims(Strategy::Mps, 3, &DraSettings::default(), None);
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
    fn intervals_parse_as_the_flag_spells_them() {
        assert_eq!("long".parse::<TimeSliceInterval>(), Ok(TimeSliceInterval::Long));
        assert!("Long".parse::<TimeSliceInterval>().is_err());
        assert_eq!(
            describe(&cell_claims(
                Strategy::TimeSlicing,
                3,
                &DraSettings {
                    timeslice: Some(TimeSliceInterval::Short),
                    ..DraSettings::default()
                },
                None
            )),
            "DRA: one shared claim, GpuConfig TimeSlicing interval Short"
        );
    }
}
