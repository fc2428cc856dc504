// @ts-check
/**
 * ExplorerView: try layouts of a planned cell live (`%%shard --plan --explore`).
 *
 * Draws the explorer's state (views/explorer.py): per input and per dimension, one toggle per
 * mesh axis (which axes cut that dimension); the mesh's shape over the same devices and its axis
 * types; the target, where the cell gave one; the current plan's figures (peak against the
 * device's memory, the largest buffers, the collectives, the estimate and what bounds it); the
 * difference from the previous layout; the kernel's status while it plans; the one-line message
 * for a wrong choice; and the ranked table of tried layouts, each with its `%%shard` line, a copy
 * button, and a click that goes back to it. Every change is a message to the kernel
 * (`model.send`); the kernel answers with a new state. Data only ever goes in through
 * `textContent` and attributes (format.js's `h`).
 */
import { h, formatBytes, formatSeconds, formatShape, formatSpec, detailLine, mount, keepTwinHidden } from "./format.js";

/** Rows of each list drawn (the kernel sends at most this many). */
const MAX_ROWS = 64;

/**
 * `P('data', None)` from the state's spec form, one list of mesh axes per dimension.
 * @param {string[][]} spec
 */
export function specText(spec) {
  return formatSpec((spec || []).map((axes) => (!axes || !axes.length ? null : axes.length === 1 ? axes[0] : axes)));
}

/**
 * The spec with `axis` toggled on dimension `dim`: removed where it cuts that dimension, else
 * added after the axes already there (the order a `P(('data', 'model'), ...)` entry lists them).
 * @param {string[][]} spec
 * @param {number} dim
 * @param {string} axis
 * @returns {string[][]}
 */
export function toggled(spec, dim, axis) {
  return (spec || []).map((axes, d) => {
    const now = [...(axes || [])];
    if (d !== dim) return now;
    return now.includes(axis) ? now.filter((a) => a !== axis) : [...now, axis];
  });
}

/**
 * The mesh in the `--mesh` syntax: `data=8,model=8`.
 * @param {any} mesh
 */
export function meshText(mesh) {
  return ((mesh && mesh.axes) || []).map((/** @type {[string, number]} */ [name, size]) => `${name}=${size}`).join(",");
}

/**
 * Does the product of `axes`' sizes divide `length`? (A hint on the toggle; the kernel decides.)
 * @param {number} length
 * @param {string[]} axes
 * @param {Map<string, number>} sizes
 */
function divides(length, axes, sizes) {
  const n = axes.reduce((p, a) => p * (sizes.get(a) || 1), 1);
  return n > 0 && length % n === 0;
}

/**
 * One row per input: its name, shape, current spec, and per dimension a toggle per mesh axis.
 * @param {any} state
 * @param {(msg: any) => void} send
 */
