//! headroom's policies beside PyTorch's: the rule that sets `headroom`
//! apart, worked through by hand, and fault injection — a device call that
//! fails in the middle of a training step loses nothing under any policy.

use headroom_alloc::units::MIB;
use headroom_alloc::{
    AllocError, AllocatorConfig, CountingDevice, DeviceCachingAllocator, FaultyDevice, NamedPolicy, PolicyName,
    SimDevice,
};

fn allocator(policy: PolicyName, capacity: u64) -> DeviceCachingAllocator<FaultyDevice<SimDevice>, NamedPolicy> {
    DeviceCachingAllocator::with_policy(
        FaultyDevice::new(SimDevice::new(capacity)),
        AllocatorConfig::default(),
        policy.build(),
    )
}

/// Sixteen 20 MiB blocks held (sixteen device allocations: the budget for one
/// unmap), then A (100 MiB) and B (90 MiB, 10 MiB left in its last step), A
/// freed, then C (105 MiB), which A's hole cannot hold. PyTorch keeps A's
/// segment cached and allocates C's; with expandable segments A's pages stay
/// mapped and C's are mapped after B; `headroom` gives back A's whole pages,
/// which cover all the growth C needs, in one unmap, and maps C from them.
#[test]
fn headroom_reuses_free_pages_before_its_peak_grows() {
    let run = |policy| {
        let mut a = counted(policy);
        let held: Vec<_> = (0..16).map(|_| a.malloc(20 * MIB, 0).unwrap()).collect();
        let x = a.malloc(100 * MIB, 0).unwrap();
        let _b = a.malloc(90 * MIB, 0).unwrap();
        a.free(x.ptr).unwrap();
        let _c = a.malloc(105 * MIB, 0).unwrap();
        a.validate().unwrap();
        assert_eq!(held.len(), 16);
        let s = a.memory_stats();
        (s["reserved_bytes.all.peak"] as u64 / MIB, s["num_device_alloc"], s["num_device_free"])
    };
    assert_eq!(run(PolicyName::PyTorch), (616, 19, 0));
    assert_eq!(run(PolicyName::Expandable), (620, 19, 0));
    // C lacks 95 MiB past B's step: A's 100 MiB go back in one unmap, and 100 MiB are
    // mapped in whole 20 MiB steps, as expandable segments would map them.
    assert_eq!(run(PolicyName::Headroom), (520, 19, 1));
}

