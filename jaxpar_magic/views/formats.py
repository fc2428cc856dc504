"""The helpers the views' static forms (HTML and text) share: numbers, bytes, times, shapes, specs and
device ids in words, escaped chips and swatches, a small PNG. Plain Python; views/base.py re-exports them."""
from __future__ import annotations

import base64
import html
import struct
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

esc = html.escape


def style_block() -> str:
    """Nothing: static HTML carries no stylesheet (a sanitizer removes ``<style>``); its styles are
    inline (views/inline.py). Kept for renderers that still prepend it."""
    return ""


def format_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    v, i = _scaled(n, 1024, len(units))
    sign = "-" if n < 0 else ""
    return f"{sign}{int(v)} B" if i == 0 else f"{sign}{to_fixed(v)} {units[i]}"


def _scaled(n: float, step: int, units: int) -> tuple[float, int]:
    """|n| divided by `step` while it is at least `step` (at most `units` - 1 times), and how often."""
    v, i = abs(float(n)), 0
    while v >= step and i < units - 1:
        v /= step
        i += 1
    return v, i


def to_fixed(v: float, digits: int = 1) -> str:
    """JavaScript's ``v.toFixed(digits)`` for v >= 0: a tie of the exact binary value rounds up (5.25 MiB
    is ``5.3``, where Python's ``f"{v:.1f}"`` gives ``5.2``), so a size reads the same in the widget,
    the static HTML and the text."""
    from decimal import ROUND_HALF_UP, Decimal

    return str(Decimal(v).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def format_si(n: float | None) -> str:
    if n is None:
        return "?"
    prefixes = ["", " k", " M", " G", " T", " P", " E"]
    v, i = _scaled(n, 1000, len(prefixes))
    sign = "-" if n < 0 else ""
    return f"{sign}{round(v, 2):g}" if i == 0 else f"{sign}{v:.2f}{prefixes[i]}"


def to_precision(v: float, digits: int = 3) -> str:
    """JavaScript's ``v.toPrecision(digits)``: ``digits`` significant digits, zeros kept, in fixed
    notation unless the exponent is below -6 or at least ``digits`` (``2.92e-7``, ``1.23e+5``).
    The one number formatter behind the widget's, the static HTML's and the text's figures."""
    if v != v or v in (float("inf"), float("-inf")):
        return {float("inf"): "Infinity", float("-inf"): "-Infinity"}.get(v, "NaN")
    if v == 0:
        return "0" if digits == 1 else "0." + "0" * (digits - 1)
    mantissa, exponent = f"{v:.{digits - 1}e}".split("e")
    e = int(exponent)
    if e < -6 or e >= digits:
        return f"{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"
    return f"{v:.{max(0, digits - 1 - e)}f}"


def format_seconds(s: float | None) -> str:
    """``850 µs``, ``1.33 ms``, ``2.50 s``, ``0.00292 ns``; the twin of ``formatSeconds`` in js/format.js."""
    if s is None or s != s or s in (float("inf"), float("-inf")):
        return "?"
    a = abs(s)
    if a == 0:
        return "0 s"
    if a < 1e-6:
        return f"{to_precision(s * 1e9)} ns"
    if a < 1e-3:
        return f"{to_precision(s * 1e6)} µs"
    if a < 1:
        return f"{to_precision(s * 1e3)} ms"
    return f"{to_precision(s)} s"


def format_ms(ms: float | None) -> str:
    if ms is None:
        return "?"
    if ms >= 1000:
        return f"{ms / 1000:.3g} s"
    return f"{ms:.3g} ms"


def format_shape(dtype: str, shape: Sequence[int]) -> str:
    return f"{dtype}[{', '.join(str(s) for s in shape)}]"


def op_words(collective: dict[str, Any]) -> str:
    """A collective's operation with what it combines by, as every view says it: 'all-reduce (sum)'."""
    reduction = collective.get("reduction")
    return str(collective.get("op")) + (f" ({reduction})" if reduction else "")


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
    return f"background:{bg};color:{fg[:4]}"  # #111 or #fff: the text colours are grey or white
