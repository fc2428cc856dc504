"""What every view shares: the widget base class and the ES-module bundler (the helpers the static
HTML and text renderings use live in views/formats.py and are re-exported here).

How the views' shared JS helpers are loaded
-------------------------------------------
anywidget imports ``_esm`` from a ``blob:`` URL (``URL.createObjectURL(new Blob([esm]))``),
and a relative ``import ... from "./palette.js"`` cannot resolve against a blob URL. So the
sources in ``js/`` stay plain ES modules (they import each other and run as they are in a
browser, which the browser tests check), and :func:`bundle_esm` inlines the helpers when a
view class is created: each ``import { a, b } from "./helper.js";`` line of a view becomes
``const { a, b } = __jpm_helper;``, where ``__jpm_helper`` is the helper module's source
wrapped in a function that returns its exports. One source of truth, no build step. The
bundler accepts only that import form and ``export function|const|class NAME`` in helpers and
raises :class:`ValueError` on anything else, so a new construct fails loudly in the tests.

A view may also import from another view (``js/tree.js`` draws its pictures with
``js/sharding.js``'s ``draw``): a module inlined that way has its own imports inlined first,
once per bundle, and its ``export default`` (its widget entry point) is kept private.

How a notebook stores the views' code once
------------------------------------------
anywidget syncs ``_esm`` and ``_css`` as traits of every widget model, and a notebook saved with
its widget state (nbclient, JupyterLab's "save widget state") keeps every model's traits: 36
views meant 36 copies of a 20-45 KB bundle and of the 17.7 KB stylesheet. Measured on the
collectives chapter, that was 1.1 MB of its 2.4 MB. anywidget imports an ``http(s)://`` ``_esm``
by URL (the browser would then share one module), but the kernel cannot know the URL a
front end reaches its server under, and exported pages, VS Code and Colab have no such server.
What every widget manager does have is ``model.widget_manager.get_model(id)``, which anywidget
passes to ``render``. So one model-only widget per kernel, :class:`ViewLibrary`, holds the
stylesheet and the code pieces once (each helper once, each view kind's body once, added when
that kind is first shown); every view's ``_esm`` is the same small ``js/loader.js``, which looks
the library up by the id in the view's ``_jpm_lib`` trait, injects the stylesheet once per page,
and imports the view's module assembled from its pieces (byte for byte what :func:`bundle_esm`
builds), once per page.

The static form
---------------
In a kernel a view is two outputs (:meth:`ViewBase._ipython_display_`): first its static picture
(``text/html``, every style inline: views/inline.py) with its ``text/plain``, then the widget
alone. The widget, once drawn, hides its static twin (js/loader.js finds it by the twin's class).
So wherever the widget cannot be drawn (an untrusted notebook, a notebook saved without widget
state, which shows ipywidgets' "Error displaying widget: model not found" in the widget's place,
an exported page offline, a viewer without widgets) the static picture stays, and a terminal
front end (``jupyter console``) prints the text once. Terminal IPython and plain Python get one
output with both forms.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import re
import threading
import uuid
from collections.abc import Callable
from typing import Any, ClassVar

import anywidget
import ipywidgets
import traitlets

from ..cell.bounded_cache import BoundedCache
from .assets import assets, read_asset  # noqa: F401  (the views import them from here)
from .formats import (  # noqa: F401  (the views import them from here)
    esc,
    style_block,
    format_bytes,
    to_fixed,
    format_si,
    to_precision,
    format_seconds,
    format_ms,
    format_shape,
    op_words,
    format_spec,
    format_slices,
    format_ids,
    format_coords,
    unravel,
    product,
    png_data_uri,
    chip,
    swatch_style,
)
from .textwidth import in_kernel as _in_kernel  # a name of its own: tests pretend to be in a kernel

_IMPORT_RE = re.compile(r'^import\s*\{([^}]*)\}\s*from\s*"\./([A-Za-z_][\w-]*)\.js";[ \t]*$', re.M)
_ANY_IMPORT_RE = re.compile(r"^\s*import\b", re.M)
_EXPORT_RE = re.compile(r"^export\s+(function|const|class)\s+([A-Za-z_$][\w$]*)", re.M)
_ANY_EXPORT_RE = re.compile(r"^\s*export\b", re.M)
_NAME_RE = re.compile(r"^[A-Za-z_$][\w$]*$")


_DEFAULT_EXPORT_RE = re.compile(r"^export\s+default\s+", re.M)


def _inline_imports(name: str, src: str, helpers: dict[str, tuple[str, set[str]]], loading: tuple[str, ...]) -> str:
    """`src` with each ``import { a } from "./dep.js";`` replaced by ``const { a } = __jpm_dep;``;
    every dep's wrapped source is added to `helpers`, after the deps it imports itself."""

    def replace(match: re.Match[str]) -> str:
        names = [n.strip() for n in match.group(1).split(",") if n.strip()]
        dep = match.group(2)
        if dep in loading:
            raise ValueError(f"js/{name}: importing ./{dep}.js makes a cycle ({' -> '.join(loading + (dep,))})")
        if dep not in helpers:
            helpers[dep] = _helper_module(dep, helpers, loading + (dep,))
        for n in names:
            if not _NAME_RE.match(n):
                raise ValueError(f"js/{name}: unsupported import specifier {n!r} from ./{dep}.js")
            if n not in helpers[dep][1]:
                raise ValueError(f"js/{name}: ./{dep}.js does not export {n!r}")
        return f"const {{ {', '.join(names)} }} = __jpm_{dep};"

    body = _IMPORT_RE.sub(replace, src)
    if _ANY_IMPORT_RE.search(body):
        raise ValueError(f'js/{name}: only `import {{ a, b }} from "./helper.js";` is supported')
    return body


