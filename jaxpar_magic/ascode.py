"""`--as-code`: the plain JAX a `%%pmap`, `%%shard` or `%%shard_map` cell stands for.

`as_code(magic, options, source, namespace)` returns a self-contained snippet: imports, the mesh,
the `jax.jit` / `jax.shard_map` / `jax.device_put` calls with their specs, and the cell's own lines
as a function body. Executed in a namespace that holds only the names the cell reads, it binds the
names the magic binds, to the same values with the same shardings.

Nothing runs. The line and the cell go through the engines' own checks (so a mistake is the same
UsageError the magic gives), then the engine's own program is traced abstractly (`jax.eval_shape`:
no compile, no transfer) to learn what the cell gives back: which names are arrays computed on the
devices and which are plain Python values, their shapes, and the out specs `%%shard_map` proves.

The mesh is always rebuilt from its devices' ids and axis types, never read from the namespace:
the snippet stands alone, and `--mesh NAME` binds NAME to an equal mesh. The snippet's own names
(`mesh`, `per_device`, `run`, ...) are chosen so that none changes a name the cell uses, and none
overwrites a different value of yours (`mesh_2` when your `mesh` is another mesh).
"""
from __future__ import annotations

import ast
import io
import sys
import tokenize
from dataclasses import dataclass

from . import cell as cells
from .errors import UsageError, explaining
from .inputs import classify
from .programs import analyse_cached

INDENT = "    "
WIDTH = 120  # a call longer than this is written one argument per line
COMMENT_WIDTH = 100

_PMAP_WHY = [
    "# jax.pmap itself is jax.jit(jax.shard_map(...)) since JAX 0.8. check_vma=False is pmap's own setting on",
    "# JAX 0.10: with the checks on, the gradient of a replicated input is summed over the devices on its",
    "# own, and a following lax.pmean makes it N times too large.",
]


def as_code(magic: str, options, source: str, namespace: dict, *, axis_name: str | None = None) -> str:
    """The snippet for a `%%magic` cell with the parsed line `options` (jaxpar_magic.lines);
    `axis_name` is %%pmap's axis name with the configured default already applied."""
    if magic in ("pmap", "shard", "shard_map"):
        _plain_jax_inputs(analyse_cached(source, f"{magic}-cell"), namespace, magic)
    if magic == "pmap":
        return _pmap_code(options, source, namespace, axis_name or options.axis_name or "i")
    if magic == "shard":
        return _shard_code(options, source, namespace)
    if magic == "shard_map":
        return _shard_map_code(options, source, namespace)
    raise UsageError(f"--as-code: there is no %%{magic} magic; it works on %%pmap, %%shard and %%shard_map cells.")


def _plain_jax_inputs(cell: cells.Cell, namespace: dict, magic: str) -> None:
    """The snippet calls plain `jax.jit`, which takes arrays and pytrees of arrays: an input with
    other leaves (an Equinox module's activation) or a Flax NNX object is said before it fails."""
    from .inputs import TreeInput

    for name in cell.reads:
        tree = TreeInput.of(name, namespace[name], abstract=True) if name in namespace else None
        if tree is None:
            continue
        if tree.graphdef is not None:
            raise UsageError(
                f"--as-code: {name!r} is a Flax NNX object. The snippet would be plain `jax.jit`, which cannot "
                f"update it in place the way %%{magic} does; in a script use `nnx.jit` (or `nnx.split` before and "
                f"`nnx.merge` inside the jitted function). Run the cell without --as-code to train it here."
            )
        if tree.statics:
            kinds = sorted({type(leaf).__name__ for _, leaf in tree.statics})
            raise UsageError(
                f"--as-code: {name!r} ({type(namespace[name]).__name__}) has leaves that are not arrays "
                f"({', '.join(kinds)}), which plain `jax.jit` cannot take as arguments. In a script, use "
                f"`eqx.filter_jit` (Equinox) or mark those fields static; %%{magic} itself treats them as static."
            )


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
}


class _Names:
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
    return {"jax": "jax", "jax.numpy": "jnp", "numpy": "np"}.get(getattr(module, "__name__", None))


def _import(module: str, name: str) -> str:
    if "." not in module and name == module:
        return f"import {module}"
    return f"import {module} as {name}"


def _library_object(key: str):
    import importlib

    module, attr = _LIBRARIES[key]
    obj = importlib.import_module(module)
    return getattr(obj, attr) if attr else obj


def _same_mesh(mesh):
    """`same` for a mesh variable: your name may be reused when it holds an equal mesh."""
    import jax

    return lambda value: isinstance(value, jax.sharding.Mesh) and value == mesh


# --- small pieces of text ----------------------------------------------------------------------------

