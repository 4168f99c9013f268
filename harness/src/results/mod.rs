//! What a run leaves on disk: the records ([`record`], one serde struct per record;
//! [`isolation`], one per isolation trial) and the run directory that holds them
//! ([`store`]: atomic writes, resume; [`lock`]: one sweep at a time); [`repeats`] makes
//! one row of a cell measured in several repeats.

pub mod isolation;
pub mod lock;
pub mod record;
pub mod repeats;
pub mod store;
