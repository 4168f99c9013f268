//! Dynamic Resource Allocation in the simulated cluster: NVIDIA's DRA driver for GPUs
//! (its DeviceClasses, the ResourceSlice it publishes, the checks it makes of a claim's
//! `GpuConfig` when the kubelet prepares it) and Kubernetes' side (claim validation,
//! allocation of a claim to a free device, the FitError and kubelet event texts). Rules
//! J1 to J7 in UPSTREAM-RULES.md; each function names the upstream file it plays.
//!
//! Written from kubernetes-sigs/dra-driver-nvidia-gpu at tag v0.4.1 (764900e78337)
//! and from Kubernetes 1.34: kubernetes/api `resource/v1/types.go` and
//! kubernetes/dynamic-resource-allocation `structured/` at v0.34.0 (ae6c3b91, 169aed4c),
//! kubernetes/kubernetes `pkg/apis/resource/validation/validation.go` (009801d9), the
//! scheduler's `dynamicresources.go` (00d37505) and the kubelet's `cm/dra/manager.go`
//! (001332b0). Independent of the harness's own `dra.rs` types: this side reads claims
//! as JSON, as the API server and the driver do.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

/// The driver's name (`cmd/gpu-kubelet-plugin/main.go` `DriverName`).
pub const DRIVER: &str = "gpu.nvidia.com";
/// The finalizer the scheduler adds when it allocates a claim (`resource/v1` `Finalizer`).
pub const FINALIZER: &str = "resource.kubernetes.io/delete-protection";

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
pub fn kubelet_plugin_pod(node: &str, gates: &Gates) -> (crate::key::Key, Value) {
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
    (
        crate::key::Key::new("pods", ns, name),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {
                "app.kubernetes.io/name": "dra-driver-nvidia-gpu",
                "app.kubernetes.io/instance": "dra-driver-nvidia-gpu",
                "dra-driver-nvidia-gpu-component": "kubelet-plugin"}},
            "spec": {"nodeName": node, "containers": [
                {"name": "gpus", "image": "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:v0.4.1", "env": env}
            ]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        }),
    )
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// API validation of a claim's `spec.devices` (J3: `validation.go`
/// `validateDeviceClaim`, `validateDeviceRequest`, `validateExactDeviceRequest`,
/// `validateDeviceConfiguration`, `validateRawExtension`): the field errors, in the API
/// server's rendering, of the rules the harness's claims could break. `path` is
/// `spec` for a claim, `spec.spec` for a template.
pub fn validate_claim_spec(devices: &Value, path: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let requests = devices["requests"].as_array().cloned().unwrap_or_default();
    let mut names = BTreeSet::new();
    for (i, r) in requests.iter().enumerate() {
        let at = format!("{path}.devices.requests[{i}]");
        let name = r["name"].as_str().unwrap_or_default();
        if !is_dns_label(name) {
            errs.push(format!("{at}.name: Invalid value: {name:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"));
        } else if !names.insert(name.to_string()) {
            errs.push(format!("{at}: Duplicate value: {name:?}"));
        }
        match (r["exactly"].is_object(), r["firstAvailable"].is_array()) {
            (false, false) => {
                errs.push(format!("{at}: Required value: exactly one of `exactly` or `firstAvailable` is required"))
            }
            (true, true) => errs.push(format!(
                "{at}: Invalid value: null: exactly one of `exactly` or `firstAvailable` is required, but multiple fields are set"
            )),
            _ => {}
        }
        let exact = &r["exactly"];
        if exact.is_object() {
            if exact["deviceClassName"].as_str().is_none_or(str::is_empty) {
                errs.push(format!("{at}.exactly.deviceClassName: Required value"));
            }
            match exact["allocationMode"].as_str() {
                None | Some("ExactCount") => {
                    if let Some(c) = exact["count"].as_i64().filter(|c| *c < 0) {
                        errs.push(format!("{at}.exactly.count: Invalid value: {c}: must be greater than zero"));
                    }
                }
                Some("All") => {}
                Some(other) => errs.push(format!(
                    "{at}.exactly.allocationMode: Unsupported value: {other:?}: supported values: \"All\", \"ExactCount\""
                )),
            }
        }
    }
    for (i, c) in devices["config"].as_array().into_iter().flatten().enumerate() {
        let at = format!("{path}.devices.config[{i}]");
        for (j, r) in c["requests"].as_array().into_iter().flatten().enumerate() {
            let r = r.as_str().unwrap_or_default();
            if !names.contains(r) {
                errs.push(format!("{at}.requests[{j}]: Invalid value: {r:?}: must be the name of a request in the claim or the name of a request and a subrequest separated by '/'"));
            }
        }
        let opaque = &c["opaque"];
        if !opaque.is_object() {
            errs.push(format!("{at}.opaque: Required value"));
            continue;
        }
        if opaque["driver"].as_str().is_none_or(str::is_empty) {
            errs.push(format!("{at}.opaque.driver: Required value"));
        }
        match &opaque["parameters"] {
            Value::Null => errs.push(format!("{at}.opaque.parameters: Required value")),
            Value::Object(_) => {}
            _ => errs.push(format!(
                "{at}.opaque.parameters: Invalid value: \"<value omitted>\": must be a valid JSON object"
            )),
        }
    }
    errs
}