_SHORT_DTYPES = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int32": "i32",
                 "int64": "i64", "int16": "i16", "int8": "i8", "uint32": "u32", "uint8": "u8", "bool": "bool",
                 "complex64": "c64", "complex128": "c128"}


def _shape_text(shape, dtype) -> str:
    import numpy as np

    name = np.dtype(dtype).name
    return f"{_SHORT_DTYPES.get(name, name)}[{','.join(str(int(s)) for s in shape)}]"


def _spec_text(p: str, spec) -> str:
    def entry(e):
        if e is None:
            return "None"
        if isinstance(e, str):
            return repr(e)
        return "(" + ", ".join(repr(a) for a in e) + ("," if len(e) == 1 else "") + ")"

    return f"{p}(" + ", ".join(entry(e) for e in spec) + ")"


def _tuple_text(items) -> str:
    items = list(items)
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _call(head: str, args: list[str], indent: str = "", tail: str = "") -> list[str]:
    """`head(args)tail` on one line, or one argument per line when that is too long."""
    one = f"{indent}{head}({', '.join(args)}){tail}"
    if len(one) <= WIDTH or not args:
        return [one]
    return [f"{indent}{head}("] + [f"{indent}{INDENT}{a}," for a in args] + [f"{indent}){tail}"]


def _comment(text: str, indent: str = "") -> list[str]:
    """`text` as comment lines that fit the width."""
    import textwrap

    width = COMMENT_WIDTH - len(indent) - 2
    return [f"{indent}# {line}" for line in textwrap.wrap(text, width, break_on_hyphens=False)]


def _targets(names: list[str]) -> str:
    return ", ".join(names)


def _single_specs(*spec_dicts) -> None:
    """--as-code writes one spec per input; a pytree of specs (`@NAME`) is not written out yet."""
    for specs in spec_dicts:
        for name, spec in specs.items():
            if not isinstance(spec, tuple):
                raise UsageError(
                    f"--as-code: {name}={spec} gives one spec per leaf; --as-code writes one spec per input. Give "
                    f"{name!r} a single spec to see its code, or run the cell without --as-code."
                )


def _is_leaf(value) -> bool:
    import jax

    return isinstance(value, jax.ShapeDtypeStruct)


def _describe_devices(mesh) -> str:
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


def _axes_text(mesh) -> str:
    return ", ".join(f"{n}={s}" for n, s in mesh.shape.items())


def _mesh_lines(mesh, names: _Names, var: str, intro: list[str]) -> list[str]:
    """`var = Mesh(...)`: the same devices in the same grid, the same axis names and types."""
    import jax

    jax_, np_, mesh_cls, axis_type = names.lib("jax"), names.lib("np"), names.lib("Mesh"), names.lib("AxisType")
    ids = [int(d.id) for d in mesh.devices.flat]
    every = [int(d.id) for d in jax.devices()]  # the engines' order (in a cluster: every process's devices)
    lines = [line for text in intro for line in _comment(text)]
    if ids == every:
        devices = f"{jax_}.devices()"
    elif ids == every[:len(ids)]:
        devices = f"{jax_}.devices()[:{len(ids)}]"
    else:
        by_id = names.value("device_by_id")
        lines.append(f"{by_id} = {{d.id: d for d in {jax_}.devices()}}")
        devices = f"[{by_id}[i] for i in {_tuple_text(map(str, ids))}]"
    shape = tuple(int(s) for s in mesh.devices.shape)
    grid = f"{np_}.array({devices})" + (f".reshape({', '.join(map(str, shape))})" if len(shape) > 1 else "")
    types = _tuple_text(f"{axis_type}.{t.name}" for t in mesh.axis_types)
    lines += _call(f"{var} = {mesh_cls}", [grid, _tuple_text(repr(str(n)) for n in mesh.axis_names),
                                           f"axis_types={types}"])
    return lines


def _concrete(mesh, option: str) -> None:
    import jax

    if not isinstance(mesh, jax.sharding.Mesh):
        raise UsageError(
            f"--as-code {option}: the mesh is abstract (an AbstractMesh has no devices), so there is no code that "
            f"runs on it. Build it with devices (`%mesh {_axes_text(mesh).replace(', ', ' ')}`) to get the snippet, "
            "or plan the cell with --plan."
        )


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


def _cell_lines(cell: cells.Cell, final: tuple | None, indent: str = INDENT) -> list[str]:
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
class _Returns:
    device: list[str]  # names computed on the devices, in the cell's order
    shapes: dict  # name -> its global shape (a ShapeDtypeStruct, or a tree of them)
    plain: list[str]  # names holding plain Python values (numbers, functions) the trace saw
    final: str | None  # None, "name" (the final expression is a bound name), "device" or "plain"
    final_name: str | None = None
    final_shape: object = None


