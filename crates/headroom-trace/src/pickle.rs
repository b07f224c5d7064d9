//! A streaming reader for the pickle opcodes that memory snapshots use.
//!
//! Snapshots are plain Python data — dicts, lists, tuples, str, int, float,
//! bool, None — pickled with protocol 2 (TorchScript's pickler) to 5
//! (Python 3.14's default). This reader runs exactly that subset of the
//! pickle machine and nothing else: a global, a reduce, a persistent id or
//! any opcode outside the subset is an error naming its byte offset, so
//! reading a file never executes anything it names.
//!
//! It is written here rather than taken from `serde-pickle` for two reasons
//! the figures show: serde-pickle materialises the whole file as a generic
//! value tree (several times the file's size), and it copies memoised
//! objects at every reference, while a snapshot refers to the same stack of
//! frames thousands of times. Here a [`Builder`] turns each container into
//! its own value the moment the container is complete, so the caller can
//! keep compact records instead of a tree, and a memoised object is built
//! once and then shared by [`Clone`].

use std::io::{self, Read};

mod plain_dict;

/// Turns pickled values into the caller's values, bottom-up.
///
/// The scalar constructors (`none` to `float`) may be called more than once
/// for the same bytes (a dict's run of pairs matched, then read again by the
/// general path when the match stops): they must only make the value.
pub trait Builder {
    type Value: Clone;
    fn none(&mut self) -> Self::Value;
    fn bool(&mut self, v: bool) -> Self::Value;
    fn int(&mut self, v: i64) -> Self::Value;
    /// An int in `(i64::MAX, u64::MAX]`: stream handles can be that large.
    fn uint(&mut self, v: u64) -> Self::Value;
    fn float(&mut self, v: f64) -> Self::Value;
    fn str(&mut self, v: &str) -> Self::Value;
    /// A list, complete: nothing is appended to it after this call. Items
    /// come as a slice of the reader's own vector, which it fills again for
    /// the next container.
    fn list(&mut self, items: &[Self::Value]) -> Self::Value;
    fn tuple(&mut self, items: &[Self::Value]) -> Self::Value;
    /// A dict, complete, in insertion order (repeated keys kept; the builder decides).
    fn dict(&mut self, items: &[(Self::Value, Self::Value)]) -> Self::Value;
}

/// Why a pickle could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PickleError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("the file ends at byte {offset}, in the middle of the pickle (truncated?)")]
    Truncated { offset: u64 },
    #[error("byte {offset}: opcode {opcode:#04x}{} is not one that memory snapshots use", name_suffix(*opcode))]
    Opcode { opcode: u8, offset: u64 },
    #[error(
        "byte {offset}: the pickle refers to Python code ({what}); snapshots hold only plain values, and headroom \
         never runs what a file names"
    )]
    Code { what: String, offset: u64 },
    #[error("byte {offset}: {message}")]
    Malformed { offset: u64, message: String },
}

fn name_suffix(op: u8) -> String {
    opcode_name(op).map(|n| format!(" ({n})")).unwrap_or_default()
}

/// Names of the opcodes outside the subset, for messages.
fn opcode_name(op: u8) -> Option<&'static str> {
    Some(match op {
        b'I' => "INT",
        b'L' => "LONG",
        b'S' => "STRING",
        b'T' => "BINSTRING",
        b'U' => "SHORT_BINSTRING",
        b'V' => "UNICODE",
        b'F' => "FLOAT",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        b'b' => "BUILD",
        0x8b => "LONG4",
        b'B' => "BINBYTES",
        b'C' => "SHORT_BINBYTES",
        0x8e => "BINBYTES8",
        0x96 => "BYTEARRAY8",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        0x8f => "EMPTY_SET",
        0x90 => "ADDITEMS",
        0x91 => "FROZENSET",
        b'g' => "GET",
        b'p' => "PUT",
        _ => return None,
    })
}

const READ_CHUNK: usize = 1 << 16;

/// Bytes from a reader, with the absolute offset of each.
struct Input<R> {
    reader: R,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    /// Offset in the file of `buf[0]`.
    base: u64,
}

