"""`--as-code` for `%%pmap`: the jax.jit(jax.shard_map(...)) a block-mode cell stands for (what one
device runs, the --split / --merge reshapes around the call), and for a function-mode cell the
`pmapped` helper that gives each function jax.pmap's meaning.
"""
from __future__ import annotations

import ast
import sys

from ...cell import analysis as cells
from ...cell.inputs import classify, input_arrays, rebuilt
from ...cell.programs import analyse_cached
from .common import INDENT, SnippetNames, TracedReturns, abstract_of, after_call_lines, axes_text, call_lines, cell_body, comment_lines, describe_devices, final_edit, is_leaf, is_snippet_library, mesh_definition, plain_intro, plain_lines, same_mesh, shape_text, snippet, spec_text, targets_text, traced_returns, tuple_text, with_weak_types
from .libraries import arrays_only, check_plain_outputs


_PMAP_WHY = ("jax.pmap itself is jax.jit(jax.shard_map(...)) since JAX 0.8. check_vma=False is pmap's own setting on "
             "JAX 0.10: with the checks on, the gradient of a replicated input is summed over the devices on its "
             "own, and a following lax.pmean makes it N times too large.")


def pmap_code(options, source: str, namespace: dict, axis_name: str, kinds: dict | None = None) -> str:
    from ...engines.pmap import mesh_for

    cell = analyse_cached(source, "pmap-cell")
    mesh = mesh_for(axis_name, options.devices, options.mesh)
    if cell.mode == "function":
        return _pmap_function_code(cell, options, mesh, namespace)
    return _pmap_block_code(cell, options, mesh, namespace, kinds or {})


def _pmap_mesh_intro(mesh, options) -> list[str]:
    devices = describe_devices(mesh)
    if options.mesh is None:
        axis = mesh.axis_names[0]
        return [f"%%pmap runs over {devices}, along one axis named {axis!r} (the name collectives use)."]
    shape = "x".join(str(s) for s in mesh.devices.shape)
    return [f"%%pmap --mesh {axes_text(mesh).replace(' ', '')}: {devices} as a {shape} grid; collectives name "
            f"its axes."]


def _pmap_block_code(cell: cells.Cell, options, mesh, namespace: dict, kinds: dict) -> str:
    import jax

    from ...engines.pmap_inputs import per_device_note
    from ...engines.pmap import prepare

    broadcast, split, merge = tuple(options.broadcast), tuple(options.split), tuple(options.merge)
    # The run's own checks, in its order; the mapped inputs are checked and reshaped abstractly
    # (a --split of a real array would be a computation).
    cells.check_axis_names(cell.source, tuple(mesh.axis_names))
    trees, _ = classify(cell, namespace, {"--broadcast": broadcast, "--split": split})
    leaves = input_arrays(trees, namespace)  # (NNX objects split together, as the run splits them)
    shapes = dict(zip((t.name for t in trees), rebuilt(trees, [[abstract_of(a) for a in arrays] for arrays in leaves])))
    prepared = prepare(cell, {**namespace, **shapes}, mesh, broadcast=broadcast, split=split, merge=merge,
                       abstract=True)
    inputs = list(prepared.names)
    args = [with_weak_types(a, arrays) if t.name in split else arrays
            for t, a, arrays in zip(trees, prepared.arguments, leaves)]
    program = prepared.program()
    returns = traced_returns(program, args, cell, mesh, lambda n: n not in merge, set_mesh=False,
                             note=lambda: per_device_note(cell, namespace, mesh, broadcast))
    check_plain_outputs(returns, "pmap")
    abstract_args = dict(zip((t.name for t in trees), rebuilt(trees, jax.eval_shape(lambda *a: a, *args))))
    return _write_pmap_block(cell, namespace, mesh, options, inputs, abstract_args, returns, kinds)


def _write_pmap_block(cell, namespace, mesh, options, inputs, args, returns: TracedReturns, kinds: dict) -> str:
    names = SnippetNames(namespace, cell.reads, cell.writes)
    jax_, p = names.lib("jax"), names.lib("P")
    mesh_var = names.value("mesh", same=same_mesh(mesh))
    per_device, run = names.value("per_device"), names.value("run")
    plain = names.value("plain") if returns.plain or returns.final == "plain" else None
    result = names.value("result") if returns.final in ("device", "plain") else None
    k = len(mesh.axis_names)
    split = arrays_only(names, kinds, inputs)  # NNX objects and Equinox modules: only their arrays cross
    arguments = dict(zip(inputs, split.arguments))

    body = [f'{INDENT}"""The cell\'s code: what ONE device runs."""']
    body += _pmap_slices(names, inputs, args, set(options.broadcast), k, arguments)
    body += split.inside
    body += cell_body(cell, final_edit(returns, result))
    body += plain_lines(returns, plain, result, INDENT)
    returned = returns.device + ([result] if returns.final == "device" else [])
    shapes = dict(returns.shapes, **({result: returns.final_shape} if returns.final == "device" else {}))
    body += _pmap_return(names, returned, shapes, k)

    every = spec_text(p, tuple(mesh.axis_names))
    in_specs = tuple_text(f"{p}()" if n in options.broadcast else every for n in inputs)
    run_lines = comment_lines(_PMAP_WHY) + call_lines(
        f"{run} = {jax_}.jit({jax_}.shard_map",
        [per_device, f"mesh={mesh_var}", f"in_specs={in_specs}", f"out_specs={every if returned else '()'}",
         "check_vma=False"], tail=")")
    after = _pmap_call(names, run, inputs, args, returned, returns, mesh, mesh_var, options, arguments)
    after += after_call_lines(returns, plain, result)
    return snippet(names, [
        mesh_definition(mesh, names, mesh_var, _pmap_mesh_intro(mesh, options)),
        split.before,
        plain_intro(plain) if plain else [],
        [f"def {per_device}({', '.join(split.arguments)}):"] + body,
        run_lines,
        after,
    ])