/// Without sixteen device allocations made, `headroom` has no unmap to spend:
/// it grows as expandable segments do.
#[test]
fn headroom_gives_back_no_more_often_than_its_budget() {
    let peak = |policy| {
        let mut a = counted(policy);
        let x = a.malloc(100 * MIB, 0).unwrap();
        let _b = a.malloc(90 * MIB, 0).unwrap();
        a.free(x.ptr).unwrap();
        let _c = a.malloc(105 * MIB, 0).unwrap();
        let s = a.memory_stats();
        (s["reserved_bytes.all.peak"], s["num_device_free"])
    };
    assert_eq!(peak(PolicyName::Headroom), peak(PolicyName::Expandable));
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

fn counted(policy: PolicyName) -> DeviceCachingAllocator<CountingDevice<SimDevice>, NamedPolicy> {
    DeviceCachingAllocator::with_policy(
        CountingDevice::new(SimDevice::new(8 << 30)),
        AllocatorConfig::default(),
        policy.build(),
    )
}

fn device_calls<D: headroom_alloc::DeviceMemory>(a: &DeviceCachingAllocator<D, NamedPolicy>) -> i64 {
    let s = a.memory_stats();
    s["num_device_alloc"] + s["num_device_free"]
}

/// A step that needs a small-pool page at one moment and 8 MiB more of the
/// large pool at another, beside `weights` MiB held throughout: at their
/// peak either can be had only by giving back the other's free pages.
/// Returns the device calls of each of ten steps and the peak reserved.
fn two_moment_steps(policy: PolicyName, weights: u64) -> (Vec<i64>, u64) {
    let mut a = counted(policy);
    let _w = a.malloc(weights * MIB, 0).unwrap();
    let mut calls = Vec::new();
    for _ in 0..10 {
        let before = device_calls(&a);
        let s = a.malloc(512 << 10, 0).unwrap();
        a.free(s.ptr).unwrap();
        let l = a.malloc(8 * MIB, 0).unwrap();
        a.free(l.ptr).unwrap();
        calls.push(device_calls(&a) - before);
        a.validate().unwrap();
    }
    (calls, a.memory_stats()["reserved_bytes.all.peak"] as u64)
}

/// `tight` gives back the small-pool page when the large pool needs 8 MiB
/// at the peak, and the large pool's pages when the small pool needs its
/// page again: four device calls every step. `headroom` gives back only its
/// own pool's pages, so the two never trade: no device call after the first
/// step, at most a page above `tight`'s peak.
#[test]
fn headroom_never_trades_pages_between_pools() {
    for weights in [20, 60] {
        let (tight, tight_peak) = two_moment_steps(PolicyName::Tight, weights);
        let (headroom, peak) = two_moment_steps(PolicyName::Headroom, weights);
        assert!(tight[2..].iter().all(|&c| c == 4), "tight: {tight:?}");
        assert_eq!(&headroom[1..], &[0; 9], "headroom: {headroom:?}");
        assert!(peak <= tight_peak + 20 * MIB, "{peak} against tight's {tight_peak}");
    }
}

/// Below its peak `headroom` maps a quarter of the room left under it at a
/// time: the activations of a step mapped again after a flush take one
/// device call, where `tight` maps 20 MiB steps.
#[test]
fn below_its_peak_headroom_maps_a_quarter_of_the_room_ahead() {
    let calls = |policy| {
        let mut a = counted(policy);
        let big = a.malloc(400 * MIB, 0).unwrap();
        a.free(big.ptr).unwrap();
        a.empty_cache().unwrap();
        let before = device_calls(&a);
        let layers: Vec<_> = (0..20).map(|_| a.malloc(5 * MIB, 0).unwrap()).collect();
        let calls = device_calls(&a) - before;
        assert!(a.reserved_bytes() <= 400 * MIB, "{policy}: mapping ahead passed the peak");
        for b in layers {
            a.free(b.ptr).unwrap();
        }
        a.validate().unwrap();
        calls
    };
    assert_eq!(calls(PolicyName::Headroom), 1);
    assert_eq!(calls(PolicyName::Tight), 5);
}

/// Climbing past its peak with nothing to give back, `headroom` maps a
/// request's own pages in physical allocations of 20 MiB: 100 MiB is five
/// allocations, not fifty, and costs the device time of five. An allocation
/// goes back whole: while a block holds part of one, its free pages stay.
#[test]
fn headroom_maps_a_climbing_request_in_large_physical_allocations() {
    let mut a = counted(PolicyName::Headroom);
    let x = a.malloc(100 * MIB, 0).unwrap();
    let created = a.device().calls().pages_mapped;
    assert_eq!(created, 5, "100 MiB in 20 MiB allocations");
    let mut t = counted(PolicyName::Tight);
    t.malloc(100 * MIB, 0).unwrap();
    assert_eq!(t.device().calls().pages_mapped, 50, "a page apiece");
    // X's first 10 MiB taken again: the allocation under them stays whole.
    a.free(x.ptr).unwrap();
    let y = a.malloc(10 * MIB, 0).unwrap();
    assert_eq!(y.ptr, x.ptr);
    a.empty_cache().unwrap();
    a.validate().unwrap();
    assert_eq!(a.reserved_bytes(), 20 * MIB, "the allocation Y is on stays, the other four go");
    assert_eq!(a.reserved_bytes(), a.device().inner().used_bytes());
    a.free(y.ptr).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.reserved_bytes(), 0);
    assert_eq!(a.device().inner().used_bytes(), 0);
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

    // The same steps without the workspace: growth in whole 20 MiB steps leaves the first
    // steps' slack under the peak, where a plan may map its arena; planned or not, every
    // step keeps its blocks intact and the peak stays that of headroom's run.
    let mut b = allocator(PolicyName::Planned, 4 << 30);
    let mut h = allocator(PolicyName::Headroom, 4 << 30);
    let mut held = vec![(b.malloc(512 * MIB, 0).unwrap().ptr, 512 * MIB)];
    let mut held_h = vec![(h.malloc(512 * MIB, 0).unwrap().ptr, 512 * MIB)];
    for i in 0..6 {
        step(&mut b, &mut held).unwrap();
        step(&mut h, &mut held_h).unwrap();
        check_intact(&b, &held, &format!("step {i} without room"));
    }
    let peak =
        |a: &DeviceCachingAllocator<FaultyDevice<SimDevice>, NamedPolicy>| a.memory_stats()["reserved_bytes.all.peak"];
    assert!(peak(&b) <= peak(&h), "planned {} against headroom's {}", peak(&b), peak(&h));
}
