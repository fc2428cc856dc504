// @ts-check
/**
 * ShardingView: how an array is split over a mesh.
 *
 * The array's blocks are drawn to relative scale (1-D: a row; 2-D: a grid; N-D: facets over
 * the leading dimensions, at most 16), each coloured by the device that holds it; a block
 * held by several devices is drawn as copies: a neutral cell labelled "N copies: ids" with a
 * small mark per copy in each device's colour (side-by-side stripes would read as a split). The
 * legend maps mesh axes to array dimensions and writes the PartitionSpec. Hover or click a
 * block for its index slices and shard shape.
 */
import { deviceColor } from "./palette.js";
import { h, formatBytes, formatShape, formatSpec, formatSlices, formatIds, unravel, product, detailLine, mount } from "./format.js";

/** Facets drawn for N-D arrays (the rest are counted). */
const MAX_FACETS = 16;
/** A 1-D array with more blocks than this wraps into rows of equal blocks. */
const WRAP_1D = 64;
/**
 * "8 distinct blocks on 8 devices"; with no devices, where the blocks are instead (the twin of
 * views/sharding.py's _head_sub).
 * @param {any} state @param {number} count
 */
function headSub(state, count) {
  const blocks = `${count} distinct block${count === 1 ? "" : "s"}`;
  const n = state.total_devices ?? "?";
  if (n === 0) return state.abstract ? `${blocks}, not laid out on devices` : `${blocks} in host memory, on no device`;
  return `${blocks} on ${n} device${n === 1 ? "" : "s"}`;
}

/** Copy marks drawn for a block held by several devices. */
const MAX_STRIPES = 8;

/**
 * @typedef {{block: number[], index: number[][], shard_shape: number[], devices: number[]}} Tile
 * @typedef {{name: string, size: number}} Axis
 */

/**
 * The mesh axes an entry of the spec names.
 * @param {string | string[] | null} entry
 * @returns {string[]}
 */
function entryAxes(entry) {
  if (entry === null || entry === undefined) return [];
  return Array.isArray(entry) ? entry.map(String) : [String(entry)];
}

/**
 * Caption of one array dimension: `dim 0 · 4000 · split 8× over data`.
 * @param {any} state
 * @param {number} k
 */
function dimCaption(state, k) {
  const axes = entryAxes((state.spec || [])[k] ?? null);
  const n = (state.grid || [])[k] || 1;
  const split = axes.length ? `split ${n}× over ${axes.join("×")}` : "not split";
  return `dim ${k} · ${state.shape[k]} · ${split}`;
}

/**
 * The caption written sideways along a drawing `px` tall: shortened when it would not fit.
 * @param {any} state
 * @param {number} k
 * @param {number} px
 */
export function sideCaption(state, k, px) {
  const full = dimCaption(state, k);
  return full.length * 7 <= px ? full : px >= 70 ? `dim ${k} · ${state.shape[k]}` : `dim ${k}`;
}

/**
 * A device's process when the state spans several (optional `device_process`,
 * `{"<device id>": process}`), else null for every device.
 * @param {any} state
 * @returns {(d: number) => number | null}
 */
export function processOf(state) {
  const map = state.device_process;
  if (!map || typeof map !== "object" || new Set(Object.values(map)).size <= 1) return () => null;
  return (d) => (Object.prototype.hasOwnProperty.call(map, String(d)) ? Number(map[String(d)]) : null);
}

/**
 * ` · process 1`, ` · processes 0,1` (a block replicated across processes), or "".
 * @param {(d: number) => number | null} procOf
 * @param {number[]} devs
 */
export function processText(procOf, devs) {
  const procs = [...new Set(devs.map(procOf).filter((p) => p !== null))].sort((a, b) => /** @type {number} */ (a) - /** @type {number} */ (b));
  if (!procs.length) return "";
  return procs.length === 1 ? ` · process ${procs[0]}` : ` · processes ${formatIds(/** @type {number[]} */ (procs), 4)}`;
}

/**
 * One line per process: which devices it has and how many blocks it holds a copy of.
 * @param {(d: number) => number | null} procOf
 * @param {any} state
 * @param {Tile[]} tiles
 * @returns {string[]}
 */
