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

#[test]
fn dicts_of_plain_values_read_as_the_general_path_reads_them() {
    let msg = |b: &[u8]| read(b).unwrap_err().to_string();
    let d = |pairs: &[(Py, Py)]| Py::Dict(pairs.to_vec());
    // A trace entry's shape: memo fetches and numbers of every width, then SETITEMS.
    let entry = b"\x80\x04]\x94(\x8c\x01a\x94N\x94\x88\x94\x89\x94}\x94(h\x01K\x07h\x02M\x00\x01h\x03J\xff\xff\xff\xff\
h\x04\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00h\x01G?\xf8\x00\x00\x00\x00\x00\x00ue.";
    let v = read(entry).unwrap();
    let a = Py::str("a");
    let pairs = [
        (a.clone(), Py::Int(7)),
        (Py::None, Py::Int(256)),
        (Py::Bool(true), Py::Int(-1)),
        (Py::Bool(false), Py::UInt(u64::MAX)),
        (a.clone(), Py::Float(1.5)),
    ];
    assert_eq!(v, Py::List(vec![a.clone(), Py::None, Py::Bool(true), Py::Bool(false), d(&pairs)]));
    // Put at a slot not the next (BINPUT 5): read by the general path, the same dict.
    assert_eq!(read(b"\x80\x02}q\x05(K\x01K\x02u.").unwrap(), d(&[(Py::Int(1), Py::Int(2))]));
    assert_eq!(read(b"\x80\x02}q\x00(K\x01K\x02uh\x00\x86.").unwrap(), {
        let one = d(&[(Py::Int(1), Py::Int(2))]);
        Py::Tuple(vec![one.clone(), one])
    });
    // A second batch of pairs after a plain run: the dict is still being built.
    let two = b"\x80\x04}\x94(K\x01K\x02u(K\x03K\x04u.";
    assert_eq!(read(two).unwrap(), d(&[(Py::Int(1), Py::Int(2)), (Py::Int(3), Py::Int(4))]));
    // A run stopped by a new string, a nested list or a FRAME is read whole by the general path.
    let s = b"\x80\x04}\x94(K\x01\x8c\x01b\x94]\x94K\x02\x95\x01\x00\x00\x00\x00\x00\x00\x00NNu.";
    assert_eq!(
        read(s).unwrap(),
        d(&[(Py::Int(1), Py::str("b")), (Py::List(vec![]), Py::Int(2)), (Py::None, Py::None)])
    );
    // The dict's own slot fetched inside its pairs finishes it, as the general path does.
    assert!(msg(b"\x80\x04}\x94(h\x00K\x01u.").contains("SETITEMS on something that is not a dict"));
    // An odd count, a fetch never stored, an int past 64 bits: the general path's errors, at their bytes.
    assert!(msg(b"\x80\x04}\x94(K\x01u.").contains("odd number"));
    assert_eq!(msg(b"\x80\x04}\x94(K\x01h\x07u."), "byte 7: memo 7 was never stored");
    assert_eq!(
        msg(b"\x80\x04}\x94(K\x01\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01u."),
        "byte 7: an integer of 9 bytes, beyond 64 bits"
    );
    // A run cut by the end of the file, and one longer than the reader's buffer.
    assert!(msg(b"\x80\x04}\x94(K\x01K\x02").contains("ends at byte"));
    let mut long = b"\x80\x04}\x94(".to_vec();
    for i in 0..40_000u32 {
        long.push(b'J');
        long.extend_from_slice(&i.to_le_bytes());
        long.extend_from_slice(b"K\x01");
    }
    long.extend_from_slice(b"u.");
    match read(&long).unwrap() {
        Py::Dict(items) => {
            assert_eq!(items.len(), 40_000);
            assert_eq!(items[39_999], (Py::Int(39_999), Py::Int(1)));
        }
        other => panic!("not a dict: {other:?}"),
    }
}

#[test]
fn long1_in_a_plain_dict_is_two_s_complement_of_its_bytes() {
    // Each LONG1 of 1 to 8 bytes, with more pairs behind it (so the run's
    // bytes are buffered past it) and at the end of the run.
    let mut bytes = b"\x80\x04}\x94(".to_vec();
    let mut expected = Vec::new();
    let patterns: [[u8; 8]; 5] = [
        [0; 8],
        [0xff; 8],
        [0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef],
        [0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10],
        [0x00, 0x80, 0x7f, 0x80, 0x00, 0x7f, 0x80, 0xff],
    ];
    let mut key = 0;
    for n in 1..=8usize {
        for p in &patterns {
            for top in [0x00u8, 0x7f, 0x80, 0xff] {
                let mut v = p[..n].to_vec();
                v[n - 1] = top;
                let mut wide = [if top & 0x80 != 0 { 0xff } else { 0 }; 8];
                wide[..n].copy_from_slice(&v);
                bytes.push(b'J');
                bytes.extend_from_slice(&(key as i32).to_le_bytes());
                bytes.extend_from_slice(&[0x8a, n as u8]);
                bytes.extend_from_slice(&v);
                expected.push((Py::Int(key), Py::Int(i64::from_le_bytes(wide))));
                key += 1;
            }
        }
    }
    bytes.extend_from_slice(b"u.");
    assert_eq!(read(&bytes).unwrap(), Py::Dict(expected));
}