impl<R: Read> Input<R> {
    fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Makes `n` bytes available at `pos`; false if the file ends first.
    #[inline]
    fn fill(&mut self, n: usize) -> io::Result<bool> {
        if self.end - self.pos >= n {
            return Ok(true);
        }
        self.refill(n)
    }

    #[cold]
    fn refill(&mut self, n: usize) -> io::Result<bool> {
        self.buf.copy_within(self.pos..self.end, 0);
        self.base += self.pos as u64;
        self.end -= self.pos;
        self.pos = 0;
        if self.buf.len() < n.max(READ_CHUNK) {
            self.buf.resize(n.max(READ_CHUNK), 0);
        }
        while self.end < n {
            let got = match self.reader.read(&mut self.buf[self.end..]) {
                Ok(0) => return Ok(false),
                Ok(k) => k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            self.end += got;
        }
        Ok(true)
    }

    #[inline]
    fn take(&mut self, n: usize) -> Result<&[u8], PickleError> {
        if !self.fill(n)? {
            return Err(PickleError::Truncated { offset: self.base + self.end as u64 });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    #[inline]
    fn byte(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, PickleError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Result<u64, PickleError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
}

/// A list or dict still being filled, standing at `pos` on the stack.
struct Open<V> {
    pos: usize,
    /// The memo slot that names it, if any.
    memo: Option<u32>,
    items: Items<V>,
}

enum Items<V> {
    List(Vec<V>),
    Dict(Vec<(V, V)>),
}

/// A memo entry: a finished value, or a container still on the stack.
enum Memo<V> {
    Value(V),
    Building,
}

/// The most memo entries a file may define: far beyond any snapshot (a
/// 100 MB snapshot has about a million), small enough to refuse a file that
/// would make the memo table itself exhaust memory.
const MAX_MEMO: u64 = 1 << 28;

/// How far a memo index may run ahead of the values stored so far. Python's
/// picklers number the memo densely (each put takes the next index), so a
/// real file never skips; the slack only tolerates hand-made ones. Without
/// the bound, a few bytes per put could grow the table by this much each
/// time and reach gigabytes from a kilobyte file: with it, the table holds
/// at most one slot per put plus this many, whatever the indices.
const MEMO_SLACK: u64 = 1 << 20;

/// The longest string read: snapshots hold file names, function names and
/// settings, none near this.
const MAX_STRING: usize = 1 << 26;

/// Reads one pickle from `reader`, building its value with `builder`.
/// Reads no further than the STOP opcode.
pub fn read_pickle<R: Read, B: Builder>(reader: R, builder: &mut B) -> Result<B::Value, PickleError> {
    Machine {
        input: Input { reader, buf: Vec::new(), pos: 0, end: 0, base: 0 },
        stack: Vec::new(),
        marks: Vec::new(),
        open: Vec::new(),
        done: Finisher { memo: Vec::new(), spare_lists: Vec::new(), spare_dicts: Vec::new() },
        puts: 0,
    }
    .run(builder)
}

/// The pickle machine. Its stack holds finished values; a container still
/// being filled is a `None` there, its items kept in [`Machine::open`], and
/// MARKs are heights in [`Machine::marks`]. So the slot pushed by the opcodes
/// that dominate a snapshot (a memo fetch, a small int) is just the value,
/// and closing a MARK needs no search.
///
/// Invariants: `stack[i]` is `None` exactly when `open` holds a container
/// with `pos == i`; `open` is sorted by `pos`; `marks` is non-decreasing and
/// no mark exceeds `stack.len()`.
struct Machine<R, V> {
    input: Input<R>,
    stack: Vec<Option<V>>,
    /// Stack heights at which a MARK stands, innermost last.
    marks: Vec<usize>,
    open: Vec<Open<V>>,
    done: Finisher<V>,
    /// Memo puts so far: the memo table may not run further ahead of them than [`MEMO_SLACK`].
    puts: u64,
}

/// Turns containers into values, and keeps what that needs: the memo, and
/// emptied item vectors to fill again (a large snapshot closes a million
/// small dicts; reusing their vectors saves an allocation and a free each).
struct Finisher<V> {
    memo: Vec<Memo<V>>,
    spare_lists: Vec<Vec<V>>,
    spare_dicts: Vec<Vec<(V, V)>>,
}

/// Spare vectors kept for reuse. CPython's pickler appends list items in
/// batches of 1,000, so up to 1,000 dicts of a trace stand open at once;
/// a few KB each at most.
const SPARES: usize = 1 << 11;

impl<V: Clone> Finisher<V> {
    /// The value of a finished container.
    fn value<B: Builder<Value = V>>(&mut self, open: Open<V>, b: &mut B) -> V {
        let v = match open.items {
            Items::List(items) => {
                let v = b.list(&items);
                self.recycle_list(items);
                v
            }
            Items::Dict(mut items) => {
                let v = b.dict(&items);
                if self.spare_dicts.len() < SPARES {
                    items.clear();
                    self.spare_dicts.push(items);
                }
                v
            }
        };
        if let Some(i) = open.memo {
            self.memo[i as usize] = Memo::Value(v.clone());
        }
        v
    }

    fn recycle_list(&mut self, mut items: Vec<V>) {
        if self.spare_lists.len() < SPARES {
            items.clear();
            self.spare_lists.push(items);
        }
    }

    fn list(&mut self) -> Vec<V> {
        self.spare_lists.pop().unwrap_or_default()
    }

    fn dict(&mut self) -> Vec<(V, V)> {
        self.spare_dicts.pop().unwrap_or_default()
    }
}

impl<R: Read, V: Clone> Machine<R, V> {
    fn malformed<T>(&self, at: u64, message: impl Into<String>) -> Result<T, PickleError> {
        Err(PickleError::Malformed { offset: at, message: message.into() })
    }

    /// Whether the top of the stack is a value (not a MARK, not empty).
    #[inline]
    fn top_is_value(&self) -> bool {
        !self.stack.is_empty() && self.marks.last() != Some(&self.stack.len())
    }

    /// The container on top of the stack, if it is one and no MARK stands above it.
    fn top_open(&mut self) -> Option<&mut Items<V>> {
        if self.top_is_value() && self.stack.last().is_some_and(Option::is_none) {
            self.open.last_mut().map(|o| &mut o.items)
        } else {
            None
        }
    }

    /// The container just below stack height `m`, where the MARK that stood
    /// there was just closed, unless another MARK stands at the same height.
    fn open_below(&self, m: usize) -> Option<&Items<V>> {
        let behind_mark = self.marks.last().is_some_and(|&n| n >= m);
        match self.open.last() {
            Some(o) if !behind_mark && m > 0 && o.pos == m - 1 => Some(&o.items),
            _ => None,
        }
    }

    #[inline]
    fn push(&mut self, v: V) {
        self.stack.push(Some(v));
    }

    fn push_open(&mut self, items: Items<V>) {
        self.open.push(Open { pos: self.stack.len(), memo: None, items });
        self.stack.push(None);
    }

    /// Pops a value, finishing it if it is a container still being filled.
    #[inline]
    fn pop_value<B: Builder<Value = V>>(&mut self, b: &mut B, at: u64) -> Result<V, PickleError> {
        if !self.top_is_value() {
            return if self.stack.is_empty() && self.marks.is_empty() {
                self.malformed(at, "the pickle's stack is empty where a value is needed")
            } else {
                self.malformed(at, "a MARK where a value is needed")
            };
        }
        match self.stack.pop() {
            Some(Some(v)) => Ok(v),
            _ => {
                let open = self.open.pop().expect("a None on the stack is an open container");
                Ok(self.done.value(open, b))
            }
        }
    }

    /// Closes the topmost MARK, finishing the containers above it: the
    /// stack height where it stood, with only values above it.
    #[inline]
    fn close_mark<B: Builder<Value = V>>(&mut self, b: &mut B, at: u64) -> Result<usize, PickleError> {
        let Some(m) = self.marks.pop() else {
            return self.malformed(at, "no MARK to close");
        };
        if self.open.last().is_some_and(|o| o.pos >= m) {
            // In the order they were opened, so records are numbered in file order.
            // From the end: usually one or two containers (an entry's frames list)
            // stand above the mark, below a thousand entries still open.
            let mut first = self.open.len() - 1;
            while first > 0 && self.open[first - 1].pos >= m {
                first -= 1;
            }
            for open in self.open.drain(first..) {
                let pos = open.pos;
                self.stack[pos] = Some(self.done.value(open, b));
            }
        }
        Ok(m)
    }

    /// Pops everything above the topmost MARK, and the MARK, into a vector.
    fn pop_mark<B: Builder<Value = V>>(&mut self, b: &mut B, at: u64) -> Result<Vec<V>, PickleError> {
        let m = self.close_mark(b, at)?;
        let mut items = self.done.list();
        Self::values_above(&mut self.stack, m, &mut items);
        Ok(items)
    }

    /// Moves the key-value pairs above stack height `m` (a MARK just
    /// closed, so only values stand there) into `into`.
    ///
    /// One `extend` of known length (a trace entry's eight pairs, at every
    /// entry): a single capacity check, not one per pair.
    fn pairs_above(stack: &mut Vec<Option<V>>, m: usize, into: &mut Vec<(V, V)>) {
        let value = |v: &Option<V>| v.clone().expect("only values stand above a closed MARK");
        into.extend(stack[m..].chunks_exact(2).map(|pair| (value(&pair[0]), value(&pair[1]))));
        stack.truncate(m);
    }

    /// Moves the values above stack height `m` (a MARK just closed) into `into`.
    fn values_above(stack: &mut Vec<Option<V>>, m: usize, into: &mut Vec<V>) {
        into.extend(stack[m..].iter().flatten().cloned());
        stack.truncate(m);
    }

    fn even_above(&self, m: usize, at: u64) -> Result<(), PickleError> {
        if (self.stack.len() - m).is_multiple_of(2) {
            Ok(())
        } else {
            self.malformed(at, "an odd number of items for a dict")
        }
    }

    fn memo_put(&mut self, index: u64, at: u64) -> Result<(), PickleError> {
        if index >= MAX_MEMO {
            return self.malformed(at, format!("memo index {index} is beyond any snapshot's"));
        }
        if !self.top_is_value() {
            return self.malformed(at, "nothing to memoise");
        }
        let i = index as usize;
        let entry = match self.stack.last() {
            Some(Some(v)) => Memo::Value(v.clone()),
            _ => {
                self.open.last_mut().expect("a None on the stack is an open container").memo = Some(index as u32);
                Memo::Building
            }
        };
        self.puts += 1;
        let memo = &mut self.done.memo;
        if i >= memo.len() {
            if index > self.puts + MEMO_SLACK {
                return self.malformed(
                    at,
                    format!(
                        "memo index {index} after {} memo puts: Python numbers the memo densely, and a table that \
                         sparse would take memory out of proportion to the file",
                        self.puts - 1
                    ),
                );
            }
            if i == memo.len() {
                // Python's picklers number the memo densely: each put is the next slot.
                memo.push(entry);
                return Ok(());
            }
            memo.resize_with(i + 1, || Memo::Building);
        }
        memo[i] = entry;
        Ok(())
    }

    /// The opcode a snapshot runs most (every key, every shared frame): the
    /// finished value is pushed inline, everything else is out of line.
    #[inline(always)]
    fn memo_get<B: Builder<Value = V>>(&mut self, index: u64, b: &mut B, at: u64) -> Result<(), PickleError> {
        if let Some(Memo::Value(v)) = self.done.memo.get(index as usize) {
            let v = v.clone();
            self.push(v);
            return Ok(());
        }
        self.memo_get_slow(index, b, at)
    }

    /// The BINGETs and LONG_BINGETs that follow one: a stack's frames, and
    /// an entry's keys and the values shared with other entries, are runs of
    /// memo fetches. A loop whose branch predicts takes them, rather than
    /// one indirect jump of the dispatch each.
    #[inline(always)]
    fn memo_get_run<B: Builder<Value = V>>(&mut self, b: &mut B) -> Result<(), PickleError> {
        loop {
            let pos = self.input.pos;
            let (index, len) = match self.input.buf.get(pos..self.input.end) {
                Some([b'h', i, ..]) => (*i as u64, 2),
                Some([b'j', a, b2, c, d, ..]) => (u32::from_le_bytes([*a, *b2, *c, *d]) as u64, 5),
                _ => return Ok(()),
            };
            let at = self.input.offset();
            self.input.pos += len;
            self.memo_get(index, b, at)?;
        }
    }

    #[cold]
    #[inline(never)]
    fn memo_get_slow<B: Builder<Value = V>>(&mut self, index: u64, b: &mut B, at: u64) -> Result<(), PickleError> {
        match self.done.memo.get(index as usize) {
            Some(_) => self.finish_in_place(index, b, at),
            None => self.malformed(at, format!("memo {index} was never stored")),
        }
    }

    /// A second reference to a list or dict that is still on the stack. The
    /// pickler writes a container's items right after creating it, so by the
    /// time it is referred to again it is complete; finish it where it
    /// stands. (A container that contains itself then fails at its next
    /// append, with a message: snapshots have no such structures.)
    fn finish_in_place<B: Builder<Value = V>>(&mut self, index: u64, b: &mut B, at: u64) -> Result<(), PickleError> {
        let Some(i) = self.open.iter().rposition(|o| o.memo == Some(index as u32)) else {
            return self.malformed(at, format!("memo {index} was never stored"));
        };
        let open = self.open.remove(i);
        let pos = open.pos;
        let v = self.done.value(open, b);
        self.stack[pos] = Some(v.clone());
        self.push(v);
        Ok(())
    }

    #[allow(
        clippy::too_many_lines,
        reason = "one arm per opcode: the machine's loop reads as the pickle format's table of opcodes"
    )]
    fn run<B: Builder<Value = V>>(mut self, b: &mut B) -> Result<V, PickleError> {
        let first = self.input.fill(2)?;
        match self.input.buf[..self.input.end].first() {
            Some(0x80) if !first => return Err(PickleError::Truncated { offset: self.input.end as u64 }),
            Some(0x80) => {}
            _ => return self.malformed(0, "not a pickle (pickles of protocol 2 and later start with byte 0x80)"),
        }
        loop {
            let at = self.input.offset();
            let op = self.input.byte()?;
            match op {
                0x80 => {
                    let proto = self.input.byte()?;
                    if !(2..=5).contains(&proto) {
                        return self.malformed(at, format!("pickle protocol {proto}; snapshots use 2 to 5"));
                    }
                }
                // FRAME: a length prefix for the bytes that follow; nothing to do when streaming.
                0x95 => {
                    self.input.u64()?;
                }
                b'.' => {
                    let v = self.pop_value(b, at)?;
                    if !self.stack.is_empty() || !self.marks.is_empty() {
                        return self.malformed(at, "values left on the stack at STOP");
                    }
                    return Ok(v);
                }
                b'(' => self.marks.push(self.stack.len()),
                b'0' => {
                    self.pop_value(b, at)?;
                }
                b'1' => {
                    let items = self.pop_mark(b, at)?;
                    self.done.recycle_list(items);
                }
                b'2' => {
                    let v = self.pop_value(b, at)?;
                    self.push(v.clone());
                    self.push(v);
                }
                b'N' => {
                    let v = b.none();
                    self.push(v)
                }
                0x88 | 0x89 => {
                    let v = b.bool(op == 0x88);
                    self.push(v)
                }
                b'J' => {
                    let v = i32::from_le_bytes(self.input.take(4)?.try_into().expect("4 bytes"));
                    let v = b.int(v as i64);
                    self.push(v)
                }
                b'K' => {
                    let v = self.input.byte()?;
                    let v = b.int(v as i64);
                    self.push(v)
                }
                b'M' => {
                    let v = u16::from_le_bytes(self.input.take(2)?.try_into().expect("2 bytes"));
                    let v = b.int(v as i64);
                    self.push(v)
                }
                0x8a => {
                    let n = self.input.byte()? as usize;
                    let bytes = self.input.take(n)?;
                    let v = match long1(bytes) {
                        Some(Long::Signed(v)) => b.int(v),
                        Some(Long::Unsigned(v)) => b.uint(v),
                        None => return self.malformed(at, format!("an integer of {n} bytes, beyond 64 bits")),
                    };
                    self.push(v)
                }
                b'G' => {
                    let v = f64::from_be_bytes(self.input.take(8)?.try_into().expect("8 bytes"));
                    let v = b.float(v);
                    self.push(v)
                }
                0x8c => {
                    let n = self.input.byte()? as usize;
                    self.string(b, n, at)?;
                }
                b'X' => {
                    let n = self.input.u32()? as usize;
                    self.string(b, n, at)?;
                }
                0x8d => {
                    let n = self.input.u64()?;
                    let Ok(n) = usize::try_from(n) else {
                        return self.malformed(at, format!("a string of {n} bytes"));
                    };
                    self.string(b, n, at)?;
                }
                b']' => {
                    let items = self.done.list();
                    self.push_open(Items::List(items));
                }
                b'}' => {
                    if !self.plain_dict(b, at)? {
                        let items = self.done.dict();
                        self.push_open(Items::Dict(items));
                    }
                }
                b')' => {
                    let v = b.tuple(&[]);
                    self.push(v)
                }
                b'l' => {
                    let items = self.pop_mark(b, at)?;
                    self.push_open(Items::List(items));
                }
                b'd' => {
                    let m = self.close_mark(b, at)?;
                    self.even_above(m, at)?;
                    let mut pairs = self.done.dict();
                    Self::pairs_above(&mut self.stack, m, &mut pairs);
                    self.push_open(Items::Dict(pairs));
                }
                b't' => {
                    let items = self.pop_mark(b, at)?;
                    let v = b.tuple(&items);
                    self.done.recycle_list(items);
                    self.push(v)
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    if self.stack.len() < n {
                        return self.malformed(at, "too few values for a tuple");
                    }
                    let mut items = self.done.list();
                    for _ in 0..n {
                        let v = self.pop_value(b, at)?;
                        items.push(v);
                    }
                    items.reverse();
                    let v = b.tuple(&items);
                    self.done.recycle_list(items);
                    self.push(v)
                }
                b'a' => {
                    let v = self.pop_value(b, at)?;
                    match self.top_open() {
                        Some(Items::List(items)) => items.push(v),
                        _ => return self.malformed(at, "APPEND to something that is not a list being built"),
                    }
                }
                b'e' => {
                    let m = self.close_mark(b, at)?;
                    if !matches!(self.open_below(m), Some(Items::List(_))) {
                        return self.malformed(at, "APPENDS to something that is not a list being built");
                    }
                    if let Some(Items::List(items)) = self.open.last_mut().map(|o| &mut o.items) {
                        Self::values_above(&mut self.stack, m, items);
                    }
                }
                b's' => {
                    let v = self.pop_value(b, at)?;
                    let k = self.pop_value(b, at)?;
                    match self.top_open() {
                        Some(Items::Dict(items)) => items.push((k, v)),
                        _ => return self.malformed(at, "SETITEM on something that is not a dict being built"),
                    }
                }
                b'u' => {
                    let m = self.close_mark(b, at)?;
                    if !matches!(self.open_below(m), Some(Items::Dict(_))) {
                        return self.malformed(at, "SETITEMS on something that is not a dict being built");
                    }
                    self.even_above(m, at)?;
                    if let Some(Items::Dict(items)) = self.open.last_mut().map(|o| &mut o.items) {
                        Self::pairs_above(&mut self.stack, m, items);
                    }
                }
                0x94 => {
                    let i = self.done.memo.len() as u64;
                    self.memo_put(i, at)?;
                }
                b'q' => {
                    let i = self.input.byte()? as u64;
                    self.memo_put(i, at)?;
                }
                b'r' => {
                    let i = self.input.u32()? as u64;
                    self.memo_put(i, at)?;
                }
                b'h' => {
                    let i = self.input.byte()? as u64;
                    self.memo_get(i, b, at)?;
                    self.memo_get_run(b)?;
                }
                b'j' => {
                    let i = self.input.u32()? as u64;
                    self.memo_get(i, b, at)?;
                    self.memo_get_run(b)?;
                }
                b'c' | 0x93 | b'R' | 0x81 | 0x92 | b'i' | b'o' | 0x82..=0x84 => {
                    let what = match op {
                        b'c' | 0x93 => "a global",
                        b'R' => "a call (REDUCE)",
                        0x81 | 0x92 => "an object constructor (NEWOBJ)",
                        b'i' | b'o' => "an instance (INST/OBJ)",
                        _ => "an extension-registry global (EXT)",
                    };
                    return Err(PickleError::Code { what: what.into(), offset: at });
                }
                _ => return Err(PickleError::Opcode { opcode: op, offset: at }),
            }
        }
    }

    fn string<B: Builder<Value = V>>(&mut self, b: &mut B, n: usize, at: u64) -> Result<(), PickleError> {
        // The buffer grows to hold a string whole: refuse a length no snapshot
        // has before allocating it (a corrupt length would ask for exabytes).
        if n > MAX_STRING {
            return self.malformed(at, format!("a string of {n} bytes, longer than any a snapshot holds"));
        }
        let bytes = self.input.take(n)?;
        let v = match std::str::from_utf8(bytes) {
            Ok(s) => b.str(s),
            Err(e) => return self.malformed(at, format!("a string that is not UTF-8 ({e})")),
        };
        self.push(v);
        Ok(())
    }
}

enum Long {
    Signed(i64),
    Unsigned(u64),
}

/// LONG1's little-endian two's complement, when it fits in 64 bits (or is
/// a non-negative value below 2^64).
fn long1(bytes: &[u8]) -> Option<Long> {
    let Some(&last) = bytes.last() else {
        return Some(Long::Signed(0));
    };
    let negative = last & 0x80 != 0;
    // A ninth byte of zero only carries the sign of a value in [2^63, 2^64).
    let bytes = match bytes {
        [head @ .., 0] if bytes.len() == 9 && !negative => head,
        _ => bytes,
    };
    if bytes.len() > 8 {
        return None;
    }
    // Shifted in byte by byte: no copy through memory to stall the load.
    let mut u = 0u64;
    for (i, &b) in bytes.iter().enumerate() {
        u |= (b as u64) << (8 * i);
    }
    if negative && bytes.len() < 8 {
        u |= u64::MAX << (8 * bytes.len());
    }
    if bytes.len() == 8 && !negative && u > i64::MAX as u64 {
        return Some(Long::Unsigned(u));
    }
    Some(Long::Signed(u as i64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long1_covers_the_64_bit_range() {
        let v = |b: &[u8]| match long1(b) {
            Some(Long::Signed(v)) => Some(v as i128),
            Some(Long::Unsigned(v)) => Some(v as i128),
            None => None,
        };
        assert_eq!(v(&[]), Some(0));
        assert_eq!(v(&[0xff]), Some(-1));
        assert_eq!(v(&[0x00, 0x80]), Some(-32768));
        assert_eq!(v(&[0x00, 0x80, 0x00]), Some(32768));
        assert_eq!(v(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]), Some(i64::MAX as i128));
        assert_eq!(v(&[0, 0, 0, 0, 0, 0, 0, 0x80]), Some(i64::MIN as i128));
        assert_eq!(v(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0]), Some(1i128 << 63));
        assert_eq!(v(&[0, 0, 0, 0, 0, 0, 0, 0, 1]), None);
    }
}
