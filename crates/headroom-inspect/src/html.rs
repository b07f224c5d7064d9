//! The report as one self-contained HTML file: nothing from elsewhere (no
//! style sheet, font or script fetched), plots drawn by plotters as inline
//! SVG, so it reads whole with script off. An inline script
//! (`report.js`) makes it interactive where script runs: it redraws the
//! timeline and the segment map from data embedded beside them
//! ([`crate::page_data`]) to zoom and pan, show a band's or a block's size,
//! call site and stack on pointing, and filter every view to one site on a
//! click; zoomed in where few enough allocations are in view, it draws each
//! as its own band ([`crate::allocations`]). It opens offline and stays small on a 100 MB snapshot: the
//! timeline carries at most [`crate::timeline::MAX_POINTS`] points and the
//! segment map the largest [`crate::layout::MAP_SEGMENTS`] segments.

use crate::layout::Layout;
use crate::page_data::xs;
use crate::report::DeviceReport;
use crate::{Comparison, Report};
use headroom_alloc::units::format_size;
use headroom_alloc::BlockState;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use std::fmt::Write as _;

/// Colours of the bands, one per call site, then "other".
const PALETTE: [RGBColor; 9] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];
/// The allocated line, the reserved line and free blocks.
const ALLOCATED: RGBColor = RGBColor(20, 20, 20);
const RESERVED: RGBColor = RGBColor(200, 30, 30);
const FREE: RGBColor = RGBColor(215, 215, 215);
const PENDING: RGBColor = RGBColor(250, 180, 60);

/// Escapes text for HTML, and characters that act rather than show (see
/// [`crate::printable`]) but for line breaks and tabs, which HTML shows as spaces.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\n' | '\t' => out.push(c),
            c if crate::printable::acts(c) => out.extend(c.escape_unicode()),
            _ => out.push(c),
        }
    }
    out
}

/// The unit a chart's byte axis is drawn in.
fn unit(max: u64) -> (f64, &'static str) {
    if max >= 1 << 30 {
        ((1u64 << 30) as f64, "GiB")
    } else if max >= 1 << 20 {
        ((1u64 << 20) as f64, "MiB")
    } else {
        (1024.0, "KiB")
    }
}

/// Renders the reports (several snapshots with a comparison) as one page.
pub fn render(reports: &[Report], comparison: Option<&Comparison>) -> String {
    let mut h = String::new();
    let title = reports.iter().map(|r| r.snapshot.as_str()).collect::<Vec<_>>().join(", ");
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>headroom inspect: {}</title><style>{}</style></head><body>\n\
         <h1>headroom inspect</h1><p class=\"sub\">{}</p>\n",
        esc(&title),
        CSS,
        esc(&title)
    );
    if let Some(c) = comparison {
        comparison_section(&mut h, c);
    }
    let mut k = 0;
    for r in reports {
        for d in &r.devices {
            let _ = writeln!(h, "<section id=\"device-{k}\">");
            device_section(&mut h, r, d);
            let _ = writeln!(
                h,
                "<script type=\"application/json\" class=\"hr-data\">{}</script>\n</section>",
                crate::page_data::script_json(&crate::page_data::device_data(d))
            );
            k += 1;
        }
    }
    h.push_str("<footer>Made by headroom inspect: figures counted from the snapshot's trace; segment layouts and remedies from headroom's replay of it.</footer>\n");
    let _ = write!(h, "<script>\n{SCRIPT}</script>\n</body></html>\n");
    h
}

