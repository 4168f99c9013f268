//! NVIDIA's DRA driver for GPUs on the test node: its DeviceClasses, the ResourceSlice
//! it publishes, and the checks it makes of a claim's `GpuConfig` when the kubelet
//! prepares it, with the kubelet's event text. Rules J1 to J8 in UPSTREAM-RULES.md; each
//! function names the upstream file it plays. Claims are validated by the real API
//! server and allocated by the real scheduler.
//!
//! Written from kubernetes-sigs/dra-driver-nvidia-gpu at tag v0.4.1 (764900e78337) and
//! from Kubernetes 1.34: kubernetes/api `resource/v1/types.go` and the kubelet's
//! `cm/dra/manager.go` (001332b0). Independent of the harness's own `dra.rs` types: this
//! side reads claims as JSON, as the driver does.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// The driver's name (`cmd/gpu-kubelet-plugin/main.go` `DriverName`).
pub const DRIVER: &str = "gpu.nvidia.com";

/// The driver's feature gates that decide sharing (`pkg/featuregates/featuregates.go`
/// at v0.4.1: both alpha, off by default).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Gates {
    /// `TimeSlicingSettings`.
    pub time_slicing: bool,
    /// `MPSSupport`.
    pub mps: bool,
}

/// The DeviceClasses the driver's chart installs for GPUs (J1:
/// `deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-*.yaml`).
pub fn device_classes() -> Vec<Value> {
    ["gpu", "mig"]
        .into_iter()
        .map(|t| {
            json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": format!("{t}.nvidia.com")},
                "spec": {"selectors": [{"cel": {"expression": format!(
                    "device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{t}'"
                )}}]}
            })
        })
        .collect()
}

/// The ResourceSlice the driver's kubelet plugin publishes for `gpus` whole GPUs (J2:
/// `cmd/gpu-kubelet-plugin/deviceinfo.go` `GpuInfo.Attributes`, `partitions.go`
/// `fullGpuCapacity`): pool = the node, devices `gpu-<minor>`, attributes without an
/// index, the memory as capacity.
pub fn resource_slice(node: &str, gpus: u32, product: &str, memory_bytes: u64) -> Value {
    let devices: Vec<Value> = (0..gpus)
        .map(|i| {
            json!({
                "name": format!("gpu-{i}"),
                "attributes": {
                    "type": {"string": "gpu"},
                    "uuid": {"string": format!("GPU-sim-{i:04}")},
                    "productName": {"string": product},
                    "brand": {"string": "Nvidia"},
                    "architecture": {"string": "Hopper"},
                    "cudaComputeCapability": {"version": "9.0.0"},
                    "driverVersion": {"version": "580.159.4"},
                    "cudaDriverVersion": {"version": "13.0.0"},
                    "resource.kubernetes.io/pciBusID": {"string": format!("0000:{:02x}:00.0", 0x18 + i)}
                },
                // As the API server stores a BinarySI quantity: whole MiB as `Mi`.
                "capacity": {"memory": {"value": format!("{}Mi", memory_bytes >> 20)}}
            })
        })
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-{DRIVER}-sim00")},
        "spec": {"driver": DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices}
    })
}

/// Turns the slice's GPU 0 into a GPU in MIG mode with static instances of `profiles`
/// (J8: `cmd/gpu-kubelet-plugin/nvlib.go` `GetPerGpuAllocatableDevices` at v0.4.1: a
/// MIG-enabled GPU publishes only its existing MIG devices, the whole GPU not at all;
/// `mig.go` names them `gpu-<minor>-mig-<profile without dots>-<GI profile id>-<placement
/// start>` and `CommonAttributesMig`/`CommonCapacitiesMig` give `type` mig, `uuid`,
/// `parentUUID`, `profile`, the parent's product and versions, and `memory` and
/// `multiprocessors` as capacities). Profile IDs and sizes are the H100 80GB's.
pub fn make_static_mig(slice: &mut Value, profiles: &[String]) {
    let Some(devices) = slice["spec"]["devices"].as_array_mut() else {
        return;
    };
    let Some(parent) = devices.first().cloned() else {
        return;
    };
    let mut migs = Vec::new();
    let mut placement: BTreeMap<&str, u32> = BTreeMap::new();
    for (i, profile) in profiles.iter().enumerate() {
        // (GPU-instance profile id, memory MiB, SMs) as `nvidia-smi mig -lgip` lists them.
        let (id, mib, sms) = match profile.as_str() {
            "1g.10gb" => (19, 9_856, 16),
            "1g.20gb" => (15, 19_968, 26),
            "2g.20gb" => (14, 19_968, 32),
            "3g.40gb" => (9, 40_192, 60),
            "4g.40gb" => (5, 40_192, 64),
            _ => (0, 80_384, 132),
        };
        let start = placement.entry(profile.as_str()).or_default();
        let mut attrs = parent["attributes"].clone();
        attrs["type"] = json!({"string": "mig"});
        attrs["parentUUID"] = parent["attributes"]["uuid"].clone();
        attrs["uuid"] = json!({"string": format!("MIG-sim-{i:04}")});
        attrs["profile"] = json!({"string": profile});
        migs.push(json!({
            "name": format!("gpu-0-mig-{}-{id}-{start}", profile.replace('.', "")),
            "attributes": attrs,
            "capacity": {"memory": {"value": format!("{mib}Mi")}, "multiprocessors": {"value": sms.to_string()}}
        }));
        *start += 1;
    }
    devices.remove(0);
    devices.splice(0..0, migs);
}

