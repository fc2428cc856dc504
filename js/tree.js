// @ts-check
/**
 * TreeView: a pytree's array leaves as one table, one row per distinct layout (shape, dtype,
 * sharding) with how many leaves share it and a few of their paths. Hover a row to see its
 * picture (the sharding view's own drawing, from `./sharding.js`); click it, or press Enter on
 * it, to keep that picture; arrow keys move between rows.
 *
 * The state comes from `tree_summary.tree_state` in Python; `views/tree.py` writes the same
 * table as static HTML and text.
 */
import { h, formatBytes, formatShape, mount } from "./format.js";
import { draw } from "./sharding.js";

/**
 * @typedef {{shape: number[], dtype: string, kind: string, spec: string, where: string, bytes: number,
 *   device_bytes: number | null, count: number, paths: string[], more_paths: number, picture: number | null}} Row
 */

/**
 * @param {number} n
 * @param {string} one
 * @param {string} [many]
 */
function plural(n, one, many) {
  return `${n} ${n === 1 ? one : many || `${one}s`}`;
}

/**
 * `121 array leaves in 3 layouts`; the twin of `summary` in views/tree.py.
 * @param {any} state
 */
export function summary(state) {
  return `${plural(Number(state.arrays || 0), "array leaf", "array leaves")} in ${plural(Number(state.layouts || 0), "layout")}`;
}

/**
 * `P('data', None) · split dim 0 8× over data`, or the words alone.
 * @param {Row} row
 */
export function layoutText(row) {
  return row.spec ? `${row.spec} · ${row.where}` : String(row.where || "");
}

/**
 * The paths a row lists, then how many it leaves out.
 * @param {string[]} paths
 * @param {number} more
 */
export function pathsText(paths, more) {
  const listed = (paths || []).join(", ");
  return more ? `${listed}, … and ${more} more` : listed;
}

/**
 * The line about static (non-array) leaves, or null when there are none.
 * @param {any} state
 */
export function staticText(state) {
  const stat = state.static || {};
  if (!stat.count) return null;
  const parts = (stat.groups || []).map((/** @type {any} */ g) => `${g.kind} ×${g.count} (${pathsText(g.paths, g.more_paths)})`);
  if (stat.groups_omitted) parts.push(`${stat.groups_omitted} more kinds`);
  return `static leaves (not arrays, not shipped): ${stat.count} · ${parts.join(" · ")}`;
}

/**
 * The line about layouts the state did not list, or null.
 * @param {any} state
 */
export function omittedText(state) {
  const left = state.rows_omitted || {};
  if (!left.layouts) return null;
  return `… ${plural(left.layouts, "more layout")} (${plural(left.leaves, "leaf", "leaves")}) not listed`;
}

/** @param {number | null | undefined} n */
const deviceBytes = (n) => (n === null || n === undefined ? "—" : formatBytes(n));

