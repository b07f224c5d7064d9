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
//! Records are built while the file is read (see [`crate::pickle`]): a
//! trace entry costs 64 bytes whatever its size in the file.

use crate::pickle::{read_pickle, Builder, PickleError};
use headroom_alloc::{AllocatorConfig, BlockState, PoolKind, StreamId};
use rustc_hash::FxHashMap;
use std::io::{self, BufRead, Read};

/// What a trace entry records, by PyTorch's action names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TraceAction {
    Alloc,
    FreeRequested,
    FreeCompleted,
    /// Before `free_requested`/`free_completed` existed (converters still write it).
    Free,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Snapshot,
    Oom,
    /// Metadata added to a live allocation after the fact (newest versions).
    Annotate,
    /// An action this reader does not know (a newer PyTorch's): kept, not replayed.
    Other,
}

impl TraceAction {
    const NAMES: [(&'static str, TraceAction); 11] = [
        ("alloc", TraceAction::Alloc),
        ("free_requested", TraceAction::FreeRequested),
        ("free_completed", TraceAction::FreeCompleted),
        ("free", TraceAction::Free),
        ("segment_alloc", TraceAction::SegmentAlloc),
        ("segment_free", TraceAction::SegmentFree),
        ("segment_map", TraceAction::SegmentMap),
        ("segment_unmap", TraceAction::SegmentUnmap),
        ("snapshot", TraceAction::Snapshot),
        ("oom", TraceAction::Oom),
        ("annotate", TraceAction::Annotate),
    ];

    /// PyTorch's name (`"other"` for actions this reader does not know).
    pub fn name(self) -> &'static str {
        Self::NAMES.iter().find(|(_, a)| *a == self).map_or("other", |(n, _)| n)
    }
}

/// A stack of frames, interned: 0 is the empty stack.
pub type StackId = u32;

/// One trace entry.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TraceEvent {
    pub action: TraceAction,
    /// Block, segment or range address (0 where the entry has none).
    pub addr: u64,
    /// The caller's unrounded size for `alloc` and frees; the segment or
    /// range for `segment_*`; the rounded request for `oom`.
    pub size: u64,
    pub stream: StreamId,
    pub time_us: Option<i64>,
    /// For `oom`: the bytes the device said were free.
    pub device_free: Option<u64>,
    pub stack: StackId,
    /// `pool_id`, where the entry has one (PyTorch's `TraceEntry::mempool_`, and
    /// headroom's snapshots): the private pool of the block or segment; (0, 0) else.
    pub pool_id: (u64, u64),
}

/// One block of a recorded segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub address: u64,
    pub size: u64,
    /// Meaningful only for active blocks: PyTorch leaves a stale value on inactive ones.
    pub requested_size: u64,
    pub state: BlockState,
    pub stack: StackId,
}

/// One recorded segment: a `cudaMalloc`, or one mapped run of an expandable segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub device: u32,
    pub address: u64,
    pub total_size: u64,
    pub stream: StreamId,
    /// `segment_type`; `None` in snapshots that predate it.
    pub pool: Option<PoolKind>,
    /// `segment_pool_id`: (0, 0) is the default pool, anything else a private
    /// pool (CUDA graphs, `torch.cuda.MemPool`).
    pub pool_id: (i64, i64),
    pub is_expandable: bool,
    pub blocks: Vec<Block>,
    pub stack: StackId,
}

/// One frame of a stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Index into [`Stacks::strings`].
    pub filename: u32,
    pub line: i64,
    pub name: u32,
}

/// Interned frames and stacks.
#[derive(Clone, Debug, Default)]
pub struct Stacks {
    pub strings: Vec<Box<str>>,
    pub frames: Vec<Frame>,
    /// Frame ids, innermost first as PyTorch records them; `stacks[0]` is empty.
    pub stacks: Vec<Box<[u32]>>,
}

impl Stacks {
    /// The frames of a stack, innermost first.
    pub fn frames_of(&self, stack: StackId) -> impl Iterator<Item = (&str, i64, &str)> + '_ {
        self.stacks[stack as usize].iter().map(|&f| {
            let f = self.frames[f as usize];
            (&*self.strings[f.filename as usize], f.line, &*self.strings[f.name as usize])
        })
    }
}

/// The allocator settings a snapshot recorded (`allocator_settings`, 2.4 and later).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RecordedSettings {
    /// The raw `PYTORCH_CUDA_ALLOC_CONF` string ("" when unset).
    pub conf: Option<String>,
    pub expandable_segments: Option<bool>,
    /// Bytes; `None` for unlimited (PyTorch writes -1).
    pub max_split_size: Option<u64>,
    pub garbage_collection_threshold: Option<f64>,
}

