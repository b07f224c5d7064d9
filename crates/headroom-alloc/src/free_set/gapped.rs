//! `Gapped`: a size class's sorted keys with their block ids, with room kept before
//! the first entry, so that an insert or remove near the front moves the entries
//! before it into or out of that room instead of every entry after it; and a class
//! of one entry keeps it inline, in the class's own bucket.
//!
//! Why the room: a class holding many free blocks is used from its front. The best fit
//! takes a class's first entry (the smallest block, lowest address), and a block freed
//! into a class mostly sorts within its first few entries. In `run.pickle`'s check pass,
//! nearly every remove from a class of four or more entries was of its first, and a
//! `memmove` of the entries after it, about 80 instructions each, was the largest
//! single cost left in the allocator (docs/PERFORMANCE.md, "Replay passes,
//! twenty-third round (the allocator)").
//!
//! Why inline: most classes that hold anything hold one block, and most blocks come
//! into an empty class and leave it empty (docs/PERFORMANCE.md, "Replay passes,
//! eighteenth round"). With the key and the id in vectors of their own, a best fit or
//! a free of such a class read three cache lines picked by size in no order (the
//! bucket, the key's, the id's); inline, the bucket's alone (docs/PERFORMANCE.md,
//! "Replay passes, twenty-fifth round"). The entries of a class of several lie in one
//! vector, the id beside its key, so that the bucket and the vector leave room for the
//! inline entry within the bucket's 64 bytes.

use super::sorted::{move_within, Sorted};

/// Room before the first entry is given back (the entries moved down to the start)
/// only once it is both larger than the entries and at least this many slots: a class
/// used as a queue, taken from the front and pushed at the back, would otherwise grow
/// without end, and compacting each time would move as much as the removes saved.
const ROOM_KEPT: usize = 32;

/// `head` of a set whose one entry is inline (`key`, `id`; `entries` empty then). With
/// it, `entries.len() - head` wraps to 1, so the length needs no branch.
const INLINE: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Entry {
    key: u128,
    id: u32,
}

/// Sorted entries in `entries[head..]`; the slots before `head` hold removed entries.
/// An empty set has no room (`head` 0, `entries` empty). One entry taken into an empty
/// set is inline (`head` [`INLINE`]) until a second comes; a set left with one entry by
/// removes keeps it in the vector.
#[derive(Clone, Debug, Default)]
pub(super) struct Gapped {
    key: u128,
    entries: Vec<Entry>,
    head: u32,
    id: u32,
}

impl From<Sorted> for Gapped {
    fn from(v: Sorted) -> Self {
        let entries = v.keys.into_iter().zip(v.ids).map(|(key, id)| Entry { key, id }).collect();
        Gapped { key: 0, entries, head: 0, id: 0 }
    }
}

impl Gapped {
    #[inline]
    fn inline(&self) -> bool {
        self.head == INLINE
    }

    #[inline]
    pub(super) fn len(&self) -> usize {
        // A class holds at most `SMALL_MAX` entries here, so the length fits a u32.
        (self.entries.len() as u32).wrapping_sub(self.head) as usize
    }

    /// The live entries (none where the one entry is inline).
    #[inline]
    fn live(&self) -> &[Entry] {
        &self.entries[self.head as usize..]
    }

    /// The position of the first key at least `key`.
    #[inline]
    pub(super) fn lower_bound(&self, key: u128) -> usize {
        if self.inline() {
            return usize::from(self.key < key);
        }
        self.live().partition_point(|e| e.key < key)
    }

    #[inline]
    pub(super) fn at(&self, i: usize) -> (u128, u32) {
        if self.inline() {
            debug_assert_eq!(i, 0);
            return (self.key, self.id);
        }
        let e = self.entries[self.head as usize + i];
        (e.key, e.id)
    }

    #[inline]
    pub(super) fn id_at(&self, i: usize) -> u32 {
        if self.inline() {
            debug_assert_eq!(i, 0);
            return self.id;
        }
        self.entries[self.head as usize + i].id
    }

    #[inline]
    pub(super) fn last_key(&self) -> Option<u128> {
        if self.inline() {
            return Some(self.key);
        }
        // An empty set has no room, so the vector's last is the set's.
        self.entries.last().map(|e| e.key)
    }

