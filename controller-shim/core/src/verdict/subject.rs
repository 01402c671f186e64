//! What a verdict is about, and the one place that writes it down. Every
//! output names a subject through one of these forms:
//! * [`Subject::text`], for people: the status endpoint and `status`, Events
//!   and their notes, `verify`'s table, remediation messages
//!   (`volume slurm-etc`, `subPath slurmd:sshd-config/sshd_config`,
//!   `env slurmd:SLURM_CONF`);
//! * [`Subject::metric_label`], the `volume` label of
//!   `mountguard_mount_state` (`slurm-etc`, `subPath:slurmd/2`,
//!   `env:slurmd/SLURM_CONF`), kept short and stable for dashboards;
//! * [`SubjectKey`], how remediation records a failing subject in a
//!   persisted attempt and finds it again among the replacement pod's
//!   verdicts (`volume slurm-etc`, `subPath slurmd/2`, `env slurmd/SLURM_CONF`):
//!   matched as a value, never by comparing rendered text.

use std::fmt;
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
                Some(
                    crate::model::EnvRef::Key { var, .. }
                    | crate::model::EnvRef::NotFromApi { var, .. },
                ) => var.clone(),
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

impl Subject {
    /// The subject as shown to people (status, Events, `verify`,
    /// remediation messages).
    pub fn text(&self) -> String {
        match self {
            Subject::Volume { volume } => format!("volume {volume}"),
            Subject::SubPath {
                container,
                volume,
                sub_path,
                ..
            } => format!("subPath {container}:{volume}/{sub_path}"),
            Subject::Env { container, var } => format!("env {container}:{var}"),
        }
    }

    /// The `volume` label of the `mountguard_mount_state` series.
    pub fn metric_label(&self) -> String {
        match self {
            Subject::Volume { volume } => volume.to_string(),
            Subject::SubPath {
                container, index, ..
            } => format!("subPath:{container}/{index}"),
            Subject::Env { container, var } => format!("env:{container}/{var}"),
        }
    }

    /// The key remediation records and matches this subject by.
    pub fn key(&self) -> SubjectKey {
        match self {
            Subject::Volume { volume } => SubjectKey::Volume {
                volume: volume.to_string(),
            },
            Subject::SubPath {
                container, index, ..
            } => SubjectKey::SubPath {
                container: container.to_string(),
                index: *index,
            },
            Subject::Env { container, var } => SubjectKey::Env {
                container: container.to_string(),
                var: var.to_string(),
            },
        }
    }
}

/// A subject as remediation records it: by names (a replacement pod is a
/// new pod, so [`SubjectId`] positions do not carry over), stable across
/// the pods of a NodeSet. Persisted as text (`volume <v>`,
/// `subPath <container>/<index>`, `env <container>/<var>`); text in none of
/// these forms (written by hand) is kept as [`SubjectKey::Other`], shown
/// as it is and matching no verdict.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SubjectKey {
    /// A volume, by name.
    Volume {
        /// Volume name.
        volume: String,
    },
    /// A subPath mount, by container and position in its `volumeMounts`.
    SubPath {
        /// Container name.
        container: String,
        /// Position in the container's `volumeMounts`.
        index: u32,
    },
    /// An environment reference, by container and variable.
    Env {
        /// Container name.
        container: String,
        /// Variable name (`valueFrom`), or `envFrom` plus the prefix if any.
        var: String,
    },
    /// Text in none of the forms above.
    Other(String),
}

impl fmt::Display for SubjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubjectKey::Volume { volume } => write!(f, "volume {volume}"),
            SubjectKey::SubPath { container, index } => write!(f, "subPath {container}/{index}"),
            SubjectKey::Env { container, var } => write!(f, "env {container}/{var}"),
            SubjectKey::Other(s) => f.write_str(s),
        }
    }
}

impl From<&str> for SubjectKey {
    /// Reads the persisted form. Container names (DNS labels) hold no `/`,
    /// so the first `/` ends the container.
    fn from(s: &str) -> Self {
        let parsed = if let Some(volume) = s.strip_prefix("volume ") {
            Some(SubjectKey::Volume {
                volume: volume.to_string(),
            })
        } else if let Some(rest) = s.strip_prefix("subPath ") {
            rest.split_once('/').and_then(|(container, index)| {
                Some(SubjectKey::SubPath {
                    container: container.to_string(),
                    index: index.parse().ok()?,
                })
            })
        } else if let Some(rest) = s.strip_prefix("env ") {
            rest.split_once('/')
                .map(|(container, var)| SubjectKey::Env {
                    container: container.to_string(),
                    var: var.to_string(),
                })
        } else {
            None
        };
        parsed.unwrap_or_else(|| SubjectKey::Other(s.to_string()))
    }
}

impl Serialize for SubjectKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SubjectKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(SubjectKey::from(s.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    #[test]
    fn every_form_of_every_subject() {
        let volume = Subject::Volume { volume: a("etc") };
        let sub_path = Subject::SubPath {
            container: a("slurmd"),
            volume: a("sshd-config"),
            index: 2,
            sub_path: a("sshd_config"),
        };
        let env = Subject::Env {
            container: a("slurmd"),
            var: a("envFrom:SLURM_"),
        };
        let table = [
            (&volume, "volume etc", "etc", "volume etc"),
            (
                &sub_path,
                "subPath slurmd:sshd-config/sshd_config",
                "subPath:slurmd/2",
                "subPath slurmd/2",
            ),
            (
                &env,
                "env slurmd:envFrom:SLURM_",
                "env:slurmd/envFrom:SLURM_",
                "env slurmd/envFrom:SLURM_",
            ),
        ];
        for (s, text, label, key) in table {
            assert_eq!(s.text(), text);
            assert_eq!(s.metric_label(), label);
            assert_eq!(s.key().to_string(), key);
            // The persisted form reads back as the same key.
            assert_eq!(SubjectKey::from(key), s.key(), "{key}");
            let json = serde_json::to_string(&s.key()).unwrap();
            assert_eq!(json, format!("{key:?}"));
            assert_eq!(serde_json::from_str::<SubjectKey>(&json).unwrap(), s.key());
        }
    }

    #[test]
    fn keys_match_by_value_and_odd_text_is_kept() {
        // A variable whose name holds a slash stays one variable.
        assert_eq!(
            SubjectKey::from("env c/a/b"),
            SubjectKey::Env {
                container: "c".into(),
                var: "a/b".into()
            }
        );
        for odd in ["", "volume", "subPath c/x", "subPath c", "env c", "mount x"] {
            let k = SubjectKey::from(odd);
            assert_eq!(k, SubjectKey::Other(odd.to_string()), "{odd:?}");
            assert_eq!(k.to_string(), odd);
        }
        // Same names, other positions: other keys.
        let k = |i| {
            Subject::SubPath {
                container: a("c"),
                volume: a("v"),
                index: i,
                sub_path: a("p"),
            }
            .key()
        };
        assert_ne!(k(1), k(2));
        assert_eq!(k(1), k(1));
    }
}
