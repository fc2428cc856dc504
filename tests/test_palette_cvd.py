"""Device colours a colour-blind reader can tell apart: devices 0-7 under simulated protanopia,
deuteranopia and tritanopia (Machado, Oliveira & Fernandes 2009, "A physiologically-based model for
simulation of color vision deficiency", severity 1.0 matrices, applied in linear RGB), compared in
CIELAB (D65)."""

from __future__ import annotations

import itertools

import numpy as np

from jaxpar_magic.views.palette import device_color

SIMULATIONS = {
    "protanopia": [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216], [-0.003882, -0.048116, 1.051998]],
    "deuteranopia": [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413], [-0.011820, 0.042940, 0.968881]],
    "tritanopia": [[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602], [0.004733, 0.691367, 0.303900]],
    "typical": [[1, 0, 0], [0, 1, 0], [0, 0, 1]],
}
#: A CIELAB distance (ΔE*ab) two colours side by side must keep: about 10 reads as clearly different.
MIN_DELTA_E = 15


def linear(hex_colour: str) -> np.ndarray:
    c = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)]) / 255
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def cielab(rgb_linear: np.ndarray) -> np.ndarray:
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ rgb_linear
    t = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(t > 0.008856, np.cbrt(t), 7.787 * t + 16 / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def contrast(a: str, b: str) -> float:
    lum = [float(np.array([0.2126, 0.7152, 0.0722]) @ linear(c)) for c in (a, b)]
    return (max(lum) + 0.05) / (min(lum) + 0.05)


def test_the_first_eight_devices_stay_apart_under_every_colour_vision() -> None:
    colours = [device_color(d)[0] for d in range(8)]
    for name, matrix in SIMULATIONS.items():
        seen = [cielab(np.clip(np.array(matrix) @ linear(c), 0, 1)) for c in colours]
        closest = min((float(np.linalg.norm(seen[i] - seen[j])), i, j) for i, j in itertools.combinations(range(8), 2))
        assert closest[0] >= MIN_DELTA_E, f"{name}: devices {closest[1]} and {closest[2]} differ by ΔE {closest[0]:.1f}"


def test_every_tile_colour_keeps_its_text_readable() -> None:
    for d in list(range(64)) + [1000, 4095]:
        bg, fg = device_color(d)
        assert contrast(bg, fg) >= 4.5, (d, bg, fg)
