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
 * `movement_model` in views/collectives_model.py (the static picture is drawn from it too).
 *
 * This module is the widget: its render entry and each card's controls (the iteration toggle,
 * the step buttons, slider, play and keyboard) and the state they keep; js/collectives_draw.js
 * draws what they pick, from js/collectives_model.js.
 */
import { h, detailLine, mount } from "./format.js";
import { algorithmName, bytesNote, movementModel, movementSentence, stepsPhrase } from "./collectives_model.js";
import { drawHead, drawStage } from "./collectives_draw.js";

/** @typedef {import("./collectives_model.js").Iteration} Iteration */

/** Cards drawn (the engines send at most this many). */
const MAX_CARDS = 64;
/** Autoplay: one step per this many milliseconds. */
const PLAY_MS = 900;

/**
 * One card, with its own iteration toggle and step control.
 * @param {any} card
 * @param {{order: number[], procOf: (d: number) => number | null}} ctx
 * @returns {{node: HTMLElement, dispose: () => void}}
 */
function drawCard(card, ctx) {
  const el = h("div", { class: "jpm-ccard", data: { index: card.index ?? "", op: card.op } });
  el.append(drawHead(card));
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
 * A card as views/collectives.py's `wire_state` sent it, with its transfers back as objects (they
 * travel as `[src, src_block, dst, dst_block, reduce]`: a saved notebook stores every one).
 * @param {any} card
 */
export function unpackCard(card) {
  const mv = card.movement;
  if (!mv || !mv.packed) return card;
  const unpack = (/** @type {number[][]} */ ts) => (ts || []).map(([src, srcBlock, dst, dstBlock, reduce]) => ({ src, src_block: srcBlock, dst, dst_block: dstBlock, reduce: Boolean(reduce) }));
  return { ...card, movement: { ...mv, transfers: unpack(mv.transfers), steps: (mv.steps || []).map((/** @type {any} */ s) => ({ ...s, transfers: unpack(s.transfers) })) } };
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
  const cards = (state.cards || []).slice(0, MAX_CARDS).map(unpackCard);
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
