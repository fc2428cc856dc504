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
 * one <style> in the page's head.
 */

const STYLE_ID = "jpm-views-css";

/** Modules already loaded on this page, by library id and view (one promise each). */
const loaded = /** @type {Map<string, Promise<any>>} */ (
  /** @type {any} */ (globalThis).__jpmViewModules ??= new Map()
);

/** @param {string} css */
function useStylesheet(css) {
  let style = document.getElementById(STYLE_ID);
  if (!style) {
    style = document.createElement("style");
    style.id = STYLE_ID;
    document.head.append(style);
  }
  if (style.textContent !== css) style.textContent = css;
}

/**
 * @param {{get: (k: string) => any}} lib
 * @param {string} view
 */
async function importView(lib, view) {
  const needs = (lib.get("needs") || {})[view];
  const code = lib.get("code") || {};
  if (!needs || !(`view:${view}` in code)) throw new Error(`the view library has no code for "${view}"`);
  useStylesheet(lib.get("css") || "");
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
    found = model.widget_manager.get_model(id).then((lib) => importView(lib, view));
    // A failure is not kept: the next view tries again (the library may arrive later).
    found.catch(() => loaded.delete(key));
    loaded.set(key, found);
  }
  return found;
}

export default {
  /** @param {{model: any, el: HTMLElement}} ctx */
  async render(ctx) {
    let mod;
    try {
      mod = await viewModule(ctx.model);
    } catch (err) {
      const note = document.createElement("div");
      note.className = "jpm-view jpm-error";
      note.textContent = `jaxpar_magic: this view's code is not available here (${err}); run the cell again to redraw it`;
      ctx.el.replaceChildren(note);
      return () => ctx.el.replaceChildren();
    }
    return mod.default.render(ctx);
  },
};
