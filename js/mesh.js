// @ts-check
/**
 * MeshView: a device mesh laid out by mesh coordinates.
 *
 * 1-D: one row (wrapped every 64 cells); 2-D: a grid, first axis down, second across;
 * N-D: small multiples over the leading axes, each a 2-D grid of the last two axes.
 * Cells carry the device colour; ids are written only when cells are big enough, and every
 * cell has a title and feeds the detail line on hover/click.
 */
import { deviceColor } from "./palette.js";
import { h, formatCoords, unravel, product, detailLine, mount } from "./format.js";

/** Facet titles drawn as text at most this many times (beyond that: title attribute only). */
const MAX_FACET_TITLES = 64;
/** A 1-D mesh wraps after this many cells. */
const WRAP_1D = 64;

/**
 * @typedef {{name: string, size: number}} Axis
 * @typedef {{name?: string, axes: Axis[], device_ids: number[], axis_types?: string[],
 *   abstract?: boolean, kinds?: string[]}} MeshState
 */

/** Past this many rows a facet is drawn with small unlabelled cells (ids on hover), so a tall
 * mesh such as data=32 × model=8 stays a compact picture; the twin of views/mesh.py's. */
const COMPACT_ROWS = 16;

/**
 * Cell size for a facet of `rows` × `cols` cells when the mesh has `total` cells.
 * @param {number} rows
 * @param {number} cols
 * @param {number} total
 * @param {number} maxId
 */
function cellSize(rows, cols, total, maxId) {
  if (rows > COMPACT_ROWS) return cols <= 64 ? { px: 11, font: 0, label: false } : { px: 6, font: 0, label: false };
  if (cols <= 16 && total <= 256) return { px: 40, font: 13, label: true };
  if (cols <= 32 && total <= 1024) return { px: 26, font: 10, label: maxId < 1000 };
  if (cols <= 64) return { px: 11, font: 0, label: false };
  return { px: 6, font: 0, label: false };
}

/**
 * One cell.
 * @param {number} id
 * @param {string} where coordinates text
 * @param {{px: number, font: number, label: boolean}} size
 * @param {boolean} abstract
 */
function cell(id, where, size, abstract) {
  const what = abstract ? `position ${id}` : `device ${id}`;
  const text = where ? `${what} · ${where}` : what;
  const style = { width: `${size.px}px`, height: `${size.px}px` };
  if (!abstract) {
    const c = deviceColor(id);
    Object.assign(style, { background: c.bg, color: c.fg });
  }
  if (size.label) Object.assign(style, { "font-size": `${size.font}px` });
  return h(
    "div",
    { class: abstract ? "jpm-cell jpm-abstract" : "jpm-cell", style, title: text, data: { detail: text, id } },
    size.label ? String(id) : null,
  );
}

/**
 * Axis caption: `name · size`.
 * @param {Axis} axis
 * @param {string} arrow
 */
function axisLabel(axis, arrow) {
  return h("span", { class: "jpm-axis-label" }, h("span", { class: "jpm-axis-name", text: axis.name }), ` · ${axis.size} ${arrow}`);
}

/**
 * A 2-D grid of cells with its axis captions.
 * @param {{rowAxis: Axis | null, colAxis: Axis, rows: number, cols: number, ids: number[],
 *   coordsOf: (k: number) => string, size: {px: number, font: number, label: boolean},
 *   abstract: boolean, note?: string}} g
 */
function grid(g) {
  const track = `repeat(${g.cols}, ${g.size.px}px)`;
  const tight = g.size.px < 20;
  const frame = h("div", { class: "jpm-frame" });
  const top = h("div", { class: "jpm-axis-x" }, axisLabel(g.colAxis, "→"), g.note ? h("span", { class: "jpm-note", text: ` ${g.note}` }) : null);
  if (g.size.label && !g.note) {
    const ticks = h("div", { class: "jpm-ticks", style: { "grid-template-columns": track } });
    for (let c = 0; c < g.cols; c++) ticks.append(h("span", { text: c }));
    top.append(ticks);
  }
  frame.append(top);
  if (g.rowAxis) {
    const left = h("div", { class: "jpm-axis-y" }, axisLabel(g.rowAxis, "→"));
    if (g.size.label) {
      const ticks = h("div", { class: "jpm-ticks jpm-ticks-y", style: { "grid-template-rows": `repeat(${g.rows}, ${g.size.px}px)` } });
      for (let r = 0; r < g.rows; r++) ticks.append(h("span", { text: r }));
      left.append(ticks);
    }
    frame.append(left);
  }
  const cells = h("div", { class: tight ? "jpm-grid jpm-tight" : "jpm-grid", style: { "grid-template-columns": track } });
  g.ids.forEach((id, k) => cells.append(cell(id, g.coordsOf(k), g.size, g.abstract)));
  frame.append(cells);
  return frame;
}

