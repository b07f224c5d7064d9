//! # headroom-torch
//!
//! headroom's caching allocator behind the two C functions PyTorch's
//! `torch.cuda.memory.CUDAPluggableAllocator` loads from a shared library:
//!
//! ```text
//! void* headroom_malloc(size_t size, int device, cudaStream_t stream);
//! void  headroom_free(void* ptr, size_t size, int device, cudaStream_t stream);
//! ```
//!
//! the three hooks it calls for private pools (CUDA graphs, `torch.cuda.MemPool`;
//! see `pools.rs`): `headroom_begin_allocate_to_pool`,
//! `headroom_end_allocate_to_pool`, `headroom_release_pool`;
//! plus what PyTorch's own allocator offers beside them: statistics
//! (`headroom_memory_stats_json`, PyTorch's `memory_stats()` keys), history
//! and a snapshot in PyTorch's format (`headroom_record_history`,
//! `headroom_dump_snapshot`), `headroom_empty_cache`, and `headroom_ready`
//! (whether it can serve, and if not why). `python/headroom_gpu/torch_allocator.py`
//! loads it into PyTorch.
//!
//! Settings come from the environment, read once, at the first call:
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `HEADROOM_POLICY` | `pytorch`, `expandable`, `headroom`, `tight`, `lifetime` or `planned` ([`headroom_alloc::PolicyName`]) | `headroom` |
//! | `HEADROOM_ALLOC_CONF` | settings in `PYTORCH_CUDA_ALLOC_CONF` syntax | none |
//! | `HEADROOM_TORCH_BACKEND` | `cuda`, or `sim` (a simulated GPU, for tests) | `cuda` |
//! | `HEADROOM_TORCH_SIM_BYTES` | memory of each simulated GPU | 80 GiB |
//!
//! Each device has its own allocator behind its own lock, made at its first
//! request, so threads on different GPUs never wait for each other. On
//! `cuda` it runs over `headroom_cuda::CudaDevice` with PyTorch's stream
//! handles as they come; without an NVIDIA driver `headroom_ready` says so. A C
//! function never unwinds into its caller: a panic, bad input or a missing
//! backend is written to stderr once and answered with a null pointer (which
//! PyTorch reports as out of memory) or ignored (a free).

mod pools;

pub use pools::{headroom_begin_allocate_to_pool, headroom_end_allocate_to_pool, headroom_release_pool};

use headroom_alloc::units::{parse_size, GIB};
use headroom_alloc::{AllocatorConfig, CachingAllocator, DeviceMemory, NamedPolicy, PolicyName, SimDevice, Snapshot};
use headroom_cuda::{CudaDevice, Streams};
use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, OnceLock};

/// The most devices one process may address.
const MAX_DEVICES: usize = 64;

// The device behind a trait object: it is called only when the cache has no block to give.
type DeviceAllocator = CachingAllocator<Box<dyn DeviceMemory>, NamedPolicy>;

/// Where memory comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Cuda,
    /// A simulated GPU of this many bytes per device.
    Sim(u64),
}

/// The settings read from the environment, or why the plug-in cannot run.
struct Plugin {
    policy: PolicyName,
    config: AllocatorConfig,
    backend: Backend,
    /// Made at each device's first request (or why that device cannot be used); never
    /// dropped, so a reference to one needs no lock and no count.
    devices: Vec<OnceLock<Result<DeviceAllocator, String>>>,
    history: Mutex<Option<usize>>,
}

static PLUGIN: OnceLock<Result<Plugin, String>> = OnceLock::new();

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn load() -> Result<Plugin, String> {
    let policy = match env("HEADROOM_POLICY") {
        Some(p) => p.parse::<PolicyName>().map_err(|e| format!("HEADROOM_POLICY: {e}"))?,
        None => PolicyName::Headroom,
    };
    let config = AllocatorConfig::parse(&env("HEADROOM_ALLOC_CONF").unwrap_or_default())
        .map_err(|e| format!("HEADROOM_ALLOC_CONF: {e}"))?;
    let backend = match env("HEADROOM_TORCH_BACKEND").as_deref().unwrap_or("cuda") {
        "sim" => Backend::Sim(match env("HEADROOM_TORCH_SIM_BYTES") {
            Some(s) => parse_size(&s).map_err(|e| format!("HEADROOM_TORCH_SIM_BYTES: {e}"))?,
            None => 80 * GIB,
        }),
        "cuda" => {
            headroom_cuda::available()
                .map_err(|why| format!("{why}. Unload the plug-in to use PyTorch's own allocator"))?;
            Backend::Cuda
        }
        other => return Err(format!("HEADROOM_TORCH_BACKEND={other}: expected cuda or sim")),
    };
    let devices = (0..MAX_DEVICES).map(|_| OnceLock::new()).collect();
    Ok(Plugin { policy, config, backend, devices, history: Mutex::new(None) })
}

