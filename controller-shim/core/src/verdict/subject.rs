//! What a verdict is about, and the one place that renders it.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::model::PodModel;

/// What a verdict is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// A Secret, ConfigMap or projected volume of the pod.
    Volume {
        /// Volume name.
        volume: Arc<str>,
    },
    /// A subPath mount of a container.
    SubPath {
        /// Container name.
        container: Arc<str>,
        /// Volume name.
        volume: Arc<str>,
        /// Position in the container's `volumeMounts`.
        index: u32,
        /// The subPath.
        sub_path: Arc<str>,
    },
    /// An environment reference of a container.
    Env {
        /// Container name.
        container: Arc<str>,
        /// Variable name (`valueFrom`), or `envFrom` plus the prefix if any.
        var: Arc<str>,
    },
}

/// Stable identity of a subject within a pod (pod specs are immutable in
/// the fields that matter, so indexes are stable for a pod UID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SubjectId {
    /// Volume index.
    Volume(u16),
    /// (container index, mount index).
    SubPath(u16, u16),
    /// (container index, env reference index).
    Env(u16, u16),
}

/// The subject a [`SubjectId`] names in `pod`.
pub fn subject_of(pod: &PodModel, id: SubjectId) -> Subject {
    let unknown = || Subject::Volume {
        volume: Arc::from("?"),
    };
    match id {
        SubjectId::Volume(vi) => {
            pod.volumes
                .get(vi as usize)
                .map_or_else(unknown, |v| Subject::Volume {
                    volume: v.name.clone(),
                })
        }
        SubjectId::SubPath(ci, mi) => {
            let Some(c) = pod.containers.get(ci as usize) else {
                return unknown();
            };
            let Some(m) = c.mounts.get(mi as usize) else {
                return unknown();
            };
            Subject::SubPath {
                container: c.name.clone(),
                volume: pod
                    .volumes
                    .get(m.volume as usize)
                    .map_or_else(|| Arc::from("?"), |v| v.name.clone()),
                index: m.index,
                sub_path: m
                    .sub_path
                    .clone()
                    .unwrap_or_else(|| Arc::from("$(subPathExpr)")),
            }
        }
        SubjectId::Env(ci, ei) => {
            let Some(c) = pod.containers.get(ci as usize) else {
                return unknown();
            };
            let var: Arc<str> = match c.env.get(ei as usize) {
                Some(crate::model::EnvRef::Key { var, .. }) => var.clone(),
                Some(crate::model::EnvRef::From { prefix, .. }) if prefix.is_empty() => {
                    Arc::from("envFrom")
                }
                Some(crate::model::EnvRef::From { prefix, .. }) => {
                    Arc::from(format!("envFrom:{prefix}"))
                }
                None => Arc::from("?"),
            };
            Subject::Env {
                container: c.name.clone(),
                var,
            }
        }
    }
}
