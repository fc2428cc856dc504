// @ts-check
/**
 * MemoryView: one device's live bytes over the compiled program's schedule, one bar per stretch of
 * steps (each its busiest step), the peak marked, the device's memory drawn as a line, and the
 * buffers that fill the peak listed under it. Hovering or clicking a bar names its step's operation
 * and source line. The twin of views/memory.py; js/plan.js embeds `memorySection`.
 */
import { h, formatBytes, detailLine, mount } from "./format.js";

/** @param {any} b */
export function shapeText(b) {
  if ((b.count || 1) > 1) return ""; // a group of buffers: sizes differ
  return `${b.dtype}[${(b.shape || []).join(",")}]`;
}

/** @param {any} b */
export function whereText(b) {
  const o = b.origin;
  if (o) return `line ${o.line} of ${o.cell}${o.function ? `, in ${o.function}()` : ""}${o.source ? `: ${o.source}` : ""}`;
  if (b.line === null || b.line === undefined) return "";
  return `line ${b.line}${b.source ? `: ${b.source}` : ""}`;
}

/** @param {any} b */
export function whatText(b) {
  const space = b.space ? ` in ${b.space}` : "";
  const count = b.count || 1;
  let text;
  if (b.kind === "argument" || b.kind === "output") text = b.name ? `${b.kind} ${b.name}` : `${b.kind}s`;
  else {
    const op = b.op || b.instruction;
    const made = `from ${op}${b.instruction && b.instruction !== op ? ` (${b.instruction})` : ""}`;
    text = b.role ? `${b.role}, ${made}` : `temporary ${made}`;
  }
  return `${count > 1 ? `${count} buffers: ` : ""}${text}${space}`;
}

/** @param {any} p */
export function stepText(p) {
  const name = p.instruction || "";
  const head = p.op && p.op !== name ? `${name} (${p.op})` : name;
  const where = whereText(p);
  return head + (where ? `, ${where}` : "");
}

/**
 * What is live before the first step (the twin of `start_sentence` in views/memory.py).
 * @param {any} peak
 */
export function startSentence(peak) {
  return `before step 0: ${formatBytes(peak.start_bytes || 0)} of arguments, live when the program starts`;
}

/** @param {any} state */
export function peakSentence(state) {
  const peak = state.peak || {};
  const where = peak.at ? stepText(peak.at) : "";
  return `peak ${formatBytes(peak.live)} live at step ${peak.step} of ${peak.steps}${where ? `: ${where}` : ""}`;
}

/** @param {any} state */
export function capacitySentence(state) {
  const cap = state.capacity;
  const reported = (state.peak || {}).reported || 0;
  if (!cap) return "device memory unknown (give --hardware or --device-memory)";
  if (reported > cap) return `device memory ${formatBytes(cap)}: the peak of ${formatBytes(reported)} does not fit`;
  return `device memory ${formatBytes(cap)}: the peak of ${formatBytes(reported)} is ${((100 * reported) / cap).toFixed(1)}% of it`;
}

/**
 * (bytes, what, array, source) rows: the buffers, then "other" and the compiler's reserve.
 * @param {any} peak
 * @returns {Array<[number, string, string, string]>}
 */
export function peakRows(peak) {
  /** @type {Array<[number, string, string, string]>} */
  const out = (peak.buffers || []).map((/** @type {any} */ b) => [b.bytes, whatText(b), shapeText(b), whereText(b)]);
  if (peak.other_count) out.push([peak.other_bytes, `other: ${peak.other_count} smaller buffer${peak.other_count === 1 ? "" : "s"}`, "", ""]);
  for (const part of peak.reserve || []) out.push([part.bytes, part.note, "", ""]);
  return out;
}

/** @param {any} peak */
function buffersTable(peak) {
  const body = h("tbody");
  for (const [n, what, shape, where] of peakRows(peak)) {
    const detail = `${formatBytes(n)}: ${what}${shape ? ` ${shape}` : ""}${where ? `, ${where}` : ""}`;
    body.append(
      h(
        "tr",
        { data: { detail } },
        h("td", { class: "jpm-num", text: formatBytes(n) }),
        h("td", { text: what }),
        h("td", { class: "jpm-mono", text: shape }),
        h("td", { class: "jpm-mono jpm-srccell", text: where || "—", title: where }),
      ),
    );
  }
  body.append(h("tr", {}, h("td", { class: "jpm-num" }, h("b", { text: formatBytes(peak.reported) })), h("td", { colspan: "3", text: "the peak per device" })));
  const head = h("thead", {}, h("tr", {}, ...["size", "what", "array", "source"].map((t) => h("th", { text: t }))));
  const table = h("div", { class: "jpm-scroll" }, h("table", { class: "jpm-table jpm-plan-table jpm-peak-table" }, head, body));
  if (!peak.disagreement) return table;
  return h("div", {}, table, h("div", { class: "jpm-note jpm-disagreement", text: peak.disagreement }));
}

/** @param {any} state */
function scale(state) {
  const peak = state.peak || {};
  const top = Math.max(1, peak.live || 0, peak.reported || 0);
  const cap = state.capacity;
  const on = Boolean(cap) && cap <= 2 * top;
  return { top: on ? Math.max(top, cap) : top, on };
}

/** @param {any} state */
function timeline(state) {
  const peak = state.peak || {};
  const { top, on } = scale(state);
  const chart = h("div", { class: "jpm-timeline", role: "img", "aria-label": peakSentence(state) });
  const places = peak.places || [];
  for (const p of peak.timeline || []) {
    const at = typeof p.at === "number" && places[p.at] ? places[p.at] : p;
    const detail = `step ${p.step}: ${formatBytes(p.bytes)} live — ${stepText(at)}`;
    chart.append(
      h("span", {
        class: p.step === peak.step ? "jpm-tl-bar jpm-tl-peak" : "jpm-tl-bar",
        style: { height: `${(100 * (p.bytes || 0)) / top}%` },
        title: detail,
        data: { detail, step: String(p.step) },
      }),
    );
  }
  if (on) chart.append(h("span", { class: "jpm-tl-cap", style: { bottom: `${(100 * state.capacity) / top}%` }, title: capacitySentence(state), data: { detail: capacitySentence(state) } }));
  return [
    chart,
    h("div", { class: "jpm-tl-axis" }, h("span", { text: "step 0" }), h("span", { text: "the schedule" }), h("span", { text: `step ${(peak.steps || 1) - 1}` })),
    h("div", { class: "jpm-note", text: `${peakSentence(state)}; ${capacitySentence(state)}` }),
    h("div", { class: "jpm-note", text: startSentence(peak) }),
  ];
}

/**
 * The memory section a plan view embeds: the timeline, then the peak's buffers.
 * @param {any} state
 */
export function memorySection(state) {
  return h(
    "div",
    { class: "jpm-section jpm-memory" },
    h("div", { class: "jpm-h", text: `Live memory per device, over ${state.compiler || "the compiler"}'s schedule` }),
    ...timeline(state),
    h("div", { class: "jpm-h jpm-sub-h", text: "What fills memory at the peak" }),
    buffersTable(state.peak || {}),
  );
}

/** @param {any} state */
export function draw(state) {
  const root = h("div", { class: "jpm-view jpm-plan" });
  root.append(h("div", { class: "jpm-head" }, h("span", { class: "jpm-title jpm-mono", text: state.title || "memory" }), h("span", { class: "jpm-badge", text: "planned, not run" })));
  root.append(memorySection(state));
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
