//! Rendering of an inventory for `mountguard-agent scan`: a table for
//! people, or the JSON document streamed to a writer.

use std::fmt::Write as _;
use std::io::Write as _;

use mountguard_inventory::table::write_aligned;
use mountguard_inventory::{NodeInventory, ReadError, digest::to_hex};

/// Characters of a digest shown in the table.
pub const DIGEST_PREFIX: usize = 12;

/// Size of the buffer between the JSON serializer and the output.
const JSON_BUF: usize = 64 * 1024;

/// Writes the inventory document (pretty-printed, then a newline) to `out`
/// as it is serialized, through a [`JSON_BUF`]-byte buffer.
pub fn json(inv: &NodeInventory, out: impl std::io::Write) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::with_capacity(JSON_BUF, out);
    serde_json::to_writer_pretty(&mut out, inv).map_err(std::io::Error::other)?;
    out.write_all(b"\n")?;
    out.flush()
}

/// One row per volume and subPath target, then every error below the table.
/// Digests are cut to their first [`DIGEST_PREFIX`] hex characters; the JSON
/// output carries them in full.
pub fn table(inv: &NodeInventory) -> String {
    let header = [
        "POD UID", "PLUGIN", "VOLUME", "DATA DIR", "FILES", "DIGEST", "ERRORS",
    ];
    let mut rows: Vec<[String; 7]> = Vec::new();
    let mut errors: Vec<(String, &ReadError)> = Vec::new();
    for pod in &inv.pods {
        for e in &pod.errors {
            errors.push((pod.uid.clone(), e));
        }
        for v in &pod.volumes {
            let digest = v
                .digest
                .map(|d| to_hex(&d.0)[..DIGEST_PREFIX].to_string())
                .unwrap_or_else(|| "-".into());
            rows.push([
                pod.uid.clone(),
                v.plugin.as_str().to_string(),
                v.name.clone(),
                v.data_dir.clone().unwrap_or_else(|| "-".into()),
                v.files.len().to_string(),
                digest,
                v.errors.len().to_string(),
            ]);
            for e in &v.errors {
                errors.push((format!("{} {}/{}", pod.uid, v.plugin.as_str(), v.name), e));
            }
        }
        for s in &pod.sub_paths {
            let digest = match (s.files.len(), s.files.get("")) {
                (1, Some(d)) => to_hex(&d.0)[..DIGEST_PREFIX].to_string(),
                _ => "-".into(),
            };
            let name = format!("{}/{}/{}", s.volume, s.container, s.index);
            rows.push([
                pod.uid.clone(),
                "subPath".into(),
                name.clone(),
                "-".into(),
                s.files.len().to_string(),
                digest,
                s.errors.len().to_string(),
            ]);
            for e in &s.errors {
                errors.push((format!("{} subPath/{name}", pod.uid), e));
            }
        }
    }
    let mut table = vec![header.map(String::from)];
    table.extend_from_slice(&rows);
    let mut bytes = Vec::new();
    write_aligned(&table, &mut bytes).expect("writing to a Vec cannot fail");
    let mut out = String::from_utf8(bytes).expect("the table is built of strings");
    let _ = writeln!(
        out,
        "\nnode {} generation {} scanned at {}: {} pods, {} volumes and subPaths, {} errors",
        inv.node,
        inv.generation,
        inv.scanned_at,
        inv.pods.len(),
        rows.len(),
        errors.len()
    );
    if !errors.is_empty() {
        out.push_str("\nERRORS\n");
        for (at, e) in errors {
            let path = if e.path.is_empty() {
                "."
            } else {
                e.path.as_str()
            };
            let _ = writeln!(out, "{at} {path}: {}: {}", e.kind.as_str(), e.message);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use mountguard_inventory::{
        Plugin, PodInventory, ReadErrorKind, Sha256Hex, SubPathInventory, VolumeInventory,
    };

    use super::*;

    #[test]
    fn streamed_json_is_the_pretty_document_and_a_newline() {
        let mut inv = NodeInventory::new("n1", "0", jiff::Timestamp::UNIX_EPOCH);
        inv.generation = 7;
        // More than one buffer's worth, so the document is written in pieces.
        for p in 0..400 {
            let mut v = VolumeInventory {
                plugin: Plugin::Secret,
                name: format!("v{p}"),
                data_dir: Some("..2026_12_01_00_00_00.1".into()),
                written_at: None,
                digest: Some(Sha256Hex([p as u8; 32])),
                files: Default::default(),
                modes: Default::default(),
                errors: Vec::new(),
            };
            v.files.insert("k".into(), Sha256Hex([1; 32]));
            inv.pods.push(PodInventory {
                uid: format!("pod-{p:04}"),
                volumes: vec![v],
                sub_paths: Vec::new(),
                errors: Vec::new(),
            });
        }
        let mut out = Vec::new();
        json(&inv, &mut out).unwrap();
        let mut want = serde_json::to_string_pretty(&inv).unwrap();
        want.push('\n');
        assert!(out.len() > JSON_BUF);
        assert_eq!(String::from_utf8(out).unwrap(), want);
    }

    /// The table's bytes, pinned: columns as wide as their widest cell
    /// (header included), two spaces apart, the last column unpadded,
    /// subPaths as rows, errors listed below.
    #[test]
    fn table_bytes() {
        let mut inv = NodeInventory::new("n1", "0", jiff::Timestamp::UNIX_EPOCH);
        inv.generation = 3;
        let mut v = VolumeInventory {
            plugin: Plugin::Projected,
            name: "slurm-etc".into(),
            data_dir: Some("..2026_12_01_00_00_00.1".into()),
            written_at: None,
            digest: Some(Sha256Hex([0xab; 32])),
            files: Default::default(),
            modes: Default::default(),
            errors: Vec::new(),
        };
        v.files.insert("slurm.key".into(), Sha256Hex([1; 32]));
        let mut s = SubPathInventory {
            volume: "cfg".into(),
            container: "c".into(),
            index: 0,
            files: Default::default(),
            errors: Vec::new(),
        };
        s.errors.push(ReadError {
            path: String::new(),
            kind: ReadErrorKind::Permission,
            message: "denied".into(),
        });
        inv.pods.push(PodInventory {
            uid: "u-1".into(),
            volumes: vec![v],
            sub_paths: vec![s],
            errors: Vec::new(),
        });
        assert_eq!(
            table(&inv),
            "POD UID  PLUGIN     VOLUME     DATA DIR                 FILES  DIGEST        ERRORS\n\
             u-1      projected  slurm-etc  ..2026_12_01_00_00_00.1  1      abababababab  0\n\
             u-1      subPath    cfg/c/0    -                        0      -             1\n\
             \n\
             node n1 generation 3 scanned at 1970-01-01T00:00:00Z: 1 pods, 2 volumes and subPaths, 1 errors\n\
             \n\
             ERRORS\n\
             u-1 subPath/cfg/c/0 .: permission: denied\n"
        );
    }
}