/// The driver's kubelet-plugin pod on the node as the chart makes it (J1: chart
/// `templates/kubeletplugin.yaml` at v0.4.1, installed as `docs/install.md` says, in
/// namespace `dra-driver-nvidia-gpu`): label `dra-driver-nvidia-gpu-component:
/// kubelet-plugin`, container `gpus` with the driver's image and `FEATURE_GATES` rendered
/// from the helm map (`K=v,` in key order; absent when no gate is set).
pub fn kubelet_plugin_pod(node: &str, gates: &Gates) -> Value {
    let ns = "dra-driver-nvidia-gpu";
    let name = "dra-driver-nvidia-gpu-kubelet-plugin-sim00";
    let set: Vec<String> = [("MPSSupport", gates.mps), ("TimeSlicingSettings", gates.time_slicing)]
        .into_iter()
        .filter(|(_, on)| *on)
        .map(|(k, _)| format!("{k}=true,"))
        .collect();
    let env = if set.is_empty() {
        json!([])
    } else {
        json!([{"name": "FEATURE_GATES", "value": set.concat()}])
    };
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {
            "app.kubernetes.io/name": "dra-driver-nvidia-gpu",
            "app.kubernetes.io/instance": "dra-driver-nvidia-gpu",
            "dra-driver-nvidia-gpu-component": "kubelet-plugin"}},
        "spec": {"nodeName": node, "containers": [
            {"name": "gpus", "image": "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:v0.4.1", "env": env}
        ]},
    })
}

