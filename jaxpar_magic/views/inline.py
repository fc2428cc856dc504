"""Static HTML that keeps its looks wherever a notebook is opened: every style inline.

Why inline
----------
An untrusted notebook (one executed by nbclient, ``nbconvert --execute``, a colleague) renders
``text/html`` through JupyterLab's sanitizer: ``<style>`` and ``<svg>`` elements are removed and
only the ``style`` attribute survives, with a fixed list of CSS properties and values
(``@jupyterlab/apputils``' ``sanitizer.ts``, the ``allowedStyles`` table). That list has
``display`` (block, inline-block, table, table-cell, flex, grid), box sizes in px and %, margins,
paddings, borders, colours as hex, ``rgb()``, ``rgba()`` and names, fonts, ``opacity``,
``white-space``, ``overflow``, ``box-shadow`` and ``linear-gradient`` backgrounds. It has no
``gap``, no ``flex-wrap``, no ``grid-template-*``, no ``var()``, no ``calc()`` and no
``position: sticky``; ``data-*`` attributes are dropped, ``class`` and ``title`` kept, and an
``<img>`` may carry a ``data:`` URI.

So the static form is laid out with what survives: rows of ``inline-block`` boxes that wrap like
words, ``display: table`` for side by side, ``<table>``s for grids, and pictures as ``<img>``s of
SVG or PNG data. Its styles live in ``js/static.css``, written as CSS and applied here to every
element (by tag and class, with descendant selectors), so a view's renderer writes classes as the
live view does. Colours that must follow the theme are left to inherit (text) or are translucent
greys that read on light and dark backgrounds alike; ``tests/test_static_css.py`` checks every
declaration against the sanitizer's rules, and the JupyterLab tests open untrusted notebooks.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

from .assets import read_asset

_TAG_RE = re.compile(r"<(/?)([a-zA-Z][a-zA-Z0-9]*)((?:\s+[a-zA-Z_:][-a-zA-Z0-9_:.]*(?:=\"[^\"]*\")?)*)\s*(/?)>")
_ATTR_RE = re.compile(r'\s+([a-zA-Z_:][-a-zA-Z0-9_:.]*)(?:="([^"]*)")?')
_VOID = {"img", "br", "hr", "input", "col", "wbr"}
#: Inherited properties: a declaration a parent already gives its children is left out (a static
#: view's size is its styles). Only on tags a notebook's own stylesheet leaves alone: JupyterLab
#: and nbconvert style pre, code, table cells and images directly, and inheritance loses to that.
_INHERITED = {"color", "font-family", "font-size", "font-weight", "line-height", "text-align", "white-space",
              "letter-spacing", "text-transform", "font-style", "overflow-wrap", "word-break", "cursor"}
_BARE = {"div", "span", "i", "b"}
#: Inherited properties JupyterLab's own stylesheet sets on these tags (``.jp-RenderedHTMLCommon td``
#: and the like): below such a tag, what an ancestor of ours gave is no longer what a child inherits.
_RESET_BY_NOTEBOOK = {
    "table": {"color", "font-size"},
    "tr": {"line-height", "white-space", "text-align"},
    "td": {"line-height", "white-space", "text-align"},
    "th": {"line-height", "white-space", "text-align", "font-weight"},
    "pre": {"color", "font-family", "font-size", "line-height", "white-space", "word-break", "overflow-wrap"},
    "code": {"color", "font-family", "font-size", "line-height", "white-space", "overflow-wrap"},
}
_COMPOUND_RE = re.compile(r"^([a-z][a-z0-9]*)?((?:\.[-a-zA-Z0-9_]+)*)$")


class Compound(NamedTuple):
    tag: str | None
    classes: frozenset[str]

    def matches(self, tag: str, classes: frozenset[str]) -> bool:
        return (self.tag is None or self.tag == tag) and self.classes <= classes


class Rule(NamedTuple):
    parts: tuple[Compound, ...]  # ancestors first, the element itself last (descendant combinator)
    specificity: tuple[int, int]
    order: int
    declarations: tuple[tuple[str, str], ...]


def _compound(text: str) -> Compound:
    found = _COMPOUND_RE.match(text)
    if not found or not text:
        raise ValueError(f"js/static.css: unsupported selector part {text!r} (only tag, .class and tag.class)")
    classes = frozenset(c for c in found.group(2).split(".") if c)
    return Compound(found.group(1), classes)


def parse_rules(css: str) -> list[Rule]:
    """The rules of ``css``: ``selector, selector { property: value; ... }``, comments allowed,
    selectors made of ``tag``, ``.class`` and ``tag.class`` parts joined by spaces."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    rules: list[Rule] = []
    for order, (selectors, body) in enumerate(re.findall(r"([^{}]+)\{([^{}]*)\}", css)):
        declarations = []
        for item in body.split(";"):
            if item.strip():
                name, _, value = item.partition(":")
                declarations.append((name.strip(), " ".join(value.split())))
        for selector in selectors.split(","):
            parts = tuple(_compound(p) for p in selector.split())
            if not parts:
                continue
            specificity = (sum(len(p.classes) for p in parts), sum(p.tag is not None for p in parts))
            rules.append(Rule(parts, specificity, order, tuple(declarations)))
    return rules


