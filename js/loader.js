// @ts-check
/**
 * Every jaxpar_magic view's `_esm`: the same small module for all views, so a saved notebook
 * holds each view's code once (in the kernel's ViewLibrary model) instead of once per view.
 *
 * The view model names its kind (`_jpm_view`) and the library model (`_jpm_lib`,
 * "IPY_MODEL_<id>"). The library holds the stylesheet (`css`), the code pieces (`code`:
 * "helper:<name>" and "view:<name>") and which helpers each view needs (`needs`). The view's
 * module is those pieces joined, exactly as views/base.py's bundle_esm joins them, imported
 * once per page from a Blob URL (as anywidget imports any `_esm`); the stylesheet goes into
 * one <style> where the view's root is: the page's head, or the shadow root a host such as
 * marimo mounts the view in (styles in the head do not reach inside a shadow root).
 *
 * In a kernel each view is shown twice: its static picture, then this widget (views/base.py). Once
 * the widget has drawn and is in the page, it hides the static twin (the element of class
 * `jpm-twin-<_jpm_twin>`, and the output box around it when the front end has one); where the
 * widget cannot draw, the twin stays.
 */

const STYLE_ID = "jpm-views-css";

/** Modules already loaded on this page, by library id and view (one promise each). */
const loaded = /** @type {Map<string, Promise<any>>} */ (
  /** @type {any} */ (globalThis).__jpmViewModules ??= new Map()
);

/**
 * @param {string} css
 * @param {Node} where the view's element: its root node gets the stylesheet
 */
function useStylesheet(css, where) {
  const root = where.getRootNode();
  const shadow = typeof ShadowRoot !== "undefined" && root instanceof ShadowRoot;
  const scope = shadow ? /** @type {ShadowRoot} */ (root) : document;
  let style = scope.querySelector(`#${STYLE_ID}`);
  if (!style) {
    style = document.createElement("style");
    style.id = STYLE_ID;
    (shadow ? root : document.head).append(style);
  }
  if (style.textContent !== css) style.textContent = css;
}

/**
 * Hide the static twin of a drawn view (and the output box that holds only it) once the view's
 * element is in the page: a widget manager renders a view before it attaches the element to the
 * output area (ipywidgets' create_view, then the output renderer), so until then the twin is
 * looked for again on the next animation frames.
 * @param {HTMLElement} el
 * @param {string} twin
 * @returns {() => void} stops looking
 */
function hideTwin(el, twin) {
  let frame = 0;
  const look = () => {
    if (!el.isConnected) return void (frame = requestAnimationFrame(look));
    for (const node of /** @type {Document | ShadowRoot} */ (el.getRootNode()).querySelectorAll(`.jpm-twin-${twin}`)) {
      const box = node.closest(".jp-OutputArea-child");
      /** @type {HTMLElement} */ (box?.contains(el) ? node : box || node).style.display = "none";
    }
  };
  if (/^[0-9a-f]+$/.test(twin)) look();
  return () => cancelAnimationFrame(frame);
}

/**
 * @param {{get: (k: string) => any}} lib
 * @param {string} view
 */
async function importView(lib, view) {
  const needs = (lib.get("needs") || {})[view];
  const code = lib.get("code") || {};
  if (!needs || !(`view:${view}` in code)) throw new Error(`the view library has no code for "${view}"`);
  const source = [...needs.map((/** @type {string} */ n) => code[`helper:${n}`]), code[`view:${view}`]].join("");
  const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
  try {
    return await import(/* webpackIgnore: true */ url);
  } finally {
    URL.revokeObjectURL(url);
  }
}

/** @param {{get: (k: string) => any, widget_manager: {get_model: (id: string) => Promise<any>}}} model */
function viewModule(model) {
  const view = String(model.get("_jpm_view") || "");
  const id = String(model.get("_jpm_lib") || "").replace(/^IPY_MODEL_/, "");
  const key = `${id}/${view}`;
  let found = loaded.get(key);
  if (!found) {
    found = model.widget_manager.get_model(id).then(async (lib) => ({ css: lib.get("css") || "", mod: await importView(lib, view) }));
    // A failure is not kept: the next view tries again (the library may arrive later).
    found.catch(() => loaded.delete(key));
    loaded.set(key, found);
  }
  return found;
}

export default {
  /** @param {{model: any, el: HTMLElement}} ctx */
  async render(ctx) {
    let found;
    try {
      found = await viewModule(ctx.model);
    } catch (err) {
      const note = document.createElement("div");
      note.className = "jpm-view jpm-error";
      note.textContent = `jaxpar_magic: this view's code is not available here (${err}); run the cell again to redraw it`;
      ctx.el.replaceChildren(note);
      return () => ctx.el.replaceChildren();
    }
    useStylesheet(found.css, ctx.el);
    const cleanup = found.mod.default.render(ctx);
    const stop = hideTwin(ctx.el, String(ctx.model.get("_jpm_twin") || ""));
    return () => (stop(), cleanup?.());
  },
};