/**
 * The mesh's axis types as chips: one ("Explicit axes") when every axis has the same type, else one
 * per axis (["data:", "Explicit"]). Twin of views/mesh.py's types_chips.
 * @param {MeshState} state
 * @param {{name: string, size: number}[]} axes
 * @returns {string[][]}
 */
function typesChips(state, axes) {
  const types = (state.axis_types || []).slice(0, axes.length).map(String);
  if (!types.length) return [];
  if (new Set(types).size === 1) return [[`${types[0]} ${types.length > 1 ? "axes" : "axis"}`]];
  return types.map((t, k) => [`${axes[k].name}:`, t]);
}

/**
 * @param {MeshState} state
 */
export function draw(state) {
  const axes = (state.axes && state.axes.length ? state.axes : [{ name: "", size: (state.device_ids || [0]).length }]).map((a) => ({
    name: String(a.name),
    size: Number(a.size),
  }));
  const sizes = axes.map((a) => a.size);
  const total = product(sizes);
  const ids = (state.device_ids || []).slice(0, total);
  const abstract = Boolean(state.abstract);
  const maxId = ids.reduce((a, b) => Math.max(a, b), 0);

  const root = h("div", { class: "jpm-view jpm-mesh" });
  const head = h(
    "div",
    { class: "jpm-head" },
    h("span", { class: "jpm-title" }, "Mesh ", h("code", { text: state.name || "mesh" })),
    h("span", { class: "jpm-sub", text: `${axes.map((a) => `${a.name}=${a.size}`).join(" × ")} · ${total} ${abstract ? "positions" : total === 1 ? "device" : "devices"}` }),
  );
  const chips = h("span", { class: "jpm-chips" });
  for (const kind of state.kinds || []) chips.append(h("span", { class: "jpm-chip", text: kind }));
  for (const [label, type] of typesChips(state, axes)) {
    chips.append(type === undefined ? h("span", { class: "jpm-chip", text: label }) : h("span", { class: "jpm-chip" }, `${label} `, h("b", { text: type })));
  }
  if (abstract) chips.append(h("span", { class: "jpm-badge jpm-warn", text: "abstract", title: "an AbstractMesh: cells are positions, not devices" }));
  head.append(chips);
  root.append(head);

  const body = h("div", { class: "jpm-section" });
  /** @param {number[]} prefix */
  const whereFn = (prefix) => (/** @type {number} */ k, /** @type {number[]} */ gsizes) => formatCoords(axes, prefix.concat(unravel(k, gsizes)));

  if (axes.length === 1) {
    const n = ids.length;
    const wrapped = n > WRAP_1D;
    const cols = wrapped ? WRAP_1D : n;
    const size = cellSize(Math.ceil(n / cols), cols, n, maxId);
    const where = whereFn([]);
    body.append(
      grid({
        rowAxis: null,
        colAxis: axes[0],
        rows: Math.ceil(n / cols),
        cols,
        ids,
        coordsOf: (k) => where(k, [n]),
        size,
        abstract,
        note: wrapped ? `(wrapped every ${WRAP_1D})` : undefined,
      }),
    );
  } else {
    const lead = sizes.slice(0, -2);
    const [rows, cols] = sizes.slice(-2);
    const facets = product(lead);
    const per = rows * cols;
    const size = cellSize(rows, cols, total, maxId);
    const titled = facets <= MAX_FACET_TITLES;
    const wrap = h("div", { class: "jpm-facets" });
    for (let f = 0; f < facets; f++) {
      const prefix = unravel(f, lead);
      const where = whereFn(prefix);
      const g = grid({
        rowAxis: axes[axes.length - 2],
        colAxis: axes[axes.length - 1],
        rows,
        cols,
        ids: ids.slice(f * per, (f + 1) * per),
        coordsOf: (k) => where(k, [rows, cols]),
        size,
        abstract,
      });
      if (lead.length === 0) {
        wrap.append(g);
      } else {
        const label = formatCoords(axes, prefix);
        wrap.append(h("div", { class: "jpm-facet", title: label }, titled ? h("div", { class: "jpm-facet-title", text: label }) : null, g));
      }
    }
    body.append(wrap);
    if (lead.length > 0 && !titled) {
      body.append(h("div", { class: "jpm-note", text: `${facets} facets over ${axes.slice(0, -2).map((a) => a.name).join(", ")}; hover a facet or cell for its coordinates` }));
    }
  }
  root.append(body);
  const detail = detailLine(root, `hover or click a cell for its ${abstract ? "position" : "device"} and coordinates`);
  root.append(detail.line);
  return { node: root, dispose: detail.dispose };
}

export default {
  /** @param {{model: any, el: HTMLElement}} ctx */
  render({ model, el }) {
    return mount(model, el, draw);
  },
};
