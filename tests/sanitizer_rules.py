"""JupyterLab's HTML sanitizer, the part that decides what an untrusted notebook's ``text/html`` keeps:
its tags, attributes and inline CSS properties with their allowed values.

Ported (the regular expressions rewritten in Python, for the properties our static views use) from
``packages/apputils/src/sanitizer.ts`` of JupyterLab 4 (class ``CssProp`` and the ``Sanitizer``'s
``allowedTags``, ``allowedAttributes`` and ``allowedStyles``). sanitize-html drops a declaration
whose property is not listed or whose value does not match, and an attribute or tag not listed.
The JupyterLab tests (tests/test_jupyterlab_static.py) check the real thing on untrusted notebooks.
"""

from __future__ import annotations

import re

_N = {
    "integer_zero_ff": r"([0-9]|[1-9][0-9]|1[0-9][0-9]|2[0-4][0-9]|25[0-5])",
    "number": r"[+-]?([0-9]*[.])?[0-9]+(e-?[0-9]*)?",
    "number_pos": r"[+]?([0-9]*[.])?[0-9]+(e-?[0-9]*)?",
    "number_zero_hundred": r"[+]?(([0-9]|[1-9][0-9])([.][0-9]+)?|100)",
    "number_zero_one": r"[+]?(1([.][0]+)?|0([.][0-9]+)?)",
}
_IDENT = r"-?([_a-z]|[\xA0-\xFF])([_a-z0-9-]|[\xA0-\xFF])*"
_STRING = r"(\"[^\n\r\f\\\"]*\")|('[^\n\r\f\\']*')"
_LEN_OR_PERC = rf"(0|{_N['number']}(px|em|rem|ex|in|cm|mm|pt|pc|%))"
_LENGTH = rf"({_N['number']}(px|em|rem|ex|in|cm|mm|pt|pc)|0)"
_LENGTH_POS = rf"({_N['number_pos']}(px|em|rem|ex|in|cm|mm|pt|pc)|0)"
_PERCENTAGE = rf"{_N['number']}%"
_PERCENTAGE_POS = rf"{_N['number_pos']}%"
_PERC_0_100 = rf"{_N['number_zero_hundred']}%"
_BORDER_STYLE = "none|hidden|dotted|dashed|solid|double|groove|ridge|inset|outset"
_GENERIC_FAMILY = "serif|sans-serif|cursive|fantasy|monospace"
_COLOR_NAMES = (
    "aliceblue|antiquewhite|aqua|black|blue|gray|green|lightgrey|navy|orange|red|silver|teal|transparent|white|yellow"
)
_ALPHA = rf"{_N['integer_zero_ff']}|{_N['number_zero_one']}|{_PERC_0_100}"
_COLOR = (
    r"\#(0x)?[0-9a-f]+"
    r"|rgb\(\s*(\d{1,3})\s*,\s*(\d{1,3})\s*,\s*(\d{1,3})\s*\)"
    rf"|rgba\(\s*(\d{{1,3}})\s*,\s*(\d{{1,3}})\s*,\s*(\d{{1,3}})\s*,\s*({_ALPHA})\s*\)"
    rf"|{_COLOR_NAMES}"
)
_BORDER_WIDTH = rf"thin|medium|thick|{_LENGTH}"
_BORDER = rf"(({_BORDER_WIDTH}|{_BORDER_STYLE}|{_COLOR})\s*){{1,3}}"
_MARGIN_WIDTH = rf"{_LEN_OR_PERC}|auto"
_PADDING_WIDTH = rf"{_LENGTH_POS}|{_PERCENTAGE_POS}"
_FAMILY = rf"{_STRING}|({_IDENT}\s*)+"
_FONT_FAMILY = rf"({_FAMILY}|{_GENERIC_FAMILY})(,\s*({_FAMILY}|{_GENERIC_FAMILY}))*"
_FONT_SIZE = rf"xx-small|x-small|small|medium|large|x-large|xx-large|smaller|larger|{_LENGTH_POS}|{_PERCENTAGE_POS}"
_LINE_HEIGHT = rf"normal|{_N['number_pos']}|{_LENGTH_POS}|{_PERCENTAGE_POS}"
_FONT_WEIGHT = "normal|bold|bolder|lighter|100|200|300|400|500|600|700|800|900"
_FONT = (rf"(((((normal|italic|oblique)|(normal|small-caps)|({_FONT_WEIGHT}))\s*){{1,3}})?\s*({_FONT_SIZE})"
         rf"\s*(\/\s*({_LINE_HEIGHT}))?\s+({_FONT_FAMILY}))")
_RADIUS = rf"(({_LEN_OR_PERC})\s*){{1,4}}(\/\s*(({_LEN_OR_PERC})\s*){{1,4}})?"
_SHADOW = (rf"(({_COLOR})\s+(({_LENGTH})\s*){{2,4}}(\s+inset)?)|((inset\s+)?(({_LENGTH})\s*){{2,4}}\s*({_COLOR})?)")
_DISPLAY = ("inline|block|list-item|run-in|inline-list-item|inline-block|table|inline-table|table-cell|table-caption|"
            "flex|inline-flex|grid|inline-grid|auto|block|table|flex|grid|block-level|inline-level|none|"
            "table-row-group|table-header-group|table-footer-group|table-row|table-cell|table-column-group|"
            "table-column|table-caption|inherit|inline-box|inline-stack")