/// What the driver makes of a claim's opaque `GpuConfig` when the kubelet prepares it
/// (J5: `cmd/gpu-kubelet-plugin/device_state.go` `prepareDevices`: strict decoding,
/// `Normalize`, `Validate`, then applying; `api/nvidia.com/resource/v1beta1/
/// validate.go`, `sharing.go`, `gpuconfig.go`). Ok: the sharing it applies (None: none).
pub fn prepare_config(params: &Value, gates: &Gates, claim_uid: &str) -> Result<Option<Sharing>, String> {
    let decode = |e: String| format!("error getting opaque device configs: error decoding config parameters: {e}");
    let Some(obj) = params.as_object() else {
        return Err(decode("expected a JSON object".into()));
    };
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
    if obj.get("apiVersion").and_then(Value::as_str) != Some("resource.nvidia.com/v1beta1") || kind != "GpuConfig" {
        return Err(decode(format!(
            "no kind {kind:?} is registered for version \"resource.nvidia.com/v1beta1\" in scheme \"sim\""
        )));
    }
    let unknown = |path: String| decode(format!("strict decoding error: unknown field {path:?}"));
    if let Some(k) = obj
        .keys()
        .find(|k| !["apiVersion", "kind", "sharing"].contains(&k.as_str()))
    {
        return Err(unknown(k.clone()));
    }
    let Some(sharing) = obj.get("sharing").filter(|s| !s.is_null()) else {
        return Ok(None);
    };
    if let Some(k) = sharing
        .as_object()
        .into_iter()
        .flat_map(|m| m.keys())
        .find(|k| !["strategy", "timeSlicingConfig", "mpsConfig"].contains(&k.as_str()))
    {
        return Err(unknown(format!("sharing.{k}")));
    }
    for (field, known) in [
        ("timeSlicingConfig", &["interval"][..]),
        (
            "mpsConfig",
            &[
                "defaultActiveThreadPercentage",
                "defaultPinnedDeviceMemoryLimit",
                "defaultPerDevicePinnedMemoryLimit",
            ][..],
        ),
    ] {
        if let Some(k) = sharing[field]
            .as_object()
            .into_iter()
            .flat_map(|m| m.keys())
            .find(|k| !known.contains(&k.as_str()))
        {
            return Err(unknown(format!("sharing.{field}.{k}")));
        }
    }
    let validating = |e: String| format!("error validating GPU config: {e}");
    let strategy = sharing["strategy"].as_str().unwrap_or_default();
    match strategy {
        "TimeSlicing" if !gates.time_slicing => {
            return Err(validating(
                "\"TimeSlicing\" is selected as the GPU sharing strategy, but the \"TimeSlicingSettings\" feature gate is not enabled".into(),
            ));
        }
        "MPS" if !gates.mps => {
            return Err(validating(
                "\"MPS\" is selected as the GPU sharing strategy, but the \"MPSSupport\" feature gate is not enabled"
                    .into(),
            ));
        }
        "TimeSlicing" | "MPS" => {}
        other => {
            return Err(validating(format!(
                "unknown GPU sharing strategy: {other}, supported GPU sharing strategies: TimeSlicing, MPS"
            )));
        }
    }
    let ts = &sharing["timeSlicingConfig"];
    let mps = &sharing["mpsConfig"];
    if strategy == "TimeSlicing" {
        // Normalize gives a missing timeSlicingConfig the Default interval; an empty one
        // reaches Validate with no interval, which dereferences it (not run upstream;
        // refused here).
        let interval = if ts.is_null() {
            "Default"
        } else {
            ts["interval"]
                .as_str()
                .ok_or_else(|| validating("timeSlicingConfig without an interval".into()))?
        };
        if !["Default", "Short", "Medium", "Long"].contains(&interval) {
            return Err(validating(format!(
                "unknown time-slice interval: {interval}, supported time-slice intervals: Default, Short, Medium, Long"
            )));
        }
        if !mps.is_null() {
            // `applySharingConfig`'s wrapping (`device_state.go`), for the claims' one
            // request `gpu`.
            return Err(format!(
                "error applying config: error getting timeslice config for requests '[gpu]' in claim '{claim_uid}': cannot use MpsConfig with the 'TimeSlicing' strategy"
            ));
        }
        return Ok(Some(Sharing::TimeSlicing(interval.to_string())));
    }
    let pct = mps["defaultActiveThreadPercentage"].as_i64();
    if pct.is_some_and(|p| p < 0) {
        return Err(validating("active thread percentage must not be negative".into()));
    }
    if pct.is_some_and(|p| p > 100) {
        return Err(validating(
            "active thread percentage must not be greater than 100".into(),
        ));
    }
    if !ts.is_null() {
        return Err(
            "error applying config: error getting MPS configuration: cannot use TimeSlicingConfig with the 'MPS' strategy"
                .into(),
        );
    }
    let limit = mps["defaultPinnedDeviceMemoryLimit"].as_str();
    if let Some(q) = limit {
        let mib = quantity_bytes(q).map(|b| b >> 20);
        if mib.is_none_or(|m| m < 1) {
            return Err(format!(
                "error starting MPS control daemon: error transforming DefaultPerDevicePinnedMemoryLimit into string: invalid limit: default value set too low: {q}"
            ));
        }
    }
    Ok(Some(Sharing::Mps {
        thread_percentage: pct.map(|p| p as u32),
        pinned_limit: limit.map(str::to_string),
    }))
}

/// The sharing the driver applied to a prepared claim.
#[derive(Debug, Clone, PartialEq)]
pub enum Sharing {
    /// `nvidia-smi compute-policy --set-timeslice` with this interval.
    TimeSlicing(String),
    /// A control daemon per claim with these defaults.
    Mps {
        /// `set_default_active_thread_percentage`.
        thread_percentage: Option<u32>,
        /// `set_default_device_pinned_mem_limit`, as given.
        pinned_limit: Option<String>,
    },
}

/// Bytes of a Kubernetes quantity of the forms the harness writes (`26624Mi`, `20Gi`,
/// plain bytes); None otherwise.
fn quantity_bytes(q: &str) -> Option<u64> {
    let digits = q.bytes().take_while(u8::is_ascii_digit).count();
    let (n, unit) = q.split_at(digits);
    let mult: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return None,
    };
    n.parse::<u64>().ok()?.checked_mul(mult)
}

