"""What every engine's `--as-code` snippet shares: the snippet's own names, its pieces of text, the
mesh it rebuilds, the cell's lines as a function body, what a cell traced abstractly gives back, and
the checks every engine makes before writing (one spec per input, a mesh with devices); inputs
from Flax NNX and Equinox are written the library's way (stages/ascode/libraries.py). The per-engine writers are stages/ascode/pmap.py, stages/ascode/shard.py and stages/ascode/shard_map.py.
"""
from __future__ import annotations

import io
import tokenize
from dataclasses import dataclass

from ...cell import analysis as cells
from ...errors import UsageError, explaining

INDENT = "    "
WIDTH = 120  # a call longer than this is written one argument per line
COMMENT_WIDTH = 100


# --- the snippet's own names -----------------------------------------------------------------------

_LIBRARIES = {  # the usual name -> (module, attribute or None)
    "functools": ("functools", None),
    "jax": ("jax", None),
    "jnp": ("jax.numpy", None),
    "np": ("numpy", None),
    "AxisType": ("jax.sharding", "AxisType"),
    "Mesh": ("jax.sharding", "Mesh"),
    "NamedSharding": ("jax.sharding", "NamedSharding"),
    "P": ("jax.sharding", "PartitionSpec"),
    "nnx": ("flax.nnx", None),
    "eqx": ("equinox", None),
}


class SnippetNames:
    """Names the snippet binds for itself, chosen against the cell's names and your namespace."""

    def __init__(self, namespace: dict, reads, writes):
        self._namespace = namespace
        self._reads = set(reads)
        self._writes = set(writes)
        self._taken: set[str] = set()
        self._libraries: dict[str, str] = {}  # library key -> name

    def _pick(self, want: str, fits) -> str:
        for name in [want] + [f"{want}_{i}" for i in range(2, 1000)]:
            if name not in self._taken and fits(name):
                self._taken.add(name)
                return name
        raise AssertionError("no free name")  # a thousand names of one stem taken: not a real cell

    def lib(self, key: str) -> str:
        """A module or class, imported under its usual name unless that name means something else here."""
        if key not in self._libraries:
            obj = _library_object(key)
            self._libraries[key] = self._pick(key, lambda n: n not in self._writes and (
                n not in self._namespace or self._namespace[n] is obj))
        return self._libraries[key]

    def value(self, want: str, same=None) -> str:
        """A name for something the snippet defines; `same(v)` tells that your `v` may be overwritten by it."""
        def fits(name):
            if name in self._writes:
                return False
            if name in self._namespace:
                return same is not None and same(self._namespace[name])
            return name not in self._reads
        return self._pick(want, fits)

    def import_lines(self) -> list[str]:
        used = self._libraries
        lines = []
        if "functools" in used:
            lines += [_import("functools", used["functools"]), ""]
        for key, module in (("jax", "jax"), ("jnp", "jax.numpy"), ("np", "numpy")):
            if key in used:
                lines.append(_import(module, used[key]))
        sharding = [(attr, used[key]) for key, (mod, attr) in _LIBRARIES.items()
                    if mod == "jax.sharding" and key in used]
        if sharding:
            parts = [attr if attr == name else f"{attr} as {name}" for attr, name in sorted(sharding)]
            lines.append(f"from jax.sharding import {', '.join(parts)}")
        if "nnx" in used:
            lines.append("from flax import nnx" if used["nnx"] == "nnx" else _import("flax.nnx", used["nnx"]))
        if "eqx" in used:
            lines.append(_import("equinox", used["eqx"]))
        return lines + self.module_imports(lines)

    def module_imports(self, already: list[str]) -> list[str]:
        """The modules the cell reads by name (`lax`, `jnp`, `optax`), imported as your namespace has
        them, so the snippet also runs pasted into a script."""
        import types

        lines = []
        for name in sorted(self._reads):
            module = self._namespace.get(name)
            if not isinstance(module, types.ModuleType) or self._libraries.get(_library_key(module)) == name:
                continue
            parent, _, child = module.__name__.rpartition(".")
            line = f"from {parent} import {child}" if parent and child == name else _import(module.__name__, name)
            if line not in already:
                lines.append(line)
        return lines


