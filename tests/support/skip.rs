//! Saying that a test did not run. A test that cannot run here (no GPU, no
//! browser, a part of `../shared` missing) returns early and `cargo test`
//! calls it `ok`; what it prints with `eprintln!` the harness captures and
//! shows only for failures. This writes to the process's stderr directly,
//! past the capture, so the line stands in the summary a user reads. (Where
//! `../shared` is absent altogether, the tests that read it are not run at
//! all: the crate's build script sets `cfg(no_shared)` and they are marked
//! `#[cfg_attr(no_shared, ignore = ...)]`, so the summary counts them ignored.)
//!
//! Included by path (`#[path = ".../tests/support/skip.rs"] mod skip;`) in
//! each crate's tests that skip.

/// Prints `skipped: TEST: WHY` where `cargo test` shows it.
pub fn skip(why: &str) {
    use std::io::Write;
    let test = std::thread::current().name().unwrap_or("a test").to_string();
    let _ = writeln!(std::io::stderr(), "skipped: {test}: {why}");
}