/// The kubelet's event when prepare fails (J6: `kuberuntime_manager.go` and
/// `cm/dra/manager.go`; the driver's wrapping from `driver.go` `nodePrepareResource` and
/// `device_state.go`): the pod stays in ContainerCreating and the kubelet retries.
pub fn prepare_failed_event(ns: &str, claim: &str, uid: &str, driver_error: &str) -> String {
    format!(
        "Failed to prepare dynamic resources: prepare dynamic resources: NodePrepareResources failed for ResourceClaim {claim}: error preparing devices for claim {ns}/{claim}:{uid}: prepare devices failed: {driver_error}"
    )
}

/// The driver's configs in a claim's allocation that apply to `request` (J5:
/// `GetOpaqueDeviceConfigs`: other drivers' entries skipped; a later entry wins).
pub fn config_for<'a>(allocation: &'a Value, request: &str) -> Option<&'a Value> {
    allocation["devices"]["config"]
        .as_array()
        .into_iter()
        .flatten()
        .rev()
        .find(|c| {
            c["opaque"]["driver"] == json!(DRIVER)
                && c["requests"]
                    .as_array()
                    .is_none_or(|r| r.is_empty() || r.contains(&json!(request)))
        })
        .map(|c| &c["opaque"]["parameters"])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gates(ts: bool, mps: bool) -> Gates {
        Gates { time_slicing: ts, mps }
    }

    #[test]
    fn the_driver_checks_a_gpu_config_as_it_prepares_the_claim() {
        let cfg = |sharing: Value| json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing});
        let on = gates(true, true);
        assert_eq!(
            prepare_config(
                &json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}),
                &gates(false, false),
                "u"
            ),
            Ok(None)
        );
        assert_eq!(
            prepare_config(
                &cfg(json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}})),
                &on,
                "u"
            ),
            Ok(Some(Sharing::TimeSlicing("Long".into())))
        );
        for (c, g, says) in [
            (
                json!({"strategy": "TimeSlicing"}),
                gates(false, true),
                "error validating GPU config: \"TimeSlicing\" is selected as the GPU sharing strategy, but the \"TimeSlicingSettings\" feature gate is not enabled",
            ),
            (
                json!({"strategy": "MPS"}),
                gates(true, false),
                "but the \"MPSSupport\" feature gate is not enabled",
            ),
            (
                json!({"strategy": "Mps"}),
                on.clone(),
                "unknown GPU sharing strategy: Mps, supported GPU sharing strategies: TimeSlicing, MPS",
            ),
            (
                json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "long"}}),
                on.clone(),
                "unknown time-slice interval: long",
            ),
            (
                json!({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}}),
                on.clone(),
                "must not be greater than 100",
            ),
            (
                json!({"strategy": "MPS", "timeSlicingConfig": {"interval": "Long"}}),
                on.clone(),
                "cannot use TimeSlicingConfig with the 'MPS' strategy",
            ),
            (
                json!({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "512Ki"}}),
                on.clone(),
                "default value set too low: 512Ki",
            ),
            (
                json!({"strategy": "MPS", "extra": 1}),
                on.clone(),
                "strict decoding error: unknown field \"sharing.extra\"",
            ),
        ] {
            let e = prepare_config(&cfg(c.clone()), &g, "u-1").expect_err(says);
            assert!(e.contains(says), "{c}: {e}");
        }
    }

    #[test]
    fn a_gpu_in_mig_mode_publishes_its_instances_and_no_whole_gpu() {
        let mut slice = resource_slice("n1", 1, "H100", 80 << 30);
        let profiles: Vec<String> = ["1g.10gb", "1g.10gb", "3g.40gb"].map(String::from).to_vec();
        make_static_mig(&mut slice, &profiles);
        let names: Vec<&str> = slice["spec"]["devices"]
            .as_array()
            .expect("devices")
            .iter()
            .filter_map(|d| d["name"].as_str())
            .collect();
        assert_eq!(
            names,
            ["gpu-0-mig-1g10gb-19-0", "gpu-0-mig-1g10gb-19-1", "gpu-0-mig-3g40gb-9-0"],
            "no whole GPU beside them"
        );
        let d = &slice["spec"]["devices"][2];
        assert_eq!(
            (
                &d["attributes"]["parentUUID"]["string"],
                &d["attributes"]["profile"]["string"]
            ),
            (&json!("GPU-sim-0000"), &json!("3g.40gb"))
        );
    }
}
