//! The per-region use of one window: a vector sorted by region, for the one
//! or two regions a window usually has. A `BTreeMap` allocates a node with
//! room for eleven entries for a single region (~0.6 KB a window at a
//! million live windows); this holds what is there. Serialized exactly as
//! the map was (a length, then the pairs in order), so stored snapshots
//! and log entries read the same either way.

use std::fmt;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ids::RegionId;

/// Regions of one window with their use, sorted by region, each once.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RegionUses<V> {
    sorted: Vec<(RegionId, V)>,
}

impl<V: fmt::Debug> fmt::Debug for RegionUses<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.sorted.iter().map(|(k, v)| (k, v)))
            .finish()
    }
}

impl<V> RegionUses<V> {
    /// No regions.
    pub fn new() -> Self {
        Self { sorted: Vec::new() }
    }

    fn position(&self, region: &RegionId) -> Result<usize, usize> {
        self.sorted.binary_search_by(|(r, _)| r.cmp(region))
    }

    /// Whether `region` has used the window.
    pub fn contains_key(&self, region: &RegionId) -> bool {
        self.position(region).is_ok()
    }

    /// How many regions used the window.
    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    /// `region`'s use.
    pub fn get(&self, region: &RegionId) -> Option<&V> {
        self.position(region).ok().map(|i| &self.sorted[i].1)
    }

    /// `region`'s use, to change.
    pub fn get_mut(&mut self, region: &RegionId) -> Option<&mut V> {
        match self.position(region) {
            Ok(i) => Some(&mut self.sorted[i].1),
            Err(_) => None,
        }
    }

    /// The regions and their use, sorted by region.
    pub fn iter(&self) -> impl Iterator<Item = (&RegionId, &V)> + Clone {
        self.sorted.iter().map(|(region, used)| (region, used))
    }
}

impl<V: Default> RegionUses<V> {
    /// `region`'s use, inserted as the default if it has none yet.
    pub fn entry_or_default(&mut self, region: &RegionId) -> &mut V {
        let i = match self.position(region) {
            Ok(i) => i,
            Err(i) => {
                self.sorted.insert(i, (region.clone(), V::default()));
                i
            }
        };
        &mut self.sorted[i].1
    }
}

impl<V> From<std::collections::BTreeMap<RegionId, V>> for RegionUses<V> {
    fn from(map: std::collections::BTreeMap<RegionId, V>) -> Self {
        Self {
            sorted: map.into_iter().collect(),
        }
    }
}

impl<V: Serialize> Serialize for RegionUses<V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.sorted.len()))?;
        for (region, used) in &self.sorted {
            map.serialize_entry(region, used)?;
        }
        map.end()
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for RegionUses<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct UsesVisitor<V>(std::marker::PhantomData<V>);

        impl<'de, V: Deserialize<'de>> Visitor<'de> for UsesVisitor<V> {
            type Value = RegionUses<V>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of regions to their use")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                let mut sorted: Vec<(RegionId, V)> =
                    Vec::with_capacity(access.size_hint().unwrap_or(0).min(1_024));
                while let Some((region, used)) = access.next_entry::<RegionId, V>()? {
                    sorted.push((region, used));
                }
                // Written sorted and unique; anything else is not ours.
                if sorted.windows(2).any(|pair| pair[0].0 >= pair[1].0) {
                    return Err(serde::de::Error::custom(
                        "regions are not sorted and unique",
                    ));
                }
                Ok(RegionUses { sorted })
            }
        }

        deserializer.deserialize_map(UsesVisitor(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    fn region(n: u8) -> RegionId {
        RegionId::new(format!("r{n:03}")).expect("valid region")
    }

    proptest! {
        /// Any sequence of updates leaves the same regions and values as a
        /// BTreeMap given the same updates, in the same order, and both
        /// encode to the same bytes (so stored data reads either way).
        #[test]
        fn behaves_and_encodes_like_the_map(updates in proptest::collection::vec((0u8..12, 0u64..1_000), 0..60)) {
            let mut uses = RegionUses::<u64>::new();
            let mut map = BTreeMap::<RegionId, u64>::new();
            for (r, add) in updates {
                *uses.entry_or_default(&region(r)) += add;
                *map.entry(region(r)).or_default() += add;
                prop_assert_eq!(uses.contains_key(&region(r)), true);
            }
            prop_assert_eq!(uses.len(), map.len());
            let listed: Vec<_> = uses.iter().map(|(k, v)| (k.clone(), *v)).collect();
            let expected: Vec<_> = map.iter().map(|(k, v)| (k.clone(), *v)).collect();
            prop_assert_eq!(&listed, &expected);
            let ours = postcard::to_stdvec(&uses).expect("encodes");
            let theirs = postcard::to_stdvec(&map).expect("encodes");
            prop_assert_eq!(&ours, &theirs);
            let back: RegionUses<u64> = postcard::from_bytes(&theirs).expect("decodes");
            prop_assert!(back == uses);
            prop_assert_eq!(RegionUses::from(map), uses);
        }
    }

    #[test]
    fn unsorted_or_repeated_regions_are_refused() {
        let pairs = vec![(region(2), 1u64), (region(1), 1)];
        let bytes = postcard::to_stdvec(&pairs).expect("encodes");
        assert!(postcard::from_bytes::<RegionUses<u64>>(&bytes).is_err());
        let pairs = vec![(region(1), 1u64), (region(1), 2)];
        let bytes = postcard::to_stdvec(&pairs).expect("encodes");
        assert!(postcard::from_bytes::<RegionUses<u64>>(&bytes).is_err());
    }
}
