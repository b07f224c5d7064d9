//! A dict of plain values read in one pass.
//!
//! Nearly every dict in a snapshot is one run of opcodes: an EMPTY_DICT, its
//! memo put, a MARK, key-value pairs that are each a memo fetch or a small
//! number, and a SETITEMS (a trace entry's eight pairs, a frame's three). The
//! general machine takes ~25 trips through its dispatch for such a run,
//! pushing each value on its stack and moving the pairs off it again at the
//! SETITEMS. Here the run is matched against the bytes already buffered and
//! the pairs go straight into the dict's item vector.
//!
//! It leaves the machine exactly where the general path would: the same open
//! dict with the same pairs, the same memo slot (filled by the same
//! [`Machine::memo_put`], so its errors are the same), and the builder called
//! for the same values in the same order. Anything else in the run (a string
//! read for the first time, a nested container, a fetch of a memo slot not
//! finished, a FRAME, an odd count, the end of the buffer) stops the match
//! before anything is changed, and the general path reads the run instead.

use super::{long1, Builder, Items, Long, Machine, Memo, PickleError, MAX_MEMO};
use std::io::Read;

impl<R: Read, V: Clone> Machine<R, V> {
    /// Reads the dict whose EMPTY_DICT was just taken, at `at`, if its
    /// opcodes are a run of plain pairs; false (nothing read) otherwise.
    #[inline]
    pub(super) fn plain_dict<B: Builder<Value = V>>(&mut self, b: &mut B, at: u64) -> Result<bool, PickleError> {
        let start = self.input.pos;
        let buf = &self.input.buf[start..self.input.end];
        let next = self.done.memo.len() as u64;
        // Only a put at the next slot, as every Python pickler writes: a memo
        // fetch in the pairs can then never name the dict itself.
        let mut i = match *buf {
            [0x94, b'(', ..] => 2,
            [b'q', x, b'(', ..] if x as u64 == next => 3,
            [b'r', x0, x1, x2, x3, b'(', ..] if u32::from_le_bytes([x0, x1, x2, x3]) as u64 == next => 6,
            _ => return Ok(false),
        };
        let mut items = self.done.dict();
        let memo = &self.done.memo;
        let closed = loop {
            if buf.get(i) == Some(&b'u') {
                break true;
            }
            let Some(k) = plain_value(buf, &mut i, memo, b) else { break false };
            let Some(v) = plain_value(buf, &mut i, memo, b) else { break false };
            items.push((k, v));
        };
        if !closed {
            items.clear();
            self.done.spare_dicts.push(items);
            return Ok(false);
        }
        self.input.pos = start + i + 1;
        self.push_open(Items::Dict(items));
        if next < MAX_MEMO {
            // What `memo_put` does for a put at the next slot, whose checks
            // then cannot fail: the table grows by one with each put, so it
            // never runs further ahead of the puts than it did.
            self.open.last_mut().expect("just opened").memo = Some(next as u32);
            self.puts += 1;
            self.done.memo.push(Memo::Building);
        } else {
            // The put's own offset, for its error: right after the EMPTY_DICT.
            self.memo_put(next, at + 1)?;
        }
        Ok(true)
    }
}

/// One value that needs nothing but its own bytes and the memo: a memo
/// fetch of a finished value, an int, a float, a bool or None. Advances `i`
/// past it; None, with `i` where it was, for anything else.
#[inline(always)]
fn plain_value<V: Clone, B: Builder<Value = V>>(buf: &[u8], i: &mut usize, memo: &[Memo<V>], b: &mut B) -> Option<V> {
    let fetch = |index: usize| match memo.get(index) {
        Some(Memo::Value(v)) => Some(v.clone()),
        _ => None,
    };
    let (v, n) = match *buf.get(*i..)? {
        [b'h', x, ..] => (fetch(x as usize)?, 2),
        [b'j', x0, x1, x2, x3, ..] => (fetch(u32::from_le_bytes([x0, x1, x2, x3]) as usize)?, 5),
        [b'K', x, ..] => (b.int(x as i64), 2),
        [b'M', x0, x1, ..] => (b.int(u16::from_le_bytes([x0, x1]) as i64), 3),
        [b'J', x0, x1, x2, x3, ..] => (b.int(i32::from_le_bytes([x0, x1, x2, x3]) as i64), 5),
        // LONG1 of 1 to 8 bytes with 8 bytes buffered (an address, a time):
        // one load, masked and sign-extended, where `long1` shifts in a byte
        // at a time. Always in i64's range: 8 bytes with the sign bit clear
        // are at most i64::MAX.
        [0x8a, n @ 1..=8, x0, x1, x2, x3, x4, x5, x6, x7, ..] => {
            let bits = 8 * n as u32;
            let mut u = u64::from_le_bytes([x0, x1, x2, x3, x4, x5, x6, x7]) & (u64::MAX >> (64 - bits));
            if n < 8 && u >> (bits - 1) != 0 {
                u |= u64::MAX << bits;
            }
            (b.int(u as i64), 2 + n as usize)
        }
        [0x8a, n, ref rest @ ..] => {
            let bytes = rest.get(..n as usize)?;
            let v = match long1(bytes)? {
                Long::Signed(v) => b.int(v),
                Long::Unsigned(v) => b.uint(v),
            };
            (v, 2 + n as usize)
        }
        [b'G', x0, x1, x2, x3, x4, x5, x6, x7, ..] => {
            (b.float(f64::from_be_bytes([x0, x1, x2, x3, x4, x5, x6, x7])), 9)
        }
        [b'N', ..] => (b.none(), 1),
        [op @ (0x88 | 0x89), ..] => (b.bool(op == 0x88), 1),
        _ => return None,
    };
    *i += n;
    Some(v)
}
