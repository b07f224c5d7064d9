//! `SimDevice`: a simulated GPU that is a full backend, not a mock.
//!
//! It has a capacity, hands out deterministic addresses (and can be told the
//! address of the next segment, which replays of recorded runs need), maps
//! and unmaps VMM pages at a granularity, and records events on any number of
//! streams and lets the caller decide when they complete. Counting calls and
//! injecting faults are adaptors over any device: [`crate::CountingDevice`],
//! [`crate::FaultyDevice`].

use crate::device::{DeviceError, DeviceInfo, DeviceMemory, EventId, MemInfo, StreamId};
use crate::units::{GIB, MIB};
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Where simulated `cudaMalloc` addresses start (a typical CUDA device address).
const MALLOC_BASE: u64 = 0x7f00_0000_0000;
/// Where simulated VMM reservations start, far above the malloc range.
const RESERVE_BASE: u64 = 0x7e00_0000_0000;
/// `cudaMalloc` returns 2 MiB-aligned addresses for large allocations.
const MALLOC_ALIGN: u64 = 2 * MIB;

#[derive(Clone, Debug)]
struct SimEvent {
    stream: StreamId,
    complete: bool,
}

#[derive(Clone, Debug)]
struct Reservation {
    size: u64,
    /// Mapped ranges, by start: (end, page size), never overlapping. Kept as
    /// ranges, not pages, so that the simulator's cost does not grow with
    /// the number of pages a policy maps.
    pages: BTreeMap<u64, (u64, u64)>,
}

impl Reservation {
    fn mapped_pages(&self) -> u64 {
        self.pages.iter().map(|(&s, &(e, p))| (e - s) / p).sum()
    }
}

/// A simulated GPU. See the module documentation.
#[derive(Clone, Debug)]
pub struct SimDevice {
    total: u64,
    granularity: Option<u64>,
    name: String,
    used: u64,
    next_malloc: u64,
    next_reserve: u64,
    forced: VecDeque<u64>,
    forced_reserve: VecDeque<u64>,
    segments: BTreeMap<u64, u64>,
    reservations: BTreeMap<u64, Reservation>,
    events: FxHashMap<u64, SimEvent>,
    /// The events not yet complete, by stream: completing one stream's events
    /// touches only them (a replay gives every delayed free a stream of its
    /// own, and a scan of every event per completion made it quadratic).
    pending: BTreeSet<(StreamId, u64)>,
    next_event: u64,
    auto_complete: bool,
}

impl SimDevice {
    /// A device of `total_bytes` with 2 MiB VMM pages and events that stay
    /// pending until the caller completes them.
    pub fn new(total_bytes: u64) -> Self {
        SimDevice {
            total: total_bytes,
            granularity: Some(2 * MIB),
            name: format!("simulated GPU ({:.2} GiB)", total_bytes as f64 / GIB as f64),
            used: 0,
            next_malloc: MALLOC_BASE,
            next_reserve: RESERVE_BASE,
            forced: VecDeque::new(),
            forced_reserve: VecDeque::new(),
            segments: BTreeMap::new(),
            reservations: BTreeMap::new(),
            events: FxHashMap::default(),
            pending: BTreeSet::new(),
            next_event: 1,
            auto_complete: false,
        }
    }

    /// Sets the VMM granularity; `None` makes the device refuse to map pages.
    pub fn with_vmm_granularity(mut self, granularity: Option<u64>) -> Self {
        self.granularity = granularity;
        self
    }

    /// Makes every event complete as soon as it is recorded.
    pub fn with_auto_complete_events(mut self, yes: bool) -> Self {
        self.auto_complete = yes;
        self
    }

    /// The address the next `malloc` returns (queued: several may be given).
    pub fn push_next_address(&mut self, addr: u64) {
        self.forced.push_back(addr);
    }

    /// The address the next `reserve` returns (queued), as
    /// [`SimDevice::push_next_address`] does for `malloc`.
    pub fn push_next_reservation(&mut self, va: u64) {
        self.forced_reserve.push_back(va);
    }

