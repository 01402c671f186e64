//! The status API.

pub mod authorize;
pub(crate) mod routes;
pub mod store;