def _helper_module(name: str, helpers: dict[str, tuple[str, set[str]]], loading: tuple[str, ...]) -> tuple[str, set[str]]:
    """A helper's source as ``const __jpm_NAME = (() => {...})();`` and its exported names."""
    src = _without_comments(_inline_imports(f"{name}.js", read_asset(f"{name}.js"), helpers, loading))
    exports = [m.group(2) for m in _EXPORT_RE.finditer(src)]
    body = _EXPORT_RE.sub(lambda m: m.group(1) + " " + m.group(2), src)
    body = _DEFAULT_EXPORT_RE.sub("const __jpm_default = ", body)  # a view's entry point, unused here
    if _ANY_EXPORT_RE.search(body):
        raise ValueError(f"js/{name}.js: only `export function|const|class NAME` is supported")
    wrapped = (
        f"const __jpm_{name} = (() => {{\n// ---- js/{name}.js ----\n{body}\n"
        f"return {{ {', '.join(exports)} }};\n}})();\n"
    )
    return wrapped, set(exports)


def _without_comments(src: str) -> str:
    """``src`` without its ``/* */`` blocks and whole-line ``//`` comments and indentation: every
    notebook stores the views' code (js/ has no string or multi-line template that holds either,
    which the browser tests of the bundles would show), a third smaller this way."""
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    lines = (line.strip() for line in src.splitlines())
    return "\n".join(line for line in lines if line and not line.startswith("//")) + "\n"


# Every view model's ``_esm``: the same small module, whatever the view.
_LOADER = _without_comments(read_asset("loader.js"))


class Bundle(str):
    """A view's self-contained ES module (the string), and the pieces it was built from.

    ``view`` is the view's name (``"results"`` for ``js/results.js``), ``helpers`` the wrapped helper
    modules it needs, in order, and ``body`` the view's own source with its imports rewritten. The
    string is ``header + "".join(helpers.values()) + body``; js/loader.js rebuilds it from the same
    pieces.
    """

    view: str
    helpers: dict[str, str]
    body: str

    def __new__(cls, view: str, helpers: dict[str, str], body: str) -> Bundle:
        header = f"// jaxpar_magic: js/{view}.js with its helpers inlined by views/base.py\n"
        out = super().__new__(cls, header + "".join(helpers.values()) + body)
        out.view, out.helpers, out.body = view, helpers, body
        return out


def bundle_esm(view: str) -> Bundle:
    """One self-contained ES module for ``js/<view>``, helpers inlined (see module docstring)."""
    helpers: dict[str, tuple[str, set[str]]] = {}
    body = _without_comments(_inline_imports(view, read_asset(view), helpers, (view.removesuffix(".js"),)))
    return Bundle(view.removesuffix(".js"), {name: code for name, (code, _) in helpers.items()}, body)