    /// Whether `va` lies in a reservation.
    pub fn is_reserved(&self, va: u64) -> bool {
        self.reservations.range(..=va).next_back().is_some_and(|(&b, r)| va < b + r.size)
    }

    /// Whether a reservation of `size` bytes at `va` would overlap one that exists.
    pub fn reservation_overlaps(&self, va: u64, size: u64) -> bool {
        let end = va.saturating_add(size);
        self.reservations.range(..end).next_back().is_some_and(|(&b, r)| b + r.size > va)
    }

    /// Whether a segment of `size` bytes at `ptr` would overlap one that exists.
    pub fn segment_overlaps(&self, ptr: u64, size: u64) -> bool {
        let end = ptr.saturating_add(size);
        self.segments.range(..end).next_back().is_some_and(|(&b, &s)| b + s > ptr)
    }

    /// Keeps the addresses the device picks itself (segments and
    /// reservations) at or above `end`: a replay that is told the recorded
    /// run's addresses keeps its own clear of every one it may be told later.
    pub fn keep_own_addresses_above(&mut self, end: u64) {
        let up = |a: u64, align: u64| a.checked_next_multiple_of(align).unwrap_or(a);
        self.next_malloc = self.next_malloc.max(up(end, MALLOC_ALIGN));
        self.next_reserve = self.next_reserve.max(up(end, GIB));
    }

    /// Forgets the addresses given by [`SimDevice::push_next_address`] and
    /// [`SimDevice::push_next_reservation`] and not used yet.
    pub fn clear_next_addresses(&mut self) {
        self.forced.clear();
        self.forced_reserve.clear();
    }

    /// Takes `[ptr, ptr + size)` as a segment already allocated (by a run
    /// before this one), as if `malloc` had returned it. Later addresses
    /// the device picks itself are above it.
    pub fn adopt_segment(&mut self, ptr: u64, size: u64) -> Result<(), DeviceError> {
        let end = ptr.checked_add(size).filter(|_| size > 0).ok_or_else(|| address_space_exhausted(size))?;
        if self.segments.range(..end).next_back().is_some_and(|(&b, &s)| b + s > ptr) {
            return Err(DeviceError::Invalid(format!("adopted segment {ptr:#x}+{size} overlaps a live segment")));
        }
        if self.used.saturating_add(size) > self.total {
            return Err(self.oom(size));
        }
        self.used += size;
        self.segments.insert(ptr, size);
        if end > self.next_malloc {
            self.next_malloc = end.div_ceil(MALLOC_ALIGN).saturating_mul(MALLOC_ALIGN);
        }
        Ok(())
    }

    /// Takes the reservation `[va, va + size)` as one made already, with the
    /// `mapped` runs (`(address, size)`) mapped in pages of `page`, as if
    /// `reserve` and `map` had made them. Later reservations the device
    /// places itself are above it.
    pub fn adopt_reservation(
        &mut self,
        va: u64,
        size: u64,
        page: u64,
        mapped: &[(u64, u64)],
    ) -> Result<(), DeviceError> {
        let end = va.checked_add(size).filter(|_| size > 0).ok_or_else(|| address_space_exhausted(size))?;
        if self.reservation_overlaps(va, size) || self.segment_overlaps(va, size) {
            return Err(DeviceError::Invalid(format!("adopted reservation {va:#x}+{size} overlaps device memory")));
        }
        let bytes: u64 = mapped.iter().map(|r| r.1).sum();
        let inside = mapped.iter().all(|&(s, n)| s >= va && s.saturating_add(n) <= end && n % page.max(1) == 0);
        if !inside || page == 0 {
            return Err(DeviceError::Invalid(format!("adopted runs are not whole pages inside {va:#x}+{size}")));
        }
        if self.used.saturating_add(bytes) > self.total {
            return Err(self.oom(bytes));
        }
        self.used += bytes;
        let pages = mapped.iter().map(|&(s, n)| (s, (s + n, page))).collect();
        self.reservations.insert(va, Reservation { size, pages });
        self.next_reserve =
            self.next_reserve.max(end.checked_next_multiple_of(GIB).ok_or(address_space_exhausted(size))?);
        Ok(())
    }

