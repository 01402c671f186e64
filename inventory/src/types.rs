//! Wire types of the node inventory (`mountguard.io/node-inventory/v1`).

use std::collections::BTreeMap;
use std::fmt;

use jiff::Timestamp;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::digest::{FileDigest, from_hex, to_hex};
use crate::{Error, SCHEMA};

/// A SHA-256 digest that travels as 64 lowercase hex characters.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sha256Hex(pub FileDigest);

impl fmt::Debug for Sha256Hex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print a full digest by accident in logs: Debug shows a prefix.
        write!(f, "Sha256Hex({}..)", &to_hex(&self.0)[..8])
    }
}

impl Serialize for Sha256Hex {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&to_hex(&self.0))
    }
}

impl<'de> Deserialize<'de> for Sha256Hex {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        from_hex(&s).map(Sha256Hex).ok_or_else(|| {
            serde::de::Error::custom(format!("digest {s:?} is not 64 lowercase hex characters"))
        })
    }
}

/// Everything the agent saw on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeInventory {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// The Kubernetes node name.
    pub node: String,
    /// Version of the agent that produced this inventory.
    pub agent_version: String,
    /// Bumped by the agent whenever the inventory content changes; a
    /// restarted agent starts again from its start time in milliseconds so
    /// generations keep increasing across restarts.
    pub generation: u64,
    /// When the scan that produced this inventory finished.
    pub scanned_at: Timestamp,
    /// Pods found under `<kubelet-root>/pods`, sorted by UID.
    pub pods: Vec<PodInventory>,
}

impl NodeInventory {
    /// A new, empty inventory for `node`.
    pub fn new(
        node: impl Into<String>,
        agent_version: impl Into<String>,
        scanned_at: Timestamp,
    ) -> Self {
        Self {
            schema: SCHEMA.to_string(),
            node: node.into(),
            agent_version: agent_version.into(),
            generation: 0,
            scanned_at,
            pods: Vec::new(),
        }
    }

    /// Parses and checks an inventory document.
    pub fn from_json(bytes: &[u8]) -> Result<Self, Error> {
        let inv: NodeInventory = serde_json::from_slice(bytes)?;
        if inv.schema != SCHEMA {
            return Err(Error::Schema { found: inv.schema });
        }
        Ok(inv)
    }

    /// The pod with this UID, if present.
    pub fn pod(&self, uid: &str) -> Option<&PodInventory> {
        self.pods.iter().find(|p| p.uid == uid)
    }
}

/// One pod directory `<kubelet-root>/pods/<uid>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodInventory {
    /// The pod UID (the directory name).
    pub uid: String,
    /// Secret, ConfigMap and projected volumes, sorted by (plugin, name).
    #[serde(default)]
    pub volumes: Vec<VolumeInventory>,
    /// subPath bind targets, sorted by (volume, container, index).
    #[serde(default)]
    pub sub_paths: Vec<SubPathInventory>,
    /// Problems with the pod directory itself (e.g. it vanished mid-scan).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<ReadError>,
}

impl PodInventory {
    /// The volume with this name, if present.
    pub fn volume(&self, name: &str) -> Option<&VolumeInventory> {
        self.volumes.iter().find(|v| v.name == name)
    }
}

/// The volume plugin directory a volume was found under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Plugin {
    /// `kubernetes.io~secret`
    Secret,
    /// `kubernetes.io~configmap`
    Configmap,
    /// `kubernetes.io~projected`
    Projected,
}

impl Plugin {
    /// All plugins the agent reads.
    pub const ALL: [Plugin; 3] = [Plugin::Secret, Plugin::Configmap, Plugin::Projected];

    /// The kubelet's directory name for this plugin.
    pub fn dir_name(self) -> &'static str {
        match self {
            Plugin::Secret => "kubernetes.io~secret",
            Plugin::Configmap => "kubernetes.io~configmap",
            Plugin::Projected => "kubernetes.io~projected",
        }
    }

    /// The plugin for a kubelet directory name.
    pub fn from_dir_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.dir_name() == name)
    }

    /// The wire name (`secret`, `configmap`, `projected`).
    pub fn as_str(self) -> &'static str {
        match self {
            Plugin::Secret => "secret",
            Plugin::Configmap => "configmap",
            Plugin::Projected => "projected",
        }
    }
}