_BG_POSITION = rf"(({_LEN_OR_PERC}|left|center|right|top|bottom)\s*){{1,4}}"

#: Every property the sanitizer keeps that our static views use, with the values it accepts.
ALLOWED_STYLES = {
    "background": rf"((({_BG_POSITION})|({_COLOR}))\s*)+",
    "background-color": _COLOR,
    "border": _BORDER, "border-top": _BORDER, "border-bottom": _BORDER, "border-left": _BORDER, "border-right": _BORDER,
    "border-color": rf"(({_COLOR})\s*){{1,4}}",
    "border-radius": _RADIUS,
    "border-collapse": "collapse|separate",
    "border-spacing": rf"{_LENGTH}\s*({_LENGTH})?",
    "bottom": rf"{_LEN_OR_PERC}|auto", "top": rf"{_LENGTH}|{_PERCENTAGE}|auto", "left": rf"{_LEN_OR_PERC}|auto",
    "right": rf"{_LENGTH}|{_PERCENTAGE}|auto",
    "box-shadow": rf"none|{_SHADOW}(,\s*({_SHADOW}))*",
    "box-sizing": "content-box|padding-box|border-box",
    "color": _COLOR,
    "cursor": "auto|crosshair|default|pointer|move|text|wait|help|progress|not-allowed",
    "display": _DISPLAY,
    "font": _FONT, "font-family": _FONT_FAMILY, "font-size": _FONT_SIZE, "font-weight": _FONT_WEIGHT,
    "font-style": "normal|italic|oblique",
    "height": rf"{_LENGTH}|{_PERCENTAGE}|auto",
    "letter-spacing": rf"normal|{_LENGTH}",
    "line-height": _LINE_HEIGHT,
    "margin": rf"(({_MARGIN_WIDTH})\s*){{1,4}}",
    "margin-top": _MARGIN_WIDTH, "margin-bottom": _MARGIN_WIDTH, "margin-left": _MARGIN_WIDTH, "margin-right": _MARGIN_WIDTH,
    "max-height": rf"{_LENGTH_POS}|{_PERCENTAGE_POS}|none|auto",
    "max-width": rf"{_LENGTH_POS}|{_PERCENTAGE_POS}|none|auto",
    "min-height": rf"{_LENGTH_POS}|{_PERCENTAGE_POS}|auto",
    "min-width": rf"{_LENGTH_POS}|{_PERCENTAGE_POS}|auto",
    "opacity": _N["number_zero_one"],
    "overflow": "visible|hidden|scroll|auto",
    "overflow-x": "visible|hidden|scroll|auto|no-display|no-content",
    "overflow-y": "visible|hidden|scroll|auto|no-display|no-content",
    "overflow-wrap": "normal|break-word",
    "padding": rf"(({_PADDING_WIDTH})\s*){{1,4}}",
    "padding-top": _PADDING_WIDTH, "padding-bottom": _PADDING_WIDTH, "padding-left": _PADDING_WIDTH,
    "padding-right": _PADDING_WIDTH,
    "position": "static|relative|absolute",
    "table-layout": "auto|fixed",
    "text-align": "left|right|center|justify",
    "text-overflow": rf"((clip|ellipsis|{_STRING})\s*){{1,2}}",
    "text-transform": "capitalize|uppercase|lowercase|none",
    "vertical-align": rf"baseline|sub|super|top|text-top|middle|bottom|text-bottom|{_LEN_OR_PERC}",
    "white-space": "normal|pre|nowrap|pre-wrap|pre-line",
    "width": rf"{_LENGTH_POS}|{_PERCENTAGE_POS}|auto",
    "word-break": "normal|keep-all|break-all",
    "z-index": r"auto|[+-]?[0-9]{1,7}",
}
_COMPILED = {k: re.compile(f"^({v})$", re.I) for k, v in ALLOWED_STYLES.items()}

#: Tags our static HTML may use that the sanitizer keeps (a subset of its allowedTags).
ALLOWED_TAGS = {"b", "br", "code", "col", "colgroup", "details", "div", "i", "img", "li", "pre", "span", "summary",
                "table", "tbody", "td", "th", "thead", "tr", "ul"}
#: Attributes the sanitizer keeps on every tag, and the extra ones per tag that we use.
GLOBAL_ATTRS = {"class", "dir", "hidden", "id", "lang", "style", "title"}
TAG_ATTRS = {"img": {"alt", "height", "src", "width"}, "td": {"colspan", "rowspan", "width"},
             "th": {"colspan", "rowspan", "width"}, "details": {"open"}, "col": {"width", "span"}}


def rejected_declarations(style: str) -> list[str]:
    """The declarations of an inline style the sanitizer would drop."""
    bad = []
    for declaration in style.split(";"):
        if not declaration.strip():
            continue
        name, _, value = declaration.partition(":")
        name, value = name.strip().lower(), value.strip()
        rule = _COMPILED.get(name)
        if rule is None or not rule.match(value):
            bad.append(declaration.strip())
    return bad
