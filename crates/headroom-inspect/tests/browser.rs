//! The HTML report in a real browser. Headless Chromium renders it offline:
//! the screenshot is not blank, the plots' colours are on it, and the
//! console stays free of errors (a page with a deliberate script error must
//! be caught by the same check). Then the page is driven as a user drives
//! it, through the DevTools protocol: pointer moves over a band and a block
//! show their size, call site and stack; the wheel zooms the timeline, a
//! drag pans it and a double-click resets it; a click on a site shows only
//! that site in the bands, the segment map and the table. Zoomed in on the
//! bundled snapshot until few enough allocations are in view, each is its
//! own band, and pointing at one shows its size. With script off, the plots
//! are still there.
//!
//! Needs Debian's `chromium` (.ci/run installs it); where it is absent the
//! tests count as ignored (`cfg(no_browser)`, build/test_environment.rs), and under CI,
//! which must have it, they fail.

mod common;
#[path = "../../../tests/support/skip.rs"]
mod skip;

use headroom_inspect::{html, inspect, InspectOptions};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command};

const CHROMIUM: &str = "/usr/bin/chromium";

/// Flags for a headless Chromium on a machine without a network: the
/// background-networking ones keep it from trying to reach Google's hosts.
const FLAGS: [&str; 8] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
];

fn chromium() -> bool {
    if Path::new(CHROMIUM).exists() {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "CI must install chromium (.ci/run does)");
    skip::skip(&format!("{CHROMIUM} is absent (apt-get install chromium)"));
    false
}