export function processLines(procOf, state, tiles) {
  const map = state.device_process || {};
  /** @type {Map<number, number[]>} */
  const devices = new Map();
  for (const key of Object.keys(map)) {
    const p = procOf(Number(key));
    if (p === null) continue;
    if (!devices.has(p)) devices.set(p, []);
    /** @type {number[]} */ (devices.get(p)).push(Number(key));
  }
  return [...devices.keys()].sort((a, b) => a - b).map((p) => {
    const ids = /** @type {number[]} */ (devices.get(p)).sort((a, b) => a - b);
    const held = tiles.filter((t) => (t.devices || []).some((d) => procOf(d) === p)).length;
    return `process ${p}: devices ${formatIds(ids, 6)} · holds ${held} block${held === 1 ? "" : "s"}`;
  });
}

/**
 * One block.
 * @param {Tile | undefined} tile
 * @param {string} dtype
 * @param {number} wpx approximate width in pixels
 * @param {number} hpx approximate height in pixels
 * @param {(d: number) => number | null} [procOf]
 */
function block(tile, dtype, wpx, hpx, procOf = () => null) {
  if (!tile) return h("div", { class: "jpm-block", style: { background: "var(--jpm-panel)" } });
  const devs = tile.devices || [];
  const who = devs.length === 0 ? "no device" : devs.length === 1 ? `device ${devs[0]}` : `devices ${formatIds(devs, 8)} (${devs.length}, replicated)`;
  const detail = `block (${tile.block.join(", ")}) · index ${formatSlices(tile.index)} · shard ${formatShape(dtype, tile.shard_shape)} · ${who}${processText(procOf, devs)}`;
  const copies = devs.length > 1;
  const big = wpx >= 48 && hpx >= 40 ? " jpm-big" : "";
  const el = h("div", { class: `jpm-block${big}${copies ? " jpm-copies" : ""}`, title: detail, data: { detail } });
  if (devs.length === 1) {
    const c = deviceColor(devs[0]);
    el.style.background = c.bg;
    el.style.color = c.fg;
  }
  // Copies, not a split: one neutral cell that names its devices, and a small mark per copy.
  const label = copies ? copiesLabel(devs) : devs.length ? String(devs[0]) : "";
  const fits = hpx >= 15 && wpx >= 7 * Math.min(label.length, 12) + 8;
  if (fits) el.append(h("span", { class: copies ? "jpm-blabel" : "", text: label }));
  if (copies) {
    const marks = h("span", { class: "jpm-copy-marks" });
    for (const id of devs.slice(0, MAX_STRIPES)) marks.append(h("i", { style: { background: deviceColor(id).bg } }));
    if (devs.length > MAX_STRIPES) marks.append(`+${devs.length - MAX_STRIPES}`);
    el.append(marks);
  }
  return el;
}

/**
 * A replicated block's label: `2 copies: 0,1`; the twin of views/sharding.py's `copies_label`.
 * @param {number[]} devs
 */
export function copiesLabel(devs) {
  return `${devs.length} copies: ${formatIds(devs, 2)}`;
}

/**
 * The state's blocks, decoded: the twin of `expand_sharding_tiles` in views/summaries.py.
 *
 * `bounds[d]` holds the grid[d] + 1 cut points of dimension d; `blocks[k]` says who holds the
 * k-th block in row-major order over `grid`: a device id, or a list of ids (several: replicas;
 * none: on no device). A capped state sends fewer than product(grid) blocks: the rest are absent.
 * @param {any} state
 * @returns {{byBlock: Map<string, Tile>, ext: number[][], count: number}}
 */
export function decodeBlocks(state) {
  const shape = (state.shape || []).map(Number);
  /** @type {number[]} */
  const grid = (state.grid || shape.map(() => 1)).map(Number);
  /** @type {number[][]} */
  const bounds = state.bounds || [];
  const blocks = state.blocks || [];
  if (bounds.length !== grid.length || bounds.some((b, k) => !Array.isArray(b) || b.length !== grid[k] + 1)) {
    throw new Error(`bounds ${JSON.stringify(bounds)} do not match grid ${JSON.stringify(grid)}`);
  }
  const count = product(grid);
  if (blocks.length > count) throw new Error(`${blocks.length} blocks for a grid of ${count}`);
  /** @type {Map<string, Tile>} */
  const byBlock = new Map();
  blocks.forEach((/** @type {number | number[]} */ held, /** @type {number} */ k) => {
    const devices = typeof held === "number" ? [held] : Array.isArray(held) ? held.map(Number) : null;
    if (!devices) throw new Error(`block ${k}: ${JSON.stringify(held)} is not a device id or a list of them`);
    const block = unravel(k, grid);
    const index = block.map((b, d) => [Number(bounds[d][b]), Number(bounds[d][b + 1])]);
    byBlock.set(block.join(","), { block, index, shard_shape: index.map(([a, z]) => z - a), devices });
  });
  const ext = bounds.map((cuts) => cuts.slice(1).map((z, b) => Math.max(0, z - cuts[b])));
  return { byBlock, ext, count: state.blocks ? count : 0 };
}

