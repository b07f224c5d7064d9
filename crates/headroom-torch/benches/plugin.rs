//! The plug-in's cost per call: a warm malloc + free pair through the C
//! functions PyTorch calls, beside the same pair on the library's
//! `CachingAllocator` directly (figures in docs/PERFORMANCE.md).
//!
//! `cargo bench -p headroom-torch --bench plugin`

use criterion::{criterion_group, criterion_main, Criterion};
use headroom_alloc::units::GIB;
use headroom_alloc::{AllocatorConfig, CachingAllocator, PolicyName, SimDevice};
use headroom_torch::{headroom_free, headroom_malloc};
use std::hint::black_box;

fn warm_pair(c: &mut Criterion) {
    std::env::set_var("HEADROOM_TORCH_BACKEND", "sim");
    std::env::set_var("HEADROOM_POLICY", "headroom");
    let mut g = c.benchmark_group("plugin_warm_pair_64MiB");
    let size = 64usize << 20;
    // SAFETY: the pointer comes from headroom_malloc; streams are only compared.
    unsafe {
        let p = headroom_malloc(size, 0, std::ptr::null_mut());
        headroom_free(p, size, 0, std::ptr::null_mut());
    }
    g.bench_function("c_abi", |b| {
        b.iter(|| unsafe {
            // SAFETY: as above.
            let p = headroom_malloc(black_box(size), 0, std::ptr::null_mut());
            headroom_free(p, size, 0, std::ptr::null_mut());
        })
    });
    let direct = CachingAllocator::with_policy(
        SimDevice::new(80 * GIB),
        AllocatorConfig::default(),
        PolicyName::Headroom.build(),
    );
    let a = direct.malloc(size as u64, 0).unwrap();
    direct.free(a.ptr).unwrap();
    g.bench_function("library", |b| {
        b.iter(|| {
            let a = direct.malloc(black_box(size as u64), 0).unwrap();
            direct.free(a.ptr).unwrap();
        })
    });
    g.finish();
}

criterion_group!(benches, warm_pair);
criterion_main!(benches);
