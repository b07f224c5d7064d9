//! `Classes`: a stream's free set once it holds many blocks, split by size
//! class, each class a sorted vector (or, past `SMALL_MAX` entries, sorted
//! runs) of its own.
//!
//! Why classes: in one sorted order of (size, address), a block that grows by
//! absorbing a neighbour, or shrinks as its front is handed out, moves far
//! (under expandable segments a merged block grows past most of its
//! neighbours), and every entry between its two places moves with it; the
//! best fit searches the whole set. Classes are ordered as sizes are, so the
//! set's order is the classes' in turn: a block moves only within its class or
//! to another one, a search is of one class, and the next class that holds
//! anything is found by a bitmap. The set holds exactly the entries it did
//! and answers in the same order: PyTorch's `BlockComparatorSize`.

use super::gapped::Gapped;
use super::{pack, Runs, Sorted, Take, SMALL_MAX, SMALL_MIN};

/// Sizes below `1 << (GRAIN_BITS + SUB_BITS)` (32 KiB) are classed by 512 bytes, larger
/// ones by 64 classes an octave (a class of the 8–16 MiB octave spans 128 KiB).
const GRAIN_BITS: u32 = 9;
const SUB_BITS: u32 = 6;
const LINEAR: u64 = 1 << (GRAIN_BITS + SUB_BITS);
/// Every u64 size has a class: 64 linear ones, then 64 for each octave from 2^15 to 2^63.
const CLASSES: usize = (1 << SUB_BITS) * (64 - (GRAIN_BITS + SUB_BITS) as usize + 1);
const WORDS: usize = CLASSES.div_ceil(64);
const _: () = assert!(WORDS <= 64, "the summary word covers every word of the bitmap");

