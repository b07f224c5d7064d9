//! headroom's policies beside PyTorch's: the rule that sets `headroom`
//! apart, worked through by hand, and fault injection — a device call that
//! fails in the middle of a training step loses nothing under any policy.

use headroom_alloc::units::MIB;
use headroom_alloc::{
    AllocError, AllocatorConfig, DeviceCachingAllocator, FaultyDevice, NamedPolicy, PolicyName, SimDevice,
};

fn allocator(policy: PolicyName, capacity: u64) -> DeviceCachingAllocator<FaultyDevice<SimDevice>, NamedPolicy> {
    DeviceCachingAllocator::with_policy(
        FaultyDevice::new(SimDevice::new(capacity)),
        AllocatorConfig::default(),
        policy.build(),
    )
}

/// A (100 MiB) and B (100 MiB), A freed, then C (150 MiB), which A's hole
/// cannot hold. PyTorch keeps A's segment cached and allocates C's; with
/// expandable segments A's pages stay mapped and C's are mapped after B in
/// 20 MiB pages; `headroom` unmaps A's pages before its peak grows and maps
/// C's from them, so it reserves exactly what is live.
#[test]
fn headroom_reuses_free_pages_before_its_peak_grows() {
    let peak = |policy| {
        let mut a = allocator(policy, 8 << 30);
        let x = a.malloc(100 * MIB, 0).unwrap();
        let _b = a.malloc(100 * MIB, 0).unwrap();
        a.free(x.ptr).unwrap();
        let _c = a.malloc(150 * MIB, 0).unwrap();
        a.validate().unwrap();
        assert_eq!(a.reserved_bytes(), a.device().inner().used_bytes());
        a.memory_stats()["reserved_bytes.all.peak"] as u64
    };
    assert_eq!(peak(PolicyName::PyTorch), 350 * MIB);
    assert_eq!(peak(PolicyName::Expandable), 360 * MIB);
    assert_eq!(peak(PolicyName::Headroom), 250 * MIB);
}

/// Below its peak `headroom` maps ahead in 20 MiB steps, as expandable
/// segments do, so a run of small large-pool requests costs few device calls.
#[test]
fn below_its_peak_headroom_maps_ahead() {
    let mut a = allocator(PolicyName::Headroom, 8 << 30);
    let big = a.malloc(400 * MIB, 0).unwrap();
    a.free(big.ptr).unwrap();
    a.empty_cache().unwrap();
    let before = a.memory_stats()["num_device_alloc"];
    let small: Vec<_> = (0..40).map(|_| a.malloc(2 * MIB + 1, 0).unwrap()).collect();
    let calls = a.memory_stats()["num_device_alloc"] - before;
    assert!(calls <= 5, "{calls} mappings for 40 requests of 2 MiB under the peak");
    for b in small {
        a.free(b.ptr).unwrap();
    }
    a.validate().unwrap();
}

/// Sizes of one step of a small transformer-like run: the same shapes every
/// step, activations freed in reverse, gradients made during the backward.
fn step_sizes(layer: u64) -> [u64; 4] {
    [(3 + layer % 4) * MIB + 4096, (12 + layer) * MIB, 300_000 + layer * 1000, (40 + 3 * layer) * MIB]
}

/// One training step; returns Err on the first refused request, leaving what it holds in `live`.
fn step(
    a: &mut DeviceCachingAllocator<FaultyDevice<SimDevice>, NamedPolicy>,
    live: &mut Vec<(u64, u64)>,
) -> Result<(), AllocError> {
    let mark = live.len();
    for layer in 0..6 {
        for s in step_sizes(layer) {
            let b = a.malloc(s, 0)?;
            live.push((b.ptr, b.size));
        }
    }
    // The backward frees activations, newest first, and makes gradients as it goes.
    while live.len() > mark {
        let (ptr, size) = live.pop().expect("an activation");
        a.free(ptr)?;
        if size > 20 * MIB {
            let g = a.malloc(size / 4, 0)?;
            a.free(g.ptr)?;
        }
    }
    Ok(())
}

/// Everything the caller holds is still allocated, at its size, and the
/// statistics count exactly that.
fn check_intact(a: &DeviceCachingAllocator<FaultyDevice<SimDevice>, NamedPolicy>, live: &[(u64, u64)], what: &str) {
    a.validate().unwrap_or_else(|v| panic!("{what}: {v}"));
    for &(ptr, size) in live {
        assert_eq!(a.allocation_size(ptr), Some(size), "{what}: allocation {ptr:#x} lost");
    }
    let held: u64 = live.iter().map(|&(_, s)| s).sum();
    assert_eq!(a.memory_stats()["allocated_bytes.all.current"] as u64, held, "{what}");
    assert_eq!(a.reserved_bytes(), a.device().inner().used_bytes(), "{what}");
}