/** @param {any} state */
export function drawTree(state) {
  /** @type {Row[]} */
  const rows = state.rows || [];
  const pictures = state.pictures || [];
  const root = h("div", { class: "jpm-view jpm-tree" });
  root.append(
    h(
      "div",
      { class: "jpm-head" },
      h("span", { class: "jpm-title" }, h("code", { text: state.name || "tree" })),
      h("span", { class: "jpm-chip" }, h("b", { text: String(state.type || "") })),
      h("span", { class: "jpm-chip", text: summary(state) }),
      h("span", { class: "jpm-chip" }, "all leaves ", h("b", { text: formatBytes(state.bytes) })),
      state.device_bytes !== null && state.device_bytes !== undefined ? h("span", { class: "jpm-chip", title: "what the most loaded device holds of this tree" }, "per device ", h("b", { text: formatBytes(state.device_bytes) })) : null,
      state.abstract ? h("span", { class: "jpm-badge jpm-warn", text: "abstract", title: "ShapeDtypeStructs: shapes and layouts, no data" }) : null,
      state.process_count > 1 ? h("span", { class: "jpm-badge", text: `${state.process_count} processes` }) : null,
    ),
  );

  const pane = h("div", { class: "jpm-section jpm-tree-picture" });
  /** @type {(() => void) | undefined} */
  let disposePicture;
  let pinned = rows.length ? 0 : -1;
  let shown = -2;
  /** @type {HTMLElement[]} */
  const trs = [];
  /** @param {number} k */
  const showRow = (k) => {
    if (k === shown) return;
    shown = k;
    if (disposePicture) disposePicture();
    disposePicture = undefined;
    trs.forEach((tr, i) => tr.classList.toggle("jpm-shown", i === k));
    const row = rows[k];
    if (!row) {
      pane.replaceChildren(h("div", { class: "jpm-note", text: rows.length ? "hover or click a row for its picture" : "" }));
      return;
    }
    const caption = h("div", { class: "jpm-note", text: `${row.count === 1 ? "" : `one of ${row.count} leaves: `}${row.paths[0] || ""}` });
    if (row.picture === null || row.picture === undefined || !pictures[row.picture]) {
      pane.replaceChildren(caption, h("div", { class: "jpm-note", text: "this layout's picture was not sent (the view carries a bounded number of pictures)" }));
      return;
    }
    const out = draw(pictures[row.picture]);
    disposePicture = out.dispose;
    pane.replaceChildren(caption, out.node);
  };
  /** @param {number} k */
  const pin = (k) => {
    pinned = k;
    trs.forEach((tr, i) => {
      tr.classList.toggle("jpm-pinned-row", i === k);
      tr.setAttribute("aria-selected", String(i === k));
    });
    showRow(k);
  };

  if (rows.length) {
    const body = h("tbody");
    rows.forEach((row, k) => {
      const paths = pathsText(row.paths, row.more_paths);
      const tr = h(
        "tr",
        { class: "jpm-tree-row", tabindex: "0", role: "option", data: { row: k } },
        h("td", { class: "jpm-num", text: row.count }),
        h("td", { class: "jpm-mono", text: formatShape(row.dtype, row.shape) }),
        h("td", { text: layoutText(row) }),
        h("td", { class: "jpm-num", text: deviceBytes(row.device_bytes) }),
        h("td", { class: "jpm-mono jpm-paths", text: paths, title: paths }),
      );
      trs.push(tr);
      body.append(tr);
    });
    const table = h(
      "table",
      { class: "jpm-table jpm-tree-table", role: "listbox", "aria-label": "leaves by layout" },
      h("thead", {}, h("tr", {}, ...["leaves", "shape", "layout", "per device", "paths"].map((t) => h("th", { text: t })))),
      body,
    );
    /** @param {Event} ev */
    const rowOf = (ev) => {
      const tr = ev.target instanceof Element ? ev.target.closest("tr.jpm-tree-row") : null;
      return tr ? trs.indexOf(/** @type {HTMLElement} */ (tr)) : -1;
    };
    table.addEventListener("mouseover", (ev) => {
      const k = rowOf(ev);
      if (k >= 0) showRow(k);
    });
    table.addEventListener("mouseleave", () => showRow(pinned));
    table.addEventListener("click", (ev) => {
      const k = rowOf(ev);
      if (k >= 0) pin(k);
    });
    table.addEventListener("keydown", (ev) => {
      const k = rowOf(ev);
      if (k < 0) return;
      if (ev.key === "Enter" || ev.key === " ") {
        ev.preventDefault();
        pin(k);
      } else if (ev.key === "ArrowDown" || ev.key === "ArrowUp") {
        ev.preventDefault();
        const next = Math.max(0, Math.min(trs.length - 1, k + (ev.key === "ArrowDown" ? 1 : -1)));
        trs[next].focus();
      }
    });
    table.addEventListener("focusin", (ev) => {
      const k = rowOf(ev);
      if (k >= 0) showRow(k);
    });
    table.addEventListener("focusout", () => showRow(pinned));
    root.append(h("div", { class: "jpm-section jpm-tree-rows" }, table));
  } else root.append(h("div", { class: "jpm-note", text: "no array leaves" }));
  for (const line of [omittedText(state), staticText(state)]) if (line) root.append(h("div", { class: "jpm-note", text: line }));
  root.append(pane);
  if (rows.length) pin(0);
  else showRow(-1);
  return {
    node: root,
    dispose() {
      if (disposePicture) disposePicture();
    },
  };
}

export default {
  /** @param {{model: any, el: HTMLElement}} ctx */
  render({ model, el }) {
    return mount(model, el, drawTree);
  },
};