    /// Takes the one entry of an empty set, inline: a push into a class its bit says is
    /// empty (most pushes: a class mostly holds none or one block), with nothing to ask.
    #[inline(always)]
    pub(super) fn push_into_empty(&mut self, key: u128, id: u32) {
        debug_assert!(self.head == 0 && self.entries.is_empty(), "an empty set has no room");
        (self.key, self.id, self.head) = (key, id, INLINE);
    }

    /// Appends a key past the last: inline into an empty set.
    #[inline]
    pub(super) fn push(&mut self, key: u128, id: u32) {
        debug_assert!(self.last_key().is_none_or(|last| last < key), "a push keeps the keys sorted");
        if self.inline() {
            self.entries.extend([Entry { key: self.key, id: self.id }, Entry { key, id }]);
            self.head = 0;
        } else if self.entries.is_empty() {
            self.push_into_empty(key, id);
        } else {
            self.entries.push(Entry { key, id });
        }
    }

    #[inline]
    pub(super) fn clear(&mut self) {
        self.entries.clear();
        self.head = 0;
    }

    /// The position of exactly `key`, if present.
    #[inline]
    pub(super) fn find(&self, key: u128) -> Option<usize> {
        if self.inline() {
            return (self.key == key).then_some(0);
        }
        let at = self.lower_bound(key);
        (self.live().get(at).map(|e| e.key) == Some(key)).then_some(at)
    }

    /// Inserts; false if the key was already present.
    #[inline]
    pub(super) fn insert(&mut self, key: u128, id: u32) -> bool {
        if self.last_key().is_none_or(|last| last < key) {
            self.push(key, id);
            return true;
        }
        self.insert_before_last(key, id)
    }

    /// [`Gapped::insert`] of a key not past the last: before an inline entry, both go
    /// to the vector; else the entries before its place move down into the room where
    /// there is room and they are the fewer, else the entries after it move up.
    fn insert_before_last(&mut self, key: u128, id: u32) -> bool {
        if self.inline() {
            if self.key == key {
                return false;
            }
            self.entries.extend([Entry { key, id }, Entry { key: self.key, id: self.id }]);
            self.head = 0;
            return true;
        }
        let (h, at) = (self.head as usize, self.lower_bound(key));
        if self.entries[h + at].key == key {
            return false;
        }
        let after = self.len() - at;
        if h > 0 && at < after {
            move_within(&mut self.entries, h, at, h - 1);
            self.head -= 1;
            self.entries[h - 1 + at] = Entry { key, id };
        } else {
            self.entries.push(Entry { key, id });
            move_within(&mut self.entries, h + at, after, h + at + 1);
            self.entries[h + at] = Entry { key, id };
        }
        true
    }

    /// Removes `key`; its id if it was present. The inline entry and the last (most
    /// removes by key from a class of several under expandable segments) go with no
    /// search, inline; the rest is a call.
    #[inline]
    pub(super) fn remove(&mut self, key: u128) -> Option<u32> {
        if self.inline() {
            if self.key != key {
                return None;
            }
            self.head = 0;
            return Some(self.id);
        }
        let last = *self.entries.last()?;
        if last.key == key {
            if self.len() == 1 {
                self.clear();
            } else {
                self.entries.pop();
            }
            return Some(last.id);
        }
        self.remove_before_last(key)
    }

    /// [`Gapped::remove`] of a key not the last.
    #[inline(never)]
    fn remove_before_last(&mut self, key: u128) -> Option<u32> {
        let at = self.find(key)?;
        Some(self.remove_at(at).1)
    }

    /// Removes the entry at `i`. The inline one and the first of several (a best fit's,
    /// most removes) go inline: the first by widening the room; the rest is a call.
    #[inline]
    pub(super) fn remove_at(&mut self, i: usize) -> (u128, u32) {
        if self.inline() {
            debug_assert_eq!(i, 0);
            self.head = 0;
            return (self.key, self.id);
        }
        let (h, n) = (self.head as usize, self.len());
        let e = self.entries[h + i];
        if i == 0 && n > 1 {
            self.head += 1;
            if h + 1 > ROOM_KEPT && h + 1 > n {
                self.compact();
            }
        } else {
            self.remove_at_moving(i);
        }
        (e.key, e.id)
    }

