//! What the GPUs are: the inventory types read once per run, the parser of
//! `nvidia-smi -L` (pure; the source of MIG device UUIDs), and the choice of the GPU a
//! local run measures (`--gpu`). Nothing here changes a GPU setting.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::telemetry::environment::GpuRecord;

/// One MIG device as `nvidia-smi -L` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigDevice {
    /// Profile, e.g. `1g.10gb`.
    pub profile: String,
    /// `MIG-…` UUID, what `CUDA_VISIBLE_DEVICES` takes.
    pub uuid: String,
}

/// A process that holds a GPU context, as NVML lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuProcess {
    /// Process id (in NVML's view: another container's processes may show pids that
    /// mean nothing here).
    pub pid: u32,
    /// `/proc/PID/comm`, when this machine can read it.
    pub name: Option<String>,
    /// Device memory it holds, bytes, when NVML says.
    pub used_memory_bytes: Option<u64>,
}

impl fmt::Display for GpuProcess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.pid, self.name.as_deref().unwrap_or("(name unknown)"))?;
        if let Some(b) = self.used_memory_bytes {
            write!(f, " ({} MiB)", b >> 20)?;
        }
        Ok(())
    }
}

/// One GPU in the inventory.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuInfo {
    /// Index.
    pub index: u32,
    /// Name.
    pub name: String,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Memory in bytes.
    pub memory_total_bytes: Option<u64>,
    /// Some(true) MIG enabled, Some(false) disabled, None not MIG-capable / unknown.
    pub mig_enabled: Option<bool>,
    /// Compute mode name.
    pub compute_mode: Option<String>,
    /// Existing MIG devices.
    pub mig_devices: Vec<MigDevice>,
    /// PCI bus id, e.g. `00000000:19:00.0`.
    pub pci_bus_id: Option<String>,
    /// Compute processes on it when the inventory was read.
    pub processes: Vec<GpuProcess>,
}

impl GpuInfo {
    /// The record written to run.json.
    pub fn record(&self) -> GpuRecord {
        GpuRecord {
            index: self.index,
            name: self.name.clone(),
            uuid: self.uuid.clone(),
            memory_total_bytes: self.memory_total_bytes,
            mig_mode: self
                .mig_enabled
                .map(|m| if m { "Enabled" } else { "Disabled" }.to_string()),
            compute_mode: self.compute_mode.clone(),
            mig_devices: self
                .mig_devices
                .iter()
                .map(|m| format!("MIG {} (UUID: {})", m.profile, m.uuid))
                .collect(),
            pci_bus_id: self.pci_bus_id.clone(),
        }
    }

    /// One line for listings: `GPU 1: NVIDIA H100 80GB HBM3 (GPU-…, bus 00000000:19:00.0)`.
    pub fn line(&self) -> String {
        let bus = self
            .pci_bus_id
            .as_deref()
            .map_or(String::new(), |b| format!(", bus {b}"));
        format!("GPU {}: {} ({}{bus})", self.index, self.name, self.uuid)
    }

    /// Short name for run ids: "h100", "a100", …
    pub fn short_name(&self) -> String {
        let lower = self.name.to_lowercase();
        let tokens: Vec<&str> = lower
            .split(|c: char| c.is_whitespace() || c == '-' || c == '_')
            .filter(|t| !t.is_empty())
            .collect();
        let has_digit = |t: &&&str| t.chars().any(|c| c.is_ascii_digit());
        tokens
            .iter()
            .filter(has_digit)
            .find(|t| t.starts_with(|c: char| c.is_ascii_alphabetic()))
            .or_else(|| tokens.iter().find(has_digit))
            .map(|t| t.chars().filter(|c| c.is_ascii_alphanumeric()).collect::<String>())
            .unwrap_or_else(|| "gpu".into())
    }
}

/// All GPUs, and the driver.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuInventory {
    /// GPUs by index.
    pub gpus: Vec<GpuInfo>,
    /// Driver version.
    pub driver_version: Option<String>,
    /// CUDA version the driver supports, e.g. "13.0".
    pub cuda_driver_version: Option<String>,
    /// Whether NVML answered.
    pub nvml: bool,
}

