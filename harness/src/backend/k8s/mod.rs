//! Kubernetes: the objects and patches the harness applies (pure: [`objects`], and
//! [`dra_claims`] for the ResourceClaims of `--sharing-api dra`), what both sharing paths
//! stand on ([`base`]: the client settings, pod state, the workload, the journal's
//! restore), the two paths beside each other ([`device_plugin`]: the GPU operator's
//! device-plugin config; [`dra`]: DRA claims), the two Deployments of an isolation trial
//! ([`trial`]), and the port-forward to the cluster's Prometheus ([`portforward`]).

pub mod base;
#[cfg(test)]
mod cluster_tests;
#[cfg(test)]
mod common_tests;
pub mod device_plugin;
pub mod dra;
pub mod dra_claims;
#[cfg(test)]
mod dra_cluster_tests;
pub mod journal;
pub mod manifests;
pub mod objects;
pub mod portforward;
#[cfg(test)]
mod process_cluster_tests;
#[cfg(test)]
mod real_node_tests;
pub mod session;
pub mod trial;