/// A memory snapshot, as read.
#[derive(Clone, Debug, Default)]
pub struct MemorySnapshot {
    /// Every device's segments, in the file's order.
    pub segments: Vec<Segment>,
    /// `device_traces[d]`: device d's trace, oldest first.
    pub device_traces: Vec<Vec<TraceEvent>>,
    /// `None` before 2.4, which did not record them.
    pub settings: Option<RecordedSettings>,
    pub stacks: Stacks,
    /// Which form the file had, for messages: "pickle protocol 4", "JSON", ...
    pub format: String,
}

impl MemorySnapshot {
    /// The devices the snapshot mentions (segments or a non-empty trace), ascending.
    pub fn devices(&self) -> Vec<u32> {
        let mut d: Vec<u32> = self.segments.iter().map(|s| s.device).collect();
        d.extend((0..self.device_traces.len() as u32).filter(|&i| !self.device_traces[i as usize].is_empty()));
        d.sort_unstable();
        d.dedup();
        d
    }

    /// The settings the recorded allocator ran with, and a note when the
    /// snapshot predates recording them or they cannot be read.
    pub fn allocator_config(&self) -> (AllocatorConfig, Option<String>) {
        let Some(s) = &self.settings else {
            return (
                AllocatorConfig::default(),
                Some(
                    "the snapshot does not record its allocator settings (PyTorch before 2.4): defaults assumed".into(),
                ),
            );
        };
        match s.conf.as_deref().map(AllocatorConfig::parse) {
            Some(Ok(c)) => {
                let diff = s.overrides(&c);
                if diff.is_empty() {
                    return (c, None);
                }
                let conf = s.conf.as_deref().unwrap_or_default();
                let note = format!(
                    "the recorded fields ({}) differ from PYTORCH_CUDA_ALLOC_CONF {conf:?} (settings changed at run \
                     time, by torch.cuda.memory._set_allocator_settings?): the fields are used",
                    diff.join(", ")
                );
                let text =
                    std::iter::once(conf.trim()).filter(|t| !t.is_empty()).chain(diff.iter().map(String::as_str));
                (s.with_fields(c, text.collect::<Vec<_>>().join(",")), Some(note))
            }
            Some(Err(e)) => {
                let base = AllocatorConfig::default();
                let text = s.overrides(&base).join(",");
                (
                    s.with_fields(base, text),
                    Some(format!(
                        "the recorded PYTORCH_CUDA_ALLOC_CONF {:?} does not parse ({e}); its separate fields are used",
                        s.conf.as_deref().unwrap_or_default()
                    )),
                )
            }
            None => {
                let base = AllocatorConfig::default();
                let text = s.overrides(&base).join(",");
                (s.with_fields(base, text), None)
            }
        }
    }
}

impl RecordedSettings {
    /// The fields that say otherwise than `c`, as `key:value` (an absent
    /// `max_split_size` reads as "no limit", as PyTorch writes -1 for it).
    fn overrides(&self, c: &AllocatorConfig) -> Vec<String> {
        let mut diff = Vec::new();
        if let Some(e) = self.expandable_segments.filter(|&e| e != c.expandable_segments) {
            diff.push(format!("expandable_segments:{}", if e { "True" } else { "False" }));
        }
        let split = self.max_split_size.unwrap_or(u64::MAX);
        if split != c.max_split_size {
            diff.push(format!("max_split_size_mb:{}", split / (1 << 20)));
        }
        if let Some(t) = self.garbage_collection_threshold.filter(|&t| t != c.garbage_collection_threshold) {
            diff.push(format!("garbage_collection_threshold:{t}"));
        }
        diff
    }

    /// `base` with the recorded fields applied. Its settings string becomes
    /// `text` where that says the same (so a snapshot written from the
    /// replay reads back to the same settings); where it cannot (a split
    /// size PyTorch's parser refuses), the fields stand alone.
    fn with_fields(&self, base: AllocatorConfig, text: String) -> AllocatorConfig {
        let mut c = base;
        if let Some(e) = self.expandable_segments {
            c.expandable_segments = e;
        }
        c.max_split_size = self.max_split_size.unwrap_or(u64::MAX);
        if let Some(t) = self.garbage_collection_threshold {
            c.garbage_collection_threshold = t;
        }
        match AllocatorConfig::parse(&text) {
            Ok(p)
                if p.expandable_segments == c.expandable_segments
                    && p.max_split_size == c.max_split_size
                    && p.garbage_collection_threshold == c.garbage_collection_threshold =>
            {
                p
            }
            _ => c,
        }
    }
}