/// Which GPU of this machine a local run measures (`--gpu`): an index as NVML and
/// `nvidia-smi` number them, or a `GPU-…` UUID (a unique prefix is enough, as for
/// `CUDA_VISIBLE_DEVICES`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSelector {
    /// NVML index.
    Index(u32),
    /// `GPU-…` UUID or a unique prefix of one.
    Uuid(String),
}

impl FromStr for GpuSelector {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if let Ok(i) = t.parse::<u32>() {
            return Ok(Self::Index(i));
        }
        if t.starts_with("MIG-") {
            return Err(format!(
                "{t} is a MIG device, not a GPU: give its GPU's index or GPU-… UUID (`nvidia-smi -L` lists both) and --strategies mig"
            ));
        }
        if t.starts_with("GPU-") && t.len() > 4 {
            return Ok(Self::Uuid(t.to_string()));
        }
        Err(format!(
            "`{t}` is neither a GPU index (0, 1, …) nor a GPU-… UUID; `nvidia-smi -L` lists both"
        ))
    }
}

impl fmt::Display for GpuSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Index(i) => write!(f, "{i}"),
            Self::Uuid(u) => f.write_str(u),
        }
    }
}

impl Serialize for GpuSelector {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for GpuSelector {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Index(u32),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Index(i) => Ok(Self::Index(i)),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// The GPU `selector` names (None: the first, GPU 0, as before `--gpu` existed), or why
/// none fits, naming the GPUs there are (pure).
pub fn select_gpu<'a>(inventory: &'a GpuInventory, selector: Option<&GpuSelector>) -> Result<&'a GpuInfo, String> {
    let listing = || {
        if inventory.gpus.is_empty() {
            "NVML lists no NVIDIA GPU here".to_string()
        } else {
            let all: Vec<String> = inventory.gpus.iter().map(GpuInfo::line).collect();
            format!("this machine has {}", all.join("; "))
        }
    };
    match selector {
        None => inventory.gpus.first().ok_or_else(listing),
        Some(GpuSelector::Index(i)) => inventory
            .gpus
            .iter()
            .find(|g| g.index == *i)
            .ok_or_else(|| format!("there is no GPU {i}: {}", listing())),
        Some(GpuSelector::Uuid(u)) => {
            let found: Vec<&GpuInfo> = inventory
                .gpus
                .iter()
                .filter(|g| g.uuid.starts_with(u.as_str()))
                .collect();
            match found.as_slice() {
                [one] => Ok(one),
                [] => Err(format!("no GPU has UUID {u}: {}", listing())),
                many => Err(format!(
                    "{u} is the start of {} GPUs' UUIDs; give more of it: {}",
                    many.len(),
                    listing()
                )),
            }
        }
    }
}

/// The inventory a local run works with: only the chosen GPU, so every part that reads
/// "the GPU" (pods, the MPS daemon, MIG devices, NVML telemetry, the run's record)
/// reads that one. An empty inventory (no GPU, the CPU pipeline) stays empty unless a
/// GPU was asked for (pure).
pub fn narrow_to(inventory: &GpuInventory, selector: Option<&GpuSelector>) -> Result<GpuInventory, String> {
    if inventory.gpus.is_empty() && selector.is_none() {
        return Ok(inventory.clone());
    }
    let gpu = select_gpu(inventory, selector)?.clone();
    Ok(GpuInventory {
        gpus: vec![gpu],
        ..inventory.clone()
    })
}

/// Why a sweep must not measure `gpu` (pure): processes that are not the harness's
/// hold it, and their work would be measured as the cost of sharing. None: idle.
pub fn busy_gpu_refusal(gpu: &GpuInfo) -> Option<String> {
    if gpu.processes.is_empty() {
        return None;
    }
    let list: Vec<String> = gpu.processes.iter().map(ToString::to_string).collect();
    Some(format!(
        "GPU {} ({}) is running {} compute process(es) that are not this run's: {}; their work would be measured as the cost of sharing. Pick an idle GPU with --gpu (`gpushare-bench doctor` lists each GPU's processes), or pass --allow-busy-gpu to measure anyway (run.json records it)",
        gpu.index,
        gpu.name,
        list.len(),
        list.join(", ")
    ))
}

