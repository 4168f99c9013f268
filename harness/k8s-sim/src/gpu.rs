//! The GPU operator's node-side rules, as pure functions: what the device plugin does
//! with a config file, which labels GPU feature discovery publishes, what the node
//! advertises, and which MIG layouts mig-parted knows. Each function names the upstream
//! file and version it reproduces (UPSTREAM-RULES.md B, C, F).

use std::collections::BTreeMap;

use serde_json::Value;

/// The GPUs of the simulated node (all alike, as on real GPU nodes).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuModel {
    /// GFD's product name (`NVIDIA-H100-80GB-HBM3`).
    pub product: String,
    /// PCI device id (mig-parted device filters match it: 0x2330 is H100 80GB HBM3).
    pub pci_device_id: u32,
    /// Memory, MiB (GFD's `nvidia.com/gpu.memory`).
    pub memory_mib: u64,
    /// MIG profiles this GPU can be split into, with how many fit (`1g.10gb` → 7).
    pub mig_profiles: Vec<(String, u32)>,
}

impl GpuModel {
    /// An H100 80GB HBM3 (SXM5), as GFD names it.
    pub fn h100_80gb() -> Self {
        Self {
            product: "NVIDIA-H100-80GB-HBM3".into(),
            pci_device_id: 0x2330,
            memory_mib: 81559,
            mig_profiles: vec![
                ("1g.10gb".into(), 7),
                ("2g.20gb".into(), 3),
                ("3g.40gb".into(), 2),
                ("7g.80gb".into(), 1),
            ],
        }
    }

    /// An H100 NVL (94 GB).
    pub fn h100_nvl() -> Self {
        Self {
            product: "NVIDIA-H100-NVL".into(),
            pci_device_id: 0x2321,
            memory_mib: 95830,
            mig_profiles: vec![
                ("1g.12gb".into(), 7),
                ("2g.24gb".into(), 3),
                ("3g.47gb".into(), 2),
                ("7g.94gb".into(), 1),
            ],
        }
    }
}

/// The sharing a device-plugin config asks for (`api/config/v1/sharing.go` `SharingStrategy`).
#[derive(Debug, Clone, PartialEq)]
pub enum Sharing {
    /// No sharing section (or replicas ≤ 1 nowhere given): one pod per GPU.
    None,
    /// `sharing.timeSlicing`.
    TimeSlicing {
        /// Replicas per GPU.
        replicas: u32,
        /// `failRequestsGreaterThanOne`.
        fail_gt_one: bool,
    },
    /// `sharing.mps` (failRequestsGreaterThanOne is forced true, `config.go` `NewConfig`).
    Mps {
        /// Replicas per GPU.
        replicas: u32,
    },
}

/// A parsed device-plugin config file.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginConfig {
    /// Its sharing.
    pub sharing: Sharing,
    /// `renameByDefault` (the resource becomes `nvidia.com/gpu.shared`).
    pub renamed: bool,
}

impl PluginConfig {
    /// Replicas per GPU (1 without sharing).
    pub fn replicas(&self) -> u32 {
        match self.sharing {
            Sharing::None => 1,
            Sharing::TimeSlicing { replicas, .. } | Sharing::Mps { replicas } => replicas,
        }
    }

    /// GFD's `nvidia.com/gpu.sharing-strategy` value.
    pub fn strategy_label(&self) -> &'static str {
        match self.sharing {
            Sharing::None => "none",
            Sharing::TimeSlicing { .. } => "time-slicing",
            Sharing::Mps { .. } => "mps",
        }
    }
}