def _returns(cell: cells.Cell, program, device_shapes: dict, final_shape, same_when_bound) -> _Returns:
    device = list(program.device_outputs)
    plain = list(program.static_outputs)
    kind, name = None, None
    if cell.has_final_expression and not cells.silenced(cell.source):
        traced = bool(program.final_per_device and program.final_per_device[0])
        last = cell.tree.body[-1].value
        if cell.final_is_output and last.id in device + plain and same_when_bound(last.id):
            kind, name = "name", last.id
        elif traced:
            kind = "device"
        elif program.static_final and program.static_final[0] is not None:
            kind = "plain"
    return _Returns(device, {n: device_shapes[n] for n in device}, plain, kind, name, final_shape)


def _explained(trace, cell: cells.Cell, mesh, note=None):
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


def _with_weak_types(abstract, value):
    """`abstract` (ShapeDtypeStructs) keeping the weak types of `value`'s leaves, as a real call would."""
    import jax

    return jax.tree.map(lambda s, a: jax.ShapeDtypeStruct(s.shape, s.dtype, weak_type=getattr(a, "weak_type", False)),
                        abstract, value)


def _abstract(value):
    import jax

    return jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=getattr(a, "weak_type", False)), value)


def _plain_lines(returns: _Returns, plain: str | None, result: str | None, indent: str) -> list[str]:
    """Inside the function: keep the plain Python values the trace computes (jit returns only arrays)."""
    if not returns.plain and returns.final != "plain":
        return []
    args = [f"{n}={n}" for n in returns.plain] + ([f"{result}={result}"] if returns.final == "plain" else [])
    return _call(f"{plain}.update", args, indent)


def _after_call_lines(returns: _Returns, plain: str | None, result: str | None) -> list[str]:
    lines = [f"{n} = {plain}[{n!r}]" for n in returns.plain]
    if returns.final == "plain":
        lines.append(f"{result} = {plain}[{result!r}]")
    if returns.final == "name":
        lines.append(returns.final_name)
    elif returns.final in ("device", "plain"):
        lines.append(result)
    return lines


def _plain_intro(plain: str) -> list[str]:
    return [f"{plain} = {{}}  # plain Python values the cell computes while JAX traces it (jit returns only arrays)"]


# --- %%pmap, block mode -------------------------------------------------------------------------------

def _pmap_code(options, source: str, namespace: dict, axis_name: str) -> str:
    from .pmapping import mesh_for

    cell = analyse_cached(source, "pmap-cell")
    mesh = mesh_for(axis_name, options.devices, options.mesh)
    if cell.mode == "function":
        return _pmap_function_code(cell, options, mesh, namespace)
    return _pmap_block_code(cell, options, mesh, namespace)


def _pmap_mesh_intro(mesh, options) -> list[str]:
    devices = _describe_devices(mesh)
    if options.mesh is None:
        axis = mesh.axis_names[0]
        return [f"%%pmap runs over {devices}, along one axis named {axis!r} (the name collectives use)."]
    shape = "x".join(str(s) for s in mesh.devices.shape)
    return [f"%%pmap --mesh {_axes_text(mesh).replace(' ', '')}: {devices} as a {shape} grid; collectives name "
            f"its axes."]


def _pmap_block_code(cell: cells.Cell, options, mesh, namespace: dict) -> str:
    import jax

    from .pmap_inputs import per_device_note
    from .pmapping import prepare

    broadcast, split, merge = tuple(options.broadcast), tuple(options.split), tuple(options.merge)
    # The run's own checks, in its order; the mapped inputs are checked and reshaped abstractly
    # (a --split of a real array would be a computation).
    cells.check_axis_names(cell.source, tuple(mesh.axis_names))
    trees, _ = classify(cell, namespace, {"--broadcast": broadcast, "--split": split})
    shapes = {t.name: t.rebuild([_abstract(a) for a in t.arrays(namespace[t.name])]) for t in trees}
    prepared = prepare(cell, {**namespace, **shapes}, mesh, broadcast=broadcast, split=split, merge=merge,
                       abstract=True)
    inputs = list(prepared.names)
    args = [_with_weak_types(a, t.arrays(namespace[t.name])) if t.name in split else t.arrays(namespace[t.name])
            for t, a in zip(trees, prepared.arguments)]
    program = prepared.program()
    device, final = _explained(lambda: jax.eval_shape(program.jitted, *args), cell, mesh,
                               lambda: per_device_note(cell, namespace, mesh, broadcast))
    device = program.outputs_of(device)
    final = program.final_of(final)[0] if final is not None else None
    returns = _returns(cell, program, device, final, lambda n: n not in merge)
    abstract_args = {t.name: t.rebuild(a) for t, a in zip(trees, jax.eval_shape(lambda *a: a, *args))}
    return _write_pmap_block(cell, namespace, mesh, options, inputs, abstract_args, returns)


