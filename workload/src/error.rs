//! Typed errors of the workload, each mapped to the process exit code of the contract
//! (docs/metrics-contract.md): 2 bad arguments or input files, 3 no GPU or driver, 4 out of GPU memory,
//! 1 anything else.

use std::path::PathBuf;

/// Everything that can stop the workload, with the names a user needs to fix it.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// `--model` named no preset.
    #[error("unknown model `{0}`: expected one of yolos-small, minilm-l6, tiny")]
    UnknownPreset(String),
    /// `--precision` named no precision.
    #[error("unknown precision `{0}`: expected one of fp32, tf32, bf16")]
    UnknownPrecision(String),
    /// `--device` named no device.
    #[error("unknown device `{0}`: expected cuda or cpu")]
    UnknownDevice(String),
    /// `--load` is not `closed` or `poisson:RATE`.
    #[error("bad --load `{value}`: {reason} (expected `closed` or `poisson:RATE`, RATE in inferences per second, > 0)")]
    BadLoad {
        /// The value given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A byte size such as `--reserve-memory` did not parse.
    #[error("bad size `{value}`: {reason} (examples: 0, 512MiB, 2GiB, 1.5GB, 1000000)")]
    BadSize {
        /// The value given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A duration or a schedule (`--add-latency`, `--inject-fault-after`,
    /// `--grow-memory`) did not parse.
    #[error("bad {flag} `{value}`: {reason}")]
    BadDelay {
        /// The flag.
        flag: &'static str,
        /// The value given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Any other combination of arguments that cannot work.
    #[error("{0}")]
    BadArgument(String),
    /// `--crash-after` sent SIGKILL to this process and the kernel ignored it (the
    /// process is its PID namespace's init).
    #[error(
        "--crash-after: SIGKILL was ignored: this process is its PID namespace's init (PID {0}), which a signal from inside that namespace cannot kill; in a container set shareProcessNamespace: true"
    )]
    CrashIgnored(u32),
    /// The HTTP listener could not be bound (port in use, bad address, ...).
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address from `--listen`.
        addr: String,
        /// The operating system's answer.
        source: std::io::Error,
    },
    /// The weights directory is missing or incomplete.
    #[error("weights directory {}: {reason}", path.display())]
    WeightsDir {
        /// The directory from `--weights`.
        path: PathBuf,
        /// What is missing.
        reason: String,
    },
    /// A tensor the model needs is not in the weights file.
    #[error("weights file {}: tensor `{name}` is missing", path.display())]
    MissingTensor {
        /// The safetensors file.
        path: PathBuf,
        /// The tensor name.
        name: String,
    },
    /// A tensor has the wrong shape for the preset.
    #[error("weights file {}: tensor `{name}` has shape {found:?}, expected {expected:?}", path.display())]
    TensorShape {
        /// The safetensors file.
        path: PathBuf,
        /// The tensor name.
        name: String,
        /// Shape in the file.
        found: Vec<usize>,
        /// Shape the preset needs.
        expected: Vec<usize>,
    },
    /// The weights file is unreadable or not safetensors, or a tensor has an unsupported type.
    #[error("weights file {}: {reason}", path.display())]
    WeightsFormat {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The tokenizer could not be loaded or failed on the input.
    #[error("tokenizer {}: {reason}", path.display())]
    Tokenizer {
        /// The tokenizer.json file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// No CUDA driver library (libcuda) could be loaded.
    #[error("no NVIDIA driver: {0}")]
    NoDriver(String),
    /// The driver loaded but no GPU can be used.
    #[error("no usable NVIDIA GPU: {0}")]
    NoGpu(String),
    /// A CUDA library the backend needs (cuBLASLt, NVRTC) is missing.
    #[error("CUDA library {library} not found: {hint}")]
    MissingLibrary {
        /// The library, e.g. `libcublasLt.so.13`.
        library: String,
        /// How to provide it.
        hint: String,
    },
    /// A device allocation failed for lack of memory.
    #[error("out of GPU memory while allocating {what}: {requested} bytes requested, {free} of {total} bytes free")]
    OutOfMemory {
        /// What was being allocated.
        what: String,
        /// Bytes asked for.
        requested: usize,
        /// Bytes free on the device at that moment.
        free: usize,
        /// Bytes on the device (or in the MIG instance / under the MPS limit).
        total: usize,
    },
    /// Any other CUDA driver, cuBLASLt or kernel failure.
    #[error("CUDA error while {what}: {detail}")]
    Cuda {
        /// What the workload was doing.
        what: String,
        /// The library's error name and text.
        detail: String,
    },
    /// A fault that loses the process's CUDA context (an illegal address, a failed
    /// launch, the MPS server ending the client): no call on it can succeed again, a new
    /// process gets a fresh one. No GPU reset is needed.
    #[error("GPU fault while {what}: {detail} (this process's CUDA context is lost)")]
    GpuFault {
        /// What the workload was doing.
        what: String,
        /// The driver's error name and text.
        detail: String,
    },
    /// NVRTC rejected one of our kernel sources.
    #[error("compiling CUDA kernels `{module}` failed: {log}")]
    KernelCompile {
        /// The kernel family (source file).
        module: String,
        /// The compiler log.
        log: String,
    },
    /// A stop signal arrived during an inference and the inference was abandoned
    /// (a clean stop: exit code 0; nothing of the abandoned inference is recorded).
    #[error("stopped during an inference")]
    Cancelled,
    /// Input/output outside the above (reading a file, the runtime).
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The operating system's answer.
        source: std::io::Error,
    },
}