/// One volume directory `<pod>/volumes/<plugin>/<name>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolumeInventory {
    /// The volume plugin.
    pub plugin: Plugin,
    /// The volume name from the pod spec.
    pub name: String,
    /// The timestamped data directory `..data` pointed to when the volume
    /// was read (opaque), absent when the volume has no `..data` yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<String>,
    /// Modification time of the data directory: when the kubelet published
    /// the content the volume serves now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_at: Option<Timestamp>,
    /// Combined volume digest (see [`crate::volume_digest`]) over `files`;
    /// present only when every file was read (no `errors`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<Sha256Hex>,
    /// Visible relative path (nested as `a/b/c`) to the SHA-256 of its bytes.
    #[serde(default)]
    pub files: BTreeMap<String, Sha256Hex>,
    /// Permission bits of each file, as an octal string (`"0600"`). Carried
    /// for diagnosis only: they do not enter the digest or any verdict.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub modes: BTreeMap<String, String>,
    /// Everything that could not be read, one entry per problem.
    #[serde(default)]
    pub errors: Vec<ReadError>,
}

/// One subPath bind target `<pod>/volume-subpaths/<volume>/<container>/<index>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubPathInventory {
    /// The volume name the subPath is taken from.
    pub volume: String,
    /// The container name.
    pub container: String,
    /// Position of the volumeMount in the container's `volumeMounts`.
    pub index: u32,
    /// Relative path (empty string when the target is a single file) to the
    /// SHA-256 of its bytes.
    #[serde(default)]
    pub files: BTreeMap<String, Sha256Hex>,
    /// Everything that could not be read.
    #[serde(default)]
    pub errors: Vec<ReadError>,
}

/// A problem met while reading; never fatal to the scan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReadError {
    /// Path relative to the volume (or subPath target); empty for the
    /// volume itself. Non-UTF-8 bytes are escaped as `\xNN` and a literal
    /// backslash as `\\`, so the name is represented losslessly.
    pub path: String,
    /// What kind of problem.
    pub kind: ReadErrorKind,
    /// A human-readable explanation.
    pub message: String,
}

/// Kinds of read problems.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ReadErrorKind {
    /// Permission denied (the agent lacks DAC_READ_SEARCH?).
    Permission,
    /// A symlink pointing outside the volume, or `..data` of the wrong shape.
    SymlinkEscape,
    /// A FIFO, socket, device or other non-regular file.
    NotRegularFile,
    /// A file larger than the agent's size cap.
    TooLarge,
    /// The entry disappeared while it was read (and retries ran out).
    Vanished,
    /// A file name that is not valid UTF-8 (escaped in `path`).
    InvalidName,
    /// An empty Secret or projected volume directory that is not a mount
    /// point in the agent's view: mount propagation is likely missing.
    MountPropagation,
    /// Any other I/O error.
    Io,
    /// A kind this version does not know (sent by a newer agent).
    #[serde(other)]
    Other,
}

impl ReadErrorKind {
    /// Stable label value for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ReadErrorKind::Permission => "permission",
            ReadErrorKind::SymlinkEscape => "symlinkEscape",
            ReadErrorKind::NotRegularFile => "notRegularFile",
            ReadErrorKind::TooLarge => "tooLarge",
            ReadErrorKind::Vanished => "vanished",
            ReadErrorKind::InvalidName => "invalidName",
            ReadErrorKind::MountPropagation => "mountPropagation",
            ReadErrorKind::Io => "io",
            ReadErrorKind::Other => "other",
        }
    }
}