    /// Completes every pending event.
    pub fn complete_all_events(&mut self) {
        for (_, id) in std::mem::take(&mut self.pending) {
            if let Some(e) = self.events.get_mut(&id) {
                e.complete = true;
            }
        }
    }

    /// Completes the pending events recorded on `stream`.
    pub fn complete_events_on(&mut self, stream: StreamId) {
        let ids: Vec<u64> = self.pending.range((stream, 0)..=(stream, u64::MAX)).map(|&(_, id)| id).collect();
        for id in ids {
            self.pending.remove(&(stream, id));
            if let Some(e) = self.events.get_mut(&id) {
                e.complete = true;
            }
        }
    }

    /// Number of events recorded and not yet destroyed.
    pub fn live_events(&self) -> usize {
        self.events.len()
    }

    /// Bytes of physical memory this device has handed out (segments and mapped pages).
    pub fn used_bytes(&self) -> u64 {
        self.used
    }

    fn take_allocation(&mut self, size: u64) -> Result<(), DeviceError> {
        if size > self.total {
            return Err(DeviceError::NeverFits { requested: size, total: self.total });
        }
        if self.used.saturating_add(size) > self.total {
            return Err(self.oom(size));
        }
        self.used += size;
        Ok(())
    }

    fn oom(&self, size: u64) -> DeviceError {
        DeviceError::OutOfMemory { requested: size, free: self.mem_get_info().free, total: self.total }
    }

    fn reservation_of(&mut self, va: u64, size: u64) -> Result<&mut Reservation, DeviceError> {
        let (&base, r) = self
            .reservations
            .range_mut(..=va)
            .next_back()
            .ok_or_else(|| DeviceError::Invalid(format!("{va:#x} is not in a reservation")))?;
        if va + size > base + r.size {
            return Err(DeviceError::Invalid(format!(
                "range {va:#x}+{size} runs past its reservation {base:#x}+{}",
                r.size
            )));
        }
        Ok(r)
    }
}

/// Addresses are handed out upwards and never reused, so a run that
/// allocates more than 2^64 bytes of segments over its life runs out of them.
fn address_space_exhausted(size: u64) -> DeviceError {
    DeviceError::Invalid(format!(
        "the simulated device's 64-bit address space is used up (a new range of {size} bytes does not fit)"
    ))
}

impl DeviceMemory for SimDevice {
    fn info(&self) -> DeviceInfo {
        DeviceInfo { total_bytes: self.total, vmm_granularity: self.granularity, name: self.name.clone() }
    }