/// Says `message` on stderr, once per distinct message.
fn complain(message: &str) {
    static SAID: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let said = SAID.get_or_init(|| Mutex::new(HashSet::new()));
    if let Ok(mut s) = said.lock() {
        if s.insert(message.to_string()) {
            eprintln!("headroom-torch: {message}");
        }
    }
}

fn plugin() -> Option<&'static Plugin> {
    match PLUGIN.get_or_init(load) {
        Ok(p) => Some(p),
        Err(e) => {
            complain(e);
            None
        }
    }
}

impl Plugin {
    /// The allocator of `device`, made at its first use.
    fn device(&self, device: c_int) -> Result<&DeviceAllocator, String> {
        let i = usize::try_from(device)
            .ok()
            .filter(|&i| i < MAX_DEVICES)
            .ok_or_else(|| format!("device {device} is out of range (0 to {})", MAX_DEVICES - 1))?;
        self.devices[i]
            .get_or_init(|| {
                let device: Box<dyn DeviceMemory> = match self.backend {
                    Backend::Sim(bytes) => Box::new(SimDevice::new(bytes)),
                    // PyTorch passes its `cudaStream_t` handles.
                    Backend::Cuda => Box::new(CudaDevice::new(i as u32, Streams::Handles).map_err(|e| e.to_string())?),
                };
                let a = CachingAllocator::with_policy(device, self.config.clone(), self.policy.build());
                a.lock().record_history(self.history.lock().map(|h| *h).unwrap_or(None));
                Ok(a)
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    fn made(&self) -> impl Iterator<Item = (u32, &DeviceAllocator)> {
        self.devices
            .iter()
            .enumerate()
            .filter_map(|(i, a)| a.get().and_then(|a| a.as_ref().ok()).map(|a| (i as u32, a)))
    }
}

/// Runs `f`, turning a panic into `fallback` and a message.
fn guarded<R>(what: &str, fallback: R, f: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        complain(&format!("{what} panicked; answered as a failure"));
        fallback
    })
}

/// Whether the plug-in can serve: 1 if its settings load and its backend
/// runs, else 0 with the reason written into `buf` (`len` bytes,
/// NUL-terminated). Ask before handing PyTorch the allocator.
///
/// # Safety
/// `buf` must be valid for `len` bytes, or null with `len` 0.
#[no_mangle]
pub unsafe extern "C" fn headroom_ready(buf: *mut c_char, len: usize) -> c_int {
    guarded("headroom_ready", 0, || match PLUGIN.get_or_init(load) {
        Ok(_) => 1,
        Err(e) => {
            // SAFETY: the caller gives `len` writable bytes at `buf`.
            unsafe { copy_out(e, buf, len) };
            0
        }
    })
}

/// `CUDAPluggableAllocator`'s allocation function: `size` bytes on
/// `device` for use on `stream`. Null when out of memory or when the
/// plug-in cannot run (said on stderr).
///
/// # Safety
/// `stream` is only compared, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn headroom_malloc(size: usize, device: c_int, stream: *mut c_void) -> *mut c_void {
    guarded("headroom_malloc", std::ptr::null_mut(), || {
        let Some(p) = plugin() else { return std::ptr::null_mut() };
        let a = match p.device(device) {
            Ok(a) => a,
            Err(e) => {
                complain(&e);
                return std::ptr::null_mut();
            }
        };
        match a.malloc(size as u64, stream as u64) {
            Ok(b) => b.ptr as *mut c_void,
            Err(e) => {
                complain(e.to_string().lines().next().unwrap_or("allocation failed"));
                std::ptr::null_mut()
            }
        }
    })
}