def _library_key(module) -> str | None:
    """The _LIBRARIES key under which the snippet itself imports `module`, if it does."""
    return {"jax": "jax", "jax.numpy": "jnp", "numpy": "np", "flax.nnx": "nnx", "equinox": "eqx"}.get(
        getattr(module, "__name__", None))


def _import(module: str, name: str) -> str:
    if "." not in module and name == module:
        return f"import {module}"
    return f"import {module} as {name}"


def _library_object(key: str):
    import importlib

    module, attr = _LIBRARIES[key]
    obj = importlib.import_module(module)
    return getattr(obj, attr) if attr else obj


def is_snippet_library(name: str, obj) -> bool:
    """`obj` is the very module or class the snippet imports under its usual `name` (`jax`, `np`, `P`)."""
    return name in _LIBRARIES and obj is _library_object(name)


def same_mesh(mesh):
    """`same` for a mesh variable: your name may be reused when it holds an equal mesh."""
    import jax

    return lambda value: isinstance(value, jax.sharding.Mesh) and value == mesh


# --- small pieces of text ----------------------------------------------------------------------------

_SHORT_DTYPES = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int32": "i32",
                 "int64": "i64", "int16": "i16", "int8": "i8", "uint32": "u32", "uint8": "u8", "bool": "bool",
                 "complex64": "c64", "complex128": "c128"}


def shape_text(shape, dtype) -> str:
    """`f32[8,128]`: a shape and dtype as a comment writes it."""
    import numpy as np

    name = np.dtype(dtype).name
    return f"{_SHORT_DTYPES.get(name, name)}[{','.join(str(int(s)) for s in shape)}]"


def spec_text(p: str, spec) -> str:
    """`P('data', None)`: a spec (a tuple of entries) as code, `p` being the snippet's name for PartitionSpec."""
    def entry(e):
        if e is None:
            return "None"
        if isinstance(e, str):
            return repr(e)
        return "(" + ", ".join(repr(a) for a in e) + ("," if len(e) == 1 else "") + ")"

    return f"{p}(" + ", ".join(entry(e) for e in spec) + ")"


def tuple_text(items) -> str:
    """`(a, b)`, and `(a,)` for one item: texts as a Python tuple."""
    items = list(items)
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def call_lines(head: str, args: list[str], indent: str = "", tail: str = "") -> list[str]:
    """`head(args)tail` on one line, or one argument per line when that is too long."""
    one = f"{indent}{head}({', '.join(args)}){tail}"
    if len(one) <= WIDTH or not args:
        return [one]
    return [f"{indent}{head}("] + [f"{indent}{INDENT}{a}," for a in args] + [f"{indent}){tail}"]


def comment_lines(text: str, indent: str = "") -> list[str]:
    """`text` as comment lines that fit the width: the text output's (80 columns in a kernel, the terminal's
    else: views/textwidth.py), so that fitting the code to it (as_code.py) wraps no comment again."""
    import textwrap

    from ...views.textwidth import text_width

    width = min(COMMENT_WIDTH, text_width()) - len(indent) - 2
    return [f"{indent}# {line}" for line in textwrap.wrap(text, width, break_on_hyphens=False)]


def targets_text(names: list[str]) -> str:
    """The left side of an assignment that binds `names`."""
    return ", ".join(names)


def check_single_specs(*spec_dicts) -> None:
    """--as-code writes one spec per input; a pytree of specs (`@NAME`) is not written out yet."""
    for specs in spec_dicts:
        for name, spec in specs.items():
            if not isinstance(spec, tuple):
                raise UsageError(
                    f"--as-code: {name}={spec} gives one spec per leaf; --as-code writes one spec per input. Give "
                    f"{name!r} a single spec to see its code, or run the cell without --as-code."
                )


def is_leaf(value) -> bool:
    """An abstract array (a ShapeDtypeStruct), not a pytree of them."""
    import jax

    return isinstance(value, jax.ShapeDtypeStruct)


