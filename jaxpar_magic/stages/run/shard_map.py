"""The run stage of `%%shard_map` and its plain-Python twin `shard_map_cell`: find or build the
prepared cell's jit(shard_map) (engines/shard_map.py: prepare), run it on the blocks, and hand back a
ShardMapResult; with --collectives the same program also records what each collective did.

Plain Python, no IPython. The namespace is read, never written, until the result is bound.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...cell import analysis as cells
from ...cell.bindings import bind_results
from ...cell.bounded_cache import BoundedCache
from ...cell.inputs import absent_builtins
from ...cell.programs import RECORDS, TRACE, Rerun, analyse_cached
from ...cell.treespecs import normalize
from ...engines.shard import is_mesh, resolve_mesh
from ...engines.shard_map import check_cell, prepare
from ...errors import explaining
from ..record.cell_recording import recording
from .program import RunResult, complete, moved_placements, outputs_of, replay_function, run_cell


_cache = BoundedCache()
_reruns = BoundedCache()  # (source, mesh, specs, check_vma) -> Rerun of the last successful run


@dataclass
class ShardMapResult(RunResult):
    """Outputs are global arrays, each assembled by its out spec."""

    out_specs: dict  # name -> the spec each device output was assembled with (given or proven P())
    in_specs: dict
    final_is_array: bool
    collectives: dict | None = None  # the collective cards' view state (--collectives)
    moved: list = field(default_factory=list)  # inputs laid out again from another mesh (meshes.moved_text)

    @property
    def bindings(self) -> dict:
        """What a successful cell binds: its outputs (inputs stay as they were, as with jax.shard_map)."""
        return dict(self.outputs)


def _full_path(cell, namespace, mesh, in_specs, out_specs, check_vma, collectives=False, outputs=None):
    """The full path: prepare, find or build the program, remember what was checked."""
    prepared = prepare(cell, namespace, mesh, in_specs, out_specs, check_vma=check_vma, outputs=outputs)
    fingerprints = prepared.fingerprints(namespace)
    shapes = tuple(tree.signature for tree in prepared.inputs)
    key = (cell.source, tuple(t.key for t in prepared.inputs), mesh, prepared.leaf_specs,
           tuple(sorted(out_specs.items())), check_vma, collectives, outputs, shapes, fingerprints)
    program = _cache.lookup(key, lambda: prepared.program(recording if collectives else None), family=key[:-2])
    rerun = Rerun(prepared.inputs, (None,) * len(prepared.inputs), fingerprints, absent_builtins(cell, namespace),
                  program, key)
    return rerun, prepared.arguments, prepared.moved


def rerun_key(cell: cells.Cell, mesh, in_specs: dict, out_specs: dict, check_vma: bool = True,
              collectives: bool = False, outputs=None) -> tuple:
    """What a re-run of the same cell with the same options is looked up by (a replay computes it once)."""
    return (cell.source, mesh, tuple(sorted(in_specs.items())), tuple(sorted(out_specs.items())), check_vma,
            collectives, outputs)


def run_shard_map(cell: cells.Cell, namespace: dict, mesh, in_specs: dict, out_specs: dict, check_vma: bool = True,
                  want_facts: bool = False, collectives: bool = False, outputs=None,
                  wait: bool = False) -> ShardMapResult:
    """Run the cell as the body of jit(shard_map); the namespace is read, never written. `wait`:
    wait for the result (--report's run time)."""
    key = rerun_key(cell, mesh, in_specs, out_specs, check_vma, collectives, outputs)

    def full_path():
        with explaining(cell.filename, mesh.axis_names):  # discovering the outputs traces the cell
            return _full_path(cell, namespace, mesh, in_specs, out_specs, check_vma, collectives, outputs)

    rerun, args, moved, (results, run_ms, signature) = run_cell(_cache, _reruns.get(key), namespace, cell, mesh,
                                                                full_path, wait=wait)
    program = rerun.program
    rerun.remember(_reruns, key, signature, moved_placements(moved, rerun.inputs, args))
    trace = results[TRACE]
    final, final_is_array = trace.final_of(results[1])
    result = ShardMapResult(
        outputs=trace.bound_outputs(results[0]),
        device_outputs=trace.device_outputs,
        out_specs=program.assembled,
        in_specs=dict(in_specs),
        final=final,
        final_is_array=final_is_array,
        has_final=cell.has_final_expression,
        mesh=mesh,
        facts=None,
        run_ms=run_ms,
        cell=cell,
        moved=moved,
    )
    return complete(result, program, signature, args, mesh, cell, want_facts,
                    (results[TRACE].sites, results[RECORDS]) if collectives else None, "collectives of the %%shard_map cell")


def replayer(cell: cells.Cell, mesh, in_specs: dict, out_specs: dict, check_vma: bool = True,
             mesh_name: str | None = None, outputs=None):
    """The re-run of a --no-show cell with these resolved options (program.replay_function): binds
    the outputs and returns (the final value,), or None when the cell must take the full path again."""

    def finish(rerun, args, results, namespace):
        return results[TRACE].bound_outputs(results[0]), None

    return replay_function(_reruns, _cache, rerun_key(cell, mesh, in_specs, out_specs, check_vma, False, outputs),
                           cell, mesh, finish, mesh_name=mesh_name)


def shard_map_cell(source: str, namespace: dict, *, mesh=None, in_specs=None, out_specs=None, check_vma: bool = True,
                   want_facts: bool = False, bind: bool = True, collectives: bool = False,
                   outputs=None, wait: bool = False, profile: int = 0, hardware=None) -> ShardMapResult:
    """Plain-Python twin of `%%shard_map`: specs as dicts of tuples, e.g.
    `shard_map_cell("c = lax.psum(a @ b, 'y')", ns, mesh=mesh, in_specs={'a': ('x', 'y'), 'b': ('y', None)},
    out_specs={'c': ('x', None)})`. With `bind`, the outputs go into `namespace` once the cell succeeded.
    `outputs` (a line's --out names): the only names the cell returns (those without a spec are proven
    the same on every device); None (the default) returns every name it assigns. `profile` (a line's
    --profile-steps): run the compiled program that many more times under the profiler, the result's
    `profile` (with the plan on `hardware` beside it, where it has a time; stages/profile/). A re-run returns
    once its program is dispatched, as `jax.jit` does; `wait` waits for the result (its run_ms is then the run's)."""
    if profile:
        from ..profile.profile_cell import check_profile

        check_profile(profile, "%%shard_map", collectives=collectives)
    in_specs = {n: normalize(s) for n, s in (in_specs or {}).items()}
    out_specs = {n: normalize(s) for n, s in (out_specs or {}).items()}
    cell = analyse_cached(source, "shard_map-cell")
    check_cell(cell, in_specs, out_specs)
    if not is_mesh(mesh):
        mesh = resolve_mesh(mesh, namespace, [in_specs, out_specs])
    outputs = outputs_of(outputs, out_specs)
    result = run_shard_map(cell, namespace, mesh, in_specs, out_specs, check_vma, want_facts, collectives, outputs,
                           wait)
    if profile:
        from ..profile.profile_cell import profile_cell

        result.profile = profile_cell(result, profile, "shard_map", source, namespace, hardware, mesh=mesh,
                                      in_specs=in_specs, out_specs=out_specs, check_vma=check_vma, outputs=outputs)
    if bind:
        bind_results(namespace, result.bindings)  # one step: an interrupt leaves all or nothing
    return result
