//! `Gapped`: a size class's sorted keys with their block ids, with room kept before
//! the first entry, so that an insert or remove near the front moves the entries
//! before it into or out of that room instead of every entry after it.
//!
//! Why: a class holding many free blocks is used from its front. The best fit takes
//! a class's first entry (the smallest block, lowest address), and a block freed into
//! a class mostly sorts within its first few entries. In `run.pickle`'s check pass,
//! nearly every remove from a class of four or more entries was of its first, and a
//! `memmove` of the entries after it, about 80 instructions each, was the largest
//! single cost left in the allocator (docs/PERFORMANCE.md, "Replay passes,
//! twenty-third round (the allocator)").

use super::sorted::{move_within, replace_moving, Sorted};

/// Room before the first entry is given back (the entries moved down to the start)
/// only once it is both larger than the entries and at least this many slots: a class
/// used as a queue, taken from the front and pushed at the back, would otherwise grow
/// without end, and compacting each time would move as much as the removes saved.
const ROOM_KEPT: usize = 32;

/// Sorted keys in `keys[head..]`, their ids in `ids[head..]`; the slots before `head`
/// hold removed entries. An empty set has no room (`head` 0, both vectors empty).
#[derive(Clone, Debug, Default)]
pub(super) struct Gapped {
    keys: Vec<u128>,
    ids: Vec<u32>,
    head: usize,
}

impl From<Sorted> for Gapped {
    fn from(v: Sorted) -> Self {
        Gapped { keys: v.keys, ids: v.ids, head: 0 }
    }
}