/// Why a snapshot could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error(transparent)]
    Pickle(#[from] PickleError),
    #[error("not valid JSON: {0}")]
    Json(serde_json::Error),
    #[error("not a memory snapshot: {0}")]
    Shape(String),
    /// Read whole, but its segments cannot be one allocator's state.
    #[error("the snapshot contradicts itself: {0}")]
    Inconsistent(String),
}

/// Reads a snapshot, pickle or JSON, telling them apart by their first byte;
/// gzip-compressed, it is decompressed as it is read.
pub fn read_snapshot<R: BufRead>(mut reader: R) -> Result<MemorySnapshot, SnapshotError> {
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
    read_snapshot(io::BufReader::with_capacity(1 << 16, counted))
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

// ---------------------------------------------------------------------------
// The builder: compact records as the file is read.

/// A value under construction. Containers that are snapshot records become
/// records at once; the rest stay generic (few: the top level, settings).
#[derive(Clone, Copy, Debug)]
#[repr(u64)]
enum V {
    None,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(u32),
    List(u32),
    Tuple(u32),
    Dict(u32),
    Frame(u32),
    Stack(StackId),
    Entry(u32),
    /// A list of entries `start..end`, consecutive in the entry table.
    Entries(u32, u32),
    Block(u32),
    Segment(u32),
}

/// Keys and values the builder recognises, interned first so their ids are known.
const KNOWN: [&str; 31] = [
    "action",
    "addr",
    "size",
    "stream",
    "time_us",
    "frames",
    "device_free",
    "filename",
    "line",
    "name",
    "address",
    "state",
    "requested_size",
    "blocks",
    "device",
    "total_size",
    "segment_type",
    "segment_pool_id",
    "is_expandable",
    "history",
    "real_size",
    "active_allocated",
    "active_pending_free",
    "inactive",
    "small",
    "large",
    "segments",
    "device_traces",
    "allocator_settings",
    "active_awaiting_free",
    "pool_id",
];

/// The id of a known key: its index in [`KNOWN`], found at compile time.
const fn id(key: &str) -> u32 {
    let mut i = 0;
    while i < KNOWN.len() {
        if const_eq(KNOWN[i], key) {
            return i as u32;
        }
        i += 1;
    }
    panic!("not a known key")
}

const fn const_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

struct SnapshotBuilder {
    strings: Vec<Box<str>>,
    string_ids: FxHashMap<Box<str>, u32>,
    frames: Vec<Frame>,
    frame_ids: FxHashMap<Frame, u32>,
    stacks: Vec<Box<[u32]>>,
    stack_ids: FxHashMap<Box<[u32]>, StackId>,
    lists: Vec<Vec<V>>,
    dicts: Vec<Vec<(V, V)>>,
    entries: Vec<TraceEvent>,
    blocks: Vec<Block>,
    segments: Vec<Segment>,
    /// Action by string id, for the strings that name one.
    actions: FxHashMap<u32, TraceAction>,
    /// The first record that did not make sense; reported once reading ends.
    error: Option<String>,
    /// Items of every container read: a bound on what the file can honestly
    /// make, since each item took at least one byte of it.
    items_read: u64,
    /// Records copied out of shared lists into segments and traces. A pickle's
    /// memo lets a two-byte reference stand for a list of a million records;
    /// copies are allowed up to `items_read`, so memory follows the file.
    copied: u64,
}

impl SnapshotBuilder {
    fn new() -> Self {
        let mut b = SnapshotBuilder {
            strings: Vec::new(),
            string_ids: FxHashMap::default(),
            frames: Vec::new(),
            frame_ids: FxHashMap::default(),
            stacks: vec![Box::new([])],
            stack_ids: FxHashMap::default(),
            lists: Vec::new(),
            dicts: Vec::new(),
            entries: Vec::new(),
            blocks: Vec::new(),
            segments: Vec::new(),
            actions: FxHashMap::default(),
            error: None,
            items_read: 0,
            copied: 0,
        };
        for k in KNOWN {
            b.intern(k);
        }
        for (name, action) in TraceAction::NAMES {
            let i = b.intern(name);
            b.actions.insert(i, action);
        }
        b
    }

    fn intern(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.string_ids.get(s) {
            return i;
        }
        let i = self.strings.len() as u32;
        self.strings.push(s.into());
        self.string_ids.insert(s.into(), i);
        i
    }

    fn fail(&mut self, message: String) -> V {
        if self.error.is_none() {
            self.error = Some(message);
        }
        V::None
    }

    /// Counts `n` records copied; false (with the error set) past what the file holds.
    fn copy_allowed(&mut self, n: u64, what: impl FnOnce() -> String) -> bool {
        self.copied = self.copied.saturating_add(n);
        if self.copied <= self.items_read {
            return true;
        }
        let message = format!(
            "{} refers again to records already used (a list shared through the pickle's memo): copying them \
             would build {} records from a file of {} values; refused, so that memory follows the file's size",
            what(),
            self.copied,
            self.items_read
        );
        self.fail(message);
        false
    }

    fn kind(&self, v: &V) -> &'static str {
        match v {
            V::None => "None",
            V::Bool(_) => "a bool",
            V::Int(_) | V::UInt(_) => "an int",
            V::Float(_) => "a float",
            V::Str(_) => "a str",
            V::List(_) | V::Stack(0) => "a list",
            // A stack is a list of frames: said so, or "'segments' is a list, not a list".
            V::Stack(_) => "a list of frames (dicts with 'filename' and 'line')",
            V::Entries(..) => "a list of trace entries",
            V::Tuple(_) => "a tuple",
            V::Dict(_) => "a dict",
            V::Frame(_) => "a frame",
            V::Entry(_) => "a trace entry",
            V::Block(_) => "a block",
            V::Segment(_) => "a segment",
        }
    }

    fn text(&self, v: &V) -> Option<&str> {
        match v {
            V::Str(i) => Some(&self.strings[*i as usize]),
            _ => None,
        }
    }

    fn list_items(&self, v: &V) -> Option<Vec<V>> {
        match v {
            V::List(i) | V::Tuple(i) => Some(self.lists[*i as usize].clone()),
            V::Entries(s, e) => Some((*s..*e).map(V::Entry).collect()),
            V::Stack(0) => Some(Vec::new()),
            _ => None,
        }
    }
}

