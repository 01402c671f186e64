//! The agents' report API.

pub mod auth;
pub mod body;
pub mod limits;
pub mod report;
