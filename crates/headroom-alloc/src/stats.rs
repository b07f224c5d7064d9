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
    /// Index into a [`StatArray`]'s pools: 0 = small_pool, 1 = large_pool.
    #[inline]
    pub(crate) fn pool_index(self) -> usize {
        match self {
            PoolKind::Small => 0,
            PoolKind::Large => 1,
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

/// One pool's stat, kept as its peak and the room below it (`slack`, peak less current,
/// never negative) where [`Stat`] keeps the current value: a rise then costs one
/// subtraction that sets the flags for the rare new peak, where a current value is
/// added to and compared with the peak (docs/PERFORMANCE.md, "Warm malloc + free pair,
/// twenty-first round").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct PoolStat {
    peak: i64,
    slack: i64,
    allocated: i64,
    freed: i64,
}

impl PoolStat {
    #[inline(always)]
    fn current(&self) -> i64 {
        self.peak - self.slack
    }

    #[inline(always)]
    fn stat(&self) -> Stat {
        Stat { current: self.current(), peak: self.peak, allocated: self.allocated, freed: self.freed }
    }

    #[inline(always)]
    fn increase(&mut self, n: u64) {
        self.allocated += n as i64;
        self.slack -= n as i64;
        if self.slack < 0 {
            self.raise_peak();
        }
    }

    /// Out of line and cold so that the rise stays a subtraction and a branch: written
    /// inline, the compiler made every rise a maximum with its moves.
    #[cold]
    #[inline(never)]
    fn raise_peak(&mut self) {
        self.peak -= self.slack;
        self.slack = 0;
    }

    #[inline(always)]
    fn decrease(&mut self, n: u64) {
        self.freed += n as i64;
        self.slack += n as i64;
    }
}

/// A stat for "all", "small_pool" and "large_pool" (PyTorch's `StatArray`).
///
/// Only the two pools are counted. "all" is their sum, worked out when read: its
/// current value and its totals are the pools' added, since every change goes to
/// exactly one pool. Its peak is not: the pools peak at different moments, so the
/// room below it (`all_slack`: the peak less the sum) is kept, and a rise past it
/// raises the peak. Updating "all" beside the pool cost about half of a request's
/// statistics (docs/PERFORMANCE.md, "Replay passes, nineteenth round"). Invariant
/// (checked by `validate`): `small.peak.max(large.peak) <= all.peak <= small.peak +
/// large.peak`, with both pools' currents never negative.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatArray {
    pools: [PoolStat; 2],
    all_slack: i64,
}

impl StatArray {
    /// The "all" stat: the pools' sum, and the sum's own peak.
    #[inline]
    pub fn all(&self) -> Stat {
        let [s, l] = &self.pools;
        let current = s.current() + l.current();
        Stat { current, peak: current + self.all_slack, allocated: s.allocated + l.allocated, freed: s.freed + l.freed }
    }

    /// The "small_pool" stat.
    #[inline]
    pub fn small_pool(&self) -> Stat {
        self.pools[0].stat()
    }

    /// The "large_pool" stat.
    #[inline]
    pub fn large_pool(&self) -> Stat {
        self.pools[1].stat()
    }

    /// The stat of one pool.
    #[inline]
    pub fn pool(&self, kind: PoolKind) -> Stat {
        self.pools[kind.pool_index()].stat()
    }

    /// By PyTorch's `StatType` index: 0 = all, 1 = small_pool, 2 = large_pool.
    pub fn get(&self, index: usize) -> Option<Stat> {
        match index {
            0 => Some(self.all()),
            1 => Some(self.small_pool()),
            2 => Some(self.large_pool()),
            _ => None,
        }
    }

    /// "all", "small_pool", "large_pool", in PyTorch's order.
    pub fn to_array(&self) -> [Stat; 3] {
        [self.all(), self.small_pool(), self.large_pool()]
    }

    fn reset_peak(&mut self) {
        for p in &mut self.pools {
            p.peak = p.current();
            p.slack = 0;
        }
        self.all_slack = 0;
    }

    fn reset_accumulated(&mut self) {
        for p in &mut self.pools {
            p.allocated = 0;
            p.freed = 0;
        }
    }
}

#[inline(always)]
pub(crate) fn increase(a: &mut StatArray, pool: PoolKind, n: u64) {
    a.pools[pool.pool_index()].increase(n);
    a.all_slack -= n as i64;
    if a.all_slack < 0 {
        raise_all_peak(a);
    }
}

/// As [`PoolStat::raise_peak`], for "all".
#[cold]
#[inline(never)]
fn raise_all_peak(a: &mut StatArray) {
    a.all_slack = 0;
}

#[inline(always)]
pub(crate) fn decrease(a: &mut StatArray, pool: PoolKind, n: u64) {
    a.pools[pool.pool_index()].decrease(n);
    a.all_slack += n as i64;
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
            for (pool, stat) in POOLS.iter().zip(a.to_array()) {
                for (field, v) in FIELDS.iter().zip(fields(&stat)) {
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
            a.reset_peak();
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// `torch.cuda.reset_accumulated_memory_stats()`.
    pub fn reset_accumulated(&mut self) {
        for a in self.arrays_mut() {
            a.reset_accumulated();
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

    /// "all" worked out from the pools reads as PyTorch's `StatArray` does, where
    /// "all" is a stat updated beside the pool's on every change: the same
    /// current, peak and totals after any run of changes and resets.
    #[test]
    fn all_from_the_pools_matches_all_updated_beside_them() {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut a = StatArray::default();
        let mut beside = [Stat::default(); 3];
        let mut peaked_apart = false;
        for step in 0..20_000 {
            let r = next();
            let (kind, k) = if r & 1 == 0 { (PoolKind::Small, 1) } else { (PoolKind::Large, 2) };
            let n = (r >> 8) % 1000;
            match (r >> 2) % 16 {
                0 => {
                    a.reset_peak();
                    beside.iter_mut().for_each(Stat::reset_peak);
                }
                1 => {
                    a.reset_accumulated();
                    beside.iter_mut().for_each(Stat::reset_accumulated);
                }
                2..=8 if beside[k].current >= n as i64 => {
                    decrease(&mut a, kind, n);
                    beside[0].decrease(n);
                    beside[k].decrease(n);
                }
                _ => {
                    increase(&mut a, kind, n);
                    beside[0].increase(n);
                    beside[k].increase(n);
                }
            }
            assert_eq!(a.to_array(), beside, "step {step}");
            assert_eq!((0..3).map(|i| a.get(i).unwrap()).collect::<Vec<_>>(), beside, "step {step}");
            peaked_apart |= beside[0].peak < beside[1].peak + beside[2].peak;
        }
        assert!(peaked_apart, "never a peak of \"all\" below the pools' peaks summed");
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