/**
 * A 2-D grid of blocks (relative sizes).
 * @param {{rows: number[], cols: number[], width: number, height: number, at: (r: number, c: number) => Tile | undefined, dtype: string, procOf?: (d: number) => number | null}} g
 */
function blockGrid(g) {
  const rsum = g.rows.reduce((a, b) => a + b, 0) || 1;
  const csum = g.cols.reduce((a, b) => a + b, 0) || 1;
  const gap = g.rows.length > 32 || g.cols.length > 32 ? 1 : 2;
  const el = h("div", {
    class: "jpm-blocks",
    style: {
      width: `${g.width}px`,
      "max-width": "100%", // a narrow output area squeezes the blocks rather than cutting them off
      height: `${g.height}px`,
      gap: `${gap}px`,
      "grid-template-columns": g.cols.map((c) => `minmax(0, ${c / csum}fr)`).join(" "),
      "grid-template-rows": g.rows.map((r) => `minmax(0, ${r / rsum}fr)`).join(" "),
    },
  });
  for (let r = 0; r < g.rows.length; r++) {
    for (let c = 0; c < g.cols.length; c++) {
      el.append(block(g.at(r, c), g.dtype, (g.width * g.cols[c]) / csum, (g.height * g.rows[r]) / rsum, g.procOf));
    }
  }
  return el;
}

/**
 * Pixel size of one facet's drawing: the array's aspect ratio (clamped) inside a box that
 * shrinks as facets multiply, never so small that blocks vanish.
 * @param {number} facets
 * @param {number} R rows of the array (elements)
 * @param {number} C columns of the array (elements)
 * @param {number} gr blocks down
 * @param {number} gc blocks across
 */
export function boxSize(facets, R, C, gr, gc) {
  const maxW = facets === 1 ? 520 : facets <= 4 ? 300 : 200;
  const maxH = facets === 1 ? 340 : facets <= 4 ? 240 : 160;
  const aspect = Math.max(0.15, Math.min(6, R / Math.max(1, C)));
  let width = maxW;
  let height = width * aspect;
  if (height > maxH) {
    height = maxH;
    width = height / aspect;
  }
  width = Math.max(width, 60, Math.min(gc * 6, 600));
  height = Math.max(height, 36, Math.min(gr * 8, 600));
  return { width: Math.round(width), height: Math.round(height) };
}