def _write_pmap_block(cell, namespace, mesh, options, inputs, args, returns: _Returns) -> str:
    names = _Names(namespace, cell.reads, cell.writes)
    jax_, p = names.lib("jax"), names.lib("P")
    mesh_var = names.value("mesh", same=_same_mesh(mesh))
    per_device, run = names.value("per_device"), names.value("run")
    plain = names.value("plain") if returns.plain or returns.final == "plain" else None
    result = names.value("result") if returns.final in ("device", "plain") else None
    k = len(mesh.axis_names)

    body = [f'{INDENT}"""The cell\'s code: what ONE device runs."""']
    body += _pmap_slices(names, inputs, args, set(options.broadcast), k)
    body += _cell_lines(cell, _final_edit(returns, result))
    body += _plain_lines(returns, plain, result, INDENT)
    returned = returns.device + ([result] if returns.final == "device" else [])
    shapes = dict(returns.shapes, **({result: returns.final_shape} if returns.final == "device" else {}))
    body += _pmap_return(names, returned, shapes, k)

    every = _spec_text(p, tuple(mesh.axis_names))
    in_specs = _tuple_text(f"{p}()" if n in options.broadcast else every for n in inputs)
    run_lines = list(_PMAP_WHY) + _call(
        f"{run} = {jax_}.jit({jax_}.shard_map",
        [per_device, f"mesh={mesh_var}", f"in_specs={in_specs}", f"out_specs={every if returned else '()'}",
         "check_vma=False"], tail=")")
    after = _pmap_call(names, run, inputs, args, returned, returns, mesh, options)
    after += _after_call_lines(returns, plain, result)
    return _snippet(names, [
        _mesh_lines(mesh, names, mesh_var, _pmap_mesh_intro(mesh, options)),
        _plain_intro(plain) if plain else [],
        [f"def {per_device}({', '.join(inputs)}):"] + body,
        run_lines,
        after,
    ])


def _pmap_slices(names: _Names, inputs, args: dict, broadcast: set, k: int) -> list[str]:
    """The first lines of the per-device function: what each device sees of each input."""
    index = "[" + ", ".join(["0"] * k) + "]"
    axes = "axis" if k == 1 else "axes"
    lines = []
    for name in inputs:
        arg = args[name]
        if name in broadcast:
            what = _shape_text(arg.shape, arg.dtype) if _is_leaf(arg) else "value"
            lines += _comment(f"{name}: the whole {what}, on every device (--broadcast)", INDENT)
        elif _is_leaf(arg):
            block = _shape_text((1,) * k + tuple(arg.shape[k:]), arg.dtype)
            lines.append(f"{INDENT}{name} = {name}{index}  # this device's {_shape_text(arg.shape[k:], arg.dtype)} "
                         f"slice (its block, {block}, less the device {axes})")
        else:
            lines.append(f"{INDENT}{name} = {names.lib('jax')}.tree.map(lambda a: a{index}, {name})  # this device's "
                         f"slice of every leaf (its blocks less the device {axes})")
    return lines


def _pmap_return(names: _Names, returned: list[str], shapes: dict, k: int) -> list[str]:
    """`return y[None], ...`: every output with the device axes back, as pmap's outputs have them."""
    new_axes = "[" + ", ".join(["None"] * k) + "]"
    exprs = [f"{name}{new_axes}" if _is_leaf(shapes[name]) else
             f"{names.lib('jax')}.tree.map(lambda a: {names.lib('jnp')}.asarray(a){new_axes}, {name})"
             for name in returned]
    if not exprs:
        return [f"{INDENT}return ()"]
    axes = "axis" if k == 1 else "axes"
    return _comment(f"Each output gets the device {axes} back: shard_map stacks the devices' blocks along "
                    f"{'it' if k == 1 else 'them'}.", INDENT) + [f"{INDENT}return {', '.join(exprs)}"]


