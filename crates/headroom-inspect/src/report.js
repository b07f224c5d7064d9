// headroom inspect's report, made interactive. The page is whole without
// this script: every plot is inline SVG. With it, each device's timeline and
// segment map are redrawn from the data embedded beside them, so that the
// timeline zooms (wheel, +/−) and pans (drag), pointing at a band or a block
// shows its size, call site and the user's frames of its stack in a fixed
// panel, and clicking a site (band, legend, block or table row) shows only
// that site in every view and pins the panel on it, with its whole stack on
// request. Where the visible stretch of the timeline holds few enough
// allocations (EACH_MAX), each is drawn as its own band, as PyTorch's
// memory_viz draws them; a toggle goes back to the bands by site. No network,
// no library: one file that opens offline.
(function () {
  "use strict";
  var PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf"];
  var ALLOCATED = "#141414", RESERVED = "#c81e1e", FREE = "#d7d7d7", PENDING = "#fab43c", OTHER = "#1f77b4";
  var NOT_DRAWN = "#b4b4b4";
  var NS = "http://www.w3.org/2000/svg";
  var W = 1000, H = 420, L = 76, R = 12, T = 12, B = 44;
  // The most allocations drawn each as its own band: one SVG rectangle each,
  // rebuilt on every wheel notch and drag step. Up to a few thousand redraw
  // within a frame or two; beyond that the page stutters, and on a 1000-unit
  // wide plot most bands would be thinner than a pixel anyway (the bands by
  // site show those stretches better).
  var EACH_MAX = 5000;

  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function html(tag, cls, parent, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  // As PyTorch's OOM message (and the text report) writes sizes.
  function size(b) {
    if (b <= 1024) return b + " bytes";
    if (b <= 1048576) return (b / 1024).toFixed(2) + " KiB";
    if (b <= 1073741824) return (b / 1048576).toFixed(2) + " MiB";
    return (b / 1073741824).toFixed(2) + " GiB";
  }
  function unit(max) {
    if (max >= 1073741824) return [1073741824, "GiB"];
    if (max >= 1048576) return [1048576, "MiB"];
    return [1024, "KiB"];
  }
  // About n round ticks over [lo, hi].
  function ticks(lo, hi, n) {
    var span = hi - lo;
    if (!(span > 0)) return [lo];
    var step = Math.pow(10, Math.floor(Math.log10(span / n)));
    var err = span / n / step;
    step *= err >= 7.5 ? 10 : err >= 3.5 ? 5 : err >= 1.5 ? 2 : 1;
    var out = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
    return out;
  }
  function label(v) {
    return Math.abs(v) >= 1e5 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(2) : String(+v.toPrecision(6));
  }

  function Device(section, d) {
    this.d = d;
    this.section = section;
    this.n = d.x.length;
    this.xmin = d.x[0];
    this.xmax = Math.max(d.x[this.n - 1], this.xmin + 1e-9);
    this.x0 = this.xmin;
    this.x1 = this.xmax;
    this.filter = null;
    this.each = true;
    this.allocs = d.allocs ? decode(d.allocs, this.xmax) : null;
    this.color = {};
    for (var k = 0; k < d.series.length; k++) this.color[d.series[k].site] = PALETTE[k % PALETTE.length];
    this.tip = html("div", "hr-tip", section);
    this.tip.hidden = true;
    this.bar = html("div", "hr-filter", null);
    this.bar.hidden = true;
    var first = section.querySelector("h2");
    section.insertBefore(this.bar, first ? first.nextSibling : section.firstChild);
    var self = this;
    section.querySelectorAll("tr[data-site]").forEach(function (tr) {
      tr.classList.add("hr-pick");
      tr.addEventListener("click", function () {
        self.pick(+tr.getAttribute("data-site"));
      });
    });
    if (this.n > 1) this.timeline();
    if (d.layout) this.segments();
  }

  // The allocations' columns as arrays: start and end x, bytes, site.
  function decode(a, xmax) {
    var n = a.t.length, start = new Float64Array(n), end = new Float64Array(n), bytes = new Float64Array(n), t = 0;
    for (var j = 0; j < n; j++) {
      t += a.t[j];
      start[j] = t * a.tick;
      end[j] = a.d[j] < 0 ? xmax : (t + a.d[j]) * a.tick;
      bytes[j] = a.s[j] * a.unit;
    }
    return { n: n, start: start, end: end, bytes: bytes, site: a.k, open: a.d, tick: a.tick, offset: null };
  }

  // Each allocation's offset in the stack: it keeps it while live, in the
  // lowest gap that holds it among the allocations live when it began. The
  // gaps are kept in order of offset, the last one open above the highest
  // live allocation; past GAPS_SEARCHED of them an allocation goes on top.
  var GAPS_SEARCHED = 2000;
  function offsets(al) {
    var off = new Float64Array(al.n), byEnd = [], gaps = [{ o: 0, s: Infinity }], e = 0, j, k;
    for (j = 0; j < al.n; j++) byEnd.push(j);
    byEnd.sort(function (a, b) {
      return al.end[a] - al.end[b] || a - b;
    });
    function free(o, sz) {
      var lo = 0, hi = gaps.length;
      while (lo < hi) {
        var m = (lo + hi) >> 1;
        if (gaps[m].o > o) hi = m;
        else lo = m + 1;
      }
      var p = lo, g = p > 0 ? gaps[p - 1] : null;
      if (g && g.o + g.s === o) {
        g.s += sz;
        p--;
      } else {
        g = { o: o, s: sz };
        gaps.splice(p, 0, g);
      }
      var next = gaps[p + 1];
      if (next && g.o + g.s === next.o) {
        g.s = next.s === Infinity ? Infinity : g.s + next.s;
        gaps.splice(p + 1, 1);
      }
    }
    for (j = 0; j < al.n; j++) {
      // Those ended by now (one that begins later ends later, whatever the ticks say).
      while (e < al.n && byEnd[e] < j && al.end[byEnd[e]] <= al.start[j] && al.open[byEnd[e]] >= 0) {
        var gone = byEnd[e++];
        free(off[gone], al.bytes[gone]);
      }
      var size = al.bytes[j], last = Math.min(gaps.length - 1, GAPS_SEARCHED);
      for (k = 0; k < last && gaps[k].s < size; k++);
      if (k === last) k = gaps.length - 1;
      off[j] = gaps[k].o;
      gaps[k].o += size;
      if (gaps[k].s !== Infinity) {
        gaps[k].s -= size;
        if (gaps[k].s === 0) gaps.splice(k, 1);
      }
    }
    return off;
  }

  Device.prototype.site = function (id) {
    var s = this.d.sites[id];
    if (s) return s;
    var al = this.d.allocs, a = al && al.sites[id];
    if (!a) return { name: "(site " + id + ")", role: "", phase: "", frames: [], stack: [], more: 0 };
    var f = function (k) {
      return al.files[al.frames[k][0]] + al.frames[k][1];
    };
    return { name: a[0], role: a[1], phase: a[2], frames: a[3].map(f), stack: a[4].map(f), more: a[5] };
  };

  Device.prototype.siteName = function (id) {
    return this.site(id).name;
  };

  // Shows or hides everything but site `id` (null: every site again).
  Device.prototype.pick = function (id) {
    this.filter = this.filter === id ? null : id;
    var self = this;
    // The panel stays on the site shown alone, to read and scroll, until it is shown no more.
    this.pinned = false;
    if (this.filter === null) this.hide();
    else {
      var s = this.site(this.filter);
      this.show(null, [s.name, s.role ? "role " + s.role + ", phase " + s.phase : ""], s);
      this.pin();
    }
    this.bar.hidden = this.filter === null;
    this.bar.textContent = "";
    if (this.filter !== null) {
      html("span", null, this.bar, "Showing only ");
      html("code", null, this.bar, this.siteName(this.filter));
      var clear = html("button", null, this.bar, "show every site");
      clear.type = "button";
      clear.addEventListener("click", function () {
        self.pick(null);
      });
    }
    this.section.querySelectorAll("tr[data-site]").forEach(function (tr) {
      tr.hidden = self.filter !== null && +tr.getAttribute("data-site") !== self.filter;
    });
    if (this.drawTimeline) this.drawTimeline();
    if (this.drawSegments) this.drawSegments();
  };

  // The panel: what is pointed at, with the user's own frames of its stack
  // first and the whole stack on request. Pinned, it keeps its site.
  Device.prototype.show = function (evt, lines, frames) {
    if (this.pinned) return;
    var tip = this.tip;
    tip.textContent = "";
    tip.classList.remove("pinned");
    lines.forEach(function (l, i) {
      if (l) html(i === 0 ? "b" : "div", null, tip, l);
    });
    if (frames && frames.frames.length) {
      var ol = html("ol", "hr-stack", tip);
      frames.frames.forEach(function (f) {
        html("li", null, ol, f);
      });
    }
    if (frames && frames.stack && frames.stack.length) {
      var whole = html("details", "hr-whole", tip);
      html("summary", null, whole, "whole stack (" + (frames.stack.length + frames.more) + " frames)" + (this.pinned ? "" : ": click the site to pin this panel"));
      var all = html("ol", "hr-stack", whole);
      frames.stack.forEach(function (f) {
        html("li", null, all, f);
      });
      if (frames.more) html("div", "muted", whole, "… " + frames.more + " more frames");
    }
    tip.hidden = false;
  };

  // Keeps the panel as it is until it is unpinned.
  Device.prototype.pin = function () {
    var self = this;
    this.pinned = true;
    this.tip.classList.add("pinned");
    var unpin = html("button", "hr-unpin", null, "unpin");
    unpin.type = "button";
    unpin.addEventListener("click", function () {
      self.pinned = false;
      self.hide();
    });
    this.tip.insertBefore(unpin, this.tip.firstChild);
  };

  // What the panel says of allocation j.
  Device.prototype.allocLines = function (j) {
    var al = this.allocs, s = this.site(al.site[j]), entries = this.d.xlabel === "trace entry";
    var at = function (x) {
      return entries ? "entry " + Math.max(0, Math.round(x / al.tick) - 1) : label(x) + " s";
    };
    var from = j < (this.d.allocs.before || 0) ? "live when the trace began" : "from " + at(al.start[j]);
    var to = al.open[j] < 0 ? "still live at the trace's end" : "to " + at(al.end[j]) + (entries ? "" : " (" + label(al.end[j] - al.start[j]) + " s)");
    return ["allocation of " + size(al.bytes[j]), from + ", " + to, s.name, s.role ? "role " + s.role + ", phase " + s.phase : ""];
  };

  Device.prototype.hide = function () {
    if (!this.pinned) this.tip.hidden = true;
  };

  Device.prototype.timeline = function () {
    var self = this, d = this.d;
    var staticChart = this.section.querySelector(".static[data-view=timeline]");
    var box = html("div", "live chart", null);
    staticChart.parentNode.insertBefore(box, staticChart);
    var tools = html("div", "hr-tools", box);
    function button(text, title, fn) {
      var b = html("button", null, tools, text);
      b.type = "button";
      b.title = title;
      b.setAttribute("aria-label", title);
      b.addEventListener("click", fn);
      return b;
    }
    button("+", "zoom in", function () {
      self.zoom(0.5, (self.x0 + self.x1) / 2);
    });
    button("−", "zoom out", function () {
      self.zoom(2, (self.x0 + self.x1) / 2);
    });
    button("reset", "show the whole trace", function () {
      self.zoom(Infinity, 0);
    });
    var toggle = self.allocs ? button("each allocation", "", function () {
      self.each = !self.each;
      self.pinned = false;
      self.hide();
      self.drawTimeline();
    }) : null;
    if (toggle) toggle.className = "hr-view";
    var status = html("span", "muted", tools, "");
    html("span", "muted", tools, " · wheel to zoom, drag to pan, double-click to reset; point at a band for its stack, click it to show only its site; zoomed in to few enough allocations, each is its own band");
    var svg = el("svg", { viewBox: "0 0 " + W + " " + H, class: "hr-timeline", role: "img", "aria-label": "memory over the trace" }, box);
    var legend = html("div", "hr-legend", box);
    d.series.forEach(function (s) {
      var item = html("button", "hr-key", legend);
      item.type = "button";
      item.setAttribute("data-site", s.site);
      var sw = html("span", "hr-swatch", item);
      sw.style.background = self.color[s.site];
      html("span", null, item, self.siteName(s.site));
      item.addEventListener("click", function () {
        self.pick(s.site);
      });
    });
    var rest = html("span", "hr-key", legend);
    html("span", "hr-swatch", rest).style.background = NOT_DRAWN;
    html("span", null, rest, "other call sites (not among the largest at the peak)");
    [["reserved", RESERVED], ["allocated", ALLOCATED]].forEach(function (k) {
      var item = html("span", "hr-key", legend);
      var sw = html("span", "hr-swatch hr-line", item);
      sw.style.background = k[1];
      html("span", null, item, k[0]);
    });

    // Cumulative band tops at every point: band k spans [cum[k-1], cum[k]).
    var cum = d.series.map(function () {
      return new Float64Array(self.n);
    });
    for (var i = 0; i < this.n; i++) {
      var run = 0;
      for (var k = 0; k < d.series.length; k++) {
        run += d.series[k].bytes[i];
        cum[k][i] = run;
      }
    }
    function sx(x) {
      return L + ((x - self.x0) / (self.x1 - self.x0)) * (W - L - R);
    }
    var yscale = 1;
    function sy(v) {
      return H - B - (v / yscale) * (H - T - B);
    }
    // Index of the last point at or before x.
    function at(x) {
      var lo = 0, hi = self.n - 1;
      while (lo < hi) {
        var mid = (lo + hi + 1) >> 1;
        if (d.x[mid] <= x) lo = mid;
        else hi = mid - 1;
      }
      return lo;
    }
    function path(ys, lower, i0, i1) {
      var p = "";
      for (var i = i0; i <= i1; i++) p += (i === i0 ? "M" : "L") + sx(d.x[i]).toFixed(1) + "," + sy(ys(i)).toFixed(1);
      if (lower) for (var j = i1; j >= i0; j--) p += "L" + sx(d.x[j]).toFixed(1) + "," + sy(lower(j)).toFixed(1);
      return p + (lower ? "Z" : "");
    }
    // The allocations that overlap the visible span, while there are few enough to draw each.
    var shown = null;
    function visible() {
      var al = self.allocs, out = [];
      if (!al) return null;
      for (var j = 0; j < al.n; j++) {
        if (al.start[j] <= self.x1 && al.end[j] >= self.x0) out.push(j);
      }
      return out;
    }
    this.drawTimeline = function () {
      while (svg.firstChild) svg.removeChild(svg.firstChild);
      svg.setAttribute("data-x0", self.x0);
      svg.setAttribute("data-x1", self.x1);
      var i0 = Math.max(0, at(self.x0) - 1), i1 = Math.min(self.n - 1, at(self.x1) + 1);
      var top = 1;
      for (var i = i0; i <= i1; i++) top = Math.max(top, d.reserved[i], d.allocated[i]);
      var vis = visible(), fits = vis !== null && vis.length <= EACH_MAX;
      shown = fits && self.each ? vis : null;
      if (shown && !self.allocs.offset) self.allocs.offset = offsets(self.allocs);
      if (shown) shown.forEach(function (j) {
        top = Math.max(top, self.allocs.offset[j] + self.allocs.bytes[j]);
      });
      svg.setAttribute("data-view", shown ? "allocations" : "sites");
      svg.setAttribute("data-allocations", vis ? vis.length : "");
      if (toggle) {
        toggle.disabled = !fits;
        toggle.textContent = shown ? "by site" : "each allocation";
        toggle.title = !fits ? "zoom in to at most " + EACH_MAX + " allocations to draw each as its own band (" + vis.length + " here)" : shown ? "show the bands by call site" : "draw each allocation as its own band";
        toggle.setAttribute("aria-label", toggle.title);
      }
      yscale = top * 1.05;
      var u = unit(top);
      el("rect", { x: 0, y: 0, width: W, height: H, fill: "#fff" }, svg);
      var clip = el("clipPath", { id: "hr-clip-" + d.device + "-" + self.section.id }, el("defs", {}, svg));
      el("rect", { x: L, y: T, width: W - L - R, height: H - T - B }, clip);
      var plot = el("g", { "clip-path": "url(#" + clip.id + ")" }, svg);
      if (shown) eachBand(plot);
      else d.series.forEach(function (s, k) {
        var dim = self.filter !== null && self.filter !== s.site;
        var band = el("path", {
          d: path(function (i) {
            return cum[k][i];
          }, function (i) {
            return k ? cum[k - 1][i] : 0;
          }, i0, i1),
          fill: self.color[s.site],
          "fill-opacity": dim ? 0.1 : 0.75,
          class: "hr-band",
          "data-site": s.site,
        }, plot);
        band.style.cursor = "pointer";
      });
      // What the drawn bands leave of allocated: the sites not drawn, as one band.
      var last = d.series.length ? cum[d.series.length - 1] : null;
      if (!shown) el("path", {
        d: path(function (i) {
          return Math.max(d.allocated[i], last ? last[i] : 0);
        }, function (i) {
          return last ? last[i] : 0;
        }, i0, i1),
        fill: NOT_DRAWN,
        "fill-opacity": self.filter !== null ? 0.1 : 0.75,
        class: "hr-band-rest",
      }, plot);
      el("path", { d: path(function (i) { return d.reserved[i]; }, null, i0, i1), fill: "none", stroke: RESERVED, "stroke-width": 2 }, plot);
      el("path", { d: path(function (i) { return d.allocated[i]; }, null, i0, i1), fill: "none", stroke: ALLOCATED, "stroke-width": 2 }, plot);
      var axis = el("g", { "font-size": 12, fill: "#333", "font-family": "sans-serif" }, svg);
      el("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#333" }, axis);
      el("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#333" }, axis);
      ticks(self.x0, self.x1, 8).forEach(function (v) {
        var x = sx(v);
        if (x < L - 0.5 || x > W - R + 0.5) return;
        el("line", { x1: x, y1: H - B, x2: x, y2: H - B + 5, stroke: "#333" }, axis);
        el("text", { x: x, y: H - B + 18, "text-anchor": "middle", class: "hr-xtick" }, axis).textContent = label(v);
      });
      ticks(0, yscale / u[0], 6).forEach(function (v) {
        var y = sy(v * u[0]);
        if (y < T - 0.5) return;
        el("line", { x1: L - 5, y1: y, x2: L, y2: y, stroke: "#333" }, axis);
        el("text", { x: L - 8, y: y + 4, "text-anchor": "end" }, axis).textContent = label(v);
      });
      el("text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle" }, axis).textContent = d.xlabel;
      el("text", { x: 14, y: (T + H - B) / 2, "text-anchor": "middle", transform: "rotate(-90 14 " + (T + H - B) / 2 + ")" }, axis).textContent = u[1];
      el("line", { class: "hr-guide", x1: 0, y1: T, x2: 0, y2: H - B, stroke: "#555", "stroke-dasharray": "3,3", visibility: "hidden" }, svg);
      el("rect", { class: "hr-plot", x: L, y: T, width: W - L - R, height: H - T - B, fill: "transparent" }, svg);
      var whole = self.x0 <= self.xmin && self.x1 >= self.xmax;
      status.textContent = (whole ? "the whole trace" : "showing " + label(self.x0) + " to " + label(self.x1) + " of " + label(self.xmax)) + (vis ? ", " + vis.length + " allocations" + (d.allocs.dropped ? " (the largest; " + d.allocs.dropped + " smaller in the trace not kept)" : "") + (shown ? ", each its own band" : "") : "") + " ";
    };
    // Each allocation as its own band: a rectangle from its start to its end, at its offset.
    function eachBand(plot) {
      var al = self.allocs, xl = sx(self.x0) - 2, xr = sx(self.x1) + 2;
      shown.forEach(function (j) {
        var site = al.site[j], dim = self.filter !== null && self.filter !== site;
        var a = Math.max(xl, sx(al.start[j])), b = Math.min(xr, sx(al.end[j]));
        var y1 = sy(al.offset[j]), y0 = sy(al.offset[j] + al.bytes[j]);
        var r = el("rect", {
          x: a.toFixed(1), y: y0.toFixed(2), width: Math.max(0.5, b - a).toFixed(1), height: Math.max(0.3, y1 - y0).toFixed(2),
          fill: self.color[site] || NOT_DRAWN, "fill-opacity": dim ? 0.1 : 0.8,
          class: "hr-alloc", "data-alloc": j, "data-site": site,
        }, plot);
        // An edge between bands thick enough to show one; thinner ones would be all edge.
        if (y1 - y0 > 3) {
          r.setAttribute("stroke", "#fff");
          r.setAttribute("stroke-width", 0.5);
        }
        r.style.cursor = "pointer";
      });
    }
    // The data coordinates under a pointer event.
    function where(evt) {
      var r = svg.getBoundingClientRect();
      var px = ((evt.clientX - r.left) / r.width) * W, py = ((evt.clientY - r.top) / r.height) * H;
      return { px: px, py: py, x: self.x0 + ((px - L) / (W - L - R)) * (self.x1 - self.x0), v: ((H - B - py) / (H - T - B)) * yscale, inside: px >= L && px <= W - R && py >= T && py <= H - B };
    }
    // What lies under a pointer: the point and the band (or line, or allocation) there.
    function under(p) {
      var i = at(p.x);
      if (i + 1 < self.n && Math.abs(d.x[i + 1] - p.x) < Math.abs(d.x[i] - p.x)) i++;
      if (shown) {
        var al = self.allocs;
        for (var j = shown.length - 1; j >= 0; j--) {
          var a = shown[j];
          if (al.start[a] <= p.x && p.x <= al.end[a] && p.v >= al.offset[a] && p.v < al.offset[a] + al.bytes[a]) return { i: i, site: al.site[a], alloc: a };
        }
        return { i: i, site: null };
      }
      for (var k = 0; k < d.series.length; k++) {
        if (p.v >= (k ? cum[k - 1][i] : 0) && p.v < cum[k][i]) return { i: i, site: d.series[k].site, bytes: d.series[k].bytes[i] };
      }
      return { i: i, site: null };
    }
    var drag = null;
    svg.addEventListener("wheel", function (evt) {
      var p = where(evt);
      if (!p.inside) return;
      evt.preventDefault();
      self.zoom(evt.deltaY < 0 ? 0.8 : 1.25, p.x);
    }, { passive: false });
    svg.addEventListener("pointerdown", function (evt) {
      var p = where(evt);
      if (!p.inside) return;
      drag = { px: evt.clientX, x0: self.x0, x1: self.x1, moved: false };
      svg.setPointerCapture(evt.pointerId);
    });
    svg.addEventListener("pointermove", function (evt) {
      var p = where(evt);
      if (drag) {
        var r = svg.getBoundingClientRect();
        var dx = ((evt.clientX - drag.px) / r.width) * W;
        if (Math.abs(dx) > 3) drag.moved = true;
        if (drag.moved) {
          var shift = (-dx / (W - L - R)) * (drag.x1 - drag.x0);
          shift = Math.max(self.xmin - drag.x0, Math.min(self.xmax - drag.x1, shift));
          self.x0 = drag.x0 + shift;
          self.x1 = drag.x1 + shift;
          self.drawTimeline();
          self.hide();
          return;
        }
      }
      var guide = svg.querySelector(".hr-guide");
      if (!p.inside) {
        guide.setAttribute("visibility", "hidden");
        self.hide();
        return;
      }
      var u = under(p), i = u.i;
      guide.setAttribute("x1", sx(d.x[i]));
      guide.setAttribute("x2", sx(d.x[i]));
      guide.setAttribute("visibility", "visible");
      var when = (d.xlabel === "trace entry" ? "entry " : label(d.x[i]) + " s, entry ") + (d.entry[i] === null ? "(start)" : d.entry[i]);
      var lines = [when, "allocated " + size(d.allocated[i]) + ", reserved " + size(d.reserved[i])];
      var frames = null;
      if (u.alloc !== undefined) {
        self.show(evt, self.allocLines(u.alloc), self.site(u.site));
        return;
      }
      if (u.site !== null) {
        var s = self.site(u.site);
        lines.push(s.name + ": " + size(u.bytes) + " live here");
        if (s.role) lines.push("role " + s.role + ", phase " + s.phase);
        frames = s;
      } else if (shown) {
        // Between the bands of each allocation: room its neighbours' frees left.
      } else if (p.v <= d.allocated[i]) {
        lines.push("other call sites (not among the largest at the peak)");
      } else if (p.v <= d.reserved[i]) {
        lines.push("reserved but not allocated: cached by the allocator");
      }
      self.show(evt, lines, frames);
    });
    svg.addEventListener("pointerup", function (evt) {
      var p = where(evt);
      var clicked = drag && !drag.moved;
      drag = null;
      if (clicked && p.inside) {
        var u = under(p);
        if (u.alloc !== undefined) {
          // The panel is pinned on the allocation clicked (another click moves it).
          self.pinned = false;
          self.show(evt, self.allocLines(u.alloc), self.site(u.site));
          self.pin();
        } else if (shown && self.filter === null) {
          self.pinned = false;
          self.hide();
        } else if (u.site !== null) self.pick(u.site);
      }
    });
    svg.addEventListener("pointerleave", function () {
      self.hide();
    });
    svg.addEventListener("dblclick", function () {
      self.zoom(Infinity, 0);
    });
    staticChart.classList.add("replaced");
    this.drawTimeline();
  };

  // Scales the visible span by `factor` about x (Infinity: the whole trace).
  Device.prototype.zoom = function (factor, x) {
    var span = this.xmax - this.xmin;
    var w = Math.min(span, Math.max((this.x1 - this.x0) * factor, span / 1e6, 1e-9));
    var lo = x - ((x - this.x0) / (this.x1 - this.x0)) * w;
    lo = Math.max(this.xmin, Math.min(this.xmax - w, lo));
    this.x0 = lo;
    this.x1 = lo + w;
    this.drawTimeline();
  };

  Device.prototype.segments = function () {
    var self = this, layout = this.d.layout;
    var staticChart = this.section.querySelector(".static[data-view=segments]");
    if (!staticChart) return;
    var box = html("div", "live chart", null);
    staticChart.parentNode.insertBefore(box, staticChart);
    var rows = layout.segments.length;
    var h = 40 + rows * 14;
    var svg = el("svg", { viewBox: "0 0 " + W + " " + h, class: "hr-segments", role: "img", "aria-label": "segments " + layout.when }, box);
    var longest = Math.max(1, layout.segments.length ? layout.segments[0].size : 1);
    var u = unit(longest);
    this.drawSegments = function () {
      while (svg.firstChild) svg.removeChild(svg.firstChild);
      el("rect", { x: 0, y: 0, width: W, height: h, fill: "#fff" }, svg);
      var head = layout.total > rows ? "the " + rows + " largest of " + layout.total + " segments " : rows + " segments ";
      el("text", { x: W / 2, y: 14, "text-anchor": "middle", "font-size": 13, "font-family": "sans-serif" }, svg).textContent = head + layout.when + ", by offset (" + u[1] + " axis to " + label(longest / u[0]) + ")";
      layout.segments.forEach(function (s, row) {
        var off = 0, y = 24 + row * 14;
        s.blocks.forEach(function (b, k) {
          var x = 12 + (off / longest) * (W - 24), w = Math.max(0.5, (b[0] / longest) * (W - 24));
          var fill = b[1] === 2 ? FREE : b[1] === 1 ? PENDING : b[2] !== null && self.color[b[2]] ? self.color[b[2]] : OTHER;
          var dim = self.filter !== null && b[2] !== self.filter;
          var r = el("rect", { x: x.toFixed(2), y: y, width: w.toFixed(2), height: 11, fill: fill, "fill-opacity": dim ? 0.2 : 1, class: "hr-block", "data-row": row, "data-block": k }, svg);
          r.style.cursor = b[2] !== null ? "pointer" : "default";
          off += b[0];
        });
      });
    };
    function block(evt) {
      var t = evt.target;
      if (!t.classList || !t.classList.contains("hr-block")) return null;
      var s = layout.segments[+t.getAttribute("data-row")];
      var k = +t.getAttribute("data-block"), off = 0;
      for (var j = 0; j < k; j++) off += s.blocks[j][0];
      return { s: s, b: s.blocks[k], off: off };
    }
    svg.addEventListener("pointermove", function (evt) {
      var hit = block(evt);
      if (!hit) return self.hide();
      var b = hit.b;
      var state = ["allocated", "freed, waiting for its stream (pending)", "free (cached)"][b[1]];
      var lines = ["block of " + size(b[0]) + ": " + state, "at offset " + size(hit.off) + " of a " + size(hit.s.size) + " segment at " + hit.s.address + (hit.s.expandable ? " (expandable)" : "")];
      var site = b[2] !== null ? self.d.sites[b[2]] : null;
      if (site) lines.push(site.name + " (role " + site.role + ", phase " + site.phase + ")");
      self.show(evt, lines, site);
    });
    svg.addEventListener("pointerleave", function () {
      self.hide();
    });
    svg.addEventListener("click", function (evt) {
      var hit = block(evt);
      if (hit && hit.b[2] !== null) self.pick(hit.b[2]);
    });
    staticChart.classList.add("replaced");
    this.drawSegments();
  };

  document.documentElement.classList.add("js");
  document.querySelectorAll("script.hr-data").forEach(function (s) {
    new Device(s.closest("section"), JSON.parse(s.textContent));
  });
})();
