"""What every view shares: the widget base class, the ES-module bundler, and the helpers
the static (HTML and text) renderings use.

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
"""

from __future__ import annotations

import base64
import html
import importlib.resources
import re
import struct
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar

import anywidget
import traitlets

_IMPORT_RE = re.compile(r'^import\s*\{([^}]*)\}\s*from\s*"\./([A-Za-z_][\w-]*)\.js";[ \t]*$', re.M)
_ANY_IMPORT_RE = re.compile(r"^\s*import\b", re.M)
_EXPORT_RE = re.compile(r"^export\s+(function|const|class)\s+([A-Za-z_$][\w$]*)", re.M)
_ANY_EXPORT_RE = re.compile(r"^\s*export\b", re.M)
_NAME_RE = re.compile(r"^[A-Za-z_$][\w$]*$")


def assets():
    """The folder of the views' ES modules and stylesheet.

    An installed copy (wheel) carries them as the package ``jaxpar_magic.js``. A source checkout
    (``pip install -e .``, or ``python -m pytest`` from the repository root) has them in the
    top-level ``js/`` folder beside the package, which is where we look when that package is absent.
    """
    try:
        return importlib.resources.files("jaxpar_magic.js")
    except ModuleNotFoundError:
        pass
    checkout = importlib.resources.files("jaxpar_magic").parent / "js"
    if checkout.joinpath("views.css").is_file():
        return checkout
    raise ModuleNotFoundError(
        "jaxpar_magic's widget code is missing: neither the installed package data `jaxpar_magic.js` nor a "
        f"source checkout's js/ folder ({checkout}) was found. Reinstall the package (`pip install jaxpar_magic`, "
        "or `pip install -e .` in a checkout)."
    )


def read_asset(name: str) -> str:
    """Text of one file of the views' front end (``js/`` in the repository)."""
    return assets().joinpath(name).read_text(encoding="utf-8")


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
    src = _inline_imports(f"{name}.js", read_asset(f"{name}.js"), helpers, loading)
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


def bundle_esm(view: str) -> str:
    """One self-contained ES module for ``js/<view>``, helpers inlined (see module docstring)."""
    helpers: dict[str, tuple[str, set[str]]] = {}
    body = _inline_imports(view, read_asset(view), helpers, (view.removesuffix(".js"),))
    head = "".join(code for code, _ in helpers.values())
    return f"// jaxpar_magic: js/{view} with its helpers inlined by views/base.py\n{head}{body}"


class ViewBase(anywidget.AnyWidget):
    """A view: one synced ``state`` dict, drawn by an ES module in the notebook, and the same
    state rendered as static HTML (exported notebooks) and text (terminal IPython).

    Subclasses set ``_esm = bundle_esm("<view>.js")`` and the two static renderers.
    """

    state = traitlets.Dict().tag(sync=True)
    _css = read_asset("views.css")

    _render_html: ClassVar[Callable[[dict[str, Any]], str]]
    _render_text: ClassVar[Callable[[dict[str, Any]], str]]

    def __init__(self, state: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(state=dict(state or {}), **kwargs)

    def to_html(self) -> str:
        """Static HTML for the current state (no script, every string escaped)."""
        return type(self)._render_html(self.state)

    def to_text(self) -> str:
        """Plain-text rendering of the current state."""
        return type(self)._render_text(self.state)

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        data, metadata = bundle
        data = dict(data)
        data["text/html"] = self.to_html()
        data["text/plain"] = self.to_text()
        return data, metadata

    def __repr__(self) -> str:
        return self.to_text()


# ---------------------------------------------------------------------------------------------
# Static rendering helpers (twins of js/format.js).

esc = html.escape


def style_block() -> str:
    """The views' stylesheet as one ``<style>`` element; every rule is scoped by ``.jpm-``."""
    return f"<style>{read_asset('views.css')}</style>"


def format_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    v, i = abs(float(n)), 0
    while v >= 1024 and i < len(units) - 1:
        v /= 1024
        i += 1
    sign = "-" if n < 0 else ""
    return f"{sign}{int(v)} B" if i == 0 else f"{sign}{v:.1f} {units[i]}"


def format_si(n: float | None) -> str:
    if n is None:
        return "?"
    prefixes = ["", " k", " M", " G", " T", " P", " E"]
    v, i = abs(float(n)), 0
    while v >= 1000 and i < len(prefixes) - 1:
        v /= 1000
        i += 1
    sign = "-" if n < 0 else ""
    return f"{sign}{round(v, 2):g}" if i == 0 else f"{sign}{v:.2f}{prefixes[i]}"


def format_ms(ms: float | None) -> str:
    if ms is None:
        return "?"
    if ms >= 1000:
        return f"{ms / 1000:.3g} s"
    return f"{ms:.3g} ms"


def format_shape(dtype: str, shape: Sequence[int]) -> str:
    return f"{dtype}[{', '.join(str(s) for s in shape)}]"


def format_spec(spec: Sequence[Any]) -> str:
    def one(e: Any) -> str:
        if e is None:
            return "None"
        if isinstance(e, (list, tuple)):
            return f"('{e[0]}',)" if len(e) == 1 else "(" + ", ".join(f"'{a}'" for a in e) + ")"
        return f"'{e}'"

    return "P(" + ", ".join(one(e) for e in spec) + ")"


def format_slices(index: Sequence[Sequence[int]]) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in index) + "]"


def format_ids(ids: Sequence[int], limit: int = 6) -> str:
    pieces: list[str] = []
    covered = i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        if len(pieces) == limit:
            break
        pieces.append(f"{ids[i]}–{ids[j]}" if j - i >= 2 else ",".join(str(x) for x in ids[i : j + 1]))
        covered = i = j + 1
    rest = len(ids) - covered
    return f"{','.join(pieces)},…(+{rest})" if rest > 0 else ",".join(pieces)


def format_coords(axes: Sequence[dict[str, Any]], coords: Sequence[int]) -> str:
    return ", ".join(f"{axes[k]['name'] if k < len(axes) else k}={c}" for k, c in enumerate(coords))


def unravel(flat: int, sizes: Sequence[int]) -> list[int]:
    out = [0] * len(sizes)
    for k in range(len(sizes) - 1, -1, -1):
        out[k] = flat % sizes[k]
        flat //= sizes[k]
    return out


def product(sizes: Iterable[int]) -> int:
    out = 1
    for s in sizes:
        out *= int(s)
    return out


def png_data_uri(rows: Sequence[Sequence[tuple[int, int, int]]]) -> str:
    """A tiny RGB PNG (one pixel per cell) as a ``data:`` URI.

    The static HTML draws large grids (thousands of devices) this way, scaled up with
    ``image-rendering: pixelated``: a 64x64 grid costs a few hundred bytes instead of 4,096
    elements.
    """
    height = len(rows)
    width = len(rows[0]) if height else 0
    raw = b"".join(b"\x00" + bytes(c for px in row for c in px) for row in rows)

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return (
            struct.pack(">I", len(payload))
            + kind
            + payload
            + struct.pack(">I", zlib.crc32(kind + payload) & 0xFFFFFFFF)
        )

    png = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def chip(label: str, value: str | None = None, *, cls: str = "") -> str:
    """A small labelled pill, escaped."""
    extra = f" {cls}" if cls else ""
    if value is None:
        return f'<span class="jpm-chip{extra}">{esc(label)}</span>'
    return f'<span class="jpm-chip{extra}">{esc(label)} <b>{esc(value)}</b></span>'


def swatch_style(device_id: int) -> str:
    from .palette import device_color

    bg, fg = device_color(device_id)
    return f"background:{bg};color:{fg}"