def _pmap_call(names: _Names, run: str, inputs, args: dict, returned, returns: _Returns, mesh, options) -> list[str]:
    """The call, with --split's reshapes going in and --merge's coming out."""
    jax_ = names.lib("jax")
    k, total = len(mesh.axis_names), int(mesh.devices.size)
    sizes = [int(s) for s in mesh.devices.shape]
    grid = " x ".join(map(str, sizes))
    call_args, lines = [], []
    for name in inputs:
        arg = args[name]
        if name not in options.split:
            call_args.append(name)
        elif _is_leaf(arg):
            call_args.append(f"{name}.reshape({', '.join(str(int(s)) for s in arg.shape)})")
            lines += _comment(f"--split {name}: its {_product(arg.shape[:k + 1])} rows become {grid} blocks of "
                              f"{int(arg.shape[k])}, one per device.")
        else:
            lead = ", ".join(map(str, sizes))
            call_args.append(f"{jax_}.tree.map(lambda a: a.reshape({lead}, a.shape[0] // {total}, *a.shape[1:]), "
                             f"{name})")
            lines += _comment(f"--split {name}: the rows of each leaf become {grid} blocks, one per device.")
    call = f"{run}({', '.join(call_args)})"
    lines.append(f"{_targets(returned)} = {call}" if returned else call)
    for name in (n for n in returns.device if n in options.merge):
        shape = returns.shapes[name]
        if _is_leaf(shape):
            rows = _product(shape.shape[:k + 1])
            merged = ", ".join(str(int(s)) for s in (rows,) + tuple(shape.shape[k + 1:]))
            block = int(shape.shape[k]) if shape.ndim > k else 1
            lines.append(f"{name} = {name}.reshape({merged})  # --merge {name}: the devices' blocks of {block} back "
                         f"into one axis of {rows}")
        else:
            lines.append(f"{name} = {jax_}.tree.map(lambda a: a.reshape(-1, *a.shape[{k + 1}:]), {name})  "
                         f"# --merge {name}: device and block axes back into one")
    return lines


def _product(sizes) -> int:
    total = 1
    for s in sizes:
        total *= int(s)
    return total


def _final_edit(returns: _Returns, result: str | None):
    if returns.final in ("device", "plain"):
        return ("assign", result)
    if returns.final == "name":
        return ("drop",)
    return None


def _snippet(names: _Names, parts: list[list[str]]) -> str:
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


# --- %%pmap, function mode ---------------------------------------------------------------------------

_PMAPPED = '''\
def {pmapped}(f, in_axes=0, out_axes=0, static_argnums=(), donate_argnums=()):
    """f on every device of {mesh}, with jax.pmap's meaning, as jax.jit(jax.shard_map(...)).

    An argument's device axis sits at its in_axes position (None: every device gets the argument
    whole, as it gets a plain Python number or a static argument); each device sees its slice
    without that axis. Each output gets the axis back at its out_axes position (None: one value).
    """
    k = len({mesh}.axis_names)

    def spec(axis):  # the device axis at position `axis`, split over all the mesh's axes
        return {P}() if axis is None else {P}(*[None] * axis, *{mesh}.axis_names)

    def drop_axis(x, axis):  # each device's block keeps the device axis, of size 1: remove it
        return x if axis is None else {jax}.tree.map(lambda a: a.reshape(a.shape[:axis] + a.shape[axis + k:]), x)

    def add_axis(x, axis):  # shard_map stacks the devices' blocks along the axis given back here
        return {jax}.tree.map(
            lambda a: {jnp}.asarray(a) if axis is None else {jnp}.expand_dims(a, tuple(range(axis, axis + k))), x)

{why}
    @{functools}.partial({jax}.jit, static_argnums=static_argnums, static_argnames="axes",
                       donate_argnums=tuple(i for i in donate_argnums if i not in static_argnums))
    def on_devices(*args, axes):
        dynamic = [i for i in range(len(args)) if i not in static_argnums]

        def per_device(*blocks):
            full = list(args)  # static arguments stay plain Python values
            for i, block in zip(dynamic, blocks):
                full[i] = drop_axis(block, axes[i])
            out = f(*full)
            if isinstance(out_axes, (tuple, list)) and isinstance(out, (tuple, list)):
                return type(out)(add_axis(o, axis) for o, axis in zip(out, out_axes))
            return add_axis(out, out_axes)

        out_specs = tuple(map(spec, out_axes)) if isinstance(out_axes, (tuple, list)) else spec(out_axes)
        return {jax}.shard_map(per_device, mesh={mesh}, in_specs=tuple(spec(axes[i]) for i in dynamic),
                             out_specs=out_specs, check_vma=False)(*(args[i] for i in dynamic))

    @{functools}.wraps(f)  # the per-device original stays at .__wrapped__
    def call(*args):
        if any(isinstance(leaf, {jax}.core.Tracer) for leaf in {jax}.tree.leaves(args)):
            return f(*args)  # called from code already traced per device (jax.grad of it, another such function)
        axes = tuple(in_axes) if isinstance(in_axes, (tuple, list)) else (in_axes,) * len(args)
        # A plain Python number has no device axis: every device gets it (jax.pmap would refuse it).
        axes = tuple(None if isinstance(a, (bool, int, float, complex)) else axis for a, axis in zip(args, axes))
        return on_devices(*args, axes=axes)

    return call'''