def _pmap_slices(names: SnippetNames, inputs, args: dict, broadcast: set, k: int, arguments: dict) -> list[str]:
    """The first lines of the per-device function: what each device sees of each input (`arguments`:
    the name each input crosses into the program under, an NNX object's state for instance)."""
    index = "[" + ", ".join(["0"] * k) + "]"
    axes = "axis" if k == 1 else "axes"
    lines = []
    for original in inputs:
        arg, name = args[original], arguments[original]
        if original in broadcast:
            what = shape_text(arg.shape, arg.dtype) if is_leaf(arg) else "value"
            lines += comment_lines(f"{name}: the whole {what}, on every device (--broadcast)", INDENT)
        elif is_leaf(arg):
            block = shape_text((1,) * k + tuple(arg.shape[k:]), arg.dtype)
            lines.append(f"{INDENT}{name} = {name}{index}  # this device's {shape_text(arg.shape[k:], arg.dtype)} "
                         f"slice (its block, {block}, less the device {axes})")
        else:
            lines.append(f"{INDENT}{name} = {names.lib('jax')}.tree.map(lambda a: a{index}, {name})  # this device's "
                         f"slice of every leaf (its blocks less the device {axes})")
    return lines


def _pmap_return(names: SnippetNames, returned: list[str], shapes: dict, k: int) -> list[str]:
    """`return y[None], ...`: every output with the device axes back, as pmap's outputs have them."""
    new_axes = "[" + ", ".join(["None"] * k) + "]"
    exprs = [f"{name}{new_axes}" if is_leaf(shapes[name]) else
             f"{names.lib('jax')}.tree.map(lambda a: {names.lib('jnp')}.asarray(a){new_axes}, {name})"
             for name in returned]
    if not exprs:
        return [f"{INDENT}return ()"]
    axes = "axis" if k == 1 else "axes"
    return comment_lines(f"Each output gets the device {axes} back: shard_map stacks the devices' blocks along "
                    f"{'it' if k == 1 else 'them'}.", INDENT) + [f"{INDENT}return {', '.join(exprs)}"]


def _pmap_call(names: SnippetNames, run: str, inputs, args: dict, returned, returns: TracedReturns, mesh,
               mesh_var: str, options, arguments: dict) -> list[str]:
    """The call, with --split's reshapes going in and --merge's coming out."""
    jax_ = names.lib("jax")
    k, total = len(mesh.axis_names), int(mesh.devices.size)
    sizes = [int(s) for s in mesh.devices.shape]
    grid = " x ".join(map(str, sizes))
    call_args, lines = [], []
    for original in inputs:
        arg, name = args[original], arguments[original]
        if original not in options.split:
            call_args.append(name)
        elif is_leaf(arg):
            call_args.append(f"{name}.reshape({', '.join(str(int(s)) for s in arg.shape)})")
            lines += comment_lines(f"--split {name}: its {_product(arg.shape[:k + 1])} rows become {grid} blocks of "
                              f"{int(arg.shape[k])}, one per device.")
        else:
            lead = ", ".join(map(str, sizes))
            call_args.append(f"{jax_}.tree.map(lambda a: a.reshape({lead}, a.shape[0] // {total}, *a.shape[1:]), "
                             f"{name})")
            lines += comment_lines(f"--split {name}: the rows of each leaf become {grid} blocks, one per device.")
    call = f"{run}({', '.join(call_args)})"
    lines.append(f"with {jax_}.set_mesh({mesh_var}):  # the cell's own mesh, whatever mesh is set globally")
    lines.append(INDENT + (f"{targets_text(returned)} = {call}" if returned else call))
    for name in (n for n in returns.device if n in options.merge):
        shape = returns.shapes[name]
        if is_leaf(shape):
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
        with {jax}.set_mesh({mesh}):  # the function's own mesh, whatever mesh is set globally
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
    return obj is not None and is_snippet_library(name, obj)


def _pmap_function_code(cell: cells.Cell, options, mesh, namespace: dict) -> str:
    reads, writes = _function_mode_names(cell)
    names = SnippetNames(namespace, reads, writes)
    mesh_var = names.value("mesh", same=same_mesh(mesh))
    pmapped = names.value("pmapped")
    helper = _PMAPPED.format(
        pmapped=pmapped, mesh=mesh_var, P=names.lib("P"), jax=names.lib("jax"), jnp=names.lib("jnp"),
        functools=names.lib("functools"), why="\n".join(comment_lines(_PMAP_WHY, INDENT)))
    options_text = []
    for label, value, default in (("in_axes", options.in_axes, 0), ("out_axes", options.out_axes, 0),
                                  ("static_argnums", options.static_broadcasted_argnums, ()),
                                  ("donate_argnums", options.donate_argnums, ())):
        if label.endswith("argnums") and isinstance(value, int):
            value = (value,)
        if value != default:
            options_text.append(f"{label}={value!r}")
    binds = [f"{name} = {pmapped}({', '.join([name] + options_text)})" for name in cell.functions]
    mesh_lines = mesh_definition(mesh, names, mesh_var, _pmap_mesh_intro(mesh, options))
    cell_lines = ["# The cell, unchanged: each function is what ONE device runs."] + cell_body(cell, None, indent="")
    return snippet(names, [mesh_lines, cell_lines, helper.split("\n"),
                  ["# %%pmap binds each function as its parallel version."] + binds])
