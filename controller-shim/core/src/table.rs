//! [`KeyedTable`]: a table of values that carry their own key (a pod's
//! UID), stored densely. At a cluster's size (hundreds of thousands of
//! pods) a hash map of the values themselves is between 44 % and 87 % full
//! (it doubles its buckets when it passes seven eighths), so it holds up
//! to twice the bytes of its values; here the values sit in fixed-size
//! chunks, full but the last, and the hash table holds only their 4-byte
//! positions.

use std::hash::BuildHasher;

/// A value that carries its own key.
pub trait Keyed {
    /// The key's type (a pod's UID).
    type Key: ?Sized + Eq + std::hash::Hash;
    /// The key (unique in a table).
    fn key(&self) -> &Self::Key;
}

/// Values per chunk: a chunk never moves once allocated, so growing the
/// table copies no value, and at most one chunk is partly empty.
const CHUNK: usize = 1024;

/// Values that carry their own key, by key; in no particular order.
#[derive(Clone)]
pub struct KeyedTable<T> {
    /// Every value; chunks of [`CHUNK`], all full but the last.
    chunks: Vec<Vec<T>>,
    len: usize,
    /// Positions in `chunks`, hashed and compared through the value's key.
    positions: hashbrown::HashTable<u32>,
    hasher: foldhash::fast::RandomState,
}

impl<T> Default for KeyedTable<T> {
    fn default() -> Self {
        Self {
            chunks: Vec::new(),
            len: 0,
            positions: hashbrown::HashTable::new(),
            hasher: foldhash::fast::RandomState::default(),
        }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for KeyedTable<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.chunks.iter().flatten())
            .finish()
    }
}

/// Equal when both hold the same values, in whatever order.
impl<T: Keyed + PartialEq> PartialEq for KeyedTable<T> {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().all(|v| other.get(v.key()) == Some(v))
    }
}

impl<T: Keyed + Eq> Eq for KeyedTable<T> {}

fn at<T>(chunks: &[Vec<T>], pos: u32) -> &T {
    let pos = pos as usize;
    &chunks[pos / CHUNK][pos % CHUNK]
}

impl<T: Keyed> KeyedTable<T> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn hash(&self, key: &T::Key) -> u64 {
        self.hasher.hash_one(key)
    }

    fn position(&self, key: &T::Key) -> Option<u32> {
        self.position_hashed(self.hash(key), key)
    }

    fn position_hashed(&self, hash: u64, key: &T::Key) -> Option<u32> {
        let chunks = &self.chunks;
        self.positions
            .find(hash, |p| at(chunks, *p).key() == key)
            .copied()
    }

    /// Appends `value`, whose key (hashed to `hash`) is not in the table;
    /// returns its position.
    fn push_new(&mut self, hash: u64, value: T) -> usize {
        let pos = self.len;
        let pos32 = u32::try_from(pos).expect("fewer than 2^32 values in a table");
        if self.chunks.last().is_none_or(|c| c.len() == CHUNK) {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        self.chunks
            .last_mut()
            .expect("a chunk with room")
            .push(value);
        self.len += 1;
        let (chunks, hasher) = (&self.chunks, &self.hasher);
        self.positions
            .insert_unique(hash, pos32, |p| hasher.hash_one(at(chunks, *p).key()));
        pos
    }

    /// The value with this key.
    pub fn get(&self, key: &T::Key) -> Option<&T> {
        self.position(key).map(|p| at(&self.chunks, p))
    }

    /// The value with this key, to change (not its key).
    pub fn get_mut(&mut self, key: &T::Key) -> Option<&mut T> {
        let p = self.position(key)? as usize;
        Some(&mut self.chunks[p / CHUNK][p % CHUNK])
    }

    /// Whether a value has this key.
    pub fn contains_key(&self, key: &T::Key) -> bool {
        self.position(key).is_some()
    }

    /// Stores `value`, replacing the value with the same key; returns that.
    pub fn insert(&mut self, value: T) -> Option<T> {
        let hash = self.hash(value.key());
        if let Some(p) = self.position_hashed(hash, value.key()) {
            let p = p as usize;
            return Some(std::mem::replace(
                &mut self.chunks[p / CHUNK][p % CHUNK],
                value,
            ));
        }
        self.push_new(hash, value);
        None
    }

    /// The value with this key, or `make()` stored first (its key must be
    /// `key`).
    pub fn get_or_insert_with(&mut self, key: &T::Key, make: impl FnOnce() -> T) -> &mut T {
        let hash = self.hash(key);
        let p = match self.position_hashed(hash, key) {
            Some(p) => p as usize,
            None => {
                let value = make();
                assert!(value.key() == key, "a value made for a key has that key");
                self.push_new(hash, value)
            }
        };
        &mut self.chunks[p / CHUNK][p % CHUNK]
    }

    /// Removes the value with this key; returns it. The last value takes
    /// its place (positions stay dense).
    pub fn remove(&mut self, key: &T::Key) -> Option<T> {
        let hash = self.hash(key);
        let chunks = &self.chunks;
        let entry = self
            .positions
            .find_entry(hash, |p| at(chunks, *p).key() == key)
            .ok()?;
        let pos = entry.remove().0 as usize;
        let last = self.len - 1;
        if pos != last {
            // The last value moves to `pos`: repoint its entry.
            let chunks = &self.chunks;
            let moved = at(chunks, last as u32);
            let slot = self
                .positions
                .find_mut(self.hasher.hash_one(moved.key()), |p| *p as usize == last)
                .expect("every value has a position");
            *slot = pos as u32;
        }
        let tail = self
            .chunks
            .last_mut()
            .expect("a non-empty table has a chunk");
        let value = tail.pop().expect("the last chunk is not empty");
        if tail.is_empty() {
            self.chunks.pop();
        }
        self.len -= 1;
        if pos == last {
            return Some(value);
        }
        Some(std::mem::replace(
            &mut self.chunks[pos / CHUNK][pos % CHUNK],
            value,
        ))
    }

    /// Every value, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flatten()
    }

    /// Forgets every value and gives the memory back.
    pub fn clear(&mut self) {
        *self = Self {
            hasher: self.hasher.clone(),
            ..Self::default()
        };
    }

    /// Room for `additional` more values without rehashing the positions
    /// (the values' chunks are allocated as they fill).
    pub fn reserve(&mut self, additional: usize) {
        let (chunks, hasher) = (&self.chunks, &self.hasher);
        self.positions
            .reserve(additional, |p| hasher.hash_one(at(chunks, *p).key()));
    }

    /// How many values the position table holds room for (the values
    /// themselves take only what they need, in chunks).
    pub fn capacity(&self) -> usize {
        self.positions.capacity()
    }

    /// Gives back what the position table holds beyond its values.
    pub fn shrink_to_fit(&mut self) {
        let (chunks, hasher) = (&self.chunks, &self.hasher);
        self.positions
            .shrink_to_fit(|p| hasher.hash_one(at(chunks, *p).key()));
    }
}

