//! `AllocLock`: the lock around one device's allocator, taken with one atomic
//! compare-and-swap and released with a plain store.
//!
//! Why not `std::sync::Mutex`: its release is a second atomic
//! read-modify-write, since it must learn whether a thread sleeps on the lock
//! and wake it. A warm malloc+free pair takes the lock twice, and each of
//! those atomics costs about as much as a tenth of the pair's own work
//! (docs/PERFORMANCE.md, "Warm malloc + free pair"). Here no thread sleeps on
//! the lock: one that finds it taken spins a little (the holder's section is
//! tens of nanoseconds), then yields its core until the lock is free, so the
//! holder, if it was preempted, runs again. The release then has no one to
//! wake and is a store.

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

/// Spins before a waiting thread starts yielding its core.
const SPINS: u32 = 64;

/// A value behind the allocator's lock; see the module documentation.
pub struct AllocLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a guard, and at most one guard
// exists at a time (`locked` is taken by a compare-and-swap and released by
// the guard's drop), so sharing the lock shares no unsynchronised access; the
// acquire/release pair orders each holder's accesses after the previous one's.
unsafe impl<T: Send> Sync for AllocLock<T> {}

impl<T> AllocLock<T> {
    pub fn new(value: T) -> Self {
        AllocLock { locked: AtomicBool::new(false), value: UnsafeCell::new(value) }
    }

    /// Takes the lock, waiting while another thread holds it.
    #[inline]
    pub fn lock(&self) -> AllocGuard<'_, T> {
        if self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            self.lock_contended();
        }
        AllocGuard { lock: self, _value: PhantomData }
    }

    #[cold]
    fn lock_contended(&self) {
        let mut spins = 0;
        loop {
            // Read, not swap, while it is taken: the line stays shared until it is free.
            while self.locked.load(Ordering::Relaxed) {
                if spins < SPINS {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            if self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                return;
            }
        }
    }

    pub fn into_inner(self) -> T {
        self.value.into_inner()
    }
}

/// The lock held: the value, until it is dropped.
pub struct AllocGuard<'a, T> {
    lock: &'a AllocLock<T>,
    /// A guard hands out `&T` and `&mut T`, so it may be shared between threads only where
    /// `T: Sync` (as `MutexGuard`), which `&AllocLock<T>` alone (`T: Send`) would not ask.
    _value: PhantomData<&'a mut T>,
}

impl<T> Deref for AllocGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: this guard holds the lock, so no other reference to the value exists.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for AllocGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this the only use of the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for AllocGuard<'_, T> {
    /// A panic while the lock was held leaves no half-done update behind that
    /// matters more than refusing service (as `CachingAllocator` did with a
    /// poisoned mutex): the lock is released all the same.
    #[inline]
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Increments that are not atomic on their own come out exact only if the
    /// lock excludes: four threads, each adding 1 in two steps under the lock.
    #[test]
    fn excludes_other_threads() {
        let lock = Arc::new(AllocLock::new((0u64, 0u64)));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = Arc::clone(&lock);
                std::thread::spawn(move || {
                    for _ in 0..50_000 {
                        let mut g = lock.lock();
                        let seen = g.0;
                        std::hint::black_box(&mut *g);
                        g.0 = seen + 1;
                        g.1 += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let lock = Arc::try_unwrap(lock).ok().unwrap();
        assert_eq!(lock.into_inner(), (200_000, 200_000));
    }

    #[test]
    fn a_panic_while_held_releases_it() {
        let lock = Arc::new(AllocLock::new(1));
        let l = Arc::clone(&lock);
        let r = std::thread::spawn(move || {
            let _g = l.lock();
            panic!("inside the lock");
        })
        .join();
        assert!(r.is_err());
        assert_eq!(*lock.lock(), 1);
    }
}
