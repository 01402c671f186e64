//! [`PodUid`]: a pod's `metadata.uid` in 16 bytes.
//!
//! Every UID the API server assigns is a UUID in its canonical lowercase
//! text form (36 characters). Held as an `Arc<str>`, that is a 16-byte
//! pointer in every structure keyed by it plus a 52-byte allocation per
//! pod; a [`PodUid`] holds the UUID's 16 bytes inline and allocates
//! nothing. Any other text (the UIDs of test doubles and hand-written
//! tests, an uppercase UUID) is kept as it was given, behind one pointer,
//! so a UID always reads back as exactly the text it was made of.
//!
//! Equality, ordering and hashing are those of the text: two UIDs are
//! equal when their texts are, and sort as their texts do (a sorted slice
//! of UIDs is sorted by text, so a binary search agrees with a string
//! comparison). One text has one representation (a canonical lowercase
//! UUID is always held as its bytes), so the derived hash is consistent
//! with that equality.

use std::cmp::Ordering;
use std::fmt;
use std::num::NonZeroU64;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A pod's UID: a canonical lowercase UUID as its 16 bytes, any other text
/// as given. Reads back (`Display`, serde) as the original text.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PodUid(Repr);

/// The two forms. The UUID's low half is a `NonZeroU64` so the text form
/// fits in the space of the high half and the whole is 16 bytes (a UUID
/// whose last 8 bytes are zero, which no RFC 4122 UUID is, is held as
/// text).
#[derive(Clone, PartialEq, Eq, Hash)]
enum Repr {
    /// The UUID's bytes 0-7 and 8-15, big-endian: compared as numbers they
    /// order as the lowercase hex text does.
    Uuid { hi: u64, lo: NonZeroU64 },
    /// Any other text (a thin pointer: one word).
    Text(Arc<Box<str>>),
}

/// Positions of the dashes in the canonical form.
const DASHES: [usize; 4] = [8, 13, 18, 23];
/// Length of the canonical form.
const LEN: usize = 36;

/// The value of a lowercase hex digit; `None` for anything else.
fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// The 16 bytes of `s` if it is a UUID in canonical lowercase form
/// (`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, digits `0-9a-f`).
fn parse_canonical(s: &str) -> Option<u128> {
    let b = s.as_bytes();
    if b.len() != LEN {
        return None;
    }
    let mut v: u128 = 0;
    for (i, &c) in b.iter().enumerate() {
        if DASHES.contains(&i) {
            if c != b'-' {
                return None;
            }
            continue;
        }
        v = (v << 4) | u128::from(hex_value(c)?);
    }
    Some(v)
}

/// A UUID's canonical text, on the stack.
struct UuidText([u8; LEN]);

impl UuidText {
    fn new(v: u128) -> Self {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [b'-'; LEN];
        let mut nibble = 32;
        for (i, c) in out.iter_mut().enumerate() {
            if DASHES.contains(&i) {
                continue;
            }
            nibble -= 1;
            *c = DIGITS[((v >> (4 * nibble)) & 0xf) as usize];
        }
        Self(out)
    }

    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("hex digits and dashes are ASCII")
    }
}

/// The text of a UID, borrowed or rendered on the stack.
enum Text<'a> {
    Uuid(UuidText),
    Str(&'a str),
}

impl std::ops::Deref for Text<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        match self {
            Text::Uuid(t) => t.as_str(),
            Text::Str(s) => s,
        }
    }
}

impl PodUid {
    /// The UID with this text.
    pub fn new(s: &str) -> Self {
        match parse_canonical(s) {
            Some(v) => Self::from_u128(v).unwrap_or_else(|| Self::text(s)),
            None => Self::text(s),
        }
    }

    /// The UID of this UUID (`None`: its low half is zero, see [`Repr`]).
    fn from_u128(v: u128) -> Option<Self> {
        let hi = (v >> 64) as u64;
        let lo = NonZeroU64::new(v as u64)?;
        Some(Self(Repr::Uuid { hi, lo }))
    }