def _function_mode_names(cell: cells.Cell) -> tuple[set, set]:
    """Names a function-mode cell reads (globals its functions use) and binds (functions, imports)."""
    reads, writes = set(), set(cell.functions)
    for stmt in cell.tree.body:
        found = cells.StatementNames()
        found.visit(stmt)
        reads.update(found.loads)
        if not isinstance(stmt, (ast.Import, ast.ImportFrom)):
            writes.update(found.stores)
            continue
        for alias, name in zip(stmt.names, found.stores):
            if not _imports_same(stmt, alias, name):
                writes.add(name)
    return reads, writes


def _imports_same(stmt, alias, name: str) -> bool:
    """`import jax` in the cell binds the very module the snippet imports: not a clash."""
    if isinstance(stmt, ast.Import):
        module = alias.name if alias.asname else alias.name.split(".")[0]
        obj = sys.modules.get(module)
    else:
        module = sys.modules.get(stmt.module or "") if not stmt.level else None
        obj = getattr(module, alias.name, None) if module is not None else None
    return obj is not None and name in _LIBRARIES and obj is _library_object(name)


def _pmap_function_code(cell: cells.Cell, options, mesh, namespace: dict) -> str:
    reads, writes = _function_mode_names(cell)
    names = _Names(namespace, reads, writes)
    mesh_var = names.value("mesh", same=_same_mesh(mesh))
    pmapped = names.value("pmapped")
    helper = _PMAPPED.format(
        pmapped=pmapped, mesh=mesh_var, P=names.lib("P"), jax=names.lib("jax"), jnp=names.lib("jnp"),
        functools=names.lib("functools"), why="\n".join(INDENT + line for line in _PMAP_WHY))
    options_text = []
    for label, value, default in (("in_axes", options.in_axes, 0), ("out_axes", options.out_axes, 0),
                                  ("static_argnums", options.static_broadcasted_argnums, ()),
                                  ("donate_argnums", options.donate_argnums, ())):
        if label.endswith("argnums") and isinstance(value, int):
            value = (value,)
        if value != default:
            options_text.append(f"{label}={value!r}")
    binds = [f"{name} = {pmapped}({', '.join([name] + options_text)})" for name in cell.functions]
    mesh_lines = _mesh_lines(mesh, names, mesh_var, _pmap_mesh_intro(mesh, options))
    cell_lines = ["# The cell, unchanged: each function is what ONE device runs."] + _cell_lines(cell, None, indent="")
    return _snippet(names, [mesh_lines, cell_lines, helper.split("\n"),
                  ["# %%pmap binds each function as its parallel version."] + binds])


# --- %%shard -----------------------------------------------------------------------------------------

def _shard_code(options, source: str, namespace: dict) -> str:
    import jax

    from .shard import check_cell, prepare, resolve_mesh

    in_specs, out_specs = dict(options.in_specs), dict(options.out_specs)
    cell = analyse_cached(source, "shard-cell")
    check_cell(cell)
    mesh = resolve_mesh(options.mesh, namespace, [in_specs, out_specs])
    _concrete(mesh, "%%shard")
    _single_specs(in_specs, out_specs)
    # The checks `place` makes, without placing anything: --in inputs are described, not moved.
    prepared = prepare(cell, namespace, mesh, in_specs, out_specs, describe=True, abstract=False)
    inputs, constrained = list(prepared.names), prepared.out_specs
    placed = {t.name: specs[0] for t, specs in zip(prepared.inputs, prepared.leaf_specs) if t.name in in_specs}
    program, args = prepared.program(), prepared.arguments

    def trace():
        with jax.set_mesh(mesh):
            return jax.eval_shape(program.jitted, *args)

    device, final = _explained(trace, cell, mesh)[:2]
    device = program.outputs_of(device)
    final = program.final_of(final)[0] if final is not None else None
    returns = _returns(cell, program, device, final, lambda n: n not in constrained)
    return _write_shard(cell, namespace, mesh, options, inputs, placed, constrained, returns)


