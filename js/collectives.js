// @ts-check
/**
 * CollectivesView: one card per collective call a `%%pmap --collectives` cell executed.
 *
 * A card says what the call was (op, source line, axes, groups, `f32[4] → f32[8,4]`, how often it
 * ran) and draws it as a stage of aligned columns, one per device (at most 16), grouped by the
 * groups that communicate:
 *
 *   before   the value each device passed in (compact text, or a tiny heat map for 2-D+)
 *   sends    a bar of the blocks each device holds, curves for the data that moves, and a bar
 *            of what lands in each output block, coloured by the device it came from (striped
 *            when several contributions are combined into one block)
 *   after    the value each device got back
 *   bytes    sent ↑ / received ↓ per device (an estimate from the sizes and the algorithm: a
 *            ring for the all-reduce family, a pairwise exchange for all_to_all, direct sends for
 *            ppermute), beside the compiled collective's result buffer (its size, not its traffic)
 *
 * The stage fills the card's width (up to its design width): columns shrink in proportion down to
 * a readable minimum, below which the stage scrolls inside the card, never past its border.
 *
 * A step control walks through `movement.steps` (the algorithm one step at a time); step 0
 * is the whole movement. The drawing's data comes from `movementModel`, the twin of
 * `movement_model` in views/collectives.py, which also draws the static picture.
 */
import { deviceColor } from "./palette.js";
import { h, svg, formatBytes, formatIds, detailLine, mount } from "./format.js";

/** Cards drawn (the engines send at most this many) and device columns drawn per card. */
const MAX_CARDS = 64;
const MAX_DEVICES_DRAWN = 16;
/** Curves drawn per picture; 16 devices all-to-all is exactly this many. */
const MAX_LINKS = 256;
/**
 * Stage geometry, in pixels (views/collectives.py uses the same numbers). Device columns and
 * group gaps are drawn at their design width when the card has room, and shrink in proportion
 * down to `MIN_COL_W` a column; below that the stage scrolls inside its card.
 */
const LABEL_W = 50;
const GROUP_GAP = 12;
const BAR_H = 14;
const LINKS_H = 64;
const MIN_COL_W = 50;
/** Autoplay: one step per this many milliseconds. */
const PLAY_MS = 900;
/** Heat-map colours: viridis at five stops (readable on light and dark backgrounds). */
const HEAT_STOPS = [
  [68, 1, 84],
  [59, 82, 139],
  [33, 145, 140],
  [94, 201, 98],
  [253, 231, 37],
];

/**
 * @typedef {{src: number, src_block: number, dst: number, dst_block: number, reduce?: boolean}} Transfer
 * @typedef {{label: string, transfers: Transfer[]}} Step
 * @typedef {{rows: number, cols: number, values: (number | null)[], min: number, max: number}} Heat
 * @typedef {{device: number, shape: number[], dtype: string, text: string, values?: number[], heat?: Heat | null}} Tile
 * @typedef {{label: string, before: Tile[], after: Tile[]}} Iteration
 * @typedef {{kind: string, blocks: number, transfers: Transfer[], steps: Step[]}} Movement
 * @typedef {number[][]} Slot  origins `[device, block]` of what a block holds
 * @typedef {{columns: number[], groups: number[][], partial: boolean[], in_slots: number, out_slots: number,
 *   top: Slot[][], bottom: Slot[][], links: Transfer[], links_omitted: number, label: string}} Picture
 */

/**
 * The sign a reduction is drawn with.
 * @param {string} op
 */
export function reduceSymbol(op) {
  return op === "pmax" ? "max" : op === "pmin" ? "min" : op === "pmean" ? "mean" : "Σ";
}

/** @param {string} kind */
export function movementSentence(kind) {
  switch (kind) {
    case "all-reduce":
      return "every device's contribution is combined into every output of its group";
    case "all-gather":
      return "each device's block lands in every output of its group";
    case "reduce-scatter":
      return "block k of every input is combined into device k of the group";
    case "all-to-all":
      return "block k of device j goes to device k as its block j: a transpose of blocks";
    case "permute":
      return "each device sends its whole value to another; a device nobody sends to gets zeros";
    default:
      return "no data moves between devices";
  }
}

/**
 * The device columns of a card, grouped: the communicating groups (in group order) restricted
 * to the devices drawn, then any drawn device no group names.
 * @param {any} card
 * @returns {{columns: number[], groups: number[][]}}
 */
export function cardColumns(card) {
  const it = (card.iterations || [])[0];
  /** @type {number[]} */
  const drawn = [];
  for (const t of it ? [...(it.before || []), ...(it.after || [])] : []) {
    if (!drawn.includes(t.device) && drawn.length < MAX_DEVICES_DRAWN) drawn.push(t.device);
  }
  const placed = new Set();
  /** @type {number[][]} */
  const groups = [];
  for (const g of card.groups || []) {
    const mine = g.filter((/** @type {number} */ d) => drawn.includes(d) && !placed.has(d));
    mine.forEach((/** @type {number} */ d) => placed.add(d));
    if (mine.length) groups.push(mine);
  }
  const rest = drawn.filter((d) => !placed.has(d));
  if (rest.length) groups.push(rest);
  return { columns: groups.flat(), groups };
}

/**
 * Add an origin to a slot, keeping it sorted and without repeats.
 * @param {Slot} slot
 * @param {number[]} origin
 */