@functools.cache
def static_rules() -> tuple[dict[str, list[Rule]], dict[str, list[Rule]]]:
    """js/static.css, indexed by the last part's first class (or its tag when it has none)."""
    by_class: dict[str, list[Rule]] = {}
    by_tag: dict[str, list[Rule]] = {}
    for rule in parse_rules(read_asset("static.css")):
        last = rule.parts[-1]
        if last.classes:
            by_class.setdefault(min(last.classes), []).append(rule)
        else:
            by_tag.setdefault(str(last.tag), []).append(rule)
    return by_class, by_tag


def _matches(rule: Rule, tag: str, classes: frozenset[str], ancestors: list[tuple[str, frozenset[str]]]) -> bool:
    if not rule.parts[-1].matches(tag, classes):
        return False
    k = len(ancestors) - 1
    for part in reversed(rule.parts[:-1]):
        while k >= 0 and not part.matches(*ancestors[k]):
            k -= 1
        if k < 0:
            return False
        k -= 1
    return True


class _Context(NamedTuple):
    """An open element and what it passes on: its ancestors' (tag, classes), innermost last, and
    the inherited declarations its children get. Interned (`_context`): the same chain of tags and
    classes is one context, whatever the markup."""

    tag: str
    ancestors: tuple[tuple[str, frozenset[str]], ...]
    inherited: dict[str, str]


_CONTEXTS: list[_Context] = [_Context("", (), {})]  # by id; 0 is the top level
_CONTEXT_IDS: dict[tuple, int] = {}
#: (an opening tag's text, the id of the context it opens in) -> (its text with the styles inline, the
#: id of the context it opens, or None for a void element). Our renderers write the same few dozen
#: tags in the same few chains, so a view's static HTML is mostly look-ups (bench section 15).
_RESTYLED: dict[tuple[str, int], tuple[str, int | None]] = {}
_RESTYLED_MOST = 50_000


def _context(parent: int, tag: str, classes: frozenset[str], merged: dict[str, str]) -> int:
    key = (parent, tag, classes)
    found = _CONTEXT_IDS.get(key)
    if found is None:
        outer = _CONTEXTS[parent]
        passed = {k: v for k, v in outer.inherited.items() if k not in _RESET_BY_NOTEBOOK.get(tag, ())}
        inherited = {**passed, **{k: v for k, v in merged.items() if k in _INHERITED}}
        _CONTEXTS.append(_Context(tag, outer.ancestors + ((tag, classes),), inherited))
        found = _CONTEXT_IDS[key] = len(_CONTEXTS) - 1
    return found


def _restyle(found: re.Match[str], where: int) -> tuple[str, int | None]:
    """One opening tag with js/static.css applied, in the context `where`."""
    by_class, by_tag = static_rules()
    tag, attrs, selfclose = found.group(2).lower(), found.group(3), found.group(4)
    context = _CONTEXTS[where]
    ancestors = list(context.ancestors)
    pairs = [(m.group(1), m.group(2)) for m in _ATTR_RE.finditer(attrs)]
    values = dict(pairs)
    classes = frozenset((values.get("class") or "").split())
    candidates = list(by_tag.get(tag, ()))
    for c in classes:
        candidates += by_class.get(c, ())
    chosen = sorted((r for r in candidates if _matches(r, tag, classes, ancestors)),
                    key=lambda r: (r.specificity, r.order))
    merged: dict[str, str] = {}
    for rule in chosen:
        for name, value in rule.declarations:
            merged.pop(name, None)  # re-inserted last: the later rule wins, in order
            merged[name] = value
    parent = context.inherited
    opened = None
    if tag not in _VOID and not selfclose:
        opened = _context(where, tag, classes, merged)
    if tag in _BARE:
        merged = {k: v for k, v in merged.items() if k not in _INHERITED or parent.get(k) != v}
    if not merged and not values.get("style") and not any(k.startswith("data-") for k in values):
        return found.group(0), opened
    style = ";".join(f"{k}:{v}" for k, v in merged.items()).replace('"', "&quot;")
    if values.get("style"):
        style = f"{style};{values['style']}" if style else values["style"]
    # data-* attributes go too: a sanitizer drops them, and only a live view reads them.
    rest = "".join(f' {k}="{v}"' if v is not None else f" {k}" for k, v in pairs
                   if k != "style" and not k.startswith("data-"))
    return f'<{found.group(2)}{rest} style="{style}"{" /" if selfclose else ""}>', opened


def inline_styles(markup: str) -> str:
    """``markup`` (a view's static HTML, written by our renderers: attributes double-quoted and
    escaped) with js/static.css applied to every element as its ``style`` attribute. A style the
    renderer wrote itself comes last, so it wins (a device's colour, a computed width).

    Each opening tag is restyled once per context it appears in (`_RESTYLED`); safe to call from
    several threads (a view's values are filled in by a background thread: views/later.py)."""
    if len(_RESTYLED) > _RESTYLED_MOST:
        _RESTYLED.clear()
    open_ids = [0]

    def restyle(found: re.Match[str]) -> str:
        text = found.group(0)
        if found.group(1):  # a closing tag closes the innermost element of its name, and any left open inside it
            tag = found.group(2).lower()
            while len(open_ids) > 1:
                if _CONTEXTS[open_ids.pop()].tag == tag:
                    break
            return text
        key = (text, open_ids[-1])
        done = _RESTYLED.get(key)
        if done is None:
            done = _RESTYLED[key] = _restyle(found, open_ids[-1])
        if done[1] is not None:
            open_ids.append(done[1])
        return done[0]

    return _TAG_RE.sub(restyle, markup)
