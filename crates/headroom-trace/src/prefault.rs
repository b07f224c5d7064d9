//! A vector's pages made present ahead of its writer, on a thread of its own.
//!
//! Memory a process touches for the first time costs a page fault per page, paid by the
//! thread that touches it: the kernel finds a page, clears it and maps it. Reading a
//! snapshot of a million trace entries writes some 86 MB of records into pages nothing has
//! touched, and those faults were a third of the reading thread's time, while the second
//! core waited for the file to be read (docs/PERFORMANCE.md, "`inspect`, ninth round").
//! A [`Prefault`] asks the kernel (`MADV_POPULATE_WRITE`, Linux 5.14 and later) to map the
//! pages of a vector's reserved capacity a few megabytes ahead of where it is written, on
//! the otherwise idle core, so the writer finds them present. Where the kernel refuses, or
//! on other systems, nothing is prefaulted and the writer faults as before.
//!
//! Populating a page changes nothing a program can read: a page not yet present is mapped
//! zero-filled, as the writer's own fault would map it, and a present one is left as it is.
//! The one duty is that the range stays the vector's while the thread may still populate
//! it: the vector may not grow (move) or be dropped until the [`Prefault`] is dropped, which
//! stops and joins the thread.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// How far ahead of the writer pages are made present: far enough that the thread, woken
/// once a [`STRIDE`], stays ahead of a writer that also parses; near enough that the pages
/// present beyond the vector's end when writing stops are few.
const AHEAD: usize = 8 << 20;

/// How often, in bytes written, the writer tells the thread how far it has come.
pub(crate) const STRIDE: usize = 1 << 20;

/// See the module documentation.
pub(crate) struct Prefault {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    /// Bytes of the range written so far.
    written: AtomicUsize,
    stop: AtomicBool,
}

impl Prefault {
    /// Begins making `vec`'s spare capacity present ahead of its writes; `None` where this
    /// system cannot (the writer then faults its pages itself). `vec` may not grow or be
    /// dropped until the returned value is.
    pub(crate) fn ahead_of<T>(vec: &Vec<T>) -> Option<Prefault> {
        let size = std::mem::size_of::<T>();
        let start = vec.as_ptr() as usize + vec.len() * size;
        let end = vec.as_ptr() as usize + vec.capacity() * size;
        Prefault::range(start, end)
    }

    #[cfg(target_os = "linux")]
    fn range(start: usize, end: usize) -> Option<Prefault> {
        // SAFETY: sysconf reads a constant of the system.
        let page =
            usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok().filter(|p| p.is_power_of_two())?;
        if end <= start + page {
            return None;
        }
        let shared = Arc::new(Shared { written: AtomicUsize::new(0), stop: AtomicBool::new(false) });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("prefault".into())
            .spawn(move || populate_ahead(&s, start, end, page))
            .ok()?;
        Some(Prefault { shared, thread: Some(thread) })
    }

    #[cfg(not(target_os = "linux"))]
    fn range(_start: usize, _end: usize) -> Option<Prefault> {
        None
    }

    /// The writer has written `bytes` of the range (from the vector's length when the
    /// prefault began).
    pub(crate) fn written(&self, bytes: usize) {
        self.shared.written.store(bytes, Ordering::Release);
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
    }
}

impl Drop for Prefault {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            // The thread only asks the kernel for pages; it has nothing to report.
            let _ = t.join();
        }
    }
}

/// The thread: populates `[start, end)` up to [`AHEAD`] bytes past what the writer has
/// written, sleeping between the writer's reports, until told to stop or refused.
#[cfg(target_os = "linux")]
fn populate_ahead(shared: &Shared, start: usize, end: usize, page: usize) {
    // The first page may hold the allocation's header (or earlier elements): present
    // already, which populating leaves as it is.
    let mut done = start & !(page - 1);
    while !shared.stop.load(Ordering::Acquire) {
        let want = (start + shared.written.load(Ordering::Acquire)).saturating_add(AHEAD).min(end);
        if done < want {
            let upto = want.div_ceil(page) * page;
            let upto = if upto > end { want & !(page - 1) } else { upto };
            if upto <= done {
                std::thread::park();
                continue;
            }
            // SAFETY: `[done, upto)` lies in the vector's allocation (from the page that holds
            // its first spare byte to its capacity's end, rounded down to a page where the
            // allocation ends inside one), which stays mapped until this thread is joined.
            // MADV_POPULATE_WRITE maps missing pages zero-filled and leaves present ones as
            // they are: no byte the program can read changes.
            let r = unsafe { libc::madvise(done as *mut libc::c_void, upto - done, libc::MADV_POPULATE_WRITE) };
            if r != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                // An older kernel (EINVAL) or no memory to give (ENOMEM): the writer faults
                // its own pages, as it would without this thread.
                return;
            }
            if r == 0 {
                done = upto;
            }
        } else {
            std::thread::park();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot_builder::SnapshotBuilder;
    use crate::snapshot_file::{write_snapshot, SnapshotFormat};
    use headroom_alloc::{AllocatorConfig, DeviceCachingAllocator, SimDevice};

    #[test]
    fn what_is_written_is_read_back_while_pages_are_made_present() {
        let n = 3 << 20;
        let mut v: Vec<u64> = Vec::with_capacity(n);
        let p = Prefault::ahead_of(&v);
        if cfg!(target_os = "linux") {
            assert!(p.is_some(), "a 24 MiB reservation is prefaulted");
        }
        for i in 0..n as u64 {
            if let Some(p) = &p {
                if (i as usize).is_multiple_of(STRIDE / 8) {
                    p.written(i as usize * 8);
                }
            }
            v.push(i * 3);
        }
        drop(p);
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64 * 3));
        // Past the reservation the vector grows as any does.
        v.push(1);
        assert_eq!(v.len(), n + 1);
    }

    /// A pickle of `allocations` allocations and their frees, as headroom writes one.
    fn pickle(allocations: usize) -> Vec<u8> {
        let mut a = DeviceCachingAllocator::new(SimDevice::new(1 << 40), AllocatorConfig::default());
        a.record_history(Some(2 * allocations));
        let blocks: Vec<_> = (0..allocations).map(|i| a.malloc(512 * (1 + i as u64 % 40), 0).unwrap()).collect();
        for b in blocks {
            a.free(b.ptr).unwrap();
        }
        let mut bytes = Vec::new();
        write_snapshot(&a.snapshot(), SnapshotFormat::Pickle, &mut bytes).unwrap();
        bytes
    }

    fn read(bytes: &[u8], reserve: Option<usize>) -> crate::snapshot::MemorySnapshot {
        let mut b = SnapshotBuilder::new();
        if let Some(n) = reserve {
            b.reserve_entries(n);
        }
        let root = crate::pickle::read_pickle(bytes, &mut b).unwrap();
        b.finish(root).unwrap()
    }

    #[test]
    fn a_trace_read_into_a_reserved_table_is_the_trace_read_without() {
        let bytes = pickle(30_000);
        let plain = read(&bytes, None);
        assert_eq!(plain.device_traces[0].len(), 60_000);
        // Room for more entries than the file has (the prefault runs to the end), and for
        // fewer (it stops where the table must grow, and the table grows).
        for reserve in [200_000, 20_000, 0] {
            let s = read(&bytes, Some(reserve));
            assert_eq!(s.device_traces, plain.device_traces, "reserved for {reserve}");
            assert_eq!(s.segments, plain.segments, "reserved for {reserve}");
        }
    }
}
