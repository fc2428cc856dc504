"""The run stage of `%%shard` and its plain-Python twin `shard_cell`: find or compile the prepared
cell's program (shard.prepare), run the cell's unchanged code on its sharded inputs, and hand back
a ShardResult to bind (placed inputs, outputs, and the new state of the NNX objects it changed).

Plain Python, no IPython. The namespace is read, never written, until the result is bound.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...cell import analysis as cells, nnx_graphs
from ...cell.bindings import bind_results
from ...cell.bounded_cache import BoundedCache
from ...cell.inputs import absent_builtins, graph_state
from ...cell.programs import TRACE, Rerun, analyse_cached, apply_write_backs, split_write_backs, write_backs_of
from ...cell.treespecs import normalize
from ...engines.shard import check_cell, is_mesh, prepare, resolve_mesh
from .donation import results_bound
from .program import RunResult, complete, moved_placements, outputs_of, replay_function, run_cell


_cache = BoundedCache()
_reruns = BoundedCache()  # (source, mesh, specs) -> Rerun of the last successful run


@dataclass
class ShardResult(RunResult):
    placed: dict  # inputs named in --in, as placed on the mesh
    final_is_array: bool
    write_backs: list = field(default_factory=list)  # [(values holding NNX objects, their new state)], written on bind
    moved: list = field(default_factory=list)  # inputs laid out again from another mesh (meshes.moved_text)

    @property
    def bindings(self) -> dict:
        """What a successful cell binds: the placed inputs (like the seed's `v1sp = device_put(...)`,
        so a re-run moves no data) and the outputs, in one dict to bind in one step."""
        return {**self.placed, **self.outputs}

    def commit(self, namespace: dict) -> None:
        """Write the new state of the NNX objects the cell changed (or laid out) into them."""
        apply_write_backs(self.write_backs)

    def bind(self, namespace: dict) -> None:
        bind_results(namespace, self.bindings)  # one step: an interrupt leaves all or nothing
        self.commit(namespace)


def rerun_key(cell: cells.Cell, mesh, in_specs: dict, out_specs: dict, outputs=None, donate=()) -> tuple:
    """What a re-run of the same cell with the same options is looked up by (a replay computes it once)."""
    return (cell.source, mesh, tuple(sorted(in_specs.items())), tuple(sorted(out_specs.items())), outputs,
            tuple(donate))


def run_shard(cell: cells.Cell, namespace: dict, mesh, in_specs: dict, out_specs: dict,
              want_facts: bool = False, outputs=None, donate=(), wait: bool = False) -> ShardResult:
    """Run a cell's unchanged code on sharded inputs; the namespace is read, never written (but the
    buffers of the inputs named in `donate` are given to the program, as jax.jit's donate_argnums).
    `wait`: wait for the result (--report's run time), where a re-run otherwise returns once its
    program is dispatched."""
    key = rerun_key(cell, mesh, in_specs, out_specs, outputs, donate)
    rerun, args, moved, (results, run_ms, signature) = run_cell(
        _cache, _reruns.get(key), namespace, cell, mesh,
        lambda: _full_path(cell, namespace, mesh, in_specs, out_specs, outputs, donate), wait=wait)
    program = rerun.program
    placements = {tree.name: [leaf.sharding for leaf in arrays]
                  for tree, arrays in zip(rerun.inputs, args) if tree.name in in_specs}
    rerun.remember(_reruns, key, signature, {**placements, **moved_placements(moved, rerun.inputs, args)})
    result = _shard_result(cell, mesh, rerun.inputs, args, results, namespace, in_specs, run_ms, rerun.graph_call)
    result.moved = moved
    return complete(result, program, signature, args, mesh, cell, want_facts)


def _placed_and_outputs(trace, inputs, args, device, namespace, in_specs, graphs=None):
    """(placed inputs, outputs, computed output names, NNX write-backs) of a run, as the user's types
    (`trace`: the run's CellTrace; `graphs`: Rerun.graph_call, which writes NNX objects directly)."""
    computed, states = split_write_backs(trace.outputs_of(device, graphs=graphs))
    placed = {}
    for tree, arrays in zip(inputs, args):
        if tree.name not in in_specs:
            continue
        if tree.graphdef is None:
            placed[tree.name] = tree.rebuild(arrays)
        else:  # NNX objects stay the user's own; if the cell did not change them, they get their placed state
            placed[tree.name] = nnx_graphs.with_objects(tree.tree_of(arrays),
                                                        nnx_graphs.nodes_of([namespace[n] for n in tree.group]))
            if tree.group not in states:
                states[tree.group] = graph_state(inputs, args)
    outputs = dict(trace.static_outputs)
    outputs.update(computed)
    if trace.input_objects:  # outputs that are NNX objects the cell read: the user's very objects
        group = next(tree.group for tree in inputs if tree.graphdef is not None)
        values = [namespace[name] for name in group]  # as they were before the cell: nothing is bound yet
        outputs = {name: nnx_graphs.resolved(value, values) for name, value in outputs.items()}
        computed = {name: outputs[name] for name in computed}
    return placed, outputs, computed, write_backs_of(namespace, states) if states else []


def _shard_result(cell, mesh, inputs, args, results, namespace, in_specs, run_ms=0.0, graphs=None) -> ShardResult:
    """The run's placed inputs and outputs as the user's types (complete() adds its facts)."""
    device, final, trace = results
    placed, outputs, computed, write_backs = _placed_and_outputs(trace, inputs, args, device, namespace, in_specs,
                                                                 graphs)
    final, final_is_array = trace.final_of(final)
    return ShardResult(
        outputs=outputs,
        device_outputs=tuple(n for n in trace.device_outputs if n in computed),
        placed=placed,
        final=final,
        final_is_array=final_is_array,
        has_final=cell.has_final_expression,
        mesh=mesh,
        facts=None,
        run_ms=run_ms,
        cell=cell,
        write_backs=write_backs,
    )


def replayer(cell: cells.Cell, mesh, in_specs: dict, out_specs: dict, mesh_name: str | None = None, outputs=None,
             donate=()):
    """The re-run of a --no-show cell with these resolved options (program.replay_function): binds
    the placed inputs and outputs, writes NNX objects' new state, and returns (the final value,), or
    None when the cell must take the full path again."""

    def finish(rerun, args, results, namespace):  # what ShardResult.bind binds, without building one
        placed, outputs, _, write_backs = _placed_and_outputs(results[TRACE], rerun.inputs, args, results[0],
                                                              namespace, in_specs, rerun.graph_call)
        placed.update(outputs)
        return placed, (lambda ns: apply_write_backs(write_backs)) if write_backs else None

    return replay_function(_reruns, _cache, rerun_key(cell, mesh, in_specs, out_specs, outputs, donate), cell, mesh,
                           finish, mesh_name=mesh_name)


def _full_path(cell, namespace, mesh, in_specs, out_specs, outputs=None, donate=()):
    """The full path: prepare (places the inputs), find or compile the program."""
    prepared = prepare(cell, namespace, mesh, in_specs, out_specs, outputs=outputs, donate=donate)
    fingerprints = prepared.fingerprints(namespace)
    key = (cell.source, tuple(t.key for t in prepared.inputs), mesh, tuple(sorted(in_specs.items())),
           tuple(sorted(prepared.out_specs.items())), outputs, tuple(donate), fingerprints)
    program = _cache.lookup(key, prepared.program, family=key[:-1])
    rerun = Rerun(prepared.inputs, (None,) * len(prepared.inputs), fingerprints, absent_builtins(cell, namespace),
                  program, key)
    return rerun, prepared.arguments, prepared.moved


def shard_cell(source: str, namespace: dict, *, mesh=None, in_specs=None, out_specs=None,
               want_facts: bool = False, bind: bool = True, outputs=None, donate=(), wait: bool = False,
               profile: int = 0, hardware=None) -> ShardResult:
    """Plain-Python twin of `%%shard`: specs as dicts of tuples or PartitionSpecs, e.g.
    in_specs={'v1s': ('data',)}; a pytree input takes one spec for every leaf, or a pytree of specs.
    `outputs` (a line's --out names, e.g. ('loss',)): the only names the cell returns, the others are
    temporaries; None (the default) returns every name it assigns. `donate` (a line's --donate
    names): inputs whose buffers the program may reuse for its outputs, as jax.jit's donate_argnums;
    rebind them to what the cell returns (`model, opt_state = step(model, opt_state, batch)`).
    A re-run returns once its program is dispatched, as `jax.jit` does; `wait` waits for the result
    (its run_ms is then the run's, as --report shows it).

    With `bind`, the placed inputs and the outputs go into `namespace` only after the cell succeeded
    (placed inputs are rebound like the seed's `v1sp = jax.device_put(v1s, sharding)`, so a re-run
    moves no data), and Flax NNX objects the cell changed get their new state. `profile` (a line's
    --profile-steps): run the compiled program that many more times under the profiler, the result's
    `profile` (with the plan on `hardware` beside it, where it has a time; stages/profile/).
    With `donate` and not `bind`, an interrupt that came once the program had the inputs is raised
    as this returns (the caller gets no result, as with `w = step(w)` interrupted under jax.jit).
    """
    if profile:
        from ..profile.profile_cell import check_profile

        check_profile(profile, "%%shard", donate=tuple(donate))
    in_specs = {n: normalize(s) for n, s in (in_specs or {}).items()}
    out_specs = {n: normalize(s) for n, s in (out_specs or {}).items()}
    cell = analyse_cached(source, "shard-cell")
    check_cell(cell)
    if not is_mesh(mesh):
        mesh = resolve_mesh(mesh, namespace, [in_specs, out_specs])
    outputs = outputs_of(outputs, out_specs)
    with results_bound():  # --donate: an interrupt once the program has the inputs waits for the bind below
        result = run_shard(cell, namespace, mesh, in_specs, out_specs, want_facts, outputs, tuple(donate), wait)
        if profile:
            from ..profile.profile_cell import profile_cell

            result.profile = profile_cell(result, profile, "shard", source, namespace, hardware, mesh=mesh,
                                          in_specs=in_specs, out_specs=out_specs, outputs=outputs)
        if bind:
            result.bind(namespace)
    return result
