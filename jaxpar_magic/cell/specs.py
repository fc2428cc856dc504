"""Parsing the small languages of our magic lines: mesh shapes, device lists, Python literals.

No `eval`: literals go through `ast.literal_eval`, everything else through explicit grammars.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from ..errors import UsageError

_AXIS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # used with fullmatch: `$` would accept a trailing newline
MAX_LITERAL = 1000  # characters: a longer option literal is a mistake, and deep nesting would recurse


def is_count(text: str) -> bool:
    """ASCII digits only: str.isdigit() also accepts '²' and other digits int() refuses."""
    return text.isascii() and text.isdigit()


_is_count = is_count  # the name this module's parsers use


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
        if not eq or not _AXIS.fullmatch(name) or not _is_count(size) or int(size) < 1:
            raise UsageError(
                f"{option}: cannot read {item!r}; write each axis as NAME=SIZE with a Python "
                f"identifier and a positive whole number, separated by commas, e.g. `{option} outer=2,inner=4`."
            )
        if name in names:
            raise UsageError(f"{option}: axis {name!r} appears twice; give each mesh axis its own name.")
        names.append(name)
        sizes.append(int(size))
    return MeshShape(tuple(names), tuple(sizes))


_NOT_ALLOWED = object()


def _ints_and_nones(value) -> bool:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return True
    return isinstance(value, (tuple, list)) and all(_ints_and_nones(v) for v in value)


def parse_literal(text: str | None, option: str):
    """A Python literal from the magic line (tuples, ints, None), read without executing anything."""
    if text is None:
        return None
    stripped = text.strip()
    if len(stripped) >= 2 and stripped[0] == stripped[-1] and stripped[0] in "'\"":
        stripped = stripped[1:-1]  # IPython keeps the quotes of `--in-axes "(0, None)"`
    try:
        value = ast.literal_eval(stripped) if len(stripped) <= MAX_LITERAL else _NOT_ALLOWED
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        value = _NOT_ALLOWED
    if not _ints_and_nones(value):
        raise UsageError(
            f"{option}: {text!r} is not a literal of whole numbers, None and tuples; write e.g. "
            f"`{option} \"(0, None)\"`."
        )
    return value


def parse_device_selection(words: list[str] | None) -> int | tuple[int, ...] | None:
    """`--devices 4` means the first four devices; `--devices 0 2 4 6` (or `0,2,4,6`) lists ids."""
    if not words:
        return None
    items = [w for word in words for w in word.replace(",", " ").split()]
    if not items or not all(_is_count(w) for w in items):
        raise UsageError(
            f"--devices: expected a count (`--devices 4`) or device ids (`--devices 0 2 4 6`), got {' '.join(words)!r}."
        )
    if len(items) == 1:
        count = int(items[0])
        if count < 1:
            raise UsageError("--devices 0: a cell needs at least one device; give a count of 1 or more, or device ids.")
        return count
    return tuple(int(w) for w in items)


# --- PartitionSpecs: NAME=data, NAME=data,None, NAME=(data,model),None, NAME=P('data', None), NAME=8

def _top_level_split(text: str, sep: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch in "([" and 1 or (-1 if ch in ")]" else 0)
        if ch == sep and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return parts


def _spec_entry(item: str, where: str):
    item = item.strip().strip("'\"")
    if item == "None":
        return None
    if _is_count(item):
        return int(item)  # "split this dimension over N devices" (PositionalSharding's job)
    if item.startswith("(") and item.endswith(")"):
        # One level only, read without recursion: `((((data))))` 500 deep is a mistake, not a RecursionError.
        names = tuple(p.strip().strip("'\"") for p in item[1:-1].split(",") if p.strip())
        if not all(_AXIS.fullmatch(n) and n != "None" for n in names):
            raise UsageError(f"{where}: inside parentheses list mesh axis names only, e.g. `(data,model)`; "
                             f"cannot read {_shortened(item)!r}.")
        return names
    if _AXIS.fullmatch(item):
        return item
    raise UsageError(
        f"{where}: cannot read {_shortened(item)!r} as a PartitionSpec entry; use a mesh axis name, None, a tuple "
        "of axis names like (data,model), or a device count like 8."
    )


def _shortened(text: str, most: int = 60) -> str:
    """A long piece of a magic line, cut for a message (the user has the whole line in front of them)."""
    return text if len(text) <= most else text[:most] + "…"


@dataclass(frozen=True)
class SpecTree:
    """`NAME=@SPECS`: one spec per leaf, from a pytree of PartitionSpecs (or NamedShardings) that the
    namespace holds under `name` (e.g. `nnx.get_partition_spec(state)`, `nn.get_sharding(params, mesh)`)."""

    name: str

    def __str__(self) -> str:
        return "@" + self.name


def parse_spec(text: str, where: str) -> "tuple | SpecTree":
    """One PartitionSpec, as a tuple of entries (None | axis name | tuple of names | int), or
    `@NAME`: a pytree of specs from the namespace, one per leaf."""
    text = text.strip()
    if text.startswith("@"):
        name = text[1:].strip()
        if not _AXIS.fullmatch(name):
            raise UsageError(
                f"{where}: `@{name}` should name a pytree of PartitionSpecs in your namespace, e.g. "
                f"`@param_specs` after `param_specs = nnx.get_partition_spec(state)`."
            )
        return SpecTree(name)
    for prefix in ("P(", "PartitionSpec("):
        if text.startswith(prefix) and text.endswith(")"):
            text = text[len(prefix):-1].strip()
            break
    if not text:
        return ()
    items = _top_level_split(text, ",")
    if len(items) > 1 and not items[-1].strip():
        items.pop()  # P('data',) is a one-entry spec, as in Python
    empty = [n for n, item in enumerate(items, 1) if not item.strip().strip("'\"").strip()]
    if empty:  # `data,,` is no spec in Python either; reading it as P('data', None) would guess
        raise UsageError(f"{where}: entry {empty[0]} of {_shortened(text)!r} is empty; write None for a dimension left "
                         f"whole (`data,None`), or remove the extra comma.")
    return tuple(_spec_entry(item, where) for item in items)


def parse_assignments(words: list[str] | None, option: str) -> dict[str, tuple]:
    """`--in v1s=data v2s=P('data', None)` -> {'v1s': ('data',), 'v2s': ('data', None)}."""
    if not words:
        return {}
    joined = " ".join(words)
    pieces: list[str] = []
    for token in _top_level_split(joined, " "):
        if not token:
            continue
        if "=" in token or not pieces:
            pieces.append(token)
        else:
            pieces[-1] += " " + token  # a space inside P('data', None) split it into two words
    specs = {}
    for piece in pieces:
        name, eq, spec = piece.partition("=")
        name = name.strip()
        if not eq or not _AXIS.fullmatch(name):
            raise UsageError(
                f"{option}: cannot read {piece!r}; write NAME=SPEC, e.g. `{option} v1s=data` or "
                f"`{option} w=P('data', 'model')`."
            )
        if name in specs:
            raise UsageError(f"{option}: {name!r} appears twice; give each name one spec.")
        if not spec.strip():
            raise UsageError(
                f"{option} {name}=: the spec is empty. Write `{name}=None` (or `{name}=P()`) to replicate {name!r} on "
                f"every device, or name the mesh axes its dimensions are split over, e.g. `{name}=data`."
            )
        specs[name] = parse_spec(spec, f"{option} {name}")
    return specs
