// @ts-check
/**
 * ProfileView: a measured step (`--profile`). One lane per device (or XLA:CPU thread), a bar per op
 * placed in % of the step and coloured by what it did (compute; each collective its own colour;
 * copies; waits drawn hatched), a step selector, the step's shares, the top ops with their lines,
 * and the plan's estimate beside the measurement. Hovering or clicking a bar names the op, its line
 * and its time. The twin of views/profile.py (which draws the median step).
 */
import { h, detailLine, formatSeconds, mount } from "./format.js";

const COLLECTIVE_CLASSES = /** @type {Record<string, string>} */ ({
  "all-reduce": "ar", "all-gather": "ag", "reduce-scatter": "rs", "all-to-all": "aa", "ragged-all-to-all": "aa",
  "collective-permute": "cp",
});
const SHARES = [["compute", "compute"], ["collective", "collectives"], ["wait", "waiting"], ["copy", "copies"], ["idle", "idle"]];
const LEGEND = [["compute", "compute"], ["ar", "all-reduce"], ["ag", "all-gather"], ["rs", "reduce-scatter"], ["aa", "all-to-all"], ["cp", "permute"], ["copy", "copy"], ["wait", "waiting"]];

/** @param {number | null | undefined} value microseconds */
export function us(value) {
  return value === null || value === undefined ? "—" : formatSeconds(value * 1e-6);
}

/**
 * @param {string} kind
 * @param {string | null} collective
 */
export function barClass(kind, collective) {
  if (kind === "collective") return `jpm-pf-${COLLECTIVE_CLASSES[collective || ""] || "cx"}`;
  return `jpm-pf-${kind}`;
}

/**
 * A lane's events of one step, with their instruction's facts.
 * @param {any} state
 * @param {any} lane
 * @param {number} step
 */
export function stepEvents(state, lane, step) {
  const kinds = state.kinds || [];
  const names = state.names || [];
  const out = [];
  for (const [s, start, duration, kind, name, flight] of lane.events || []) {
    if (s !== step) continue;
    const fact = names[name] || ["?", "", null, null];
    out.push({ start, duration, kind: kinds[kind] || "?", name: fact[0], what: fact[1], collective: fact[2], line: fact[3], inFlight: Boolean(flight) });
  }
  return out;
}

/** @param {any} e */
export function eventText(e) {
  const what = e.collective || e.what || "";
  const where = e.line !== null && e.line !== undefined ? `, line ${e.line}` : "";
  let doing = e.kind === "wait" ? ", waiting" : e.kind === "copy" ? ", copy" : "";
  if (e.inFlight) doing = ", in flight";
  return `${e.name} (${what}${where}): ${us(e.duration)} at ${us(e.start)}${doing}`;
}

/**
 * @param {any} state
 * @param {number} step
 */
function spanOf(state, step) {
  const steps = state.steps || [];
  return Math.max(1e-9, (steps[step] && steps[step].span_us) || 0);
}

/**
 * The lanes of one step, and the axis under them.
 * @param {any} state
 * @param {number} step
 */
function lanes(state, step) {
  const span = spanOf(state, step);
  const grid = h("div", { class: "jpm-pf-lanes", role: "img", "aria-label": `timeline of step ${step + 1}` });
  for (const lane of state.lanes || []) {
    const dropped = (lane.dropped || []).find((/** @type {number[]} */ d) => d[0] === step);
    const more = dropped ? ` (+${dropped[1]} shorter ops, ${us(dropped[2])}, not drawn)` : "";
    const track = h("div", { class: "jpm-pf-track" });
    for (const e of stepEvents(state, lane, step)) {
      const left = Math.max(0, Math.min(100, (100 * e.start) / span));
      const width = Math.max(0.2, Math.min(100 - left, (100 * e.duration) / span));
      const detail = `${lane.label}: ${eventText(e)}`;
      track.append(h("span", {
        class: `jpm-pf-bar ${barClass(e.kind, e.collective)}${e.inFlight ? " jpm-pf-flight" : ""}`,
        style: { left: `${left.toFixed(2)}%`, width: `${width.toFixed(2)}%` },
        title: detail,
        data: { detail },
      }));
    }
    grid.append(h("span", { class: "jpm-pf-label", text: lane.label, title: lane.label + more, data: { detail: lane.label + more } }), track);
  }
  const hidden = (state.lanes_total || 0) - (state.lanes || []).length;
  const steps = state.steps || [];
  const wall = steps[step] && steps[step].wall_us ? `; the call took ${us(steps[step].wall_us)}` : "";
  return h(
    "div",
    {},
    grid,
    h("div", { class: "jpm-pf-axis" }, h("span", { text: "0" }), h("span", { text: `step ${step + 1} of ${steps.length}: ${us(span)} on the devices${wall}` }), h("span", { text: us(span) })),
    hidden > 0 ? h("div", { class: "jpm-note", text: `and ${hidden} more lanes, not drawn` }) : null,
  );
}

