// @ts-check
/**
 * PlanView: what a planned (compiled, never run) cell would need per device.
 *
 * A memory bar (arguments, outputs, temporaries stacked) against the device's memory, red with
 * the overshoot when it does not fit; FLOPs and bytes accessed; with a hardware profile, the
 * roofline (compute, memory, collectives, and which one bounds the estimate); every collective
 * the compiler inserted; the outputs with their specs; and the caveats (folded when long): the
 * figures come from XLA's CPU compiler, not from the target's.
 */
import { h, formatBytes, formatSI, formatMs, formatSeconds, formatShape, formatSpec, detailLine, mount } from "./format.js";
import { memorySection, whatText } from "./memory.js";

/** Collectives listed (the engines send at most this many). */
const MAX_COLLECTIVES = 256;

const COMPILE_WORDS = { compiled: "compiled in", reused: "reused an earlier plan's compile; lowered in", refused: "the compiler refused it after" };

/**
 * What the time beside it measured (the twin of `compile_words` in views/plan.py).
 * @param {any} state
 */
export function compileWords(state) {
  return /** @type {any} */ (COMPILE_WORDS)[state.compiled || "compiled"] || "compiled in";
}

/**
 * The sentence under the memory bar.
 * @param {any} m
 */
export function memorySentence(m) {
  const total = formatBytes(m.total);
  if (m.capacity === null || m.capacity === undefined) {
    return `${total} per device; device memory unknown (give --device-memory or --hardware to check the fit)`;
  }
  const of = `${formatBytes(m.capacity)} of device memory${m.capacity_source ? ` (from ${m.capacity_source})` : ""}`;
  if (m.fits === false) return `does not fit: ${total} needs ${formatBytes(m.overshoot || Math.max(0, m.total - m.capacity))} more than the ${of}`;
  const pct = m.capacity > 0 ? (100 * m.total) / m.capacity : 0;
  return `fits: ${total} is ${pct.toFixed(pct < 10 ? 1 : 0)}% of the ${of}`;
}

/**
 * The memory bar's parts: arguments, outputs (less those reusing argument buffers), temporaries; where
 * the compiler reports its own peak (XLA:TPU), the rest of it as "temporaries and scratch".
 * The twin of `bar_parts` in views/plan.py.
 * @param {any} m
 * @returns {Array<[string, string, number]>}
 */
export function barParts(m) {
  const alias = Number(m.alias) || 0;
  const arg = Number(m.argument) || 0;
  const out = Math.max(0, (Number(m.output) || 0) - alias);
  if (m.reported_peak) return [["argument", "arguments", arg], ["output", "outputs", out], ["temp", "temporaries and scratch", Math.max(0, (Number(m.total) || 0) - arg - out)]];
  return [["argument", "arguments", arg], ["output", "outputs", out], ["temp", "temporaries", Number(m.temp) || 0]];
}

/** @param {any} m */
function memoryBar(m) {
  const parts = barParts(m);
  const cap = m.capacity ?? null;
  const scale = Math.max(1, m.total || 0, cap || 0);
  const bar = h("div", { class: m.fits === false ? "jpm-membar jpm-bad" : "jpm-membar", role: "img", "aria-label": memorySentence(m) });
  let left = 0;
  for (const [key, name, v] of parts) {
    const detail = `${name}: ${formatBytes(v)} per device`;
    bar.append(h("span", { class: `jpm-mem-${key}`, style: { left: `${(100 * left) / scale}%`, width: `${(100 * v) / scale}%` }, title: detail, data: { detail, part: key } }));
    left += v;
  }
  if (cap !== null) {
    if (m.fits === false) {
      const over = Math.max(0, m.total - cap);
      const detail = `over the device memory by ${formatBytes(m.overshoot || over)}`;
      bar.append(h("span", { class: "jpm-mem-over", style: { left: `${(100 * cap) / scale}%`, width: `${(100 * over) / scale}%` }, title: detail, data: { detail } }));
    }
    const detail = `device memory: ${formatBytes(cap)}${m.capacity_source ? ` (${m.capacity_source})` : ""}`;
    bar.append(h("span", { class: "jpm-mem-cap", style: { left: `${(100 * cap) / scale}%` }, title: detail, data: { detail } }));
  }
  const legend = h("div", { class: "jpm-mem-legend" });
  for (const [key, name, bytes] of parts) legend.append(h("span", {}, h("i", { class: `jpm-mem-${key}` }), `${name} `, h("b", { text: formatBytes(bytes) })));
  legend.append(h("span", {}, "total ", h("b", { text: formatBytes(m.total) })));
  if (m.alias) legend.append(h("span", { class: "jpm-sub", text: `(${formatBytes(m.alias)} of outputs reuse argument buffers)` }));
  return h(
    "div",
    { class: "jpm-section" },
    h("div", { class: "jpm-h", text: "Memory per device" }),
    bar,
    legend,
    h("div", { class: m.fits === false ? "jpm-fit jpm-bad" : m.fits === true ? "jpm-fit jpm-ok" : "jpm-fit", text: memorySentence(m) }),
    m.note ? h("div", { class: "jpm-note", text: m.note }) : null,
    ...(m.notes || []).map((/** @type {string} */ n) => h("div", { class: "jpm-note", text: n })),
  );
}