impl<T: Keyed> FromIterator<T> for KeyedTable<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut t = Self::new();
        for v in iter {
            t.insert(v);
        }
        t
    }
}

impl<T> IntoIterator for KeyedTable<T> {
    type Item = T;
    type IntoIter = std::iter::Flatten<std::vec::IntoIter<Vec<T>>>;

    fn into_iter(self) -> Self::IntoIter {
        self.chunks.into_iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone, PartialEq, Eq)]
    struct V {
        key: String,
        n: u32,
    }

    impl Keyed for V {
        type Key = str;

        fn key(&self) -> &str {
            &self.key
        }
    }

    fn v(key: impl Into<String>, n: u32) -> V {
        V { key: key.into(), n }
    }

    /// The table against a `BTreeMap` through inserts, replacements and
    /// removals spanning several chunks, removing from the middle, the end
    /// and the last chunk.
    #[test]
    fn a_keyed_table_holds_what_a_map_would() {
        let mut t = KeyedTable::new();
        let mut m = BTreeMap::new();
        let n = 3 * CHUNK as u32 + 17;
        for i in 0..n {
            assert_eq!(t.insert(v(format!("k{i}"), i)), None);
            m.insert(format!("k{i}"), i);
        }
        // Replacing keeps the length and gives the old value back.
        assert_eq!(t.insert(v("k5", 500)), Some(v("k5", 5)));
        m.insert("k5".into(), 500);
        assert_eq!(t.len(), m.len());
        // Remove every third value, the last one, and one that is absent.
        for i in (0..n).step_by(3).chain([n - 1]) {
            let k = format!("k{i}");
            assert_eq!(t.remove(&k).map(|x| x.n), m.remove(&k), "{k}");
        }
        assert_eq!(t.remove("absent"), None);
        assert_eq!(t.len(), m.len());
        for i in 0..n {
            let k = format!("k{i}");
            assert_eq!(t.get(&k).map(|x| x.n), m.get(&k).copied(), "{k}");
            assert_eq!(t.contains_key(&k), m.contains_key(&k));
        }
        let mut listed: Vec<(String, u32)> = t.iter().map(|x| (x.key.clone(), x.n)).collect();
        listed.sort();
        let mut expected: Vec<(String, u32)> = m.clone().into_iter().collect();
        expected.sort();
        assert_eq!(listed, expected);
        // Dense: the chunks hold exactly the values.
        assert_eq!(t.chunks.len(), m.len().div_ceil(CHUNK));
        // Changing a value in place.
        t.get_mut("k1").unwrap().n = 11;
        assert_eq!(t.get("k1").unwrap().n, 11);
        assert_eq!(t.get_or_insert_with("k1", || v("k1", 0)).n, 11);
        assert_eq!(t.get_or_insert_with("new", || v("new", 7)).n, 7);
        assert_eq!(t.get("new"), Some(&v("new", 7)));
        // Emptied, it holds nothing and takes values again.
        let keys: Vec<String> = t.iter().map(|x| x.key.clone()).collect();
        for k in &keys {
            assert!(t.remove(k).is_some(), "{k}");
        }
        assert!(t.is_empty());
        assert!(t.chunks.is_empty());
        t.insert(v("again", 1));
        assert_eq!(t.get("again").unwrap().n, 1);
        t.clear();
        assert!(t.is_empty() && t.get("again").is_none());
    }

    #[test]
    fn keyed_tables_are_equal_whatever_the_order() {
        let a: KeyedTable<V> = [v("a", 1), v("b", 2)].into_iter().collect();
        let b: KeyedTable<V> = [v("b", 2), v("a", 1)].into_iter().collect();
        let c: KeyedTable<V> = [v("a", 1), v("b", 3)].into_iter().collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
