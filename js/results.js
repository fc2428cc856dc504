// @ts-check
/**
 * ResultView: what each device computed in a `%%pmap` cell, and the collectives that ran.
 *
 * One tile per device (coloured by device), collapsed to one line when every device holds
 * the same value; a card per collective, with its replica groups, and for
 * collective-permute an SVG ring of who sent to whom (summarised past 64 devices).
 */
import { deviceColor } from "./palette.js";
import { h, svg, formatBytes, formatSI, formatMs, formatShape, formatIds, formatCoords, detailLine, mount, keepTwinHidden } from "./format.js";

/** The ring is drawn up to this many distinct devices; past it, a summary. */
const RING_MAX = 64;
/** Replica groups drawn (the rest summarised) and cells drawn per group. */
const GROUPS_MAX = 16;
const GROUP_CELLS_MAX = 64;

/**
 * @typedef {{name: string, size: number}} Axis
 * @typedef {{devices: number[], coords?: number[] | null, text: string}} Tile
 * @typedef {{name: string, shape: number[], dtype: string, same_on_all?: boolean, tiles?: Tile[],
 *   omitted?: number, same_text?: string | null, global_shape?: number[], pending?: boolean, error?: string}} Output
 * @typedef {{op: string, shape?: string, bytes?: number | null, groups?: number[][], groups_text?: string,
 *   pairs?: number[][], pairs_omitted?: number, source_line?: string | null}} Collective
 */

/**
 * A device swatch: its id on its colour.
 * @param {number} id
 * @param {string} detail
 * @param {boolean} [label]
 */
function swatch(id, detail, label = true) {
  const c = deviceColor(id);
  return label
    ? h("span", { class: "jpm-swatch", style: { background: c.bg, color: c.fg }, title: detail, data: { detail } }, String(id))
    : h("i", { style: { background: c.bg }, title: detail, data: { detail } });
}

/**
 * The processes holding some devices, `p1` or `p0,1`, when the state spans several processes
 * (optional `device_process`, aligned with `device_ids`); otherwise "".
 * @param {(d: number) => number | null} procOf
 * @param {number[]} devices
 */
function procLabel(procOf, devices) {
  const procs = [...new Set(devices.map(procOf).filter((p) => p !== null))].sort((a, b) => /** @type {number} */ (a) - /** @type {number} */ (b));
  return procs.length ? `p${formatIds(/** @type {number[]} */ (procs), 3)}` : "";
}

/**
 * @param {Output} out
 * @param {Axis[]} axes
 * @param {(d: number) => number | null} [procOf] a device's process when there are several
 */
function drawOutput(out, axes, procOf = () => null) {
  const sec = h("div", { class: "jpm-section jpm-output" });
  const shape = formatShape(out.dtype, out.shape || []);
  sec.append(
    h(
      "div",
      { class: "jpm-out-head" },
      h("span", { class: "jpm-out-name", text: out.name }),
      h("span", { class: "jpm-chip" }, "per device ", h("b", { text: shape })),
      out.global_shape ? h("span", { class: "jpm-chip" }, "blocks of ", h("b", { text: formatShape(out.dtype, out.global_shape) })) : null,
      out.same_on_all ? h("span", { class: "jpm-badge", text: "same on all" }) : null,
    ),
  );
  const tiles = out.tiles || [];
  if (out.error || out.pending) {
    // Values on their way from the devices, or unreadable: views/values.py (PENDING_TEXT), views/results.py _waiting.
    sec.append(h("div", { class: "jpm-note", text: out.error ? `values unavailable: ${out.error}` : "values: waiting for the devices…" }));
  } else if (out.same_on_all && tiles.length) {
    const tile = tiles[0];
    const strip = h("div", { class: "jpm-same-strip" });
    for (const id of tile.devices.slice(0, GROUP_CELLS_MAX)) {
      const proc = procOf(id);
      strip.append(swatch(id, `${out.name} on device ${id}${proc === null ? "" : ` (process ${proc})`}: ${tile.text}`, false));
    }
    sec.append(
      h(
        "div",
        { class: "jpm-same" },
        strip,
        h(
          "div",
          { style: { flex: "1", "min-width": "0" } },
          h("div", { class: "jpm-same-label", text: out.same_text || `same on all ${tile.devices.length} devices` }),
          h("pre", { class: "jpm-tile-val", text: tile.text }),
        ),
      ),
    );
  } else {
    const grid = h("div", { class: "jpm-tiles" });
    for (const tile of tiles) {
      const first = tile.devices.length ? tile.devices[0] : 0;
      const c = deviceColor(first);
      const where = tile.coords ? formatCoords(axes, tile.coords) : "";
      const who = tile.devices.length === 1 ? `device ${first}` : `devices ${formatIds(tile.devices)}`;
      const proc = procLabel(procOf, tile.devices);
      const slice = tile.slice ? ` ${out.name}${tile.slice}` : "";
      const detail = `${out.name} on ${who}${where ? ` (${where})` : ""}${proc ? ` · process ${proc.slice(1)}` : ""}: ${shape}${slice ? ` =${slice}` : ""}`;
      grid.append(
        h(
          "div",
          { class: "jpm-tile", data: { detail } },
          h(
            "div",
            { class: "jpm-tile-head", style: { background: c.bg, color: c.fg } },
            h("span", { text: tile.devices.length === 1 ? `dev ${first}` : `dev ${formatIds(tile.devices, 3)}` }),
            h("span", { text: where }),
            proc ? h("span", { class: "jpm-proc", text: proc }) : null,
          ),
          tile.slice ? h("div", { class: "jpm-tile-slice", text: `${out.name}${tile.slice}` }) : null,
          h("pre", { class: "jpm-tile-val", text: tile.text }),
        ),
      );
    }
    sec.append(grid);
  }
  if (out.omitted) sec.append(h("div", { class: "jpm-note", text: `… ${out.omitted} more devices not shown` }));
  return sec;
}

