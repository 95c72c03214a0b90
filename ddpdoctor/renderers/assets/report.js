// ddpdoctor HTML report charts. Builds SVG with DOM calls only (createElementNS + textContent), never
// innerHTML, so names that came from a trace are shown as text and can never become markup.
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var D = JSON.parse(document.getElementById("ddpdoctor-data").textContent);
  // One meaning per colour everywhere: blue backward, orange communication, red exposed communication (nothing
  // hides it), green overlapped, grey steps and other work, slate per-rank figures. A straggler is marked with a
  // star and an outline, never with red (red would say "exposed", and the straggler may be the faster rank).
  var C = { step: "#e5eaf1", bwd: "#3b82f6", bucket: "#f59e0b", last: "#dc2626", call: "#9ca3af",
    overlap: "#16a34a", exposed: "#dc2626", rank: "#64748b" };
  var LINES = ["#334155", "#7c3aed", "#0891b2", "#a16207", "#be185d", "#4d7c0f", "#1e40af", "#9f1239"];
  var MAX_TIMELINE_RANKS = 32, MAX_BAR_RANKS = 64, MAX_SKEW_BARS = 400;

  function el(tag, attrs, parent) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs) { if (Object.prototype.hasOwnProperty.call(attrs, k)) e.setAttribute(k, String(attrs[k])); }
    if (parent) parent.appendChild(e);
    return e;
  }
  function label(parent, x, y, text, anchor) {
    var t = el("text", { x: x, y: y, "text-anchor": anchor || "start" }, parent);
    t.textContent = text;
    return t;
  }
  function tip(node, text) { var t = el("title", {}, node); t.textContent = text; }
  function ms(us) { return (typeof us === "number" && isFinite(us)) ? (us / 1000).toFixed(2) : "-"; }
  function num(v) { return (typeof v === "number" && isFinite(v)) ? v : null; }
  function byRank(obj) { var out = {}; if (obj) { for (var k in obj) { out[parseInt(k, 10)] = obj[k]; } } return out; }
  function note(container, text) {
    var p = document.createElement("p"); p.className = "note"; p.textContent = text; container.appendChild(p);
  }
  function done(container) { container.setAttribute("data-rendered", "1"); }
  function niceStep(range, ticks) {
    var raw = range / ticks, mag = Math.pow(10, Math.floor(Math.log(raw) / Math.LN10));
    var n = raw / mag; return (n < 1.5 ? 1 : n < 3 ? 2 : n < 7 ? 5 : 10) * mag;
  }

  var ranks = D.ranks || [];
  var coll = D.collectives || {};
  var buckets = coll.buckets || [];
  var calls = coll.calls || [];
  var stragglerRanks = ((D.stragglers || {}).ranks) || [];

  // ---- per-rank timeline of one step: backward compute against each bucket's communication ----
  function stepIds() {
    var seen = {}, ids = [];
    ranks.forEach(function (r) { (r.per_step || []).forEach(function (s) {
      if (!seen[s.step]) { seen[s.step] = 1; ids.push(s.step); } }); });
    return ids.sort(function (a, b) { return a - b; });
  }

  function drawTimeline(container, step) {
    while (container.firstChild) container.removeChild(container.firstChild);
    var shown = ranks.slice(0, MAX_TIMELINE_RANKS);
    stragglerRanks.forEach(function (sr) {
      if (!shown.some(function (r) { return r.rank === sr; })) {
        var r = ranks.filter(function (x) { return x.rank === sr; })[0]; if (r) shown.push(r);
      }
    });
    var rows = [], t0 = Infinity, t1 = -Infinity;
    shown.forEach(function (r) {
      var s = (r.per_step || []).filter(function (p) { return p.step === step; })[0];
      if (!s || num(s.start_us) === null || num(s.dur_us) === null) return;
      var bk = buckets.filter(function (b) { return b.rank === r.rank && b.step === step; });
      var cs = calls.filter(function (c) { return c.rank === r.rank && c.step === step; });
      // Collectives that overlap in time (gloo and NCCL run buckets concurrently) get their own sub-lanes.
      var drawn = {}, items = [];
      bk.forEach(function (b) { if (num(b.start_us) !== null && num(b.end_us) !== null) { drawn[b.start_us] = 1; items.push({ b: b, bucket: true }); } });
      cs.forEach(function (c) { if (!drawn[c.start_us] && num(c.start_us) !== null && num(c.end_us) !== null) items.push({ b: c, bucket: false }); });
      items.sort(function (a, b) { return a.b.start_us - b.b.start_us; });
      var laneEnds = [];
      items.forEach(function (it) {
        var k = 0; while (k < laneEnds.length && laneEnds[k] > it.b.start_us) k++;
        laneEnds[k] = it.b.end_us; it.lane = k;
      });
      rows.push({ rank: r.rank, s: s, items: items, lanes: Math.max(1, laneEnds.length) });
      t0 = Math.min(t0, s.start_us); t1 = Math.max(t1, s.start_us + s.dur_us);
      bk.concat(cs).forEach(function (b) { if (num(b.end_us) !== null) t1 = Math.max(t1, b.end_us); });
    });
    if (!rows.length) { note(container, "No per-step data for step " + step + "."); done(container); return; }
    var left = 70, right = 20, top = 24, lane = 16, gap = 10, width = Math.max(700, container.clientWidth || 1000);
    var sub = 10, offsets = [], y0 = top;
    rows.forEach(function (row) { offsets.push(y0); y0 += lane + 2 + row.lanes * sub + gap; });
    var height = y0 + 30;
    var svg = el("svg", { width: width, height: height, role: "img", "aria-label": "timeline of step " + step }, container);
    var span = Math.max(1, t1 - t0), plotW = width - left - right;
    function X(t) { return left + (t - t0) / span * plotW; }
    var tick = niceStep(span, 8);
    for (var t = 0; t <= span + 1e-9; t += tick) {
      el("line", { x1: X(t0 + t), x2: X(t0 + t), y1: top - 4, y2: height - 24, "class": "grid" }, svg);
      label(svg, X(t0 + t), height - 10, (t / 1000).toFixed(t < 1000 ? 2 : 1) + " ms", "middle");
    }
    rows.forEach(function (row, i) {
      var y = offsets[i], s = row.s;
      var tag = "rank " + row.rank + (stragglerRanks.indexOf(row.rank) >= 0 ? " ★" : "");
      label(svg, left - 8, y + lane + 3, tag, "end");
      var stepBar = el("rect", { x: X(s.start_us), y: y, width: Math.max(1, X(s.start_us + s.dur_us) - X(s.start_us)),
        height: lane, fill: C.step, "class": "tl-step" }, svg);
      tip(stepBar, "rank " + row.rank + " step " + step + ": " + ms(s.dur_us) + " ms, compute " + ms(s.compute_us) +
        " ms, exposed comm " + ms(s.exposed_comm_us) + " ms");
      if (num(s.backward_start_us) !== null && num(s.backward_end_us) !== null) {
        var bw = el("rect", { x: X(s.backward_start_us), y: y + 2, height: lane - 4, fill: C.bwd, "class": "tl-backward",
          width: Math.max(1, X(s.backward_end_us) - X(s.backward_start_us)) }, svg);
        tip(bw, "backward: " + ms(s.backward_end_us - s.backward_start_us) + " ms");
      }
      row.items.forEach(function (it) {
        var b = it.b, cy = y + lane + 2 + it.lane * sub;
        var r = el("rect", { x: X(b.start_us), y: cy, height: sub - 2, width: Math.max(1, X(b.end_us) - X(b.start_us)),
          "class": it.bucket ? "tl-bucket" : "tl-call", fill: it.bucket ? C.bucket : C.call }, svg);
        var bend = num(s.backward_end_us);
        if (it.bucket && bend !== null && b.end_us > bend) {
          el("rect", { x: X(Math.max(bend, b.start_us)), y: cy, height: sub - 2, "class": "tl-exposed", fill: C.exposed,
            width: Math.max(1, X(b.end_us) - X(Math.max(bend, b.start_us))) }, svg);
        }
        if (it.bucket) {
          tip(r, "bucket " + b.index + (b.is_last ? " (last)" : "") + ": " + (num(b.bytes) === null ? "?" : (b.bytes / 1e6).toFixed(2)) +
            " MB, " + ms(b.dur_us) + " ms" + (b.after_backward_end_us > 0 ? ", runs " + ms(b.after_backward_end_us) +
            " ms after backward ends" : ""));
        } else {
          tip(r, String(b.op) + " (group " + String(b.group) + "): " + ms(b.dur_us) + " ms");
        }
      });
    });
    if (ranks.length > shown.length) note(container, (ranks.length - shown.length) + " more ranks not drawn.");
    done(container);
  }

  function setupTimeline() {
    var container = document.getElementById("chart-timeline");
    var select = document.getElementById("step-select");
    var ids = stepIds();
    if (!ids.length) { note(container, "No profiled steps."); done(container); return; }
    ids.forEach(function (id) { var o = document.createElement("option"); o.value = id; o.textContent = "step " + id; select.appendChild(o); });
    // Start on the slowest step of rank 0: the one worth looking at.
    var first = (ranks[0].per_step || []).slice().sort(function (a, b) { return b.dur_us - a.dur_us; })[0];
    select.value = first ? first.step : ids[0];
    select.addEventListener("change", function () { drawTimeline(container, parseInt(select.value, 10)); });
    drawTimeline(container, parseInt(select.value, 10));
  }

  function nSteps(r) { var n = Array.isArray(r.steps) ? r.steps.length : r.steps; return (typeof n === "number" && n > 0) ? n : 1; }

  // ---- overlapped vs exposed communication per rank ----
  function drawOverlap() {
    var container = document.getElementById("chart-overlap");
    var rs = ranks.slice().sort(function (a, b) { return (b.exposed_comm_us || 0) - (a.exposed_comm_us || 0); })
      .slice(0, MAX_BAR_RANKS);
    if (!rs.length) { note(container, "No ranks."); done(container); return; }
    var maxC = Math.max.apply(null, rs.map(function (r) { return (r.comm_us || 0) / nSteps(r); }).concat([1]));
    var left = 70, barH = 16, gap = 6, width = Math.max(700, container.clientWidth || 900), plotW = width - left - 330;
    var svg = el("svg", { width: width, height: 10 + rs.length * (barH + gap) + 10, role: "img", "aria-label": "overlap per rank" }, container);
    rs.forEach(function (r, i) {
      var y = 10 + i * (barH + gap);
      label(svg, left - 8, y + barH - 4, "rank " + r.rank, "end");
      if (num(r.comm_us) === null) { label(svg, left, y + barH - 4, "not measured"); return; }
      if (r.comm_us === 0) { label(svg, left, y + barH - 4, "no communication"); return; }
      var ov = (r.overlap_us || 0) / nSteps(r), ex = (r.exposed_comm_us || 0) / nSteps(r);  // per step
      var a = el("rect", { x: left, y: y, width: ov / maxC * plotW, height: barH, fill: C.overlap, "class": "ov-bar" }, svg);
      tip(a, "overlapped with compute: " + ms(ov) + " ms per step");
      var b = el("rect", { x: left + ov / maxC * plotW, y: y, width: ex / maxC * plotW, height: barH, fill: C.exposed, "class": "ex-bar" }, svg);
      tip(b, "exposed (nothing to hide it): " + ms(ex) + " ms per step");
      label(svg, left + (ov + ex) / maxC * plotW + 6, y + barH - 4,
        (r.overlap_pct === null || r.overlap_pct === undefined ? "-" : r.overlap_pct.toFixed(1)) + "% overlap, " +
        ms(ex) + " ms exposed per step (" + (typeof r.exposed_comm_pct === "number" ? r.exposed_comm_pct.toFixed(1) : "-") + "% of step)");
    });
    if (ranks.length > rs.length) note(container, "Showing the " + rs.length + " ranks with the most exposed communication of " + ranks.length + ".");
    done(container);
  }

  // ---- stragglers: wait each rank caused, median step time per rank, arrival skew per matched collective ----
  function barChart(container, items, unit, title) {
    var left = 70, barH = 14, gap = 5, width = Math.max(600, container.clientWidth || 800), plotW = width - left - 280;
    var maxV = Math.max.apply(null, items.map(function (it) { return it.v; }).concat([1e-9]));
    var h3 = document.createElement("h3"); h3.textContent = title; h3.style.fontSize = "13px"; container.appendChild(h3);
    var svg = el("svg", { width: width, height: 8 + items.length * (barH + gap), role: "img", "aria-label": title }, container);
    items.forEach(function (it, i) {
      var y = 4 + i * (barH + gap);
      label(svg, left - 8, y + barH - 3, it.label, "end");
      var r = el("rect", { x: left, y: y, width: Math.max(1, it.v / maxV * plotW), height: barH, "class": "st-bar",
        fill: C.rank, stroke: it.hot ? "#111827" : "none", "stroke-width": it.hot ? 2 : 0 }, svg);
      tip(r, it.label + ": " + it.text);
      label(svg, left + it.v / maxV * plotW + 6, y + barH - 3, it.text);
    });
    return svg;
  }

  function rankLabel(k) { return "rank " + k + (stragglerRanks.indexOf(k) >= 0 ? " ★" : ""); }

  function drawStragglers() {
    var container = document.getElementById("chart-stragglers");
    var ev = ((D.stragglers || {}).evidence) || {};
    var waits = byRank(ev.caused_wait_us), stepBy = byRank(ev.step_time_us_by_rank);
    var rs = ranks.map(function (r) { return r.rank; }).slice(0, MAX_BAR_RANKS);
    var any = false;
    if (Object.keys(waits).length) {
      any = true;
      barChart(container, rs.map(function (k) { return { label: rankLabel(k), v: waits[k] || 0, text: ms(waits[k] || 0) + " ms",
        hot: stragglerRanks.indexOf(k) >= 0 }; }), "ms", "Time the other ranks waited for this rank (sum over matched collectives)");
    }
    var stepItems = rs.map(function (k) {
      var v = stepBy[k]; if (v === undefined) { var r = ranks.filter(function (x) { return x.rank === k; })[0]; v = r && r.step_time_us ? r.step_time_us.median : null; }
      return { label: rankLabel(k), v: v || 0, text: ms(v) + " ms", hot: stragglerRanks.indexOf(k) >= 0 };
    });
    if (stepItems.length) { any = true; barChart(container, stepItems, "ms", "Median step time per rank"); }
    var matched = (coll.matched || []).slice(0, MAX_SKEW_BARS);
    if (matched.length) {
      any = true;
      barChart(container, matched.map(function (m, i) { return { label: "#" + (m.seq !== null && m.seq !== undefined ? m.seq : i),
        v: m.arrival_skew_us || 0, text: ms(m.arrival_skew_us) + " ms, last: rank " + m.last_rank + " (" + String(m.op) + ")",
        hot: stragglerRanks.indexOf(m.last_rank) >= 0 }; }), "ms", "Arrival skew per matched collective (latest start - earliest start)");
    }
    if (!any) note(container, "No cross-rank data (one rank, or no matched collectives).");
    done(container);
  }

  // ---- a small line/point chart: axes, ticks, and series of {x, y} ----
  function axes(svg, box, xr, yr, xlab, ylab, xfmt, logX) {
    function X(v) { var a = logX ? Math.log(v) : v, lo = logX ? Math.log(xr[0]) : xr[0], hi = logX ? Math.log(xr[1]) : xr[1];
      return box.l + (hi > lo ? (a - lo) / (hi - lo) : 0.5) * (box.w - box.l - box.r); }
    function Y(v) { return box.h - box.b - (yr[1] > yr[0] ? (v - yr[0]) / (yr[1] - yr[0]) : 0.5) * (box.h - box.t - box.b); }
    el("line", { x1: box.l, x2: box.w - box.r, y1: box.h - box.b, y2: box.h - box.b, "class": "axis" }, svg);
    el("line", { x1: box.l, x2: box.l, y1: box.t, y2: box.h - box.b, "class": "axis" }, svg);
    var yt = niceStep(Math.max(yr[1] - yr[0], 1e-9), 5);
    for (var v = Math.ceil(yr[0] / yt) * yt; v <= yr[1] + 1e-9; v += yt) {
      el("line", { x1: box.l, x2: box.w - box.r, y1: Y(v), y2: Y(v), "class": "grid" }, svg);
      label(svg, box.l - 6, Y(v) + 4, (Math.round(v * 100) / 100).toString(), "end");
    }
    label(svg, (box.l + box.w - box.r) / 2, box.h - 4, xlab, "middle");
    var yl = label(svg, 12, (box.t + box.h - box.b) / 2, ylab, "middle");
    yl.setAttribute("transform", "rotate(-90 12 " + ((box.t + box.h - box.b) / 2) + ")");
    return { X: X, Y: Y };
  }

  function drawSteps() {
    var container = document.getElementById("chart-steps");
    var series = ranks.slice(0, 16).map(function (r) {
      return { rank: r.rank, pts: (r.per_step || []).filter(function (s) { return num(s.dur_us) !== null; })
        .map(function (s) { return { x: s.step, y: s.dur_us / 1000 }; }) };
    }).filter(function (s) { return s.pts.length; });
    if (!series.length) { note(container, "No per-step data."); done(container); return; }
    var xs = [], ys = [];
    series.forEach(function (s) { s.pts.forEach(function (p) { xs.push(p.x); ys.push(p.y); }); });
    var width = Math.max(600, Math.min(1000, container.clientWidth || 900)), box = { l: 60, r: 110, t: 10, b: 36, w: width, h: 240 };
    var svg = el("svg", { width: width, height: box.h, role: "img", "aria-label": "step time per step and rank" }, container);
    var xmin = Math.min.apply(null, xs), xmax = Math.max.apply(null, xs);
    var a = axes(svg, box, [xmin - 0.5, xmax + 0.5], [0, Math.max.apply(null, ys) * 1.1], "profiler step", "ms per step");
    for (var st = xmin; st <= xmax; st++) label(svg, a.X(st), box.h - box.b + 14, String(st), "middle");
    series.forEach(function (s, i) {
      var hot = stragglerRanks.indexOf(s.rank) >= 0, color = LINES[i % LINES.length];
      el("polyline", { points: s.pts.map(function (p) { return a.X(p.x) + "," + a.Y(p.y); }).join(" "), fill: "none",
        stroke: color, "stroke-width": hot ? 2.5 : 1.5, "stroke-dasharray": hot ? "6 3" : "none", "class": "step-line" }, svg);
      s.pts.forEach(function (p) {
        var c = el("circle", { cx: a.X(p.x), cy: a.Y(p.y), r: 3, fill: color, "class": "step-point" }, svg);
        tip(c, "rank " + s.rank + " step " + p.x + ": " + p.y.toFixed(2) + " ms");
      });
      // a legend on the right, one row per rank (end-of-line labels collide when ranks run alike)
      var ly = box.t + 10 + i * 15;
      el("line", { x1: box.w - box.r + 10, x2: box.w - box.r + 30, y1: ly - 4, y2: ly - 4, stroke: color, "stroke-width": 2,
        "stroke-dasharray": hot ? "6 3" : "none" }, svg);
      label(svg, box.w - box.r + 34, ly, rankLabel(s.rank));
    });
    if (ranks.length > series.length) note(container, "The first " + series.length + " ranks of " + ranks.length + ".");
    done(container);
  }

  function drawWhatif() {
    var container = document.getElementById("chart-whatif");
    var w = D.whatif || {};
    var preds = (w.predictions || []).filter(function (p) { return num(p.bucket_cap_mb) !== null && p.bucket_cap_mb > 0 &&
      num(p.exposed_comm_us) !== null; });
    if (!w.available || !preds.length) { note(container, "No what-if: " + (w.reason || "no DDP buckets in this run") + "."); done(container); return; }
    var caps = preds.map(function (p) { return p.bucket_cap_mb; }), ys = preds.map(function (p) { return p.exposed_comm_us / 1000; });
    if (num(w.measured_exposed_us) !== null) ys.push(w.measured_exposed_us / 1000);
    var width = Math.max(600, Math.min(1000, container.clientWidth || 900)), box = { l: 60, r: 150, t: 10, b: 36, w: width, h: 240 };
    var svg = el("svg", { width: width, height: box.h, role: "img", "aria-label": "what-if curve" }, container);
    var a = axes(svg, box, [Math.min.apply(null, caps) / 1.3, Math.max.apply(null, caps) * 1.3], [0, Math.max.apply(null, ys) * 1.15],
      "bucket_cap_mb (log scale)", "exposed comm, ms per step", null, true);
    caps.forEach(function (c) { label(svg, a.X(c), box.h - box.b + 14, String(c), "middle"); });
    el("polyline", { points: preds.map(function (p) { return a.X(p.bucket_cap_mb) + "," + a.Y(p.exposed_comm_us / 1000); }).join(" "),
      fill: "none", stroke: C.exposed, "stroke-width": 2, "class": "whatif-line" }, svg);
    preds.forEach(function (p) {
      var c = el("circle", { cx: a.X(p.bucket_cap_mb), cy: a.Y(p.exposed_comm_us / 1000), r: 3, fill: C.exposed, "class": "whatif-point" }, svg);
      tip(c, "bucket_cap_mb=" + p.bucket_cap_mb + ": " + ms(p.exposed_comm_us) + " ms exposed per step, " +
        (num(p.buckets_per_step) === null ? "?" : p.buckets_per_step) + " bucket(s)");
    });
    if (num(w.measured_exposed_us) !== null) {
      var my = a.Y(w.measured_exposed_us / 1000);
      el("line", { x1: box.l, x2: box.w - box.r, y1: my, y2: my, stroke: "#111827", "stroke-dasharray": "4 3", "class": "whatif-measured" }, svg);
      label(svg, box.w - box.r + 4, my + 4, "measured " + ms(w.measured_exposed_us) + " ms");
    }
    var cur = num(w.current_bucket_cap_mb) !== null ? w.current_bucket_cap_mb : 25;
    if (num(w.current_predicted_exposed_us) !== null) {
      var cc = el("circle", { cx: a.X(Math.min(Math.max(cur, caps[0]), caps[caps.length - 1])), cy: a.Y(w.current_predicted_exposed_us / 1000),
        r: 6, fill: "none", stroke: "#111827", "stroke-width": 2, "class": "whatif-current" }, svg);
      tip(cc, "current bucket_cap_mb=" + cur + ": predicted " + ms(w.current_predicted_exposed_us) + " ms");
    }
    done(container);
  }

  function drawBuckets() {
    var container = document.getElementById("chart-buckets");
    var r0 = ranks[0];
    var steps = r0 ? (r0.per_step || []).filter(function (s) { return num(s.backward_start_us) !== null && num(s.backward_end_us) !== null; }) : [];
    var step = null, bk = [];
    for (var i = 0; i < steps.length && !bk.length; i++) {
      step = steps[i];
      bk = buckets.filter(function (b) { return b.rank === r0.rank && b.step === step.step && num(b.start_us) !== null && num(b.end_us) !== null; });
    }
    if (!bk.length) { note(container, "No gradient buckets recorded."); done(container); return; }
    var t0 = step.backward_start_us, bend = step.backward_end_us - t0;
    var tEnd = Math.max(bend, Math.max.apply(null, bk.map(function (b) { return b.end_us - t0; })));
    var maxMb = Math.max.apply(null, bk.map(function (b) { return (b.bytes || 0) / 1e6; }).concat([1e-6]));
    var width = Math.max(600, Math.min(1000, container.clientWidth || 900)), box = { l: 60, r: 20, t: 10, b: 36, w: width, h: 240 };
    var svg = el("svg", { width: width, height: box.h, role: "img", "aria-label": "bucket sizes against backward" }, container);
    var a = axes(svg, box, [Math.min(0, Math.min.apply(null, bk.map(function (b) { return b.start_us - t0; }))), tEnd * 1.02],
      [0, maxMb * 1.15], "ms since backward started (rank " + r0.rank + ", step " + step.step + ")", "bucket MB");
    var tick = niceStep(tEnd, 8);
    for (var t = 0; t <= tEnd + 1e-9; t += tick) label(svg, a.X(t), box.h - box.b + 14, (t / 1000).toFixed(1), "middle");
    el("rect", { x: a.X(0), y: box.t, width: Math.max(1, a.X(bend) - a.X(0)), height: box.h - box.t - box.b, fill: C.bwd,
      opacity: 0.15, "class": "bk-backward" }, svg);
    bk.forEach(function (b) {
      var mb = (b.bytes || 0) / 1e6, x0 = a.X(b.start_us - t0), x1 = a.X(b.end_us - t0), y = a.Y(mb);
      var r = el("rect", { x: x0, y: y, width: Math.max(1, x1 - x0), height: a.Y(0) - y, fill: C.bucket, opacity: 0.85, "class": "bk-bar" }, svg);
      tip(r, "bucket " + b.index + ": " + mb.toFixed(2) + " MB, all_reduce " + ms(b.dur_us) + " ms, starts " +
        ms(b.start_us - t0) + " ms after backward started");
      if (b.end_us - t0 > bend) {
        var xs = a.X(Math.max(bend, b.start_us - t0));
        el("rect", { x: xs, y: y, width: Math.max(1, x1 - xs), height: a.Y(0) - y, fill: C.exposed, opacity: 0.85, "class": "bk-exposed" }, svg);
      }
    });
    done(container);
  }

  setupTimeline();
  drawOverlap();
  drawStragglers();
  drawSteps();
  drawWhatif();
  drawBuckets();
  document.body.setAttribute("data-rendered", "1");
})();
