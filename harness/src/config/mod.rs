//! Configuration: the command line ([`cli`]) and the sweep options shared by flags and
//! config files, validated into one [`plan::SweepPlan`] that the rest of the program
//! uses. Pure: nothing here touches the machine.

pub mod cli;
pub mod isolation;
pub mod options;
pub mod plan;
pub mod request;
pub mod values;
