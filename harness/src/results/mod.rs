//! What a run leaves on disk: the records ([`record`], one serde struct per record;
//! [`isolation`], one per isolation trial) and the run directory that holds them
//! ([`store`]: atomic writes, resume; [`lock`]: one sweep at a time); [`repeats`] makes
//! one row of a cell measured in several repeats; [`raw`] keeps each cell's per-window
//! histogram increments, from which `verify` recomputes the rows, and [`requests`] each
//! streamed request; [`jsonl`] reads and writes both.

pub mod equal_load;
pub mod isolation;
pub mod jsonl;
pub mod lock;
pub mod raw;
pub mod record;
pub mod repeats;
pub mod requests;
pub mod store;