#[test]
fn a_device_call_failing_mid_step_loses_nothing_under_any_policy() {
    for policy in PolicyName::ALL {
        for n in [1, 2, 3, 5, 8, 13, 21, 34] {
            let what = format!("{policy}, device allocation {n} failing");
            let mut a = allocator(policy, 4 << 30);
            let weights = a.malloc(512 * MIB, 0).unwrap();
            let mut live = vec![(weights.ptr, weights.size)];
            a.device_mut().fail_nth_allocation(n);
            for i in 0..4 {
                // A single refused device call is absorbed by the ladder's
                // flush and retry, or fails the request cleanly.
                match step(&mut a, &mut live) {
                    Ok(()) => {}
                    Err(AllocError::OutOfMemory(_)) => {}
                    Err(e) => panic!("{what}: step {i}: {e}"),
                }
                check_intact(&a, &live, &what);
            }
            for (ptr, _) in live.drain(..) {
                a.free(ptr).unwrap();
            }
            a.empty_cache().unwrap();
            assert_eq!(a.reserved_bytes(), 0, "{what}");
            assert_eq!(a.device().inner().used_bytes(), 0, "{what}");
        }
    }
}

#[test]
fn a_refused_request_mid_step_leaves_the_rest_and_the_next_step_runs() {
    for policy in PolicyName::ALL {
        let mut a = allocator(policy, 4 << 30);
        let weights = a.malloc(512 * MIB, 0).unwrap();
        let mut live = vec![(weights.ptr, weights.size)];
        step(&mut a, &mut live).unwrap();
        // Mid-step, the device refuses everything: the request that needs it fails.
        let held = a.malloc(30 * MIB, 0).unwrap();
        live.push((held.ptr, held.size));
        a.device_mut().refuse_allocations(true);
        let err = a.malloc(3 << 30, 0).unwrap_err();
        assert!(matches!(err, AllocError::OutOfMemory(_)), "{policy}: {err}");
        check_intact(&a, &live, policy.name());
        a.device_mut().refuse_allocations(false);
        step(&mut a, &mut live).unwrap_or_else(|e| panic!("{policy}: the next step failed: {e}"));
        check_intact(&a, &live, policy.name());
    }
}

/// `planned`: once a step has repeated, the steps after it run in one arena at the
/// offsets the plan chose — no device call, every block where the plan put it — and a
/// step that departs from the plan drops it, losing nothing. Without room under the peak
/// for the arena, no plan is kept.
#[test]
fn planned_steps_run_from_one_arena_once_a_step_repeats() {
    let mut a = allocator(PolicyName::Planned, 4 << 30);
    let weights = a.malloc(512 * MIB, 0).unwrap();
    let mut live = vec![(weights.ptr, weights.size)];
    let plans = |a: &DeviceCachingAllocator<FaultyDevice<SimDevice>, NamedPolicy>| match a.policy() {
        NamedPolicy::Planned(p) => (p.plans(), p.arena()),
        _ => unreachable!("the planned policy"),
    };
    // The first step holds a workspace beside its activations, as first iterations do
    // (autotuning, lazily made state): the peak it sets leaves the later steps room to map
    // an arena without passing it.
    let workspace = a.malloc(200 * MIB, 0).unwrap();
    step(&mut a, &mut live).unwrap();
    a.free(workspace.ptr).unwrap();
    // A second step to see the step repeat; the plan is made in the third, maps its arena
    // (giving back the pages the first steps left cached) and settles by the fifth.
    for i in 1..5 {
        step(&mut a, &mut live).unwrap();
        check_intact(&a, &live, &format!("step {i}"));
    }
    let ((made, dropped), arena) = plans(&a);
    assert_eq!((made, dropped), (1, 0));
    let (arena_bytes, planned) = arena.expect("a plan in force");
    // Every large request of the step is planned (the 300 kB ones are small-pool blocks).
    assert_eq!(planned, 6 * 3 + 6);
    let calls = |a: &DeviceCachingAllocator<FaultyDevice<SimDevice>, NamedPolicy>| {
        let s = a.memory_stats();
        s["num_device_alloc"] + s["num_device_free"]
    };
    let (before, reserved) = (calls(&a), a.reserved_bytes());
    for i in 5..9 {
        step(&mut a, &mut live).unwrap();
        check_intact(&a, &live, &format!("planned step {i}"));
    }
    assert_eq!(calls(&a), before, "planned steps call the device");
    assert_eq!(a.reserved_bytes(), reserved);
    // The arena holds what one step has live at its peak, no more: here the activations
    // of six layers, 50 to 65 MiB each plus their 12-17 MiB and 3-6 MiB companions.
    let step_live: u64 = (0..6).flat_map(step_sizes).filter(|&s| s > MIB).map(|s| s.next_multiple_of(2 * MIB)).sum();
    assert!(arena_bytes <= step_live, "arena {arena_bytes} B for {step_live} B live at the step's peak");
    // Another shape: the plan is dropped at the first request that departs; nothing is lost.
    let odd = a.malloc(7 * MIB, 0).unwrap();
    live.push((odd.ptr, odd.size));
    assert_eq!(plans(&a).0, (1, 1));
    step(&mut a, &mut live).unwrap();
    check_intact(&a, &live, "after the plan was dropped");

    // The same steps with no room under the peak (no workspace): every plan is dropped at
    // its first request, and the run is headroom's.
    let mut b = allocator(PolicyName::Planned, 4 << 30);
    let mut held = vec![(b.malloc(512 * MIB, 0).unwrap().ptr, 512 * MIB)];
    for i in 0..6 {
        step(&mut b, &mut held).unwrap();
        check_intact(&b, &held, &format!("tight step {i}"));
    }
    let ((made, dropped), arena) = plans(&b);
    assert!(made >= 1 && made == dropped && arena.is_none(), "{made} made, {dropped} dropped");
}