/// Parses a config file as the device plugin, GFD and the MPS daemon do at start and on
/// every SIGHUP: k8s-device-plugin v0.18.1 `api/config/v1/config.go` (`parseConfigFrom`:
/// empty version is v1, any other → `unknown version`) and `api/config/v1/replicas.go`
/// (`ReplicatedResources.UnmarshalJSON`: resources present and non-empty, each with a
/// name and replicas, **replicas ≥ 2**; `devices` only `all` or a positive count).
/// An empty file (the config-manager's `/dev/null` fallback) is the default config.
/// The error is the one `main.go` `startPlugins` logs before the process exits 1.
pub fn parse_plugin_config(text: &str) -> Result<PluginConfig, String> {
    let fail = |m: String| {
        Err(format!(
            "unable to load config: unable to finalize config: unable to parse config file: error parsing config file: unmarshal error: {m}"
        ))
    };
    if text.trim().is_empty() {
        return Ok(PluginConfig {
            sharing: Sharing::None,
            renamed: false,
        });
    }
    let v: Value = match serde_yaml_ng::from_str(text) {
        Ok(v) => v,
        Err(e) => return fail(e.to_string()),
    };
    match v.get("version").and_then(Value::as_str) {
        None | Some("v1") => {}
        Some(other) => return fail(format!("unknown version: {other}")),
    }
    let mut out = PluginConfig {
        sharing: Sharing::None,
        renamed: false,
    };
    for key in ["timeSlicing", "mps"] {
        let Some(section) = v.get("sharing").and_then(|s| s.get(key)) else {
            continue;
        };
        let resources = match section.get("resources").and_then(Value::as_array) {
            Some(r) if !r.is_empty() => r,
            _ => return fail("no resources specified".into()),
        };
        let mut replicas = 0;
        for r in resources {
            if r.get("name").and_then(Value::as_str).is_none_or(str::is_empty) {
                return fail("no resource name specified".into());
            }
            let Some(n) = r.get("replicas").and_then(Value::as_i64) else {
                return fail("no replicas specified".into());
            };
            if n < 2 {
                return fail("number of replicas must be >= 2".into());
            }
            match r.get("devices") {
                None => {}
                Some(Value::String(s)) if s == "all" => {}
                Some(Value::String(s)) => {
                    return fail(format!("devices set as '{s}' but the only valid string input is 'all'"));
                }
                Some(Value::Number(c)) if c.as_i64().is_some_and(|c| c > 0) => {}
                Some(other) => return fail(format!("invalid devices: {other}")),
            }
            if r.get("name").and_then(Value::as_str) == Some("nvidia.com/gpu") {
                replicas = u32::try_from(n).unwrap_or(u32::MAX);
            }
        }
        if replicas < 2 {
            continue;
        }
        out.renamed = section.get("renameByDefault").and_then(Value::as_bool).unwrap_or(false);
        // `mps` is read after `timeSlicing`, so it wins as in `SharingStrategy`.
        out.sharing = if key == "mps" {
            Sharing::Mps { replicas }
        } else {
            Sharing::TimeSlicing {
                replicas,
                fail_gt_one: section
                    .get("failRequestsGreaterThanOne")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
            }
        };
    }
    Ok(out)
}

/// Checks the device plugin or GFD make against the GPUs before serving:
/// `cmd/nvidia-device-plugin/main.go` `validateFlags` (MPS with `--mig-strategy=mixed`),
/// `internal/plugin/mps.go` `getMPSOptions` and `internal/lm/nvml.go` `isMPSCapable`
/// (MPS on MIG devices), both fatal.
pub fn check_against_gpus(config: &PluginConfig, mig_enabled: bool, mig_strategy: &str) -> Result<(), String> {
    if matches!(config.sharing, Sharing::Mps { .. }) {
        if mig_strategy == "mixed" {
            return Err("unable to validate flags: using --mig-strategy=mixed is not supported with MPS".into());
        }
        if mig_enabled {
            return Err("error starting plugins: sharing using MPS is not supported for MIG devices".into());
        }
    }
    Ok(())
}

/// The MIG layouts of the operator's default mig-parted config (gpu-operator v25.10.1
/// `assets/state-mig-manager/0400_configmap.yaml`): name → (device filter, profile, count
/// per GPU). An empty filter matches every GPU.
pub fn mig_layout(name: &str) -> Option<(Vec<u32>, Option<&'static str>)> {
    let h100_a100_80 = vec![0x2330, 0x2331, 0x2322, 0x20B2, 0x20B5, 0x20F3, 0x20F5, 0x2324];
    Some(match name {
        "all-disabled" => (vec![], None),
        "all-1g.10gb" => (h100_a100_80, Some("1g.10gb")),
        "all-1g.12gb" => (vec![], Some("1g.12gb")),
        "all-1g.18gb" => (vec![], Some("1g.18gb")),
        "all-1g.5gb" => (vec![0x20B0, 0x20B1, 0x20F1, 0x20F6], Some("1g.5gb")),
        "all-2g.20gb" => (
            vec![0x2330, 0x2331, 0x2322, 0x20B2, 0x20B5, 0x20F3, 0x20F5, 0x2324],
            Some("2g.20gb"),
        ),
        _ => return None,
    })
}

/// What the node's GPUs are: MIG off, or split into one profile.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuState {
    /// The MIG profile every GPU is split into (None: MIG disabled).
    pub mig: Option<(String, u32)>,
}