/// Renders `page` and returns the screenshot's RGB pixels and the console lines.
fn render(dir: &Path, page: &str) -> (Vec<[u8; 3]>, Vec<String>) {
    let file = dir.join("report.html");
    std::fs::write(&file, page).unwrap();
    let shot = dir.join("shot.png");
    let out = Command::new(CHROMIUM)
        .args(FLAGS)
        .args(["--enable-logging=stderr", "--v=0", "--window-size=1100,3200"])
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

#[test]
#[cfg_attr(no_browser, ignore = "needs Chromium (apt-get install chromium)")]
fn the_report_renders_offline_with_its_plots_and_no_console_errors() {
    if !chromium() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let snap = common::training_run(6, true);
    let report = inspect("train.json", &snap, &[], &InspectOptions::default());
    let page = html::render(&[report], None);
    for fetch in ["src=\"http", "href=\"http", "@import", "url(http", "<link", "<script src"] {
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
#[cfg_attr(no_browser, ignore = "needs Chromium (apt-get install chromium)")]
fn a_console_error_is_caught() {
    if !chromium() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, console) =
        render(dir.path(), "<!DOCTYPE html><html><body><p>x</p><script>undefined_function()</script></body></html>");
    assert!(!console.is_empty(), "the deliberate error shows on the console");
}

// ---------------------------------------------------------------------------
// Driving the page: the DevTools protocol over a pipe (--remote-debugging-pipe:
// Chromium reads commands on fd 3 and writes replies and events on fd 4, each
// a JSON message ended by a NUL). No port, no WebSocket, no other process.

extern "C" {
    fn dup2(old: i32, new: i32) -> i32;
    fn fcntl(fd: i32, cmd: i32, ...) -> i32;
}
const F_DUPFD: i32 = 0;

struct Browser {
    child: Child,
    to: std::io::PipeWriter,
    from: BufReader<std::io::PipeReader>,
    next: u64,
    /// Errors the pages reported: exceptions, console errors, failed loads.
    errors: Vec<String>,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn launch() -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let (commands, to) = std::io::pipe().unwrap();
        let (from, replies) = std::io::pipe().unwrap();
        let (r, w) = (commands.as_raw_fd(), replies.as_raw_fd());
        let mut cmd = Command::new(CHROMIUM);
        cmd.args(FLAGS).arg("--remote-debugging-pipe").arg(format!("--user-data-dir={}", profile.path().display()));
        // SAFETY: between fork and exec only async-signal-safe calls (fcntl, dup2)
        // on descriptors this process owns. They are first moved above 10, so that
        // placing them at 3 and 4 cannot overwrite one with the other.
        unsafe {
            cmd.pre_exec(move || {
                let (r, w) = (fcntl(r, F_DUPFD, 10), fcntl(w, F_DUPFD, 10));
                if r < 0 || w < 0 || dup2(r, 3) < 0 || dup2(w, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().unwrap();
        drop((commands, replies));
        Browser { child, to, from: BufReader::new(from), next: 0, errors: Vec::new(), _profile: profile }
    }

    fn read(&mut self) -> Value {
        let mut buf = Vec::new();
        let n = self.from.read_until(0, &mut buf).unwrap();
        assert!(n > 0, "chromium closed the pipe");
        buf.pop();
        let v: Value = serde_json::from_slice(&buf).unwrap();
        match v["method"].as_str() {
            Some("Runtime.exceptionThrown") => self.errors.push(v["params"]["exceptionDetails"].to_string()),
            Some("Runtime.consoleAPICalled") if v["params"]["type"] == "error" => {
                self.errors.push(v["params"]["args"].to_string())
            }
            Some("Log.entryAdded") if v["params"]["entry"]["level"] == "error" => {
                self.errors.push(v["params"]["entry"]["text"].to_string())
            }
            _ => {}
        }
        v
    }

    /// Sends a command (to a page's session) and returns its result.
    fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = serde_json::to_vec(&msg).unwrap();
        bytes.push(0);
        self.to.write_all(&bytes).unwrap();
        loop {
            let v = self.read();
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {}", v["error"]);
                return v["result"].clone();
            }
        }
    }

    /// A new page at `url`, loaded, with script on or off: its session.
    fn open(&mut self, url: &str, script: bool) -> String {
        let target = self.call(None, "Target.createTarget", json!({"url": "about:blank"}))["targetId"].clone();
        let s = self.call(None, "Target.attachToTarget", json!({"targetId": target, "flatten": true}))["sessionId"]
            .as_str()
            .unwrap()
            .to_string();
        for domain in ["Runtime.enable", "Page.enable", "Log.enable"] {
            self.call(Some(&s), domain, json!({}));
        }
        let metrics = json!({"width": 1100, "height": 900, "deviceScaleFactor": 1, "mobile": false});
        self.call(Some(&s), "Emulation.setDeviceMetricsOverride", metrics);
        self.call(Some(&s), "Emulation.setScriptExecutionDisabled", json!({"value": !script}));
        self.call(Some(&s), "Page.navigate", json!({"url": url}));
        loop {
            let v = self.read();
            if v["method"] == "Page.loadEventFired" && v["sessionId"] == s.as_str() {
                return s;
            }
        }
    }

    /// The value of a JavaScript expression in the page.
    fn eval(&mut self, s: &str, js: &str) -> Value {
        let r = self.call(Some(s), "Runtime.evaluate", json!({"expression": js, "returnByValue": true}));
        assert!(r.get("exceptionDetails").is_none(), "{js}: {}", r["exceptionDetails"]);
        r["result"]["value"].clone()
    }

    fn mouse(&mut self, s: &str, kind: &str, x: f64, y: f64, extra: Value) {
        let mut p = json!({"type": kind, "x": x, "y": y});
        for (k, v) in extra.as_object().unwrap() {
            p[k] = v.clone();
        }
        self.call(Some(s), "Input.dispatchMouseEvent", p);
    }

    fn click(&mut self, s: &str, x: f64, y: f64, count: u32) {
        let press = json!({"button": "left", "buttons": 1, "clickCount": count});
        self.mouse(s, "mousePressed", x, y, press);
        self.mouse(s, "mouseReleased", x, y, json!({"button": "left", "buttons": 0, "clickCount": count}));
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The tooltip's text, or None while it is hidden.
fn tip(b: &mut Browser, s: &str) -> Option<String> {
    b.eval(s, "(() => { const t = document.querySelector('.hr-tip'); return t.hidden ? null : t.textContent; })()")
        .as_str()
        .map(str::to_string)
}

/// The timeline's visible span, as the chart records it.
fn span(b: &mut Browser, s: &str) -> (f64, f64) {
    let v = b.eval(
        s,
        "(() => { const g = document.querySelector('svg.hr-timeline'); return [+g.dataset.x0, +g.dataset.x1]; })()",
    );
    (f(&v[0]), f(&v[1]))
}

/// After a click on `site`'s band: the panel is pinned on it. It stays when the pointer
/// leaves, leads with the user's own frame (not torch's, not the allocator's), and holds
/// the whole stack on request.
fn the_panel_is_pinned_on(b: &mut Browser, s: &str, site: &Value) {
    b.mouse(s, "mouseMoved", 2.0, 2.0, json!({}));
    let panel = b.eval(
        s,
        &format!(
            r#"(() => {{ const t = document.querySelector('.hr-tip');
            const d = JSON.parse(document.querySelector('script.hr-data').textContent).sites["{}"];
            const first = t.querySelector('ol.hr-stack li');
            return {{shown: !t.hidden, pinned: t.classList.contains('pinned'), fixed: getComputedStyle(t).position,
                    first: first ? first.textContent : null, want: d.frames[0],
                    whole: t.querySelectorAll('details.hr-whole li').length, stack: d.stack.length,
                    stackFirst: d.stack[0]}}; }})()"#,
            site
        ),
    );
    assert_eq!(
        (&panel["shown"], &panel["pinned"], &panel["fixed"]),
        (&json!(true), &json!(true), &json!("fixed")),
        "{panel}"
    );
    assert_eq!(panel["first"], panel["want"], "{panel}");
    let first = panel["first"].as_str().unwrap();
    assert!(first.contains("/me/proj/") && !first.contains("/torch/"), "the user's frame first: {panel}");
    if panel["stackFirst"].as_str().unwrap().contains("/torch/") {
        assert_ne!(panel["stackFirst"], panel["first"], "torch's frames come after: {panel}");
    }
    assert_eq!(panel["whole"], panel["stack"], "the whole stack on request: {panel}");
}

#[test]
#[cfg_attr(no_browser, ignore = "needs Chromium (apt-get install chromium)")]
fn the_report_is_driven_zoomed_pointed_at_and_filtered() {
    if !chromium() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let snap = common::training_run(6, true);
    let report = inspect("train.json", &snap, &[], &InspectOptions::default());
    let d = &report.devices[0];
    assert!(d.series.len() >= 3, "bands to point at: {}", d.series.len());
    let page = html::render(std::slice::from_ref(&report), None);
    let file = dir.path().join("report.html");
    std::fs::write(&file, &page).unwrap();
    let url = format!("file://{}", file.display());

    let mut b = Browser::launch();
    let s = b.open(&url, true);
    assert!(b.errors.is_empty(), "errors: {:?}", b.errors);
    assert_eq!(b.eval(&s, "document.documentElement.classList.contains('js')"), true);
    assert_eq!(b.eval(&s, "document.querySelectorAll('.static.replaced').length"), 2, "timeline and map redrawn");
    // So few allocations that each is drawn as its own band at every zoom: the toggle shows the bands by site.
    assert_eq!(b.eval(&s, "document.querySelector('svg.hr-timeline').dataset.view"), "allocations");
    b.eval(&s, "document.querySelector('.hr-view').click()");
    assert_eq!(b.eval(&s, "document.querySelector('svg.hr-timeline').dataset.view"), "sites");

    // The plot area on screen, and a point of the bottom band where it is
    // thickest, found from the page's data (not from the chart's code).
    let geo = b.eval(
        &s,
        r#"(() => {
            const p = document.querySelector('svg.hr-timeline .hr-plot');
            p.scrollIntoView({block: 'center'});
            const r = p.getBoundingClientRect();
            const d = JSON.parse(document.querySelector('script.hr-data').textContent);
            let i = 0;
            d.series[0].bytes.forEach((v, k) => { if (v > d.series[0].bytes[i]) i = k; });
            let top = 1;
            for (let k = 0; k < d.x.length; k++) top = Math.max(top, d.reserved[k], d.allocated[k]);
            const x0 = d.x[0], x1 = d.x[d.x.length - 1];
            return {left: r.left, top: r.top, width: r.width, height: r.height,
                    px: r.left + (d.x[i] - x0) / (x1 - x0) * r.width,
                    py: r.bottom - d.series[0].bytes[i] / 2 / (top * 1.05) * r.height,
                    site: d.sites[d.series[0].site].name, site1: d.series[1].site,
                    site1name: d.sites[d.series[1].site].name, frame: d.sites[d.series[0].site].frames[0]};
        })()"#,
    );
    let (px, py) = (f(&geo["px"]), f(&geo["py"]));
    let (cx, cy) = (f(&geo["left"]) + f(&geo["width"]) / 2.0, f(&geo["top"]) + f(&geo["height"]) / 2.0);

    // Pointing at the band: its site, its bytes there, its stack.
    assert_eq!(tip(&mut b, &s), None);
    b.mouse(&s, "mouseMoved", px, py, json!({}));
    let t = tip(&mut b, &s).expect("a tooltip over the band");
    for want in [geo["site"].as_str().unwrap(), "live here", "allocated", "MiB", geo["frame"].as_str().unwrap()] {
        assert!(t.contains(want), "{want:?} not in the tooltip: {t}");
    }
    b.mouse(&s, "mouseMoved", 2.0, 2.0, json!({}));
    assert_eq!(tip(&mut b, &s), None, "the tooltip goes when the pointer leaves");

    // The wheel zooms about the pointer; the axis follows.
    let whole = span(&mut b, &s);
    let labels = "[...document.querySelectorAll('svg.hr-timeline .hr-xtick')].map(t => t.textContent).join(' ')";
    let before = b.eval(&s, labels);
    for _ in 0..3 {
        b.mouse(&s, "mouseWheel", cx, cy, json!({"deltaX": 0, "deltaY": -120}));
    }
    let zoomed = span(&mut b, &s);
    let ratio = (zoomed.1 - zoomed.0) / (whole.1 - whole.0);
    assert!((ratio - 0.512).abs() < 0.01, "three notches in: {ratio}");
    assert!(zoomed.0 > whole.0 && zoomed.1 < whole.1, "about the pointer: {zoomed:?} in {whole:?}");
    assert_ne!(b.eval(&s, labels), before, "the axis is relabelled");

    // A drag to the left pans to later times by the distance dragged.
    let w = f(&geo["width"]);
    b.mouse(&s, "mousePressed", cx, cy, json!({"button": "left", "buttons": 1, "clickCount": 1}));
    b.mouse(&s, "mouseMoved", cx - 100.0, cy, json!({"button": "left", "buttons": 1}));
    b.mouse(&s, "mouseMoved", cx - 200.0, cy, json!({"button": "left", "buttons": 1}));
    b.mouse(&s, "mouseReleased", cx - 200.0, cy, json!({"button": "left", "buttons": 0, "clickCount": 1}));
    let panned = span(&mut b, &s);
    let expected = 200.0 / w * (zoomed.1 - zoomed.0);
    let moved = panned.0 - zoomed.0;
    assert!((moved - expected).abs() < expected * 0.05 || panned.1 >= whole.1, "panned {moved}, dragged {expected}");
    assert!(((panned.1 - panned.0) - (zoomed.1 - zoomed.0)).abs() < 1e-9 * whole.1.max(1.0), "the span is kept");

    // A double-click shows the whole trace again.
    b.click(&s, cx, cy, 1);
    b.click(&s, cx, cy, 2);
    assert_eq!(span(&mut b, &s), whole);

    // A click on a site in the legend: only that site, in every view.
    let site1 = geo["site1"].as_u64().unwrap();
    let key = b.eval(
        &s,
        &format!(
            "(() => {{ const k = document.querySelector('.hr-legend button[data-site=\"{site1}\"]'); \
             k.scrollIntoView({{block: 'center'}}); const r = k.getBoundingClientRect(); \
             return [r.left + r.width / 2, r.top + r.height / 2]; }})()"
        ),
    );
    b.click(&s, f(&key[0]), f(&key[1]), 1);
    let state = r#"(() => ({
        bar: document.querySelector('.hr-filter').hidden ? null : document.querySelector('.hr-filter').textContent,
        rows: [...document.querySelectorAll('tr[data-site]')].filter(r => !r.hidden).map(r => +r.dataset.site),
        allRows: document.querySelectorAll('tr[data-site]').length,
        bands: [...document.querySelectorAll('svg.hr-timeline .hr-band')].map(p => [+p.dataset.site, +p.getAttribute('fill-opacity')]),
        blocks: [...document.querySelectorAll('svg.hr-segments .hr-block')].map(r => +r.getAttribute('fill-opacity')),
    }))()"#;
    let v = b.eval(&s, state);
    let bar = v["bar"].as_str().expect("the filter is said");
    assert!(bar.contains(geo["site1name"].as_str().unwrap()), "{bar}");
    assert_eq!(v["rows"], json!([site1]), "only its row in the table of {} rows", v["allRows"]);
    for band in v["bands"].as_array().unwrap() {
        let (id, opacity) = (band[0].as_u64().unwrap(), f(&band[1]));
        assert_eq!(opacity > 0.5, id == site1, "band {id}: opacity {opacity}");
    }
    let dimmed = v["blocks"].as_array().unwrap().iter().filter(|o| f(o) < 0.5).count();
    assert!(dimmed > 0, "blocks of other sites are dimmed in the segment map");

    // A click on a band in the chart picks its site instead.
    let p = b.eval(
        &s,
        "(() => { document.querySelector('svg.hr-timeline').scrollIntoView({block: 'center'}); return 0; })()",
    );
    assert_eq!(p, 0);
    let g = b.eval(
        &s,
        r#"(() => { const d = JSON.parse(document.querySelector('script.hr-data').textContent);
            const r = document.querySelector('svg.hr-timeline .hr-plot').getBoundingClientRect();
            let i = 0; d.series[0].bytes.forEach((v, k) => { if (v > d.series[0].bytes[i]) i = k; });
            let top = 1; for (let k = 0; k < d.x.length; k++) top = Math.max(top, d.reserved[k], d.allocated[k]);
            const x0 = d.x[0], x1 = d.x[d.x.length - 1];
            return [r.left + (d.x[i] - x0) / (x1 - x0) * r.width, r.bottom - d.series[0].bytes[i] / 2 / (top * 1.05) * r.height, d.series[0].site]; })()"#,
    );
    b.click(&s, f(&g[0]), f(&g[1]), 1);
    let v = b.eval(&s, state);
    assert_eq!(v["rows"], json!([g[2]]), "the band's site is shown alone");
    the_panel_is_pinned_on(&mut b, &s, &g[2]);
    // And the filter's button shows every site again.
    let clear = b.eval(
        &s,
        "(() => { const k = document.querySelector('.hr-filter button'); k.scrollIntoView({block: 'center'}); \
         const r = k.getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2]; })()",
    );
    b.click(&s, f(&clear[0]), f(&clear[1]), 1);
    let v = b.eval(&s, state);
    assert_eq!(v["bar"], Value::Null);
    assert_eq!(v["rows"].as_array().unwrap().len() as u64, v["allRows"].as_u64().unwrap());
    assert_eq!(tip(&mut b, &s), None, "every site shown again: the panel is unpinned");

    // Pointing at an allocated block of the segment map: its size, state, site and stack.
    let blk = b.eval(
        &s,
        r#"(() => { const d = JSON.parse(document.querySelector('script.hr-data').textContent);
            for (const [row, seg] of d.layout.segments.entries()) for (const [k, blk] of seg.blocks.entries())
              if (blk[1] === 0 && blk[2] !== null) {
                const r = document.querySelector(`svg.hr-segments .hr-block[data-row="${row}"][data-block="${k}"]`);
                r.scrollIntoView({block: 'center'}); const b = r.getBoundingClientRect();
                return [b.left + b.width / 2, b.top + b.height / 2, d.sites[blk[2]].name]; }
            return null; })()"#,
    );
    b.mouse(&s, "mouseMoved", f(&blk[0]), f(&blk[1]), json!({}));
    let t = tip(&mut b, &s).expect("a tooltip over the block");
    for want in ["block of", "allocated", "segment at 0x", blk[2].as_str().unwrap()] {
        assert!(t.contains(want), "{want:?} not in the tooltip: {t}");
    }
    assert!(b.errors.is_empty(), "errors while driving: {:?}", b.errors);

    // With script off the page is whole: the static plots show, nothing interactive does.
    let s2 = b.open(&url, false);
    let v = b.eval(&s2, "[...document.querySelectorAll('.static svg')].map(g => g.getBoundingClientRect().height)");
    let heights: Vec<f64> = v.as_array().unwrap().iter().map(f).collect();
    assert!(heights.len() >= 3 && heights.iter().all(|&h| h > 100.0), "static plots: {heights:?}");
    assert_eq!(b.eval(&s2, "document.querySelectorAll('.live').length"), 0);
}