/**
 * `FLOPs ÷ 197.00 TFLOP/s (bf16 peak)`, or the rate of each matmul class.
 * @param {any} r
 * @param {any} hw
 */
function ratesText(r, hw) {
  const rates = r.rates || [];
  if (!rates.length) return hw ? `FLOPs ÷ ${formatSI(hw.peak_flops)}FLOP/s` : "";
  if (rates.length === 1) return `FLOPs ÷ ${formatSI(rates[0].flops_per_s)}FLOP/s (${rates[0].rate})`;
  return "FLOPs at " + rates.map((/** @type {any} */ x) => `${formatSI(x.flops_per_s)}FLOP/s for ${(100 * x.share).toFixed(0)}% (${x.rate})`).join(", ");
}

/**
 * One row per term; plans from before the collective split keep one `collectives` row.
 * @param {any} r
 * @param {any} hw
 * @returns {Array<[string, string, any, string]>}
 */
function roofRows(r, hw) {
  /** @type {Array<[string, string, any, string]>} */
  const rows = [
    ["compute", "compute", r.compute_s, ratesText(r, hw)],
    ["memory", "memory", r.memory_s, hw ? `bytes accessed ÷ ${formatSI(hw.hbm_bandwidth)}B/s` : ""],
  ];
  if (!("ici_s" in r)) {
    rows.push(["collectives", "collectives", r.collective_s, hw ? `collective bytes × ring factor ÷ ${formatSI(hw.interconnect_bandwidth)}B/s` : ""]);
    return rows;
  }
  const labels = r.labels || {};
  const [near, far] = (hw && hw.fabric) || ["ICI", "DCN"];
  const link = hw && hw.link_bandwidth;
  rows.push(["ici", labels.ici || `${near} collectives`, r.ici_s, link ? `rings per mesh axis, ${formatSI(link)}B/s per link each way` : "ring per mesh axis"]);
  if (r.dcn_s || r.bound === "dcn") {
    const unit = near === "NVLink" ? "node" : "host";
    rows.push(["dcn", labels.dcn || `${far} collectives`, r.dcn_s, hw && hw.dcn_bandwidth ? `past the ${near === "NVLink" ? "node" : "pod"}: ${formatSI(hw.dcn_bandwidth)}B/s per ${unit}` : ""]);
  }
  if (r.latency_s) rows.push(["latency", labels.latency || "collective latency", r.latency_s, hw && hw.hop_latency ? `hops × ${formatSeconds(hw.hop_latency)}` : "per hop"]);
  return rows;
}

/**
 * The twin of `estimate_sentence` in views/plan.py.
 * @param {any} r
 */
export function estimateSentence(r) {
  const bound = r.bound_text || r.bound;
  if (!("serial_s" in r)) return `estimate ${formatSeconds(r.estimate_s)} per step, ${bound}-bound (the largest of the three)`;
  return `estimate ${formatSeconds(r.estimate_s)} per step, bound by ${bound}, if communication fully overlaps compute (optimistic); ${formatSeconds(r.serial_s)} if none of it does`;
}

/**
 * The roofline: each term as a bar, the dominant one marked.
 * @param {any} r
 * @param {any} hw
 * @param {any} topology
 */
