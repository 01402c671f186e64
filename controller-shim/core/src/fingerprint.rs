//! Keyed fingerprints.
//!
//! A fingerprint is the first [`Fingerprint::LEN`] bytes (shown as 12 hex
//! characters) of `HMAC-SHA256(installation key, raw 32-byte digest)`. Two
//! equal fingerprints under one key mean, with overwhelming probability,
//! equal content; without the key a fingerprint reveals nothing about the
//! content, not even whether it equals a guessed value. Raw digests never
//! leave the engine: every verdict carries fingerprints only.

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use serde::{Serialize, Serializer};
use sha2::Sha256;

use crate::Error;
use crate::model::Digest;

/// A short keyed fingerprint of a digest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub [u8; Fingerprint::LEN]);

impl Fingerprint {
    /// Bytes kept from the HMAC (12 hex characters).
    pub const LEN: usize = 6;
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

impl Serialize for Fingerprint {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

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

    /// The fingerprint of `digest`.
    pub fn fingerprint(&self, digest: &Digest) -> Fingerprint {
        let mut mac = self.mac.clone();
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
    use mountguard_inventory::file_digest;

    #[test]
    fn fingerprint_is_truncated_hmac_sha256_of_the_raw_digest() {
        // RFC 4231 test case 2 uses key "Jefe" (too short for us); compute an
        // independent HMAC by hand over the same input instead.
        let key = b"0123456789abcdef0123456789abcdef";
        let d = file_digest(b"slurm.key content");
        let fp = Fingerprinter::new(key).unwrap().fingerprint(&d);

        // HMAC by definition: H((K ^ opad) || H((K ^ ipad) || m)).
        use sha2::Digest as _;
        let mut k = [0u8; 64];
        k[..key.len()].copy_from_slice(key);
        let ipad: Vec<u8> = k.iter().map(|b| b ^ 0x36).collect();
        let opad: Vec<u8> = k.iter().map(|b| b ^ 0x5c).collect();
        let inner = Sha256::new().chain_update(&ipad).chain_update(d).finalize();
        let outer = Sha256::new()
            .chain_update(&opad)
            .chain_update(inner)
            .finalize();
        assert_eq!(fp.0, outer[..6]);
        assert_eq!(fp.to_string().len(), 12);
        assert_eq!(fp.to_string(), hex::encode(&outer[..6]));
    }

    #[test]
    fn different_keys_give_unrelated_fingerprints_and_fingerprint_is_not_digest_prefix() {
        let d = file_digest(b"x");
        let a = Fingerprinter::new(&[1u8; 32]).unwrap().fingerprint(&d);
        let b = Fingerprinter::new(&[2u8; 32]).unwrap().fingerprint(&d);
        assert_ne!(a, b);
        assert_ne!(a.0, d[..6]);
        assert_eq!(
            a,
            Fingerprinter::new(&[1u8; 32]).unwrap().fingerprint(&d),
            "deterministic under one key"
        );
    }

    #[test]
    fn short_keys_are_rejected_and_debug_hides_the_key() {
        let err = Fingerprinter::new(b"short").unwrap_err();
        assert!(err.to_string().contains("at least 16"), "{err}");
        let f = Fingerprinter::new(b"a-long-enough-secret-key").unwrap();
        assert_eq!(format!("{f:?}"), "Fingerprinter(..)");
    }
}
