// @ts-check
/**
 * The drawing of one collective card, in the DOM (text through textContent only): its head (op,
 * shapes, axes, groups, badges) and its stage of aligned device columns, the values before and
 * after as text or tiny heat maps, the movement picture (two bars of blocks and the curves of the
 * data that moves, in SVG) and the bytes per device. What the picture shows comes from
 * js/collectives_model.js; js/collectives.js adds the controls that pick what is drawn.
 */
import { deviceColor } from "./palette.js";
import { h, svg, formatBytes, formatIds } from "./format.js";
import { algorithmName, hubs, labelNeed, pictureBlocked, reduceSymbol, shapesText, slotText, stageGeometry, stageLayout } from "./collectives_model.js";

/** Heights in pixels of a bar of blocks and of the curves between the bars (views/collectives.py uses the same). */
const BAR_H = 14;
const LINKS_H = 64;
/** Heat-map colours: viridis at five stops (readable on light and dark backgrounds). */
const HEAT_STOPS = [
  [68, 1, 84],
  [59, 82, 139],
  [33, 145, 140],
  [94, 201, 98],
  [253, 231, 37],
];

/**
 * @typedef {import("./collectives_model.js").Heat} Heat
 * @typedef {import("./collectives_model.js").Tile} Tile
 * @typedef {import("./collectives_model.js").Iteration} Iteration
 * @typedef {import("./collectives_model.js").Slot} Slot
 * @typedef {import("./collectives_model.js").Picture} Picture
 */

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
export function drawStage(card, it, pic, ctx) {
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
 * A card's head: what the call was (op, the value it moves, shapes, axes, groups), how often it
 * ran, and whether it was recorded.
 * @param {any} card
 */
export function drawHead(card) {
  return h(
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
}

/** @param {any} card */
function groupsChip(card) {
  const groups = card.groups || [];
  if (!groups.length) return null;
  const sizes = new Set(groups.map((/** @type {number[]} */ g) => g.length));
  const text = groups.length === 1 ? `1 group of ${groups[0].length}` : sizes.size === 1 ? `${groups.length} groups of ${groups[0].length}` : `${groups.length} groups`;
  return h("span", { class: "jpm-sub", title: groups.slice(0, 16).map((/** @type {number[]} */ g) => `{${formatIds(g, 6)}}`).join(" "), text });
}
