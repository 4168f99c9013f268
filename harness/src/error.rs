//! Typed errors of the harness. Every variant names what the user has to look at: the
//! flag, the file, the pod, the strategy.

use std::path::PathBuf;

/// Everything that can stop or degrade a sweep.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A command-line flag has a bad value.
    #[error("bad {flag} `{value}`: {reason}")]
    Flag {
        /// The flag, e.g. `--pods`.
        flag: String,
        /// The value given.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// A command needs a flag that was not given (nor set in the config file).
    #[error("missing {flag}: {reason}")]
    MissingFlag {
        /// The flag, e.g. `--slo`.
        flag: String,
        /// What it is for.
        reason: String,
    },
    /// The config file is unreadable or invalid.
    #[error("config file {}: {reason}", path.display())]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A Prometheus exposition could not be parsed.
    #[error("metrics from {source_name}, line {line}: {reason}")]
    MetricsText {
        /// Where the text came from (pod or URL).
        source_name: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// The metrics lack something the contract promises.
    #[error("metrics from {source_name}: {reason}")]
    MetricsContract {
        /// Where the text came from.
        source_name: String,
        /// What is missing or inconsistent.
        reason: String,
    },
    /// A pod's metrics endpoint did not answer.
    #[error("scraping {pod} at {url}: {reason}")]
    Scrape {
        /// The pod.
        pod: String,
        /// The URL.
        url: String,
        /// What happened.
        reason: String,
    },
    /// The workload binary could not be started.
    #[error("starting workload pod {pod}: {reason}")]
    Spawn {
        /// The pod.
        pod: String,
        /// What happened.
        reason: String,
    },
    /// The MPS control daemon could not be started or stopped.
    #[error("MPS control daemon: {what}{}", source.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    Mps {
        /// What was being done, and what went wrong.
        what: String,
        /// The operating system's answer, when there was one.
        #[source]
        source: Option<std::io::Error>,
    },
    /// A run directory that says something it may not (a tampered or foreign file, a
    /// run that is not there, two runs that cannot be compared): bad input, exit 2.
    #[error("results {}: {reason}", path.display())]
    RunDir {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A results directory that cannot be read or written.
    #[error("results {}: {reason}", path.display())]
    Results {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The Prometheus server path failed.
    #[error("Prometheus {url}: {reason}")]
    Prometheus {
        /// The server.
        url: String,
        /// What happened.
        reason: String,
    },
    /// The Kubernetes backend failed.
    #[error("Kubernetes: {what}{}", detail.as_ref().map(|d| format!(": {d}")).unwrap_or_default())]
    Kubernetes {
        /// What was being done (names the node, object or pod).
        what: String,
        /// The API server's answer in words (with the RBAC hint on 403).
        detail: Option<String>,
        /// The client's error, when there was one.
        #[source]
        source: Option<Box<kube::Error>>,
    },
    /// The sweep was interrupted by a signal (SIGINT, SIGTERM, SIGHUP).
    #[error("interrupted{}; finished cells are saved", signal_name(*signal).map(|n| format!(" by {n}")).unwrap_or_default())]
    Interrupted {
        /// The signal number (0 when the stop was asked for without one).
        signal: i32,
    },
    /// The GPU to measure runs processes that are not the run's (`--allow-busy-gpu`
    /// measures anyway).
    #[error("{detail}")]
    GpuBusy {
        /// Which GPU, what runs on it, and the way out.
        detail: String,
    },
    /// Plain I/O.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The operating system's answer.
        source: std::io::Error,
    },
}

impl BenchError {
    /// An I/O error with context.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BenchError {
        let what = what.into();
        move |source| BenchError::Io { what, source }
    }

    /// A bad flag value.
    pub fn flag(flag: &str, value: &str, reason: impl Into<String>) -> BenchError {
        BenchError::Flag {
            flag: flag.into(),
            value: value.into(),
            reason: reason.into(),
        }
    }

    /// A Kubernetes failure without a client error (a timeout, a missing label).
    pub fn kube(what: impl Into<String>) -> BenchError {
        BenchError::Kubernetes {
            what: what.into(),
            detail: None,
            source: None,
        }
    }

    /// An MPS failure without an operating-system error.
    pub fn mps(what: impl Into<String>) -> BenchError {
        BenchError::Mps {
            what: what.into(),
            source: None,
        }
    }

    /// Whether this is an interrupt (a signal asked the run to stop).
    pub fn is_interrupt(&self) -> bool {
        matches!(self, BenchError::Interrupted { .. })
    }

    /// Process exit code: 2 for bad input (flags, config), 128 + the signal for an
    /// interrupt (130 SIGINT, 143 SIGTERM, 129 SIGHUP), 1 else.
    pub fn exit_code(&self) -> i32 {
        match self {
            BenchError::Flag { .. }
            | BenchError::MissingFlag { .. }
            | BenchError::Config { .. }
            | BenchError::RunDir { .. } => 2,
            BenchError::Interrupted { signal } if *signal > 0 => 128 + signal,
            BenchError::Interrupted { .. } => 130,
            _ => 1,
        }
    }
}

/// The name of a stop signal, for messages.
fn signal_name(signal: i32) -> Option<&'static str> {
    match signal {
        libc::SIGINT => Some("SIGINT"),
        libc::SIGTERM => Some("SIGTERM"),
        libc::SIGHUP => Some("SIGHUP"),
        _ => None,
    }
}

/// Result alias of the harness.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;