function roofline(r, hw, topology) {
  const rows = roofRows(r, hw);
  const top = Math.max(...rows.map((x) => Number(x[2]) || 0), 1e-30);
  const grid = h("div", { class: "jpm-roof" });
  for (const [key, name, s, how] of rows) {
    const bound = r.bound === key;
    const detail = `${name}: ${formatSeconds(s)}${how ? ` (${how})` : ""}${bound ? " — bounds the estimate" : ""}`;
    grid.append(
      h("span", { class: bound ? "jpm-roof-name jpm-bound" : "jpm-roof-name", text: name }),
      h("span", { class: "jpm-roof-track", title: detail, data: { detail, bound: bound ? "yes" : "no" } }, h("span", { class: bound ? "jpm-roof-bar jpm-bound" : "jpm-roof-bar", style: { width: `${(100 * (Number(s) || 0)) / top}%` } })),
      h("span", { class: bound ? "jpm-roof-val jpm-bound" : "jpm-roof-val", text: `${roofValue(key, s, r)}${bound ? "  ← bounds the estimate" : ""}` }),
    );
  }
  return h(
    "div",
    { class: "jpm-section" },
    h("div", { class: "jpm-h" }, "Step time, roofline", hw ? h("span", { class: "jpm-mono", text: ` · ${hw.name}` }) : null),
    grid,
    h("div", { class: "jpm-estimate", text: estimateSentence(r) }),
    topology && topology.text ? h("div", { class: "jpm-note", text: `topology: ${topology.text}` }) : null,
    hw && hw.source ? h("div", { class: "jpm-note", text: `profile: ${hw.name} — ${hw.source}` }) : null,
  );
}

/**
 * A roofline row's time; a collectives row at 0 s beside a latency row says where its collectives'
 * time went. The twin of views/plan.py's `roof_value`.
 * @param {string} key
 * @param {number} s
 * @param {any} r
 */
export function roofValue(key, s, r) {
  const latencyBound = (key === "ici" || key === "dcn") && !s && r.latency_s;
  return `${formatSeconds(s)}${latencyBound ? " (latency-bound: see collective latency)" : ""}`;
}

/**
 * The source of a collective: `line 3: loss, grads = …`.
 * @param {{line?: number | null, source?: string | null, origin?: any}} c
 */
function where(c) {
  const line = c.line !== null && c.line !== undefined ? `line ${c.line}` : "";
  const here = [line, c.source || ""].filter(Boolean).join(": ");
  const o = /** @type {any} */ (c).origin;
  if (!o) return here;
  const inside = o.function ? `, in ${o.function}()` : "";
  const text = `line ${o.line} of ${o.cell}${inside}${o.source ? `: ${o.source}` : ""}`;
  return text + (line ? ` (called from ${line})` : "");
}

const SLICED = "XLA:CPU makes an all-reduce that each device then slices; XLA:TPU and XLA:GPU make it this reduce-scatter, which the plan shows and costs";

/**
 * The twin of `left_alone_sentence` in views/plan.py.
 * @param {string[]} names
 */
export function leftAloneSentence(names) {
  return `Not bound, because they hold concrete values a plan must not replace: ${names.join(", ")}. Their planned versions are on the plan: \`_plan.abstract['${names[0]}']\`.`;
}

/** @param {any} state */
function collectivesTable(state) {
  const colls = (state.collectives || []).slice(0, MAX_COLLECTIVES);
  const sec = h("div", { class: "jpm-section" }, h("div", { class: "jpm-h", text: `Collectives the compiler inserted (${colls.length + (state.collectives_omitted || 0)})` }));
  if (!colls.length) {
    sec.append(h("div", { class: "jpm-note", text: "none: the compiled program moves no data between devices" }));
    return sec;
  }
  const timed = colls.some((/** @type {any} */ c) => c.seconds !== null && c.seconds !== undefined);
  const head = ["op", "shape", "bytes / device", "groups", "source"].concat(timed ? ["time"] : []);
  const table = h("table", { class: "jpm-table jpm-plan-table" }, h("thead", {}, h("tr", {}, ...head.map((t) => h("th", { text: t })))));
  const body = h("tbody");
  for (const c of colls) {
    const op = c.reduction ? `${c.op} (${c.reduction})` : c.op; // as the collectives view says it: all-reduce (sum)
    const detail = `${op} ${c.shape} · ${formatBytes(c.bytes)} per device · ${c.groups_text || ""}${where(c) ? ` · ${where(c)}` : ""}`;
    body.append(
      h(
        "tr",
        { data: { detail } },
        h("td", { class: "jpm-op", text: c.sliced_from ? `${op} *` : op, title: c.sliced_from ? SLICED : null }),
        h("td", { class: "jpm-mono", text: c.shape }),
        h("td", { class: "jpm-num", text: formatBytes(c.bytes) }),
        h("td", { text: c.groups_text || (c.axes || []).join(", ") }),
        h("td", { class: "jpm-mono jpm-srccell", text: where(c) || "—", title: where(c) }),
        timed ? h("td", { class: "jpm-num", text: formatSeconds(c.seconds) }) : null,
      ),
    );
  }
  table.append(body);
  sec.append(h("div", { class: "jpm-scroll" }, table));
  if (colls.some((/** @type {any} */ c) => c.sliced_from)) sec.append(h("div", { class: "jpm-note", text: `* ${SLICED}` }));
  if (state.collectives_omitted) sec.append(h("div", { class: "jpm-note", text: `… ${state.collectives_omitted} more collectives not listed` }));
  return sec;
}

