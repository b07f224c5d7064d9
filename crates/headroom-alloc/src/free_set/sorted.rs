//! `Sorted`: a free set's sorted keys with their block ids, the vector that a small
//! stream's set and each run of a crowded size class are made of, and its moves.

/// Sorted keys with their block ids beside them, in two vectors: an insert or
/// remove moves 20 bytes an entry after it, not the 32 of a `(u128, u32)`
/// pair padded to the key's alignment, and a search reads keys only.
#[derive(Clone, Debug, Default)]
pub(super) struct Sorted {
    pub(super) keys: Vec<u128>,
    pub(super) ids: Vec<u32>,
}

impl Sorted {
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.keys.len()
    }

    /// The position of the first key at least `key`.
    #[inline]
    pub(super) fn lower_bound(&self, key: u128) -> usize {
        self.keys.partition_point(|&k| k < key)
    }

    #[inline]
    pub(super) fn at(&self, i: usize) -> (u128, u32) {
        (self.keys[i], self.ids[i])
    }

    #[inline]
    pub(super) fn get(&self, i: usize) -> Option<(u128, u32)> {
        Some((*self.keys.get(i)?, self.ids[i]))
    }

    #[inline]
    pub(super) fn last_key(&self) -> Option<u128> {
        self.keys.last().copied()
    }

    /// Inserts; false if the key was already present.
    #[inline]
    pub(super) fn insert(&mut self, key: u128, id: u32) -> bool {
        // Past the last key (into an empty set: the warm case, and most inserts into a size
        // class, whose sets hold one or two blocks): a push, inlined, with no search and no
        // call (docs/PERFORMANCE.md, "Replay passes, sixteenth round").
        if self.keys.last().is_none_or(|&last| last < key) {
            self.keys.push(key);
            self.ids.push(id);
            return true;
        }
        self.insert_before_last(key, id)
    }

    /// [`Sorted::insert`] of a key not past the last.
    fn insert_before_last(&mut self, key: u128, id: u32) -> bool {
        let at = self.lower_bound(key);
        debug_assert!(at < self.keys.len(), "a key past the last is pushed");
        if self.keys[at] == key {
            return false;
        }
        // Pushed, then the entries from `at` on moved up one: `Vec::insert` moves them with a
        // call of `memmove`, however few.
        let after = self.keys.len() - at;
        self.keys.push(key);
        self.ids.push(id);
        move_within(&mut self.keys, at, after, at + 1);
        move_within(&mut self.ids, at, after, at + 1);
        (self.keys[at], self.ids[at]) = (key, id);
        debug_assert!(at == 0 || self.keys[at - 1] < key, "the keys stay sorted");
        debug_assert!(self.keys[at + 1] > key, "the keys stay sorted");
        true
    }

    /// Removes `key`; its id if it was present. The last key (a set of one: most removes
    /// from a size class) is popped with no search.
    #[inline]
    pub(super) fn remove(&mut self, key: u128) -> Option<u32> {
        if self.keys.last() == Some(&key) {
            self.keys.pop();
            return self.ids.pop();
        }
        self.remove_before_last(key)
    }

    /// [`Sorted::remove`] of a key not the last.
    fn remove_before_last(&mut self, key: u128) -> Option<u32> {
        let at = self.find(key)?;
        Some(self.remove_at(at).1)
    }

    #[inline(always)]
    pub(super) fn remove_at(&mut self, i: usize) -> (u128, u32) {
        // The last entry (a set of one, the common warm case) is popped: `Vec::remove`
        // calls `memmove` even to move nothing. Inline, where as a call of its own the pop
        // cost about 40 instructions (docs/PERFORMANCE.md, "Warm malloc + free pair,
        // twenty-first round").
        if i + 1 == self.keys.len() {
            if let (Some(k), Some(id)) = (self.keys.pop(), self.ids.pop()) {
                return (k, id);
            }
        }
        self.remove_before_last_at(i)
    }

    /// [`Sorted::remove_at`] of an entry not the last.
    #[inline(never)]
    fn remove_before_last_at(&mut self, i: usize) -> (u128, u32) {
        let (k, id) = (self.keys[i], self.ids[i]);
        let after = self.keys.len() - i - 1;
        move_within(&mut self.keys, i + 1, after, i);
        move_within(&mut self.ids, i + 1, after, i);
        self.keys.pop();
        self.ids.pop();
        (k, id)
    }

    /// The position of exactly `key`, if present.
    #[inline]
    pub(super) fn find(&self, key: u128) -> Option<usize> {
        let at = self.lower_bound(key);
        (self.keys.get(at) == Some(&key)).then_some(at)
    }

    /// Gives the entry at `old` the key `key` and the id `id`, moving only the
    /// entries between its old and new places; or, where `key` is present already,
    /// removes the entry at `old` and returns false. One search, of the side of
    /// `old` the key moves to: a block that shrinks sorts before its old place,
    /// one that grows after it.
    #[inline(always)]
    pub(super) fn replace_at(&mut self, old: usize, key: u128, id: u32) -> bool {
        // Where the key still sorts between the entry's neighbours it takes the entry's
        // place with no search and no move: a remainder shrinking in a set of one, or a
        // block growing by a neighbour it absorbed, as in every warm pair. Written inline,
        // a few comparisons, where the call with its searches cost about 60 instructions
        // (docs/PERFORMANCE.md, "Warm malloc + free pair, twenty-first round").
        let keys = &self.keys[..];
        debug_assert!(old < keys.len(), "the entry replaced is in the set");
        let after_prev = old == 0 || keys[old - 1] < key;
        if after_prev && keys.get(old + 1).is_none_or(|&next| key < next) {
            self.keys[old] = key;
            self.ids[old] = id;
            return true;
        }
        self.replace_at_moving(old, key, id)
    }

    /// [`Sorted::replace_at`] of a key that sorts past a neighbour of the entry's place
    /// (or equals one).
    #[inline(never)]
    fn replace_at_moving(&mut self, old: usize, key: u128, id: u32) -> bool {
        if replace_moving(&mut self.keys, &mut self.ids, old, key, id) {
            return true;
        }
        self.remove_at(old);
        false
    }

    pub(super) fn split_off(&mut self, at: usize) -> Sorted {
        Sorted { keys: self.keys.split_off(at), ids: self.ids.split_off(at) }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (u128, u32)> + '_ {
        self.keys.iter().copied().zip(self.ids.iter().copied())
    }

    /// The entries from position `from` on.
    pub(super) fn iter_from(&self, from: usize) -> impl Iterator<Item = (u128, u32)> + '_ {
        self.keys[from..].iter().copied().zip(self.ids[from..].iter().copied())
    }
}

