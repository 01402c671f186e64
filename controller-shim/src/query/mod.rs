//! The command line's clients.

pub mod endpoint;
pub mod status;
pub mod wait;
