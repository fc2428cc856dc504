"""Parsing the small languages of our magic lines: mesh shapes, device lists, Python literals.

No `eval`: literals go through `ast.literal_eval`, everything else through explicit grammars.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from .errors import UsageError

_AXIS = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class MeshShape:
    """Axis names and sizes in mesh order, e.g. outer=2,inner=4."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]

    @property
    def size(self) -> int:
        total = 1
        for s in self.sizes:
            total *= s
        return total

    def __str__(self) -> str:
        return ",".join(f"{n}={s}" for n, s in zip(self.names, self.sizes))


def parse_mesh_shape(text: str | list[str], option: str = "--mesh") -> MeshShape:
    """`outer=2,inner=4` or `outer=2 inner=4` (as one string or as argparse's list of words)."""
    words = text if isinstance(text, list) else [text]
    items = [item for word in words for item in word.replace(",", " ").split()]
    if not items:
        raise UsageError(f"{option} needs at least one AXIS=SIZE, e.g. `{option} data=4,model=2`.")
    names, sizes = [], []
    for item in items:
        name, eq, size = item.partition("=")
        name, size = name.strip(), size.strip()
        if not eq or not _AXIS.match(name) or not size.isdigit() or int(size) < 1:
            raise UsageError(
                f"{option}: cannot read {item!r}; write each axis as NAME=SIZE with a Python "
                f"identifier and a positive whole number, separated by commas, e.g. `{option} outer=2,inner=4`."
            )
        if name in names:
            raise UsageError(f"{option}: axis {name!r} appears twice; give each mesh axis its own name.")
        names.append(name)
        sizes.append(int(size))
    return MeshShape(tuple(names), tuple(sizes))


def parse_literal(text: str | None, option: str):
    """A Python literal from the magic line (tuples, ints, None), read without executing anything."""
    if text is None:
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise UsageError(
            f"{option}: {text!r} is not a Python literal; write numbers, None and tuples only, "
            f"e.g. `{option} \"(0, None)\"`."
        ) from None


def parse_device_selection(words: list[str] | None) -> int | tuple[int, ...] | None:
    """`--devices 4` means the first four devices; `--devices 0 2 4 6` (or `0,2,4,6`) lists ids."""
    if not words:
        return None
    items = [w for word in words for w in word.replace(",", " ").split()]
    if not all(w.isdigit() for w in items):
        raise UsageError(
            f"--devices: expected a count (`--devices 4`) or device ids (`--devices 0 2 4 6`), got {' '.join(words)!r}."
        )
    if len(items) == 1:
        return int(items[0])
    return tuple(int(w) for w in items)