function inputsSection(state, send) {
  const axes = ((state.mesh && state.mesh.axes) || []).map((/** @type {[string, number]} */ [name]) => name);
  const sizes = new Map(((state.mesh && state.mesh.axes) || []).map((/** @type {[string, number]} */ [n, s]) => [n, s]));
  const sec = h("div", { class: "jpm-section jpm-ex-inputs" }, h("div", { class: "jpm-h", text: "How each input is cut (click an axis)" }));
  const table = h("table", { class: "jpm-table jpm-ex-table" });
  const body = h("tbody");
  let group = /** @type {string | null} */ (null);
  for (const [i, inp] of (state.inputs || []).slice(0, MAX_ROWS).entries()) {
    if (inp.group && inp.group !== inp.name && inp.group !== group) {
      body.append(h("tr", { class: "jpm-ex-group" }, h("td", { colspan: 3, class: "jpm-mono", text: inp.group })));
    }
    group = inp.group || null;
    const dims = h("td", { class: "jpm-ex-dims" });
    const spec = inp.spec || (inp.shape || []).map(() => []);
    for (const [d, length] of (inp.shape || []).entries()) {
      const cut = spec[d] || [];
      const cell = h("span", { class: "jpm-ex-dim", data: { dim: d } }, h("span", { class: "jpm-sub jpm-mono", text: `dim ${d} (${length})` }));
      for (const axis of axes) {
        const on = cut.includes(axis);
        const next = toggled(spec, d, axis);
        const fine = divides(length, next[d], sizes);
        const detail = `${inp.name}: ${on ? "stop cutting" : "cut"} dim ${d} (${length}) ${on ? "by" : "over"} ${axis} -> ${specText(next)}${fine ? "" : ` (${axis} does not divide ${length} evenly here)`}`;
        cell.append(
          h("button", {
            type: "button",
            class: fine ? "jpm-btn jpm-ex-axis" : "jpm-btn jpm-ex-axis jpm-ex-nodiv",
            "aria-pressed": on ? "true" : "false",
            title: detail,
            text: axis,
            data: { detail, focus: `axis:${i}:${d}:${axis}`, input: inp.name, axis },
            on: { click: () => send({ kind: "choose", name: inp.name, spec: next }) },
          }),
        );
      }
      dims.append(cell);
    }
    if (!(inp.shape || []).length) dims.append(h("span", { class: "jpm-sub", text: "a scalar: nothing to cut" }));
    body.append(
      h(
        "tr",
        { class: "jpm-ex-input", data: { name: inp.name } },
        h(
          "td",
          {},
          h("span", { class: "jpm-out-name", text: inp.name }),
          h("div", { class: "jpm-sub jpm-mono", text: formatShape(inp.dtype, inp.shape) }),
          // A group of leaves of one shape and layout is one row: a toggle changes them all.
          (inp.count || 1) > 1 ? h("div", { class: "jpm-sub jpm-ex-count", text: `and ${inp.count - 1} more leaves like it` }) : null,
        ),
        h("td", { class: "jpm-spec jpm-ex-spec", text: specText(spec) }),
        dims,
      ),
    );
  }
  table.append(body);
  sec.append(h("div", { class: "jpm-scroll" }, table));
  return sec;
}

/**
 * A labelled `<select>` that sends `make(value)` when changed.
 * @param {string} label
 * @param {string} cls
 * @param {string[]} options
 * @param {string | null} current
 * @param {(value: string | null) => any} make
 * @param {(msg: any) => void} send
 */
function picker(label, cls, options, current, make, send) {
  const select = /** @type {HTMLSelectElement} */ (h("select", { class: `jpm-ex-select ${cls}`, "aria-label": label, data: { focus: cls } }));
  // No current value (a target without a topology): say "none" rather than show the first option as chosen.
  const all = current === null ? ["", ...options] : options.includes(current) ? options : [current, ...options];
  for (const o of all) {
    const opt = /** @type {HTMLOptionElement} */ (h("option", { value: o, text: o === "" ? "none" : o }));
    if (o === (current ?? "")) opt.selected = true;
    select.append(opt);
  }
  select.addEventListener("change", () => send(make(select.value === "" ? null : select.value)));
  return h("label", { class: "jpm-ex-pick" }, h("span", { class: "jpm-sub", text: label }), select);
}

const AXIS_TYPES = ["Explicit", "Auto"];

/**
 * The mesh (shape picker, axis types) and the target, where the cell gave one.
 * @param {any} state
 * @param {(msg: any) => void} send
 */
function controlsSection(state, send) {
  const mesh = state.mesh || {};
  const now = meshText(mesh);
  const types = mesh.types || [];
  const row = h("div", { class: "jpm-controls jpm-ex-controls" });
  row.append(picker(`mesh over ${mesh.devices ?? "?"} devices`, "jpm-ex-shape", mesh.shapes || [], now, (v) => ({ kind: "reshape", mesh: v }), send));
  // One type for every axis, as `--axis-types` sets it; a mixed mesh shows its types as they are.
  const same = types.length && types.every((/** @type {string} */ t) => t === types[0]) ? types[0] : null;
  if (same) row.append(picker("axis types", "jpm-ex-types", AXIS_TYPES, same, (v) => ({ kind: "reshape", mesh: now, axis_types: v.toLowerCase() }), send));
  else if (types.length) row.append(h("span", { class: "jpm-chip" }, "axis types ", h("b", { text: types.join(", ") })));
  const target = state.target;
  if (target) {
    const opts = target.options || {};
    const hw = target.hardware ?? null;
    const topo = target.topology ?? null;
    if (hw !== null || (opts.hardware || []).length) {
      row.append(picker("hardware", "jpm-ex-hardware", opts.hardware || [], hw, (v) => ({ kind: "retarget", hardware: v, topology: topo }), send));
    }
    if (topo !== null || (opts.topology || []).length) {
      row.append(picker("topology", "jpm-ex-topology", opts.topology || [], topo, (v) => ({ kind: "retarget", hardware: hw, topology: v }), send));
    }
  }
  return row;
}