function addOrigin(slot, origin) {
  if (!slot.some((o) => o[0] === origin[0] && o[1] === origin[1])) slot.push([origin[0], origin[1]]);
  slot.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
}

/**
 * What the picture of one card shows at `step` (0: the whole movement; k: step k of the ring).
 *
 * Whole movement: the top bar holds each device's own input blocks; the bottom bar holds, per
 * output block, the origins (device, block) of every transfer landing there. Step k: both bars
 * are the ring's working buffer (n blocks), before and after step k, simulated from step 1 on:
 * a transfer copies (or, with `reduce`, combines) the source block's contents into the target.
 * @param {any} card
 * @param {number} step
 * @returns {Picture}
 */
export function movementModel(card, step) {
  const mv = card.movement || { kind: "none", blocks: 1, transfers: [], steps: [] };
  const { columns, groups } = cardColumns(card);
  /** @type {Transfer[]} */
  const whole = mv.transfers || [];
  /** @type {Step[]} */
  const steps = mv.steps || [];
  const k = Math.max(0, Math.min(step, steps.length));
  const maxOf = (/** @type {Transfer[]} */ ts, /** @type {(t: Transfer) => number} */ f) => ts.reduce((m, t) => Math.max(m, f(t) + 1), 1);
  const drawn = new Set(columns);
  /** @type {Transfer[]} */
  let shown;
  let top;
  let bottom;
  let inSlots;
  let outSlots;
  let label;
  if (k === 0) {
    inSlots = maxOf(whole, (t) => t.src_block);
    outSlots = maxOf(whole, (t) => t.dst_block);
    top = columns.map((d) => Array.from({ length: inSlots }, (_, b) => [[d, b]]));
    bottom = columns.map(() => Array.from({ length: outSlots }, () => /** @type {Slot} */ ([])));
    for (const t of whole) {
      const at = columns.indexOf(t.dst);
      if (at >= 0 && t.dst_block < outSlots) addOrigin(bottom[at][t.dst_block], [t.src, t.src_block]);
    }
    shown = whole;
    label = "whole movement";
  } else {
    const all = steps.flatMap((s) => s.transfers || []);
    const n = Math.max(Number(mv.blocks) || 1, maxOf(all, (t) => Math.max(t.src_block, t.dst_block)));
    /** @type {Map<number, Slot[]>} */
    const buf = new Map();
    const devices = new Set([...columns, ...(card.groups || []).flat(), ...all.flatMap((t) => [t.src, t.dst])]);
    for (const d of devices) {
      const own = whole.filter((t) => t.src === d && t.dst === d && mv.kind === "all-gather");
      /** @type {Slot[]} */
      const slots = Array.from({ length: n }, () => []);
      if (mv.kind === "all-gather") {
        const g = (card.groups || []).find((/** @type {number[]} */ gr) => gr.includes(d));
        if (own.length) own.forEach((t) => t.dst_block < n && addOrigin(slots[t.dst_block], [d, t.src_block]));
        else if (g && g.indexOf(d) < n) slots[g.indexOf(d)].push([d, 0]);
      } else slots.forEach((s, b) => s.push([d, b]));
      buf.set(d, slots);
    }
    // A permute writes a fresh output (a device nobody sends to gets zeros); the rings and the
    // pairwise all-to-all work in one buffer.
    const fresh = mv.kind === "permute";
    const apply = (/** @type {Step} */ s) => {
      /** @type {Map<number, Slot[]>} */
      const next = new Map([...buf].map(([d, slots]) => [d, slots.map((o) => (fresh ? [] : o.map((x) => [...x])))]));
      for (const t of s.transfers || []) {
        const from = (buf.get(t.src) || [])[t.src_block] || [];
        const into = /** @type {Slot[]} */ (next.get(t.dst));
        if (!into || t.dst_block >= n) continue;
        if (!t.reduce) into[t.dst_block] = [];
        for (const o of from) addOrigin(into[t.dst_block], o);
      }
      for (const [d, slots] of next) buf.set(d, slots);
    };
    for (let s = 0; s < k - 1; s++) apply(steps[s]);
    top = columns.map((d) => (buf.get(d) || []).map((o) => o.map((x) => [...x])));
    apply(steps[k - 1]);
    bottom = columns.map((d) => (buf.get(d) || []).map((o) => o.map((x) => [...x])));
    inSlots = n;
    outSlots = n;
    shown = steps[k - 1].transfers || [];
    label = `step ${k} of ${steps.length}: ${steps[k - 1].label}`;
  }
  const visible = shown.filter((t) => drawn.has(t.src) && drawn.has(t.dst));
  // A column whose communicating group has devices not drawn: its blocks hold more than we show.
  const partial = columns.map((d) => (card.groups || []).some((/** @type {number[]} */ g) => g.includes(d) && g.some((e) => !drawn.has(e))));
  return {
    columns,
    groups,
    partial,
    in_slots: inSlots,
    out_slots: outSlots,
    top,
    bottom,
    links: visible.slice(0, MAX_LINKS).map((t) => ({ src: t.src, src_block: t.src_block, dst: t.dst, dst_block: t.dst_block, reduce: !!t.reduce })),
    links_omitted: Math.max(0, visible.length - MAX_LINKS),
    label,
  };
}

