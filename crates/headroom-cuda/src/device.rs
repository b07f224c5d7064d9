//! [`CudaDevice`]: one GPU as the caching allocator's segment source.

use crate::driver::{available, backend, describe, is, Unavailable};
use cudarc::driver::result::{self, stream::StreamKind};
use cudarc::driver::sys;
use headroom_alloc::{DeviceError, DeviceInfo, DeviceMemory, EventId, MemInfo, StreamId};
use std::collections::HashMap;

/// What a [`StreamId`] names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Streams {
    /// A label from a trace: each distinct value gets a stream of its own, made on first use
    /// (0 is the legacy default stream). For replays, whose stream numbers were handles in
    /// another process.
    Labels,
    /// The integer value of a `cudaStream_t` of this process (PyTorch's plug-in interface
    /// passes its streams so).
    Handles,
}

/// One GPU, through the driver API. Every call makes the device's primary
/// context current on the calling thread first, so the value may move
/// between threads.
pub struct CudaDevice {
    ordinal: u32,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    info: DeviceInfo,
    /// Physical pages: pinned memory on this device.
    prop: sys::CUmemAllocationProp,
    /// The physical allocation behind each mapped page and the page's size, by its address.
    pages: HashMap<u64, (sys::CUmemGenericAllocationHandle, u64)>,
    streams: Streams,
    own_streams: HashMap<StreamId, sys::CUstream>,
    /// Recorded events by `EventId`; a slot is `None` once destroyed.
    events: Vec<Option<sys::CUevent>>,
    free_slots: Vec<usize>,
    /// Destroyed events kept for reuse: creating one is a driver call.
    spare_events: Vec<sys::CUevent>,
}

// SAFETY: the context, stream and event handles are process-wide identifiers that the driver
// accepts from any thread once the context is current there, which every method ensures
// (`bind`). `&mut self` keeps calls on one value from overlapping.
unsafe impl Send for CudaDevice {}

impl CudaDevice {
    /// Device `ordinal`, its stream numbers read as `streams` says.
    pub fn new(ordinal: u32, streams: Streams) -> Result<CudaDevice, Unavailable> {
        let count = available()?;
        if ordinal >= count {
            return Err(Unavailable::NoDevice { ordinal, count });
        }
        let setup = |call: &'static str| move |e| Unavailable::Setup { ordinal, call, error: describe(e) };
        let dev = result::device::get(ordinal as i32).map_err(setup("cuDeviceGet"))?;
        // SAFETY: `dev` is a valid device; the retain is undone in `Drop`.
        let ctx = unsafe { result::primary_ctx::retain(dev) }.map_err(setup("cuDevicePrimaryCtxRetain"))?;
        // SAFETY: `ctx` was just retained.
        unsafe { result::ctx::set_current(ctx) }.map_err(setup("cuCtxSetCurrent"))?;
        // SAFETY: `dev` is valid and its context current.
        let total = unsafe { result::device::total_mem(dev) }.map_err(setup("cuDeviceTotalMem"))? as u64;
        let name = result::device::get_name(dev).map_err(setup("cuDeviceGetName"))?;
        // SAFETY: a plain attribute query of a valid device.
        let vmm = unsafe {
            result::device::get_attribute(
                dev,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            )
        }
        .unwrap_or(0)
            > 0;
        // SAFETY: every field of the C struct is an integer, an enum whose 0 is valid, or a
        // pointer; zero is its documented default before the fields below are set.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = ordinal as i32;
        let granularity = vmm
            .then(|| {
                let mut g = 0usize;
                // SAFETY: `prop` describes this device's pinned memory; `g` receives the answer.
                unsafe {
                    sys::cuMemGetAllocationGranularity(
                        &mut g,
                        &prop,
                        sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                    )
                }
                .result()
                .ok()
                .map(|_| g as u64)
            })
            .flatten();
        Ok(CudaDevice {
            ordinal,
            dev,
            ctx,
            info: DeviceInfo { total_bytes: total, vmm_granularity: granularity, name },
            prop,
            pages: HashMap::new(),
            streams,
            own_streams: HashMap::new(),
            events: Vec::new(),
            free_slots: Vec::new(),
            spare_events: Vec::new(),
        })
    }

    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// Makes the device's context current on this thread.
    pub(crate) fn bind(&self) -> Result<(), DeviceError> {
        // SAFETY: `ctx` stays retained for the value's life.
        unsafe { result::ctx::set_current(self.ctx) }.map_err(|e| backend("cuCtxSetCurrent", e))
    }