/// `v.copy_within(from..from + len, to)`, with the short moves (most in a size class, which
/// holds a few blocks) written with a constant length, which the compiler makes a few loads
/// and stores: a call of `memmove` cost 38 instructions on average, however little it moved, and
/// nothing at all for no move (docs/PERFORMANCE.md, "Replay passes, twentieth round").
#[inline(always)]
pub(super) fn move_within<T: Copy>(v: &mut [T], from: usize, len: usize, to: usize) {
    match len {
        0 => {}
        1 => v.copy_within(from..from + 1, to),
        2 => v.copy_within(from..from + 2, to),
        3 => v.copy_within(from..from + 3, to),
        _ => v.copy_within(from..from + len, to),
    }
}

/// The moving half of [`Sorted::replace_at`] over sorted `keys` with their `ids`: the
/// entry at `old` takes `key` and `id`, and only the entries between its old and new
/// places move. False, with nothing moved, where `key` is present already (the caller
/// then removes the entry at `old`).
#[inline(always)]
pub(super) fn replace_moving(keys: &mut [u128], ids: &mut [u32], old: usize, key: u128, id: u32) -> bool {
    if key < keys[old] {
        let to = keys[..old].partition_point(|&k| k < key);
        if keys[to] == key {
            return false;
        }
        // The common shrink keeps its place (the set's smallest, or one just above a
        // smaller block): no move.
        move_within(keys, to, old - to, to + 1);
        move_within(ids, to, old - to, to + 1);
        (keys[to], ids[to]) = (key, id);
    } else {
        let to = old + 1 + keys[old + 1..].partition_point(|&k| k < key);
        if keys.get(to) == Some(&key) {
            return false;
        }
        move_within(keys, old + 1, to - old - 1, old);
        move_within(ids, old + 1, to - old - 1, old);
        (keys[to - 1], ids[to - 1]) = (key, id);
    }
    true
}