/**
 * `fits: 3.2 GiB of 16.0 GiB`, or why it does not.
 * @param {any} plan
 */
export function fitText(plan) {
  const peak = formatBytes(plan.peak_bytes);
  const cap = plan.capacity_bytes;
  if (cap === null || cap === undefined) return `peak ${peak} per device; device memory unknown`;
  if (plan.fits === false) return `does not fit: peak ${peak} per device, ${formatBytes(plan.peak_bytes - cap)} over the ${formatBytes(cap)} of device memory`;
  return `fits: peak ${peak} per device of ${formatBytes(cap)} (${((100 * plan.peak_bytes) / Math.max(1, cap)).toFixed(0)}%)`;
}

/**
 * The current plan's figures.
 * @param {any} plan
 */
function planSection(plan) {
  const sec = h("div", { class: "jpm-section jpm-ex-plan" }, h("div", { class: "jpm-h", text: "This layout's plan" }));
  if (plan.summary) sec.append(h("div", { class: "jpm-ex-summary", text: plan.summary }));
  const cap = plan.capacity_bytes;
  const scale = Math.max(1, plan.peak_bytes || 0, cap || 0);
  const bar = h("div", { class: plan.fits === false ? "jpm-membar jpm-bad" : "jpm-membar", role: "img", "aria-label": fitText(plan) });
  bar.append(h("span", { class: "jpm-mem-temp", style: { left: "0%", width: `${(100 * Math.min(plan.peak_bytes || 0, cap ?? Infinity)) / scale}%` } }));
  if (cap !== null && cap !== undefined) {
    if (plan.fits === false) bar.append(h("span", { class: "jpm-mem-over", style: { left: `${(100 * cap) / scale}%`, width: `${(100 * (plan.peak_bytes - cap)) / scale}%` } }));
    bar.append(h("span", { class: "jpm-mem-cap", style: { left: `${(100 * cap) / scale}%` } }));
  }
  sec.append(bar, h("div", { class: plan.fits === false ? "jpm-fit jpm-bad jpm-ex-fit" : plan.fits === true ? "jpm-fit jpm-ok jpm-ex-fit" : "jpm-fit jpm-ex-fit", text: fitText(plan) }));
  const chips = h("div", { class: "jpm-chips jpm-ex-figures" });
  chips.append(h("span", { class: "jpm-chip jpm-ex-peak" }, "peak per device ", h("b", { text: formatBytes(plan.peak_bytes) })));
  const moved = (plan.collectives || []).reduce((/** @type {number} */ s, /** @type {any} */ c) => s + (c.bytes || 0) * (c.calls || 1), 0);
  chips.append(h("span", { class: "jpm-chip jpm-ex-moved" }, "moved per step ", h("b", { text: formatBytes(moved) })));
  if (plan.estimate_s !== null && plan.estimate_s !== undefined) {
    chips.append(h("span", { class: "jpm-chip jpm-ex-estimate" }, "estimate ", h("b", { text: formatSeconds(plan.estimate_s) }), plan.bound ? ` bound by ${plan.bound}` : ""));
  } else chips.append(h("span", { class: "jpm-chip jpm-zero jpm-ex-estimate", text: "no estimate (give --hardware)" }));
  if (plan.compiler) chips.append(h("span", { class: "jpm-chip" }, "from ", h("b", { text: plan.compiler })));
  sec.append(chips);
  // Bytes first, so a narrow page scrolls the long descriptions, never the figures, out of sight; the
  // source line, where the buffer's description does not already end with it.
  const largest = (plan.largest || []).map((/** @type {any} */ b) => [formatBytes(b.bytes), String(b.what), b.line && !String(b.what).includes(b.line) ? b.line : ""]);
  const where = largest.some((r) => r[2]);
  sec.append(listTable("Largest buffers", "jpm-ex-largest", where ? ["bytes", "what", "where"] : ["bytes", "what"], largest.map((r) => (where ? r : r.slice(0, 2))), "no buffers reported", 0));
  sec.append(
    listTable(
      "Collectives per step",
      "jpm-ex-collectives",
      ["kind", "bytes / device", "calls", "what"],
      (plan.collectives || []).map((/** @type {any} */ c) => [c.kind, formatBytes(c.bytes), String(c.calls ?? 1), c.what || ""]),
      "none: this layout moves no data between devices",
      1,
    ),
  );
  return sec;
}