/**
 * A block's contents as text: `3` (device 3's value), `3:2` (its block 2), `Σ(0–7)` (combined),
 * `Σ(0–7):2` (block 2 of each, combined), `·` (nothing). In a group with devices not drawn,
 * `Σ(0–15,…)` and `…` (from devices not drawn).
 * @param {Slot} origins
 * @param {boolean} blocked whether sources have several blocks (then the block is written)
 * @param {string} sym
 * @param {boolean} [partial] the device's group has devices not drawn
 */
export function slotText(origins, blocked, sym, partial = false) {
  if (!origins.length) return partial ? "…" : "·";
  if (origins.length === 1) return blocked ? `${origins[0][0]}:${origins[0][1]}` : `${origins[0][0]}`;
  const devs = [...new Set(origins.map((o) => o[0]))].sort((a, b) => a - b);
  const blocks = new Set(origins.map((o) => o[1]));
  const which = !blocked ? "" : blocks.size === 1 ? `:${origins[0][1]}` : ":*";
  return `${sym}(${formatIds(devs, 4)}${partial ? ",…" : ""})${which}`;
}

/** Whether any origin in a picture names a block other than 0. @param {Picture} p */
export function pictureBlocked(p) {
  return [...p.top, ...p.bottom].some((slots) => slots.some((o) => o.some((x) => x[1] !== 0)));
}

/**
 * Stage geometry: the width of a device column and the left edge of each column (relative to
 * the end of the label column), with a gap between groups.
 * @param {number[][]} groups
 */
export function stageGeometry(groups) {
  const n = groups.reduce((a, g) => a + g.length, 0) || 1;
  const width = Math.max(52, Math.min(120, Math.floor((880 - LABEL_W - GROUP_GAP * (groups.length - 1)) / n)));
  /** @type {number[]} */
  const left = [];
  let x = 0;
  groups.forEach((g, gi) => {
    if (gi) x += GROUP_GAP;
    for (let i = 0; i < g.length; i++) {
      left.push(x);
      x += width;
    }
  });
  return { width, left, total: x };
}

/**
 * The stage's grid and width bounds. Every device column and group gap is a flexible track in
 * proportion to its design width, so the movement picture (drawn in design units and stretched
 * over the columns it spans) stays aligned with the tiles at any width between `min_width`
 * (columns of `MIN_COL_W`) and `max_width` (the design width).
 * @param {number[][]} groups
 */
export function stageLayout(groups) {
  const geo = stageGeometry(groups);
  const tracks = [`${LABEL_W}px`];
  groups.forEach((g, gi) => {
    if (gi) tracks.push(`minmax(0, ${GROUP_GAP}fr)`);
    for (let i = 0; i < g.length; i++) tracks.push(`minmax(0, ${geo.width}fr)`);
  });
  return { template: tracks.join(" "), min_width: LABEL_W + Math.ceil((geo.total * MIN_COL_W) / geo.width), max_width: LABEL_W + geo.total };
}

/**
 * The picture width (in px) a block's label needs to fit its block: the picture is `total`
 * design units wide, the block `w`; a character takes about 6 px. CSS hides the label below it.
 * @param {string} text
 * @param {number} w
 * @param {number} total
 */
export function labelNeed(text, w, total) {
  return Math.ceil((total * (text.length * 6 + 2)) / w);
}

/**
 * A design x coordinate as a percentage of the picture's width.
 * @param {number} x
 * @param {number} total
 */
function pct(x, total) {
  return `${Math.round((x / total) * 1e4) / 100}%`;
}

/** @param {number} t 0..1 */
function heatRGB(t) {
  const x = Math.max(0, Math.min(1, t)) * (HEAT_STOPS.length - 1);
  const i = Math.min(HEAT_STOPS.length - 2, Math.floor(x));
  const f = x - i;
  return HEAT_STOPS[i].map((a, c) => Math.round(a + (HEAT_STOPS[i + 1][c] - a) * f));
}

/**
 * A tiny heat map, one canvas pixel per cell, scaled up without smoothing.
 * @param {Heat} heat
 * @param {number} maxW
 */
function heatCanvas(heat, maxW) {
  const rows = Math.max(1, heat.rows);
  const cols = Math.max(1, heat.cols);
  const canvas = /** @type {HTMLCanvasElement} */ (h("canvas", { class: "jpm-heat", width: cols, height: rows }));
  const ctx = canvas.getContext("2d");
  if (ctx) {
    const img = ctx.createImageData(cols, rows);
    const span = heat.max - heat.min;
    for (let i = 0; i < rows * cols; i++) {
      const v = heat.values[i];
      const rgb = v === null || v === undefined || !Number.isFinite(v) ? [128, 128, 128] : heatRGB(span > 0 ? (v - heat.min) / span : 0.5);
      img.data.set([...rgb, 255], i * 4);
    }
    ctx.putImageData(img, 0, 0);
  }
  // Cells up to 12 px, the map at most `maxW` wide and 48 px tall (cells need not be square).
  canvas.style.width = `${cols * Math.max(1, Math.min(12, Math.floor(maxW / cols)))}px`;
  canvas.style.height = `${rows * Math.max(1, Math.min(12, Math.floor(48 / rows)))}px`;
  return canvas;
}

/**
 * @param {Tile} tile
 * @param {string} when "before" or "after"
 * @param {string} shape
 * @param {number} width
 * @param {number | null} proc its process, when there is more than one
 */