/**
 * Replica groups as boxes of device swatches.
 * @param {Collective} coll
 */
function drawGroups(coll) {
  const groups = coll.groups || [];
  const box = h("div", { class: "jpm-groups" });
  const big = groups.length > GROUPS_MAX || groups.some((g) => g.length > 16);
  groups.slice(0, GROUPS_MAX).forEach((g, k) => {
    const detail = `group ${k}: devices ${formatIds(g, 12)} (${g.length})`;
    const el = h("div", { class: "jpm-group", title: detail, data: { detail } });
    for (const id of g.slice(0, GROUP_CELLS_MAX)) el.append(swatch(id, `device ${id} · group ${k} of ${coll.op}`, !big));
    if (g.length > GROUP_CELLS_MAX) el.append(h("span", { class: "jpm-more", text: `+${g.length - GROUP_CELLS_MAX}` }));
    box.append(el);
  });
  if (groups.length > GROUPS_MAX) box.append(h("span", { class: "jpm-more", text: `… ${groups.length - GROUPS_MAX} more groups not drawn` }));
  return box;
}

/**
 * Who sent to whom: devices on a ring, an arrow per pair. Past RING_MAX devices, a summary.
 * @param {Collective} coll
 * @param {number[]} order device ids in mesh order
 */
function drawPermute(coll, order) {
  const pairs = (coll.pairs || []).filter((p) => Array.isArray(p) && p.length === 2);
  const wrap = h("div", { class: "jpm-permute" });
  const seen = new Set(pairs.flat());
  const nodes = order.filter((d) => seen.has(d));
  for (const d of [...seen].sort((a, b) => a - b)) if (!nodes.includes(d)) nodes.push(d);
  const pos = new Map(order.map((d, k) => [d, k]));
  // A uniform shift in mesh order is the common case (ppermute around a ring): say it.
  const shifts = new Set(pairs.map(([s, d]) => (pos.has(s) && pos.has(d) ? (((/** @type {number} */ (pos.get(d)) - /** @type {number} */ (pos.get(s))) % order.length) + order.length) % order.length : NaN)));
  const shift = shifts.size === 1 ? [...shifts][0] : NaN;
  const omitted = coll.pairs_omitted || 0;
  const sample = pairs.slice(0, 8).map(([s, d]) => `${s}→${d}`).join(", ") + (pairs.length > 8 || omitted ? ", …" : "");
  let summary = `${pairs.length + omitted} pair${pairs.length + omitted === 1 ? "" : "s"}: ${sample}`;
  if (Number.isFinite(shift) && !omitted) {
    // "every device" and "(cyclic)" only when they hold: a pipeline's 0→4 … 3→7 is neither.
    const who = pairs.length === order.length ? "every device sends" : `each of the ${pairs.length} senders sends`;
    const wraps = pairs.some(([s, d]) => /** @type {number} */ (pos.get(d)) < /** @type {number} */ (pos.get(s)));
    summary += ` — ${who} to the ${shift === 1 ? "next one" : `one ${shift} places later`} in mesh order${wraps ? " (cyclic)" : ""}`;
  }
  if (omitted) summary += ` (${omitted} pairs not shipped)`;
  wrap.append(h("div", { class: "jpm-note", text: summary }));
  if (nodes.length === 0 || nodes.length > RING_MAX) {
    if (nodes.length > RING_MAX) wrap.append(h("div", { class: "jpm-note", text: `${nodes.length} devices take part: too many to draw the ring.` }));
    return wrap;
  }
  const n = nodes.length;
  const nodeR = n <= 12 ? 13 : n <= 24 ? 10 : n <= 40 ? 7 : 5;
  const labels = n <= 40;
  const R = Math.max(72, Math.min(170, (n * (2 * nodeR + 10)) / (2 * Math.PI)));
  const pad = nodeR + 8;
  const size = 2 * (R + pad);
  const at = new Map(nodes.map((d, k) => {
    const a = -Math.PI / 2 + (2 * Math.PI * k) / n;
    return [d, [size / 2 + R * Math.cos(a), size / 2 + R * Math.sin(a)]];
  }));
  const root = svg("svg", { class: "jpm-ring", width: size, height: size, viewBox: `0 0 ${size} ${size}`, role: "img", "aria-label": `${coll.op}: ${summary}` });
  const arrows = svg("g");
  const dots = svg("g");
  for (const [s, d] of pairs) {
    const a = /** @type {number[]} */ (at.get(s));
    const b = /** @type {number[]} */ (at.get(d));
    const detail = `device ${s} → device ${d}`;
    if (s === d) {
      arrows.append(svg("circle", { class: "jpm-arrow", cx: a[0], cy: a[1], r: nodeR + 4, data: { detail } }));
      continue;
    }
    const dx = b[0] - a[0];
    const dy = b[1] - a[1];
    const len = Math.hypot(dx, dy);
    const [ux, uy] = [dx / len, dy / len];
    // Bend each arrow to its right, so a→b and b→a never overlap.
    const bend = Math.min(0.18 * len, 28);
    const cx = (a[0] + b[0]) / 2 - uy * bend;
    const cy = (a[1] + b[1]) / 2 + ux * bend;
    const start = towards(a, [cx, cy], nodeR + 2);
    const end = towards(b, [cx, cy], nodeR + 3);
    const tip = Math.max(5, Math.min(8, nodeR * 0.6));
    const [tx, ty] = unit([end[0] - cx, end[1] - cy]);
    const head = [
      end,
      [end[0] - tx * tip - ty * tip * 0.55, end[1] - ty * tip + tx * tip * 0.55],
      [end[0] - tx * tip + ty * tip * 0.55, end[1] - ty * tip - tx * tip * 0.55],
    ];
    const bodyEnd = [end[0] - tx * tip * 0.8, end[1] - ty * tip * 0.8];
    arrows.append(
      svg(
        "g",
        { data: { detail } },
        svg("title", { text: detail }),
        svg("path", { class: "jpm-arrow", d: `M${fx(start[0])},${fx(start[1])} Q${fx(cx)},${fx(cy)} ${fx(bodyEnd[0])},${fx(bodyEnd[1])}` }),
        svg("polygon", { class: "jpm-arrowhead", points: head.map((p) => `${fx(p[0])},${fx(p[1])}`).join(" ") }),
      ),
    );
  }
  for (const d of nodes) {
    const [x, y] = /** @type {number[]} */ (at.get(d));
    const c = deviceColor(d);
    const detail = `device ${d}: sends to ${pairs.filter((p) => p[0] === d).map((p) => p[1]).join(", ") || "none"}; receives from ${pairs.filter((p) => p[1] === d).map((p) => p[0]).join(", ") || "none"}`;
    dots.append(
      svg(
        "g",
        { data: { detail } },
        svg("title", { text: detail }),
        svg("circle", { class: "jpm-node", cx: fx(x), cy: fx(y), r: nodeR, fill: c.bg }),
        labels ? svg("text", { x: fx(x), y: fx(y), "text-anchor": "middle", "dominant-baseline": "central", fill: c.fg, "font-size": nodeR >= 10 ? 11 : 9, text: d }) : null,
      ),
    );
  }
  root.append(arrows, dots);
  wrap.append(root);
  return wrap;
}

