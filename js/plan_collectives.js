// @ts-check
/**
 * The plan view's collectives: each one the compiler inserted (groups, calls, time, whether the compiled
 * schedule overlaps it, why it is there), a summary by op and axis past a screenful, what XLA's partitioner
 * said, a pipeline's bubble, and the inputs the cell hands back in another layout. The twins of
 * views/plan_collectives.py.
 */
import { h, formatBytes, formatSeconds } from "./format.js";

/** Collectives listed (the engines send at most this many). */
const MAX_COLLECTIVES = 256;

const SLICED = "XLA:CPU makes an all-reduce that each device then slices; XLA:TPU and XLA:GPU can make it this reduce-scatter, which the plan shows and costs";

/**
 * The source of a collective: `line 3: loss, grads = …` (the twin of `where`).
 * @param {any} c
 */
export function where(c) {
  const line = c.line !== null && c.line !== undefined ? `line ${c.line}` : "";
  const here = [line, c.source || ""].filter(Boolean).join(": ");
  const o = c.origin;
  if (!o) return here;
  const inside = o.function ? `, in ${o.function}()` : "";
  const text = `line ${o.line} of ${o.cell}${inside}${o.source ? `: ${o.source}` : ""}`;
  return text + (line ? ` (called from ${line})` : "");
}

/**
 * `overlapped`, `exposed` or "" (the twin of `overlap_words`).
 * @param {any} c
 */
export function overlapWords(c) {
  return c.overlapped === true ? "overlapped" : c.overlapped === false ? "exposed" : "";
}

/**
 * `40.0 µs (latency-bound, exposed)` (the twin of `time_words`).
 * @param {any} c
 */
export function timeWords(c) {
  const said = [c.bound ? `${c.bound}-bound` : "", overlapWords(c)].filter(Boolean);
  return formatSeconds(c.seconds) + (said.length ? ` (${said.join(", ")})` : "");
}

/**
 * One line of the summary by op and axis (the twin of `summary_line`).
 * @param {any} s
 */
export function summaryLine(s) {
  const axes = (s.axes || []).map((/** @type {string} */ a) => `'${a}'`).join(" x ") || "no axis";
  const count = Number(s.instructions) || 0;
  const called = s.calls !== null && s.calls !== undefined && s.calls !== count ? `, ${s.calls.toLocaleString("en-US")} calls` : "";
  let timed = "";
  if (s.seconds !== null && s.seconds !== undefined) timed = `, ${formatSeconds(s.seconds)}${s.exposed_s ? ` (${formatSeconds(s.exposed_s)} exposed)` : ""}`;
  return `${s.op} over ${axes}: ${count.toLocaleString("en-US")} instruction${count === 1 ? "" : "s"}${called}, ${formatBytes(s.bytes)} moved per device${timed}`;
}

/**
 * A pipeline's bubble (the twin of `pipeline_text`).
 * @param {any} p
 */
export function pipelineText(p) {
  const at = p.line !== null && p.line !== undefined ? ` (the loop at line ${p.line})` : "";
  const both = p.passes === 2 ? ", forward and backward passes" : "";
  return `pipeline bubble: ${p.bubble} of ${p.ticks} ticks (${Math.round(100 * p.fraction)}%) — ${p.stages} stages over '${p.axis}' pass ${p.microbatches} microbatches${both}${at}; each stage idles ${p.bubble} ticks a step. More microbatches make it smaller.`;
}

/**
 * @param {any} change
 */
export function layoutChangeText(change) {
  return `${change.name} comes in as ${change.before} and leaves as ${change.after}: the next step starts with a reshard`;
}

/**
 * @param {any} row
 */
export function partitionerText(row) {
  const hasLine = row.line !== null && row.line !== undefined;
  const at = hasLine && row.source ? ` (line ${row.line}: ${row.source})` : hasLine ? ` (line ${row.line})` : "";
  return `${row.text}${at}`;
}

/**
 * The collectives section.
 * @param {any} state
 */
export function collectivesSection(state) {
  const colls = (state.collectives || []).slice(0, MAX_COLLECTIVES);
  const sec = h("div", { class: "jpm-section" }, h("div", { class: "jpm-h", text: `Collectives the compiler inserted (${colls.length + (state.collectives_omitted || 0)})` }));
  const summary = state.collective_summary || [];
  if (summary.length) {
    sec.append(h("div", { class: "jpm-note", text: "by op and axis:" }), h("ul", { class: "jpm-summary" }, ...summary.map((/** @type {any} */ s) => h("li", { class: "jpm-mono", text: summaryLine(s) }))));
  }
  if (!colls.length) {
    sec.append(h("div", { class: "jpm-note", text: "none: the compiled program moves no data between devices" }));
  } else {
    const timed = colls.some((/** @type {any} */ c) => c.seconds !== null && c.seconds !== undefined);
    const head = ["op", "shape", "bytes / device", "groups", "source"].concat(timed ? ["time"] : []);
    const table = h("table", { class: "jpm-table jpm-plan-table" }, h("thead", {}, h("tr", {}, ...head.map((t) => h("th", { text: t })))));
    const body = h("tbody");
    for (const c of colls) {
      const op = c.reduction ? `${c.op} (${c.reduction})` : c.op; // as the collectives view says it: all-reduce (sum)
      const why = c.why && c.why.text ? String(c.why.text) : "";
      const detail = `${op} ${c.shape} · ${formatBytes(c.bytes)} per device · ${c.groups_text || ""}${where(c) ? ` · ${where(c)}` : ""}${why ? ` · why: ${why}` : ""}`;
      body.append(
        h(
          "tr",
          { data: { detail } },
          h("td", { class: "jpm-op", text: c.sliced_from ? `${op} *` : op, title: c.sliced_from ? SLICED : null }),
          h("td", { class: "jpm-mono", text: c.shape }),
          h("td", { class: "jpm-num", text: formatBytes(c.bytes) }),
          h("td", { text: c.groups_text || (c.axes || []).join(", ") }),
          h("td", { class: "jpm-mono jpm-srccell", text: where(c) || "—", title: where(c) }),
          timed ? h("td", { class: "jpm-num", text: timeWords(c), title: timeWords(c) }) : null,
        ),
      );
      if (why) body.append(h("tr", { class: "jpm-why", data: { detail } }, h("td"), h("td", { colspan: String(head.length - 1), text: `why: ${why}` })));
    }
    table.append(body);
    sec.append(h("div", { class: "jpm-scroll" }, table));
  }
  if (colls.some((/** @type {any} */ c) => c.sliced_from)) sec.append(h("div", { class: "jpm-note", text: `* ${SLICED}` }));
  if (state.collectives_omitted) sec.append(h("div", { class: "jpm-note", text: `… ${state.collectives_omitted} more collectives not listed` }));
  for (const row of state.partitioner || []) sec.append(h("div", { class: "jpm-note jpm-partitioner", text: partitionerText(row) }));
  if (state.pipeline) sec.append(h("div", { class: "jpm-note jpm-pipeline", text: pipelineText(state.pipeline) }));
  return sec;
}

/**
 * The inputs the cell hands back in another layout, or null.
 * @param {any} state
 */
export function layoutChanges(state) {
  const changes = state.layout_changes || [];
  if (!changes.length) return null;
  return h("div", { class: "jpm-section" }, h("div", { class: "jpm-h", text: "Layouts the cell changes" }), ...changes.map((/** @type {any} */ c) => h("div", { class: "jpm-note jpm-mono", text: layoutChangeText(c) })));
}