/// Escapes a file name losslessly for the wire: valid UTF-8 runs as they are
/// (a backslash doubled), invalid bytes as `\xNN`.
pub fn escape_name(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                out.push_str("\\\\");
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file_digest;

    fn sample() -> NodeInventory {
        let mut inv =
            NodeInventory::new("node-a", "0.1.0", "2026-11-30T08:25:30Z".parse().unwrap());
        inv.generation = 42;
        let mut files = BTreeMap::new();
        files.insert("slurm.key".to_string(), Sha256Hex(file_digest(b"k")));
        inv.pods.push(PodInventory {
            uid: "0b6f".into(),
            volumes: vec![VolumeInventory {
                plugin: Plugin::Projected,
                name: "slurm-etc".into(),
                data_dir: Some("..2026_11_30_08_25_30.123".into()),
                written_at: Some("2026-11-30T08:25:30Z".parse().unwrap()),
                digest: Some(Sha256Hex(crate::volume_digest(
                    files.iter().map(|(k, v)| (k.as_str(), &v.0)),
                ))),
                files,
                modes: BTreeMap::from([("slurm.key".to_string(), "0600".to_string())]),
                errors: vec![],
            }],
            sub_paths: vec![SubPathInventory {
                volume: "sshd".into(),
                container: "slurmd".into(),
                index: 0,
                files: BTreeMap::from([(String::new(), Sha256Hex(file_digest(b"cfg")))]),
                errors: vec![],
            }],
            errors: vec![],
        });
        inv
    }

    #[test]
    fn json_roundtrip_uses_camel_case_and_hex() {
        let inv = sample();
        let json = serde_json::to_string(&inv).unwrap();
        assert!(json.contains("\"schema\":\"mountguard.io/node-inventory/v1\""));
        assert!(json.contains("\"agentVersion\""));
        assert!(json.contains("\"dataDir\":\"..2026_11_30_08_25_30.123\""));
        assert!(json.contains("\"subPaths\""));
        assert!(json.contains(&crate::digest::to_hex(&file_digest(b"k"))));
        let back = NodeInventory::from_json(json.as_bytes()).unwrap();
        assert_eq!(back, inv);
    }

    #[test]
    fn rejects_wrong_schema_unknown_fields_and_bad_digests() {
        let mut inv = sample();
        inv.schema = "mountguard.io/node-inventory/v9".into();
        let json = serde_json::to_vec(&inv).unwrap();
        assert!(matches!(
            NodeInventory::from_json(&json),
            Err(Error::Schema { .. })
        ));

        let json = serde_json::to_string(&sample()).unwrap();
        let extra = json.replacen("{\"schema\"", "{\"surprise\":1,\"schema\"", 1);
        assert!(matches!(
            NodeInventory::from_json(extra.as_bytes()),
            Err(Error::Parse(_))
        ));

        let bad = json.replace(&crate::digest::to_hex(&file_digest(b"k")), "nothex");
        let err = NodeInventory::from_json(bad.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("not 64 lowercase hex"), "{err}");

        let truncated = &json.as_bytes()[..json.len() / 2];
        assert!(NodeInventory::from_json(truncated).is_err());
    }

    #[test]
    fn unknown_error_kind_from_newer_agent_is_other() {
        let e: ReadError =
            serde_json::from_str(r#"{"path":"x","kind":"quantumFlux","message":"m"}"#).unwrap();
        assert_eq!(e.kind, ReadErrorKind::Other);
    }

    #[test]
    fn escape_name_is_lossless_and_distinguishes_backslashes() {
        assert_eq!(escape_name(b"plain.txt"), "plain.txt");
        assert_eq!(escape_name(b"a\xffb"), "a\\xffb");
        // A literal "\xff" in a valid name must not collide with byte 0xff.
        assert_eq!(escape_name(b"a\\xffb"), "a\\\\xffb");
        assert_ne!(escape_name(b"a\xffb"), escape_name(b"a\\xffb"));
    }

    #[test]
    fn plugin_dir_names_roundtrip() {
        for p in Plugin::ALL {
            assert_eq!(Plugin::from_dir_name(p.dir_name()), Some(p));
        }
        assert_eq!(Plugin::from_dir_name("kubernetes.io~empty-dir"), None);
    }
}
