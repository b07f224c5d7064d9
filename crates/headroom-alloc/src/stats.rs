//! Statistics with PyTorch's names and update rules (`torch.cuda.memory_stats()`).

use std::collections::BTreeMap;

/// One counter: current value, its peak, and the totals added and removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    pub current: i64,
    pub peak: i64,
    pub allocated: i64,
    pub freed: i64,
}

impl Stat {
    /// A branch, not a maximum written back: a run passes its peak seldom after its first
    /// steps, and ten of these go with every request (docs/PERFORMANCE.md, "Replay passes,
    /// eighteenth round").
    #[inline]
    pub(crate) fn increase(&mut self, n: u64) {
        self.current += n as i64;
        self.allocated += n as i64;
        if self.current > self.peak {
            self.peak = self.current;
        }
    }

    #[inline]
    pub(crate) fn decrease(&mut self, n: u64) {
        self.current -= n as i64;
        self.freed += n as i64;
    }

    fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// Which pool a block or segment belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PoolKind {
    /// Rounded requests up to 1 MiB, served from 2 MiB segments.
    Small,
    /// Everything larger.
    Large,
}

impl PoolKind {
    /// Index into a [`StatArray`]: 1 = small_pool, 2 = large_pool (0 is "all").
    #[inline]
    pub(crate) fn stat_index(self) -> usize {
        match self {
            PoolKind::Small => 1,
            PoolKind::Large => 2,
        }
    }

    /// PyTorch's `segment_type` string.
    pub fn name(self) -> &'static str {
        match self {
            PoolKind::Small => "small",
            PoolKind::Large => "large",
        }
    }
}

/// A stat for "all", "small_pool" and "large_pool".
pub type StatArray = [Stat; 3];

#[inline]
pub(crate) fn increase(a: &mut StatArray, pool: PoolKind, n: u64) {
    a[0].increase(n);
    a[pool.stat_index()].increase(n);
}

#[inline]
pub(crate) fn decrease(a: &mut StatArray, pool: PoolKind, n: u64) {
    a[0].decrease(n);
    a[pool.stat_index()].decrease(n);
}

/// The allocator's statistics, field for field PyTorch's `DeviceStats`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Number of allocated blocks.
    pub allocation: StatArray,
    /// Number of segments obtained with `cudaMalloc`.
    pub segment: StatArray,
    /// Allocated blocks plus blocks waiting for other streams before reuse.
    pub active: StatArray,
    /// Free blocks that cannot be released because their segment is split.
    pub inactive_split: StatArray,
    /// Bytes of allocated blocks (rounded sizes).
    pub allocated_bytes: StatArray,
    /// Bytes obtained from the device (segments and mapped pages).
    pub reserved_bytes: StatArray,
    /// Bytes of active blocks.
    pub active_bytes: StatArray,
    /// Bytes of inactive split blocks: PyTorch's "non-releasable" memory.
    pub inactive_split_bytes: StatArray,
    /// Bytes the callers asked for (unrounded) of active blocks.
    pub requested_bytes: StatArray,
    /// Allocated blocks of at least `max_split_size`.
    pub oversize_allocations: Stat,
    /// Segments of at least `max_split_size`.
    pub oversize_segments: Stat,
    /// Allocations that needed the full cache flush and a retry.
    pub num_alloc_retries: i64,
    /// Out-of-memory errors returned.
    pub num_ooms: i64,
    /// Waits for every outstanding cross-stream event.
    pub num_sync_all_streams: i64,
    /// Device allocations (`cudaMalloc` and page mappings).
    pub num_device_alloc: i64,
    /// Device frees (`cudaFree` and page unmappings).
    pub num_device_free: i64,
}

/// The nine per-pool stats, in PyTorch's key names.
pub const ARRAY_STATS: [&str; 9] = [
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
];

const POOLS: [&str; 3] = ["all", "small_pool", "large_pool"];
const FIELDS: [&str; 4] = ["current", "peak", "allocated", "freed"];

impl DeviceStats {
    /// The per-pool stat called `name` (one of [`ARRAY_STATS`]).
    pub fn array(&self, name: &str) -> Option<&StatArray> {
        Some(match name {
            "allocation" => &self.allocation,
            "segment" => &self.segment,
            "active" => &self.active,
            "inactive_split" => &self.inactive_split,
            "allocated_bytes" => &self.allocated_bytes,
            "reserved_bytes" => &self.reserved_bytes,
            "active_bytes" => &self.active_bytes,
            "inactive_split_bytes" => &self.inactive_split_bytes,
            "requested_bytes" => &self.requested_bytes,
            _ => return None,
        })
    }

    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    /// The flat dictionary `torch.cuda.memory_stats()` returns: exactly
    /// PyTorch's 122 keys, sorted. `max_split_size` is -1 when unlimited.
    pub fn to_map(&self, max_split_size: u64) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::new();
        for name in ARRAY_STATS {
            let a = self.array(name).expect("known stat");
            for (p, pool) in POOLS.iter().enumerate() {
                for (field, v) in FIELDS.iter().zip(fields(&a[p])) {
                    m.insert(format!("{name}.{pool}.{field}"), v);
                }
            }
        }
        for (name, s) in
            [("oversize_allocations", &self.oversize_allocations), ("oversize_segments", &self.oversize_segments)]
        {
            for (field, v) in FIELDS.iter().zip(fields(s)) {
                m.insert(format!("{name}.{field}"), v);
            }
        }
        m.insert("num_alloc_retries".into(), self.num_alloc_retries);
        m.insert("num_ooms".into(), self.num_ooms);
        m.insert("max_split_size".into(), if max_split_size == u64::MAX { -1 } else { max_split_size as i64 });
        m.insert("num_sync_all_streams".into(), self.num_sync_all_streams);
        m.insert("num_device_alloc".into(), self.num_device_alloc);
        m.insert("num_device_free".into(), self.num_device_free);
        m
    }

    /// `torch.cuda.reset_peak_memory_stats()`.
    pub fn reset_peak(&mut self) {
        for a in self.arrays_mut() {
            a.iter_mut().for_each(Stat::reset_peak);
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// `torch.cuda.reset_accumulated_memory_stats()`.
    pub fn reset_accumulated(&mut self) {
        for a in self.arrays_mut() {
            a.iter_mut().for_each(Stat::reset_accumulated);
        }
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }
}

fn fields(s: &Stat) -> [i64; 4] {
    [s.current, s.peak, s.allocated, s.freed]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_pytorchs_122_keys() {
        let m = DeviceStats::default().to_map(u64::MAX);
        assert_eq!(m.len(), 122);
        for k in [
            "allocation.all.current",
            "requested_bytes.large_pool.freed",
            "inactive_split_bytes.small_pool.peak",
            "oversize_segments.allocated",
            "num_device_free",
            "num_sync_all_streams",
        ] {
            assert!(m.contains_key(k), "{k}");
        }
        assert_eq!(m["max_split_size"], -1);
    }

    #[test]
    fn stat_update_rules() {
        let mut s = Stat::default();
        s.increase(10);
        s.decrease(4);
        s.increase(1);
        assert_eq!(s, Stat { current: 7, peak: 10, allocated: 11, freed: 4 });
        s.reset_peak();
        assert_eq!(s.peak, 7);
    }
}