/// The API server's answer to an invalid object (J3: `apierrors.NewInvalid`): one error
/// bare, several in brackets.
pub fn invalid_message(kind: &str, name: &str, errs: &[String]) -> String {
    let body = match errs {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    };
    format!("{kind}.resource.k8s.io {name:?} is invalid: {body}")
}

/// Whether `device` of `driver` matches a DeviceClass's selectors. Only the form the
/// driver's chart writes is understood (`device.driver == 'D' && device.attributes['D'].type
/// == 'T'`, J1); any other CEL is an error, as the simulator evaluates no CEL.
fn class_selects(class: &Value, driver: &str, device: &Value) -> Result<bool, String> {
    for sel in class["spec"]["selectors"].as_array().into_iter().flatten() {
        let expr = sel["cel"]["expression"].as_str().unwrap_or_default();
        let parts: Vec<&str> = expr.split("&&").map(str::trim).collect();
        let [d, t] = parts.as_slice() else {
            return Err(format!("CEL {expr:?} is not simulated"));
        };
        let quoted = |s: &str, prefix: &str| {
            s.strip_prefix(prefix)
                .map(|r| r.trim().trim_matches('\'').to_string())
                .filter(|r| !r.contains(' '))
        };
        let want_driver = quoted(d, "device.driver ==").ok_or_else(|| format!("CEL {expr:?} is not simulated"))?;
        let Some((domain, ty)) = t
            .strip_prefix("device.attributes['")
            .and_then(|r| r.split_once("'].type =="))
        else {
            return Err(format!("CEL {expr:?} is not simulated"));
        };
        let ty = ty.trim().trim_matches('\'');
        let have = device["attributes"]["type"]["string"].as_str();
        if want_driver != driver || domain != driver || have != Some(ty) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether `device` matches a request's own CEL selectors (J8). Only the form of the
/// driver's quickstart (`demo/specs/quickstart/v1/gpu-test4.yaml`:
/// `device.attributes['D'].KEY == 'VALUE'`, a string attribute) is understood; any other
/// CEL is an error, as the simulator evaluates no CEL.
fn request_selects(exactly: &Value, device: &Value) -> Result<bool, String> {
    for sel in exactly["selectors"].as_array().into_iter().flatten() {
        let expr = sel["cel"]["expression"].as_str().unwrap_or_default();
        let parsed = expr.strip_prefix("device.attributes['").and_then(|r| {
            let (domain, rest) = r.split_once("'].")?;
            let (key, value) = rest.split_once(" == ")?;
            let value = value.trim().strip_prefix('\'')?.strip_suffix('\'')?;
            Some((domain, key.trim(), value))
        });
        let Some((domain, key, value)) = parsed else {
            return Err(format!("CEL {expr:?} is not simulated"));
        };
        if domain != DRIVER || device["attributes"][key]["string"].as_str() != Some(value) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// One device allocated to a claim.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Allocated {
    /// Driver.
    pub driver: String,
    /// Pool (the node).
    pub pool: String,
    /// Device name (`gpu-0`).
    pub device: String,
}

/// Allocates an unallocated claim on `node` (J4: the scheduler's DRA plugin and the
/// structured allocator, `allocator_stable.go`): each `ExactCount` request gets `count`
/// devices of the node's slices that its DeviceClass selects and no other claim holds.
/// Errors are the scheduler's reasons: a missing class is PreFilter's
/// (`request <r>: device class <c> does not exist`), no room is Filter's (`cannot
/// allocate all claims`). Returns the claim's `status.allocation` and the devices.
pub fn allocate(
    claim: &Value,
    classes: &BTreeMap<String, Value>,
    slices: &[Value],
    taken: &BTreeSet<Allocated>,
    node: &str,
) -> Result<(Value, Vec<Allocated>), String> {
    let mut results = Vec::new();
    let mut chosen: Vec<Allocated> = Vec::new();
    for r in claim["spec"]["devices"]["requests"].as_array().into_iter().flatten() {
        let name = r["name"].as_str().unwrap_or_default();
        let class_name = r["exactly"]["deviceClassName"].as_str().unwrap_or_default();
        let Some(class) = classes.get(class_name) else {
            return Err(format!("request {name}: device class {class_name} does not exist"));
        };
        let count = r["exactly"]["count"].as_u64().unwrap_or(1).max(1) as usize;
        let mut got = 0;
        for slice in slices.iter().filter(|s| s["spec"]["nodeName"] == json!(node)) {
            let driver = slice["spec"]["driver"].as_str().unwrap_or_default();
            let pool = slice["spec"]["pool"]["name"].as_str().unwrap_or_default();
            for d in slice["spec"]["devices"].as_array().into_iter().flatten() {
                if got == count {
                    break;
                }
                let a = Allocated {
                    driver: driver.into(),
                    pool: pool.into(),
                    device: d["name"].as_str().unwrap_or_default().into(),
                };
                if taken.contains(&a)
                    || chosen.contains(&a)
                    || !class_selects(class, driver, d)?
                    || !request_selects(&r["exactly"], d)?
                {
                    continue;
                }
                results.push(json!({"request": name, "driver": a.driver, "pool": a.pool, "device": a.device}));
                chosen.push(a);
                got += 1;
            }
        }
        if got < count {
            return Err("cannot allocate all claims".into());
        }
    }
    let config: Vec<Value> = claim["spec"]["devices"]["config"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| json!({"source": "FromClaim", "requests": c["requests"], "opaque": c["opaque"]}))
        .collect();
    Ok((
        json!({
            "devices": {"results": results, "config": config},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}
        }),
        chosen,
    ))
}

/// The scheduler's FitError for a pod on a one-node cluster (J4): a PreFilter reason
/// replaces the node list.
pub fn unschedulable(reason: &str) -> String {
    if reason.starts_with("request ") {
        format!("0/1 nodes are available: {reason}.")
    } else {
        format!("0/1 nodes are available: 1 {reason}.")
    }
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
    fn a_gpu_in_mig_mode_publishes_its_instances_and_a_profile_selector_picks_them() {
        let classes: BTreeMap<String, Value> = device_classes()
            .into_iter()
            .map(|c| (c["metadata"]["name"].as_str().unwrap_or_default().to_string(), c))
            .collect();
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
        let slices = [slice];
        let claim = |sel: &str| json!({"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "mig.nvidia.com", "allocationMode": "ExactCount", "count": 1, "selectors": [{"cel": {"expression": sel}}]}}]}}});
        let one_g = claim("device.attributes['gpu.nvidia.com'].profile == '1g.10gb'");
        let mut taken = BTreeSet::new();
        for want in ["gpu-0-mig-1g10gb-19-0", "gpu-0-mig-1g10gb-19-1"] {
            let (alloc, devs) = allocate(&one_g, &classes, &slices, &taken, "n1").expect("room");
            assert_eq!(alloc["devices"]["results"][0]["device"], want);
            taken.extend(devs);
        }
        // The 3g.40gb instance is free, but not of the profile asked for.
        assert_eq!(
            allocate(&one_g, &classes, &slices, &taken, "n1").expect_err("full"),
            "cannot allocate all claims"
        );
        // No whole GPU to give a gpu.nvidia.com claim.
        let whole = json!({"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}}]}}});
        assert!(allocate(&whole, &classes, &slices, &BTreeSet::new(), "n1").is_err());
        let other = claim("device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('10Gi'))");
        assert!(
            allocate(&other, &classes, &slices, &BTreeSet::new(), "n1").is_err_and(|e| e.contains("is not simulated"))
        );
    }

    #[test]
    fn a_claim_gets_a_free_device_of_its_class_or_the_schedulers_reason() {
        let classes: BTreeMap<String, Value> = device_classes()
            .into_iter()
            .map(|c| (c["metadata"]["name"].as_str().unwrap_or_default().to_string(), c))
            .collect();
        let slices = [resource_slice("n1", 2, "H100", 80 << 30)];
        let claim = |class: &str| json!({"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class, "allocationMode": "ExactCount", "count": 1}}]}}});
        let mut taken = BTreeSet::new();
        for want in ["gpu-0", "gpu-1"] {
            let (alloc, devs) = allocate(&claim("gpu.nvidia.com"), &classes, &slices, &taken, "n1").expect("room");
            assert_eq!(alloc["devices"]["results"][0]["device"], want);
            taken.extend(devs);
        }
        let full = allocate(&claim("gpu.nvidia.com"), &classes, &slices, &taken, "n1").expect_err("full");
        assert_eq!(
            unschedulable(&full),
            "0/1 nodes are available: 1 cannot allocate all claims."
        );
        // The MIG class selects no whole GPU.
        assert!(allocate(&claim("mig.nvidia.com"), &classes, &slices, &BTreeSet::new(), "n1").is_err());
        let missing =
            allocate(&claim("gpu.example.com"), &classes, &slices, &BTreeSet::new(), "n1").expect_err("no class");
        assert_eq!(
            unschedulable(&missing),
            "0/1 nodes are available: request gpu: device class gpu.example.com does not exist."
        );
    }

    #[test]
    fn the_api_server_refuses_a_malformed_claim() {
        let errs = validate_claim_spec(
            &json!({"requests": [{"name": "GPU", "exactly": {}}], "config": [{"requests": ["nope"], "opaque": {"driver": "gpu.nvidia.com", "parameters": "x"}}]}),
            "spec",
        );
        assert_eq!(errs.len(), 4, "{errs:?}");
        assert!(
            errs[0].starts_with("spec.devices.requests[0].name: Invalid value: \"GPU\": a lowercase RFC 1123 label")
        );
        assert_eq!(
            errs[1],
            "spec.devices.requests[0].exactly.deviceClassName: Required value"
        );
        assert!(errs[3].ends_with("must be a valid JSON object"));
        assert!(
            invalid_message("ResourceClaim", "c", &errs)
                .starts_with("ResourceClaim.resource.k8s.io \"c\" is invalid: [spec.")
        );
    }
}
