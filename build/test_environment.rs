//! The build script of every crate whose tests need what only some machines have (each
//! Cargo.toml names this file), so that `cargo test` counts a test that cannot run here as
//! ignored, not passed:
//!
//! - `cfg(no_shared)` where `../shared` does not lie beside the repository (the fixtures and
//!   GPU recordings only development checkouts have), or `HEADROOM_NO_SHARED` is set, to try
//!   a fresh clone's run in a development checkout;
//! - `cfg(no_browser)` where Debian's Chromium (`/usr/bin/chromium`, which the report's
//!   browser tests drive) is not installed, outside CI (which installs it, and where they run
//!   and fail without it).
//!
//! Tests mark themselves `#[cfg_attr(no_shared, ignore = "...")]` and so on.
use std::path::Path;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(no_shared)");
    println!("cargo::rustc-check-cfg=cfg(no_browser)");
    println!("cargo::rerun-if-env-changed=HEADROOM_NO_SHARED");
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared");
    // A directory is scanned for changes; a path that is absent makes the script run again on each build.
    println!("cargo::rerun-if-changed={}", shared.display());
    if !shared.is_dir() || std::env::var_os("HEADROOM_NO_SHARED").is_some_and(|v| !v.is_empty()) {
        println!("cargo::rustc-cfg=no_shared");
    }
    // Under CI the browser tests run whatever: they fail there if Chromium is missing.
    println!("cargo::rerun-if-env-changed=CI");
    let chromium = Path::new("/usr/bin/chromium");
    println!("cargo::rerun-if-changed={}", chromium.display());
    if !chromium.exists() && std::env::var_os("CI").is_none() {
        println!("cargo::rustc-cfg=no_browser");
    }
}
