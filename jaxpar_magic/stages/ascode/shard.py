"""`--as-code` for `%%shard`: the `jax.jit` a cell stands for (`nnx.jit` or `eqx.filter_jit` when it
reads a Flax NNX object or an Equinox module), its --in inputs placed with `jax.device_put`, its
--out outputs laid out (`jax.reshard` on Explicit axes, `with_sharding_constraint` on Auto ones) and
its --donate inputs as `donate_argnums`.
"""
from __future__ import annotations

from ...cell.programs import analyse_cached
from .common import INDENT, SnippetNames, TracedReturns, after_call_lines, cell_body, check_concrete, check_single_specs, comment_lines, final_edit, laid_out_again, mesh_definition, plain_intro, plain_lines, same_mesh, shard_mesh_intro, snippet, spec_text, targets_text, traced_returns
from .libraries import jit_decorator, place_line


# --- %%shard -----------------------------------------------------------------------------------------

def shard_code(options, source: str, namespace: dict, kinds: dict | None = None) -> str:
    from ...cell.programs import is_write_back
    from ...engines.shard import check_cell, prepare, resolve_mesh

    in_specs, out_specs = dict(options.in_specs), dict(options.out_specs)
    cell = analyse_cached(source, "shard-cell")
    check_cell(cell)
    mesh = resolve_mesh(options.mesh, namespace, [in_specs, out_specs])
    check_concrete(mesh, "%%shard")
    check_single_specs(in_specs, out_specs)
    # The checks `place` makes, without placing anything: --in inputs are described, not moved.
    prepared = prepare(cell, namespace, mesh, in_specs, out_specs, describe=True, abstract=False,
                       outputs=options.outputs, donate=options.donate)
    inputs, constrained = list(prepared.names), prepared.out_specs
    placed = {t.name: specs[0] for t, specs in zip(prepared.inputs, prepared.leaf_specs) if t.name in in_specs}
    program, args = prepared.program(), prepared.arguments
    returns = traced_returns(program, args, cell, mesh, lambda n: n not in constrained)
    # An NNX object the cell changes: nnx.jit writes its new state back, as %%shard does; not returned.
    returns.device = [n for n in returns.device if not is_write_back(n)]
    return _write_shard(cell, namespace, mesh, options, inputs, placed, constrained, returns, kinds or {},
                        prepared.moved)


def _write_shard(cell, namespace, mesh, options, inputs, placed, constrained, returns: TracedReturns,
                 kinds: dict, moved: list) -> str:
    from ...cell.meshes import is_explicit

    names = SnippetNames(namespace, cell.reads, cell.writes)
    jax_, p, named = names.lib("jax"), names.lib("P"), names.lib("NamedSharding")
    want, intro = shard_mesh_intro(mesh, options.mesh, [options.in_specs, options.out_specs])
    mesh_var = names.value(want, same=same_mesh(mesh))
    run = names.value("run")
    plain = names.value("plain") if returns.plain or returns.final == "plain" else None
    result = names.value("result") if returns.final in ("device", "plain") else None

    place_lines = []
    if placed:
        place_lines = comment_lines("--in: each input placed on the mesh by its spec. %%shard rebinds the name to the "
                               "placed array, so a second run moves no data.")
        place_lines += [place_line(names, kinds.get(n), n, f"{named}({mesh_var}, {spec_text(p, s)})")
                        for n, s in placed.items()]

    body = [f'{INDENT}"""The cell\'s code, unchanged: jit partitions it by the layouts of its inputs."""']
    body += cell_body(cell, final_edit(returns, result))
    # On Explicit axes a layout is part of the type: --out reshards (with_sharding_constraint only asserts there).
    constrain = f"{jax_}.reshard" if is_explicit(mesh) else f"{jax_}.lax.with_sharding_constraint"
    for name, spec in constrained.items():
        body.append(f"{INDENT}{name} = {constrain}({name}, {named}({mesh_var}, {spec_text(p, spec)}))  # --out {name}")
    body += plain_lines(returns, plain, result, INDENT)
    returned = returns.device + ([result] if returns.final == "device" else [])
    body.append(f"{INDENT}return {', '.join(returned) if returned else '()'}")

    call_args, notes = laid_out_again(names, {n: n for n in inputs}, moved, mesh_var)
    call = f"{run}({', '.join(call_args)})"
    after = notes + [f"with {jax_}.set_mesh({mesh_var}):  # as %%shard runs it: the mesh is set while jit traces "
                     f"the cell", INDENT + (f"{targets_text(returned)} = {call}" if returned else call)]
    after += after_call_lines(returns, plain, result)
    mesh_lines = mesh_definition(mesh, names, mesh_var, intro)
    function = [jit_decorator(names, kinds, inputs, options.donate), f"def {run}({', '.join(inputs)}):"] + body
    return snippet(names, [mesh_lines, place_lines, plain_intro(plain) if plain else [], function, after])
