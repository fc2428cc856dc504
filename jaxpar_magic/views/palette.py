"""Device colours: the Python twin of ``js/palette.js``.

Golden-angle hues in integer hundredths of a degree, saturation by ``id % 3``, lightness by
the XOR of the id's base-4 digits (see ``js/palette.js`` for why). Both files implement one formula with the same integer hue steps and the same floating-point
operations, so a device has the same ``#rrggbb`` in the widget and in the static HTML
(``tests/browser`` compares all ids 0..4095 against the browser's answer).
"""

from __future__ import annotations

import functools

#: Devices 0-7 (the eight simulated devices of every chapter): colours picked for readers with a
#: colour-vision deficiency. Under a simulation of protanopia, deuteranopia and tritanopia (Machado,
#: Oliveira & Fernandes 2009, severity 1) every two of them differ by a CIELAB distance of at least
#: 19 (the golden-angle colours below came down to 1.6 for devices 3 and 6); all take dark text at
#: a contrast of 8:1 or more. tests/test_palette_cvd.py checks both. Ids are written on every tile,
#: so colour is never the only cue.
CVD_SAFE = ("#78c1d6", "#eed936", "#aef077", "#5ef0d4", "#e1eaae", "#f58c98", "#a69ff5", "#d4a16c")
_SATURATION = (0.62, 0.5, 0.74)
_LIGHTNESS = (0.8, 0.72, 0.86, 0.76)


@functools.lru_cache(maxsize=8192)
def device_color(device_id: int) -> tuple[str, str]:
    """Return ``(background, text)`` colours, both ``#rrggbb``, for one device id."""
    n = abs(int(device_id))
    if n < len(CVD_SAFE):
        return CVD_SAFE[n], "#111111"
    hue = ((n * 13751) % 36000) / 100
    s = _SATURATION[n % 3]
    fold, m = 0, n
    while m > 0:
        fold ^= m % 4
        m //= 4
    lightness = _LIGHTNESS[fold]
    c = (1 - abs(2 * lightness - 1)) * s
    hp = hue / 60
    x = c * (1 - abs((hp % 2) - 1))
    if hp < 1:
        r, g, b = c, x, 0.0
    elif hp < 2:
        r, g, b = x, c, 0.0
    elif hp < 3:
        r, g, b = 0.0, c, x
    elif hp < 4:
        r, g, b = 0.0, x, c
    elif hp < 5:
        r, g, b = x, 0.0, c
    else:
        r, g, b = c, 0.0, x
    m = lightness - c / 2
    rgb = [int((v + m) * 255 + 0.5) for v in (r, g, b)]
    lum = (0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2]) / 255
    return "#" + "".join(f"{v:02x}" for v in rgb), ("#111111" if lum > 0.45 else "#ffffff")


def device_rgb(device_id: int) -> tuple[int, int, int]:
    """The background colour of a device as an ``(r, g, b)`` triple."""
    bg = device_color(device_id)[0]
    return int(bg[1:3], 16), int(bg[3:5], 16), int(bg[5:7], 16)