const CSS: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;max-width:1040px;\
color:#222;padding:0 16px}h1{margin-bottom:0}.sub{color:#666;margin-top:4px;word-break:break-all}\
h2{border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:40px}h3{margin-top:28px}\
table{border-collapse:collapse;margin:8px 0;font-size:14px}td,th{padding:3px 10px;border-bottom:1px solid #eee;\
text-align:left;vertical-align:top}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}\
.chart{margin:12px 0}.chart svg{max-width:100%;height:auto}.muted{color:#777}.box{background:#f6f8fa;\
border-left:4px solid #c33;padding:8px 12px;margin:8px 0}.rec{border-left-color:#2a7}code{font-size:13px}\
footer{margin-top:48px;color:#888;font-size:12px}\
section{position:relative}.live{display:none}.js .live{display:block}.static.replaced{display:none}\
.live svg{width:100%;height:auto;touch-action:none;user-select:none}.hr-tools{font-size:13px;margin:4px 0}\
.hr-tools button,.hr-filter button{font:inherit;margin-right:4px;padding:1px 8px;cursor:pointer}\
.hr-legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;margin:4px 0}\
.hr-key{display:inline-flex;align-items:center;gap:5px;background:none;border:0;padding:0;font:inherit;color:inherit}\
button.hr-key{cursor:pointer}button.hr-key:hover{text-decoration:underline}\
.hr-swatch{display:inline-block;width:12px;height:10px}.hr-swatch.hr-line{height:3px}\
.hr-tip{position:fixed;right:12px;bottom:12px;z-index:10;width:min(560px,45vw);max-height:40vh;overflow:auto;\
background:#fff;border:1px solid #bbb;box-shadow:0 2px 8px rgba(0,0,0,.18);padding:6px 10px;font-size:12px;\
pointer-events:none;word-break:break-all}.hr-tip.pinned{pointer-events:auto;border-color:#1f77b4}\
.hr-unpin{float:right;margin-left:8px}.hr-whole summary{cursor:pointer;color:#555;margin-top:4px}\
.hr-stack{margin:4px 0 0;padding-left:22px;font-family:ui-monospace,monospace;font-size:11px;color:#444}\
.hr-filter{background:#eef5ff;border-left:4px solid #1f77b4;padding:6px 12px;margin:8px 0;font-size:14px}\
.hr-filter button{margin-left:10px}tr.hr-pick{cursor:pointer}tr.hr-pick:hover{background:#f3f7fb}";

/// The script that makes the report interactive (see the module documentation).
const SCRIPT: &str = include_str!("report.js");

fn comparison_section(h: &mut String, c: &Comparison) {
    h.push_str(
        "<h2>Side by side</h2><table><tr><th>snapshot</th><th>device</th><th class=\"n\">peak allocated</th>\
                <th class=\"n\">peak reserved</th><th class=\"n\">reserved − allocated at peak</th><th>peak phase</th>\
                <th>largest site at peak</th></tr>\n",
    );
    for (i, r) in c.rows.iter().enumerate() {
        let _ = writeln!(
            h,
            "<tr><td>{}{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td><code>{}</code></td></tr>",
            esc(&r.snapshot),
            if i == c.peaks { " <b>(peaks)</b>" } else { "" },
            r.device,
            format_size(r.peak_allocated_bytes),
            format_size(r.peak_reserved_bytes),
            format_size(r.fragmentation_at_peak_bytes),
            r.peak_phase.unwrap_or("—"),
            esc(r.top_site.as_deref().unwrap_or("—"))
        );
    }
    h.push_str("</table>\n");
    for a in &c.against_first {
        let _ = writeln!(
            h,
            "<h3>{} device {} against the first: {}{}</h3>",
            esc(&c.rows[a.row].snapshot),
            c.rows[a.row].device,
            if a.peak_allocated_difference_bytes >= 0 { "+" } else { "−" },
            format_size(a.peak_allocated_difference_bytes.unsigned_abs())
        );
        if a.sites.is_empty() {
            h.push_str("<p class=\"muted\">The same call sites hold the same bytes at both peaks.</p>\n");
            continue;
        }
        h.push_str("<table><tr><th>site</th><th class=\"n\">first</th><th class=\"n\">this one</th><th class=\"n\">difference</th></tr>\n");
        for s in &a.sites {
            let _ = writeln!(
                h,
                "<tr><td><code>{}</code></td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}{}</td></tr>",
                esc(&s.site),
                format_size(s.first_bytes),
                format_size(s.other_bytes),
                if s.difference_bytes >= 0 { "+" } else { "−" },
                format_size(s.difference_bytes.unsigned_abs())
            );
        }
        h.push_str("</table>\n");
    }
}

fn device_section(h: &mut String, r: &Report, d: &DeviceReport) {
    peak_table(h, r, d);
    oom_box(h, d);
    recommendations(h, d);
    charts(h, d);
    sites_tables(h, d);
    leak_suspects(h, d);
    cannot_tell(h, d);
}

/// The device's heading and its peak: when, how much, in which phase; and the snapshot's moment.
fn peak_table(h: &mut String, r: &Report, d: &DeviceReport) {
    let _ = writeln!(h, "<h2>{} — device {}</h2>", esc(&r.snapshot), d.device);
    let when = match (d.peak_event_index, d.peak_time_us, d.timeline.start.time_us.or(first_time(d))) {
        (Some(i), Some(t), Some(t0)) => format!("entry {i}, {:.3} s into the trace", (t - t0) as f64 / 1e6),
        (Some(i), _, _) => format!("entry {i}"),
        (None, _, _) if d.trace_entries == 0 => "the snapshot's moment (no trace)".into(),
        (None, _, _) => "before the trace's first entry".into(),
    };
    h.push_str("<table>");
    let row = |h: &mut String, k: &str, v: String| {
        let _ = writeln!(h, "<tr><th>{k}</th><td class=\"n\">{v}</td></tr>");
    };
    row(h, "peak allocated", format!("{} at {}", format_size(d.peak_allocated_bytes), esc(&when)));
    row(h, "peak reserved", format_size(d.peak_reserved_bytes));
    row(h, "reserved − allocated at the peak", format_size(d.fragmentation_at_peak_bytes));
    if let Some(p) = d.peak_phase {
        row(h, "phase at the peak", p.name().to_string());
    }
    if let Some(s) = &d.step_phases {
        row(h, "peak of each phase", format!("{} (began at {})", s.peaks_text(), format_size(s.start_bytes)));
    }
    row(
        h,
        "now (the snapshot's moment)",
        format!(
            "{} allocated, {} reserved, {} active, {} requested",
            format_size(d.now.allocated_bytes),
            format_size(d.now.reserved_bytes),
            format_size(d.now.active_bytes),
            format_size(d.now.requested_bytes)
        ),
    );
    row(h, "trace entries", d.trace_entries.to_string());
    h.push_str("</table>\n");
}

/// The out-of-memory error the trace records, and each remedy as replayed.
fn oom_box(h: &mut String, d: &DeviceReport) {
    let Some(o) = &d.oom else { return };
    let _ = writeln!(
        h,
        "<div class=\"box\"><b>Out of memory</b> at entry {} ({}) requesting {}: {} free on the device, {} reserved of \
         which {} unallocated, largest cached free block {}. Call site <code>{}</code>.</div>",
        o.index,
        o.phase.name(),
        format_size(o.requested_bytes),
        o.free_bytes.map_or("?".into(), format_size),
        format_size(o.reserved_bytes),
        format_size(o.reserved_unallocated_bytes),
        o.largest_free_block_bytes.map_or("?".into(), format_size),
        esc(&o.site)
    );
    h.push_str("<table><tr><th>remedy (replayed)</th><th>avoided?</th><th class=\"n\">peak reserved</th><th>detail</th></tr>\n");
    for m in &o.remedies {
        let _ = writeln!(
            h,
            "<tr><td><code>{}</code></td><td>{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
            esc(&m.setting),
            match m.avoided {
                Some(true) => "yes",
                Some(false) => "no",
                None => "not checked",
            },
            m.peak_reserved_bytes.map_or("—".into(), format_size),
            esc(&m.note)
        );
    }
    h.push_str("</table>\n");
}

/// What to change, each with the evidence for it.
fn recommendations(h: &mut String, d: &DeviceReport) {
    if d.recommendations.is_empty() {
        return;
    }
    h.push_str("<h3>Recommendations</h3>\n");
    for m in &d.recommendations {
        let _ = writeln!(
            h,
            "<div class=\"box rec\"><b>{}</b><br><span class=\"muted\">{}</span></div>",
            esc(&m.what),
            esc(&m.evidence)
        );
    }
}

/// Memory and fragmentation over the trace, and the segment map.
fn charts(h: &mut String, d: &DeviceReport) {
    if d.timeline.points.len() > 1 {
        h.push_str("<h3>Memory over the trace</h3>\n");
        chart_of(h, "timeline", timeline_svg(d));
        h.push_str("<h3>Fragmentation over the trace</h3>\n");
        chart(h, fragmentation_svg(d));
    }
    if let Some(l) = &d.layout_at_peak {
        h.push_str("<h3>Segments at the peak (replayed)</h3>\n");
        chart_of(h, "segments", segments_svg(l, "at the peak"));
    } else if !d.layout_now.segments.is_empty() {
        h.push_str("<h3>Segments at the snapshot's moment</h3>\n");
        chart_of(h, "segments", segments_svg(&d.layout_now, "now"));
    }
    if let Some(f) = &d.segments_at_peak {
        let _ = writeln!(
            h,
            "<p>At the peak: largest free block {}, {} free in split segments that <code>empty_cache()</code> cannot return, {} in whole free segments it can.</p>",
            format_size(f.largest_free_block_bytes),
            format_size(f.inactive_split_bytes),
            format_size(f.releasable_bytes)
        );
    }
}

/// What is live at the peak, by call site and by role.
fn sites_tables(h: &mut String, d: &DeviceReport) {
    if d.top_sites.is_empty() {
        return;
    }
    h.push_str("<h3>Live at the peak, by call site</h3><table><tr><th>site</th><th class=\"n\">bytes</th><th class=\"n\">blocks</th><th>role</th><th>phase</th></tr>\n");
    for s in &d.top_sites {
        let _ = writeln!(
            h,
            "<tr data-site=\"{}\"><td><code>{}</code></td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td></tr>",
            s.id,
            esc(&s.site.site),
            format_size(s.bytes),
            s.blocks,
            s.role.name(),
            s.phase.name()
        );
    }
    if d.other_sites > 0 {
        let _ = writeln!(
            h,
            "<tr><td class=\"muted\">{} more sites</td><td></td><td></td><td></td><td></td></tr>",
            d.other_sites
        );
    }
    h.push_str("</table>\n<h3>By role</h3><table><tr><th>role</th><th class=\"n\">bytes</th><th>how it was inferred</th></tr>\n");
    for x in &d.roles {
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"muted\">{}</td></tr>",
            x.role.name(),
            format_size(x.bytes),
            esc(x.how)
        );
    }
    h.push_str("</table>\n");
}

/// The call sites that grow from one repetition of the workload to the next.
fn leak_suspects(h: &mut String, d: &DeviceReport) {
    let Some(reps) = &d.repetitions else { return };
    let _ = writeln!(
        h,
        "<h3>Leak suspects</h3><p class=\"muted\">{} repetitions of the workload, each beginning at an allocation by <code>{}</code>.</p>",
        reps.starts.len(),
        esc(&reps.marker_site)
    );
    if d.leak_suspects.is_empty() {
        h.push_str("<p>No call site grows from one repetition to the next.</p>\n");
    } else {
        h.push_str("<table><tr><th>site</th><th class=\"n\">growth per repetition</th><th class=\"n\">live at the last repetition</th></tr>\n");
        for l in &d.leak_suspects {
            let _ = writeln!(
                h,
                "<tr><td><code>{}</code></td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                esc(&l.site),
                format_size(l.growth_per_repetition_bytes),
                format_size(l.bytes_by_repetition.last().copied().unwrap_or(0))
            );
        }
        h.push_str("</table>\n");
    }
}

/// What this snapshot cannot tell, and the report's notes.
fn cannot_tell(h: &mut String, d: &DeviceReport) {
    if d.unavailable.is_empty() && d.notes.is_empty() {
        return;
    }
    h.push_str("<h3>What this snapshot cannot tell</h3><ul>\n");
    for u in d.unavailable.iter().chain(&d.notes) {
        let _ = writeln!(h, "<li>{}</li>", esc(u));
    }
    h.push_str("</ul>\n");
}

fn first_time(d: &DeviceReport) -> Option<i64> {
    d.timeline.points.iter().find_map(|p| p.time_us)
}

fn chart(h: &mut String, svg: Result<String, String>) {
    chart_of(h, "", svg)
}

/// A chart the script may redraw (`view` names which; "" for none).
fn chart_of(h: &mut String, view: &str, svg: Result<String, String>) {
    match svg {
        Ok(svg) => {
            let _ = write!(h, "<div class=\"chart static\" data-view=\"{view}\">");
            h.push_str(&svg);
            h.push_str("</div>\n");
        }
        Err(e) => {
            let _ = writeln!(h, "<p class=\"muted\">The chart could not be drawn: {}</p>", esc(&e));
        }
    }
}

/// A chart over the trace's timeline, `height` pixels high, bytes up to
/// `top` on the y axis (labelled `ylabel`, then the unit); `draw` adds the
/// series, given the x of each point and the byte divisor.
fn over_time(
    d: &DeviceReport,
    height: u32,
    top: u64,
    ylabel: &str,
    draw: impl for<'a> FnOnce(&mut Chart<'a, 'a>, &[f64], f64) -> Result<(), String>,
) -> Result<String, String> {
    let (x, xdesc) = xs(d);
    let (div, u) = unit(top.max(1));
    let xmax = x.last().copied().unwrap_or(1.0).max(1e-9);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut c = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..xmax, 0f64..top.max(1) as f64 / div * 1.05)
            .map_err(|e| e.to_string())?;
        c.configure_mesh()
            .x_desc(xdesc)
            .y_desc(format!("{ylabel}{u}"))
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(|e| e.to_string())?;
        draw(&mut c, &x, div)?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

fn timeline_svg(d: &DeviceReport) -> Result<String, String> {
    let pts = &d.timeline.points;
    let top = pts.iter().map(|p| p.totals.reserved_bytes.max(p.totals.allocated_bytes)).max().unwrap_or(1);
    over_time(d, 420, top, "", |c, x, div| {
        // Stacked bands: each drawn from zero to its running total, largest total first.
        let mut cumulative = vec![0u64; pts.len()];
        let mut layers = Vec::new();
        for s in &d.series {
            for (c, b) in cumulative.iter_mut().zip(&s.bytes) {
                *c += b;
            }
            layers.push((s.site.clone(), cumulative.clone()));
        }
        for (k, (site, ys)) in layers.iter().enumerate().rev() {
            let color = PALETTE[k % PALETTE.len()];
            c.draw_series(AreaSeries::new(x.iter().zip(ys).map(|(&x, &y)| (x, y as f64 / div)), 0.0, color.mix(0.75)))
                .map_err(|e| e.to_string())?
                .label(shorten(site, 70))
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
        }
        c.draw_series(LineSeries::new(
            x.iter().zip(pts).map(|(&x, p)| (x, p.totals.reserved_bytes as f64 / div)),
            RESERVED.stroke_width(2),
        ))
        .map_err(|e| e.to_string())?
        .label("reserved")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 12, y)], RESERVED.stroke_width(2)));
        c.draw_series(LineSeries::new(
            x.iter().zip(pts).map(|(&x, p)| (x, p.totals.allocated_bytes as f64 / div)),
            ALLOCATED.stroke_width(2),
        ))
        .map_err(|e| e.to_string())?
        .label("allocated")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 12, y)], ALLOCATED.stroke_width(2)));
        c.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .draw()
            .map_err(|e| e.to_string())
    })
}

