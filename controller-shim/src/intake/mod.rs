//! The agents' report API.

pub mod auth;
pub mod report;