impl Gapped {
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.keys.len() - self.head
    }

    /// The position of the first key at least `key`.
    #[inline]
    pub(super) fn lower_bound(&self, key: u128) -> usize {
        self.keys[self.head..].partition_point(|&k| k < key)
    }

    #[inline]
    pub(super) fn at(&self, i: usize) -> (u128, u32) {
        (self.keys[self.head + i], self.ids[self.head + i])
    }

    #[inline]
    pub(super) fn id_at(&self, i: usize) -> u32 {
        self.ids[self.head + i]
    }

    #[inline]
    pub(super) fn last_key(&self) -> Option<u128> {
        // An empty set has no room, so the vector's last is the set's.
        self.keys.last().copied()
    }

    /// Appends a key past the last.
    #[inline]
    pub(super) fn push(&mut self, key: u128, id: u32) {
        debug_assert!(self.last_key().is_none_or(|last| last < key), "a push keeps the keys sorted");
        self.keys.push(key);
        self.ids.push(id);
    }

    #[inline]
    pub(super) fn clear(&mut self) {
        self.keys.clear();
        self.ids.clear();
        self.head = 0;
    }

    /// The position of exactly `key`, if present.
    #[inline]
    pub(super) fn find(&self, key: u128) -> Option<usize> {
        let at = self.lower_bound(key);
        (self.keys.get(self.head + at) == Some(&key)).then_some(at)
    }

    /// Inserts; false if the key was already present.
    #[inline]
    pub(super) fn insert(&mut self, key: u128, id: u32) -> bool {
        if self.keys.last().is_none_or(|&last| last < key) {
            self.push(key, id);
            return true;
        }
        self.insert_before_last(key, id)
    }

    /// [`Gapped::insert`] of a key not past the last: the entries before its place move
    /// down into the room where there is room and they are the fewer, else the entries
    /// after it move up.
    fn insert_before_last(&mut self, key: u128, id: u32) -> bool {
        let (h, at) = (self.head, self.lower_bound(key));
        if self.keys[h + at] == key {
            return false;
        }
        let after = self.len() - at;
        if h > 0 && at < after {
            move_within(&mut self.keys, h, at, h - 1);
            move_within(&mut self.ids, h, at, h - 1);
            self.head = h - 1;
            (self.keys[h - 1 + at], self.ids[h - 1 + at]) = (key, id);
        } else {
            self.keys.push(key);
            self.ids.push(id);
            move_within(&mut self.keys, h + at, after, h + at + 1);
            move_within(&mut self.ids, h + at, after, h + at + 1);
            (self.keys[h + at], self.ids[h + at]) = (key, id);
        }
        true
    }

    /// Removes `key`; its id if it was present. The last (most removes by key from a
    /// class of several under expandable segments) is popped with no search, inline; the
    /// rest is a call.
    #[inline]
    pub(super) fn remove(&mut self, key: u128) -> Option<u32> {
        if self.keys.last() == Some(&key) {
            let id = self.ids[self.ids.len() - 1];
            if self.len() == 1 {
                self.clear();
            } else {
                self.keys.pop();
                self.ids.pop();
            }
            return Some(id);
        }
        self.remove_before_last(key)
    }

    /// [`Gapped::remove`] of a key not the last.
    #[inline(never)]
    fn remove_before_last(&mut self, key: u128) -> Option<u32> {
        let at = self.find(key)?;
        Some(self.remove_at(at).1)
    }

    /// Removes the entry at `i`. The first (a best fit's, most removes) widens the room,
    /// inline; the rest is a call.
    #[inline]
    pub(super) fn remove_at(&mut self, i: usize) -> (u128, u32) {
        let (h, n) = (self.head, self.len());
        let e = (self.keys[h + i], self.ids[h + i]);
        if i == 0 && n > 1 {
            self.head = h + 1;
            if self.head > ROOM_KEPT && self.head > n {
                self.compact();
            }
        } else {
            self.remove_at_moving(i);
        }
        e
    }

    /// [`Gapped::remove_at`] of an entry other than the first of several: the set's only
    /// one clears it, the last is popped, one between moves the fewer of the entries
    /// before it (into the room) and after it.
    #[inline(never)]
    fn remove_at_moving(&mut self, i: usize) {
        let (h, n) = (self.head, self.len());
        if n == 1 {
            self.clear();
        } else if i + 1 == n {
            self.keys.pop();
            self.ids.pop();
        } else if i < n - 1 - i {
            move_within(&mut self.keys, h, i, h + 1);
            move_within(&mut self.ids, h, i, h + 1);
            self.head = h + 1;
            if self.head > ROOM_KEPT && self.head > n {
                self.compact();
            }
        } else {
            move_within(&mut self.keys, h + i + 1, n - 1 - i, h + i);
            move_within(&mut self.ids, h + i + 1, n - 1 - i, h + i);
            self.keys.pop();
            self.ids.pop();
        }
    }

    /// Gives the room back: the entries move down to the start.
    #[cold]
    fn compact(&mut self) {
        self.keys.drain(..self.head);
        self.ids.drain(..self.head);
        self.head = 0;
    }

    /// As [`Sorted::replace_at`]: the entry at `old` takes `key` and `id`, moving only
    /// the entries between its old and new places; or, where `key` is present already,
    /// the entry at `old` is removed and the answer is false.
    #[inline]
    pub(super) fn replace_at(&mut self, old: usize, key: u128, id: u32) -> bool {
        let h = self.head;
        let keys = &self.keys[h..];
        let after_prev = old == 0 || keys[old - 1] < key;
        if after_prev && keys.get(old + 1).is_none_or(|&next| key < next) {
            (self.keys[h + old], self.ids[h + old]) = (key, id);
            return true;
        }
        self.replace_at_moving(old, key, id)
    }

    /// [`Gapped::replace_at`] of a key that sorts past a neighbour of the entry's place
    /// (or equals one).
    #[inline(never)]
    fn replace_at_moving(&mut self, old: usize, key: u128, id: u32) -> bool {
        let h = self.head;
        if replace_moving(&mut self.keys[h..], &mut self.ids[h..], old, key, id) {
            return true;
        }
        self.remove_at(old);
        false
    }

    /// The entries from position `from` on.
    pub(super) fn iter_from(&self, from: usize) -> impl Iterator<Item = (u128, u32)> + '_ {
        let at = self.head + from;
        self.keys[at..].iter().copied().zip(self.ids[at..].iter().copied())
    }

    pub(super) fn into_sorted(mut self) -> Sorted {
        self.compact();
        Sorted { keys: self.keys, ids: self.ids }
    }

    #[cfg(test)]
    fn room(&self) -> usize {
        self.head
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// (key, what): 0 removes the key, 1 inserts it, 2 removes the first entry, 3 replaces
    /// the entry at `key % len` by the key `key`, 4 round-trips through `Sorted`.
    type Op = (u128, u8);

    fn check(ops: &[Op]) -> Result<(), TestCaseError> {
        let mut g = Gapped::default();
        let mut model: BTreeMap<u128, u32> = BTreeMap::new();
        let mut peak = 0;
        for (n, &(key, what)) in ops.iter().enumerate() {
            let id = n as u32;
            match what {
                0 => prop_assert_eq!(g.remove(key), model.remove(&key)),
                1 => {
                    let fresh = !model.contains_key(&key);
                    prop_assert_eq!(g.insert(key, id), fresh);
                    if fresh {
                        model.insert(key, id);
                    }
                }
                2 if !model.is_empty() => {
                    let first = model.pop_first().unwrap();
                    prop_assert_eq!(g.remove_at(0), first);
                }
                3 if !model.is_empty() => {
                    let i = (key % model.len() as u128) as usize;
                    let old = *model.keys().nth(i).unwrap();
                    model.remove(&old);
                    let fresh = !model.contains_key(&key);
                    prop_assert_eq!(g.replace_at(i, key, id), fresh);
                    if fresh {
                        model.insert(key, id);
                    }
                }
                4 => g = Gapped::from(std::mem::take(&mut g).into_sorted()),
                _ => {}
            }
            prop_assert_eq!(g.len(), model.len());
            peak = peak.max(model.len());
            let want: Vec<(u128, u32)> = model.iter().map(|(&k, &v)| (k, v)).collect();
            prop_assert_eq!(g.iter_from(0).collect::<Vec<_>>(), want.clone());
            prop_assert_eq!(g.last_key(), want.last().map(|e| e.0));
            let q = key / 2;
            let lb = want.partition_point(|e| e.0 < q);
            prop_assert_eq!(g.lower_bound(q), lb);
            prop_assert_eq!(g.find(key), want.iter().position(|e| e.0 == key));
            if lb < want.len() {
                prop_assert_eq!(g.at(lb), want[lb]);
                prop_assert_eq!(g.id_at(lb), want[lb].1);
            }
            // The room stays within `ROOM_KEPT` or the most entries held.
            prop_assert!(g.room() <= ROOM_KEPT.max(peak) + 1, "room {} for at most {peak}", g.room());
        }
        Ok(())
    }

    proptest! {
        /// Behaves as an ordered map through growth, churn at both ends and in between,
        /// and draining.
        #[test]
        fn same_answers_as_a_btreemap(ops in proptest::collection::vec((0u128..400, 0u8..5), 1..800)) {
            check(&ops)?;
        }

        /// Mostly taken from the front and refilled near it, as a size class is: the room
        /// is used and refilled.
        #[test]
        fn same_answers_used_from_the_front(ops in proptest::collection::vec((0u128..300, prop_oneof![2 => Just(2u8), 2 => Just(1u8), 1 => Just(0u8), 1 => Just(3u8)]), 200..1200)) {
            check(&ops)?;
        }
    }

    /// A queue (pushed at the back, taken from the front) keeps its room bounded: the
    /// entries move down once the room passes both `ROOM_KEPT` and their number.
    #[test]
    fn a_queue_gives_its_room_back() {
        let mut ops: Vec<Op> = (0..40).map(|k| (k, 1)).collect();
        for k in 40..5000 {
            ops.push((k, 1));
            ops.push((0, 2));
        }
        check(&ops).unwrap();
    }

    /// The room is used: after removes from the front, an insert near it moves the
    /// entries before its place down, not the hundreds after it.
    #[test]
    fn an_insert_near_the_front_fills_the_room() {
        let mut g = Gapped::default();
        for k in 0..200u128 {
            g.push(10 * k, k as u32);
        }
        for _ in 0..5 {
            g.remove_at(0);
        }
        assert_eq!((g.room(), g.len()), (5, 195));
        assert!(g.insert(61, 7));
        assert_eq!((g.room(), g.len()), (4, 196));
        assert_eq!(g.iter_from(0).take(3).collect::<Vec<_>>(), [(50, 5), (60, 6), (61, 7)]);
    }
}