class ViewLibrary(ipywidgets.Widget):
    """The views' stylesheet and code, once per kernel: a model-only widget (no view of its own)
    that every view's loader reads through the widget manager (see module docstring).

    ``code`` maps a piece's name to its source: ``"helper:format"`` for a wrapped helper,
    ``"view:results"`` for a view's body. ``needs`` maps a view to the helpers its body uses, in
    order. Pieces are added when a view kind is first shown, and never change afterwards.
    """

    css = traitlets.Unicode("").tag(sync=True)
    code = traitlets.Dict().tag(sync=True)
    needs = traitlets.Dict().tag(sync=True)

    def add(self, bundle: Bundle) -> None:
        if bundle.view in self.needs:
            return
        code = dict(self.code)
        code.update({f"helper:{name}": src for name, src in bundle.helpers.items()})
        code[f"view:{bundle.view}"] = bundle.body
        # Assign new dicts: traitlets syncs a trait on assignment, not on mutation.
        self.code = code
        self.needs = {**self.needs, bundle.view: list(bundle.helpers)}


#: Twin classes (`jpm-twin-<16 hex>`): a random prefix per kernel process and a counter, unique in a
#: notebook however many kernels wrote into it (uuid4 per view cost more than the rest of its id).
_TWIN_PREFIX = uuid.uuid4().hex[:10]
_twins = itertools.count()
#: Widget model ids (32 hex digits, as the uuid4 hex ipywidgets' comm would draw): a random half per
#: kernel process and a counter. A uuid4 per view reads the OS's random source, 240 µs a shown cell
#: on the TPU host (bench section 15's breakdown, 2026-12-06); its ids are unique all the same.
_MODEL_PREFIX = uuid.uuid4().hex[:16]
_models = itertools.count()


def new_model_id() -> str:
    return f"{_MODEL_PREFIX}{next(_models):016x}"

_library: ViewLibrary | None = None
_layout: ipywidgets.Layout | None = None


def library() -> ViewLibrary:
    """This kernel's :class:`ViewLibrary`, made on first use (and again if it was closed)."""
    global _library
    if _library is None or _library.comm is None:
        _library = ViewLibrary(css=read_asset("views.css"))
    return _library


def shared_layout() -> ipywidgets.Layout:
    """One ``Layout`` model for every view: each DOMWidget otherwise makes its own, another 40
    traits per view in a saved notebook, and ours never set one (ipywidgets lets widgets share
    a Layout)."""
    global _layout
    if _layout is None or _layout.comm is None:
        _layout = ipywidgets.Layout()
    return _layout


def state_json(state: dict[str, Any]) -> str:
    """A view's state as the front end receives it: one compact JSON string. Saved notebooks
    write widget state indented, one line per list item; a string is one line (the collectives
    chapter's view states weighed 660 KB as dicts, 340 KB as strings). NaN and infinities, which
    JSON cannot carry, become null, as jupyter_client's own fallback makes them."""
    try:
        return _ENCODER.encode(state)
    except ValueError:
        return _ENCODER.encode(_finite(state))


# One encoder: json.dumps with options builds a JSONEncoder per call (a few µs of every view shown).
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def state_from_json(value: Any) -> dict[str, Any]:
    return json.loads(value) if isinstance(value, str) else dict(value or {})


