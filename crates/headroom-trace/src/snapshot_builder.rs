//! Compact records as a snapshot file is read. The pickle machine
//! ([`crate::pickle`]) and the JSON reader (`snapshot_json.rs`) hand every
//! value to [`SnapshotBuilder`]: the containers that are snapshot records
//! (trace entries, frames, stacks, blocks, segments) become records at once,
//! and the rest stay generic (few: the top level, the settings), so a trace
//! entry costs 64 bytes whatever its size in the file.

use crate::memory_snapshot::{
    Block, Frame, MemorySnapshot, RecordedSettings, Segment, StackId, Stacks, TraceAction, TraceEvent,
};
use crate::pickle::{Builder, PickleError};
use crate::prefault::Prefault;
use headroom_alloc::{BlockState, PoolKind};
use rustc_hash::FxHashMap;
use std::io;

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

/// A value under construction. Containers that are snapshot records become
/// records at once; the rest stay generic (few: the top level, settings).
#[derive(Clone, Copy, Debug)]
#[repr(u64)]
pub(crate) enum V {
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

/// Files smaller than this are read without a [`Prefault`]: their faults are few.
const PREFAULT_FROM: u64 = 16 << 20;

/// Bytes of the file the entry table is reserved by, one entry for each: PyTorch's entries
/// (action, address, size, stream, time and frames, their keys memo fetches) take 70 or more
/// in a pickle, so a recorded trace fits with room to spare, and only address space is
/// reserved, not memory. A file of smaller entries outgrows it, and the table then grows as
/// it is read.
const FILE_BYTES_AN_ENTRY: u64 = 32;

/// Entries between the reports to the [`Prefault`] of how far the table is written.
const ENTRIES_A_STRIDE: usize = crate::prefault::STRIDE / std::mem::size_of::<TraceEvent>();

/// The tables of records and generic containers read so far.
pub(crate) struct SnapshotBuilder {
    /// The entry table's pages made present ahead of its writes ([`SnapshotBuilder::expect_bytes`]);
    /// first, so it stops before the table is dropped.
    prefault: Option<Prefault>,
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
    /// Action by string id, for the strings that name one: interned first,
    /// so their ids are small and a vector indexes them (one per entry).
    actions: Vec<Option<TraceAction>>,
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
    pub(crate) fn new() -> Self {
        let mut b = SnapshotBuilder {
            prefault: None,
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
            actions: Vec::new(),
            error: None,
            items_read: 0,
            copied: 0,
        };
        for k in KNOWN {
            b.intern(k);
        }
        for (name, action) in TraceAction::NAMES {
            let i = b.intern(name);
            let i = i as usize;
            if b.actions.len() <= i {
                b.actions.resize(i + 1, None);
            }
            b.actions[i] = Some(action);
        }
        b
    }

    /// A pickle of `file_bytes` is to be read: the entry table is reserved for the most
    /// entries a file that long can hold, and its pages are made present ahead of the
    /// entries on a thread of their own ([`Prefault`]) where the file is large enough for
    /// that to matter. A reservation the system refuses is no error: the table then grows
    /// as it is read, as without this.
    pub(crate) fn expect_bytes(&mut self, file_bytes: u64) {
        if file_bytes >= PREFAULT_FROM {
            self.reserve_entries(usize::try_from(file_bytes / FILE_BYTES_AN_ENTRY).unwrap_or(usize::MAX));
        }
    }

    /// Room for `most` entries, made present ahead of the entries written.
    pub(crate) fn reserve_entries(&mut self, most: usize) {
        if self.entries.is_empty() && self.prefault.is_none() && self.entries.try_reserve_exact(most).is_ok() {
            self.prefault = Prefault::ahead_of(&self.entries);
        }
    }

