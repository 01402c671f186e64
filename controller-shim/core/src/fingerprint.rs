//! Keyed fingerprints, each bound to the object it speaks of.
//!
//! A fingerprint is the first [`Fingerprint::LEN`] bytes (shown as 12 hex
//! characters) of `HMAC-SHA256(installation key, scope || raw 32-byte
//! digest)`, where the scope names what the content belongs to: one
//! Secret or ConfigMap (kind, namespace, name, and the key for a per-key
//! value), or one pod volume (the pod's namespace and the volume's sources
//! in spec order), each field length-prefixed so no two scopes share an
//! encoding.
//!
//! So equal fingerprints in one scope mean, with overwhelming probability,
//! equal content: the same object's versions stay comparable (the history
//! notices a change, the rollout gate compares what a consumer was
//! verified against with the current content, and expected against
//! observed in one volume). Equal content in two objects gives unrelated
//! fingerprints: somebody who can create a Secret of their own with a
//! guessed value learns nothing by comparing its fingerprint with another
//! object's. Without the key a fingerprint reveals nothing about the
//! content. Raw digests never leave the engine: every verdict carries
//! fingerprints only, and there is deliberately no unscoped fingerprint.

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::Error;
pub use crate::model::Fingerprint;
use crate::model::{Digest, ProjectedSource, SourceProjection, SourceRef, VolumeSource};

/// Computes fingerprints under one installation key.
#[derive(Clone)]
pub struct Fingerprinter {
    /// The keyed HMAC state, cloned for every fingerprint (saves re-keying).
    mac: Hmac<Sha256>,
}

impl fmt::Debug for Fingerprinter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the key.
        f.write_str("Fingerprinter(..)")
    }
}

impl Fingerprinter {
    /// Shortest accepted installation key.
    pub const MIN_KEY_LEN: usize = 16;

    /// A fingerprinter for an installation key of at least
    /// [`Self::MIN_KEY_LEN`] bytes.
    pub fn new(key: &[u8]) -> Result<Self, Error> {
        if key.len() < Self::MIN_KEY_LEN {
            return Err(Error::Config(format!(
                "fingerprint key has {} bytes, at least {} are required",
                key.len(),
                Self::MIN_KEY_LEN
            )));
        }
        let mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key)
            .map_err(|e| Error::Config(format!("fingerprint key: {e}")))?;
        Ok(Self { mac })
    }

    /// The scope of one Secret's or ConfigMap's content (and, through
    /// [`Scope::key`], of its keys' values).
    pub fn source(&self, r: &SourceRef) -> Scope {
        let mut s = self.scope(Tag::Source);
        s.field(r.kind.as_str().as_bytes());
        s.field(r.namespace.as_bytes());
        s.field(r.name.as_bytes());
        s
    }

    /// The scope of what a pod volume projects in `namespace`: its sources
    /// in spec order (a part that does not come from the API adds a
    /// marker, so two volumes that differ only there stay apart).
    pub fn volume(&self, namespace: &str, v: &VolumeSource) -> Scope {
        let mut s = self.scope(Tag::Volume);
        s.field(namespace.as_bytes());
        let add = |s: &mut Scope, p: &SourceProjection| {
            s.field(p.kind.as_str().as_bytes());
            s.field(p.name.as_bytes());
        };
        match v {
            VolumeSource::Object(p) => add(&mut s, p),
            VolumeSource::Projected(sources) => {
                for src in sources.iter() {
                    match src {
                        ProjectedSource::Object(p) => add(&mut s, p),
                        ProjectedSource::NotFromApi { .. } => s.field(b"-"),
                    }
                }
            }
        }
        s
    }

    fn scope(&self, tag: Tag) -> Scope {
        let mut mac = self.mac.clone();
        mac.update(&[tag as u8]);
        Scope { mac }
    }
}

/// What a scope names (the first byte of its encoding).
#[derive(Clone, Copy)]
#[repr(u8)]
enum Tag {
    Source = 1,
    Volume = 2,
    /// One key of a source, or one part of a volume (a subPath).
    Part = 3,
    /// Ends the scope: the digest follows.
    Content = 0,
}

/// Fingerprints of one object's content: the installation key and the
/// object's identity, absorbed once and cloned for every fingerprint.
#[derive(Clone)]
pub struct Scope {
    mac: Hmac<Sha256>,
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Scope(..)")
    }
}

impl Scope {
    /// Appends one length-prefixed field.
    fn field(&mut self, bytes: &[u8]) {
        let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        self.mac.update(&len.to_be_bytes());
        self.mac.update(bytes);
    }

    /// A narrower scope inside this one: `kind` names what the part is
    /// (`key`, `subPath`, `envFrom`), `name` which one.
    pub fn part(&self, kind: &str, name: &str) -> Scope {
        let mut s = self.clone();
        s.mac.update(&[Tag::Part as u8]);
        s.field(kind.as_bytes());
        s.field(name.as_bytes());
        s
    }

    /// The scope of one key's value of a source.
    pub fn key(&self, key: &str) -> Scope {
        self.part("key", key)
    }