function drawTile(tile, when, shape, width, proc) {
  const c = deviceColor(tile.device);
  const detail = `${when} on device ${tile.device}${proc === null ? "" : ` (process ${proc})`}: ${shape} = ${tile.text}`;
  const body = tile.heat
    ? h(
        "div",
        { class: "jpm-heat-wrap" },
        heatCanvas(tile.heat, width - 10),
        h("div", { class: "jpm-heat-range", text: `${fmtNum(tile.heat.min)}…${fmtNum(tile.heat.max)}` }),
      )
    : h("pre", { class: "jpm-tile-val", text: tile.text });
  return h(
    "div",
    { class: "jpm-ctile", title: detail, data: { detail, device: tile.device } },
    h("div", { class: "jpm-tile-head", style: { background: c.bg, color: c.fg } }, h("span", { text: `dev ${tile.device}` }), proc === null ? null : h("span", { text: `p${proc}` })),
    body,
  );
}

/** @param {number} v */
function fmtNum(v) {
  if (!Number.isFinite(v)) return String(v);
  return Math.abs(v) >= 1e4 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(1) : String(Math.round(v * 100) / 100);
}

/**
 * One bar of blocks (top or bottom of the movement picture): the blocks go into `shapes` (design
 * units, stretched), their labels into `labels` (at percentages of the width, never stretched).
 * @param {{shapes: SVGElement, labels: SVGElement}} layers
 * @param {Slot[][]} bar per column, per block, the origins
 * @param {{width: number, left: number[], total: number}} geo
 * @param {number[]} columns
 * @param {number} y
 * @param {boolean} blocked
 * @param {string} sym
 * @param {string} where "holds" / "receives"
 * @param {boolean[]} partial per column
 */
function drawBar(layers, bar, geo, columns, y, blocked, sym, where, partial) {
  bar.forEach((slots, i) => {
    const d = columns[i];
    const w = (geo.width - 6) / slots.length;
    slots.forEach((origins, b) => {
      const x = geo.left[i] + 3 + b * w;
      const text = slotText(origins, blocked, sym, partial[i]);
      const detail = `device ${d} ${where} block ${b}: ${text === "·" ? "nothing" : text === "…" ? "from devices not drawn" : text}`;
      const g = svg("g", { class: "jpm-slot", data: { detail, device: d, block: b, origins: origins.map((o) => o.join(":")).join(" ") } }, svg("title", { text: detail }));
      const devs = [...new Set(origins.map((o) => o[0]))];
      if (!devs.length) g.append(svg("rect", { class: "jpm-slot-empty", x: fx(x), y, width: fx(w), height: BAR_H }));
      else if (devs.length * 1.5 > w) g.append(svg("rect", { class: "jpm-slot-many", x: fx(x), y, width: fx(w), height: BAR_H }));
      else devs.forEach((o, s) => g.append(svg("rect", { x: fx(x + (s * w) / devs.length), y, width: fx(w / devs.length), height: BAR_H, fill: deviceColor(o).bg })));
      g.append(svg("rect", { class: "jpm-slot-edge", x: fx(x), y, width: fx(w), height: BAR_H }));
      layers.shapes.append(g);
      const onPanel = !devs.length || devs.length * 1.5 > w;
      if (text.length * 6 + 2 <= w) {
        const need = labelNeed(text, w, geo.total);
        layers.labels.append(svg("text", { class: onPanel ? "jpm-on-panel" : null, x: pct(x + w / 2, geo.total), y: y + BAR_H / 2, style: { "--need": `${need}px` }, text }));
      }
    });
  });
}

/** @param {number} v */
function fx(v) {
  return Math.round(v * 10) / 10;
}

/**
 * The movement picture: the two bars and a curve per transfer (through a combining node when
 * one set of contributions feeds several outputs, as in an all-reduce).
 *
 * Curves and blocks are drawn in design units in an inner SVG stretched to the columns' width
 * (the strokes keep their width); the labels and the combining nodes sit above it at
 * percentages of the width, so text keeps its size and shape at any width.
 * @param {Picture} pic
 * @param {any} card
 * @param {{width: number, left: number[], total: number}} geo
 */
