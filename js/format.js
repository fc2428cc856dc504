// @ts-check
/**
 * Small helpers shared by the views: number/shape/spec formatting, and a DOM builder
 * that only ever writes data through `textContent`, `setAttribute` and `style`
 * (never `innerHTML`), so a hostile axis or variable name shows up as literal text.
 *
 * `jaxpar_magic/views/base.py` mirrors the formatting functions for the static HTML.
 */

const SVG_NS = "http://www.w3.org/2000/svg";

/**
 * @typedef {string | number | Node | null | undefined | false} Child
 * @typedef {{[key: string]: any}} Props
 */

/**
 * @param {Element} node
 * @param {Props} props  `class`, `text`, `style` (object of CSS properties), `data`
 *   (dataset entries), `on` (event listeners); anything else becomes an attribute.
 * @param {Child[]} children
 */
function fill(node, props, children) {
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.setAttribute("class", String(value));
    else if (key === "text") node.textContent = String(value);
    else if (key === "style") {
      for (const [prop, v] of Object.entries(value)) {
        if (v !== null && v !== undefined) /** @type {HTMLElement} */ (node).style.setProperty(prop, String(v));
      }
    } else if (key === "data") {
      for (const [k, v] of Object.entries(value)) node.setAttribute(`data-${k}`, String(v));
    } else if (key === "on") {
      for (const [ev, fn] of Object.entries(value)) node.addEventListener(ev, fn);
    } else node.setAttribute(key, String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    node.append(typeof child === "object" ? child : document.createTextNode(String(child)));
  }
  return node;
}

/**
 * Create an HTML element.
 * @param {string} tag
 * @param {Props} [props]
 * @param {...Child} children
 * @returns {HTMLElement}
 */
export function h(tag, props = {}, ...children) {
  return /** @type {HTMLElement} */ (fill(document.createElement(tag), props, children));
}

/**
 * Create an SVG element (through `createElementNS`).
 * @param {string} tag
 * @param {Props} [props]
 * @param {...Child} children
 * @returns {SVGElement}
 */
export function svg(tag, props = {}, ...children) {
  return /** @type {SVGElement} */ (fill(document.createElementNS(SVG_NS, tag), props, children));
}

/**
 * Bytes in binary units: `20 B`, `1.5 KiB`, `152.6 MiB`.
 * @param {number | null | undefined} n
 */
export function formatBytes(n) {
  if (n === null || n === undefined || !Number.isFinite(n)) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let v = Math.abs(n);
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  const sign = n < 0 ? "-" : "";
  return i === 0 ? `${sign}${v} B` : `${sign}${v.toFixed(1)} ${units[i]}`;
}

/**
 * A count with an SI prefix: `950`, `1.23 k`, `4.50 G`.
 * @param {number | null | undefined} n
 */
export function formatSI(n) {
  if (n === null || n === undefined || !Number.isFinite(n)) return "?";
  const prefixes = ["", " k", " M", " G", " T", " P", " E"];
  let v = Math.abs(n);
  let i = 0;
  while (v >= 1000 && i < prefixes.length - 1) {
    v /= 1000;
    i += 1;
  }
  const sign = n < 0 ? "-" : "";
  return i === 0 ? `${sign}${Math.round(v * 100) / 100}` : `${sign}${v.toFixed(2)}${prefixes[i]}`;
}

/**
 * Milliseconds, 3 significant digits: `12.3 ms`, `0.402 ms`, `1.25 s`.
 * @param {number | null | undefined} ms
 */
export function formatMs(ms) {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return "?";
  if (ms >= 1000) return `${(ms / 1000).toPrecision(3)} s`;
  return `${ms.toPrecision(3)} ms`;
}

/**
 * Seconds with a unit, 3 significant digits: `850 µs`, `1.33 ms`, `2.50 s`.
 * @param {number | null | undefined} s
 */
export function formatSeconds(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return "?";
  const a = Math.abs(s);
  if (a === 0) return "0 s";
  if (a < 1e-6) return `${(s * 1e9).toPrecision(3)} ns`;
  if (a < 1e-3) return `${(s * 1e6).toPrecision(3)} µs`;
  if (a < 1) return `${(s * 1e3).toPrecision(3)} ms`;
  return `${s.toPrecision(3)} s`;
}

/**
 * `float32[500, 10000]`; a scalar is `float32[]`.
 * @param {string} dtype
 * @param {number[]} shape
 */
export function formatShape(dtype, shape) {
  return `${dtype}[${(shape || []).join(", ")}]`;
}

/**
 * A PartitionSpec written as Python would: `P('data', None)`, `P(('a', 'b'), None)`.
 * @param {(string | string[] | null)[]} spec
 */
export function formatSpec(spec) {
  /** @param {string} a */
  const q = (a) => `'${a}'`;
  const parts = (spec || []).map((e) =>
    e === null || e === undefined ? "None" : Array.isArray(e) ? (e.length === 1 ? `(${q(e[0])},)` : `(${e.map(q).join(", ")})`) : q(e),
  );
  return `P(${parts.join(", ")})`;
}

/**
 * Index slices: `[0:500, 0:10000]`.
 * @param {number[][]} index pairs `[start, stop]`
 */
export function formatSlices(index) {
  return `[${(index || []).map(([a, b]) => `${a}:${b}`).join(", ")}]`;
}

/**
 * Device ids, runs compressed: `0–7`, `0,2,4`, `0–3,8–11`; past `limit` pieces an ellipsis
 * and the total count: `0,2,4,…(+13)`.
 * @param {number[]} ids
 * @param {number} [limit]
 */
