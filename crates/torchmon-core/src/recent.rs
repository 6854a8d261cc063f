//! `Recent`: the last few values made for a key, the oldest evicted first,
//! for a lookup cheaper than making the value again (the binding's parse of
//! a compiled graph's segments, docs/internals.md, "Tensors in compiled
//! graphs").

/// At most `capacity` `(key, value)` pairs, in the order kept; a linear
/// search, for the handful of keys a program uses.
pub struct Recent<K, V> {
    kept: Vec<(K, V)>,
    capacity: usize,
}

impl<K: PartialEq, V> Recent<K, V> {
    /// `capacity` at least 1; allocates nothing until the first `insert`,
    /// so that it can be a static's value.
    pub const fn new(capacity: usize) -> Self {
        Recent {
            kept: Vec::new(),
            capacity,
        }
    }

    pub fn get(&self, key: &K) -> Option<&V> {
        self.kept.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Keeps `value` for `key` (the caller looked first: a key is not kept
    /// twice). Returns the pair evicted to make room, for the caller to drop
    /// where it chooses (outside its lock, when dropping it runs code).
    pub fn insert(&mut self, key: K, value: V) -> Option<(K, V)> {
        let evicted = (self.kept.len() >= self.capacity.max(1)).then(|| self.kept.remove(0));
        self.kept.push((key, value));
        evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_is_evicted_and_handed_back() {
        let mut recent = Recent::new(2);
        assert_eq!(recent.get(&1), None);
        assert!(recent.insert(1, "a").is_none());
        assert!(recent.insert(2, "b").is_none());
        assert_eq!(recent.get(&1), Some(&"a"));
        assert_eq!(recent.insert(3, "c"), Some((1, "a")));
        assert_eq!(
            (recent.get(&1), recent.get(&2), recent.get(&3)),
            (None, Some(&"b"), Some(&"c"))
        );
        let mut one = Recent::new(0);
        one.insert(1, ());
        assert_eq!(one.insert(2, ()), Some((1, ())));
    }
}