/// Fields of a dict by known key id; other keys are ignored. Indexed in
/// one pass, as a record looks up most of its keys (a trace entry eight).
/// A key given twice takes its last value, as Python's `dict` (and so
/// `json.load`, `pickle.load` and PyTorch's viewer) does.
struct Fields<'a> {
    items: &'a [(V, V)],
    /// Where each known key last appears in `items`; `u32::MAX` if absent.
    at: [u32; KNOWN.len()],
}

impl<'a> Fields<'a> {
    fn new(items: &'a [(V, V)]) -> Self {
        let mut at = [u32::MAX; KNOWN.len()];
        for (i, (k, _)) in items.iter().enumerate() {
            if let V::Str(s) = k {
                if let Some(slot) = at.get_mut(*s as usize) {
                    *slot = i as u32;
                }
            }
        }
        Fields { items, at }
    }

    /// The value of the key with id `k` (see [`id`]: `f.get(const { id("addr") })`).
    fn get(&self, k: u32) -> Option<&'a V> {
        self.items.get(self.at[k as usize] as usize).map(|(_, v)| v)
    }
    fn has(&self, k: u32) -> bool {
        self.get(k).is_some()
    }
}

/// An unsigned field; `what` names the record for messages (built only for one).
fn uint_of(b: &mut SnapshotBuilder, f: &Fields, k: u32, what: impl Fn() -> String) -> Option<u64> {
    let key = KNOWN[k as usize];
    match f.get(k) {
        Some(V::Int(i)) if *i >= 0 => Some(*i as u64),
        Some(V::UInt(u)) => Some(*u),
        Some(V::Bool(x)) => Some(*x as u64),
        None => None,
        Some(other) => {
            let kind = b.kind(other);
            let shown = match other {
                V::Int(i) => format!("{kind} ({i})"),
                _ => kind.to_string(),
            };
            b.fail(format!("{}: '{key}' is {shown}, expected an int of at least 0", what()));
            None
        }
    }
}

fn stack_of(v: Option<&V>) -> StackId {
    match v {
        Some(V::Stack(s)) => *s,
        _ => 0,
    }
}

impl Builder for SnapshotBuilder {
    type Value = V;

    fn none(&mut self) -> V {
        V::None
    }
    fn bool(&mut self, v: bool) -> V {
        V::Bool(v)
    }
    fn int(&mut self, v: i64) -> V {
        V::Int(v)
    }
    fn uint(&mut self, v: u64) -> V {
        V::UInt(v)
    }
    fn float(&mut self, v: f64) -> V {
        V::Float(v)
    }
    fn str(&mut self, v: &str) -> V {
        V::Str(self.intern(v))
    }