    /// The fingerprint of `digest` in this scope.
    pub fn fingerprint(&self, digest: &Digest) -> Fingerprint {
        let mut mac = self.mac.clone();
        mac.update(&[Tag::Content as u8]);
        mac.update(digest);
        let out = mac.finalize().into_bytes();
        let mut fp = [0u8; Fingerprint::LEN];
        fp.copy_from_slice(&out[..Fingerprint::LEN]);
        Fingerprint(fp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SourceKind;
    use mountguard_inventory::file_digest;
    use std::sync::Arc;

    fn secret(ns: &str, name: &str) -> SourceRef {
        SourceRef::new(SourceKind::Secret, Arc::from(ns), Arc::from(name))
    }

    fn volume_of(kind: SourceKind, name: &str) -> VolumeSource {
        VolumeSource::Object(SourceProjection {
            kind,
            name: Arc::from(name),
            items: None,
            optional: false,
        })
    }

    #[test]
    fn fingerprint_is_truncated_hmac_sha256_over_the_scope_and_the_raw_digest() {
        let key = b"0123456789abcdef0123456789abcdef";
        let d = file_digest(b"slurm.key content");
        let fp = Fingerprinter::new(key)
            .unwrap()
            .source(&secret("slurm", "auth"))
            .fingerprint(&d);

        // The encoding, written out: tag 1, then kind, namespace and name
        // each behind a 4-byte big-endian length, then 0 and the digest.
        let mut m = vec![1u8];
        for f in [&b"Secret"[..], b"slurm", b"auth"] {
            m.extend_from_slice(&(f.len() as u32).to_be_bytes());
            m.extend_from_slice(f);
        }
        m.push(0);
        m.extend_from_slice(&d);
        // HMAC by definition: H((K ^ opad) || H((K ^ ipad) || m)).
        use sha2::Digest as _;
        let mut k = [0u8; 64];
        k[..key.len()].copy_from_slice(key);
        let ipad: Vec<u8> = k.iter().map(|b| b ^ 0x36).collect();
        let opad: Vec<u8> = k.iter().map(|b| b ^ 0x5c).collect();
        let inner = Sha256::new()
            .chain_update(&ipad)
            .chain_update(&m)
            .finalize();
        let outer = Sha256::new()
            .chain_update(&opad)
            .chain_update(inner)
            .finalize();
        assert_eq!(fp.0, outer[..6]);
        assert_eq!(fp.to_string().len(), 12);
        assert_eq!(fp.to_string(), hex::encode(&outer[..6]));
    }

    /// The guess attack: a tenant's own Secret with a guessed value must
    /// not give the fingerprint another namespace's Secret shows.
    #[test]
    fn fingerprint_oracle_equal_content_in_two_objects_gives_unrelated_fingerprints() {
        let f = Fingerprinter::new(&[3u8; 32]).unwrap();
        let guess = file_digest(b"password=4711");
        let prod = f.source(&secret("prod", "db")).fingerprint(&guess);
        let distinct = [
            f.source(&secret("tenant", "db")).fingerprint(&guess),
            f.source(&secret("prod", "db2")).fingerprint(&guess),
            f.source(&SourceRef::new(
                SourceKind::ConfigMap,
                Arc::from("prod"),
                Arc::from("db"),
            ))
            .fingerprint(&guess),
            f.source(&secret("prod", "db"))
                .key("password")
                .fingerprint(&guess),
            f.volume("prod", &volume_of(SourceKind::Secret, "db"))
                .fingerprint(&guess),
            f.volume("tenant", &volume_of(SourceKind::Secret, "db"))
                .fingerprint(&guess),
            // Length prefixes: "pro"+"ddb" is not "prod"+"db".
            f.source(&secret("pro", "ddb")).fingerprint(&guess),
        ];
        for (i, fp) in distinct.iter().enumerate() {
            assert_ne!(*fp, prod, "scope {i} gives prod/db's fingerprint");
        }
        let mut all = distinct.to_vec();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), distinct.len(), "every scope is its own");
        // The same object's versions stay comparable.
        assert_eq!(f.source(&secret("prod", "db")).fingerprint(&guess), prod);
        assert_ne!(
            f.source(&secret("prod", "db"))
                .fingerprint(&file_digest(b"password=4710")),
            prod
        );
        // Two pods mounting the same sources see the same volume scope.
        assert_eq!(
            f.volume("prod", &volume_of(SourceKind::Secret, "db"))
                .fingerprint(&guess),
            distinct[4]
        );
    }

    #[test]
    fn different_keys_give_unrelated_fingerprints_and_fingerprint_is_not_digest_prefix() {
        let d = file_digest(b"x");
        let r = secret("a", "b");
        let a = Fingerprinter::new(&[1u8; 32])
            .unwrap()
            .source(&r)
            .fingerprint(&d);
        let b = Fingerprinter::new(&[2u8; 32])
            .unwrap()
            .source(&r)
            .fingerprint(&d);
        assert_ne!(a, b);
        assert_ne!(a.0, d[..6]);
        assert_eq!(
            a,
            Fingerprinter::new(&[1u8; 32])
                .unwrap()
                .source(&r)
                .fingerprint(&d),
            "deterministic under one key"
        );
    }

    #[test]
    fn short_keys_are_rejected_and_debug_hides_the_key() {
        let err = Fingerprinter::new(b"short").unwrap_err();
        assert!(err.to_string().contains("at least 16"), "{err}");
        let f = Fingerprinter::new(b"a-long-enough-secret-key").unwrap();
        assert_eq!(format!("{f:?}"), "Fingerprinter(..)");
        assert_eq!(format!("{:?}", f.source(&secret("a", "b"))), "Scope(..)");
    }
}
