//! Reading the snapshot a PyTorch user has: the dict of
//! `torch.cuda.memory._snapshot()`, as `_dump_snapshot()` pickles it, or as
//! JSON (which the newer viewer reads and headroom writes).
//!
//! Every era is read: 2.4 and later (`time_us`, `allocator_settings`), about
//! 2.1 (neither), 2.0 blocks with a `history` list instead of `frames`, and
//! 1.13's bare list of segments. Several devices, streams, private pools,
//! expandable segments, `oom` entries, missing frames and timestamps are all
//! kept. Stacks are interned: the same stack, recorded on thousands of
//! entries, is stored once.
//!
//! Records are built while the file is read, from a pickle (see
//! [`crate::pickle`]) or from JSON, by one builder: a trace entry costs 64
//! bytes whatever its size in the file. The records themselves are
//! [`crate::memory_snapshot`]'s, and are named here too.

pub use crate::memory_snapshot::{
    Block, Frame, MemorySnapshot, RecordedSettings, Segment, StackId, Stacks, TraceAction, TraceEvent,
};
pub use crate::snapshot_builder::SnapshotError;

use crate::pickle::read_pickle;
use crate::snapshot_builder::SnapshotBuilder;
use crate::snapshot_json::read_json;
use std::io::{self, BufRead, Read};

/// Reads a snapshot, pickle or JSON, telling them apart by their first byte;
/// gzip-compressed, it is decompressed as it is read.
pub fn read_snapshot<R: BufRead>(reader: R) -> Result<MemorySnapshot, SnapshotError> {
    read_snapshot_of(reader, None)
}

/// [`read_snapshot`] of a file of `file_bytes` (as stored), which sizes the tables of an
/// uncompressed pickle before reading.
fn read_snapshot_of<R: BufRead>(mut reader: R, file_bytes: Option<u64>) -> Result<MemorySnapshot, SnapshotError> {
    let gzip = crate::compressed::is_gzip(reader.fill_buf()?);
    let mut reader = crate::compressed::decompressing(reader)?;
    // A byte-order mark before JSON, as editors on Windows write one: skipped, as in traces and configs.
    if reader.fill_buf()?.starts_with(b"\xef\xbb\xbf") {
        reader.consume(3);
    }
    let first = loop {
        let buf = reader.fill_buf()?;
        match buf.iter().position(|b| !b.is_ascii_whitespace()) {
            Some(i) => {
                let b = buf[i];
                reader.consume(i);
                break Some(b);
            }
            None if buf.is_empty() => break None,
            None => {
                let n = buf.len();
                reader.consume(n);
            }
        }
    };
    let mut b = SnapshotBuilder::new();
    let (root, format) =
        match first {
            Some(0x80) => {
                let proto = reader.fill_buf()?.get(1).copied().unwrap_or(0);
                if let Some(n) = file_bytes.filter(|_| !gzip) {
                    b.expect_bytes(n);
                }
                (read_pickle(&mut reader, &mut b)?, format!("pickle protocol {proto}"))
            }
            Some(b'{') | Some(b'[') => (read_json(reader, &mut b)?, "JSON".to_string()),
            // MARK, EMPTY_DICT, EMPTY_LIST: how protocols 0 and 1 begin a dict or a list.
            Some(b'(') | Some(b'}') | Some(b']') => return Err(SnapshotError::Shape(
                "it looks like a pickle of protocol 0 or 1, which headroom does not read: PyTorch writes snapshots \
                 with protocol 2 or later (load it in Python and pickle.dump it again with protocol=4)"
                    .into(),
            )),
            Some(other) => {
                return Err(SnapshotError::Shape(format!(
                    "it starts with byte {other:#04x}; a snapshot is a pickle (byte 0x80) or JSON ('{{' or '[')"
                )))
            }
            None => return Err(SnapshotError::Shape("the file is empty".into())),
        };
    let mut snap = b.finish(root)?;
    crate::snapshot_check::check_segments(&snap).map_err(SnapshotError::Inconsistent)?;
    snap.format = if gzip { format!("{format}, gzip") } else { format };
    Ok(snap)
}

/// Reads a snapshot from a file, with the file's name in errors left to the caller.
pub fn read_snapshot_file(path: &std::path::Path) -> Result<MemorySnapshot, SnapshotError> {
    read_snapshot_file_with(path, |_, _| {})
}

/// [`read_snapshot_file`], calling `progress(bytes_read, file_size)` every
/// few megabytes (for a progress bar: a large snapshot takes seconds).
pub fn read_snapshot_file_with(
    path: &std::path::Path,
    progress: impl FnMut(u64, u64),
) -> Result<MemorySnapshot, SnapshotError> {
    let f = std::fs::File::open(path)?;
    let total = f.metadata().map(|m| m.len()).unwrap_or(0);
    // Progress counts the file's own bytes, compressed or not.
    let counted = Counted { inner: f, done: 0, reported: 0, total, progress };
    read_snapshot_of(io::BufReader::with_capacity(1 << 16, counted), Some(total))
}

/// A reader that reports how far it has read.
struct Counted<R, F> {
    inner: R,
    done: u64,
    reported: u64,
    total: u64,
    progress: F,
}

impl<R: Read, F: FnMut(u64, u64)> Read for Counted<R, F> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.done += n as u64;
        if self.done - self.reported >= 4 << 20 || n == 0 {
            self.reported = self.done;
            (self.progress)(self.done, self.total);
        }
        Ok(n)
    }
}

/// Whether `prefix` (the start of a file, decompressed) is a snapshot rather
/// than a JSONL trace: a pickle, a JSON list, or a JSON object whose first
/// key is one of a snapshot's.
pub fn looks_like_snapshot(prefix: &[u8]) -> bool {
    let s = prefix.iter().position(|b| !b.is_ascii_whitespace()).map_or(&[][..], |i| &prefix[i..]);
    match s.first() {
        Some(0x80) | Some(b'[') => true,
        Some(b'{') => {
            let rest = std::str::from_utf8(&s[1..s.len().min(256)]).unwrap_or("");
            let rest = rest.trim_start();
            ["\"segments\"", "\"device_traces\"", "\"allocator_settings\"", "\"external_annotations\""]
                .iter()
                .any(|k| rest.starts_with(k))
        }
        _ => false,
    }
}