/**
 * A small titled table of text cells (or a note when there are no rows).
 * @param {string} title
 * @param {string} cls
 * @param {string[]} head
 * @param {string[][]} rows
 * @param {string} empty
 * @param {number} num the column of figures (right-aligned)
 */
function listTable(title, cls, head, rows, empty, num) {
  const sec = h("div", { class: `jpm-ex-list ${cls}` }, h("div", { class: "jpm-sub", text: `${title} (${rows.length})` }));
  if (!rows.length) {
    sec.append(h("div", { class: "jpm-note", text: empty }));
    return sec;
  }
  const table = h("table", { class: "jpm-table" }, h("thead", {}, h("tr", {}, ...head.map((t) => h("th", { text: t })))));
  const body = h("tbody");
  for (const r of rows.slice(0, MAX_ROWS)) body.append(h("tr", {}, ...r.map((t, k) => h("td", { class: k === num ? "jpm-num" : k === r.length - 1 ? "jpm-mono" : "", text: t }))));
  table.append(body);
  sec.append(h("div", { class: "jpm-scroll" }, table));
  return sec;
}

/**
 * Put `text` on the clipboard; where the page may not (no secure context, permission refused),
 * select the line's text so Ctrl+C copies it. Says which in `note`.
 * @param {string} text
 * @param {HTMLElement} code
 * @param {HTMLElement} note
 */
export function copyLine(text, code, note) {
  const select = () => {
    const range = document.createRange();
    range.selectNodeContents(code);
    const sel = window.getSelection();
    if (sel) {
      sel.removeAllRanges();
      sel.addRange(range);
    }
    note.textContent = "selected: press Ctrl+C (⌘C) to copy";
  };
  const clip = navigator.clipboard;
  if (!clip || !clip.writeText) return select();
  clip.writeText(text).then(() => (note.textContent = "copied"), select);
}

/**
 * The tried layouts, ranked; a click on a row goes back to it, the button copies its line.
 * @param {any} state
 * @param {(msg: any) => void} send
 */
function triedSection(state, send) {
  const rows = (state.tried || []).slice(0, MAX_ROWS);
  const timed = rows.some((/** @type {any} */ r) => r.estimate_s !== null && r.estimate_s !== undefined);
  const sec = h("div", { class: "jpm-section jpm-ex-tried" }, h("div", { class: "jpm-h", text: `Tried layouts (${rows.length}): those that fit first, then by ${timed ? "estimate" : "peak"}; click one to go back to it` }));
  if (!rows.length) {
    sec.append(h("div", { class: "jpm-note", text: "none yet" }));
    return sec;
  }
  // The mesh with its axis types: two layouts that differ only in them look different.
  const head = ["#", "mesh", "line", "peak", "fits", "moved"].concat(timed ? ["estimate"] : [], [""]);
  const table = h("table", { class: "jpm-table" }, h("thead", {}, h("tr", {}, ...head.map((t) => h("th", { text: t })))));
  const body = h("tbody");
  for (const r of rows) {
    const code = h("code", { class: "jpm-mono jpm-ex-line", text: r.line });
    const note = h("span", { class: "jpm-sub jpm-ex-copied", "aria-live": "polite" });
    const copy = h("button", {
      type: "button",
      class: "jpm-btn jpm-ex-copy",
      title: "copy this line",
      text: "copy",
      on: {
        click: (/** @type {Event} */ ev) => {
          ev.stopPropagation(); // copying is not going back to the row
          copyLine(r.line, code, note);
        },
      },
    });
    const restore = () => {
      if (!r.current) send({ kind: "restore", line: r.line });
    };
    body.append(
      h(
        "tr",
        {
          class: r.current ? "jpm-ex-row jpm-ex-current" : "jpm-ex-row",
          tabindex: 0,
          "aria-current": r.current ? "true" : null,
          data: { focus: `row:${r.line}`, detail: r.line },
          on: {
            click: restore,
            keydown: (/** @type {KeyboardEvent} */ ev) => {
              if (ev.target === ev.currentTarget && (ev.key === "Enter" || ev.key === " ")) {
                ev.preventDefault();
                restore();
              }
            },
          },
        },
        h("td", { class: "jpm-num", text: r.rank }),
        h("td", { class: "jpm-mono jpm-ex-rowmesh", text: r.mesh || "" }),
        h("td", { class: "jpm-ex-linecell" }, code),
        h("td", { class: "jpm-num", text: formatBytes(r.peak_bytes) }),
        h("td", { class: r.fits === false ? "jpm-bad" : r.fits === true ? "jpm-ok" : "", text: r.fits === null || r.fits === undefined ? "?" : r.fits ? "yes" : "no" }),
        h("td", { class: "jpm-num", text: formatBytes(r.collective_bytes) }),
        timed ? h("td", { class: "jpm-num", text: formatSeconds(r.estimate_s) }) : null,
        h("td", {}, copy, note),
      ),
    );
  }
  table.append(body);
  sec.append(h("div", { class: "jpm-scroll" }, table));
  return sec;
}