/** @param {number} v */
function fx(v) {
  return Math.round(v * 10) / 10;
}
/** @param {number[]} v */
function unit(v) {
  const l = Math.hypot(v[0], v[1]) || 1;
  return [v[0] / l, v[1] / l];
}
/**
 * The point at distance `r` from `p` towards `q`.
 * @param {number[]} p
 * @param {number[]} q
 * @param {number} r
 */
function towards(p, q, r) {
  const [ux, uy] = unit([q[0] - p[0], q[1] - p[1]]);
  return [p[0] + ux * r, p[1] + uy * r];
}

/**
 * @param {Collective} coll
 * @param {number[]} order
 */
function drawCollective(coll, order) {
  const card = h("div", { class: "jpm-coll" });
  card.append(
    h(
      "div",
      { class: "jpm-coll-head" },
      h("span", { class: "jpm-op", text: coll.op }),
      coll.reduction ? h("span", { class: "jpm-chip" }, "combines by ", h("b", { text: coll.reduction })) : null,
      coll.shape ? h("span", { class: "jpm-chip" }, h("b", { text: coll.shape })) : null,
      coll.bytes !== null && coll.bytes !== undefined ? h("span", { class: "jpm-chip", title: "the size of the compiled collective's result on one device, not the bytes it sends" }, "result buffer ", h("b", { text: formatBytes(coll.bytes) })) : null,
      coll.groups_text ? h("span", { class: "jpm-sub", text: coll.groups_text }) : null,
    ),
  );
  if (coll.source_line) card.append(h("div", { class: "jpm-src", text: `↳ ${coll.source_line}` }));
  if (coll.op === "collective-permute") card.append(drawPermute(coll, order));
  else if (coll.groups && coll.groups.length) card.append(drawGroups(coll));
  return card;
}