/** Lists longer than these are folded into a closed <details> (the twins of views/plan.py's). */
const FOLD_OUTPUTS = 8;
const FOLD_CAVEATS = 3;

/**
 * The caveats, folded when there are more than a few (they are the same in every plan).
 * @param {string[]} caveats
 */
function caveatsBlock(caveats) {
  if (!caveats.length) return null;
  return h(
    "details",
    { class: "jpm-caveats", role: "note", open: caveats.length <= FOLD_CAVEATS ? "" : null },
    h("summary", { class: "jpm-h", text: `How far to trust these figures (${caveats.length} notes)` }),
    h("ul", {}, ...caveats.map((c) => h("li", { text: c }))),
  );
}

/** @param {any} state */
function outputsTable(state) {
  const outs = state.outputs || [];
  const folded = outs.length > FOLD_OUTPUTS;
  const heading = h(folded ? "summary" : "div", { class: "jpm-h" }, "Outputs, bound as ", h("span", { class: "jpm-mono", text: "jax.ShapeDtypeStruct" }), folded ? ` (${outs.length})` : null);
  const sec = h(folded ? "details" : "div", { class: "jpm-section" }, heading);
  if (!outs.length) {
    sec.append(h("div", { class: "jpm-note", text: "none" }));
    return sec;
  }
  const table = h("table", { class: "jpm-table jpm-plan-table" }, h("thead", {}, h("tr", {}, h("th", { text: "name" }), h("th", { text: "shape" }), h("th", { text: "sharding" }))));
  const body = h("tbody");
  for (const o of outs) {
    body.append(
      h(
        "tr",
        {},
        h("td", { class: "jpm-mono", text: o.name }),
        h("td", { class: "jpm-mono", text: formatShape(o.dtype, o.shape || []) }),
        h("td", { class: "jpm-mono", text: o.spec === null || o.spec === undefined ? "—" : formatSpec(o.spec) }),
      ),
    );
  }
  table.append(body);
  sec.append(table);
  return sec;
}

const COMPARE_COLUMNS = ["mesh", "memory", "fit", "largest buffer", "collective bytes", "compute", "memory time", "collectives", "estimate", "bound"];

/**
 * A row's largest buffer at the peak (the twin of `largest_text` in views/plan.py).
 * @param {any} b
 */
export function largestText(b) {
  if (!b) return "";
  let where = b.line !== null && b.line !== undefined ? `, line ${b.line}` : "";
  if (b.origin) where = `, line ${b.origin.line} of ${b.origin.cell}`;
  return `${formatBytes(b.bytes)} ${whatText(b)}${where}`;
}
const TIMED = ["compute", "memory time", "collectives", "estimate", "bound"];

/**
 * A comparison row's figures as text (the twin of `_row_cells` in views/plan.py).
 * @param {any} row
 * @returns {Record<string, string>}
 */
export function rowCells(row) {
  if (row.error) return { error: `failed: ${row.error}` };
  const mesh = (row.axes || []).map((/** @type {any} */ a) => `${a.name}=${a.size}`).join(" × ");
  const fit = row.fits === null || row.fits === undefined ? "" : row.fits ? "fits" : "DOES NOT FIT";
  const memory = formatBytes(row.memory) + (row.capacity ? ` of ${formatBytes(row.capacity)}` : "");
  /** @type {Record<string, string>} */
  const cells = { mesh, memory, fit, "largest buffer": largestText(row.largest), "collective bytes": formatBytes(row.collective_bytes) };
  if (row.estimate_s !== null && row.estimate_s !== undefined) {
    cells.compute = formatSeconds(row.compute_s);
    cells["memory time"] = formatSeconds(row.memory_s);
    cells.collectives = formatSeconds(row.collective_s);
    cells.estimate = `${formatSeconds(row.estimate_s)} – ${formatSeconds(row.serial_s)}`;
    cells.bound = String(row.bound_text || row.bound);
  }
  return cells;
}