    fn list(&mut self, items: &[V]) -> V {
        self.items_read += items.len() as u64;
        // Empty lists are mostly stacks without frames; one value for all of them.
        if items.is_empty() {
            return V::Stack(0);
        }
        if let Some(V::Frame(_)) = items.first() {
            if items.iter().all(|v| matches!(v, V::Frame(_))) {
                let ids: Box<[u32]> = items.iter().map(|v| if let V::Frame(f) = v { *f } else { 0 }).collect();
                if let Some(&s) = self.stack_ids.get(&ids) {
                    return V::Stack(s);
                }
                let s = self.stacks.len() as StackId;
                self.stacks.push(ids.clone());
                self.stack_ids.insert(ids, s);
                return V::Stack(s);
            }
        }
        if let Some(V::Entry(start)) = items.first() {
            let start = *start;
            let consecutive = items.iter().enumerate().all(|(i, v)| matches!(v, V::Entry(e) if *e == start + i as u32));
            if consecutive {
                return V::Entries(start, start + items.len() as u32);
            }
        }
        self.lists.push(items.to_vec());
        V::List(self.lists.len() as u32 - 1)
    }

    fn tuple(&mut self, items: &[V]) -> V {
        self.items_read += items.len() as u64;
        self.lists.push(items.to_vec());
        V::Tuple(self.lists.len() as u32 - 1)
    }

    fn dict(&mut self, items: &[(V, V)]) -> V {
        self.items_read += 2 * items.len() as u64;
        let f = Fields::new(items);
        if let Some(action) = f.get(const { id("action") }) {
            return self.entry(items, *action);
        }
        if f.has(const { id("filename") }) && f.has(const { id("line") }) {
            let text = |b: &mut Self, k: u32| match f.get(k) {
                Some(V::Str(i)) => *i,
                _ => b.intern(""),
            };
            let filename = text(self, const { id("filename") });
            let name = text(self, const { id("name") });
            let line = match f.get(const { id("line") }) {
                Some(V::Int(l)) => *l,
                _ => 0,
            };
            let frame = Frame { filename, line, name };
            let n = self.frames.len() as u32;
            let fid = *self.frame_ids.entry(frame).or_insert(n);
            if fid == n {
                self.frames.push(frame);
            }
            return V::Frame(fid);
        }
        if f.has(const { id("state") }) && f.has(const { id("size") }) && !f.has(const { id("blocks") }) {
            return self.block(items);
        }
        if f.has(const { id("blocks") }) {
            return self.segment(items);
        }
        self.dicts.push(items.to_vec());
        V::Dict(self.dicts.len() as u32 - 1)
    }
}

impl SnapshotBuilder {
    fn entry(&mut self, items: &[(V, V)], action: V) -> V {
        let f = Fields::new(items);
        let n = self.entries.len();
        let what = || format!("trace entry {n}");
        let action = match &action {
            V::Str(i) => self.actions.get(i).copied().unwrap_or(TraceAction::Other),
            other => {
                let k = self.kind(other);
                return self.fail(format!("{}: 'action' is {k}, expected a str", what()));
            }
        };
        let addr = uint_of(self, &f, const { id("addr") }, what).unwrap_or(0);
        let size = uint_of(self, &f, const { id("size") }, what).unwrap_or(0);
        let stream = uint_of(self, &f, const { id("stream") }, what).unwrap_or(0);
        let device_free = uint_of(self, &f, const { id("device_free") }, what);
        // PyTorch records microseconds since the epoch: a negative, NaN or
        // infinite time is no moment, and taken at face value it would put the
        // peak 292,000 years before the trace or every event at 0.
        let time_us = match f.get(const { id("time_us") }) {
            Some(V::Int(t)) if *t >= 0 => Some(*t),
            Some(V::Float(t)) if t.is_finite() && *t >= 0.0 && *t < i64::MAX as f64 => Some(*t as i64),
            None | Some(V::None) => None,
            Some(other) => {
                let shown = match other {
                    V::Int(t) => format!("{t}"),
                    V::UInt(t) => format!("{t}"),
                    V::Float(t) => format!("{t}"),
                    other => self.kind(other).to_string(),
                };
                return self.fail(format!(
                    "{}: 'time_us' is {shown}; expected microseconds since the epoch, a number from 0 to 2^63",
                    what()
                ));
            }
        };
        let stack = stack_of(f.get(const { id("frames") }));
        if matches!(action, TraceAction::Alloc | TraceAction::SegmentAlloc | TraceAction::SegmentMap)
            && !f.has(const { id("addr") })
        {
            return self.fail(format!("{}: a '{}' without 'addr'", what(), action.name()));
        }
        let pool_id = match f.get(const { id("pool_id") }).and_then(|v| self.list_items(v)).as_deref() {
            Some([V::Int(a), V::Int(b)]) if *a >= 0 && *b >= 0 => (*a as u64, *b as u64),
            _ => (0, 0),
        };
        self.entries.push(TraceEvent { action, addr, size, stream, time_us, device_free, stack, pool_id });
        V::Entry(n as u32)
    }