function drawPicture(pic, card, geo) {
  const sym = reduceSymbol(card.op);
  const blocked = pictureBlocked(pic);
  const height = 2 * BAR_H + LINKS_H;
  const shapes = svg("svg", { class: "jpm-move-shapes", width: "100%", height: "100%", viewBox: `0 0 ${geo.total} ${height}`, preserveAspectRatio: "none" });
  const labels = svg("g", { class: "jpm-labels" });
  const hubNodes = svg("g", { class: "jpm-hubs" });
  const root = svg("svg", { class: "jpm-move", width: "100%", height, role: "img", "aria-label": `${card.op}: ${pic.label}` }, shapes, labels, hubNodes);
  const col = new Map(pic.columns.map((d, i) => [d, i]));
  const xOf = (/** @type {number} */ d, /** @type {number} */ b, /** @type {number} */ slots) => {
    const i = /** @type {number} */ (col.get(d));
    const w = (geo.width - 6) / slots;
    return geo.left[i] + 3 + (Math.min(b, slots - 1) + 0.5) * w;
  };
  const y0 = BAR_H;
  const y1 = BAR_H + LINKS_H;
  const curve = (/** @type {number} */ xa, /** @type {number} */ ya, /** @type {number} */ xb, /** @type {number} */ yb) => {
    const m = (ya + yb) / 2;
    return `M${fx(xa)},${ya} C${fx(xa)},${m} ${fx(xb)},${m} ${fx(xb)},${yb}`;
  };
  const links = svg("g", { class: "jpm-links" });
  const blockWord = (/** @type {number} */ b, /** @type {number} */ slots) => (slots > 1 || blocked ? ` block ${b}` : "");
  for (const hub of hubs(pic.links)) {
    const x = hub.dsts.reduce((a, t) => a + xOf(t.dst, t.dst_block, pic.out_slots), 0) / hub.dsts.length;
    const y = (y0 + y1) / 2;
    const who = `${sym}(${formatIds([...new Set(hub.srcs.map((t) => t.src))].sort((a, b) => a - b), 3)})`;
    for (const t of hub.srcs) {
      const detail = `device ${t.src}${blockWord(t.src_block, pic.in_slots)} → ${who}`;
      links.append(svg("path", { class: "jpm-link", d: curve(xOf(t.src, t.src_block, pic.in_slots), y0, x, y - 7), stroke: deviceColor(t.src).bg, data: { detail, src: t.src, dst: "hub" } }, svg("title", { text: detail })));
    }
    for (const t of hub.dsts) {
      const detail = `${who} → device ${t.dst}${blockWord(t.dst_block, pic.out_slots)}`;
      links.append(svg("path", { class: "jpm-link jpm-link-out", d: curve(x, y + 7, xOf(t.dst, t.dst_block, pic.out_slots), y1), data: { detail, src: "hub", dst: t.dst } }, svg("title", { text: detail })));
    }
    const tw = Math.max(16, sym.length * 7 + 8);
    hubNodes.append(
      svg(
        "g",
        { class: "jpm-hub", data: { detail: `${who}: combined, then sent to devices ${formatIds(hub.dsts.map((t) => t.dst), 4)}` } },
        svg("ellipse", { cx: pct(x, geo.total), cy: y, rx: tw / 2, ry: 8 }),
        svg("text", { x: pct(x, geo.total), y, text: sym }),
      ),
    );
  }
  for (const t of pic.links.filter((l) => !l.hub)) {
    const detail = `device ${t.src}${blockWord(t.src_block, pic.in_slots)} → device ${t.dst}${blockWord(t.dst_block, pic.out_slots)}${t.reduce ? ` (${sym === "Σ" ? "summed" : sym} into it)` : ""}`;
    links.append(
      svg("path", { class: "jpm-link", d: curve(xOf(t.src, t.src_block, pic.in_slots), y0, xOf(t.dst, t.dst_block, pic.out_slots), y1), stroke: deviceColor(t.src).bg, data: { detail, src: t.src, dst: t.dst } }, svg("title", { text: detail })),
    );
  }
  shapes.append(links);
  const layers = { shapes, labels };
  drawBar(layers, pic.top, geo, pic.columns, 0, blocked, sym, "holds", pic.columns.map(() => false));
  drawBar(layers, pic.bottom, geo, pic.columns, y1, blocked, sym, "receives into", pic.partial);
  // The box is a size container: the labels' CSS compares its width with each label's --need.
  return h("div", { class: "jpm-move-box" }, root);
}

/**
 * Transfers that share one combining node: reduce transfers grouped by destination block; a
 * set of contributions feeding two or more destination blocks becomes a hub. Marks the
 * transfers it takes with `hub: true`.
 * @param {(Transfer & {hub?: boolean})[]} links
 * @returns {{srcs: Transfer[], dsts: Transfer[]}[]}
 */
export function hubs(links) {
  /** @type {Map<string, (Transfer & {hub?: boolean})[]>} */
  const into = new Map();
  for (const t of links) {
    if (!t.reduce) continue;
    const key = `${t.dst}:${t.dst_block}`;
    if (!into.has(key)) into.set(key, []);
    /** @type {Transfer[]} */ (into.get(key)).push(t);
  }
  /** @type {Map<string, {srcs: Transfer[], dsts: Transfer[], all: (Transfer & {hub?: boolean})[]}>} */
  const bySources = new Map();
  for (const ts of into.values()) {
    if (ts.length < 2) continue;
    const key = ts.map((t) => `${t.src}:${t.src_block}`).sort().join(" ");
    if (!bySources.has(key)) bySources.set(key, { srcs: ts, dsts: [], all: [] });
    const hub = /** @type {{srcs: Transfer[], dsts: Transfer[], all: Transfer[]}} */ (bySources.get(key));
    hub.dsts.push(ts[0]);
    hub.all.push(...ts);
  }
  const out = [];
  for (const hub of bySources.values()) {
    if (hub.dsts.length < 2) continue;
    hub.all.forEach((t) => (t.hub = true));
    out.push({ srcs: hub.srcs, dsts: hub.dsts });
  }
  return out;
}

/**
 * Whether a card has data movement to draw.
 * @param {any} card
 */
function moves(card) {
  const mv = card.movement || {};
  return mv.kind !== "none" && ((mv.transfers || []).length > 0 || (mv.steps || []).length > 0);
}

