//! A test cluster for the Kubernetes backend: Kubernetes' own control plane
//! ([`control_plane`]: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
//! kubectl of v1.34, built from their Go modules) with one GPU node under the NVIDIA GPU
//! operator played through its API ([`node`], as KWOK plays nodes), put together by
//! [`cluster::TestCluster`].
//!
//! What is real: everything the API server, the scheduler and the controllers decide
//! (validation, server-side apply, RBAC, scheduling and DRA allocation, Deployments,
//! ReplicaSets, DaemonSets, garbage collection, claims). What is simulated: the node's
//! own components (kubelet, device plugin and its config-manager, GPU feature discovery,
//! the MPS control daemon, the MIG manager, NVIDIA's DRA kubelet plugin), which need a
//! GPU. Each of their rules cites the upstream file and version it reproduces
//! (UPSTREAM-RULES.md); nothing in them was observed on a real GPU node. With
//! [`node::ProcessSpec`] the kubelet runs workload containers as local processes, which
//! [`prometheus::DiscoveringPrometheus`] (Prometheus's own server, built from its Go
//! module) discovers through the API server and scrapes.
//!
//! [`real_node`] is a node of the real components instead: the pinned kubelet,
//! containerd, runc and the CNI bridge in namespaces of their own, NVIDIA's device plugin
//! v0.18.1 in the GPU operator's DaemonSet layout against a `libnvidia-ml.so.1` that
//! answers from go-nvml's mock NVML server.

pub mod cluster;
pub mod control_plane;
pub mod dra;
pub mod gpu;
pub mod kubelet;
pub mod node;
pub mod prometheus;
pub mod real_node;
pub mod spec;

pub use self::spec::{ClusterSpec, PodFacts, Timings};