    /// The driver's stream for `id`.
    pub(crate) fn stream(&mut self, id: StreamId) -> Result<sys::CUstream, DeviceError> {
        self.bind()?;
        match self.streams {
            Streams::Handles => Ok(id as usize as sys::CUstream),
            Streams::Labels if id == 0 => Ok(result::stream::null()),
            Streams::Labels => match self.own_streams.get(&id) {
                Some(&s) => Ok(s),
                None => {
                    let s =
                        result::stream::create(StreamKind::NonBlocking).map_err(|e| backend("cuStreamCreate", e))?;
                    self.own_streams.insert(id, s);
                    Ok(s)
                }
            },
        }
    }

    /// What a failed request of `size` bytes is: the device is full now, or never could hold it.
    fn out_of_memory(&self, size: u64) -> DeviceError {
        let MemInfo { free, total } = self.mem_get_info();
        if size > total {
            DeviceError::NeverFits { requested: size, total }
        } else {
            DeviceError::OutOfMemory { requested: size, free, total }
        }
    }

    fn event(&self, id: EventId) -> Result<sys::CUevent, DeviceError> {
        self.events
            .get(id.0 as usize)
            .copied()
            .flatten()
            .ok_or_else(|| DeviceError::Invalid(format!("event {} is not recorded", id.0)))
    }

    /// Creates, maps and opens one page at `addr`; nothing stays behind on failure.
    fn map_page(&mut self, addr: u64, page: u64) -> Result<(), DeviceError> {
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `prop` describes this device's memory; `handle` receives the allocation.
        match unsafe { sys::cuMemCreate(&mut handle, page as usize, &self.prop, 0) }.result() {
            Ok(()) => {}
            Err(e) if is(&e, sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY) => return Err(self.out_of_memory(page)),
            Err(e) => return Err(backend("cuMemCreate", e)),
        }
        // SAFETY: `addr` lies in a reservation of the caller's, unmapped (the allocator's
        // invariant), and `handle` is a fresh allocation of `page` bytes.
        if let Err(e) = unsafe { sys::cuMemMap(addr, page as usize, 0, handle, 0) }.result() {
            // SAFETY: `handle` was created above and is mapped nowhere.
            let _ = unsafe { sys::cuMemRelease(handle) };
            return Err(backend("cuMemMap", e));
        }
        let access = sys::CUmemAccessDesc {
            location: self.prop.location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: `[addr, addr + page)` was just mapped; one descriptor is passed.
        if let Err(e) = unsafe { sys::cuMemSetAccess(addr, page as usize, &access, 1) }.result() {
            // SAFETY: undoes the map and create above.
            unsafe {
                let _ = sys::cuMemUnmap(addr, page as usize);
                let _ = sys::cuMemRelease(handle);
            }
            return Err(backend("cuMemSetAccess", e));
        }
        self.pages.insert(addr, (handle, page));
        Ok(())
    }

    /// Unmaps and releases the pages of `[va, va + size)`.
    fn unmap_pages(&mut self, va: u64, size: u64, page: u64) -> Result<(), DeviceError> {
        for addr in (va..va + size).step_by(page as usize) {
            let (handle, _) = self
                .pages
                .remove(&addr)
                .ok_or_else(|| DeviceError::Invalid(format!("no page is mapped at {addr:#x}")))?;
            // SAFETY: `addr` holds the page mapped by `map_page` with `handle`; the caller has
            // waited for the work that used it.
            unsafe { sys::cuMemUnmap(addr, page as usize) }.result().map_err(|e| backend("cuMemUnmap", e))?;
            // SAFETY: the handle is now mapped nowhere.
            unsafe { sys::cuMemRelease(handle) }.result().map_err(|e| backend("cuMemRelease", e))?;
        }
        Ok(())
    }
}

impl DeviceMemory for CudaDevice {
    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn mem_get_info(&self) -> MemInfo {
        let total = self.info.total_bytes;
        if self.bind().is_err() {
            return MemInfo { free: 0, total };
        }
        match result::mem_get_info() {
            Ok((free, total)) => MemInfo { free: free as u64, total: total as u64 },
            Err(_) => MemInfo { free: 0, total },
        }
    }

    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        if size == 0 {
            return Err(DeviceError::Invalid("malloc of 0 bytes".into()));
        }
        self.bind()?;
        // SAFETY: a plain allocation; the pointer is returned to the caller, who frees it.
        match unsafe { result::malloc_sync(size as usize) } {
            Ok(ptr) => Ok(ptr),
            Err(e) if is(&e, sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY) => Err(self.out_of_memory(size)),
            Err(e) => Err(backend("cuMemAlloc", e)),
        }
    }

    fn free(&mut self, ptr: u64, _size: u64) -> Result<(), DeviceError> {
        self.bind()?;
        // SAFETY: `ptr` came from `malloc` and is freed once (the allocator's invariant);
        // cuMemFree waits for the work that uses it, as cudaFree does.
        unsafe { result::free_sync(ptr) }.map_err(|e| backend("cuMemFree", e))
    }