def describe_devices(mesh) -> str:
    """`all 8 devices`, `the first 4 devices`, `devices 0, 2 and 5`: the mesh's devices in words."""
    import jax

    ids = [int(d.id) for d in mesh.devices.flat]
    every = [int(d.id) for d in jax.devices()]
    if ids == every:
        return f"all {len(ids)} devices" if len(ids) > 1 else "the one device"
    if ids == every[:len(ids)]:
        return f"the first {len(ids)} devices" if len(ids) > 1 else "the first device"
    if len(ids) == 1:
        return f"device {ids[0]}"
    return f"devices {', '.join(map(str, ids[:-1]))} and {ids[-1]}"


def axes_text(mesh) -> str:
    """`data=4, model=2`: the mesh's axes and sizes."""
    return ", ".join(f"{n}={s}" for n, s in mesh.shape.items())


def mesh_definition(mesh, names: SnippetNames, var: str, intro: list[str]) -> list[str]:
    """`var = Mesh(...)`: the same devices in the same grid, the same axis names and types."""
    import jax

    jax_, np_, mesh_cls, axis_type = names.lib("jax"), names.lib("np"), names.lib("Mesh"), names.lib("AxisType")
    ids = [int(d.id) for d in mesh.devices.flat]
    every = [int(d.id) for d in jax.devices()]  # the engines' order (in a cluster: every process's devices)
    lines = [line for text in intro for line in comment_lines(text)]
    if ids == every:
        devices = f"{jax_}.devices()"
    elif ids == every[:len(ids)]:
        devices = f"{jax_}.devices()[:{len(ids)}]"
    else:
        by_id = names.value("device_by_id")
        lines.append(f"{by_id} = {{d.id: d for d in {jax_}.devices()}}")
        devices = f"[{by_id}[i] for i in {tuple_text(map(str, ids))}]"
    shape = tuple(int(s) for s in mesh.devices.shape)
    grid = f"{np_}.array({devices})" + (f".reshape({', '.join(map(str, shape))})" if len(shape) > 1 else "")
    types = tuple_text(f"{axis_type}.{t.name}" for t in mesh.axis_types)
    lines += call_lines(f"{var} = {mesh_cls}", [grid, tuple_text(repr(str(n)) for n in mesh.axis_names),
                                           f"axis_types={types}"])
    return lines


def check_concrete(mesh, option: str) -> None:
    """A snippet runs on devices: an AbstractMesh (`option` names the magic) is refused."""
    import jax

    if not isinstance(mesh, jax.sharding.Mesh):
        raise UsageError(
            f"--as-code {option}: the mesh is abstract (an AbstractMesh has no devices), so there is no code that "
            f"runs on it. Build it with devices (`%mesh {axes_text(mesh).replace(', ', ' ')}`) to get the snippet, "
            "or plan the cell with --plan."
        )


def shard_mesh_intro(mesh, mesh_arg, specs: list[dict]) -> tuple[str, list[str]]:
    """%%shard's and %%shard_map's mesh: the variable's preferred name and the comment that says where
    the mesh comes from (`specs`: the --in / --out specs, whose counts make a 1-D mesh)."""
    devices = describe_devices(mesh)
    counted = [(n, e) for d in specs for n, spec in d.items() for e in spec if isinstance(e, int)]
    if counted:
        name, count = counted[0]
        return "mesh", [f"{name}={count} splits over {count} devices: a 1-D mesh of {devices}, its one axis named "
                        f"{mesh.axis_names[0]!r}."]
    if mesh_arg is None:
        from ...cell.meshes import context_mesh

        if context_mesh() is not None:  # the engines' order: the mesh jax.set_mesh set before the namespace's
            return "mesh", [f"The mesh jax.set_mesh set ({axes_text(mesh)}: {devices}), rebuilt from its devices so "
                            f"that this code stands alone."]
    if mesh_arg is None or (isinstance(mesh_arg, str) and "=" not in mesh_arg):
        name = mesh_arg or "mesh"
        return name, [f"Your mesh `{name}` ({axes_text(mesh)}: {devices}), rebuilt from its devices so that this "
                      f"code stands alone."]
    return "mesh", [f"--mesh {axes_text(mesh).replace(' ', '')}: {devices}."]


# --- the cell's own lines ------------------------------------------------------------------------------

