//! Kubernetes: the objects and patches the harness applies (pure, `objects`), the
//! backend that applies them to one GPU node (`backend`), and the port-forward to the
//! cluster's Prometheus (`portforward`); `dra` the ResourceClaims of `--sharing-api dra`.

pub mod backend;
pub mod dra;
pub mod dra_backend;
pub mod journal;
pub mod manifests;
pub mod objects;
pub mod portforward;
pub mod session;
pub mod sim;
#[cfg(test)]
mod sim_tests;
pub mod trial;
