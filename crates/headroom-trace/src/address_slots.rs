//! Slots named by address, for replays of a recording, whose allocations are
//! named by where the recorded run placed them: an address is a slot from its
//! allocation to its free, and a freed slot is used again.
//!
//! The map from address to slot is the one hash map a replay of a recording
//! keeps (the walk's slot holds the allocator's block, so the allocator keeps
//! none). It is an open-addressing table of its own, not a `HashMap`: one
//! insert and one remove per allocation, on keys that are distinct pointers,
//! need no tombstones and no control bytes. Linear probing from a
//! multiplicative hash (addresses are multiples of 512, so the high bits of the
//! product place them), at most half full, and a remove that shifts the entries
//! after it back (so a later search stops at the first vacant place) cost 111
//! instructions an allocation and its free, where hashbrown's insert and remove
//! cost 147 (docs/PERFORMANCE.md, "Replay passes, eighth round").

use crate::walk::Slot;

/// A vacant place. The one address that is this is kept apart (`at_max`).
const VACANT: u64 = u64::MAX;

/// See the module documentation.
#[derive(Clone, Debug, Default)]
pub struct AddressSlots {
    /// (address, slot), `VACANT` where none; a power of two long, or empty.
    table: Vec<(u64, Slot)>,
    /// Addresses in `table`.
    len: usize,
    /// The slot of the address `u64::MAX`, which `table` cannot hold.
    at_max: Option<Slot>,
    unused: Vec<Slot>,
    slots: Slot,
}

impl AddressSlots {
    /// A slot no address names (a request the recorded run could not serve),
    /// for [`AddressSlots::give_back`] once its operations are queued.
    pub fn take(&mut self) -> Slot {
        self.unused.pop().unwrap_or_else(|| {
            self.slots += 1;
            self.slots - 1
        })
    }

    /// A slot for the block now live at `address` (which, if some block was live
    /// there already, names this one from now on).
    pub fn allocated(&mut self, address: u64) -> Slot {
        let slot = self.take();
        if address == VACANT {
            self.at_max = Some(slot);
            return slot;
        }
        if 2 * (self.len + 1) > self.table.len() {
            self.grow();
        }
        let mask = self.table.len() - 1;
        let mut i = self.home(address);
        loop {
            let e = &mut self.table[i];
            if e.0 == VACANT {
                *e = (address, slot);
                self.len += 1;
                return slot;
            }
            if e.0 == address {
                e.1 = slot;
                return slot;
            }
            i = (i + 1) & mask;
        }
    }

    /// The slot of the block at `address`, which stops being live: `None` for
    /// an address no live block has.
    pub fn freed(&mut self, address: u64) -> Option<Slot> {
        let slot = if address == VACANT { self.at_max.take()? } else { self.remove(address)? };
        self.unused.push(slot);
        Some(slot)
    }

    /// The slot of the block live at `address`, which stays live (a free requested
    /// but not yet done): `None` for an address no live block has.
    pub fn slot_of(&self, address: u64) -> Option<Slot> {
        if address == VACANT {
            return self.at_max;
        }
        if self.table.is_empty() {
            return None;
        }
        let mask = self.table.len() - 1;
        let mut i = self.home(address);
        loop {
            match self.table[i] {
                (VACANT, _) => return None,
                (a, slot) if a == address => return Some(slot),
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// The slots taken so far: `0..count()`.
    pub fn count(&self) -> Slot {
        self.slots
    }

    /// `slot`, taken and no longer needed.
    pub fn give_back(&mut self, slot: Slot) {
        self.unused.push(slot);
    }

    /// Where `address`'s search begins: the top bits of a multiplicative hash.
    #[inline]
    fn home(&self, address: u64) -> usize {
        let bits = self.table.len().trailing_zeros();
        (address.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - bits)) as usize
    }

    #[inline]
    fn remove(&mut self, address: u64) -> Option<Slot> {
        if self.table.is_empty() {
            return None;
        }
        let mask = self.table.len() - 1;
        let mut i = self.home(address);
        loop {
            match self.table[i].0 {
                VACANT => return None,
                a if a == address => break,
                _ => i = (i + 1) & mask,
            }
        }
        let slot = self.table[i].1;
        self.len -= 1;
        // Shift back each entry after the hole whose home is not between the hole and it
        // (cyclically): its search passes the hole's place, which must not be vacant.
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let a = self.table[j].0;
            if a == VACANT {
                break;
            }
            let h = self.home(a);
            let stays = if i <= j { i < h && h <= j } else { i < h || h <= j };
            if !stays {
                self.table[i] = self.table[j];
                i = j;
            }
        }
        self.table[i].0 = VACANT;
        Some(slot)
    }

    #[cold]
    fn grow(&mut self) {
        let n = (2 * self.table.len()).max(64);
        let old = std::mem::replace(&mut self.table, vec![(VACANT, 0); n]);
        let mask = n - 1;
        for (a, s) in old.into_iter().filter(|e| e.0 != VACANT) {
            let mut i = self.home(a);
            while self.table[i].0 != VACANT {
                i = (i + 1) & mask;
            }
            self.table[i] = (a, s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        /// The same slots as a `HashMap` keeps, through growth and removes that shift
        /// entries back, with addresses that collide (few distinct, multiples of 512)
        /// and the one address the table cannot hold.
        #[test]
        fn same_slots_as_a_hash_map(ops in proptest::collection::vec((any::<bool>(), 0u64..300), 1..3000)) {
            let mut s = AddressSlots::default();
            let mut model: HashMap<u64, Slot> = HashMap::new();
            let (mut unused, mut slots): (Vec<Slot>, Slot) = (Vec::new(), 0);
            for (alloc, k) in ops {
                let address = if k == 299 { u64::MAX } else { k * 512 };
                if alloc {
                    let want = unused.pop().unwrap_or_else(|| { slots += 1; slots - 1 });
                    model.insert(address, want);
                    prop_assert_eq!(s.allocated(address), want);
                } else {
                    prop_assert_eq!(s.slot_of(address), model.get(&address).copied());
                    let want = model.remove(&address);
                    if let Some(w) = want {
                        unused.push(w);
                    }
                    prop_assert_eq!(s.freed(address), want);
                }
            }
            for (a, want) in model {
                prop_assert_eq!(s.freed(a), Some(want));
            }
            prop_assert_eq!(s.len, 0);
        }
    }
}