def _string_rows(source: str) -> set[int]:
    """Rows (1-based) that begin inside a multi-line string: indenting them would change the string."""
    rows: set[int] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.start[0] < tok.end[0] and tok.type not in (tokenize.NEWLINE, tokenize.NL):
                rows.update(range(tok.start[0] + 1, tok.end[0] + 1))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # the cell parsed (ast), so this does not happen; no rows is the safe answer
    return rows


def _column(line: str, byte_offset: int) -> int:
    """ast's offsets count UTF-8 bytes; string indices count characters."""
    return len(line.encode("utf-8")[:byte_offset].decode("utf-8", errors="ignore"))


def cell_body(cell: cells.Cell, final: tuple | None, indent: str = INDENT) -> list[str]:
    """The cell's source, indented as a function body, comments and layout kept.

    `final`: None keeps the last statement as it is; ("assign", name) writes `name = <expression>`;
    ("drop",) removes a final bare name (returned under its own name instead).
    """
    source = cell.source.replace("\r\n", "\n")
    lines = source.split("\n")
    keep = _string_rows(source)
    if final is not None and cell.has_final_expression:
        last = cell.tree.body[-1]
        row = last.lineno - 1
        start = _column(lines[row], last.col_offset)
        if final[0] == "assign":
            lines[row] = lines[row][:start] + f"{final[1]} = " + lines[row][start:]
        elif last.lineno == last.end_lineno:
            end = _column(lines[row], last.end_col_offset)
            before, after = lines[row][:start], lines[row][end:].strip()
            if not before.strip() and (not after or after.startswith("#")):
                lines[row] = None
    out = []
    for number, line in enumerate(lines, start=1):
        if line is None:
            continue
        if number in keep or not line.strip():
            out.append(line if number in keep else "")
        else:
            out.append(indent + line)
    while out and not out[-1].strip():
        out.pop()
    while out and not out[0].strip():
        out.pop(0)
    return out


# --- what a traced cell gives back ---------------------------------------------------------------------

@dataclass
class TracedReturns:
    """What a cell traced abstractly gives back: its device outputs, its plain Python values, its final expression."""

    device: list[str]  # names computed on the devices, in the cell's order
    shapes: dict  # name -> its global shape (a ShapeDtypeStruct, or a tree of them)
    plain: list[str]  # names holding plain Python values (numbers, functions) the trace saw
    final: str | None  # None, "name" (the final expression is a bound name), "device" or "plain"
    final_name: str | None = None
    final_shape: object = None


def traced_returns(program, args, cell: cells.Cell, mesh, same_when_bound, *, set_mesh: bool = True,
                   note=None) -> TracedReturns:
    """Trace the engine's program abstractly over `args` (`jax.eval_shape`: no compile, no transfer;
    under `jax.set_mesh(mesh)` as %%shard and %%shard_map run it) and say what the cell gives back.
    `same_when_bound(name)`: a final bare name is returned as it is bound (no --merge or --out
    changes it); `note()` is added to the user's own error (explained_trace)."""
    import jax

    from ...cell.meshes import on_cell_mesh

    def trace():
        with jax.set_mesh(mesh) if set_mesh else on_cell_mesh(mesh):
            return jax.eval_shape(program.jitted, *args)

    device, final, cell_trace = explained_trace(trace, cell, mesh, note)[:3]
    device = cell_trace.outputs_of(device)
    final = cell_trace.final_of(final)[0] if final is not None else None
    return _returns(cell, cell_trace, device, final, same_when_bound)


def _returns(cell: cells.Cell, cell_trace, device_shapes: dict, final_shape, same_when_bound) -> TracedReturns:
    """What the cell gives back, read from the CellTrace of its abstract trace."""
    device = list(cell_trace.device_outputs)
    plain = list(cell_trace.static_outputs)
    kind, name = None, None
    if cell.has_final_expression and not cells.silenced(cell.source):
        last = cell.tree.body[-1].value
        if cell.final_is_output and last.id in device + plain and same_when_bound(last.id):
            kind, name = "name", last.id
        elif cell_trace.final_on_devices:
            kind = "device"
        elif cell_trace.static_final is not None:
            kind = "plain"
    return TracedReturns(device, {n: device_shapes[n] for n in device}, plain, kind, name, final_shape)


