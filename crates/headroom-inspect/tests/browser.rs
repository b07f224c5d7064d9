//! The HTML report in a real browser: headless Chromium renders it offline,
//! the screenshot is not blank, the plots' colours are on it, and the
//! console stays free of errors. A page with a deliberate script error must
//! be caught by the same check.
//!
//! Needs Debian's `chromium` (.ci/run installs it); skipped with a message
//! where it is absent, except under CI, where that fails.

mod common;

use headroom_inspect::{html, inspect, InspectOptions};
use std::path::Path;
use std::process::Command;

const CHROMIUM: &str = "/usr/bin/chromium";

/// Renders `page` and returns the screenshot's RGB pixels and the console lines.
fn render(dir: &Path, page: &str) -> (Vec<[u8; 3]>, Vec<String>) {
    let file = dir.join("report.html");
    std::fs::write(&file, page).unwrap();
    let shot = dir.join("shot.png");
    let out = Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1100,3200",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", file.display()))
        .output()
        .expect("chromium runs");
    let console: Vec<String> = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.contains("CONSOLE") || l.contains("Uncaught"))
        .map(str::to_string)
        .collect();
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).expect("a screenshot")));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let step = info.color_type.samples();
    let pixels = buf[..info.buffer_size()].chunks(step).map(|p| [p[0], p[1], p[2]]).collect();
    (pixels, console)
}

fn chromium() -> bool {
    if Path::new(CHROMIUM).exists() {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "CI must install chromium (.ci/run does)");
    eprintln!("skipped: {CHROMIUM} is absent (apt-get install chromium)");
    false
}

#[test]
fn the_report_renders_offline_with_its_plots_and_no_console_errors() {
    if !chromium() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let snap = common::training_run(6, true);
    let report = inspect("train.json", &snap, &[], &InspectOptions::default());
    let page = html::render(&[report], None);
    for fetch in ["src=\"http", "href=\"http", "@import", "url(http", "<link"] {
        assert!(!page.contains(fetch), "nothing is fetched: {fetch}");
    }
    let (pixels, console) = render(dir.path(), &page);
    let count = |rgb: [u8; 3]| pixels.iter().filter(|p| p.iter().zip(rgb).all(|(a, b)| a.abs_diff(b) <= 24)).count();
    let not_white = pixels.iter().filter(|p| p.iter().any(|&c| c < 235)).count();
    assert!(not_white * 20 > pixels.len(), "the page is blank: {not_white} of {} pixels drawn", pixels.len());
    // The reserved line, the free blocks of the segment map and the first band.
    assert!(count([200, 30, 30]) > 500, "the reserved line is drawn");
    assert!(count([215, 215, 215]) > 500, "the segment map's free blocks are drawn");
    // The bands (blended where they overlap) and the segment map's allocated blocks.
    let coloured = pixels.iter().filter(|p| p.iter().max().unwrap() - p.iter().min().unwrap() > 60).count();
    assert!(coloured > 20_000, "the bands are drawn: {coloured} coloured pixels");
    assert!(count([31, 119, 180]) > 2000, "the allocated blocks are drawn");
    assert!(console.is_empty(), "console: {console:?}");
}

#[test]
fn a_console_error_is_caught() {
    if !chromium() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, console) =
        render(dir.path(), "<!DOCTYPE html><html><body><p>x</p><script>undefined_function()</script></body></html>");
    assert!(!console.is_empty(), "the deliberate error shows on the console");
}
