//! Digest definitions.
//!
//! * A **file digest** is the SHA-256 of the file's bytes, hex encoded
//!   (64 lowercase hex characters).
//! * A **volume digest** is the SHA-256 of the following byte string, hex
//!   encoded:
//!   `"mountguard.io/volume-digest/v1\n"` followed, for every file in
//!   ascending byte order of its relative path, by
//!   `u64 big-endian length of the path || path bytes (UTF-8) || 32 raw bytes of the file digest`.
//!
//! The length prefix makes the encoding unambiguous for any path. Modes,
//! timestamps and directory names do not enter the digest: only which paths
//! exist and their content.

use sha2::{Digest, Sha256};

/// Domain separation prefix of the volume digest.
pub const VOLUME_DIGEST_PREFIX: &[u8] = b"mountguard.io/volume-digest/v1\n";

/// A SHA-256 digest, raw bytes.
pub type FileDigest = [u8; 32];

/// SHA-256 of `bytes`.
pub fn file_digest(bytes: &[u8]) -> FileDigest {
    Sha256::digest(bytes).into()
}

/// Hex encoding of a digest, as it appears on the wire.
pub fn to_hex(d: &FileDigest) -> String {
    hex::encode(d)
}

/// Parses a wire digest (64 lowercase hex characters).
pub fn from_hex(s: &str) -> Option<FileDigest> {
    if s.len() != 64 || s.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    let mut out = [0u8; 32];
    hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

/// The combined digest of a volume from its (path, file digest) pairs, in any
/// order. Duplicate paths are the caller's bug; the last one wins in sorting
/// order only by accident, so callers pass each path once.
pub fn volume_digest<'a, I>(files: I) -> FileDigest
where
    I: IntoIterator<Item = (&'a str, &'a FileDigest)>,
{
    let mut entries: Vec<(&str, &FileDigest)> = files.into_iter().collect();
    entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut h = Sha256::new();
    h.update(VOLUME_DIGEST_PREFIX);
    for (path, digest) in entries {
        h.update((path.len() as u64).to_be_bytes());
        h.update(path.as_bytes());
        h.update(digest);
    }
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_digest_is_sha256() {
        assert_eq!(
            to_hex(&file_digest(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn volume_digest_is_order_independent_and_path_sensitive() {
        let a = file_digest(b"1");
        let b = file_digest(b"2");
        let d1 = volume_digest([("a", &a), ("b", &b)]);
        let d2 = volume_digest([("b", &b), ("a", &a)]);
        assert_eq!(d1, d2);
        let swapped = volume_digest([("a", &b), ("b", &a)]);
        assert_ne!(d1, swapped);
        // Length prefix: "ab"+"c" must differ from "a"+"bc".
        let x = volume_digest([("ab", &a)]);
        let y = volume_digest([("a", &a)]);
        assert_ne!(x, y);
    }

    #[test]
    fn empty_volume_digest_is_fixed() {
        // SHA-256 of the prefix alone: an empty volume has a well-defined digest.
        let expect: FileDigest = Sha256::digest(VOLUME_DIGEST_PREFIX).into();
        assert_eq!(volume_digest(std::iter::empty()), expect);
    }

    #[test]
    fn volume_digest_matches_the_documented_encoding() {
        let fa = file_digest(b"hello");
        let mut manual = Vec::new();
        manual.extend_from_slice(VOLUME_DIGEST_PREFIX);
        manual.extend_from_slice(&3u64.to_be_bytes());
        manual.extend_from_slice(b"a/b");
        manual.extend_from_slice(&fa);
        let expect: FileDigest = Sha256::digest(&manual).into();
        assert_eq!(volume_digest([("a/b", &fa)]), expect);
    }

    #[test]
    fn hex_roundtrip_and_rejects_bad_input() {
        let d = file_digest(b"x");
        assert_eq!(from_hex(&to_hex(&d)), Some(d));
        assert_eq!(from_hex("abc"), None);
        assert_eq!(from_hex(&to_hex(&d).to_uppercase()), None);
        assert_eq!(from_hex(&"g".repeat(64)), None);
    }
}
