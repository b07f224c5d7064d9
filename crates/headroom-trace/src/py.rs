//! Python values — the plain containers a PyTorch snapshot is made of — and
//! their two encodings: pickle protocol 4 and JSON.
//!
//! headroom writes its own pickler instead of using serde-pickle because
//! serde-pickle writes only protocols 2 and 3 and cannot emit tuples from a
//! map; PyTorch's viewer reads protocols 2–4 and snapshots carry tuples.
//! The writer uses only opcodes the viewer's JavaScript unpickler supports.

use rustc_hash::FxHashMap;
use std::io::{self, Write};

/// A Python value.
#[derive(Clone, Debug, PartialEq)]
pub enum Py {
    None,
    Bool(bool),
    Int(i64),
    /// An int above `i64::MAX` (a stream handle, say); Python's ints have no width.
    UInt(u64),
    Float(f64),
    Str(String),
    List(Vec<Py>),
    Tuple(Vec<Py>),
    /// Insertion-ordered, like a Python dict.
    Dict(Vec<(Py, Py)>),
}

impl Py {
    /// A dict with string keys, in the given order.
    pub fn dict<K: Into<String>>(items: impl IntoIterator<Item = (K, Py)>) -> Py {
        Py::Dict(items.into_iter().map(|(k, v)| (Py::Str(k.into()), v)).collect())
    }

    /// An int from an unsigned value, exact at any size.
    pub fn uint(v: u64) -> Py {
        i64::try_from(v).map_or(Py::UInt(v), Py::Int)
    }

    /// A str.
    pub fn str(s: impl Into<String>) -> Py {
        Py::Str(s.into())
    }
}

const PROTO: u8 = 0x80;
const STOP: u8 = b'.';
const NONE: u8 = b'N';
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const BININT: u8 = b'J';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const LONG1: u8 = 0x8a;
const BINFLOAT: u8 = b'G';
const SHORT_BINUNICODE: u8 = 0x8c;
const BINUNICODE: u8 = b'X';
const EMPTY_LIST: u8 = b']';
const EMPTY_DICT: u8 = b'}';
const EMPTY_TUPLE: u8 = b')';
const MARK: u8 = b'(';
const APPENDS: u8 = b'e';
const SETITEMS: u8 = b'u';
const TUPLE: u8 = b't';
const TUPLE1: u8 = 0x85;
const TUPLE2: u8 = 0x86;
const TUPLE3: u8 = 0x87;
const MEMOIZE: u8 = 0x94;
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';

/// Items per APPENDS/SETITEMS batch, as CPython's pickler batches them.
const BATCH: usize = 1000;

/// Strings already written, by memo slot. A snapshot names the same few
/// keys, actions and file names in every record; written once and then
/// fetched from the memo, as CPython's pickler does, they take 2–5 bytes
/// each instead of their length, and readers intern them once.
#[derive(Default)]
struct StrMemo {
    slots: FxHashMap<Box<str>, u32>,
}

/// Strings longer than this are written out each time (snapshots repeat short ones).
const MEMO_MAX_LEN: usize = 256;
/// The most strings memoised; later ones are written out each time.
const MEMO_MAX_STRINGS: usize = 1 << 16;

impl StrMemo {
    fn write<W: Write>(&mut self, s: &str, w: &mut W) -> io::Result<()> {
        if let Some(&slot) = self.slots.get(s) {
            return match u8::try_from(slot) {
                Ok(small) => w.write_all(&[BINGET, small]),
                Err(_) => {
                    w.write_all(&[LONG_BINGET])?;
                    w.write_all(&slot.to_le_bytes())
                }
            };
        }
        let b = s.as_bytes();
        if b.len() < 256 {
            w.write_all(&[SHORT_BINUNICODE, b.len() as u8])?;
        } else {
            w.write_all(&[BINUNICODE])?;
            w.write_all(&(b.len() as u32).to_le_bytes())?;
        }
        w.write_all(b)?;
        if b.len() <= MEMO_MAX_LEN && self.slots.len() < MEMO_MAX_STRINGS {
            self.slots.insert(s.into(), self.slots.len() as u32);
            w.write_all(&[MEMOIZE])?;
        }
        Ok(())
    }
}

/// Writes `value` as a protocol-4 pickle (no framing; strings memoised).
pub fn write_pickle<W: Write>(value: &Py, out: &mut W) -> io::Result<()> {
    let mut w = io::BufWriter::new(out);
    w.write_all(&[PROTO, 4])?;
    pickle_value(value, &mut w, &mut StrMemo::default())?;
    w.write_all(&[STOP])?;
    w.flush()
}

