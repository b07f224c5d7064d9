//! The build script of every crate whose tests read `../shared` (each Cargo.toml names this
//! file). Whether `../shared` lies beside the repository: the fixtures and GPU
//! recordings only development checkouts have. Where it does not (or
//! `HEADROOM_NO_SHARED` is set, to try a fresh clone's run in a development
//! checkout), `cfg(no_shared)` marks the tests that read it ignored, so that
//! `cargo test` counts them as ignored rather than passed.
use std::path::Path;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(no_shared)");
    println!("cargo::rerun-if-env-changed=HEADROOM_NO_SHARED");
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared");
    // A directory is scanned for changes; a path that is absent makes the script run again on each build.
    println!("cargo::rerun-if-changed={}", shared.display());
    if !shared.is_dir() || std::env::var_os("HEADROOM_NO_SHARED").is_some_and(|v| !v.is_empty()) {
        println!("cargo::rustc-cfg=no_shared");
    }
}