    /// The entry table grows (and moves) on the next push: the prefault, which holds its
    /// range, stops first.
    #[cold]
    fn entries_full(&mut self) {
        self.prefault = None;
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
/// Inline: a trace entry reads four, and nearly all are plain ints.
#[inline]
fn uint_of(b: &mut SnapshotBuilder, f: &Fields, k: u32, what: impl Fn() -> String) -> Option<u64> {
    match f.get(k) {
        Some(V::Int(i)) if *i >= 0 => Some(*i as u64),
        Some(V::UInt(u)) => Some(*u),
        Some(V::Bool(x)) => Some(*x as u64),
        None => None,
        Some(other) => not_uint(b, k, other, &what),
    }
}

#[cold]
#[inline(never)]
fn not_uint(b: &mut SnapshotBuilder, k: u32, other: &V, what: &dyn Fn() -> String) -> Option<u64> {
    let key = KNOWN[k as usize];
    let kind = b.kind(other);
    let shown = match other {
        V::Int(i) => format!("{kind} ({i})"),
        _ => kind.to_string(),
    };
    b.fail(format!("{}: '{key}' is {shown}, expected an int of at least 0", what()));
    None
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
            return self.entry(&f, *action);
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
            return self.block(&f);
        }
        if f.has(const { id("blocks") }) {
            return self.segment(&f);
        }
        self.dicts.push(items.to_vec());
        V::Dict(self.dicts.len() as u32 - 1)
    }
}

impl SnapshotBuilder {
    fn entry(&mut self, f: &Fields, action: V) -> V {
        let n = self.entries.len();
        let what = || format!("trace entry {n}");
        let action = match &action {
            V::Str(i) => self.actions.get(*i as usize).copied().flatten().unwrap_or(TraceAction::Other),
            other => {
                let k = self.kind(other);
                return self.fail(format!("{}: 'action' is {k}, expected a str", what()));
            }
        };
        let addr = uint_of(self, f, const { id("addr") }, what).unwrap_or(0);
        let size = uint_of(self, f, const { id("size") }, what).unwrap_or(0);
        let stream = uint_of(self, f, const { id("stream") }, what).unwrap_or(0);
        let device_free = uint_of(self, f, const { id("device_free") }, what);
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
        if self.prefault.is_some() {
            if n == self.entries.capacity() {
                self.entries_full();
            } else if n.is_multiple_of(ENTRIES_A_STRIDE) {
                if let Some(p) = &self.prefault {
                    p.written(n * std::mem::size_of::<TraceEvent>());
                }
            }
        }
        self.entries.push(TraceEvent { action, addr, size, stream, time_us, device_free, stack, pool_id });
        V::Entry(n as u32)
    }

    fn block(&mut self, f: &Fields) -> V {
        let nb = self.blocks.len();
        let what = || format!("block {nb}");
        let size = uint_of(self, f, const { id("size") }, what).unwrap_or(0);
        // 0 marks "not given": the segment fills it in from the running sum.
        let address = uint_of(self, f, const { id("address") }, what).unwrap_or(0);
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
        let mut requested_size = uint_of(self, f, const { id("requested_size") }, what).unwrap_or(0);
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

    fn segment(&mut self, f: &Fields) -> V {
        let ns = self.segments.len();
        let what = || format!("segment {ns}");
        let device = uint_of(self, f, const { id("device") }, what).unwrap_or(0);
        let Ok(device) = u32::try_from(device) else {
            return self.fail(format!("{}: device {device}", what()));
        };
        let address = uint_of(self, f, const { id("address") }, what).unwrap_or(0);
        let stream = uint_of(self, f, const { id("stream") }, what).unwrap_or(0);
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
        let total_size = match (uint_of(self, f, const { id("total_size") }, what), sum) {
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
    pub(crate) fn finish(mut self, root: V) -> Result<MemorySnapshot, SnapshotError> {
        if self.prefault.take().is_some() {
            // The reservation was for the most entries the file could hold: what was not
            // used goes back, with the pages made present beyond the last entry.
            self.entries.shrink_to_fit();
        }
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