/// A pickle written piece by piece, for values too large to build as one
/// [`Py`] first (a snapshot's trace of millions of entries): the caller opens
/// dicts and lists, writes keys and values into them, and closes them.
pub struct Pickler<W: Write> {
    w: W,
    /// Per open container: whether it is a dict, and the items written since its last MARK.
    open: Vec<(bool, usize)>,
    memo: StrMemo,
}

impl<W: Write> Pickler<W> {
    /// Starts a protocol-4 pickle.
    pub fn new(mut w: W) -> io::Result<Self> {
        w.write_all(&[PROTO, 4])?;
        Ok(Pickler { w, open: Vec::new(), memo: StrMemo::default() })
    }

    /// Opens a dict; give it alternately keys and values, then [`Pickler::end`].
    pub fn begin_dict(&mut self) -> io::Result<()> {
        self.begin(true, EMPTY_DICT)
    }

    /// Opens a list; give it values, then [`Pickler::end`].
    pub fn begin_list(&mut self) -> io::Result<()> {
        self.begin(false, EMPTY_LIST)
    }

    fn begin(&mut self, dict: bool, op: u8) -> io::Result<()> {
        self.item()?;
        self.w.write_all(&[op, MARK])?;
        self.open.push((dict, 0));
        Ok(())
    }

    /// Writes a value (or a dict key) into the innermost open container.
    pub fn value(&mut self, v: &Py) -> io::Result<()> {
        self.item()?;
        pickle_value(v, &mut self.w, &mut self.memo)
    }

    /// Closes the innermost container.
    pub fn end(&mut self) -> io::Result<()> {
        match self.open.pop() {
            Some((dict, _)) => self.w.write_all(&[if dict { SETITEMS } else { APPENDS }]),
            None => Err(io::Error::other("Pickler::end without an open container")),
        }
    }

    /// Ends the pickle and returns the writer.
    pub fn finish(mut self) -> io::Result<W> {
        if !self.open.is_empty() {
            return Err(io::Error::other("Pickler::finish with a container still open"));
        }
        self.w.write_all(&[STOP])?;
        self.w.flush()?;
        Ok(self.w)
    }

    /// Counts an item of the innermost container, batching as CPython does:
    /// 1,000 list items or dict pairs between a MARK and its APPENDS/SETITEMS.
    fn item(&mut self) -> io::Result<()> {
        let Some((dict, n)) = self.open.last_mut() else { return Ok(()) };
        let per_batch = if *dict { 2 * BATCH } else { BATCH };
        if *n == per_batch {
            *n = 0;
            let op = if *dict { SETITEMS } else { APPENDS };
            self.w.write_all(&[op, MARK])?;
        }
        *n += 1;
        Ok(())
    }
}

fn pickle_value<W: Write>(v: &Py, w: &mut W, memo: &mut StrMemo) -> io::Result<()> {
    match v {
        Py::None => w.write_all(&[NONE]),
        Py::Bool(true) => w.write_all(&[NEWTRUE]),
        Py::Bool(false) => w.write_all(&[NEWFALSE]),
        Py::Int(i) => pickle_int(*i, w),
        Py::UInt(u) => {
            // LONG1, nine bytes: the value and a zero sign byte.
            w.write_all(&[LONG1, 9])?;
            w.write_all(&u.to_le_bytes())?;
            w.write_all(&[0])
        }
        Py::Float(f) => {
            w.write_all(&[BINFLOAT])?;
            w.write_all(&f.to_be_bytes())
        }
        Py::Str(s) => memo.write(s, w),
        Py::List(items) => {
            w.write_all(&[EMPTY_LIST])?;
            for chunk in items.chunks(BATCH) {
                w.write_all(&[MARK])?;
                for x in chunk {
                    pickle_value(x, w, memo)?;
                }
                w.write_all(&[APPENDS])?;
            }
            Ok(())
        }
        Py::Tuple(items) => {
            let op = match items.len() {
                0 => return w.write_all(&[EMPTY_TUPLE]),
                1 => TUPLE1,
                2 => TUPLE2,
                3 => TUPLE3,
                _ => {
                    w.write_all(&[MARK])?;
                    TUPLE
                }
            };
            for x in items {
                pickle_value(x, w, memo)?;
            }
            w.write_all(&[op])
        }
        Py::Dict(items) => {
            w.write_all(&[EMPTY_DICT])?;
            for chunk in items.chunks(BATCH) {
                w.write_all(&[MARK])?;
                for (k, x) in chunk {
                    pickle_value(k, w, memo)?;
                    pickle_value(x, w, memo)?;
                }
                w.write_all(&[SETITEMS])?;
            }
            Ok(())
        }
    }
}