    fn block(&mut self, items: &[(V, V)]) -> V {
        let f = Fields::new(items);
        let nb = self.blocks.len();
        let what = || format!("block {nb}");
        let size = uint_of(self, &f, const { id("size") }, what).unwrap_or(0);
        // 0 marks "not given": the segment fills it in from the running sum.
        let address = uint_of(self, &f, const { id("address") }, what).unwrap_or(0);
        let state = match f.get(const { id("state") }).and_then(|v| self.text(v)) {
            Some("active_allocated") => BlockState::ActiveAllocated,
            Some("active_pending_free") | Some("active_awaiting_free") => BlockState::ActivePendingFree,
            Some("inactive") => BlockState::Inactive,
            other => {
                let shown = other.map_or("not a str".to_string(), |s| format!("{s:?}"));
                return self.fail(format!(
                    "{}: state {shown}; expected active_allocated, active_pending_free or inactive",
                    what()
                ));
            }
        };
        let mut requested_size = uint_of(self, &f, const { id("requested_size") }, what).unwrap_or(0);
        let mut stack = stack_of(f.get(const { id("frames") }));
        // PyTorch 2.0: the block's history, most recent last.
        if let Some(h) = f.get(const { id("history") }).and_then(|h| self.list_items(h)) {
            if let Some(V::Dict(d)) = h.last() {
                let d = self.dicts[*d as usize].clone();
                let hf = Fields::new(&d);
                requested_size = uint_of(self, &hf, const { id("real_size") }, what).unwrap_or(requested_size);
                stack = stack_of(hf.get(const { id("frames") }));
            }
        }
        self.blocks.push(Block { address, size, requested_size, state, stack });
        V::Block(self.blocks.len() as u32 - 1)
    }

    fn segment(&mut self, items: &[(V, V)]) -> V {
        let f = Fields::new(items);
        let ns = self.segments.len();
        let what = || format!("segment {ns}");
        let device = uint_of(self, &f, const { id("device") }, what).unwrap_or(0);
        let Ok(device) = u32::try_from(device) else {
            return self.fail(format!("{}: device {device}", what()));
        };
        let address = uint_of(self, &f, const { id("address") }, what).unwrap_or(0);
        let stream = uint_of(self, &f, const { id("stream") }, what).unwrap_or(0);
        let pool = match f.get(const { id("segment_type") }).and_then(|v| self.text(v)) {
            Some("small") => Some(PoolKind::Small),
            Some("large") => Some(PoolKind::Large),
            _ => None,
        };
        let pool_id = match f.get(const { id("segment_pool_id") }).and_then(|v| self.list_items(v)).as_deref() {
            Some([V::Int(a), V::Int(b)]) => (*a, *b),
            _ => (0, 0),
        };
        let is_expandable = matches!(f.get(const { id("is_expandable") }), Some(V::Bool(true)));
        let stack = stack_of(f.get(const { id("frames") }));
        let block_values = match f.get(const { id("blocks") }) {
            Some(v) => match self.list_items(v) {
                Some(items) => items,
                None => return self.fail(format!("{}: 'blocks' is not a list", what())),
            },
            None => Vec::new(),
        };
        if !self.copy_allowed(block_values.len() as u64, what) {
            return V::None;
        }
        let mut blocks = Vec::with_capacity(block_values.len());
        let mut at = address;
        for v in block_values {
            let V::Block(i) = v else {
                let k = self.kind(&v);
                return self.fail(format!("{}: a block is {k}, not a dict with 'size' and 'state'", what()));
            };
            let mut blk = self.blocks[i as usize].clone();
            if blk.address == 0 {
                blk.address = at;
            }
            at = blk.address.saturating_add(blk.size);
            blocks.push(blk);
        }
        let sum = blocks.iter().try_fold(0u64, |s, b| s.checked_add(b.size));
        let total_size = match (uint_of(self, &f, const { id("total_size") }, what), sum) {
            (Some(t), _) => t,
            (None, Some(sum)) => sum,
            (None, None) => return self.fail(format!("{}: its blocks' sizes add up past 2^64 bytes", what())),
        };
        self.segments.push(Segment {
            device,
            address,
            total_size,
            stream,
            pool,
            pool_id,
            is_expandable,
            blocks,
            stack,
        });
        V::Segment(self.segments.len() as u32 - 1)
    }