/// Process exit codes of the workload contract.
pub mod exit {
    /// Clean stop (SIGTERM/SIGINT, or a finished bench).
    pub const OK: i32 = 0;
    /// Anything not covered below.
    pub const OTHER: i32 = 1;
    /// Bad arguments or input files.
    pub const BAD_ARGUMENTS: i32 = 2;
    /// No GPU or no driver.
    pub const NO_GPU: i32 = 3;
    /// Out of GPU memory.
    pub const OUT_OF_MEMORY: i32 = 4;
    /// A GPU fault lost the CUDA context (injected with `--inject-fault-after`, or a
    /// neighbour's fault under MPS).
    pub const GPU_FAULT: i32 = 5;
}

impl WorkloadError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> i32 {
        use WorkloadError::*;
        match self {
            UnknownPreset(_)
            | UnknownPrecision(_)
            | UnknownDevice(_)
            | BadLoad { .. }
            | BadSize { .. }
            | BadDelay { .. }
            | BadArgument(_)
            | Listen { .. }
            | WeightsDir { .. }
            | MissingTensor { .. }
            | TensorShape { .. }
            | WeightsFormat { .. }
            | Tokenizer { .. } => exit::BAD_ARGUMENTS,
            NoDriver(_) | NoGpu(_) | MissingLibrary { .. } => exit::NO_GPU,
            OutOfMemory { .. } => exit::OUT_OF_MEMORY,
            GpuFault { .. } => exit::GPU_FAULT,
            Cuda { .. } | KernelCompile { .. } | Io { .. } | CrashIgnored(_) => exit::OTHER,
            Cancelled => exit::OK,
        }
    }
}

/// Result alias of the workload crate.
pub type Result<T, E = WorkloadError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_contract() {
        assert_eq!(WorkloadError::UnknownPreset("x".into()).exit_code(), 2);
        assert_eq!(WorkloadError::NoDriver("x".into()).exit_code(), 3);
        let oom = WorkloadError::OutOfMemory {
            what: "weights".into(),
            requested: 1,
            free: 0,
            total: 1,
        };
        assert_eq!(oom.exit_code(), 4);
        let cuda = WorkloadError::Cuda {
            what: "launching".into(),
            detail: "x".into(),
        };
        assert_eq!(cuda.exit_code(), 1);
        assert_eq!(WorkloadError::Cancelled.exit_code(), 0);
    }

    #[test]
    fn messages_name_the_bad_input() {
        let e = WorkloadError::TensorShape {
            path: "/w/model.safetensors".into(),
            name: "encoder.layer.0.attention.self.query.weight".into(),
            found: vec![384, 383],
            expected: vec![384, 384],
        };
        let text = e.to_string();
        assert!(text.contains("encoder.layer.0.attention.self.query.weight"));
        assert!(text.contains("[384, 383]"));
        assert!(text.contains("/w/model.safetensors"));
    }
}
