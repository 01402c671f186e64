//! Object access the rig's own actors share across the two control planes.
//!
//! The NodeSet double, the slurmd/slurmctld bridge, the operator double's
//! rules and the end-to-end scenario steps read and write Kubernetes
//! objects through [`Objects`]: the API server double's [`ApiHandle`]
//! (in-process, the cluster in a box) implements it, and so does
//! `real::objects::RealObjects` (a `kube::Client` of the real API server,
//! feature `real-upstream`). The calls are synchronous, as the in-box
//! handle's are, so one body of rules or of a test step runs against
//! either; the real client blocks its caller (on a multi-threaded tokio
//! runtime, or on a thread outside it).

use serde_json::Value;

use crate::apiserver::resources::ResourceType;
use crate::apiserver::{ApiError, ApiHandle, DeleteOptions};

/// Get, list, create, patch, delete, bind and evict, as the rig uses them.
pub trait Objects: Send + Sync {
    /// One object.
    fn get(&self, rt: &ResourceType, ns: &str, name: &str) -> Result<Value, ApiError>;
    /// Every object of `rt` (in `ns`, or in every namespace); empty when
    /// the list fails.
    fn list_all(&self, rt: &ResourceType, ns: Option<&str>) -> Vec<Value>;
    /// Creates `obj` in `ns`.
    fn create(&self, rt: &ResourceType, ns: &str, obj: Value) -> Result<Value, ApiError>;
    /// A JSON merge patch, of the object or of a subresource (`status`).
    fn merge_patch(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        patch: &Value,
        subresource: Option<&str>,
    ) -> Result<Value, ApiError>;
    /// Deletes an object (graceful for bound pods).
    fn delete(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<(), ApiError>;
    /// Binds pod `ns/name` to `node` (the `binding` subresource).
    fn bind(&self, ns: &str, name: &str, node: &str) -> Result<Value, ApiError>;
    /// Evicts pod `ns/name` through the Eviction API (PDB-aware).
    fn evict(&self, ns: &str, name: &str) -> Result<(), ApiError>;
}

impl Objects for ApiHandle {
    fn get(&self, rt: &ResourceType, ns: &str, name: &str) -> Result<Value, ApiError> {
        ApiHandle::get(self, rt, ns, name)
    }

    fn list_all(&self, rt: &ResourceType, ns: Option<&str>) -> Vec<Value> {
        ApiHandle::list_all(self, rt, ns)
    }

    fn create(&self, rt: &ResourceType, ns: &str, obj: Value) -> Result<Value, ApiError> {
        ApiHandle::create(self, rt, ns, obj)
    }

    fn merge_patch(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        patch: &Value,
        subresource: Option<&str>,
    ) -> Result<Value, ApiError> {
        ApiHandle::merge_patch(self, rt, ns, name, patch, subresource)
    }

    fn delete(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<(), ApiError> {
        ApiHandle::delete(self, rt, ns, name, opts).map(|_| ())
    }

    fn bind(&self, ns: &str, name: &str, node: &str) -> Result<Value, ApiError> {
        ApiHandle::bind(self, ns, name, node)
    }

    fn evict(&self, ns: &str, name: &str) -> Result<(), ApiError> {
        ApiHandle::evict(self, ns, name)
    }
}
