//! Small helpers shared by the doubles: identifiers, timestamps, randomness.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

static COUNTER: AtomicU64 = AtomicU64::new(1);

/// A random 64-bit number (not cryptographic; enough for identifiers and jitter).
pub fn random_u64() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// A random number in `[0, 1)`.
pub fn random_unit() -> f64 {
    (random_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// A new UID in the 8-4-4-4-12 form the API server uses.
pub fn new_uid() -> String {
    let a = random_u64();
    let b = random_u64();
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        (a >> 32) as u32,
        (a >> 16) as u16,
        (a as u16) & 0x0fff,
        ((b >> 48) as u16 & 0x3fff) | 0x8000,
        b & 0xffff_ffff_ffff
    )
}

/// Five lowercase alphanumerics, like the API server's `generateName` suffix.
pub fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut n = random_u64();
    (0..5)
        .map(|_| {
            let c = ALPHABET[(n % ALPHABET.len() as u64) as usize] as char;
            n /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

/// Now, as the API's `metav1.Time` (RFC 3339, second precision, UTC).
pub fn now_rfc3339() -> String {
    rfc3339(jiff::Timestamp::now())
}

/// A timestamp as the API's `metav1.Time`: whole seconds, truncated (as Go's
/// RFC 3339 formatting does), never rounded up into the future.
pub fn rfc3339(ts: jiff::Timestamp) -> String {
    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> i64 {
    jiff::Timestamp::now().as_second()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_are_distinct_and_well_formed() {
        let a = new_uid();
        let b = new_uid();
        assert_ne!(a, b);
        let parts: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(parts, vec![8, 4, 4, 4, 12]);
        assert!(a.chars().all(|c| c == '-' || c.is_ascii_hexdigit()));
    }

    #[test]
    fn timestamps_are_metav1_time() {
        // Whole seconds, truncated: Go's RFC 3339 formatting of metav1.Time.
        let ts: jiff::Timestamp = "2026-11-30T09:08:23.7Z".parse().unwrap();
        assert_eq!(rfc3339(ts), "2026-11-30T09:08:23Z");
    }

    #[test]
    fn unit_random_is_in_range() {
        for _ in 0..1000 {
            let x = random_unit();
            assert!((0.0..1.0).contains(&x));
        }
    }
}