/**
 * Bytes per device, by device id (the state lists them in mesh order).
 * @param {any} card
 * @param {number[]} order device ids in mesh order
 * @param {number} d
 */
function bytesOf(card, order, d) {
  const b = card.bytes || {};
  const i = order.indexOf(d);
  const pick = (/** @type {any[] | undefined} */ xs) => (Array.isArray(xs) && i >= 0 && i < xs.length ? xs[i] : null);
  return { sent: pick(b.sent), received: pick(b.received) };
}

/**
 * The before/movement/after/bytes stage of one card.
 * @param {any} card
 * @param {Iteration} it
 * @param {Picture} pic
 * @param {{order: number[], procOf: (d: number) => number | null}} ctx
 */
function drawStage(card, it, pic, ctx) {
  const geo = stageGeometry(pic.groups);
  const layout = stageLayout(pic.groups);
  const stage = h("div", { class: "jpm-stage", style: { "grid-template-columns": layout.template, "min-width": `${layout.min_width}px`, "max-width": `${layout.max_width}px` } });
  const gridCol = (/** @type {number} */ i) => {
    let gi = 0;
    for (let seen = pic.groups[0].length; i >= seen; seen += pic.groups[gi].length) gi += 1;
    return i + gi + 2;
  };
  let row = 1;
  if (pic.groups.length > 1) {
    let first = 0;
    pic.groups.forEach((g, gi) => {
      const span = g.length;
      stage.append(h("div", { class: "jpm-group-label", style: { "grid-row": row, "grid-column": `${gridCol(first)} / span ${span}` }, text: `group ${gi}: ${formatIds(g, 4)}` }));
      first += span;
    });
    row += 1;
  }
  const byDevice = (/** @type {Tile[]} */ tiles) => new Map((tiles || []).map((t) => [t.device, t]));
  const rows = [
    ["before", byDevice(it.before), card.in_shape],
    ["after", byDevice(it.after), card.out_shape],
  ];
  /** @param {string} text @param {number} r @param {string} [title] */
  const label = (text, r, title) => stage.append(h("div", { class: "jpm-row-label", style: { "grid-row": r, "grid-column": 1 }, text, title }));
  const tileRow = (/** @type {any[]} */ spec, /** @type {number} */ r) => {
    const [when, tiles, shape] = spec;
    if (!tiles.size) return;
    label(when, r);
    pic.columns.forEach((d, i) => {
      const t = tiles.get(d);
      if (!t) return;
      const tile = drawTile(t, when, shape || "", geo.width, ctx.procOf(d));
      tile.style.gridRow = String(r);
      tile.style.gridColumn = String(gridCol(i));
      stage.append(tile);
    });
  };
  tileRow(rows[0], row);
  if (moves(card)) {
    label("sends", row + 1, pic.label);
    const pictureEl = drawPicture(pic, card, geo);
    pictureEl.style.gridRow = String(row + 1);
    pictureEl.style.gridColumn = "2 / -1";
    stage.append(pictureEl);
  }
  tileRow(rows[1], row + 2);
  const bytes = card.bytes || {};
  if (Array.isArray(bytes.sent) || Array.isArray(bytes.received)) {
    label(bytes.estimate === false ? "bytes" : "bytes*", row + 3, `bytes each device sends (↑) and receives (↓); * estimated from the array sizes and the ${algorithmName((card.movement || {}).kind) || "movement drawn"}`);
    pic.columns.forEach((d, i) => {
      const b = bytesOf(card, ctx.order, d);
      const detail = `device ${d} sends ${formatBytes(b.sent)} and receives ${formatBytes(b.received)}${bytes.estimate === false ? "" : " (estimate)"}`;
      stage.append(h("div", { class: "jpm-bytes", style: { "grid-row": row + 3, "grid-column": gridCol(i) }, title: detail, data: { detail } }, h("div", { text: `↑${formatBytes(b.sent)}` }), h("div", { text: `↓${formatBytes(b.received)}` })));
    });
  }
  return stage;
}

/**
 * One card, with its own iteration toggle and step control.
 * @param {any} card
 * @param {{order: number[], procOf: (d: number) => number | null}} ctx
 * @returns {{node: HTMLElement, dispose: () => void}}
 */