/** @param {any} state */
export function draw(state) {
  const shape = (state.shape || []).map(Number);
  const grid = (state.grid || shape.map(() => 1)).map(Number);
  /** @type {Axis[]} */
  const meshAxes = state.mesh_axes || [];
  const { byBlock, ext, count } = decodeBlocks(state);
  const dtype = String(state.dtype || "");
  const procOf = processOf(state);

  const root = h("div", { class: "jpm-view jpm-sharding" });
  root.append(
    h(
      "div",
      { class: "jpm-head" },
      h("span", { class: "jpm-title" }, h("code", { text: state.name || "array" })),
      h("span", { class: "jpm-chip" }, h("b", { text: formatShape(dtype, shape) })),
      state.nbytes !== null && state.nbytes !== undefined ? h("span", { class: "jpm-chip" }, "whole array ", h("b", { text: formatBytes(state.nbytes) })) : null,
      h("span", { class: "jpm-sub", text: headSub(state, count) }),
      state.abstract ? h("span", { class: "jpm-badge jpm-warn", text: "abstract", title: "no devices yet: positions in an abstract mesh" }) : null,
      state.process_count > 1 ? h("span", { class: "jpm-badge", text: `${state.process_count} processes` }) : null,
    ),
  );

  // Legend: the spec, then mesh axis -> array dimension.
  const legend = h("div", { class: "jpm-legend" });
  const used = new Map();
  (state.spec || []).forEach((/** @type {any} */ e, /** @type {number} */ k) => entryAxes(e).forEach((a) => used.set(a, k)));
  for (const a of meshAxes) {
    const where = used.has(a.name) ? `splits dim ${used.get(a.name)} (${shape[used.get(a.name)]})` : `replicates: each block is copied across its ${a.size} positions`;
    legend.append(h("span", { class: "jpm-mono", text: a.name }), h("span", { text: `${a.size}` }), h("span", { text: `→ ${where}` }));
  }
  root.append(
    h(
      "div",
      { class: "jpm-section" },
      h("div", { class: "jpm-head" }, h("span", { class: "jpm-spec", text: formatSpec(state.spec || []) }), (state.replicated_over || []).length ? h("span", { class: "jpm-sub", text: `replicated over ${(state.replicated_over || []).join(", ")}` }) : null),
      legend,
      ...processLines(procOf, state, [...byBlock.values()]).map((line) => h("div", { class: "jpm-note jpm-procs", text: line })),
    ),
  );

  const body = h("div", { class: "jpm-section" });
  const nd = shape.length;
  if (nd <= 1) {
    const n = nd === 0 ? 1 : grid[0];
    const at = (/** @type {number} */ b) => byBlock.get(nd === 0 ? "" : String(b));
    let g;
    if (n <= WRAP_1D) {
      g = blockGrid({ rows: [1], cols: nd === 0 ? [1] : ext[0], width: Math.min(560, Math.max(120, n * 40)), height: 36, at: (_r, c) => at(c), dtype, procOf });
    } else {
      const rows = Math.ceil(n / WRAP_1D);
      g = blockGrid({ rows: new Array(rows).fill(1), cols: new Array(WRAP_1D).fill(1), width: 560, height: rows * 14, at: (r, c) => (r * WRAP_1D + c < n ? at(r * WRAP_1D + c) : undefined), dtype, procOf });
    }
    const frame = h("div", { class: "jpm-frame" }, h("div", { class: "jpm-axis-x", text: nd === 0 ? "scalar" : `${dimCaption(state, 0)} →${n > WRAP_1D ? ` (wrapped every ${WRAP_1D} blocks, equal widths)` : ""}` }));
    g.style.gridColumn = "2";
    g.style.gridRow = "2";
    frame.append(g);
    body.append(frame);
  } else {
    const lead = grid.slice(0, -2);
    const facets = product(lead);
    const shown = Math.min(facets, MAX_FACETS);
    const [R, C] = [shape[nd - 2], shape[nd - 1]];
    const { width, height } = boxSize(facets, R, C, grid[nd - 2], grid[nd - 1]);
    const wrap = h("div", { class: "jpm-facets" });
    for (let f = 0; f < shown; f++) {
      const prefix = unravel(f, lead);
      const g = blockGrid({
        rows: ext[nd - 2],
        cols: ext[nd - 1],
        width,
        height,
        at: (r, c) => byBlock.get(prefix.concat([r, c]).join(",")),
        dtype,
        procOf,
      });
      const frame = h(
        "div",
        { class: "jpm-frame" },
        h("div", { class: "jpm-axis-x", text: `${dimCaption(state, nd - 1)} →` }),
        h("div", { class: "jpm-axis-y" }, h("span", { class: "jpm-axis-label", title: dimCaption(state, nd - 2), text: `${sideCaption(state, nd - 2, height)} →` })),
        g,
      );
      g.style.gridColumn = "2";
      g.style.gridRow = "2";
      if (lead.length) {
        const sample = byBlock.get(prefix.concat([0, 0]).join(","));
        const slices = sample ? sample.index.slice(0, lead.length).map(([a, b]) => `${a}:${b}`) : prefix.map(String);
        const title = `[${slices.concat([":", ":"]).join(", ")}]`;
        wrap.append(h("div", { class: "jpm-facet" }, h("div", { class: "jpm-facet-title", text: title }), frame));
      } else wrap.append(frame);
    }
    if (facets > shown) wrap.append(h("div", { class: "jpm-more", text: `… ${facets - shown} more facets over the leading dimension${lead.length > 1 ? "s" : ""}` }));
    body.append(wrap);
  }
  root.append(body);
  const detail = detailLine(root, "hover or click a block for its index slices, shard shape and devices");
  root.append(detail.line);
  return { node: root, dispose: detail.dispose };
}

export default {
  /** @param {{model: any, el: HTMLElement}} ctx */
  render({ model, el }) {
    return mount(model, el, draw);
  },
};