/** @param {any} state */
function drawComparison(state) {
  const rows = state.rows || [];
  const timed = rows.some((/** @type {any} */ r) => r.estimate_s !== null && r.estimate_s !== undefined);
  const columns = COMPARE_COLUMNS.filter((c) => timed || !TIMED.includes(c));
  const root = h("div", { class: "jpm-view jpm-plan", data: { kind: "compare" } });
  root.append(h("div", { class: "jpm-head" }, h("span", { class: "jpm-title jpm-mono", text: state.title || "compare" }), h("span", { class: "jpm-badge", text: "planned, not run" })));
  for (const c of state.compilers || []) root.append(h("div", { class: "jpm-compiler" }, h("b", { text: c })));
  const table = h("table", { class: "jpm-table jpm-plan-table" }, h("thead", {}, h("tr", {}, h("th", { text: "layout" }), ...columns.map((c) => h("th", { text: c })))));
  const body = h("tbody");
  for (const row of rows) {
    const cells = rowCells(row);
    const label = h("td", { class: "jpm-mono", text: String(row.label) });
    if (cells.error) {
      body.append(h("tr", { class: "jpm-bad", data: { detail: `${row.label}: ${cells.error}` } }, label, h("td", { colspan: String(columns.length), text: cells.error })));
      continue;
    }
    const detail = `${row.label}: ${columns.map((c) => `${c} ${cells[c] || ""}`).join(" · ")}`;
    body.append(h("tr", { class: row.fits === false ? "jpm-bad" : "", data: { detail } }, label, ...columns.map((c) => h("td", { class: ["mesh", "bound", "fit", "largest buffer"].includes(c) ? "jpm-mono" : "jpm-num", text: cells[c] || "" }))));
  }
  table.append(body);
  root.append(h("div", { class: "jpm-scroll" }, table));
  root.append(h("div", { class: "jpm-note", text: timed ? "estimate: communication overlapped with compute – none overlapped; best first" : "no step-time estimate (give --hardware): ranked by memory per device" }));
  const caveats = caveatsBlock(state.caveats || []);
  if (caveats) root.append(caveats);
  const detailBox = detailLine(root, "hover or click a row for details");
  root.append(detailBox.line);
  return { node: root, dispose: detailBox.dispose };
}

/** @param {any} state */
export function draw(state) {
  if (state.kind === "compare") return drawComparison(state);
  const root = h("div", { class: "jpm-view jpm-plan" });
  const chips = h("span", { class: "jpm-chips" });
  for (const a of state.axes || []) chips.append(h("span", { class: "jpm-chip" }, `${a.name} `, h("b", { text: a.size })));
  root.append(
    h(
      "div",
      { class: "jpm-head" },
      h("span", { class: "jpm-title jpm-mono", text: state.title || "plan" }),
      chips,
      state.total_devices ? h("span", { class: "jpm-sub", text: `${state.total_devices} device${state.total_devices === 1 ? "" : "s"}` }) : null,
      h("span", { class: "jpm-badge", text: "planned, not run", title: "compiled for these devices; nothing was allocated or executed" }),
      state.compile_ms !== null && state.compile_ms !== undefined ? h("span", { class: "jpm-chip" }, `${compileWords(state)} `, h("b", { text: formatMs(state.compile_ms) })) : null,
    ),
  );
  if (state.compiler) root.append(h("div", { class: "jpm-compiler" }, h("b", { text: state.compiler.text })));
  if (state.memory) root.append(memoryBar(state.memory));
  if (state.peak) root.append(memorySection({ compiler: (state.compiler || {}).name || "XLA:CPU", capacity: (state.memory || {}).capacity, peak: state.peak }));
  const cost = state.cost || {};
  root.append(
    h(
      "div",
      { class: "jpm-section jpm-report" },
      h("span", { class: "jpm-chip" }, "FLOPs per device ", h("b", { text: formatSI(cost.flops) })),
      h("span", { class: "jpm-chip" }, "bytes accessed per device ", h("b", { text: formatBytes(cost.bytes_accessed) })),
    ),
  );
  if (state.roofline) root.append(roofline(state.roofline, state.hardware, state.topology));
  else root.append(h("div", { class: "jpm-note", text: "no step-time estimate: give --hardware (tpu-v4, tpu-v5e, tpu-v5p, tpu-v6e, h100, a100, b200, or custom:flops=…,hbm=…,bw=…,memory=…)" }));
  root.append(collectivesTable(state));
  root.append(outputsTable(state));
  if (state.left_alone && state.left_alone.length) root.append(h("div", { class: "jpm-note jpm-left-alone", text: leftAloneSentence(state.left_alone) }));
  const caveats = caveatsBlock(state.caveats || []);
  if (caveats) root.append(caveats);
  const detail = detailLine(root, "hover or click a bar or a row for details");
  root.append(detail.line);
  return { node: root, dispose: detail.dispose };
}

export default {
  /** @param {{model: any, el: HTMLElement}} ctx */
  render({ model, el }) {
    return mount(model, el, draw);
  },
};