function drawCard(card, ctx) {
  const el = h("div", { class: "jpm-ccard", data: { index: card.index ?? "", op: card.op } });
  const head = h(
    "div",
    { class: "jpm-coll-head" },
    h("span", { class: "jpm-op", text: card.op }),
    card.value ? h("span", { class: "jpm-value", text: card.value }) : null,
    card.primitive && card.primitive !== card.op ? h("span", { class: "jpm-sub", text: `(${card.primitive})` }) : null,
    card.in_shape || card.out_shape ? h("span", { class: "jpm-chip" }, h("b", { text: shapesText(card) })) : null,
    (card.axes || []).length ? h("span", { class: "jpm-chip" }, "over ", h("b", { text: card.axes.join(", ") })) : null,
    groupsChip(card),
    card.count > 1 ? h("span", { class: "jpm-badge", text: `ran ${card.count}×` }) : null,
    card.recorded === false ? h("span", { class: "jpm-badge jpm-warn", text: "not recorded" }) : null,
  );
  el.append(head);
  if (card.source || card.line !== null && card.line !== undefined) {
    el.append(h("div", { class: "jpm-src", text: `↳ ${card.line !== null && card.line !== undefined ? `line ${card.line}: ` : ""}${card.source || ""}` }));
  }
  if (card.recorded === false) {
    el.append(h("div", { class: "jpm-note", text: `not recorded: ${card.why_not || "the recorder does not support this collective"}. It ran correctly; only its picture is missing.` }));
    return { node: el, dispose: () => {} };
  }
  const iterations = /** @type {Iteration[]} */ (card.iterations || []);
  const steps = (card.movement && card.movement.steps) || [];
  const ui = { it: 0, step: 0, timer: /** @type {any} */ (null) };
  const mv = card.movement || { kind: "none" };
  el.append(h("div", { class: "jpm-note jpm-move-note", text: `${mv.kind}: ${movementSentence(mv.kind)}` }));

  const controls = h("div", { class: "jpm-controls" });
  /** @type {HTMLButtonElement[]} */
  const itButtons = [];
  if (iterations.length > 1) {
    const seg = h("div", { class: "jpm-seg", role: "group", "aria-label": "which iteration" });
    iterations.forEach((it, i) => {
      const b = /** @type {HTMLButtonElement} */ (h("button", { type: "button", class: "jpm-btn", data: { iteration: it.label }, text: `${it.label} iteration`, on: { click: () => setIteration(i) } }));
      itButtons.push(b);
      seg.append(b);
    });
    controls.append(seg);
  }
  const status = h("span", { class: "jpm-step-label", "aria-live": "polite" });
  /** @type {HTMLInputElement | null} */
  let slider = null;
  /** @type {Record<string, HTMLButtonElement>} */
  const btn = {};
  if (steps.length) {
    const mk = (/** @type {string} */ name, /** @type {string} */ text, /** @type {string} */ aria, /** @type {() => void} */ fn) => {
      btn[name] = /** @type {HTMLButtonElement} */ (h("button", { type: "button", class: "jpm-btn", "aria-label": aria, title: aria, data: { action: name }, text, on: { click: fn } }));
      return btn[name];
    };
    slider = /** @type {HTMLInputElement} */ (h("input", { type: "range", class: "jpm-slider", min: 0, max: steps.length, step: 1, value: 0, "aria-label": "step of the movement (0: the whole movement)", on: { input: () => setStep(Number(/** @type {HTMLInputElement} */ (slider).value)) } }));
    const group = h(
      "div",
      { class: "jpm-steps", role: "group", "aria-label": "step through the movement (arrow keys, Home, End)" },
      mk("whole", "« whole", "whole movement", () => setStep(0)),
      mk("prev", "‹ prev", "previous step", () => setStep(ui.step - 1)),
      mk("play", "▶ play", "play the steps", () => togglePlay()),
      mk("next", "next ›", "next step", () => setStep(ui.step + 1)),
      slider,
    );
    group.addEventListener("keydown", (ev) => {
      if (ev.target === slider) return; // the slider moves itself with the arrow keys
      const to = { ArrowLeft: ui.step - 1, ArrowRight: ui.step + 1, Home: 0, End: steps.length }[ev.key];
      if (to === undefined) return;
      ev.preventDefault();
      setStep(to);
    });
    controls.append(group);
  }
  controls.append(status);
  el.append(controls);
  // The stage keeps a readable minimum width; below it, it scrolls here, inside the card.
  let stage = h("div");
  el.append(h("div", { class: "jpm-stage-scroll" }, stage));
  const note = h("div", { class: "jpm-note" });
  el.append(note);

  function render() {
    const it = iterations[ui.it];
    const pic = movementModel(card, ui.step);
    const next = it ? drawStage(card, it, pic, ctx) : h("div", { class: "jpm-note", text: "no values recorded" });
    next.dataset.step = String(ui.step);
    next.dataset.iteration = it ? it.label : "";
    stage.replaceWith(next);
    stage = next;
    itButtons.forEach((b, i) => b.setAttribute("aria-pressed", String(i === ui.it)));
    status.textContent = steps.length ? pic.label : "";
    if (slider) {
      slider.value = String(ui.step);
      slider.setAttribute("aria-valuetext", pic.label);
      // aria-disabled, not disabled: a disabled button drops the keyboard focus.
      btn.prev.setAttribute("aria-disabled", String(ui.step === 0));
      btn.next.setAttribute("aria-disabled", String(ui.step === steps.length));
    }
    const bits = [];
    if (card.devices_omitted) bits.push(`${card.devices_omitted} more devices not drawn`);
    if (pic.links_omitted) bits.push(`${pic.links_omitted} more transfers not drawn`);
    const b = card.bytes || {};
    if (b.sent || b.received) bits.push(bytesNote(card));
    if (steps.length) bits.push(`${algorithmName((card.movement || {}).kind) || "steps"}: ${stepsPhrase(steps)}`);
    note.textContent = bits.join(" · ");
  }
  /** @param {number} i */
  function setIteration(i) {
    ui.it = Math.max(0, Math.min(iterations.length - 1, i));
    render();
  }
  /** @param {number} k */
  function setStep(k) {
    ui.step = Math.max(0, Math.min(steps.length, k));
    render();
  }
  function stop() {
    if (ui.timer !== null) clearInterval(ui.timer);
    ui.timer = null;
    if (btn.play) {
      btn.play.textContent = "▶ play";
      btn.play.setAttribute("aria-label", "play the steps");
    }
  }
  function togglePlay() {
    if (ui.timer !== null) return stop();
    if (ui.step >= steps.length) setStep(0);
    btn.play.textContent = "❚❚ pause";
    btn.play.setAttribute("aria-label", "pause");
    ui.timer = setInterval(() => {
      if (ui.step >= steps.length) return stop();
      setStep(ui.step + 1);
      if (ui.step >= steps.length) stop();
    }, PLAY_MS);
  }
  render();
  return { node: el, dispose: stop };
}