class ViewBase(anywidget.AnyWidget):
    """A view: one synced ``state`` dict, drawn by an ES module in the notebook, and the same
    state rendered as static HTML (exported notebooks) and text (terminal IPython).

    Subclasses set ``_esm = bundle_esm("<view>.js")`` and the two static renderers. The bundle is
    kept as ``_bundle``; what the model ships as ``_esm`` is js/loader.js, which takes the
    bundle's pieces from this kernel's :class:`ViewLibrary` (see module docstring).
    """

    state = traitlets.Dict().tag(
        sync=True, to_json=lambda value, view: state_json(view.wire_state(value)),
        from_json=lambda value, _: state_from_json(value),
    )
    _jpm_view = traitlets.Unicode("").tag(sync=True)
    _jpm_lib = traitlets.Unicode("").tag(sync=True)
    #: The class (``jpm-twin-<this>``) of this view's static twin, which the drawn widget hides.
    _jpm_twin = traitlets.Unicode("").tag(sync=True)
    _css = ""  # the stylesheet comes from the library, once per page
    _bundle: ClassVar[Bundle]
    #: The display id the static twin was shown under, where it is rewritten later (a result view
    #: whose values come after the cell: views/later.py); None: shown without one.
    static_display_id: str | None = None
    #: Whether the static forms are a function of the state alone, drawn once for equal states
    #: (_static_forms): a result view's state before its values come is the same every re-run.
    _static_by_content: ClassVar[bool] = False

    _render_html: ClassVar[Callable[[dict[str, Any]], str]]
    _render_text: ClassVar[Callable[[dict[str, Any]], str]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        esm = cls.__dict__.get("_esm")
        if isinstance(esm, Bundle):
            cls._bundle = esm
            cls._esm = _LOADER
        super().__init_subclass__(**kwargs)

    def __new__(cls, *args: Any, **kwargs: Any) -> ViewBase:
        return super().__new__(_synced_class(cls), *args, **kwargs)

    @traitlets.default("keys")
    def _default_keys(self) -> list[str]:
        """The synced traits, read once per class (ipywidgets scans every trait of every instance)."""
        return list(_synced_keys(type(self)))

    # Defaults, not constructor arguments: a trait set in __init__ goes through ipywidgets' change
    # handling, one a default gives does not (~5 µs each, a view per shown cell: bench section 15).
    @traitlets.default("layout")
    def _default_layout(self) -> ipywidgets.Layout:
        return shared_layout()

    @traitlets.default("_jpm_lib")
    def _default_lib(self) -> str:
        return f"IPY_MODEL_{library().model_id}"

    @traitlets.default("_jpm_twin")
    def _default_twin(self) -> str:
        return f"{_TWIN_PREFIX}{next(_twins):06x}"  # unique in this kernel; the prefix differs per kernel

    def __init__(self, state: dict[str, Any] | None = None, **kwargs: Any) -> None:
        library().add(type(self)._bundle)
        _colab_widgets()
        # ipywidgets' own __init__, not AnyWidget's: that one adds anywidget's traits to every
        # instance (`add_traits` builds a new class each time, ~0.5 ms a view); _synced_class has
        # them once per view class, with the same names and values.
        kwargs.setdefault("model_id", new_model_id())
        ipywidgets.DOMWidget.__init__(self, state=dict(state or {}), **kwargs)

    def get_state(self, key: Any = None, drop_defaults: bool = False) -> dict[str, Any]:
        """ipywidgets' Widget.get_state, each trait's writer (its ``to_json``) read once per class
        (_state_writers) where ipywidgets looks up every trait again for every state it sends: at
        open and at each change of ``state`` (~20 µs a result view, bench section 15).
        tests/test_views_static.py holds it equal to ipywidgets' own."""
        if drop_defaults:
            return super().get_state(key, drop_defaults)
        writers = _state_writers(type(self))
        keys = self.keys if key is None else (key,) if isinstance(key, str) else key
        try:
            return {k: writers[k](getattr(self, k), self) for k in keys}
        except (KeyError, TypeError):  # not a trait of this class, or no key: ipywidgets' own error
            return super().get_state(key, drop_defaults)

    def wire_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """The state as the front end gets it (and a saved notebook stores it): by default all of
        it; a view leaves out what its ES module never reads."""
        return state

    def to_html(self) -> str:
        """Static HTML for the current state (no script, every string escaped, every style inline)."""
        from .inline import inline_styles

        return inline_styles(type(self)._render_html(self.state))

    def to_text(self, width: int | None = None) -> str:
        """Plain-text rendering of the current state, fitted to ``width`` columns (the terminal's,
        80 in a notebook's text/plain)."""
        from .textwidth import fit_text, text_width

        return fit_text(type(self)._render_text(self.state), width or text_width())

    def _widget_bundle(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The widget's own output (its model id), made once per view: a view shown again reuses it."""
        made = self.__dict__.get("_jpm_widget_bundle")
        if made is not None and made[0] == self.model_id:
            return made[1]
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        data, metadata = bundle
        made = ({WIDGET_MIME: data[WIDGET_MIME]}, metadata)
        self.__dict__["_jpm_widget_bundle"] = (self.model_id, made)
        return made

    def static_bundle(self) -> dict[str, str]:
        """The static twin: the picture, marked with this widget's twin class, and the text. Drawn
        once per state (a view shown again, or its text for repr, reuses it)."""
        state = self.state
        drawn = self.__dict__.get("_jpm_drawn")
        if drawn is not None and drawn[0] is state:
            return drawn[1]
        html, text = _static_forms(self) if self._static_by_content else (self.to_html(), self.to_text())
        bundle = {"text/html": f'<div class="jpm-static jpm-twin-{self._jpm_twin}">{html}</div>', "text/plain": text}
        self.__dict__["_jpm_drawn"] = (state, bundle)
        return bundle

    def display_parts(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """What displaying this view publishes, as ``(data, metadata)`` outputs: in a kernel the
        static twin, then the widget alone; elsewhere (a terminal prints ``text/plain``) one
        output with every form."""
        widget = self._widget_bundle()
        if widget is None:
            return [(self.static_bundle(), {})]
        if not _in_kernel():
            return [({**widget[0], **self.static_bundle()}, widget[1])]
        return [(self.static_bundle(), {}), widget]

    def _ipython_display_(self, **kwargs: Any) -> None:
        from IPython.display import display

        for index, (data, metadata) in enumerate(self.display_parts()):
            if index == 0 and self.static_display_id is not None:
                display(data, metadata=metadata, raw=True, display_id=self.static_display_id)
            else:
                display(data, metadata=metadata, raw=True)

    def update_static(self) -> None:
        """Rewrite the static twin shown under `static_display_id` with the current state."""
        from IPython.display import update_display

        if self.static_display_id is not None:
            update_display(self.static_bundle(), display_id=self.static_display_id, raw=True)

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """One bundle with every form (for callers that format a view themselves; IPython's display
        calls :meth:`_ipython_display_` instead)."""
        bundle = self._widget_bundle(**kwargs)
        if bundle is None:
            return None
        data, metadata = bundle
        return {**data, **self.static_bundle()}, metadata

    def __repr__(self) -> str:
        return self.static_bundle()["text/plain"]


DRAWN = 32  # states kept
DRAWN_MOST_JSON = 16_384  # larger states are drawn anew (their JSON is not worth keeping)
_drawn = BoundedCache(DRAWN)  # (view class, text width, state as JSON) -> (html, text)
_drawn_lock = threading.Lock()  # the values thread draws filled views (views/later.py)


def _static_forms(view: ViewBase) -> tuple[str, str]:
    """(to_html, to_text) of a `_static_by_content` view, drawn once per equal state and width."""
    from .textwidth import text_width

    encoded = state_json(view.state)
    if len(encoded) > DRAWN_MOST_JSON:
        return view.to_html(), view.to_text()
    key = (type(view), text_width(), encoded)
    with _drawn_lock:
        forms = _drawn.get(key)
        if forms is not None:
            _drawn.move_to_end(key)
            return forms
    forms = (view.to_html(), view.to_text())  # drawn outside the lock: the other thread may draw meanwhile
    with _drawn_lock:
        _drawn.put(key, forms)
    return forms


WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
#: The traits anywidget's front end reads from every model, beside ipywidgets' own: its module
#: (`_esm`), its stylesheet (`_css`) and the widget class's name (`_anywidget_id`), as
#: `anywidget.AnyWidget.__init__` adds them (tests/test_views_static.py compares with a real AnyWidget).
ANYWIDGET_TRAITS = ("_esm", "_css", "_anywidget_id")


@functools.cache
def _synced_class(cls: type) -> type:
    """`cls` with anywidget's per-model traits as class traits, made once per view class: what every
    instance of `cls` is (its name and everything else stay `cls`'s)."""
    if cls.__dict__.get("_jpm_synced"):
        return cls
    values = {"_esm": cls._esm, "_css": cls._css, "_anywidget_id": f"{cls.__module__}.{cls.__name__}"}
    body: dict[str, Any] = {key: traitlets.Unicode(str(values[key])).tag(sync=True) for key in ANYWIDGET_TRAITS}
    body["_jpm_view"] = traitlets.Unicode(cls._bundle.view).tag(sync=True)  # which view module draws it
    body.update(__module__=cls.__module__, __qualname__=cls.__qualname__, _jpm_synced=True)
    return type(cls.__name__, (cls,), body)


@functools.cache
def _synced_keys(cls: type) -> tuple[str, ...]:
    return tuple(cls.class_traits(sync=True))


@functools.cache
def _state_writers(cls: type) -> dict[str, Callable[[Any, Any], Any]]:
    """Each trait's ``to_json``, as ipywidgets' ``trait_metadata(name, 'to_json', _trait_to_json)``
    finds it (a class's ``_NAME_metadata`` dict first, then the trait's metadata)."""
    writers = {}
    for name, trait in cls.class_traits().items():
        own = getattr(cls, f"_{name}_metadata", None)
        metadata = own if isinstance(own, dict) and "to_json" in own else trait.metadata
        writers[name] = metadata.get("to_json", cls._trait_to_json)
    return writers


@functools.cache
def _colab_widgets() -> None:
    """In Google Colab, its custom widget manager, once (what anywidget does for every widget there)."""
    import sys

    output = sys.modules.get("google.colab.output")
    if output is not None:
        output.enable_custom_widget_manager()


# ---------------------------------------------------------------------------------------------
# Static rendering helpers (twins of js/format.js).
