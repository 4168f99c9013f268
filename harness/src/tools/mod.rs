//! Commands beside the sweep: `doctor` (is this machine ready?) and `overhead` (what
//! does measuring cost?).

pub mod doctor;
pub mod k8s_doctor;
pub mod overhead;
