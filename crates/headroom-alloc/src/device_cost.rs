//! What device calls cost on a GPU, for a simulated run's device time.
//!
//! The simulated device answers in nanoseconds; a GPU's driver does not. A
//! `cudaMalloc` or a mapping creates physical memory and changes the GPU's
//! page tables, an unmapping (and `cudaFree`) has to wait for the work that
//! uses the memory. A policy that saves memory by unmapping pages the next
//! step maps again pays for it in step time, which the simulator shows only
//! through these costs.
//!
//! Costs are per physical allocation ("handle"), not per byte: PyTorch's
//! expandable segments map one handle per page, and "mapping 10 separately
//! allocated 2MiB pages takes 10x time compared to mapping one 20MiB physical
//! allocation of 10 pages" (the note on expandable segments in PyTorch's
//! `c10/cuda/CUDACachingAllocator.cpp`, pull request pytorch/pytorch#96995).
//! Pages mapped as one allocation cost as one (the `headroom` policy's while
//! reserved memory climbs: `Policy::allocation_size`); whether that holds for
//! allocations of many MiB is one of the GPU checks in docs/GPU.md.
//!
//! [`DeviceCosts::PUBLISHED`] takes its figures from the one published
//! measurement of the driver's virtual-memory calls found, kvcached's
//! `benchmarks/bench_vmm` (ovg-project/kvcached, README, "Sample Output on
//! A100": one thread, 4,096 pages of 2 MB, mean per call): `cuMemCreate`
//! 193.32 µs, `cuMemMap` 1.45 µs, `cuMemSetAccess` 35.99 µs, `cuMemUnmap`
//! 25.63 µs. Mapping a page is the three first (as `headroom-cuda` and
//! PyTorch do them, page by page), 230.76 µs; unmapping it is `cuMemUnmap`
//! (`cuMemRelease`, not measured there, is left out, and so is the stream
//! synchronisation PyTorch does before it, which costs whatever work is
//! queued). A `cudaMalloc` creates, maps and grants access to one physical
//! allocation inside the driver, and a `cudaFree` unmaps and releases one,
//! so each is costed as one page's mapping or unmapping. These are an A100's
//! figures; the GPU checks in docs/GPU.md measure the same calls on the H200
//! through `headroom-cuda`.

use crate::counting::DeviceCalls;

/// Time per device call, in nanoseconds. See the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceCosts {
    /// One `cudaMalloc`.
    pub malloc_ns: u64,
    /// One `cudaFree`.
    pub free_ns: u64,
    /// One physical allocation (a page, or pages mapped as one) created, mapped
    /// and made accessible.
    pub map_page_ns: u64,
    /// One physical allocation unmapped.
    pub unmap_page_ns: u64,
}

impl DeviceCosts {
    /// The published figures (kvcached's `bench_vmm` on an A100).
    pub const PUBLISHED: DeviceCosts = DeviceCosts {
        malloc_ns: 230_760,
        free_ns: 25_630,
        map_page_ns: 193_320 + 1_450 + 35_990,
        unmap_page_ns: 25_630,
    };

    /// The device time `calls` take.
    pub fn time_ns(&self, calls: &DeviceCalls) -> u64 {
        calls.malloc * self.malloc_ns
            + calls.free * self.free_ns
            + calls.pages_mapped * self.map_page_ns
            + calls.pages_unmapped * self.unmap_page_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapping_costs_per_page_and_a_malloc_as_one() {
        let c = DeviceCosts::PUBLISHED;
        // Twenty MiB as PyTorch maps it (one 20 MiB page) and as ten 2 MiB pages.
        let one = DeviceCalls { map: 1, pages_mapped: 1, ..Default::default() };
        let ten = DeviceCalls { map: 1, pages_mapped: 10, ..Default::default() };
        assert_eq!(c.time_ns(&ten), 10 * c.time_ns(&one));
        let malloc = DeviceCalls { malloc: 1, ..Default::default() };
        assert_eq!(c.time_ns(&malloc), c.time_ns(&one));
        assert_eq!(c.time_ns(&DeviceCalls::default()), 0);
    }
}
