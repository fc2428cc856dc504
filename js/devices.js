// @ts-check
/**
 * DevicesView: the devices JAX sees: platform counts (zeros included), one card per listed
 * device (coloured by id), grouped by process when there is more than one.
 */
import { deviceColor } from "./palette.js";
import { h, formatBytes, detailLine, mount } from "./format.js";

/**
 * @typedef {{id: number, platform: string, kind: string, process: number, coords?: number[] | null,
 *   core?: number | null, mem_used?: number | null, mem_limit?: number | null}} Device
 */

/**
 * One-line description of a device (detail line, title, text rendering).
 * @param {Device} d
 */
export function describe(d) {
  const parts = [`device ${d.id}`, `${d.platform}`];
  if (d.kind !== d.platform) parts.push(`${d.kind}`);
  parts.push(`process ${d.process}`);
  if (d.coords) parts.push(`coords [${d.coords.join(", ")}]`);
  if (d.core !== null && d.core !== undefined) parts.push(`core ${d.core}`);
  if (d.mem_used !== null && d.mem_used !== undefined) {
    parts.push(`memory ${formatBytes(d.mem_used)}${d.mem_limit ? ` of ${formatBytes(d.mem_limit)}` : ""}`);
  }
  return parts.join(" · ");
}

/**
 * Where a process runs, from the optional top-level `hosts` ({process: {host, pid}}):
 * `host node-a · pid 1234`, or "" when the state does not say.
 * @param {any} state
 * @param {number} process
 */
export function hostText(state, process) {
  const hosts = state.hosts || {};
  const at = hosts[String(process)];
  if (!at) return "";
  return [at.host !== null && at.host !== undefined ? `host ${at.host}` : "", at.pid !== null && at.pid !== undefined ? `pid ${at.pid}` : ""].filter(Boolean).join(" · ");
}

/**
 * @param {Device} d
 * @param {boolean} showKind the kind differs between devices (else it is in the header)
 * @param {boolean} showProcess there is more than one process
 * @param {string} [where] the process's host and pid, when known
 */
function card(d, showKind, showProcess, where = "") {
  const c = deviceColor(d.id);
  const detail = describe(d) + (where ? ` · ${where}` : "");
  const body = h("div", { class: "jpm-card-body" });
  // Value-only lines (the title and the detail line spell out what each is).
  if (showKind) body.append(h("div", { class: "jpm-line", text: d.kind }));
  const place = [d.coords ? `(${d.coords.join(", ")})` : null, d.core !== null && d.core !== undefined ? `core ${d.core}` : null].filter(Boolean).join(" · ");
  if (place) body.append(h("div", { class: "jpm-line", text: place }));
  if (d.mem_used !== null && d.mem_used !== undefined) {
    const label = d.mem_limit ? `${formatBytes(d.mem_used)} / ${formatBytes(d.mem_limit)}` : `${formatBytes(d.mem_used)} used`;
    body.append(h("div", { class: "jpm-line", text: label }));
    if (d.mem_limit) {
      const pct = Math.max(0, Math.min(100, (100 * d.mem_used) / d.mem_limit));
      body.append(h("div", { class: "jpm-bar", title: `${pct.toFixed(1)}% used` }, h("span", { style: { width: `${pct}%` } })));
    }
  }
  return h(
    "div",
    { class: "jpm-card", title: detail, data: { detail, id: d.id } },
    h("div", { class: "jpm-card-head", style: { background: c.bg, color: c.fg } }, h("span", { text: `${d.platform}:${d.id}` }), showProcess ? h("span", { text: `p${d.process}` }) : null),
    body.childElementCount ? body : null,
  );
}

/** Past this many devices whose cards would show only their name, the cards shrink to chips. */
const COMPACT_AFTER = 16;

/**
 * Whether a group's cards are drawn as small chips: none with more to say than its name (no kind
 * column, coordinates, core or memory), so eight simulated devices stand in one row; cards that
 * also name their process only past COMPACT_AFTER. The twin of views/devices.py's.
 * @param {Device[]} mine
 * @param {number} kinds
 * @param {number} [processes]
 */
export function compactCards(mine, kinds, processes = 1) {
  const nameOnly = kinds <= 1 && mine.every((d) => !(d.coords && d.coords.length) && d.core == null && d.mem_used == null);
  return nameOnly && (processes <= 1 || mine.length > COMPACT_AFTER);
}

/** @param {any} state */
export function draw(state) {
  /** @type {Device[]} */
  const devices = state.devices || [];
  const total = state.total ?? devices.length;
  const counts = state.counts || {};
  const processes = state.processes || [];
  const root = h("div", { class: "jpm-view jpm-devices" });
  const platforms = Object.entries(counts).filter(([, n]) => n > 0).map(([p]) => p);
  root.append(
    h(
      "div",
      { class: "jpm-head" },
      h("span", { class: "jpm-title", text: "Devices" }),
      h("span", { class: "jpm-sub", text: `${total} ${platforms.length === 1 ? platforms[0] + " " : ""}device${total === 1 ? "" : "s"} · backend ${state.backend ?? "?"}${processes.length > 1 ? ` · ${processes.length} processes` : ""}${processes.length === 1 && hostText(state, processes[0].process) ? ` · ${hostText(state, processes[0].process)}` : ""}` }),
      state.simulated ? h("span", { class: "jpm-badge", text: "simulated", title: "host CPU split into several XLA devices" }) : null,
    ),
  );
  const chips = h("div", { class: "jpm-chips" });
  for (const [platform, n] of Object.entries(counts)) chips.append(h("span", { class: n ? "jpm-chip" : "jpm-chip jpm-zero" }, `${platform} `, h("b", { text: n })));
  const kinds = [...new Set(devices.map((d) => String(d.kind)))];
  if (kinds.length === 1) chips.append(h("span", { class: "jpm-sub", text: `kind ` }), h("span", { class: "jpm-mono", text: kinds[0] }));
  root.append(chips);

  const groups = processes.length > 1 ? processes.map((/** @type {{process: number, count: number}} */ p) => p) : [null];
  for (const g of groups) {
    const sec = h("div", { class: "jpm-section" });
    const mine = g === null ? devices : devices.filter((d) => d.process === g.process);
    const where = g === null ? "" : hostText(state, g.process);
    // The host in its own case (the heading is upper-cased).
    if (g !== null) sec.append(h("div", { class: "jpm-h" }, `process ${g.process} · ${g.count} device${g.count === 1 ? "" : "s"}${mine.length < g.count ? ` (${mine.length} listed)` : ""}`, where ? h("span", { class: "jpm-mono", text: ` · ${where}` }) : null));
    sec.append(h("div", { class: compactCards(mine, kinds.length, processes.length) ? "jpm-cards jpm-compact" : "jpm-cards" }, ...mine.map((d) => card(d, kinds.length > 1, processes.length > 1, where))));
    root.append(sec);
  }
  if (state.omitted) root.append(h("div", { class: "jpm-note", text: `… ${state.omitted} more devices not listed (${devices.length} of ${total} shown)` }));
  const detail = detailLine(root, "hover or click a device for details");
  root.append(detail.line);
  return { node: root, dispose: detail.dispose };
}

export default {
  /** @param {{model: any, el: HTMLElement}} ctx */
  render({ model, el }) {
    return mount(model, el, draw);
  },
};