def _shard_mesh_intro(mesh, mesh_arg, specs: list[dict]) -> tuple[str, list[str]]:
    """The mesh variable's preferred name and the comment that says where the mesh comes from."""
    devices = _describe_devices(mesh)
    counted = [(n, e) for d in specs for n, spec in d.items() for e in spec if isinstance(e, int)]
    if counted:
        name, count = counted[0]
        return "mesh", [f"{name}={count} splits over {count} devices: a 1-D mesh of {devices}, its one axis named "
                        f"{mesh.axis_names[0]!r}."]
    if mesh_arg is None or (isinstance(mesh_arg, str) and "=" not in mesh_arg):
        name = mesh_arg or "mesh"
        return name, [f"Your mesh `{name}` ({_axes_text(mesh)}: {devices}), rebuilt from its devices so that this "
                      f"code stands alone."]
    return "mesh", [f"--mesh {_axes_text(mesh).replace(' ', '')}: {devices}."]


def _write_shard(cell, namespace, mesh, options, inputs, placed, constrained, returns: _Returns) -> str:
    names = _Names(namespace, cell.reads, cell.writes)
    jax_, p, named = names.lib("jax"), names.lib("P"), names.lib("NamedSharding")
    want, intro = _shard_mesh_intro(mesh, options.mesh, [options.in_specs, options.out_specs])
    mesh_var = names.value(want, same=_same_mesh(mesh))
    run = names.value("run")
    plain = names.value("plain") if returns.plain or returns.final == "plain" else None
    result = names.value("result") if returns.final in ("device", "plain") else None

    place_lines = []
    if placed:
        place_lines = _comment("--in: each input placed on the mesh by its spec. %%shard rebinds the name to the "
                               "placed array, so a second run moves no data.")
        place_lines += [f"{n} = {jax_}.device_put({n}, {named}({mesh_var}, {_spec_text(p, s)}))"
                        for n, s in placed.items()]

    body = [f'{INDENT}"""The cell\'s code, unchanged: jit partitions it by the layouts of its inputs."""']
    body += _cell_lines(cell, _final_edit(returns, result))
    for name, spec in constrained.items():
        body.append(f"{INDENT}{name} = {jax_}.lax.with_sharding_constraint({name}, {named}({mesh_var}, "
                    f"{_spec_text(p, spec)}))  # --out {name}")
    body += _plain_lines(returns, plain, result, INDENT)
    returned = returns.device + ([result] if returns.final == "device" else [])
    body.append(f"{INDENT}return {', '.join(returned) if returned else '()'}")

    call = f"{run}({', '.join(inputs)})"
    after = [f"with {jax_}.set_mesh({mesh_var}):  # as %%shard runs it: the mesh is set while jit traces the cell",
             INDENT + (f"{_targets(returned)} = {call}" if returned else call)]
    after += _after_call_lines(returns, plain, result)
    mesh_lines = _mesh_lines(mesh, names, mesh_var, intro)
    function = [f"@{jax_}.jit", f"def {run}({', '.join(inputs)}):"] + body
    return _snippet(names, [mesh_lines, place_lines, _plain_intro(plain) if plain else [], function, after])


# --- %%shard_map -------------------------------------------------------------------------------------

def _shard_map_code(options, source: str, namespace: dict) -> str:
    import jax

    from .shard import resolve_mesh
    from .shardmap import check_cell, prepare

    in_specs, out_specs = dict(options.in_specs), dict(options.out_specs)
    cell = analyse_cached(source, "shard_map-cell")
    check_cell(cell, in_specs, out_specs)
    mesh = resolve_mesh(options.mesh, namespace, [in_specs, out_specs])
    _concrete(mesh, "%%shard_map")
    _single_specs(in_specs, out_specs)
    prepared = prepare(cell, namespace, mesh, in_specs, out_specs, check_vma=options.check_vma)
    inputs = list(prepared.names)
    program = _explained(prepared.program, cell, mesh)
    chosen = program.assembled
    args = [[_abstract(a) for a in leaves] for leaves in prepared.arguments]

    def trace():
        with jax.set_mesh(mesh):
            return jax.eval_shape(program.jitted, *args)

    device, final = _explained(trace, cell, mesh)[:2]
    device = program.outputs_of(device)
    final = program.final_of(final)[0] if final is not None else None
    specs = [s[0] if s else () for s in prepared.leaf_specs]  # one spec per input (as-code takes no spec trees)
    returns = _returns(cell, program, device, final, lambda n: chosen.get(n, ()) == ())
    return _write_shard_map(cell, namespace, mesh, options, inputs, dict(zip(inputs, specs)), chosen, returns)