    /// [`Gapped::remove_at`] of an entry other than the first of several: the set's only
    /// one clears it, the last is popped, one between moves the fewer of the entries
    /// before it (into the room) and after it.
    #[inline(never)]
    fn remove_at_moving(&mut self, i: usize) {
        let (h, n) = (self.head as usize, self.len());
        if n == 1 {
            self.clear();
        } else if i + 1 == n {
            self.entries.pop();
        } else if i < n - 1 - i {
            move_within(&mut self.entries, h, i, h + 1);
            self.head += 1;
            if h + 1 > ROOM_KEPT && h + 1 > n {
                self.compact();
            }
        } else {
            move_within(&mut self.entries, h + i + 1, n - 1 - i, h + i);
            self.entries.pop();
        }
    }

    /// Gives the room back: the entries move down to the start.
    #[cold]
    fn compact(&mut self) {
        debug_assert!(!self.inline());
        self.entries.drain(..self.head as usize);
        self.head = 0;
    }

    /// As [`Sorted::replace_at`]: the entry at `old` takes `key` and `id`, moving only
    /// the entries between its old and new places; or, where `key` is present already,
    /// the entry at `old` is removed and the answer is false.
    #[inline]
    pub(super) fn replace_at(&mut self, old: usize, key: u128, id: u32) -> bool {
        if self.inline() {
            debug_assert_eq!(old, 0);
            (self.key, self.id) = (key, id);
            return true;
        }
        let (h, live) = (self.head as usize, self.live());
        let after_prev = old == 0 || live[old - 1].key < key;
        if after_prev && live.get(old + 1).is_none_or(|next| key < next.key) {
            self.entries[h + old] = Entry { key, id };
            return true;
        }
        self.replace_at_moving(old, key, id)
    }

    /// [`Gapped::replace_at`] of a key that sorts past a neighbour of the entry's place
    /// (or equals one): only the entries between the two places move.
    #[inline(never)]
    fn replace_at_moving(&mut self, old: usize, key: u128, id: u32) -> bool {
        let h = self.head as usize;
        let live = &mut self.entries[h..];
        if key < live[old].key {
            let to = live[..old].partition_point(|e| e.key < key);
            if live[to].key == key {
                self.remove_at(old);
                return false;
            }
            move_within(live, to, old - to, to + 1);
            live[to] = Entry { key, id };
        } else {
            let to = old + 1 + live[old + 1..].partition_point(|e| e.key < key);
            if live.get(to).is_some_and(|e| e.key == key) {
                self.remove_at(old);
                return false;
            }
            move_within(live, old + 1, to - old - 1, old);
            live[to - 1] = Entry { key, id };
        }
        true
    }

    /// The entries from position `from` on.
    pub(super) fn iter_from(&self, from: usize) -> impl Iterator<Item = (u128, u32)> + '_ {
        let (one, rest) = if self.inline() {
            ((from == 0).then_some((self.key, self.id)), &[][..])
        } else {
            (None, &self.live()[from..])
        };
        one.into_iter().chain(rest.iter().map(|e| (e.key, e.id)))
    }

    pub(super) fn into_sorted(self) -> Sorted {
        let (keys, ids) = self.iter_from(0).unzip();
        Sorted { keys, ids }
    }

    #[cfg(test)]
    fn room(&self) -> usize {
        if self.inline() {
            0
        } else {
            self.head as usize
        }
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
            prop_assert!(!g.inline() || g.entries.is_empty(), "an inline entry is the set's only one");
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

    /// A lone entry is inline, and goes to the vector when a second comes; an emptied set
    /// keeps its vector's capacity, so a class emptied and refilled allocates nothing.
    #[test]
    fn a_lone_entry_is_inline() {
        let mut g = Gapped::default();
        g.push(10, 1);
        assert!(g.inline() && g.entries.is_empty());
        assert_eq!((g.len(), g.at(0), g.lower_bound(10), g.lower_bound(11)), (1, (10, 1), 0, 1));
        assert!(g.insert(5, 2));
        assert!(!g.inline());
        assert_eq!(g.iter_from(0).collect::<Vec<_>>(), [(5, 2), (10, 1)]);
        assert_eq!(g.remove_at(0), (5, 2));
        assert_eq!((g.len(), g.room()), (1, 1), "one left by a remove stays in the vector");
        assert_eq!(g.remove(10), Some(1));
        let cap = g.entries.capacity();
        g.push(7, 3);
        assert!(g.inline());
        assert_eq!(g.remove(7), Some(3));
        assert_eq!((g.len(), g.room(), g.entries.capacity()), (0, 0, cap));
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
