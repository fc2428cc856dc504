"""`--as-code` for `%%shard`: the `jax.jit` a cell stands for, its --in inputs placed with
`jax.device_put` and its --out outputs constrained with `with_sharding_constraint`.
"""
from __future__ import annotations

from ...cell.programs import analyse_cached
from .common import INDENT, SnippetNames, TracedReturns, after_call_lines, cell_body, check_concrete, check_single_specs, comment_lines, final_edit, mesh_definition, plain_intro, plain_lines, same_mesh, shard_mesh_intro, snippet, spec_text, targets_text, traced_returns


# --- %%shard -----------------------------------------------------------------------------------------

def shard_code(options, source: str, namespace: dict) -> str:
    from ...engines.shard import check_cell, prepare, resolve_mesh

    in_specs, out_specs = dict(options.in_specs), dict(options.out_specs)
    cell = analyse_cached(source, "shard-cell")
    check_cell(cell)
    mesh = resolve_mesh(options.mesh, namespace, [in_specs, out_specs])
    check_concrete(mesh, "%%shard")
    check_single_specs(in_specs, out_specs)
    # The checks `place` makes, without placing anything: --in inputs are described, not moved.
    prepared = prepare(cell, namespace, mesh, in_specs, out_specs, describe=True, abstract=False)
    inputs, constrained = list(prepared.names), prepared.out_specs
    placed = {t.name: specs[0] for t, specs in zip(prepared.inputs, prepared.leaf_specs) if t.name in in_specs}
    program, args = prepared.program(), prepared.arguments
    returns = traced_returns(program, args, cell, mesh, lambda n: n not in constrained)
    return _write_shard(cell, namespace, mesh, options, inputs, placed, constrained, returns)


def _write_shard(cell, namespace, mesh, options, inputs, placed, constrained, returns: TracedReturns) -> str:
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
        place_lines += [f"{n} = {jax_}.device_put({n}, {named}({mesh_var}, {spec_text(p, s)}))"
                        for n, s in placed.items()]

    body = [f'{INDENT}"""The cell\'s code, unchanged: jit partitions it by the layouts of its inputs."""']
    body += cell_body(cell, final_edit(returns, result))
    for name, spec in constrained.items():
        body.append(f"{INDENT}{name} = {jax_}.lax.with_sharding_constraint({name}, {named}({mesh_var}, "
                    f"{spec_text(p, spec)}))  # --out {name}")
    body += plain_lines(returns, plain, result, INDENT)
    returned = returns.device + ([result] if returns.final == "device" else [])
    body.append(f"{INDENT}return {', '.join(returned) if returned else '()'}")

    call = f"{run}({', '.join(inputs)})"
    after = [f"with {jax_}.set_mesh({mesh_var}):  # as %%shard runs it: the mesh is set while jit traces the cell",
             INDENT + (f"{targets_text(returned)} = {call}" if returned else call)]
    after += after_call_lines(returns, plain, result)
    mesh_lines = mesh_definition(mesh, names, mesh_var, intro)
    function = [f"@{jax_}.jit", f"def {run}({', '.join(inputs)}):"] + body
    return snippet(names, [mesh_lines, place_lines, plain_intro(plain) if plain else [], function, after])
