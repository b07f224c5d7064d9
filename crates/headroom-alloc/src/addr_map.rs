//! `AddrMap`: allocated blocks by address, the table behind the pointer map
//! ([`crate::pointer_map`]).
//!
//! Why not `FxHashMap<u64, u32>`: every request inserts one address and every free
//! removes one, and the general table's insert (a call, with its probe for an equal key
//! by control-byte groups) and remove cost about 125 instructions of a warm pair's 790
//! (docs/PERFORMANCE.md, "Warm malloc + free pair, twenty-first round"). Here one
//! multiplication places an address, the table is kept at most half full so that a probe
//! rarely passes a second slot, and a remove shifts the entries after it back
//! (no tombstones, so the table never needs cleaning).

/// The key of an empty slot: no block starts at the last byte of the address space.
const EMPTY: u64 = u64::MAX;

/// Slots in the first table: a run allocates few blocks or many.
const MIN_SLOTS: usize = 64;

#[derive(Clone, Debug)]
pub(crate) struct AddrMap {
    /// (address, block id); a power-of-two count of them, at most half in use.
    slots: Vec<(u64, u32)>,
    /// `64 - log2(slots.len())`: the top bits of the product place an address.
    shift: u32,
    len: usize,
}

impl Default for AddrMap {
    fn default() -> Self {
        AddrMap { slots: vec![(EMPTY, 0); MIN_SLOTS], shift: 64 - MIN_SLOTS.trailing_zeros(), len: 0 }
    }
}

