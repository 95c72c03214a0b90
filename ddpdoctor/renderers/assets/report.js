// ddpdoctor HTML report charts. Builds SVG with DOM calls only (createElementNS + textContent), never
// innerHTML, so names that came from a trace are shown as text and can never become markup.
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var D = JSON.parse(document.getElementById("ddpdoctor-data").textContent);
  var C = { step: "#e5eaf1", bwd: "#3b82f6", bucket: "#f59e0b", last: "#dc2626", call: "#9ca3af",
    overlap: "#16a34a", exposed: "#dc2626" };
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
      var tag = "rank " + row.rank + (stragglerRanks.indexOf(row.rank) >= 0 ? " *" : "");
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
          "class": it.bucket ? "tl-bucket" : "tl-call", fill: it.bucket ? (b.is_last ? C.last : C.bucket) : C.call }, svg);
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

  // ---- overlapped vs exposed communication per rank ----
  function drawOverlap() {
    var container = document.getElementById("chart-overlap");
    var rs = ranks.slice().sort(function (a, b) { return (b.exposed_comm_us || 0) - (a.exposed_comm_us || 0); })
      .slice(0, MAX_BAR_RANKS);
    if (!rs.length) { note(container, "No ranks."); done(container); return; }
    var maxC = Math.max.apply(null, rs.map(function (r) { return r.comm_us || 0; }).concat([1]));
    var left = 70, barH = 16, gap = 6, width = Math.max(700, container.clientWidth || 900), plotW = width - left - 330;
    var svg = el("svg", { width: width, height: 10 + rs.length * (barH + gap) + 10, role: "img", "aria-label": "overlap per rank" }, container);
    rs.forEach(function (r, i) {
      var y = 10 + i * (barH + gap);
      label(svg, left - 8, y + barH - 4, "rank " + r.rank, "end");
      if (num(r.comm_us) === null) { label(svg, left, y + barH - 4, "not measured"); return; }
      if (r.comm_us === 0) { label(svg, left, y + barH - 4, "no communication"); return; }
      var ov = r.overlap_us || 0, ex = r.exposed_comm_us || 0;
      var a = el("rect", { x: left, y: y, width: ov / maxC * plotW, height: barH, fill: C.overlap, "class": "ov-bar" }, svg);
      tip(a, "overlapped with compute: " + ms(ov) + " ms");
      var b = el("rect", { x: left + ov / maxC * plotW, y: y, width: ex / maxC * plotW, height: barH, fill: C.exposed, "class": "ex-bar" }, svg);
      tip(b, "exposed (nothing to hide it): " + ms(ex) + " ms");
      label(svg, left + (ov + ex) / maxC * plotW + 6, y + barH - 4,
        (r.overlap_pct === null || r.overlap_pct === undefined ? "-" : r.overlap_pct.toFixed(1)) + "% overlap, " +
        ms(ex) + " ms exposed (" + (typeof r.exposed_comm_pct === "number" ? r.exposed_comm_pct.toFixed(1) : "-") + "% of step)");
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
        fill: it.hot ? C.last : C.bwd }, svg);
      tip(r, it.label + ": " + it.text);
      label(svg, left + it.v / maxV * plotW + 6, y + barH - 3, it.text);
    });
    return svg;
  }

  function drawStragglers() {
    var container = document.getElementById("chart-stragglers");
    var ev = ((D.stragglers || {}).evidence) || {};
    var waits = byRank(ev.caused_wait_us), stepBy = byRank(ev.step_time_us_by_rank);
    var rs = ranks.map(function (r) { return r.rank; }).slice(0, MAX_BAR_RANKS);
    var any = false;
    if (Object.keys(waits).length) {
      any = true;
      barChart(container, rs.map(function (k) { return { label: "rank " + k, v: waits[k] || 0, text: ms(waits[k] || 0) + " ms",
        hot: stragglerRanks.indexOf(k) >= 0 }; }), "ms", "Time the other ranks waited for this rank (sum over matched collectives)");
    }
    var stepItems = rs.map(function (k) {
      var v = stepBy[k]; if (v === undefined) { var r = ranks.filter(function (x) { return x.rank === k; })[0]; v = r && r.step_time_us ? r.step_time_us.median : null; }
      return { label: "rank " + k, v: v || 0, text: ms(v) + " ms", hot: stragglerRanks.indexOf(k) >= 0 };
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

  setupTimeline();
  drawOverlap();
  drawStragglers();
  document.body.setAttribute("data-rendered", "1");
})();