    fn reserve(&mut self, size: u64) -> Result<u64, DeviceError> {
        self.bind()?;
        let mut va: sys::CUdeviceptr = 0;
        // SAFETY: reserves address space only; `va` receives its start.
        match unsafe { sys::cuMemAddressReserve(&mut va, size as usize, 0, 0, 0) }.result() {
            Ok(()) => Ok(va),
            Err(e) if is(&e, sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY) => Err(self.out_of_memory(size)),
            Err(e) => Err(backend("cuMemAddressReserve", e)),
        }
    }

    fn release_reservation(&mut self, va: u64, size: u64) -> Result<(), DeviceError> {
        self.bind()?;
        // SAFETY: a reservation from `reserve` whose pages are all unmapped (the trait's contract).
        unsafe { sys::cuMemAddressFree(va, size as usize) }.result().map_err(|e| backend("cuMemAddressFree", e))
    }

    fn map(&mut self, va: u64, size: u64, page: u64) -> Result<(), DeviceError> {
        if page == 0 || !size.is_multiple_of(page) {
            return Err(DeviceError::Invalid(format!("map of {size} bytes in pages of {page}")));
        }
        self.bind()?;
        for addr in (va..va + size).step_by(page as usize) {
            if let Err(e) = self.map_page(addr, page) {
                // All or nothing: the pages this call mapped go again.
                let _ = self.unmap_pages(va, addr - va, page);
                return Err(e);
            }
        }
        Ok(())
    }

    fn unmap(&mut self, va: u64, size: u64, page: u64, stream: StreamId) -> Result<(), DeviceError> {
        if page == 0 || !size.is_multiple_of(page) {
            return Err(DeviceError::Invalid(format!("unmap of {size} bytes in pages of {page}")));
        }
        let s = self.stream(stream)?;
        // SAFETY: `s` is a stream of this context. The pages may still be in use by work
        // queued on it: wait for that, as PyTorch does before unmapping.
        unsafe { result::stream::synchronize(s) }.map_err(|e| backend("cuStreamSynchronize", e))?;
        self.unmap_pages(va, size, page)
    }

    fn record_event(&mut self, stream: StreamId) -> Result<EventId, DeviceError> {
        let s = self.stream(stream)?;
        let event = match self.spare_events.pop() {
            Some(e) => e,
            None => result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .map_err(|e| backend("cuEventCreate", e))?,
        };
        // SAFETY: `event` is a live event of this context and `s` one of its streams.
        if let Err(e) = unsafe { result::event::record(event, s) } {
            self.spare_events.push(event);
            return Err(backend("cuEventRecord", e));
        }
        let slot = match self.free_slots.pop() {
            Some(i) => {
                self.events[i] = Some(event);
                i
            }
            None => {
                self.events.push(Some(event));
                self.events.len() - 1
            }
        };
        Ok(EventId(slot as u64))
    }

    fn query_event(&mut self, id: EventId) -> Result<bool, DeviceError> {
        let event = self.event(id)?;
        self.bind()?;
        // SAFETY: a recorded, live event.
        match unsafe { result::event::query(event) } {
            Ok(()) => Ok(true),
            Err(e) if is(&e, sys::CUresult::CUDA_ERROR_NOT_READY) => Ok(false),
            Err(e) => Err(backend("cuEventQuery", e)),
        }
    }

    fn synchronize_event(&mut self, id: EventId) -> Result<(), DeviceError> {
        let event = self.event(id)?;
        self.bind()?;
        // SAFETY: a recorded, live event.
        unsafe { result::event::synchronize(event) }.map_err(|e| backend("cuEventSynchronize", e))
    }

    fn destroy_event(&mut self, id: EventId) {
        let i = id.0 as usize;
        if let Some(event) = self.events.get_mut(i).and_then(Option::take) {
            self.spare_events.push(event);
            self.free_slots.push(i);
        }
    }

    fn synchronize(&mut self) -> Result<(), DeviceError> {
        self.bind()?;
        result::ctx::synchronize().map_err(|e| backend("cuCtxSynchronize", e))
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        if self.bind().is_err() {
            return;
        }
        let _ = result::ctx::synchronize();
        // SAFETY: each handle below belongs to this context and is released once; the
        // device's work has finished.
        unsafe {
            for event in self.events.drain(..).flatten().chain(self.spare_events.drain(..)) {
                let _ = result::event::destroy(event);
            }
            for (_, s) in self.own_streams.drain() {
                let _ = result::stream::destroy(s);
            }
            // Pages still mapped (an allocator dropped without releasing its segments).
            for (addr, (handle, page)) in self.pages.drain() {
                let _ = sys::cuMemUnmap(addr, page as usize);
                let _ = sys::cuMemRelease(handle);
            }
            let _ = result::primary_ctx::release(self.dev);
        }
    }
}