/**
 * @param {any} state
 */
export function draw(state) {
  /** @type {Axis[]} */
  const axes = (state.axes || []).map((/** @type {Axis} */ a) => ({ name: String(a.name), size: Number(a.size) }));
  /** @type {number[]} */
  const order = state.device_ids || [];
  const root = h("div", { class: "jpm-view jpm-results" });
  const chips = h("span", { class: "jpm-chips" });
  for (const a of axes) chips.append(h("span", { class: "jpm-chip" }, `${a.name} `, h("b", { text: a.size })));
  root.append(h("div", { class: "jpm-head" }, h("span", { class: "jpm-title jpm-mono", text: state.title || "per-device results" }), chips));

  // Optional `device_process` (aligned with device_ids): tiles say their process when several.
  const procs = Array.isArray(state.device_process) ? state.device_process : [];
  const pos = new Map(order.map((d, k) => [d, k]));
  const procOf = new Set(procs).size > 1 ? (/** @type {number} */ d) => (pos.has(d) && /** @type {number} */ (pos.get(d)) < procs.length ? Number(procs[/** @type {number} */ (pos.get(d))]) : null) : () => null;
  const outputs = state.outputs || [];
  for (const out of outputs) root.append(drawOutput(out, axes, procOf));

  const colls = state.collectives || [];
  const sec = h("div", { class: "jpm-section" }, h("div", { class: "jpm-h", text: `Collectives (${colls.length})` }));
  if (colls.length === 0) sec.append(h("div", { class: "jpm-note", text: "none: the compiled program moves no data between devices" }));
  else sec.append(h("div", { class: "jpm-colls" }, ...colls.map((c) => drawCollective(c, order))));
  root.append(sec);

  const r = state.report;
  if (r) {
    const rep = h("div", { class: "jpm-report" });
    const item = (/** @type {string} */ k, /** @type {string} */ v) => h("span", { class: "jpm-chip" }, `${k} `, h("b", { text: v }));
    if (r.compile_ms !== null && r.compile_ms !== undefined) rep.append(item("compile", formatMs(r.compile_ms)));
    if (r.run_ms !== null && r.run_ms !== undefined) rep.append(item("run (waited for its result)", formatMs(r.run_ms)));  // views/results.py RUN_LABEL
    if (r.flops !== null && r.flops !== undefined) rep.append(item("FLOPs per device", formatSI(r.flops)));
    if (r.bytes_accessed !== null && r.bytes_accessed !== undefined) rep.append(item("bytes accessed per device", formatBytes(r.bytes_accessed)));
    root.append(h("div", { class: "jpm-section" }, h("div", { class: "jpm-h", text: "Cost" }), rep));
  }
  const detail = detailLine(root, "hover or click a device for details");
  root.append(detail.line);
  return { node: root, dispose: detail.dispose };
}

export default {
  /** @param {{model: any, el: HTMLElement}} ctx */
  render({ model, el }) {
    // Its values may come after the cell (views/later.py), with its static twin drawn again.
    const stop = keepTwinHidden(el, String(model.get("_jpm_twin") || ""));
    const cleanup = mount(model, el, draw);
    return () => (stop(), cleanup());
  },
};