/**
 * How a movement kind moves its data, as the step control draws it and the byte estimate
 * counts it: only the all-reduce family runs as a ring.
 * @param {string} kind
 */
export function algorithmName(kind) {
  switch (kind) {
    case "all-reduce":
    case "all-gather":
    case "reduce-scatter":
      return "ring algorithm";
    case "all-to-all":
      return "pairwise exchange";
    case "permute":
      return "direct sends";
    default:
      return "";
  }
}

/**
 * The card's note on bytes: what the estimate is, and what the compiled figure is (the size of
 * the collective's result buffer on one device, which is not what it sends).
 * @param {any} card
 */
export function bytesNote(card) {
  const b = card.bytes || {};
  if (!(b.sent || b.received)) return "";
  if ((card.movement || {}).kind === "none") return "no bytes move: every device computes this on its own";
  const how = algorithmName((card.movement || {}).kind) || "the movement drawn";
  const est = b.estimate === false ? "bytes sent ↑ and received ↓ per device" : `bytes* sent ↑ and received ↓ per device, estimated from the array sizes and the ${how}`;
  const compiled = b.compiled === null || b.compiled === undefined ? "not known" : `${formatBytes(b.compiled)} per device (its size, not what it sends)`;
  return `${est}; the compiled collective's result buffer: ${compiled}`;
}

/**
 * `f32[4] → f32[8,4]`; an op without an operand (axis_index) has only its result.
 * @param {any} card
 */
export function shapesText(card) {
  return card.in_shape ? `${card.in_shape} → ${card.out_shape || "?"}` : `→ ${card.out_shape || "?"}`;
}

/**
 * The ring steps in a phrase: `reduce-scatter (7 steps) → all-gather (7 steps)`.
 * @param {{label: string}[]} steps
 */
export function stepsPhrase(steps) {
  /** @type {[string, number][]} */
  const runs = [];
  for (const s of steps) {
    const phase = String(s.label).split(" step ")[0];
    if (runs.length && runs[runs.length - 1][0] === phase) runs[runs.length - 1][1] += 1;
    else runs.push([phase, 1]);
  }
  return runs.map(([p, n]) => `${p} (${n} step${n === 1 ? "" : "s"})`).join(" → ");
}

/** @param {any} card */
function groupsChip(card) {
  const groups = card.groups || [];
  if (!groups.length) return null;
  const sizes = new Set(groups.map((/** @type {number[]} */ g) => g.length));
  const text = groups.length === 1 ? `1 group of ${groups[0].length}` : sizes.size === 1 ? `${groups.length} groups of ${groups[0].length}` : `${groups.length} groups`;
  return h("span", { class: "jpm-sub", title: groups.slice(0, 16).map((/** @type {number[]} */ g) => `{${formatIds(g, 6)}}`).join(" "), text });
}

/** @param {any} state */
export function draw(state) {
  const axes = state.axes || [];
  /** @type {number[]} */
  const order = state.device_ids || [];
  const procs = state.device_process || null;
  const multi = Array.isArray(procs) && new Set(procs).size > 1;
  const procOf = (/** @type {number} */ d) => (multi && order.indexOf(d) >= 0 ? Number(procs[order.indexOf(d)]) : null);
  const root = h("div", { class: "jpm-view jpm-collectives" });
  const chips = h("span", { class: "jpm-chips" });
  for (const a of axes) chips.append(h("span", { class: "jpm-chip" }, `${a.name} `, h("b", { text: a.size })));
  const cards = (state.cards || []).slice(0, MAX_CARDS);
  root.append(
    h(
      "div",
      { class: "jpm-head" },
      h("span", { class: "jpm-title jpm-mono", text: state.title || "collectives" }),
      chips,
      h("span", { class: "jpm-sub", text: `${cards.length} collective call${cards.length === 1 ? "" : "s"}, in program order` }),
    ),
  );
  if (!cards.length) root.append(h("div", { class: "jpm-note", text: "none: the cell called no collective" }));
  /** @type {(() => void)[]} */
  const disposers = [];
  const list = h("div", { class: "jpm-colls" });
  for (const card of cards) {
    const c = drawCard(card, { order, procOf });
    list.append(c.node);
    disposers.push(c.dispose);
  }
  root.append(list);
  const omitted = (state.omitted_cards || 0) + Math.max(0, (state.cards || []).length - cards.length);
  if (omitted) root.append(h("div", { class: "jpm-note", text: `… ${omitted} more collective calls not shown` }));
  const detail = detailLine(root, "hover or click a device, a block or a curve for details");
  root.append(detail.line);
  return {
    node: root,
    dispose() {
      detail.dispose();
      disposers.forEach((f) => f());
    },
  };
}

export default {
  /** @param {{model: any, el: HTMLElement}} ctx */
  render({ model, el }) {
    return mount(model, el, draw);
  },
};
