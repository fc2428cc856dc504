// @ts-check
/**
 * What a collective card shows, as data: the twins of views/collectives_model.py (a browser test
 * compares them). `movementModel` says which device's block lands in which output block at each
 * step of the movement; `stageLayout` lays a card's device columns out; and the short texts a
 * card writes (a block's contents, the shapes, the algorithm, the bytes). js/collectives_draw.js
 * draws them; js/collectives.js is the widget.
 */
import { formatBytes, formatIds } from "./format.js";

/** Device columns drawn per card. */
const MAX_DEVICES_DRAWN = 16;
/** Curves drawn per picture; 16 devices all-to-all is exactly this many. */
const MAX_LINKS = 256;
/**
 * Stage geometry, in pixels (views/collectives_model.py uses the same numbers). Device columns and
 * group gaps are drawn at their design width when the card has room, and shrink in proportion
 * down to `MIN_COL_W` a column; below that the stage scrolls inside its card.
 */
const LABEL_W = 50;
const GROUP_GAP = 12;
const MIN_COL_W = 30;

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
    label = stepLabel(k, steps);
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
 * `step 3 of 14: reduce-scatter step 3 of 7`; a step whose own label counts the same steps (a
 * one-phase movement) is not counted twice: `step 1 of 1: permute`. Twin of `step_label`.
 * @param {number} k
 * @param {Step[]} steps
 */
export function stepLabel(k, steps) {
  const own = String(steps[k - 1].label);
  const same = ` step ${k} of ${steps.length}`;
  return `step ${k} of ${steps.length}: ${own.endsWith(same) ? own.slice(0, -same.length) : own}`;
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
