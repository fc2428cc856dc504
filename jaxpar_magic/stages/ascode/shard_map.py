"""`--as-code` for `%%shard_map`: the `jax.jit(jax.shard_map(...))` a cell stands for, with what each
device sees of each input and how each output is assembled from the devices' blocks.
"""
from __future__ import annotations

from ...cell.programs import analyse_cached
from .common import INDENT, SnippetNames, TracedReturns, abstract_of, after_call_lines, call_lines, cell_body, check_concrete, check_single_specs, comment_lines, explained_trace, final_edit, laid_out_again, mesh_definition, plain_intro, plain_lines, same_mesh, shape_text, shard_mesh_intro, snippet, spec_text, targets_text, traced_returns, tuple_text
from .libraries import arrays_only, check_plain_outputs


# --- %%shard_map -------------------------------------------------------------------------------------

def shard_map_code(options, source: str, namespace: dict, kinds: dict | None = None) -> str:
    from ...engines.shard import resolve_mesh
    from ...engines.shard_map import check_cell, prepare

    in_specs, out_specs = dict(options.in_specs), dict(options.out_specs)
    cell = analyse_cached(source, "shard_map-cell")
    check_cell(cell, in_specs, out_specs)
    mesh = resolve_mesh(options.mesh, namespace, [in_specs, out_specs])
    check_concrete(mesh, "%%shard_map")
    check_single_specs(in_specs, out_specs)
    prepared = prepare(cell, namespace, mesh, in_specs, out_specs, check_vma=options.check_vma,
                       outputs=options.outputs)
    inputs = list(prepared.names)
    program = explained_trace(prepared.program, cell, mesh)
    chosen = program.assembled
    args = [[abstract_of(a) for a in leaves] for leaves in prepared.arguments]
    specs = [s[0] if s else () for s in prepared.leaf_specs]  # one spec per input (as-code takes no spec trees)
    returns = traced_returns(program, args, cell, mesh, lambda n: chosen.get(n, ()) == ())
    check_plain_outputs(returns, "shard_map")
    return _write_shard_map(cell, namespace, mesh, options, inputs, dict(zip(inputs, specs)), chosen, returns,
                            kinds or {}, prepared.moved)


def _untiling(name: str, spec: tuple, mesh, given: bool, check_vma: bool) -> str:
    """How shard_map assembles an output from its blocks, in words."""
    from ...cell.layout import spec_axes

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


def _write_shard_map(cell, namespace, mesh, options, inputs, in_specs, chosen, returns: TracedReturns,
                     kinds: dict, moved: list) -> str:
    from ...cell.meshes import is_explicit

    names = SnippetNames(namespace, cell.reads, cell.writes)
    jax_, p = names.lib("jax"), names.lib("P")
    want, intro = shard_mesh_intro(mesh, options.mesh, [])
    mesh_var = names.value(want, same=same_mesh(mesh))
    per_device, run = names.value("per_device"), names.value("run")
    plain = names.value("plain") if returns.plain or returns.final == "plain" else None
    result = names.value("result") if returns.final in ("device", "plain") else None
    sizes = {str(n): int(s) for n, s in mesh.shape.items()}
    split = arrays_only(names, kinds, inputs)  # NNX objects and Equinox modules: only their arrays cross

    body = [f'{INDENT}"""The cell\'s code: what each device runs, on its own blocks."""']
    for name in inputs:
        spec = in_specs[name]
        value = namespace[name]
        if not spec:
            what = shape_text(value.shape, value.dtype) if hasattr(value, "shape") else "value"
            text = f"{name}: the whole {what} on every device (not in --in: replicated, P())"
        elif hasattr(value, "shape"):
            block = _block_shape(value.shape, spec, sizes)
            text = (f"{name}: this device's {shape_text(block, value.dtype)} block of the "
                    f"{shape_text(value.shape, value.dtype)} {name}, split by {spec_text('P', spec)}")
        else:
            text = f"{name}: this device's block of every leaf, split by {spec_text('P', spec)}"
        body += comment_lines(text, INDENT)
    body += split.inside
    body += cell_body(cell, final_edit(returns, result))
    body += plain_lines(returns, plain, result, INDENT)
    returned = returns.device + ([result] if returns.final == "device" else [])
    body.append(f"{INDENT}return {', '.join(returned) if returned else '()'}")

    out_specs = [spec_text(p, chosen[n]) for n in returns.device] + ([f"{p}()"] if returns.final == "device" else [])
    notes = [_untiling(n, chosen[n], mesh, n in options.out_specs, options.check_vma) for n in returns.device]
    if returns.final == "device":
        notes.append(f"{result}: the final expression, proven the same on every device: P().")
    out_text = out_specs[0] if len(out_specs) == 1 else tuple_text(out_specs)
    in_text = tuple_text(spec_text(p, in_specs[n]) for n in inputs)
    arguments = dict(zip(inputs, split.arguments))  # the name each input crosses into the program under
    vma = [] if options.check_vma else ["check_vma=False"]
    map_args = [per_device, f"mesh={mesh_var}", f"in_specs={in_text}", f"out_specs={out_text}"] + vma
    if is_explicit(mesh):
        mapped = names.value("mapped")
        resharded = [f"{jax_}.reshard({arguments[n]}, {spec_text(p, in_specs[n])})" for n in inputs]
        notes = [line for note in notes for line in comment_lines(note)]
        run_lines = notes + call_lines(f"{mapped} = {jax_}.shard_map", map_args) + [
            "", "", f"@{jax_}.jit", f"def {run}({', '.join(split.arguments)}):",
            f"{INDENT}# The mesh's axes are Explicit: shard_map takes each input laid out by its in_spec already.",
            f"{INDENT}return {mapped}({', '.join(resharded)})"]
    else:
        run_lines = [line for note in notes for line in comment_lines(note)] + call_lines(
            f"{run} = {jax_}.jit({jax_}.shard_map", map_args, tail=")")
    call_args, notes = laid_out_again(names, arguments, moved, mesh_var)
    call = f"{run}({', '.join(call_args)})"
    after = notes + [f"with {jax_}.set_mesh({mesh_var}):  # as %%shard_map runs it",
             INDENT + (f"{targets_text(returned)} = {call}" if returned else call)]
    after += after_call_lines(returns, plain, result)
    mesh_lines = mesh_definition(mesh, names, mesh_var, intro)
    function = [f"def {per_device}({', '.join(split.arguments)}):"] + body
    return snippet(names, [mesh_lines, split.before, plain_intro(plain) if plain else [], function, run_lines,
                           after])


def _block_shape(shape, spec, sizes: dict) -> tuple:
    from ...cell.layout import spec_axes

    block = []
    for n, axes in zip(shape, spec_axes(spec, len(shape))):
        count = 1
        for a in axes:
            count *= sizes[a]
        block.append(int(n) // count)
    return tuple(block)
