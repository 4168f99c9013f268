//! What a run leaves on disk: the records ([`record`], one serde struct per record) and
//! the run directory that holds them ([`store`]: atomic writes, resume; [`lock`]: one
//! sweep at a time).

pub mod lock;
pub mod record;
pub mod store;