def _untiling(name: str, spec: tuple, mesh, given: bool, check_vma: bool) -> str:
    """How shard_map assembles an output from its blocks, in words."""
    from .layout import spec_axes

    used = [a for axes in spec_axes(spec, len(spec)) for a in axes]
    along = [f"dimension {d} over {' x '.join(repr(a) for a in axes)}"
             for d, axes in enumerate(spec_axes(spec, len(spec))) if axes]
    left = [repr(a) for a in mesh.axis_names if a not in used]
    if not given:
        return (f"{name}: no --out; JAX's varying-axes typing proves it is the same on every device, so P() "
                f"keeps one copy.")
    text = f"{name}: blocks joined along {', '.join(along)}" if along else f"{name}: one block"
    if left:
        copies = ("the devices hold copies and one is kept" if check_vma else
                  "one device's block is kept (check_vma off: nothing checks that the copies agree)")
        text += f"; along {', '.join(left)} {copies}"
    return text + "."


def _write_shard_map(cell, namespace, mesh, options, inputs, in_specs, chosen, returns: _Returns) -> str:
    from .shardmap import is_explicit

    names = _Names(namespace, cell.reads, cell.writes)
    jax_, p = names.lib("jax"), names.lib("P")
    want, intro = _shard_mesh_intro(mesh, options.mesh, [])
    mesh_var = names.value(want, same=_same_mesh(mesh))
    per_device, run = names.value("per_device"), names.value("run")
    plain = names.value("plain") if returns.plain or returns.final == "plain" else None
    result = names.value("result") if returns.final in ("device", "plain") else None
    sizes = {str(n): int(s) for n, s in mesh.shape.items()}

    body = [f'{INDENT}"""The cell\'s code: what each device runs, on its own blocks."""']
    for name in inputs:
        spec = in_specs[name]
        value = namespace[name]
        if not spec:
            what = _shape_text(value.shape, value.dtype) if hasattr(value, "shape") else "value"
            text = f"{name}: the whole {what} on every device (not in --in: replicated, P())"
        elif hasattr(value, "shape"):
            block = _block_shape(value.shape, spec, sizes)
            text = (f"{name}: this device's {_shape_text(block, value.dtype)} block of the "
                    f"{_shape_text(value.shape, value.dtype)} {name}, split by {_spec_text('P', spec)}")
        else:
            text = f"{name}: this device's block of every leaf, split by {_spec_text('P', spec)}"
        body += _comment(text, INDENT)
    body += _cell_lines(cell, _final_edit(returns, result))
    body += _plain_lines(returns, plain, result, INDENT)
    returned = returns.device + ([result] if returns.final == "device" else [])
    body.append(f"{INDENT}return {', '.join(returned) if returned else '()'}")

    out_specs = [_spec_text(p, chosen[n]) for n in returns.device] + ([f"{p}()"] if returns.final == "device" else [])
    notes = [_untiling(n, chosen[n], mesh, n in options.out_specs, options.check_vma) for n in returns.device]
    if returns.final == "device":
        notes.append(f"{result}: the final expression, proven the same on every device: P().")
    out_text = out_specs[0] if len(out_specs) == 1 else _tuple_text(out_specs)
    in_text = _tuple_text(_spec_text(p, in_specs[n]) for n in inputs)
    vma = [] if options.check_vma else ["check_vma=False"]
    map_args = [per_device, f"mesh={mesh_var}", f"in_specs={in_text}", f"out_specs={out_text}"] + vma
    if is_explicit(mesh):
        mapped = names.value("mapped")
        resharded = [f"{jax_}.reshard({n}, {_spec_text(p, in_specs[n])})" for n in inputs]
        notes = [line for note in notes for line in _comment(note)]
        run_lines = notes + _call(f"{mapped} = {jax_}.shard_map", map_args) + [
            "", "", f"@{jax_}.jit", f"def {run}({', '.join(inputs)}):",
            f"{INDENT}# The mesh's axes are Explicit: shard_map takes each input laid out by its in_spec already.",
            f"{INDENT}return {mapped}({', '.join(resharded)})"]
    else:
        run_lines = [line for note in notes for line in _comment(note)] + _call(
            f"{run} = {jax_}.jit({jax_}.shard_map", map_args, tail=")")
    call = f"{run}({', '.join(inputs)})"
    after = [f"with {jax_}.set_mesh({mesh_var}):  # as %%shard_map runs it",
             INDENT + (f"{_targets(returned)} = {call}" if returned else call)]
    after += _after_call_lines(returns, plain, result)
    mesh_lines = _mesh_lines(mesh, names, mesh_var, intro)
    function = [f"def {per_device}({', '.join(inputs)}):"] + body
    return _snippet(names, [mesh_lines, _plain_intro(plain) if plain else [], function, run_lines, after])


def _block_shape(shape, spec, sizes: dict) -> tuple:
    from .layout import spec_axes

    block = []
    for n, axes in zip(shape, spec_axes(spec, len(shape))):
        count = 1
        for a in axes:
            count *= sizes[a]
        block.append(int(n) // count)
    return tuple(block)