export function formatIds(ids, limit = 6) {
  /** @type {string[]} */
  const pieces = [];
  let covered = 0;
  let i = 0;
  while (i < ids.length) {
    let j = i;
    while (j + 1 < ids.length && ids[j + 1] === ids[j] + 1) j += 1;
    if (pieces.length === limit) break;
    pieces.push(j - i >= 2 ? `${ids[i]}–${ids[j]}` : ids.slice(i, j + 1).join(","));
    covered = j + 1;
    i = j + 1;
  }
  const rest = ids.length - covered;
  return rest > 0 ? `${pieces.join(",")},…(+${rest})` : pieces.join(",");
}

/**
 * Coordinates with axis names: `data=1, model=0`.
 * @param {{name: string}[]} axes
 * @param {number[]} coords
 */
export function formatCoords(axes, coords) {
  return (coords || []).map((c, k) => `${axes[k] ? axes[k].name : k}=${c}`).join(", ");
}

/**
 * Row-major coordinates of flat position `flat` in a grid of `sizes`.
 * @param {number} flat
 * @param {number[]} sizes
 */
export function unravel(flat, sizes) {
  const out = new Array(sizes.length).fill(0);
  let rest = flat;
  for (let k = sizes.length - 1; k >= 0; k--) {
    out[k] = rest % sizes[k];
    rest = Math.floor(rest / sizes[k]);
  }
  return out;
}

/**
 * Product of sizes (1 for none).
 * @param {number[]} sizes
 */
export function product(sizes) {
  return (sizes || []).reduce((a, b) => a * b, 1);
}

/**
 * A detail line that hover/click/focus on any element with `data-detail` fills in.
 * Uses event delegation: one listener set on `root`, none per cell.
 * @param {HTMLElement} root  the container to watch
 * @param {string} hint  text shown when nothing is inspected
 * @returns {{line: HTMLElement, dispose: () => void}}
 */
export function detailLine(root, hint) {
  const line = h("div", { class: "jpm-detail", "aria-live": "polite", text: hint });
  let pinned = /** @type {Element | null} */ (null);
  /** @param {Event} ev */
  const find = (ev) => /** @type {Element | null} */ (ev.target instanceof Element ? ev.target.closest("[data-detail]") : null);
  /** @param {Element | null} target */
  const show = (target) => {
    line.textContent = target ? target.getAttribute("data-detail") || hint : pinned ? pinned.getAttribute("data-detail") || hint : hint;
  };
  /** @param {Event} ev */
  const over = (ev) => show(find(ev));
  const leave = () => show(null);
  /** @param {Event} ev */
  const click = (ev) => {
    const t = find(ev);
    if (pinned) pinned.classList.remove("jpm-pinned");
    pinned = t && t !== pinned ? t : null;
    if (pinned) pinned.classList.add("jpm-pinned");
    show(pinned);
  };
  root.addEventListener("mouseover", over);
  root.addEventListener("focusin", over);
  root.addEventListener("mouseleave", leave);
  root.addEventListener("click", click);
  return {
    line,
    dispose() {
      root.removeEventListener("mouseover", over);
      root.removeEventListener("focusin", over);
      root.removeEventListener("mouseleave", leave);
      root.removeEventListener("click", click);
    },
  };
}

/**
 * Wire a view: render now, re-render on `change:state`, and return the cleanup.
 * @param {{get: (k: string) => any, on: Function, off: Function}} model
 * @param {HTMLElement} el
 * @param {(state: any) => {node: HTMLElement, dispose?: () => void}} draw
 * @returns {() => void}
 */
export function mount(model, el, draw) {
  /** @type {(() => void) | undefined} */
  let dispose;
  const redraw = () => {
    if (dispose) dispose();
    // The kernel syncs the state as one JSON string (compact in a saved notebook; views/base.py).
    const raw = model.get("state");
    const state = (typeof raw === "string" ? JSON.parse(raw) : raw) || {};
    let out;
    try {
      out = draw(state);
    } catch (err) {
      // A state this version cannot draw: say so instead of leaving an empty cell.
      out = { node: h("div", { class: "jpm-view jpm-error", text: `jaxpar_magic: cannot draw this view (${err})` }) };
    }
    el.replaceChildren(out.node);
    dispose = out.dispose;
  };
  redraw();
  model.on("change:state", redraw);
  return () => {
    model.off("change:state", redraw);
    if (dispose) dispose();
    el.replaceChildren();
  };
}

/**
 * Keep hiding a view's static twin when the kernel redraws it: views whose twin is updated after the
 * cell (views/explorer.py: the tried layouts; views/later.py: a result view's values) have it drawn
 * anew in a new output box, which js/loader.js, which hid the first one, has not seen. Watches only
 * this cell's outputs.
 * @param {HTMLElement} el
 * @param {string} twin
 * @returns {() => void} stops watching
 */
export function keepTwinHidden(el, twin) {
  if (!/^[0-9a-f]+$/.test(twin) || typeof MutationObserver === "undefined") return () => {};
  let frame = 0;
  /** @type {MutationObserver | null} */
  let watch = null;
  const look = () => {
    if (!el.isConnected) return void (frame = requestAnimationFrame(look));
    const area = el.closest(".jp-OutputArea, .output_area, .output");
    if (!area) return;
    watch = new MutationObserver(() => {
      for (const node of area.querySelectorAll(`.jpm-twin-${twin}`)) {
        const box = node.closest(".jp-OutputArea-child");
        const hidden = /** @type {HTMLElement} */ (box?.contains(el) ? node : box || node);
        if (hidden.style.display !== "none") hidden.style.display = "none";
      }
    });
    watch.observe(area, { childList: true, subtree: true });
  };
  look();
  return () => (cancelAnimationFrame(frame), watch?.disconnect());
}