/**
 * @param {any} state
 * @param {(msg: any) => void} [send]
 */
export function draw(state, send = () => {}) {
  // generation: +1 per new current plan; compiles: layouts compiled so far (tests wait on both).
  const root = h("div", { class: "jpm-view jpm-explorer", data: { generation: state.generation ?? 0, compiles: state.compiles ?? 0 } });
  const status = state.status || {};
  root.append(
    h(
      "div",
      { class: "jpm-head" },
      h("span", { class: "jpm-title", text: "layout explorer" }),
      h("span", { class: "jpm-chip" }, "mesh ", h("b", { class: "jpm-ex-mesh", text: meshText(state.mesh) || "?" })),
      h("span", { class: "jpm-badge", text: "planned, not run", title: "each layout is compiled for these devices; nothing is allocated or executed" }),
      h("span", { class: status.busy ? "jpm-ex-status jpm-ex-busy" : "jpm-ex-status", role: "status", "aria-live": "polite", text: status.text || "" }),
    ),
  );
  if (state.message) root.append(h("div", { class: "jpm-ex-message jpm-bad", role: "alert", text: state.message }));
  root.append(controlsSection(state, send));
  root.append(inputsSection(state, send));
  if (state.diff) root.append(h("div", { class: "jpm-ex-diff", text: `since the previous layout: ${state.diff}` }));
  if (state.plan) root.append(planSection(state.plan));
  else root.append(h("div", { class: "jpm-note jpm-ex-noplan", text: status.busy ? "planning the first layout…" : "no plan yet" }));
  root.append(triedSection(state, send));
  const detail = detailLine(root, "hover an axis toggle or a row for details");
  root.append(detail.line);
  return { node: root, dispose: detail.dispose };
}

/**
 * The key of the control that has the focus inside `el` (a redraw keeps it there).
 * @param {HTMLElement} el
 */
function focusedKey(el) {
  const active = document.activeElement;
  return active && el.contains(active) ? active.getAttribute("data-focus") : null;
}

export default {
  /** @param {{model: any, el: HTMLElement}} ctx */
  render({ model, el }) {
    /** @param {any} msg */
    const send = (msg) => model.send(msg);
    const stop = keepTwinHidden(el, String(model.get("_jpm_twin") || ""));
    const cleanup = mount(model, el, (state) => {
      const key = focusedKey(el);
      const out = draw(state, send);
      if (key) {
        // mount() swaps the new node in right after draw returns.
        queueMicrotask(() => {
          for (const n of el.querySelectorAll("[data-focus]")) if (n.getAttribute("data-focus") === key) return /** @type {HTMLElement} */ (n).focus();
        });
      }
      return out;
    });
    return () => (stop(), cleanup());
  },
};