impl AddrMap {
    /// The home slot of `addr`: Fibonacci hashing, whose top bits mix every bit of the
    /// address (addresses are multiples of 512, so their low bits say nothing).
    #[inline(always)]
    fn home(&self, addr: u64) -> usize {
        (addr.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    #[inline(always)]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Maps `addr` to `id`, replacing what it mapped to.
    #[inline]
    pub fn insert(&mut self, addr: u64, id: u32) {
        debug_assert_ne!(addr, EMPTY, "no block starts at the last byte");
        if 2 * (self.len + 1) > self.slots.len() {
            self.grow();
        }
        let mask = self.mask();
        let mut i = self.home(addr);
        loop {
            // SAFETY: `i` is masked to the table's power-of-two length.
            let slot = unsafe { self.slots.get_unchecked_mut(i) };
            if slot.0 == EMPTY {
                *slot = (addr, id);
                self.len += 1;
                return;
            }
            if slot.0 == addr {
                slot.1 = id;
                return;
            }
            i = (i + 1) & mask;
        }
    }

    /// The slot holding `addr`, if any. The table is never full, so the probe ends.
    #[inline(always)]
    fn find(&self, addr: u64) -> Option<usize> {
        let mask = self.mask();
        let mut i = self.home(addr);
        loop {
            // SAFETY: `i` is masked to the table's power-of-two length.
            let key = unsafe { self.slots.get_unchecked(i) }.0;
            if key == addr {
                return Some(i);
            }
            if key == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    #[inline]
    pub fn get(&self, addr: u64) -> Option<u32> {
        if addr == EMPTY {
            return None;
        }
        self.find(addr).map(|i| self.slots[i].1)
    }

    /// Removes `addr`; what it mapped to, if it was there.
    #[inline]
    pub fn remove(&mut self, addr: u64) -> Option<u32> {
        if addr == EMPTY {
            return None;
        }
        let i = self.find(addr)?;
        let id = self.slots[i].1;
        self.len -= 1;
        let mask = self.mask();
        // SAFETY: masked to the table's power-of-two length.
        let next_key = unsafe { self.slots.get_unchecked((i + 1) & mask) }.0;
        if next_key == EMPTY {
            // The common case, a table at most half full: nothing after it to shift back.
            self.slots[i].0 = EMPTY;
        } else {
            self.shift_back(i);
        }
        Some(id)
    }

    /// Empties slot `hole`, moving back each entry after it (up to the next empty slot)
    /// whose home is not between the hole and it, so that every probe still finds its key.
    #[cold]
    fn shift_back(&mut self, mut hole: usize) {
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let key = self.slots[j].0;
            if key == EMPTY {
                break;
            }
            let home = self.home(key);
            // Distance probed from home to j, and from home to the hole: the entry may move
            // to the hole only if the hole lies on its probe path.
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
        }
        self.slots[hole].0 = EMPTY;
    }

    #[cold]
    fn grow(&mut self) {
        let n = 2 * self.slots.len();
        let old = std::mem::replace(&mut self.slots, vec![(EMPTY, 0); n]);
        self.shift -= 1;
        self.len = 0;
        for (addr, id) in old {
            if addr != EMPTY {
                self.insert(addr, id);
            }
        }
    }

    pub fn clear(&mut self) {
        self.slots.fill((EMPTY, 0));
        self.len = 0;
    }

    /// Back to the smallest table, or the smallest that holds what is left.
    pub fn shrink_to_fit(&mut self) {
        let mut n = MIN_SLOTS;
        while 2 * self.len > n {
            n *= 2;
        }
        if n == self.slots.len() {
            return;
        }
        let old = std::mem::replace(&mut self.slots, vec![(EMPTY, 0); n]);
        self.shift = 64 - n.trailing_zeros();
        self.len = 0;
        for (addr, id) in old {
            if addr != EMPTY {
                self.insert(addr, id);
            }
        }
    }
}

impl Extend<(u64, u32)> for AddrMap {
    fn extend<I: IntoIterator<Item = (u64, u32)>>(&mut self, iter: I) {
        for (addr, id) in iter {
            self.insert(addr, id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Inserts, removes and look-ups against `HashMap`, through growth and back to a
    /// small table, with addresses that collide in their home slots (multiples of 512 in
    /// a narrow range, and ones far apart) so that removes shift entries back.
    #[test]
    fn same_answers_as_a_hashmap() {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut map = AddrMap::default();
        let mut model: HashMap<u64, u32> = HashMap::new();
        let mut shifted = 0;
        for step in 0..100_000u32 {
            let r = next();
            // Three phases: grow to thousands, churn, drain.
            let span = if step < 30_000 { 8_000 } else { 2_000 };
            let addr = match r % 3 {
                0 => (r >> 8) % span * 512,
                1 => 0x7f00_0000_0000 + (r >> 8) % span * 2 * 1024 * 1024,
                _ => (r >> 8) % (span / 8 + 1) * 512 * 4096,
            };
            let insert = if step < 30_000 {
                r >> 60 < 11
            } else if step < 70_000 {
                r >> 60 < 8
            } else {
                r >> 60 < 3
            };
            if insert {
                let id = step;
                map.insert(addr, id);
                model.insert(addr, id);
            } else {
                let i = map.find(addr);
                let moves = i.is_some_and(|i| map.slots[(i + 1) & map.mask()].0 != EMPTY);
                assert_eq!(map.remove(addr), model.remove(&addr), "step {step}: remove {addr:#x}");
                shifted += usize::from(moves);
            }
            assert_eq!(map.len(), model.len(), "step {step}");
            let probe = (next() >> 8) % span * 512;
            assert_eq!(map.get(probe), model.get(&probe).copied(), "step {step}: get {probe:#x}");
            if step % 10_000 == 0 {
                assert_eq!(map.slots.iter().filter(|s| s.0 != EMPTY).count(), model.len(), "step {step}");
                for (&a, &id) in &model {
                    assert_eq!(map.get(a), Some(id), "step {step}: every key found");
                }
            }
        }
        assert!(shifted > 1000, "removes rarely shifted entries back ({shifted}): the test misses that path");
        for (&a, &id) in &model {
            assert_eq!(map.get(a), Some(id));
        }
        map.shrink_to_fit();
        assert!(map.slots.len() < 4 * MIN_SLOTS.max(2 * model.len()));
        for (&a, &id) in &model {
            assert_eq!(map.get(a), Some(id), "after shrinking");
        }
        map.clear();
        assert_eq!(map.len(), 0);
        assert_eq!(map.get(0), None);
    }

    /// The negative control: a remove that empties its slot without shifting back the
    /// entries after it loses keys that probed past it, and the comparison sees it.
    #[test]
    fn a_remove_without_the_shift_back_loses_keys() {
        let mut map = AddrMap::default();
        // Keys sharing one home slot: found one after another.
        let home = map.home(512);
        let same: Vec<u64> = (1..100_000u64).map(|k| k * 512).filter(|&a| map.home(a) == home).take(3).collect();
        for (i, &a) in same.iter().enumerate() {
            map.insert(a, i as u32);
        }
        let i = map.find(same[0]).unwrap();
        map.slots[i].0 = EMPTY;
        assert_eq!(map.get(same[1]), None, "the broken remove hides the keys after it");
        let mut good = AddrMap::default();
        for (i, &a) in same.iter().enumerate() {
            good.insert(a, i as u32);
        }
        assert_eq!(good.remove(same[0]), Some(0));
        assert_eq!((good.get(same[1]), good.get(same[2])), (Some(1), Some(2)));
    }
}