fn pickle_int<W: Write>(i: i64, w: &mut W) -> io::Result<()> {
    if (0..256).contains(&i) {
        w.write_all(&[BININT1, i as u8])
    } else if (0..65536).contains(&i) {
        w.write_all(&[BININT2])?;
        w.write_all(&(i as u16).to_le_bytes())
    } else if let Ok(small) = i32::try_from(i) {
        w.write_all(&[BININT])?;
        w.write_all(&small.to_le_bytes())
    } else {
        // LONG1: little-endian two's complement, shortest form.
        let bytes = i.to_le_bytes();
        let mut n = 8;
        while n > 1 {
            let top = bytes[n - 1];
            let next_sign = bytes[n - 2] & 0x80;
            if (top == 0 && next_sign == 0) || (top == 0xff && next_sign != 0) {
                n -= 1;
            } else {
                break;
            }
        }
        w.write_all(&[LONG1, n as u8])?;
        w.write_all(&bytes[..n])
    }
}

impl serde::Serialize for Py {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self {
            Py::None => s.serialize_none(),
            Py::Bool(b) => s.serialize_bool(*b),
            Py::Int(i) => s.serialize_i64(*i),
            Py::UInt(u) => s.serialize_u64(*u),
            Py::Float(f) => s.serialize_f64(*f),
            Py::Str(x) => s.serialize_str(x),
            Py::List(items) | Py::Tuple(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for x in items {
                    seq.serialize_element(x)?;
                }
                seq.end()
            }
            Py::Dict(items) => {
                let mut map = s.serialize_map(Some(items.len()))?;
                for (k, v) in items {
                    match k {
                        Py::Str(k) => map.serialize_entry(k, v)?,
                        Py::Int(i) => map.serialize_entry(&i.to_string(), v)?,
                        other => map.serialize_entry(&format!("{other:?}"), v)?,
                    }
                }
                map.end()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(v: &Py) -> serde_pickle::Value {
        let mut buf = Vec::new();
        write_pickle(v, &mut buf).unwrap();
        assert_eq!(&buf[..2], &[0x80, 4], "protocol 4");
        serde_pickle::value_from_slice(&buf, serde_pickle::DeOptions::new()).unwrap()
    }

    #[test]
    fn ints_of_every_width_read_back() {
        use serde_pickle::{HashableValue as H, Value as V};
        for i in [
            0,
            1,
            255,
            256,
            65535,
            65536,
            -1,
            -129,
            i32::MAX as i64,
            i32::MIN as i64,
            1 << 40,
            0x7f00_0000_0000,
            i64::MAX,
            i64::MIN,
            -(1 << 40),
        ] {
            assert_eq!(roundtrip(&Py::Int(i)), V::I64(i), "{i}");
        }
        let v = Py::dict([
            ("a", Py::Tuple(vec![Py::Int(0), Py::Int(0)])),
            ("b", Py::List(vec![Py::Bool(true), Py::None, Py::Float(0.5)])),
        ]);
        let V::Dict(d) = roundtrip(&v) else { panic!() };
        assert_eq!(d[&H::String("a".into())], V::Tuple(vec![V::I64(0), V::I64(0)]));
        assert_eq!(d[&H::String("b".into())], V::List(vec![V::Bool(true), V::None, V::F64(0.5)]));
    }

    #[test]
    fn repeated_strings_are_written_once_and_fetched_from_the_memo() {
        use serde_pickle::{HashableValue as H, Value as V};
        let record = |i: i64| Py::dict([("action", Py::str("alloc")), ("addr", Py::Int(i))]);
        let v = Py::List((0..300).map(record).collect());
        let mut buf = Vec::new();
        write_pickle(&v, &mut buf).unwrap();
        // Each name appears once in the file; 300 records fit in ~15 bytes each.
        assert_eq!(buf.windows(6).filter(|w| w == b"action").count(), 1);
        assert!(buf.len() < 300 * 16, "{} bytes", buf.len());
        let V::List(items) = serde_pickle::value_from_slice(&buf, serde_pickle::DeOptions::new()).unwrap() else {
            panic!()
        };
        let V::Dict(last) = &items[299] else { panic!() };
        assert_eq!(last[&H::String("action".into())], V::String("alloc".into()));
        assert_eq!(last[&H::String("addr".into())], V::I64(299));
    }

    #[test]
    fn long_strings_and_big_containers_batch() {
        use serde_pickle::Value as V;
        let long = "x".repeat(70_000);
        let list = Py::List((0..2500).map(Py::Int).collect());
        assert_eq!(roundtrip(&Py::Str(long.clone())), V::String(long));
        let V::List(items) = roundtrip(&list) else { panic!() };
        assert_eq!(items.len(), 2500);
        assert_eq!(items[2499], V::I64(2499));
    }
}