    /// The snapshot from the top-level value.
    fn finish(mut self, root: V) -> Result<MemorySnapshot, SnapshotError> {
        if let Some(e) = self.error.take() {
            return Err(SnapshotError::Shape(e));
        }
        let shape = |m: String| Err(SnapshotError::Shape(m));
        let (segments_v, traces_v, settings_v) = match &root {
            V::Dict(d) => {
                let d = std::mem::take(&mut self.dicts[*d as usize]);
                let f = Fields::new(&d);
                if !f.has(const { id("segments") }) && !f.has(const { id("device_traces") }) {
                    return shape("a dict without 'segments' or 'device_traces'".into());
                }
                (
                    f.get(const { id("segments") }).cloned(),
                    f.get(const { id("device_traces") }).cloned(),
                    f.get(const { id("allocator_settings") }).cloned(),
                )
            }
            // PyTorch 1.13: just the list of segments.
            V::List(_) | V::Stack(0) => (Some(root), None, None),
            other => return shape(format!("the top level is {}, not a dict", self.kind(other))),
        };
        let mut segments = Vec::new();
        if let Some(v) = segments_v {
            let Some(items) = self.list_items(&v) else {
                return shape(format!("'segments' is {}, not a list of segments", self.kind(&v)));
            };
            // A segment named twice (one dict, memoised) is copied; the last reference takes it.
            let mut refs = vec![0u32; self.segments.len()];
            for v in &items {
                if let V::Segment(s) = v {
                    refs[*s as usize] += 1;
                }
            }
            for (i, v) in items.into_iter().enumerate() {
                let V::Segment(s) = v else {
                    return shape(format!("segments[{i}] is {}, not a segment (a dict with 'blocks')", self.kind(&v)));
                };
                let s = s as usize;
                refs[s] -= 1;
                if refs[s] == 0 {
                    segments.push(std::mem::replace(&mut self.segments[s], empty_segment()));
                } else {
                    let n = self.segments[s].blocks.len() as u64 + 1;
                    if !self.copy_allowed(n, || format!("segments[{i}]")) {
                        return shape(self.error.take().unwrap_or_default());
                    }
                    segments.push(self.segments[s].clone());
                }
            }
        }
        let mut device_traces = Vec::new();
        if let Some(v) = traces_v {
            let Some(items) = self.list_items(&v) else {
                return shape(format!("'device_traces' is {}, not a list of traces", self.kind(&v)));
            };
            // Devices' lists may share entries (one list named twice): only the
            // last device that refers to the entry table may take it whole.
            let last_user = items.iter().rposition(|t| matches!(t, V::Entries(..) | V::List(_)));
            for (d, t) in items.into_iter().enumerate() {
                let copies = match t {
                    V::Entries(s, e) if !(s == 0 && e as usize == self.entries.len() && Some(d) == last_user) => {
                        (e - s) as u64
                    }
                    V::List(i) => self.lists[i as usize].len() as u64,
                    _ => 0,
                };
                if !self.copy_allowed(copies, || format!("device_traces[{d}]")) {
                    return shape(self.error.take().unwrap_or_default());
                }
                let trace: Vec<TraceEvent> = match t {
                    // One device's trace: the entry table itself, not a copy.
                    V::Entries(0, e) if e as usize == self.entries.len() && Some(d) == last_user => {
                        std::mem::take(&mut self.entries)
                    }
                    V::Entries(s, e) => self.entries[s as usize..e as usize].to_vec(),
                    V::Stack(0) => Vec::new(),
                    V::List(i) => {
                        let mut out = Vec::with_capacity(self.lists[i as usize].len());
                        for (j, e) in self.lists[i as usize].iter().enumerate() {
                            match e {
                                V::Entry(n) => out.push(self.entries[*n as usize]),
                                other => {
                                    return shape(format!(
                                        "device_traces[{d}][{j}] is {}, not a trace entry (a dict with 'action')",
                                        self.kind(other)
                                    ))
                                }
                            }
                        }
                        out
                    }
                    other => {
                        return shape(format!(
                            "device_traces[{d}] is {}, not a list of trace entries",
                            self.kind(&other)
                        ))
                    }
                };
                device_traces.push(trace);
            }
        }
        self.entries = Vec::new();
        self.blocks = Vec::new();
        let settings = match settings_v {
            Some(V::Dict(i)) => {
                let d = std::mem::take(&mut self.dicts[i as usize]);
                Some(self.settings(&d).map_err(SnapshotError::Shape)?)
            }
            None | Some(V::None) => None,
            Some(other) => return shape(format!("'allocator_settings' is {}, not a dict", self.kind(&other))),
        };
        Ok(MemorySnapshot {
            segments,
            device_traces,
            settings,
            stacks: Stacks { strings: self.strings, frames: self.frames, stacks: self.stacks },
            format: String::new(),
        })
    }
}

