//! A snapshot as headroom holds it: each device's segments and blocks, each
//! device's trace, the stacks its entries name (interned: a stack recorded
//! on thousands of entries is stored once) and the allocator settings it
//! recorded. The records are compact — a trace entry is 64 bytes — and are
//! built as the file is read ([`crate::snapshot`]).

use headroom_alloc::{AllocatorConfig, BlockState, PoolKind, StreamId};

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
    /// Each action by PyTorch's name for it.
    pub(crate) const NAMES: [(&'static str, TraceAction); 11] = [
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