fn fragmentation_svg(d: &DeviceReport) -> Result<String, String> {
    let pts = &d.timeline.points;
    let gap = |p: &crate::timeline::Point| p.totals.reserved_bytes.saturating_sub(p.totals.allocated_bytes);
    let top = pts.iter().map(gap).max().unwrap_or(1);
    over_time(d, 260, top, "reserved − allocated, ", |c, x, div| {
        c.draw_series(
            AreaSeries::new(x.iter().zip(pts).map(|(&x, p)| (x, gap(p) as f64 / div)), 0.0, RESERVED.mix(0.35))
                .border_style(RESERVED),
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
    })
}

fn segments_svg(l: &Layout, when: &str) -> Result<String, String> {
    let (segs, total) = l.map_segments();
    let longest = segs.first().map_or(1, |s| s.size).max(1);
    let (div, u) = unit(longest);
    let rows = segs.len().max(1);
    let height = (60 + rows * 14).min(800) as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let caption = if total > segs.len() {
            format!("the {} largest of {total} segments {when}", segs.len())
        } else {
            format!("{total} segments {when}")
        };
        let mut c = ChartBuilder::on(&root)
            .margin(12)
            .caption(caption, ("sans-serif", 14))
            .x_label_area_size(36)
            .y_label_area_size(20)
            .build_cartesian_2d(0f64..longest as f64 / div, 0f64..rows as f64)
            .map_err(|e| e.to_string())?;
        c.configure_mesh()
            .x_desc(format!("offset in the segment, {u}"))
            .disable_y_mesh()
            .disable_y_axis()
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(|e| e.to_string())?;
        let mut rects = Vec::new();
        for (row, s) in segs.iter().enumerate() {
            let y0 = rows as f64 - row as f64 - 0.9;
            let mut off = 0u64;
            for b in &s.blocks {
                let (size, state) = (b.size, b.state);
                let color = match state {
                    BlockState::ActiveAllocated => PALETTE[0],
                    BlockState::ActivePendingFree => PENDING,
                    BlockState::Inactive => FREE,
                };
                rects.push(Rectangle::new(
                    [(off as f64 / div, y0), ((off + size) as f64 / div, y0 + 0.8)],
                    color.filled(),
                ));
                off += size;
            }
        }
        c.draw_series(rects).map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

/// A site short enough for a legend.
fn shorten(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let tail: String = s.chars().rev().take(n - 1).collect::<Vec<_>>().into_iter().rev().collect();
        format!("…{tail}")
    }
}
