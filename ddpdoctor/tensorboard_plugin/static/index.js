// ddpdoctor's TensorBoard tab: the run directories under the log dir, a run's report (the same page as
// RUN/report.html) and a canvas timeline of every rank's trace on one clock. No library, no network: every
// request goes to this plugin's own routes. Strings from traces only ever reach the page through textContent.

const COLORS = {
  collective: "#f59e0b", // orange: communication, as in the HTML report
  backward: "#3b82f6", // blue: backward
  step: "#d1d5db", // grey: ProfilerStep
  optimizer: "#a855f7",
  other: ["#86efac", "#67e8f9", "#c4b5fd", "#fda4af", "#fcd34d", "#a7f3d0", "#bfdbfe", "#fbcfe8"],
};
const STATUS_COLOR = {ok: "#15803d", warning: "#b45309", error: "#b91c1c"};
const ROW = 13; // px per nesting level
const GUTTER = 190; // px of track labels
const AXIS = 16; // px of the time axis strip at the top

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "style") node.style.cssText = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const child of children) {
    if (child == null) continue;
    node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
}

async function getJson(path) {
  const response = await fetch(path);
  const data = await response.json();
  if (!response.ok) throw new Error(data.error || response.statusText);
  return data;
}

function colorFor(name, cat) {
  if (/all_?reduce|allgather|all_gather|reduce_scatter|broadcast|nccl|gloo|c10d::|barrier|send|recv/i.test(name)) {
    return COLORS.collective;
  }
  if (/^ProfilerStep#/.test(name)) return COLORS.step;
  if (/backward|autograd::engine/i.test(name)) return COLORS.backward;
  if (/optimizer/i.test(name)) return COLORS.optimizer;
  let h = 0;
  for (let i = 0; i < cat.length; i++) h = (h * 31 + cat.charCodeAt(i)) >>> 0;
  return COLORS.other[h % COLORS.other.length];
}

function fmtMs(us) {
  return (us / 1000).toFixed(us < 1000 ? 3 : 2) + " ms";
}

function style() {
  document.head.appendChild(el("style", {}, `
    body { font: 13px system-ui, sans-serif; margin: 12px; color: #111827; }
    h2 { font-size: 15px; margin: 14px 0 6px; }
    table.runs { border-collapse: collapse; width: 100%; }
    table.runs td, table.runs th { border-bottom: 1px solid #e5e7eb; padding: 4px 8px; text-align: left; }
    table.runs tr.run { cursor: pointer; } table.runs tr.run:hover { background: #f3f4f6; }
    table.runs tr.selected { background: #e0f2fe; }
    .status { font-weight: 600; } .note { color: #6b7280; }
    iframe.report { width: 100%; border: 1px solid #e5e7eb; height: 900px; }
    .tl-wrap { border: 1px solid #e5e7eb; overflow-y: auto; max-height: 620px; position: relative; }
    .tl-tools button { margin-right: 4px; }
    .details { font-family: ui-monospace, monospace; white-space: pre-wrap; background: #f9fafb;
               border: 1px solid #e5e7eb; padding: 6px; min-height: 2.5em; margin-top: 6px; }
    .legend span { margin-right: 12px; } .legend i { display: inline-block; width: 10px; height: 10px;
               margin-right: 4px; vertical-align: middle; }
  `));
}

function runTable(runs, onPick) {
  const body = el("tbody");
  for (const r of runs) {
    const counts = r.findings || {};
    const findings = ["error", "warning", "info"].filter((k) => counts[k]).map((k) => `${counts[k]} ${k}`).join(", ");
    const row = el("tr", {class: "run", "data-run": r.run, onclick: () => onPick(r, row)},
      el("td", {}, r.run),
      el("td", {}, r.command || "-"),
      el("td", {class: "status", style: `color:${STATUS_COLOR[r.status] || "#111827"}`}, r.status || "?"),
      el("td", {}, r.error || r.why || ""),
      el("td", {}, String(r.ranks ?? "-")),
      el("td", {}, r.exit_code == null ? "-" : String(r.exit_code)),
      el("td", {}, findings || "none"),
      el("td", {}, r.has_traces ? "yes" : "no"));
    body.appendChild(row);
  }
  return el("table", {class: "runs"},
    el("thead", {}, el("tr", {}, ...["run", "command", "verdict", "why", "ranks", "exit", "findings", "traces"]
      .map((h) => el("th", {}, h)))), body);
}

class Timeline {
  constructor(host, data) {
    this.data = data;
    this.rows = []; // {y, h, rank, track, events}
    let y = AXIS; // the time axis has its own strip: a rank's label (a class's ranges) never runs under it
    for (const rank of data.ranks) {
      this.rows.push({y, h: 18, header: rank.label + (rank.clock_offset_us ? ` (clock shifted ${(-rank.clock_offset_us).toFixed(1)} µs)` : "")});
      y += 18;
      for (const track of rank.tracks) {
        const h = track.depth * ROW + 4;
        this.rows.push({y, h, rank: rank.rank, track: track.name, events: track.events});
        y += h;
      }
    }
    this.height = Math.max(y, 40);
    let end = 0;
    for (const row of this.rows) for (const e of row.events || []) end = Math.max(end, e[0] + e[1]);
    this.end = end || 1;
    this.t0 = 0; this.t1 = this.end; // visible window, µs from the first event
    this.canvas = el("canvas", {id: "timeline-canvas", tabindex: "0"});
    this.wrap = el("div", {class: "tl-wrap"}, this.canvas);
    this.info = el("div", {class: "details", id: "event-details"}, "Click an event for its details.");
    const tools = el("div", {class: "tl-tools"},
      el("button", {onclick: () => this.zoom(0.5)}, "zoom in"),
      el("button", {onclick: () => this.zoom(2)}, "zoom out"),
      el("button", {onclick: () => this.pan(-0.25)}, "◀"),
      el("button", {onclick: () => this.pan(0.25)}, "▶"),
      el("button", {onclick: () => { this.t0 = 0; this.t1 = this.end; this.draw(); }}, "reset"),
      el("span", {class: "note"}, " wheel: zoom at the pointer · drag: pan · W/S zoom, A/D pan · click: details"));
    const legend = el("div", {class: "legend"},
      ...[["communication (collectives)", COLORS.collective], ["backward", COLORS.backward],
        ["profiler step", COLORS.step], ["optimizer", COLORS.optimizer], ["other ops (by category)", COLORS.other[0]]]
        .map(([t, c]) => el("span", {}, el("i", {style: `background:${c}`}), t)));
    host.append(tools, legend, this.wrap, this.info);
    this.bind();
    this.resize();
    window.addEventListener("resize", () => this.resize());
  }

  resize() {
    const width = Math.max(400, this.wrap.clientWidth || 1000);
    const ratio = window.devicePixelRatio || 1;
    this.width = width;
    this.canvas.width = width * ratio; this.canvas.height = this.height * ratio;
    this.canvas.style.width = width + "px"; this.canvas.style.height = this.height + "px";
    this.ctx = this.canvas.getContext("2d");
    this.ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    this.draw();
  }

  x(t) { return GUTTER + (t - this.t0) / (this.t1 - this.t0) * (this.width - GUTTER); }
  t(x) { return this.t0 + (x - GUTTER) / (this.width - GUTTER) * (this.t1 - this.t0); }

  zoom(factor, atX) {
    const center = atX == null ? (this.t0 + this.t1) / 2 : this.t(atX);
    const span = Math.min(this.end * 1.2, Math.max(1, (this.t1 - this.t0) * factor));
    const share = atX == null ? 0.5 : (center - this.t0) / (this.t1 - this.t0);
    this.t0 = center - span * share; this.t1 = this.t0 + span;
    this.draw();
  }

  pan(share) {
    const shift = (this.t1 - this.t0) * share;
    this.t0 += shift; this.t1 += shift; this.draw();
  }

  bind() {
    this.canvas.addEventListener("wheel", (e) => {
      e.preventDefault();
      this.zoom(e.deltaY > 0 ? 1.25 : 0.8, e.offsetX);
    }, {passive: false});
    let drag = null;
    this.canvas.addEventListener("mousedown", (e) => { drag = {x: e.offsetX, t0: this.t0, t1: this.t1, moved: false}; });
    window.addEventListener("mouseup", () => { setTimeout(() => { drag = null; }, 0); });
    this.canvas.addEventListener("mousemove", (e) => {
      if (!drag) return;
      const dx = e.offsetX - drag.x;
      if (Math.abs(dx) > 2) drag.moved = true;
      const dt = dx / (this.width - GUTTER) * (drag.t1 - drag.t0);
      this.t0 = drag.t0 - dt; this.t1 = drag.t1 - dt; this.draw();
    });
    this.canvas.addEventListener("click", (e) => { if (!drag || !drag.moved) this.pick(e.offsetX, e.offsetY); });
    this.canvas.addEventListener("keydown", (e) => {
      const k = e.key.toLowerCase();
      if (k === "w") this.zoom(0.8); else if (k === "s") this.zoom(1.25);
      else if (k === "a") this.pan(-0.1); else if (k === "d") this.pan(0.1);
    });
  }

  draw() {
    const ctx = this.ctx, names = this.data.names, cats = this.data.cats;
    ctx.clearRect(0, 0, this.width, this.height);
    ctx.font = "11px system-ui, sans-serif";
    let drawn = 0;
    for (const row of this.rows) {
      if (row.header) {
        ctx.fillStyle = "#f3f4f6"; ctx.fillRect(0, row.y, this.width, row.h);
        ctx.fillStyle = "#111827"; ctx.fillText(row.header, 4, row.y + 13);
        continue;
      }
      ctx.fillStyle = "#6b7280"; ctx.fillText(row.track.slice(0, 30), 8, row.y + 11);
      ctx.save();
      ctx.beginPath(); ctx.rect(GUTTER, row.y, this.width - GUTTER, row.h); ctx.clip();
      for (const e of row.events) {
        if (e[0] > this.t1 || e[0] + e[1] < this.t0) continue;
        const x0 = this.x(e[0]), w = Math.max(0.5, this.x(e[0] + e[1]) - x0);
        const y = row.y + 2 + e[2] * ROW;
        ctx.fillStyle = colorFor(names[e[3]], cats[e[4]]);
        ctx.fillRect(x0, y, w, ROW - 1);
        if (w > 40) {
          ctx.fillStyle = "#111827";
          ctx.fillText(names[e[3]].slice(0, Math.floor(w / 6)), x0 + 2, y + 10);
        }
        drawn++;
      }
      ctx.restore();
    }
    // time axis labels in their strip at the top
    ctx.fillStyle = "#ffffff"; ctx.fillRect(0, 0, this.width, AXIS);
    ctx.fillStyle = "#374151";
    for (let i = 0; i <= 4; i++) {
      const t = this.t0 + (this.t1 - this.t0) * i / 4;
      ctx.fillText(fmtMs(t), GUTTER + (this.width - GUTTER) * i / 4 - (i === 4 ? 60 : 0), 13);
    }
    this.canvas.setAttribute("data-rendered", "1");
    this.canvas.setAttribute("data-drawn", String(drawn));
    this.canvas.setAttribute("data-ranks", this.data.ranks.map((r) => r.rank).join(","));
  }

  pick(x, y) {
    if (x < GUTTER) return;
    const t = this.t(x), slack = (this.t1 - this.t0) / (this.width - GUTTER) * 2;
    for (const row of this.rows) {
      if (row.header || y < row.y || y >= row.y + row.h) continue;
      const depth = Math.floor((y - row.y - 2) / ROW);
      let best = null;
      for (const e of row.events) {
        if (e[2] === depth && e[0] - slack <= t && t <= e[0] + e[1] + slack && (!best || e[1] < best[1])) best = e;
      }
      if (best) {
        const name = this.data.names[best[3]], cat = this.data.cats[best[4]];
        this.info.textContent = `${name}\ncategory: ${cat || "-"}   rank ${row.rank}   track ${row.track}\n` +
          `start: ${fmtMs(best[0])} (on rank 0's clock, from the first event)   duration: ${fmtMs(best[1])}   depth ${best[2]}`;
        this.info.setAttribute("data-picked", name);
      }
      return;
    }
  }
}

// A big job (more than data.groups.max_rows ranks): its ranks as the few that matter and classes of alike ranks with
// ranges, as in the terminal and the HTML report, never a row per rank; any ranks can be drawn on request.
function rankClasses(groups, draw) {
  const body = el("tbody");
  for (const g of groups.rows) {
    const step = g.step_time_us == null ? "-" : fmtMs(g.step_time_us);
    body.appendChild(el("tr", {class: g.single ? "single" : "class"},
      el("td", {}, g.label), el("td", {}, g.ranks), el("td", {}, String(g.count)), el("td", {}, step),
      el("td", {}, el("button", {onclick: () => draw(String(g.shown_rank))}, `rank ${g.shown_rank}`))));
  }
  const input = el("input", {id: "ranks-input", size: "24", placeholder: "e.g. 512,600-603"});
  const form = el("form", {class: "tl-tools", onsubmit: (e) => { e.preventDefault(); draw(input.value); }},
    el("span", {}, `Draw other ranks (up to ${groups.max_rows}): `), input, el("button", {type: "submit"}, "draw"),
    el("button", {type: "button", onclick: () => { input.value = ""; draw(""); }}, "the ranks that matter"));
  return el("div", {},
    el("p", {class: "note"}, `${groups.all_ranks} ranks: ${groups.legend}. The timeline draws the ranks that ` +
      "matter and one rank of each class."),
    el("table", {class: "runs", id: "rank-classes-table"},
      el("thead", {}, el("tr", {}, ...["who", "ranks", "count", "median step", "drawn as"].map((h) => el("th", {}, h)))),
      body),
    form);
}

async function showRun(run, panel) {
  panel.textContent = "";
  const url = (route) => `./${route}?run=${encodeURIComponent(run.run)}`;
  const reportView = el("div", {id: "report-view"},
    el("p", {class: "note"}, "The run's report: verdict and findings, per-rank table, overlap and exposed " +
      "communication, stragglers, buckets and the what-if (the same page as report.html in the run directory)."),
    el("iframe", {class: "report", id: "report-frame", src: url("report"), title: "ddpdoctor report"}));
  const frame = reportView.querySelector("iframe");
  frame.addEventListener("load", () => {
    // same origin: grow the frame to its page so the tab scrolls as one page, not a page inside a page
    try { frame.style.height = (frame.contentDocument.documentElement.scrollHeight + 20) + "px"; } catch (e) { /* keep */ }
  });
  const tl = el("div", {id: "timeline"});
  const views = {report: reportView, timeline: tl};
  const buttons = {};
  const show = (name) => {
    for (const [k, v] of Object.entries(views)) {
      v.style.display = k === name ? "" : "none";
      buttons[k].style.fontWeight = k === name ? "700" : "400";
    }
  };
  const bar = el("div", {class: "tl-tools"});
  for (const [k, label] of [["report", "Report"], ["timeline", "Timeline of every rank"]]) {
    buttons[k] = el("button", {id: `show-${k}`, onclick: () => { show(k); if (k === "timeline") loadTimeline(); }}, label);
    bar.append(buttons[k]);
  }
  panel.append(el("h2", {}, `Run: ${run.run}`), bar, reportView, tl);
  let loaded = false;
  const loadTimeline = async () => {
    if (loaded) return;
    loaded = true;
    if (!run.has_traces) { tl.append(el("p", {class: "note"}, "This run has no traces (run/check-sync do not profile).")); return; }
    const status = el("p", {class: "note"}, "Loading the traces…");
    const classes = el("div", {id: "rank-classes"});
    const drawing = el("div", {id: "timeline-drawing"});
    tl.append(classes, status, drawing);
    const draw = async (ranks) => {
      status.textContent = "Loading the traces…";
      drawing.textContent = "";
      try {
        const data = await getJson(url("timeline") + (ranks ? `&ranks=${encodeURIComponent(ranks)}` : ""));
        const of = data.groups ? ` (${data.groups.all_ranks} ranks in the job; ` +
          (data.asked ? "the ranks asked for" : "the ranks that matter and one of each class") + " drawn)" : "";
        status.textContent = `${data.events} events of ${data.ranks.length} rank(s)${of}, all on rank 0's clock ` +
          `(aligned on matched collectives)` + (data.truncated ? `; only the ${data.max_events} longest are drawn` : "") + ".";
        if (data.groups && !classes.childNodes.length) classes.append(rankClasses(data.groups, draw));
        new Timeline(drawing, data);
        document.body.setAttribute("data-timeline", "1");
      } catch (err) {
        status.textContent = `Could not read the traces: ${err.message}`;
      }
    };
    await draw("");
  };
  const want = new URLSearchParams(window.location.search).get("view") === "timeline" ? "timeline" : "report";
  show(want);
  if (want === "timeline") await loadTimeline();
}

export async function render() {
  style();
  const header = el("div", {}, el("h2", {}, "ddpdoctor runs"));
  const list = el("div", {id: "runs"}, "Loading runs…");
  const panel = el("div", {id: "run-panel"});
  document.body.append(header, list, panel);
  let data;
  try {
    data = await getJson("./runs");
  } catch (err) {
    list.textContent = `Could not list the runs: ${err.message}`;
    return;
  }
  list.textContent = "";
  if (!data.runs.length) {
    list.append(el("p", {}, "No ddpdoctor run directory (one with report.json) under the log dir. Run " +
      "`ddpdoctor profile --nproc-per-node 2 train.py`, then point TensorBoard at ddpdoctor-runs."));
    return;
  }
  let selected = null;
  const pick = (run, row) => {
    if (selected) selected.classList.remove("selected");
    selected = row; row.classList.add("selected");
    showRun(run, panel);
  };
  list.append(runTable(data.runs, pick));
  document.body.setAttribute("data-runs", String(data.runs.length));
  const want = new URLSearchParams(window.location.search).get("run");
  const first = data.runs.find((r) => r.run === want) || data.runs.find((r) => r.has_traces) || data.runs[0];
  pick(first, list.querySelector(`tr[data-run="${CSS.escape(first.run)}"]`));
}