/** @param {any} state */
function shares(state) {
  const got = state.shares || {};
  const bar = h("div", { class: "jpm-pf-shares" });
  for (const [key, text] of SHARES) {
    const share = Math.max(0, got[key] || 0);
    const detail = `${text}: ${(100 * share).toFixed(0)}% of the step`;
    bar.append(h("span", { class: `jpm-pf-share jpm-pf-${key}`, style: { width: `${(100 * share).toFixed(2)}%` }, title: detail, data: { detail } }));
  }
  return [bar, h("div", { class: "jpm-note", text: state.shares_text || "" })];
}

function legend() {
  const line = h("div", { class: "jpm-note" });
  for (const [cls, text] of LEGEND) line.append(h("span", { class: `jpm-pf-key jpm-pf-${cls}` }), text);
  return line;
}

/** @param {any} state */
function ops(state) {
  const body = h("tbody");
  for (const o of state.ops || []) {
    body.append(h(
      "tr",
      { data: { detail: o.text } },
      h("td", { class: "jpm-num", text: us(o.total_us) }),
      h("td", { class: "jpm-mono", text: o.name }),
      h("td", { text: o.collective || o.what || "" }),
      h("td", { class: "jpm-num", text: o.line === null || o.line === undefined ? "—" : String(o.line) }),
      h("td", { class: "jpm-num", text: String(o.count) }),
      h("td", { class: "jpm-num", text: o.wait_us ? us(o.wait_us) : "" }),
    ));
  }
  const head = h("thead", {}, h("tr", {}, ...["time per step", "op", "what", "line", "runs", "waiting"].map((t) => h("th", { text: t }))));
  return h("div", { class: "jpm-scroll" }, h("table", { class: "jpm-table jpm-plan-table" }, head, body));
}

/** @param {any} beside */
function besidePlan(beside) {
  if (!beside) return null;
  const section = h("div", { class: "jpm-section" }, h("div", { class: "jpm-h", text: `Beside the plan (${beside.hardware})` }), h("div", { text: beside.sentence }));
  const rows = beside.collectives || [];
  if (rows.length) {
    const body = h("tbody");
    for (const c of rows) {
      const cells = [c.op, c.line === null || c.line === undefined ? "—" : String(c.line), c.estimated_s === null ? "—" : formatSeconds(c.estimated_s),
        c.measured_s === null ? "—" : formatSeconds(c.measured_s), c.overlapped === null || c.overlapped === undefined ? "—" : `${(100 * c.overlapped).toFixed(0)}%`];
      body.append(h("tr", {}, ...cells.map((t, k) => h("td", { class: k ? "jpm-num" : "", text: t }))));
    }
    const head = h("thead", {}, h("tr", {}, ...["collective", "line", "estimated", "measured", "overlapped"].map((t) => h("th", { text: t }))));
    section.append(h("div", { class: "jpm-scroll" }, h("table", { class: "jpm-table jpm-plan-table" }, head, body)));
  }
  section.append(h("div", { class: "jpm-note", text: beside.label }));
  return section;
}

/** @param {any} state */
export function draw(state) {
  const root = h("div", { class: "jpm-view jpm-profile" });
  root.append(h("div", { class: "jpm-head" }, h("span", { class: "jpm-title jpm-mono", text: state.title || "profile" }), h("span", { class: "jpm-badge", text: "measured" })));
  root.append(h("div", { text: state.headline || "" }), h("div", { class: "jpm-note", text: state.source || "" }));
  root.append(h("div", { class: "jpm-section" }, h("div", { class: "jpm-h", text: "Where the step went" }), ...shares(state)));
  const steps = state.steps || [];
  let step = Math.min(Math.max(0, state.median_step || 0), Math.max(0, steps.length - 1));
  const holder = h("div", {}, lanes(state, step));
  const select = /** @type {HTMLSelectElement} */ (h("select", { class: "jpm-pf-step", "aria-label": "step" }));
  steps.forEach((/** @type {any} */ s, /** @type {number} */ k) => {
    const option = /** @type {HTMLOptionElement} */ (h("option", { value: String(k), text: `step ${k + 1}: ${us(s.span_us)}${k === state.median_step ? " (median)" : ""}` }));
    if (k === step) option.selected = true;
    select.append(option);
  });
  select.addEventListener("change", () => {
    step = Number(select.value);
    holder.replaceChildren(lanes(state, step));
  });
  const anyDevice = (state.lanes || []).some((/** @type {any} */ l) => l.device !== null && l.device !== undefined);
  root.append(h(
    "div",
    { class: "jpm-section" },
    h("div", { class: "jpm-h", text: `Timeline, one lane per ${anyDevice ? "device" : "thread"}` }),
    h("label", { class: "jpm-pf-controls" }, h("span", { class: "jpm-sub", text: "show" }), select),
    holder,
    legend(),
  ));
  root.append(h("div", { class: "jpm-section" }, h("div", { class: "jpm-h", text: "Top ops, per step and lane" }), ops(state)));
  const plan = besidePlan(state.beside);
  if (plan) root.append(plan);
  for (const note of state.notes || []) root.append(h("div", { class: "jpm-note", text: note }));
  const detail = detailLine(root, "hover or click a bar for the op, its line and its time");
  root.append(detail.line);
  return { node: root, dispose: detail.dispose };
}

export default {
  /** @param {{model: any, el: HTMLElement}} ctx */
  render({ model, el }) {
    return mount(model, el, draw);
  },
};