/// `CUDAPluggableAllocator`'s free function. A pointer this plug-in did not
/// hand out is said on stderr and ignored.
///
/// # Safety
/// `ptr` and `stream` are only compared, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn headroom_free(ptr: *mut c_void, _size: usize, device: c_int, _stream: *mut c_void) {
    guarded("headroom_free", (), || {
        let Some(p) = plugin() else { return };
        match p.device(device).and_then(|a| a.free(ptr as u64).map_err(|e| e.to_string())) {
            Ok(()) => {}
            Err(e) => complain(&format!("free of {ptr:p} on device {device}: {e}")),
        }
    })
}

/// Writes `torch.cuda.memory_stats(device)` as JSON (PyTorch's keys) into
/// `buf` of `len` bytes, NUL-terminated. Returns the bytes the JSON needs
/// without the NUL (call again with a larger buffer if it is `len` or
/// more), or -1 when the plug-in cannot run or `device` is out of range.
///
/// # Safety
/// `buf` must be valid for `len` bytes, or null with `len` 0.
#[no_mangle]
pub unsafe extern "C" fn headroom_memory_stats_json(device: c_int, buf: *mut c_char, len: usize) -> isize {
    guarded("headroom_memory_stats_json", -1, || {
        let Some(p) = plugin() else { return -1 };
        let Ok(a) = p.device(device) else { return -1 };
        let text = serde_json::to_string(&a.memory_stats()).unwrap_or_default();
        // SAFETY: the caller gives `len` writable bytes at `buf`.
        unsafe { copy_out(&text, buf, len) }
    })
}

unsafe fn copy_out(text: &str, buf: *mut c_char, len: usize) -> isize {
    if !buf.is_null() && len > 0 {
        let n = text.len().min(len - 1);
        // SAFETY: `n + 1 <= len` bytes at `buf` are the caller's.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
    }
    text.len() as isize
}

/// `torch.cuda.memory._record_memory_history(max_entries=N)` for every
/// device, now and made later; 0 stops recording.
#[no_mangle]
pub extern "C" fn headroom_record_history(max_entries: usize) {
    guarded("headroom_record_history", (), || {
        let Some(p) = plugin() else { return };
        let keep = (max_entries > 0).then_some(max_entries);
        if let Ok(mut h) = p.history.lock() {
            *h = keep;
        }
        for (_, a) in p.made() {
            a.lock().record_history(keep);
        }
    })
}

/// `torch.cuda.memory._dump_snapshot(path)`: every device's segments and
/// recorded trace in PyTorch's pickle format (JSON if `path` ends in
/// `.json`), which PyTorch's viewer and `headroom inspect` open. Returns 0,
/// or -1 with the reason on stderr.
///
/// # Safety
/// `path` must be a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn headroom_dump_snapshot(path: *const c_char) -> c_int {
    guarded("headroom_dump_snapshot", -1, || {
        let Some(p) = plugin() else { return -1 };
        if path.is_null() {
            complain("headroom_dump_snapshot: no path");
            return -1;
        }
        // SAFETY: the caller passes a NUL-terminated string.
        let path = unsafe { CStr::from_ptr(path) }.to_string_lossy().into_owned();
        match dump(p, &path) {
            Ok(()) => 0,
            Err(e) => {
                complain(&format!("writing {path}: {e}"));
                -1
            }
        }
    })
}

fn dump(p: &Plugin, path: &str) -> std::io::Result<()> {
    use headroom_trace::snapshot_file::{write_snapshot, SnapshotFormat};
    let mut all = Snapshot { segments: Vec::new(), device_traces: Vec::new(), allocator_settings: Default::default() };
    for (i, a) in p.made() {
        let mut s = a.snapshot();
        for seg in &mut s.segments {
            seg.device = i;
        }
        all.allocator_settings = s.allocator_settings.clone();
        all.segments.extend(s.segments);
        if all.device_traces.len() <= i as usize {
            all.device_traces.resize_with(i as usize + 1, Vec::new);
        }
        all.device_traces[i as usize] = s.device_traces.into_iter().next().unwrap_or_default();
    }
    let mut f = std::fs::File::create(path)?;
    write_snapshot(&all, SnapshotFormat::from_path(std::path::Path::new(path)), &mut f)
}

/// `torch.cuda.empty_cache()` for every device: cached memory goes back.
#[no_mangle]
pub extern "C" fn headroom_empty_cache() {
    guarded("headroom_empty_cache", (), || {
        let Some(p) = plugin() else { return };
        for (i, a) in p.made() {
            if let Err(e) = a.empty_cache() {
                complain(&format!("empty_cache on device {i}: {e}"));
            }
        }
    })
}