    fn mem_get_info(&self) -> MemInfo {
        MemInfo { free: self.total.saturating_sub(self.used), total: self.total }
    }

    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        if size == 0 {
            return Err(DeviceError::Invalid("malloc of 0 bytes".into()));
        }
        self.take_allocation(size)?;
        let ptr = match self.forced.pop_front() {
            Some(p) => {
                let Some(end) = p.checked_add(size) else {
                    self.used -= size;
                    return Err(address_space_exhausted(size));
                };
                let overlaps = self.segments.range(..end).next_back().is_some_and(|(&b, &s)| b + s > p);
                if overlaps {
                    self.used -= size;
                    return Err(DeviceError::Invalid(format!("forced address {p:#x} overlaps a live segment")));
                }
                // The addresses the device picks itself stay above every segment it
                // placed, as above adopted ones: one picked below a forced segment could
                // run into it.
                let end = size.div_ceil(MALLOC_ALIGN).checked_mul(MALLOC_ALIGN).and_then(|s| p.checked_add(s));
                self.next_malloc = self.next_malloc.max(end.unwrap_or(u64::MAX));
                p
            }
            None => {
                let p = self.next_malloc;
                match size.div_ceil(MALLOC_ALIGN).checked_mul(MALLOC_ALIGN).and_then(|s| p.checked_add(s)) {
                    Some(next) => self.next_malloc = next,
                    None => {
                        self.used -= size;
                        return Err(address_space_exhausted(size));
                    }
                }
                p
            }
        };
        self.segments.insert(ptr, size);
        Ok(ptr)
    }

    fn free(&mut self, ptr: u64, size: u64) -> Result<(), DeviceError> {
        match self.segments.get(&ptr) {
            Some(&s) if s == size => {
                self.segments.remove(&ptr);
                self.used -= size;
                Ok(())
            }
            Some(&s) => Err(DeviceError::Invalid(format!("free of {ptr:#x} with size {size}, segment has {s}"))),
            None => Err(DeviceError::Invalid(format!("free of unknown segment {ptr:#x}"))),
        }
    }

    fn reserve(&mut self, size: u64) -> Result<u64, DeviceError> {
        let g = self.granularity.ok_or(DeviceError::Unsupported("virtual memory management"))?;
        if size == 0 || !size.is_multiple_of(g) {
            return Err(DeviceError::Invalid(format!("reservation of {size} bytes is not a multiple of {g}")));
        }
        if let Some(va) = self.forced_reserve.pop_front() {
            let overlaps = self.reservations.range(..va + size).next_back().is_some_and(|(&b, r)| b + r.size > va);
            if overlaps {
                return Err(DeviceError::Invalid(format!("forced reservation {va:#x} overlaps another")));
            }
            self.reservations.insert(va, Reservation { size, pages: BTreeMap::new() });
            let end = va.checked_add(size).and_then(|e| e.checked_next_multiple_of(GIB));
            self.next_reserve = self.next_reserve.max(end.ok_or(address_space_exhausted(size))?);
            return Ok(va);
        }
        let va = self.next_reserve;
        self.next_reserve =
            size.div_ceil(GIB).checked_mul(GIB).and_then(|s| va.checked_add(s)).ok_or(address_space_exhausted(size))?;
        self.reservations.insert(va, Reservation { size, pages: BTreeMap::new() });
        Ok(va)
    }

    fn release_reservation(&mut self, va: u64, size: u64) -> Result<(), DeviceError> {
        match self.reservations.get(&va) {
            Some(r) if r.size == size && r.pages.is_empty() => {
                self.reservations.remove(&va);
                Ok(())
            }
            Some(r) if !r.pages.is_empty() => {
                Err(DeviceError::Invalid(format!("reservation {va:#x} still has {} mapped pages", r.mapped_pages())))
            }
            _ => Err(DeviceError::Invalid(format!("no reservation {va:#x} of {size} bytes"))),
        }
    }

    fn map(&mut self, va: u64, size: u64, page: u64) -> Result<(), DeviceError> {
        let g = self.granularity.ok_or(DeviceError::Unsupported("virtual memory management"))?;
        if !page.is_multiple_of(g) || !va.is_multiple_of(g) || !size.is_multiple_of(page) || size == 0 {
            return Err(DeviceError::Invalid(format!("map of {va:#x}+{size} in pages of {page}")));
        }
        let r = self.reservation_of(va, size)?;
        if r.pages.range(..va + size).next_back().is_some_and(|(_, &(end, _))| end > va) {
            return Err(DeviceError::Invalid(format!("map of {va:#x}+{size} over mapped pages")));
        }
        self.take_allocation(size)?;
        let r = self.reservation_of(va, size)?;
        r.pages.insert(va, (va + size, page));
        Ok(())
    }

    fn unmap(&mut self, va: u64, size: u64, _page: u64, _stream: StreamId) -> Result<(), DeviceError> {
        let r = self.reservation_of(va, size)?;
        let end = va + size;
        // The mapped ranges that meet [va, end), which must cover it without a gap.
        let first = r.pages.range(..=va).next_back().filter(|(_, &(e, _))| e > va).map(|(&s, _)| s).unwrap_or(va);
        let hit: Vec<(u64, u64, u64)> = r.pages.range(first..end).map(|(&s, &(e, p))| (s, e, p)).collect();
        let mut at = va;
        for &(s, e, _) in &hit {
            if s > at {
                break;
            }
            at = at.max(e);
        }
        if hit.is_empty() || hit[0].0 > va || at < end {
            return Err(DeviceError::Invalid(format!("unmap of {va:#x}+{size}: not every page is mapped")));
        }
        // A physical allocation is unmapped whole: the range may not cut one.
        let cuts = |&(s, e, p): &(u64, u64, u64)| {
            (s < va && !(va - s).is_multiple_of(p)) || (e > end && !(end - s).is_multiple_of(p))
        };
        if hit.iter().any(cuts) {
            return Err(DeviceError::Invalid(format!("unmap of {va:#x}+{size} cuts a physical allocation")));
        }
        for (s, e, p) in hit {
            r.pages.remove(&s);
            if s < va {
                r.pages.insert(s, (va, p));
            }
            if e > end {
                r.pages.insert(end, (e, p));
            }
        }
        self.used -= size;
        Ok(())
    }

    fn record_event(&mut self, stream: StreamId) -> Result<EventId, DeviceError> {
        let id = self.next_event;
        self.next_event += 1;
        self.events.insert(id, SimEvent { stream, complete: self.auto_complete });
        if !self.auto_complete {
            self.pending.insert((stream, id));
        }
        Ok(EventId(id))
    }

    fn query_event(&mut self, event: EventId) -> Result<bool, DeviceError> {
        self.events
            .get(&event.0)
            .map(|e| e.complete)
            .ok_or_else(|| DeviceError::Invalid(format!("query of unknown event {}", event.0)))
    }

    fn synchronize_event(&mut self, event: EventId) -> Result<(), DeviceError> {
        let e = self
            .events
            .get_mut(&event.0)
            .ok_or_else(|| DeviceError::Invalid(format!("synchronize of unknown event {}", event.0)))?;
        e.complete = true;
        self.pending.remove(&(e.stream, event.0));
        Ok(())
    }

    fn destroy_event(&mut self, event: EventId) {
        if let Some(e) = self.events.remove(&event.0) {
            self.pending.remove(&(e.stream, event.0));
        }
    }

    fn synchronize(&mut self) -> Result<(), DeviceError> {
        self.complete_all_events();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_deterministic_and_can_be_forced() {
        let mut a = SimDevice::new(GIB);
        let mut b = SimDevice::new(GIB);
        for s in [2 * MIB, 20 * MIB, 3 * MIB] {
            assert_eq!(a.malloc(s).unwrap(), b.malloc(s).unwrap());
        }
        a.push_next_address(0x1000_0000);
        assert_eq!(a.malloc(2 * MIB).unwrap(), 0x1000_0000);
        a.push_next_address(0x1000_0000 + MIB);
        assert!(matches!(a.malloc(2 * MIB), Err(DeviceError::Invalid(_))));
    }

    /// A segment the device places itself never lands on one placed at a forced
    /// address above its own (found by fuzzing a snapshot whose trace forced one there).
    #[test]
    fn its_own_addresses_stay_clear_of_forced_ones() {
        let mut d = SimDevice::new(GIB);
        let first = d.malloc(2 * MIB).unwrap();
        let forced = first + 4 * MIB;
        d.push_next_address(forced);
        assert_eq!(d.malloc(20 * MIB).unwrap(), forced);
        let own = d.malloc(20 * MIB).unwrap();
        assert!(own >= forced + 20 * MIB, "{own:#x} overlaps the forced segment at {forced:#x}");
        // A forced address too near the top of the address space for the segment is refused.
        d.push_next_address(u64::MAX - MIB);
        assert!(d.malloc(2 * MIB).is_err());
        assert!(d.malloc(2 * MIB).is_ok());
    }

    #[test]
    fn capacity() {
        let mut d = SimDevice::new(100 * MIB);
        assert!(matches!(d.malloc(101 * MIB), Err(DeviceError::NeverFits { .. })));
        let p = d.malloc(60 * MIB).unwrap();
        assert!(matches!(d.malloc(60 * MIB), Err(DeviceError::OutOfMemory { free, .. }) if free == 40 * MIB));
        d.free(p, 60 * MIB).unwrap();
        assert_eq!(d.used_bytes(), 0);
    }

    #[test]
    fn pages_map_and_unmap_within_reservations() {
        let mut d = SimDevice::new(100 * MIB);
        let va = d.reserve(64 * MIB).unwrap();
        d.map(va, 40 * MIB, 20 * MIB).unwrap();
        assert_eq!(d.mem_get_info().free, 60 * MIB);
        assert!(d.map(va + 20 * MIB, 20 * MIB, 20 * MIB).is_err(), "double map");
        assert!(d.release_reservation(va, 64 * MIB).is_err(), "pages still mapped");
        d.unmap(va, 20 * MIB, 20 * MIB, 0).unwrap();
        d.unmap(va + 20 * MIB, 20 * MIB, 20 * MIB, 0).unwrap();
        d.release_reservation(va, 64 * MIB).unwrap();
        assert_eq!(d.used_bytes(), 0);
    }

    #[test]
    fn a_physical_allocation_is_unmapped_whole() {
        let mut d = SimDevice::new(100 * MIB);
        let va = d.reserve(64 * MIB).unwrap();
        // One allocation of 20 MiB, then ten of 2 MiB after it.
        d.map(va, 20 * MIB, 20 * MIB).unwrap();
        d.map(va + 20 * MIB, 20 * MIB, 2 * MIB).unwrap();
        let e = d.unmap(va + 18 * MIB, 4 * MIB, 2 * MIB, 0).unwrap_err();
        assert!(e.to_string().contains("cuts a physical allocation"), "{e}");
        d.unmap(va + 22 * MIB, 4 * MIB, 2 * MIB, 0).unwrap();
        d.unmap(va, 20 * MIB, 20 * MIB, 0).unwrap();
        assert_eq!(d.used_bytes(), 16 * MIB);
    }

    #[test]
    fn unmapping_splits_mapped_ranges_and_refuses_gaps() {
        let mut d = SimDevice::new(100 * MIB);
        let va = d.reserve(64 * MIB).unwrap();
        d.map(va, 16 * MIB, 2 * MIB).unwrap();
        d.map(va + 16 * MIB, 8 * MIB, 2 * MIB).unwrap();
        // Across the two mappings, leaving a piece of each.
        d.unmap(va + 10 * MIB, 8 * MIB, 2 * MIB, 0).unwrap();
        assert_eq!(d.used_bytes(), 16 * MIB);
        assert!(d.unmap(va + 8 * MIB, 4 * MIB, 2 * MIB, 0).is_err(), "half of it is no longer mapped");
        assert!(d.map(va + 8 * MIB, 4 * MIB, 2 * MIB).is_err(), "half of it is still mapped");
        d.map(va + 10 * MIB, 8 * MIB, 2 * MIB).unwrap();
        let e = d.release_reservation(va, 64 * MIB).unwrap_err();
        assert!(e.to_string().contains("12 mapped pages"), "{e}");
        d.unmap(va, 24 * MIB, 2 * MIB, 0).unwrap();
        d.release_reservation(va, 64 * MIB).unwrap();
        assert_eq!(d.used_bytes(), 0);
    }

    #[test]
    fn events_complete_when_told() {
        let mut d = SimDevice::new(GIB);
        let a = d.record_event(1).unwrap();
        let b = d.record_event(2).unwrap();
        assert!(!d.query_event(a).unwrap());
        d.complete_events_on(1);
        assert!(d.query_event(a).unwrap());
        assert!(!d.query_event(b).unwrap());
        d.synchronize_event(b).unwrap();
        assert!(d.query_event(b).unwrap());
    }
}