impl SnapshotBuilder {
    /// `allocator_settings`, each field checked: the replay runs under them,
    /// and `--snapshot-out` writes them back.
    fn settings(&self, d: &[(V, V)]) -> Result<RecordedSettings, String> {
        // The last value of a key, as Python's dict keeps it.
        let field = |k: &str| {
            d.iter().rev().find(|(kv, _)| matches!(kv, V::Str(s) if &*self.strings[*s as usize] == k)).map(|(_, v)| v)
        };
        let bad = |k: &str, v: &V, expected: &str| {
            let shown = match v {
                V::Int(i) => format!("{} ({i})", self.kind(v)),
                V::UInt(u) => format!("{} ({u})", self.kind(v)),
                V::Float(x) => format!("{} ({x})", self.kind(v)),
                _ => self.kind(v).to_string(),
            };
            Err(format!("allocator_settings['{k}'] is {shown}; expected {expected}"))
        };
        let conf = match field("PYTORCH_CUDA_ALLOC_CONF") {
            None => None,
            Some(v) => match self.text(v) {
                Some(t) => Some(t.to_string()),
                None => return bad("PYTORCH_CUDA_ALLOC_CONF", v, "a str (\"\" when unset)"),
            },
        };
        let expandable_segments = match field("expandable_segments") {
            None => None,
            Some(V::Bool(b)) => Some(*b),
            Some(v) => return bad("expandable_segments", v, "True or False"),
        };
        // PyTorch writes -1 (or SIZE_MAX) for "no limit".
        let max_split_size = match field("max_split_size") {
            None | Some(V::Int(-1)) | Some(V::UInt(u64::MAX)) => None,
            Some(V::Int(i)) if *i >= 0 => Some(*i as u64),
            Some(V::UInt(u)) => Some(*u),
            Some(v) => return bad("max_split_size", v, "bytes, or -1 for no limit"),
        };
        // A fraction of the memory limit: PyTorch accepts (0, 1) and writes 0 when unset.
        let garbage_collection_threshold = match field("garbage_collection_threshold") {
            None => None,
            Some(V::Float(x)) if (0.0..1.0).contains(x) => Some(*x),
            Some(V::Int(0)) => Some(0.0),
            Some(v) => return bad("garbage_collection_threshold", v, "a fraction from 0 up to 1"),
        };
        Ok(RecordedSettings { conf, expandable_segments, max_split_size, garbage_collection_threshold })
    }
}

fn empty_segment() -> Segment {
    Segment {
        device: 0,
        address: 0,
        total_size: 0,
        stream: 0,
        pool: None,
        pool_id: (0, 0),
        is_expandable: false,
        blocks: Vec::new(),
        stack: 0,
    }
}

// ---------------------------------------------------------------------------
// JSON: the same builder, driven by serde.

fn read_json<R: Read>(reader: R, b: &mut SnapshotBuilder) -> Result<V, SnapshotError> {
    use serde::de::DeserializeSeed;
    let mut de = serde_json::Deserializer::from_reader(reader);
    let v = Seed(b).deserialize(&mut de).map_err(SnapshotError::Json)?;
    de.end().map_err(|e| {
        // A second value after the first: one JSON object a line is headroom's trace format.
        if e.line() > 1 && e.column() <= 1 {
            SnapshotError::Shape(format!(
                "after one JSON value, another begins at line {} (JSON Lines): a headroom trace, which `headroom \
                 replay` reads; a snapshot is one JSON object (or a pickle)",
                e.line()
            ))
        } else {
            SnapshotError::Json(e)
        }
    })?;
    Ok(v)
}

struct Seed<'a>(&'a mut SnapshotBuilder);

impl<'de> serde::de::DeserializeSeed<'de> for Seed<'_> {
    type Value = V;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<V, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Seed<'_> {
    type Value = V;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<V, E> {
        Ok(V::None)
    }
    fn visit_bool<E>(self, v: bool) -> Result<V, E> {
        Ok(V::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<V, E> {
        Ok(V::Int(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<V, E> {
        Ok(i64::try_from(v).map_or(V::UInt(v), V::Int))
    }
    fn visit_f64<E>(self, v: f64) -> Result<V, E> {
        Ok(V::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<V, E> {
        Ok(self.0.str(v))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<V, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element_seed(Seed(self.0))? {
            items.push(v);
        }
        Ok(self.0.list(&items))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<V, A::Error> {
        let mut items = Vec::new();
        while let Some(k) = map.next_key_seed(Seed(self.0))? {
            let v = map.next_value_seed(Seed(self.0))?;
            items.push((k, v));
        }
        Ok(self.0.dict(&items))
    }
}