def explained_trace(trace, cell: cells.Cell, mesh, note=None):
    """Run an abstract trace; a foreseeable JAX error becomes the UsageError the magic would raise.

    The cell's own Python runs once, on abstract values; what it prints while traced is not part of
    the snippet, so it is set aside.
    """
    import contextlib

    try:
        with explaining(cell.filename, mesh.axis_names), contextlib.redirect_stdout(io.StringIO()):
            return trace()
    except UsageError:
        raise
    except Exception as exc:  # the user's own error: as the magic adds it, what each device saw
        if note is not None and hasattr(exc, "add_note"):
            exc.add_note(note())
        raise


def with_weak_types(abstract, value):
    """`abstract` (ShapeDtypeStructs) keeping the weak types of `value`'s leaves, as a real call would."""
    import jax

    return jax.tree.map(lambda s, a: jax.ShapeDtypeStruct(s.shape, s.dtype, weak_type=getattr(a, "weak_type", False)),
                        abstract, value)


def abstract_of(value):
    """`value`'s leaves as ShapeDtypeStructs (weak types kept): what the abstract trace takes."""
    import jax

    return jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=getattr(a, "weak_type", False)), value)


def plain_lines(returns: TracedReturns, plain: str | None, result: str | None, indent: str) -> list[str]:
    """Inside the function: keep the plain Python values the trace computes (jit returns only arrays)."""
    if not returns.plain and returns.final != "plain":
        return []
    args = [f"{n}={n}" for n in returns.plain] + ([f"{result}={result}"] if returns.final == "plain" else [])
    return call_lines(f"{plain}.update", args, indent)


def after_call_lines(returns: TracedReturns, plain: str | None, result: str | None) -> list[str]:
    """After the call: bind the plain Python values the cell computed, then show its final expression."""
    lines = [f"{n} = {plain}[{n!r}]" for n in returns.plain]
    if returns.final == "plain":
        lines.append(f"{result} = {plain}[{result!r}]")
    if returns.final == "name":
        lines.append(returns.final_name)
    elif returns.final in ("device", "plain"):
        lines.append(result)
    return lines


def plain_intro(plain: str) -> list[str]:
    """The dict that carries the cell's plain Python values out of the jitted function."""
    return [f"{plain} = {{}}  # plain Python values the cell computes while JAX traces it (jit returns only arrays)"]


def final_edit(returns: TracedReturns, result: str | None):
    """`cell_body`'s `final` for these returns: assign the final expression to `result`, or drop a bare name."""
    if returns.final in ("device", "plain"):
        return ("assign", result)
    if returns.final == "name":
        return ("drop",)
    return None


def laid_out_again(names: SnippetNames, arguments: dict, moved: list, mesh_var: str) -> tuple[list[str], list[str]]:
    """The call's arguments (`arguments`: input name -> the name passed), each input that sits on
    another mesh of these devices put on this one first, as the magic does (meshes.lay_out_again);
    and the comment that says why."""
    respecs = {name: spec for name, _, spec in moved}
    jax_, named, p = names.lib("jax"), names.lib("NamedSharding") if moved else None, names.lib("P") if moved else None
    call = [f"{jax_}.device_put({arg}, {named}({mesh_var}, {spec_text(p, respecs[name])}))" if name in respecs
            else arg for name, arg in arguments.items()]
    notes = comment_lines(f"{', '.join(respecs)} {'is' if len(respecs) == 1 else 'are'} laid out on another mesh of "
                          f"these devices: put on this one first, as jax.device_put would (jit takes no input from "
                          f"another mesh).") if moved else []
    return call, notes


# --- the snippet as a whole -------------------------------------------------------------------------

def snippet(names: SnippetNames, parts: list[list[str]]) -> str:
    """The imports, then the parts. The parts are written first (they are this call's arguments), so
    the imports are those the parts asked for."""
    return _join([names.import_lines()] + parts)


def _join(parts: list[list[str]]) -> str:
    """Blocks of lines: two blank lines around a block that defines a function, one elsewhere."""
    out: list[str] = []
    previous = None
    for part in parts:
        if not part:
            continue
        if previous is not None:
            out += [""] * (2 if _defines(previous) or _defines(part) else 1)
        out += part
        previous = part
    return "\n".join(out)


def _defines(part: list[str]) -> bool:
    return any(line.startswith(("def ", "@")) for line in part)