/// The view's state: which bands it draws, and how many allocations are in view.
fn view(b: &mut Browser, s: &str) -> (String, u64) {
    let v = b.eval(s, "(() => { const g = document.querySelector('svg.hr-timeline'); return [g.dataset.view, +g.dataset.allocations]; })()");
    (v[0].as_str().unwrap().to_string(), v[1].as_u64().unwrap())
}

#[test]
#[cfg_attr(no_browser, ignore = "needs Chromium (apt-get install chromium)")]
fn zoomed_in_each_allocation_is_its_own_band() {
    if !chromium() {
        return;
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/snapshots/qwen3-1.7b-train.pickle.gz");
    let snap = headroom_trace::snapshot::read_snapshot_file(&path).unwrap();
    let report = inspect("qwen3-1.7b-train.pickle.gz", &snap, &[], &InspectOptions::default());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("report.html");
    std::fs::write(&file, html::render(&[report], None)).unwrap();
    let mut b = Browser::launch();
    let s = b.open(&format!("file://{}", file.display()), true);

    // The whole trace holds too many to draw each: the bands by site, and the toggle is off.
    let (kind, n) = view(&mut b, &s);
    assert!(kind == "sites" && n > 5000, "{kind}, {n} allocations in view");
    assert_eq!(b.eval(&s, "document.querySelector('.hr-view').disabled"), true);

    // The wheel zooms in until few enough are in view; then each is its own band.
    let c = b.eval(
        &s,
        "(() => { const p = document.querySelector('svg.hr-timeline .hr-plot'); p.scrollIntoView({block: 'center'}); \
         const r = p.getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2]; })()",
    );
    let mut notches = 0;
    while view(&mut b, &s).1 > 5000 {
        b.mouse(&s, "mouseWheel", f(&c[0]), f(&c[1]), json!({"deltaX": 0, "deltaY": -120}));
        notches += 1;
        assert!(notches < 60, "zoomed in {notches} notches: {:?}", view(&mut b, &s));
    }
    let (kind, n) = view(&mut b, &s);
    assert_eq!(kind, "allocations", "{n} allocations in view");
    assert_eq!(b.eval(&s, "document.querySelectorAll('svg.hr-timeline .hr-alloc').length"), json!(n));

    // Pointing at the largest band on screen: its allocation's size, from the page's data.
    let a = b.eval(
        &s,
        r#"(() => { const d = JSON.parse(document.querySelector('script.hr-data').textContent).allocs;
            let best = null, area = 0;
            for (const r of document.querySelectorAll('svg.hr-timeline .hr-alloc')) {
              const b = r.getBoundingClientRect();
              if (b.width * b.height > area) { area = b.width * b.height; best = [b.left + b.width / 2, b.top + b.height / 2, +r.dataset.alloc]; }
            }
            return [best[0], best[1], d.s[best[2]] * d.unit]; })()"#,
    );
    let bytes = a[2].as_u64().unwrap();
    b.mouse(&s, "mouseMoved", f(&a[0]), f(&a[1]), json!({}));
    let t = tip(&mut b, &s).expect("a panel over the allocation");
    let want = format!("allocation of {}", headroom_alloc::units::format_size(bytes));
    assert!(t.contains(&want), "{want:?} not in the panel: {t}");
    assert!(t.contains(" s") && (t.contains("from ") || t.contains("live when")), "its time span: {t}");
    assert!(t.contains("role "), "its role: {t}");
    let frames = b.eval(&s, "document.querySelectorAll('.hr-tip details.hr-whole li').length");
    assert!(f(&frames) > 0.0, "its stack: {t}");

    // A click pins the panel on it; the toggle shows the bands by site and back.
    b.click(&s, f(&a[0]), f(&a[1]), 1);
    b.mouse(&s, "mouseMoved", 2.0, 2.0, json!({}));
    let pinned = tip(&mut b, &s).expect("the panel stays");
    assert!(pinned.contains(&want), "{pinned}");
    assert_eq!(b.eval(&s, "document.querySelector('.hr-tip').classList.contains('pinned')"), true);
    b.eval(&s, "document.querySelector('.hr-view').click()");
    assert_eq!(view(&mut b, &s).0, "sites");
    b.eval(&s, "document.querySelector('.hr-view').click()");
    assert_eq!(view(&mut b, &s).0, "allocations");
    assert!(b.errors.is_empty(), "errors while driving: {:?}", b.errors);
}