/// The labels GFD publishes (k8s-device-plugin v0.18.1 `internal/lm/resource.go`
/// `baseLabeler`/`getProductName`/`getReplicas`, `internal/lm/mig-strategy.go`
/// `newMigStrategySingleLabeler`/`newMigStrategyMixedLabeler`, `internal/lm/nvml.go`
/// `newSharingLabeler`): `-SHARED` and a strategy other than `none` only when replicas
/// > 1; `mps.capable` true only for an MPS config.
pub fn gfd_labels(
    gpu: &GpuModel,
    gpus: u32,
    state: &GpuState,
    config: &PluginConfig,
    mig_strategy: &str,
) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        l.insert(format!("nvidia.com/{k}"), v);
    };
    let shared = config.replicas() > 1;
    let shared_suffix = if shared && !config.renamed { "-SHARED" } else { "" };
    put("mig.capable", (!gpu.mig_profiles.is_empty()).to_string());
    put("mig.strategy", mig_strategy.into());
    put("mps.capable", matches!(config.sharing, Sharing::Mps { .. }).to_string());
    match (&state.mig, mig_strategy) {
        (None, _) | (Some(_), "none") => {
            put("gpu.product", format!("{}{shared_suffix}", gpu.product));
            put("gpu.count", gpus.to_string());
            put("gpu.replicas", config.replicas().to_string());
            put(
                "gpu.sharing-strategy",
                if shared { config.strategy_label() } else { "none" }.into(),
            );
            put("gpu.memory", gpu.memory_mib.to_string());
        }
        (Some((profile, per_gpu)), "single") => {
            put("gpu.product", format!("{}-MIG-{profile}{shared_suffix}", gpu.product));
            put("gpu.count", (gpus * per_gpu).to_string());
            put("gpu.replicas", config.replicas().to_string());
            put(
                "gpu.sharing-strategy",
                if shared { config.strategy_label() } else { "none" }.into(),
            );
            put("gpu.memory", (gpu.memory_mib / 8).to_string());
        }
        (Some((profile, per_gpu)), _) => {
            put("gpu.product", gpu.product.clone());
            put("gpu.count", gpus.to_string());
            put("gpu.replicas", "0".into());
            put("gpu.sharing-strategy", "none".into());
            put("gpu.memory", gpu.memory_mib.to_string());
            put(&format!("mig-{profile}.count"), (gpus * per_gpu).to_string());
            put(
                &format!("mig-{profile}.product"),
                format!("{}-MIG-{profile}", gpu.product),
            );
            put(&format!("mig-{profile}.replicas"), "1".into());
            put(&format!("mig-{profile}.sharing-strategy"), "none".into());
        }
    }
    l
}

/// What the registered device plugin advertises (`internal/rm/device_map.go`
/// `updateDeviceMapWithReplicas`: GPUs × replicas, each device annotated with its replica).
pub fn advertised(gpus: u32, state: &GpuState, config: &PluginConfig, mig_strategy: &str) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    let resource = if config.renamed && config.replicas() > 1 {
        "nvidia.com/gpu.shared"
    } else {
        "nvidia.com/gpu"
    };
    match (&state.mig, mig_strategy) {
        (None, _) => {
            out.insert(resource.to_string(), gpus * config.replicas());
        }
        (Some((_, per_gpu)), "single") => {
            out.insert(resource.to_string(), gpus * per_gpu * config.replicas());
        }
        (Some((profile, per_gpu)), "mixed") => {
            out.insert(format!("nvidia.com/mig-{profile}"), gpus * per_gpu);
        }
        (Some(_), _) => {
            // --mig-strategy=none: MIG devices are not exposed.
            out.insert(resource.to_string(), 0);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_replica_is_rejected_as_the_plugin_rejects_it() {
        let err = parse_plugin_config(
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 1\n",
        )
        .expect_err("replicas 1");
        assert!(err.ends_with("number of replicas must be >= 2"), "{err}");
        let ok = parse_plugin_config(
            "version: v1\nsharing:\n  mps:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 3\n",
        )
        .expect("valid");
        assert_eq!(ok.sharing, Sharing::Mps { replicas: 3 });
        assert!(parse_plugin_config("version: v2\n").is_err());
        assert_eq!(parse_plugin_config("version: v1\n").map(|c| c.replicas()), Ok(1));
    }

    #[test]
    fn gfd_marks_sharing_only_above_one_replica() {
        let gpu = GpuModel::h100_80gb();
        let none = parse_plugin_config("").expect("empty");
        let l = gfd_labels(&gpu, 1, &GpuState { mig: None }, &none, "single");
        assert_eq!(l["nvidia.com/gpu.sharing-strategy"], "none");
        assert_eq!(l["nvidia.com/gpu.product"], "NVIDIA-H100-80GB-HBM3");
        let ts = parse_plugin_config(
            "sharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n",
        )
        .expect("valid");
        let l = gfd_labels(&gpu, 1, &GpuState { mig: None }, &ts, "single");
        assert_eq!(l["nvidia.com/gpu.product"], "NVIDIA-H100-80GB-HBM3-SHARED");
        assert_eq!(l["nvidia.com/gpu.replicas"], "4");
        let mig = GpuState {
            mig: Some(("1g.10gb".into(), 7)),
        };
        let l = gfd_labels(&gpu, 1, &mig, &none, "single");
        assert_eq!(l["nvidia.com/gpu.product"], "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb");
        assert_eq!(l["nvidia.com/gpu.count"], "7");
        let l = gfd_labels(&gpu, 1, &mig, &none, "mixed");
        assert_eq!(l["nvidia.com/mig-1g.10gb.count"], "7");
    }
}
