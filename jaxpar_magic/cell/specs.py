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


@dataclass(frozen=True)
class InlineMesh(MeshShape):
    """`--mesh data=4,model=2` with `%mesh`'s options on the same line (`--axis-types auto`, `--devices 4`,
    `--abstract`): any mesh `%mesh` builds, spelled so that the line needs nothing bound first."""

    axis_types: str | None = None  # None: what jax.make_mesh gives
    devices: int | tuple[int, ...] | None = None  # None: all of them
    abstract: bool = False

    def words(self) -> str:
        """`data=4,model=2 --axis-types auto`: the shape and its options as they go on a line after --mesh."""
        devices = self.devices if not isinstance(self.devices, tuple) else " ".join(str(d) for d in self.devices)
        return " ".join([str(self)] + ([f"--axis-types {self.axis_types}"] if self.axis_types else [])
                        + ([f"--devices {devices}"] if devices is not None else [])
                        + (["--abstract"] if self.abstract else []))


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


# --- leaf paths: `--in params=data "params['w1']=P(None,'model')"` -----------------------------------

_STEP = re.compile(r"""\[\s*(?:'([^']*)'|"([^"]*)"|(-?[0-9]+)|([A-Za-z_][A-Za-z0-9_]*))\s*\]|\.([A-Za-z_][A-Za-z0-9_]*)""")


def path_steps(text: str) -> tuple[tuple[str, str], ...] | None:
    """`['w1'][0].mu` (as jax.tree_util.keystr writes a path) as steps (("[", "w1"), ("[", "0"), (".", "mu")),
    or None where it is no path. A key's quotes are optional (`[w1]`: the shell removes them from a line),
    so `[0]` is the sequence index and the key '0' alike."""
    steps, at = [], 0
    while at < len(text):
        found = _STEP.match(text, at)
        if found is None:
            return None
        attr = found.group(5)
        key = next(g for g in found.groups()[:4] if g is not None) if attr is None else attr
        steps.append(("." if attr is not None else "[", key))
        at = found.end()
    return tuple(steps)


@dataclass(frozen=True)
class LeafSpecs:
    """One input's specs when --in names leaves of it by path (`params=data "params['w1']=P(None,'model')"`):
    `base` for every leaf (a spec, `@NAME`, or None: each leaf as it is laid out, as for an input --in does
    not name), and per path the spec of the leaf or subtree there; the longest path that leads to a leaf wins."""

    name: str
    base: "tuple | SpecTree | None"
    paths: tuple  # ((path text, its steps, spec), ...), as written

    def __str__(self) -> str:
        """What follows `NAME=` in a message: `P(None) params[w1]=P(None,'model')`."""
        base = _spec_words(self.base) if self.base is not None else "(each leaf as laid out)"
        return " ".join([base] + [f"{self.name}{text}={_spec_words(spec)}" for text, _, spec in self.paths])


def _spec_words(spec) -> str:
    if isinstance(spec, SpecTree):
        return str(spec)
    return "P(" + ",".join("None" if e is None else repr(e) if not isinstance(e, tuple) else
                           "(" + ",".join(repr(a) for a in e) + ")" for e in spec) + ")"


def _split_name(text: str) -> tuple[str, str, str]:
    """`params['w1']=P(...)` -> ("params['w1']", "=", "P(...)"): the first `=` outside brackets and quotes."""
    depth, quote = 0, None
    for at, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"" and depth:
            quote = ch
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "=" and depth == 0:
            return text[:at], "=", text[at + 1:]
    return text, "", ""


def parse_assignments(words: list[str] | None, option: str) -> dict[str, tuple]:
    """`--in v1s=data v2s=P('data', None)` -> {'v1s': ('data',), 'v2s': ('data', None)}. With `--in`, a
    name may carry a leaf path (`params['w1']=...`): that input's entries become one LeafSpecs."""
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
    specs: dict = {}  # input -> its spec (None until given: an input named only by paths)
    given: set = set()
    paths: dict = {}  # input -> [(path text, steps, spec)]
    for piece in pieces:
        target, eq, spec = _split_name(piece)
        target = target.strip()
        name = _AXIS.match(target).group(0) if _AXIS.match(target) else ""
        path = target[len(name):]
        steps = path_steps(path) if path and option == "--in" else None
        if not eq or not name or (path and not steps):
            leaf = " (or one leaf of a pytree by its path: `params['w1']=None,model`)" if option == "--in" else ""
            raise UsageError(
                f"{option}: cannot read {_shortened(piece)!r}; write NAME=SPEC, e.g. `{option} v1s=data` or "
                f"`{option} w=P('data', 'model')`{leaf}."
            )
        if (not steps and target in given) or (steps and any(steps == s for _, s, _ in paths.get(name, ()))):
            raise UsageError(f"{option}: {target!r} appears twice; give each name one spec.")
        if not spec.strip():
            raise UsageError(
                f"{option} {target}=: the spec is empty. Write `{target}=None` (or `{target}=P()`) to replicate "
                f"{target!r} on every device, or name the mesh axes its dimensions are split over, e.g. `{target}=data`."
            )
        parsed = parse_spec(spec, f"{option} {target}")
        if steps:
            if isinstance(parsed, SpecTree):
                raise UsageError(f"{option} {target}={parsed}: a leaf path takes one spec; give `@{parsed.name}` to the "
                                 f"whole input (`{name}=@{parsed.name}`), or a spec such as `{target}=None,model`.")
            paths.setdefault(name, []).append((path, steps, parsed))
            specs.setdefault(name, None)  # keeps the line's order of inputs
        else:
            specs[target] = parsed
            given.add(target)
    for name, entries in paths.items():
        specs[name] = LeafSpecs(name, specs[name], tuple(entries))
    return specs
