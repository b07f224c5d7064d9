//! The pickle machine against pickles written by headroom's own writer and
//! by Python: values, memo sharing, framing, marks, and bad input refused
//! at its byte.

use headroom_trace::pickle::{read_pickle, Builder, PickleError};
use headroom_trace::py::{write_pickle, Py};

/// Builds headroom's own [`Py`] values, to compare with what was written.
struct PyBuilder;

impl Builder for PyBuilder {
    type Value = Py;
    fn none(&mut self) -> Py {
        Py::None
    }
    fn bool(&mut self, v: bool) -> Py {
        Py::Bool(v)
    }
    fn int(&mut self, v: i64) -> Py {
        Py::Int(v)
    }
    fn uint(&mut self, v: u64) -> Py {
        Py::UInt(v)
    }
    fn float(&mut self, v: f64) -> Py {
        Py::Float(v)
    }
    fn str(&mut self, v: &str) -> Py {
        Py::str(v)
    }
    fn list(&mut self, items: &[Py]) -> Py {
        Py::List(items.to_vec())
    }
    fn tuple(&mut self, items: &[Py]) -> Py {
        Py::Tuple(items.to_vec())
    }
    fn dict(&mut self, items: &[(Py, Py)]) -> Py {
        Py::Dict(items.to_vec())
    }
}

fn read(bytes: &[u8]) -> Result<Py, PickleError> {
    read_pickle(bytes, &mut PyBuilder)
}

#[test]
fn reads_what_the_writer_writes() {
    let v = Py::dict([
        ("ints", Py::List(vec![Py::Int(0), Py::Int(-1), Py::Int(255), Py::Int(65536), Py::Int(i64::MIN)])),
        ("big", Py::UInt(u64::MAX)),
        ("f", Py::Float(1.5)),
        ("t", Py::Tuple(vec![Py::Int(0), Py::Int(0)])),
        ("none", Py::None),
        ("b", Py::Bool(true)),
        ("s", Py::str("é".repeat(300))),
        ("long", Py::List((0..2500).map(Py::Int).collect())),
    ]);
    let mut bytes = Vec::new();
    write_pickle(&v, &mut bytes).unwrap();
    assert_eq!(read(&bytes).unwrap(), v);
}

#[test]
fn memoised_objects_are_shared_and_framing_is_skipped() {
    // pickle.dumps({'a': [1], 'b': <same list>}, protocol=4): FRAME, MEMOIZE, BINGET.
    let bytes = b"\x80\x04\x95\x14\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94K\x01a\x8c\x01b\x94h\x02u.";
    let v = read(bytes).unwrap();
    let one = Py::List(vec![Py::Int(1)]);
    assert_eq!(v, Py::dict([("a", one.clone()), ("b", one)]));
    // Protocol 2 (BINPUT, MARK, SETITEMS, LONG1 of 9 bytes for 2^64 - 1).
    let bytes = b"\x80\x02}q\x00X\x01\x00\x00\x00xq\x01\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00s.";
    assert_eq!(read(bytes).unwrap(), Py::dict([("x", Py::UInt(u64::MAX))]));
}

#[test]
fn bad_input_is_an_error_at_its_byte() {
    let msg = |b: &[u8]| read(b).unwrap_err().to_string();
    assert!(msg(b"").contains("not a pickle"));
    assert!(msg(b"{\"segments\": []}").contains("not a pickle"));
    assert!(msg(b"\x80\x04]\x94(K\x01").contains("ends at byte 7"));
    // pickle.dumps(os.system) and a REDUCE: refused where they stand, never resolved.
    let global = b"\x80\x04\x95\x14\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94\x93\x94.";
    assert_eq!(
        msg(global),
        "byte 28: the pickle refers to Python code (a global); snapshots hold only plain values, and headroom \
         never runs what a file names"
    );
    assert!(msg(b"\x80\x04C\x01x.").starts_with("byte 2: opcode 0x43 (SHORT_BINBYTES)"));
    assert!(msg(b"\x80\x04h\x05.").contains("memo 5 was never stored"));
    // A list that contains itself: `a = []; a.append(a)`.
    assert!(msg(b"\x80\x04]\x94h\x00a.").contains("APPEND to something that is not a list"));
    assert!(msg(b"\x80\x04a.").contains("stack is empty"));
    assert!(msg(b"\x80\x04K\x01K\x02.").contains("left on the stack"));
    assert!(msg(b"\x80\x07N.").contains("protocol 7"));
    // BINUNICODE8 claiming 8 EB: refused before any buffer grows (found by fuzzing).
    assert!(msg(b"\x80\x04\x8d\x07\x00\x00\x00\x00\x00\x00\x70x").contains("longer than any"));
}

#[test]
fn runs_of_memo_fetches_read_as_single_ones() {
    let msg = |b: &[u8]| read(b).unwrap_err().to_string();
    // BINGET, LONG_BINGET, BINGET in a row, as a stack's frames come.
    let run = b"\x80\x04](K\x07\x94h\x00j\x00\x00\x00\x00h\x00e.";
    assert_eq!(read(run).unwrap(), Py::List(vec![Py::Int(7); 4]));
    // A run whose first fetch finishes a list still on the stack, the second shares it.
    let one = Py::List(vec![Py::Int(1)]);
    assert_eq!(read(b"\x80\x04(]\x94K\x01ah\x00h\x00l.").unwrap(), Py::List(vec![one; 3]));
    // The error names the fetch in the run that fails, at its own byte.
    assert_eq!(msg(b"\x80\x04](K\x07\x94h\x00h\x09e."), "byte 9: memo 9 was never stored");
    assert_eq!(msg(b"\x80\x04](K\x07\x94h\x00j\x09\x00\x00\x00e."), "byte 9: memo 9 was never stored");
    // A run cut by the end of the file.
    assert!(msg(b"\x80\x04](K\x07\x94h\x00j\x00\x00").contains("ends at byte"));
}

#[test]
fn marks_close_where_they_stand() {
    let msg = |b: &[u8]| read(b).unwrap_err().to_string();
    // POP_MARK drops what stands above the MARK; DUP copies; TUPLE closes a MARK.
    assert_eq!(read(b"\x80\x04N(K\x01K\x021.").unwrap(), Py::None);
    assert_eq!(read(b"\x80\x04(K\x01\x32t.").unwrap(), Py::Tuple(vec![Py::Int(1), Py::Int(1)]));
    // A list opened inside a dict's batch is finished when the batch closes, in order.
    let nested = b"\x80\x04}(\x8c\x01a](K\x01K\x02e\x8c\x01b]u.";
    let v = read(nested).unwrap();
    assert_eq!(v, Py::dict([("a", Py::List(vec![Py::Int(1), Py::Int(2)])), ("b", Py::List(vec![]))]));
    // What stands behind a MARK is out of reach until it closes.
    assert!(msg(b"\x80\x04]((K\x01e.").contains("APPENDS to something that is not a list"));
    assert!(msg(b"\x80\x04}((K\x01K\x02u.").contains("SETITEMS on something that is not a dict"));
    assert!(msg(b"\x80\x04](K\x01a.").contains("APPEND to something that is not a list"));
    assert!(msg(b"\x80\x04(\x94.").contains("nothing to memoise"));
    assert!(msg(b"\x80\x04}(K\x01u.").contains("odd number"));
    assert!(msg(b"\x80\x04K\x01e.").contains("no MARK to close"));
    assert!(msg(b"\x80\x04(.").contains("MARK where a value is needed"));
    assert!(msg(b"\x80\x04(K\x01.").contains("left on the stack"));
}