    fn text(s: &str) -> Self {
        Self(Repr::Text(Arc::new(Box::from(s))))
    }

    /// Whether the UID is held as a UUID's 16 bytes (allocating nothing).
    pub fn is_compact(&self) -> bool {
        matches!(self.0, Repr::Uuid { .. })
    }

    /// The text, borrowed or rendered on the stack.
    fn as_text(&self) -> Text<'_> {
        match &self.0 {
            Repr::Uuid { hi, lo } => Text::Uuid(UuidText::new(
                (u128::from(*hi) << 64) | u128::from(lo.get()),
            )),
            Repr::Text(s) => Text::Str(s),
        }
    }

    /// Calls `f` with the UID's text (no allocation).
    pub fn with_str<R>(&self, f: impl FnOnce(&str) -> R) -> R {
        f(&self.as_text())
    }
}

impl From<&str> for PodUid {
    fn from(s: &str) -> Self {
        Self::new(s)
    }
}

impl From<&String> for PodUid {
    fn from(s: &String) -> Self {
        Self::new(s)
    }
}

/// Ordered as the texts are.
impl Ord for PodUid {
    fn cmp(&self, other: &Self) -> Ordering {
        match (&self.0, &other.0) {
            (Repr::Uuid { hi: a, lo: b }, Repr::Uuid { hi: c, lo: d }) => {
                (a, b.get()).cmp(&(c, d.get()))
            }
            _ => (*self.as_text()).cmp(&*other.as_text()),
        }
    }
}

impl PartialOrd for PodUid {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Equal when the texts are.
impl PartialEq<str> for PodUid {
    fn eq(&self, other: &str) -> bool {
        *self.as_text() == *other
    }
}

impl PartialEq<&str> for PodUid {
    fn eq(&self, other: &&str) -> bool {
        *self == **other
    }
}

impl fmt::Display for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.as_text())
    }
}

/// As the text's (a quoted string).
impl fmt::Debug for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.as_text(), f)
    }
}

/// As its text, a string.
impl Serialize for PodUid {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.as_text())
    }
}