/// The class of a packed key: monotone in the key's size.
#[inline]
fn class_of(key: u128) -> usize {
    let size = (key >> 64) as u64;
    if size < LINEAR {
        return (size >> GRAIN_BITS) as usize;
    }
    let octave = 63 - size.leading_zeros();
    let sub = (size >> (octave - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    (((octave - (GRAIN_BITS + SUB_BITS) + 1) << SUB_BITS) as u64 + sub) as usize
}

/// A place in a class: (run, position), the run 0 in a sorted vector.
type Pos = (usize, usize);

/// One class's entries. An empty class is always a sorted vector (runs go back to one
/// below `SMALL_MIN` entries): [`Classes::put`] pushes onto it without looking.
///
/// Aligned to 64 bytes, one cache line a class: its 64 bytes aligned to 8 could span two
/// lines each, and a best fit, a free and a replace each read a class or two of the 3,200
/// picked by size, in no order (docs/PERFORMANCE.md, "Replay passes, twenty-fourth round").
/// A class of one holds its entry inline ([`Gapped`]), so that this line is all a best fit
/// or a free of it reads ("Replay passes, twenty-fifth round").
#[derive(Clone, Debug)]
#[repr(align(64))]
enum Bucket {
    Small(Gapped),
    Runs(Runs),
}

impl Default for Bucket {
    fn default() -> Self {
        Bucket::Small(Gapped::default())
    }
}

impl Bucket {
    #[inline]
    fn len(&self) -> usize {
        match self {
            Bucket::Small(v) => v.len(),
            Bucket::Runs(m) => m.len,
        }
    }

    /// The place of the first key at least `key`, if any.
    #[inline]
    fn lower(&self, key: u128) -> Option<Pos> {
        match self {
            Bucket::Small(v) => {
                let at = v.lower_bound(key);
                (at < v.len()).then_some((0, at))
            }
            Bucket::Runs(m) => {
                let r = m.run_at_least(key);
                Some((r, m.runs.get(r)?.lower_bound(key)))
            }
        }
    }

    #[inline]
    fn at(&self, (r, at): Pos) -> (u128, u32) {
        match self {
            Bucket::Small(v) => v.at(at),
            Bucket::Runs(m) => m.runs[r].at(at),
        }
    }

    #[inline]
    fn id_at(&self, (r, at): Pos) -> u32 {
        match self {
            Bucket::Small(v) => v.id_at(at),
            Bucket::Runs(m) => m.runs[r].ids[at],
        }
    }

    /// The place after `(r, at)` in this class, if any.
    #[inline]
    fn next_pos(&self, (r, at): Pos) -> Option<Pos> {
        match self {
            Bucket::Small(v) => (at + 1 < v.len()).then_some((0, at + 1)),
            Bucket::Runs(m) if at + 1 < m.runs[r].len() => Some((r, at + 1)),
            Bucket::Runs(m) => (r + 1 < m.runs.len()).then_some((r + 1, 0)),
        }
    }

    fn last_below(&self, key: u128) -> Option<(u128, u32)> {
        match self {
            Bucket::Small(v) => v.lower_bound(key).checked_sub(1).map(|i| v.at(i)),
            Bucket::Runs(m) => m.last_below(key),
        }
    }

    fn last(&self) -> Option<(u128, u32)> {
        self.last_below(u128::MAX).or_else(|| self.lower(u128::MAX).map(|p| self.at(p)))
    }

    /// Inserts; false if the key was already present.
    #[inline(always)]
    fn insert(&mut self, key: u128, id: u32) -> bool {
        // A push onto a sorted vector (most inserts: a class mostly holds none or one block)
        // inlined where the class is found; the rest a call (the compiler made the whole of
        // it one, so that every push paid a call).
        if let Bucket::Small(v) = self {
            if v.len() < SMALL_MAX && v.last_key().is_none_or(|last| last < key) {
                v.push(key, id);
                return true;
            }
        }
        self.insert_within(key, id)
    }

    /// [`Bucket::insert`] past its inlined push.
    fn insert_within(&mut self, key: u128, id: u32) -> bool {
        match self {
            Bucket::Small(v) => {
                let inserted = v.insert(key, id);
                if v.len() > SMALL_MAX {
                    *self = Bucket::Runs(Runs::from_sorted(std::mem::take(v).into_sorted()));
                }
                inserted
            }
            Bucket::Runs(m) => m.insert(key, id),
        }
    }

    /// Back to a sorted vector once runs hold few entries.
    #[inline]
    fn settle(&mut self) {
        if let Bucket::Runs(m) = self {
            if m.len < SMALL_MIN {
                *self = Bucket::Small(std::mem::take(m).into_sorted().into());
            }
        }
    }

    #[inline]
    fn remove(&mut self, key: u128) -> Option<u32> {
        match self {
            // A sorted vector never needs settling.
            Bucket::Small(v) => v.remove(key),
            Bucket::Runs(m) => {
                let removed = m.remove(key);
                self.settle();
                removed
            }
        }
    }

    #[inline]
    fn remove_at(&mut self, (r, at): Pos) {
        match self {
            Bucket::Small(v) => {
                v.remove_at(at);
            }
            Bucket::Runs(m) => {
                m.remove_at(r, at);
            }
        }
        self.settle();
    }

    /// As [`Runs::replace`]: `old` by `key` (both of this class) with `id`.
    #[inline]
    fn replace(&mut self, old: u128, key: u128, id: u32) -> Option<bool> {
        let inserted = match self {
            Bucket::Small(v) => {
                let at = v.find(old)?;
                v.replace_at(at, key, id)
            }
            Bucket::Runs(m) => m.replace(old, key, id)?,
        };
        self.settle();
        Some(inserted)
    }

    /// The entry at `pos` takes the smaller key `new` (of this class, absent).
    #[inline]
    fn shrink_at(&mut self, (r, at): Pos, new: u128, id: u32) {
        match self {
            Bucket::Small(v) => {
                let shrunk = v.replace_at(at, new, id);
                debug_assert!(shrunk, "a remainder's key is absent");
            }
            Bucket::Runs(m) => m.shrink_at(r, at, new, id),
        }
    }

    fn iter_from(&self, key: u128) -> Box<dyn Iterator<Item = (u128, u32)> + '_> {
        match self {
            Bucket::Small(v) => Box::new(v.iter_from(v.lower_bound(key))),
            Bucket::Runs(m) => Box::new(m.starting_at(key)),
        }
    }
}

const _: () = assert!(std::mem::size_of::<Bucket>() == 64);

/// See the module documentation.
#[derive(Clone, Debug)]
pub(super) struct Classes {
    buckets: Vec<Bucket>,
    /// Bit `c` set: class `c` holds an entry.
    words: [u64; WORDS],
    /// Bit `w` set: `words[w]` is not zero.
    summary: u64,
    len: usize,
}

impl Classes {
    pub(super) fn from_sorted(v: Sorted) -> Self {
        let mut c = Classes { buckets: vec![Bucket::default(); CLASSES], words: [0; WORDS], summary: 0, len: 0 };
        for (k, id) in v.iter() {
            c.insert(k, id);
        }
        c
    }

    pub(super) fn to_sorted(&self) -> Sorted {
        let mut out = Sorted { keys: Vec::with_capacity(self.len), ids: Vec::with_capacity(self.len) };
        for (k, id) in self.iter() {
            out.keys.push(k);
            out.ids.push(id);
        }
        out
    }

    #[inline]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn mark(&mut self, c: usize) {
        self.words[c / 64] |= 1 << (c % 64);
        self.summary |= 1 << (c / 64);
    }

    /// Clears class `c`'s bit if it holds nothing now.
    #[inline]
    fn unmark_if_empty(&mut self, c: usize) {
        if self.buckets[c].len() == 0 {
            self.unmark(c);
        }
    }

    /// Clears class `c`'s bit: it holds nothing now.
    #[inline(always)]
    fn unmark(&mut self, c: usize) {
        debug_assert_eq!(self.buckets[c].len(), 0, "class {c} is left empty");
        self.words[c / 64] &= !(1 << (c % 64));
        if self.words[c / 64] == 0 {
            self.summary &= !(1 << (c / 64));
        }
    }

    /// Inserts into class `c`, the key's; false if the key was already present. A class
    /// its bit says is empty (most classes a block moves to) takes the key with no
    /// comparison: an empty class is a sorted vector, and takes its one entry inline.
    #[inline(always)]
    fn put(&mut self, c: usize, key: u128, id: u32) -> bool {
        debug_assert_eq!(c, class_of(key));
        if !self.holds(c) {
            debug_assert!(matches!(self.buckets[c], Bucket::Small(_)), "an empty class is a sorted vector");
            if let Bucket::Small(v) = &mut self.buckets[c] {
                v.push_into_empty(key, id);
                self.mark(c);
                return true;
            }
        }
        self.buckets[c].insert(key, id)
    }

    /// Removes `key` from class `c`, the key's; clears its bit where that leaves it empty.
    /// A class of one (most classes a block leaves) is emptied with no search, and its
    /// bit cleared without looking at it again.
    #[inline(always)]
    fn take_out(&mut self, c: usize, key: u128) -> Option<u32> {
        debug_assert_eq!(c, class_of(key));
        if let Bucket::Small(v) = &mut self.buckets[c] {
            if v.len() == 1 {
                let (first, id) = v.at(0);
                if first != key {
                    return None;
                }
                v.clear();
                self.unmark(c);
                return Some(id);
            }
        }
        let removed = self.buckets[c].remove(key)?;
        self.unmark_if_empty(c);
        Some(removed)
    }

    /// Removes the entry at `pos` of class `c`, as [`Self::take_out`] its key.
    #[inline(always)]
    fn take_out_at(&mut self, c: usize, pos: Pos) {
        if let Bucket::Small(v) = &mut self.buckets[c] {
            if v.len() == 1 {
                debug_assert_eq!(pos, (0, 0));
                v.clear();
                self.unmark(c);
                return;
            }
        }
        self.buckets[c].remove_at(pos);
        self.unmark_if_empty(c);
    }

    /// The first class after `c` that holds an entry.
    #[inline]
    fn next_class(&self, c: usize) -> Option<usize> {
        let c = c + 1;
        if c >= CLASSES {
            return None;
        }
        let (w, bit) = (c / 64, c % 64);
        let m = self.words[w] & (!0u64 << bit);
        if m != 0 {
            return Some(w * 64 + m.trailing_zeros() as usize);
        }
        let s = if w + 1 >= 64 { 0 } else { self.summary & (!0u64 << (w + 1)) };
        if s == 0 {
            return None;
        }
        let w = s.trailing_zeros() as usize;
        Some(w * 64 + self.words[w].trailing_zeros() as usize)
    }

    /// The last class before `c` that holds an entry.
    fn prev_class(&self, c: usize) -> Option<usize> {
        let c = c.checked_sub(1)?;
        let (w, bit) = (c / 64, c % 64);
        let m = self.words[w] & (!0u64 >> (63 - bit));
        if m != 0 {
            return Some(w * 64 + 63 - m.leading_zeros() as usize);
        }
        let s = self.summary & ((1u64 << w) - 1);
        if s == 0 {
            return None;
        }
        let w = 63 - s.leading_zeros() as usize;
        Some(w * 64 + 63 - self.words[w].leading_zeros() as usize)
    }

    /// The classes from `c` on that hold an entry, in order.
    fn classes_from(&self, c: usize) -> impl Iterator<Item = usize> + '_ {
        let first = if c < CLASSES && self.buckets[c].len() > 0 { Some(c) } else { self.next_class(c) };
        std::iter::successors(first, |&c| self.next_class(c))
    }

    /// Inserts; false if the key was already present.
    #[inline]
    pub(super) fn insert(&mut self, key: u128, id: u32) -> bool {
        let inserted = self.put(class_of(key), key, id);
        self.len += usize::from(inserted);
        inserted
    }

    #[inline]
    pub(super) fn remove(&mut self, key: u128) -> Option<u32> {
        let removed = self.take_out(class_of(key), key)?;
        self.len -= 1;
        Some(removed)
    }

    /// Replaces `old` by `key` with `id`: within its class where both are of one.
    /// None if `old` is absent; false if `key` is present (and `old` is gone).
    /// Across classes, the two buckets' remove and insert with the classes already
    /// known: a merged block leaves its class at about every other free, and finding
    /// both classes again cost about an eighth of the move (docs/PERFORMANCE.md, "Replay
    /// passes, fifteenth round").
    #[inline]
    pub(super) fn replace(&mut self, old: u128, key: u128, id: u32) -> Option<bool> {
        let (from, to) = (class_of(old), class_of(key));
        if from == to {
            let inserted = self.buckets[from].replace(old, key, id)?;
            self.len -= usize::from(!inserted);
            return Some(inserted);
        }
        // Most moves leave a class of one and go to an empty class (docs/PERFORMANCE.md,
        // "Replay passes, eighteenth round"): both told so by the bitmap and the length.
        self.take_out(from, old)?;
        let inserted = self.put(to, key, id);
        self.len -= usize::from(!inserted);
        Some(inserted)
    }

    #[inline]
    pub(super) fn first_at_least(&self, key: u128) -> Option<(u128, u32)> {
        let (c, p) = self.first_place(key)?;
        Some(self.buckets[c].at(p))
    }

    /// Whether class `c` holds an entry, by its bit.
    #[inline(always)]
    fn holds(&self, c: usize) -> bool {
        let held = self.words[c / 64] & (1 << (c % 64)) != 0;
        debug_assert_eq!(held, self.buckets[c].len() > 0, "class {c}'s bit follows its entries");
        held
    }

    /// The class and place of the first entry at least `key`. The request's own class
    /// is searched only when its bit says it holds anything: most best fits find it
    /// empty and take the next class's first entry (docs/PERFORMANCE.md, "Replay passes,
    /// sixteenth round"), and the search of an empty bucket cost more than the bit.
    /// Inlined into the best fit: as a call of its own it cost more than it saved.
    #[inline(always)]
    fn first_place(&self, key: u128) -> Option<(usize, Pos)> {
        let c = class_of(key);
        if self.holds(c) {
            if let Some(p) = self.buckets[c].lower(key) {
                return Some((c, p));
            }
        }
        let n = self.next_class(c)?;
        debug_assert!(self.buckets[n].len() > 0, "the next class holds an entry");
        Some((n, (0, 0)))
    }

    pub(super) fn last_below(&self, key: u128) -> Option<(u128, u32)> {
        let c = class_of(key);
        if let Some(e) = self.buckets[c].last_below(key) {
            return Some(e);
        }
        self.buckets[self.prev_class(c)?].last()
    }

    /// As [`super::FreeSet::take_walking_if`], over the classes: the search finds the
    /// first place, the walk steps along its class and into the next that holds any.
    #[inline]
    pub(super) fn take_walking_if(
        &mut self,
        key: u128,
        walks: impl Fn(u32) -> bool,
        mut further: impl FnMut(u32, u32) -> bool,
        take: impl FnOnce(u128, u32) -> Take,
    ) -> Option<((u128, u32), Take)> {
        let (mut c, mut pos) = self.first_place(key)?;
        // The next entry is looked for only where the walk may pass this one: an ordinary
        // block never is, and the search of the next class cost more than the question.
        while walks(self.buckets[c].id_at(pos)) {
            let next = match self.buckets[c].next_pos(pos) {
                Some(p) => (c, p),
                None => match self.next_class(c) {
                    Some(n) => (n, (0, 0)),
                    None => break,
                },
            };
            if !further(self.buckets[c].id_at(pos), self.buckets[next.0].id_at(next.1)) {
                break;
            }
            (c, pos) = next;
        }
        let (k, id) = self.buckets[c].at(pos);
        let t = take(k, id);
        match t {
            Take::Leave => return None,
            Take::Remove => {
                self.take_out_at(c, pos);
                self.len -= 1;
            }
            Take::Shrink { size, ptr } => {
                let new = pack(size, ptr);
                debug_assert!(new < k, "a remainder sorts before its block");
                let to = class_of(new);
                if to == c {
                    self.buckets[c].shrink_at(pos, new, id);
                } else {
                    self.take_out_at(c, pos);
                    let inserted = self.put(to, new, id);
                    debug_assert!(inserted, "a remainder's key is absent");
                }
            }
        }
        Some(((k, id), t))
    }

    /// The entries from the first at least `key` on, in order.
    pub(super) fn starting_at(&self, key: u128) -> impl Iterator<Item = (u128, u32)> + '_ {
        let c = class_of(key);
        self.classes_from(c).flat_map(move |n| self.buckets[n].iter_from(if n == c { key } else { 0 }))
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (u128, u32)> + '_ {
        self.starting_at(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_follow_sizes() {
        let sizes = [0, 1, 511, 512, 32767, 32768, 33280, 65535, 65536, 8 << 20, (16 << 20) - 1, 1 << 40, u64::MAX];
        let classes: Vec<usize> = sizes.iter().map(|&s| class_of(pack(s, 0))).collect();
        assert!(classes.windows(2).all(|w| w[0] <= w[1]), "{classes:?}");
        assert_eq!((classes[0], classes[2], classes[3]), (0, 0, 1));
        assert_eq!((classes[4], classes[5], classes[6]), (63, 64, 65), "linear up to 32 KiB, then by octave");
        assert_eq!(*classes.last().unwrap(), CLASSES - 1);
        // A class of the 8–16 MiB octave spans 128 KiB.
        assert_eq!(class_of(pack((8 << 20) + (128 << 10) - 1, 0)), classes[9]);
        assert_eq!(class_of(pack((8 << 20) + (128 << 10), 0)), classes[9] + 1);
    }
}