/// Parses `nvidia-smi -L`:
/// ```text
/// GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-…)
///   MIG 1g.5gb      Device  0: (UUID: MIG-c6d4f1ef-…)
/// ```
pub fn parse_nvidia_smi_list(text: &str) -> Vec<GpuInfo> {
    let mut gpus: Vec<GpuInfo> = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        let uuid = t
            .rfind("(UUID: ")
            .and_then(|i| t[i + 7..].strip_suffix(')'))
            .map(str::trim)
            .unwrap_or("")
            .to_string();
        if let Some(rest) = t.strip_prefix("GPU ") {
            let Some((idx, after)) = rest.split_once(':') else {
                continue;
            };
            let Ok(index) = idx.trim().parse() else { continue };
            let name = after.split(" (UUID:").next().unwrap_or("").trim().to_string();
            gpus.push(GpuInfo {
                index,
                name,
                uuid,
                ..GpuInfo::default()
            });
        } else if let Some(rest) = t.strip_prefix("MIG ") {
            let profile = rest.split_whitespace().next().unwrap_or("").to_string();
            if let Some(gpu) = gpus.last_mut()
                && uuid.starts_with("MIG-")
            {
                gpu.mig_devices.push(MigDevice { profile, uuid });
                gpu.mig_enabled = Some(true);
            }
        }
    }
    gpus
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn parses_nvidia_smi_list_with_mig_devices() {
        let text = "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-1234-5678-9abc-def012345678)\n\
  MIG 1g.5gb      Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)\n\
  MIG 1g.5gb      Device  1: (UUID: MIG-cba6c3a5-2c7a-5c8b-9d3e-6b53d3a8e5a1)\n\
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee)\n";
        let gpus = parse_nvidia_smi_list(text);
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].name, "NVIDIA A100-SXM4-40GB");
        assert_eq!(gpus[0].uuid, "GPU-5d5ba0d6-1234-5678-9abc-def012345678");
        assert_eq!(gpus[0].mig_devices.len(), 2);
        assert_eq!(gpus[0].mig_devices[1].profile, "1g.5gb");
        assert_eq!(gpus[0].mig_devices[1].uuid, "MIG-cba6c3a5-2c7a-5c8b-9d3e-6b53d3a8e5a1");
        assert!(gpus[1].mig_devices.is_empty());
        assert_eq!(gpus[1].short_name(), "h100");
        assert_eq!(gpus[0].short_name(), "a100");
    }

    /// The fixtures' hosts, as NVML would add to `nvidia-smi -L`: memory, MIG mode
    /// (on the GPU with MIG devices), bus ids.
    pub(crate) fn host(listing: &str) -> GpuInventory {
        let mut gpus = parse_nvidia_smi_list(listing);
        for g in &mut gpus {
            g.memory_total_bytes = Some(80 << 30);
            g.mig_enabled = Some(!g.mig_devices.is_empty());
            g.compute_mode = Some("Default".into());
            g.pci_bus_id = Some(format!("00000000:{:02X}:00.0", 0x18 + 0x10 * g.index));
        }
        GpuInventory {
            gpus,
            driver_version: Some("580.159.04".into()),
            cuda_driver_version: Some("13.0".into()),
            nvml: true,
        }
    }

    pub(crate) const EIGHT: &str = include_str!("../../tests/fixtures/hosts/dgx-h100-8gpu.nvidia-smi-L.txt");
    pub(crate) const TWO: &str = include_str!("../../tests/fixtures/hosts/h200-2gpu.nvidia-smi-L.txt");

    #[test]
    fn a_gpu_is_chosen_by_index_or_uuid_on_an_eight_gpu_host() {
        let inv = host(EIGHT);
        assert_eq!(inv.gpus.len(), 8);
        assert_eq!(inv.gpus[3].mig_devices.len(), 2);
        let pick = |s: &str| select_gpu(&inv, Some(&s.parse().expect("selector"))).map(|g| g.index);
        assert_eq!(pick("5"), Ok(5));
        assert_eq!(pick("GPU-8ea03145-26dd-4f94-b035-a17c4f5e6d06"), Ok(5));
        assert_eq!(pick("GPU-9fb1"), Ok(6), "a unique prefix is enough");
        assert_eq!(select_gpu(&inv, None).map(|g| g.index), Ok(0), "GPU 0 without --gpu");
        let e = pick("8").expect_err("no GPU 8");
        assert!(
            e.starts_with("there is no GPU 8: this machine has GPU 0: NVIDIA H100 80GB HBM3 (GPU-0a1e3c55"),
            "{e}"
        );
        assert!(
            e.contains("GPU 7: NVIDIA H100 80GB HBM3 (GPU-a0c25367-48ff-41b6-d257-c39e617a8f08, bus 00000000:88:00.0)"),
            "{e}"
        );
        let e = pick("GPU-0a1e3c55").expect_err("GPUs 0 and 1 share it");
        assert!(e.starts_with("GPU-0a1e3c55 is the start of 2 GPUs' UUIDs"), "{e}");
        let e = pick("GPU-ffff").expect_err("nobody's");
        assert!(e.starts_with("no GPU has UUID GPU-ffff"), "{e}");
        let e = "MIG-1d2c3b4a-5e6f-5a7b-8c9d-0e1f2a3b4c50"
            .parse::<GpuSelector>()
            .expect_err("a MIG device");
        assert!(e.contains("is a MIG device, not a GPU"), "{e}");
        let e = "h100".parse::<GpuSelector>().expect_err("a name");
        assert!(e.contains("neither a GPU index"), "{e}");
    }

    #[test]
    fn a_run_keeps_only_its_gpu_with_its_own_index() {
        let inv = host(TWO);
        let one = narrow_to(&inv, Some(&GpuSelector::Index(1))).expect("GPU 1");
        assert_eq!(one.gpus.len(), 1);
        assert_eq!(one.gpus[0].index, 1);
        assert_eq!(one.gpus[0].uuid, "GPU-4e7b0c32-d5e9-4f18-9b26-a3c1e8f40722");
        assert_eq!(one.driver_version.as_deref(), Some("580.159.04"));
        let rec = one.gpus[0].record();
        assert_eq!((rec.index, rec.pci_bus_id.as_deref()), (1, Some("00000000:28:00.0")));
        assert_eq!(narrow_to(&inv, None).expect("GPU 0").gpus[0].index, 0);
        // No GPU: the CPU pipeline's empty inventory stays empty, unless one is asked for.
        let none = GpuInventory::default();
        assert!(narrow_to(&none, None).expect("cpu").gpus.is_empty());
        let e = narrow_to(&none, Some(&GpuSelector::Index(0))).expect_err("no GPU");
        assert!(e.contains("NVML lists no NVIDIA GPU here"), "{e}");
    }

    #[test]
    fn a_busy_gpu_is_refused_naming_what_runs_there() {
        let mut inv = host(TWO);
        assert_eq!(busy_gpu_refusal(&inv.gpus[0]), None);
        inv.gpus[0].processes = vec![
            GpuProcess {
                pid: 4242,
                name: Some("python3".into()),
                used_memory_bytes: Some(3 << 30),
            },
            GpuProcess {
                pid: 77,
                name: None,
                used_memory_bytes: None,
            },
        ];
        let why = busy_gpu_refusal(&inv.gpus[0]).expect("busy");
        assert!(
            why.starts_with("GPU 0 (NVIDIA H200) is running 2 compute process(es) that are not this run's: 4242 python3 (3072 MiB), 77 (name unknown);"),
            "{why}"
        );
        assert!(why.contains("--allow-busy-gpu"), "{why}");
    }

    #[test]
    fn selectors_round_trip_through_the_config_file() {
        #[derive(Deserialize, Serialize)]
        struct F {
            gpu: GpuSelector,
        }
        for (text, want) in [
            ("gpu = 3", GpuSelector::Index(3)),
            ("gpu = \"3\"", GpuSelector::Index(3)),
            ("gpu = \"GPU-8ea0\"", GpuSelector::Uuid("GPU-8ea0".into())),
        ] {
            let f: F = toml::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(f.gpu, want, "{text}");
            assert_eq!(serde_json::to_value(&f).expect("json")["gpu"], want.to_string());
        }
        let e = toml::from_str::<F>("gpu = \"MIG-1\"").err().expect("MIG").to_string();
        assert!(e.contains("is a MIG device"), "{e}");
    }
}