/// From a string (what every earlier version wrote too).
impl<'de> Deserialize<'de> for PodUid {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = PodUid;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a pod UID (a string)")
            }

            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<PodUid, E> {
                Ok(PodUid::new(s))
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUIDS: [&str; 5] = [
        "0b6a2c1e-7f3d-4a59-9c1b-2e8f4d6a0c3b",
        "00000000-0000-0000-0000-000000000001",
        "ffffffff-ffff-ffff-ffff-ffffffffffff",
        "f47ac10b-58cc-4372-a567-0e02b2c3d479",
        "10000000-0000-4000-8000-000000000000",
    ];

    #[test]
    fn a_uid_is_sixteen_bytes() {
        assert_eq!(std::mem::size_of::<PodUid>(), 16);
    }

    #[test]
    fn a_canonical_uuid_is_held_as_bytes_and_reads_back_as_its_text() {
        for s in UUIDS {
            let u = PodUid::new(s);
            assert!(u.is_compact(), "{s}");
            assert_eq!(u.to_string(), s);
            assert_eq!(format!("{u:?}"), format!("{s:?}"));
            assert_eq!(u, *s);
            assert_eq!(u, PodUid::from(s));
            assert_eq!(serde_json::to_string(&u).unwrap(), format!("\"{s}\""));
            let back: PodUid = serde_json::from_str(&format!("\"{s}\"")).unwrap();
            assert_eq!(back, u);
        }
    }

    #[test]
    fn other_text_is_kept_as_given() {
        for s in [
            "",
            "u1",
            "uid-worker-0",
            // Not canonical lowercase: kept as written, not normalized.
            "0B6A2C1E-7F3D-4A59-9C1B-2E8F4D6A0C3B",
            "{0b6a2c1e-7f3d-4a59-9c1b-2e8f4d6a0c3b}",
            "0b6a2c1e7f3d4a599c1b2e8f4d6a0c3b",
            "0b6a2c1e-7f3d-4a59-9c1b-2e8f4d6a0c3g",
            "0b6a2c1e-7f3d-4a59-9c1b_2e8f4d6a0c3b",
            "0b6a2c1e-7f3d-4a59-9c1b-2e8f4d6a0c3bb",
            // A UUID whose low half is zero: held as text, same reading.
            "00000000-0000-0000-0000-000000000000",
            "12345678-9abc-def0-0000-000000000000",
            "żółw",
        ] {
            let u = PodUid::new(s);
            assert!(!u.is_compact(), "{s}");
            assert_eq!(u.to_string(), s);
            assert_eq!(u, *s);
            assert_eq!(u, PodUid::new(s));
            let back: PodUid = serde_json::from_str(&serde_json::to_string(&u).unwrap()).unwrap();
            assert_eq!(back, u);
        }
        // Texts that differ are different UIDs, whatever their forms.
        let upper = PodUid::new("0B6A2C1E-7F3D-4A59-9C1B-2E8F4D6A0C3B");
        let lower = PodUid::new("0b6a2c1e-7f3d-4a59-9c1b-2e8f4d6a0c3b");
        assert_ne!(upper, lower);
        assert_ne!(lower, "0B6A2C1E-7F3D-4A59-9C1B-2E8F4D6A0C3B");
    }

    /// Sorting UIDs sorts their texts, across both forms, so a slice sorted
    /// by UID is binary-searched consistently, and equal texts hash alike.
    #[test]
    fn uids_order_hash_and_compare_as_their_texts() {
        use std::hash::BuildHasher;
        let texts = [
            "",
            "0",
            "00000000-0000-0000-0000-000000000000",
            "00000000-0000-0000-0000-000000000001",
            "00000000-0000-0000-0000-00000000000",
            "0b6a2c1e-7f3d-4a59-9c1b-2e8f4d6a0c3b",
            "0b6a2c1e-7f3d-4a59-9c1b-2e8f4d6a0c3b-x",
            "0B6A2C1E-7F3D-4A59-9C1B-2E8F4D6A0C3B",
            "10000000-0000-4000-8000-000000000000",
            "9",
            "a",
            "f47ac10b-58cc-4372-a567-0e02b2c3d479",
            "f47ac10b-58cc-4372-a567-0e02b2c3d47",
            "ffffffff-ffff-ffff-ffff-ffffffffffff",
            "g",
            "u-1",
            "uid-10",
            "uid-9",
            "~",
        ];
        let uids: Vec<PodUid> = texts.iter().map(|s| PodUid::new(s)).collect();
        let hasher = foldhash::fast::FixedState::default();
        for (a, ta) in uids.iter().zip(texts) {
            for (b, tb) in uids.iter().zip(texts) {
                assert_eq!(a.cmp(b), ta.cmp(tb), "{ta} vs {tb}");
                assert_eq!(a == b, ta == tb, "{ta} vs {tb}");
            }
            assert_eq!(hasher.hash_one(a), hasher.hash_one(PodUid::new(ta)));
        }
        let mut sorted = uids.clone();
        sorted.reverse();
        sorted.sort();
        let mut by_text = texts.to_vec();
        by_text.sort();
        let read: Vec<String> = sorted.iter().map(PodUid::to_string).collect();
        assert_eq!(read, by_text);
        for t in texts {
            let found = sorted.binary_search(&PodUid::new(t));
            assert_eq!(found, by_text.binary_search(&t), "{t}");
        }
        assert!(sorted.binary_search(&PodUid::new("uid-5")).is_err());
    }

    #[test]
    fn with_str_reads_the_text() {
        let u = PodUid::new(UUIDS[0]);
        assert_eq!(u.with_str(str::len), 36);
        assert!(u.with_str(|s| s == UUIDS[0]));
    }
}
