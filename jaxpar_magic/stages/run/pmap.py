"""The run stage of `%%pmap` block mode and its plain-Python twin `pmap_cell`: find or compile the
prepared cell's program (engines/pmap.py: prepare), run it on every device, and hand back a BlockResult;
function mode binds each defined function as its ParallelFunction.

Plain Python, no IPython. The namespace is read, never written, until the result is bound.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...cell import analysis as cells
from ...cell.bindings import bind_results
from ...cell.bounded_cache import BoundedCache
from ...cell.inputs import absent_builtins
from ...cell.programs import RECORDS, TRACE, Rerun, analyse_cached
from ...engines.pmap import check_block_options, mesh_for, prepare
from ...engines.pmap_inputs import per_device_note
from ..record.cell_recording import recording
from .pmap_function import ParallelFunction
from .program import RunResult, complete, moved_placements, replay_function, run_cell


@dataclass
class BlockResult(RunResult):
    """A block-mode run: outputs carry the leading mesh axes; the final value is per device when traced."""

    final_per_device: bool = False
    per_device: dict | None = None  # device outputs before --merge: what the view shows per device
    collectives: dict | None = None  # the collective cards' view state (--collectives)
    moved: list = field(default_factory=list)  # inputs laid out again from another mesh (meshes.moved_text)


_block_cache = BoundedCache()
_reruns = BoundedCache()  # (source, mesh, options) -> Rerun of the last successful run


def rerun_key(cell: cells.Cell, mesh, broadcast=(), split=(), merge=(), collectives: bool = False) -> tuple:
    """What a re-run of the same cell with the same options is looked up by (a replay computes it once)."""
    return (cell.source, mesh, tuple(broadcast), tuple(split), tuple(merge), collectives)


def run_block(cell: cells.Cell, namespace: dict, mesh, *, broadcast=(), split=(), merge=(),
              want_facts: bool = False, collectives: bool = False, wait: bool = False) -> BlockResult:
    """Run a block-mode cell on every device of `mesh`; the namespace is read, never written.
    `wait`: wait for the result (--report's run time; --collectives reads its records anyway)."""
    key = rerun_key(cell, mesh, broadcast, split, merge, collectives)
    rerun, args, moved, (results, run_ms, signature) = run_cell(
        _block_cache, _reruns.get(key), namespace, cell, mesh,
        lambda: _full_path(cell, namespace, mesh, broadcast, split, merge, collectives),
        note=lambda exc: _note_devices(exc, cell, namespace, mesh, broadcast), wait=wait)
    program = rerun.program
    rerun.remember(_reruns, key, signature, moved_placements(moved, rerun.inputs, args))
    result = _block_result(cell, mesh, results, merge, run_ms)
    result.moved = moved
    return complete(result, program, signature, args, mesh, cell, want_facts,
                    (results[TRACE].sites, results[RECORDS]) if collectives else None,
                    f"collectives of the %%pmap cell ({', '.join(mesh.axis_names)})")


def _note_devices(exc: Exception, cell, namespace, mesh, broadcast) -> None:
    """The user's own error stays unchanged, with a note of what each device saw."""
    if hasattr(exc, "add_note"):
        exc.add_note(per_device_note(cell, namespace, mesh, broadcast))


def _full_path(cell, namespace, mesh, broadcast, split, merge, collectives=False):
    """The full path: prepare, find or compile the program, and remember what was checked."""
    prepared = prepare(cell, namespace, mesh, broadcast=broadcast, split=split, merge=merge)
    fingerprints = prepared.fingerprints(namespace)
    key = (cell.source, tuple(t.key for t in prepared.inputs), tuple(sorted(broadcast)), mesh, collectives,
           fingerprints)
    program = _block_cache.lookup(key, lambda: prepared.program(recording if collectives else None), family=key[:-1])
    reshape = tuple(tuple(tuple(a.shape) for a in arrays) if t.name in split else None
                    for t, arrays in zip(prepared.inputs, prepared.arguments))
    rerun = Rerun(prepared.inputs, reshape, fingerprints, absent_builtins(cell, namespace), program, key)
    return rerun, prepared.arguments, prepared.moved


def _outputs(trace, device, mesh, merge) -> dict:
    """The cell's outputs as the user's types (`trace`: the run's CellTrace), --merge's outputs with
    their device axes flattened."""
    if not merge:
        return trace.bound_outputs(device)
    k = len(mesh.axis_names)

    def merged(name, leaf):
        return leaf.reshape((-1,) + leaf.shape[k + 1:]) if name in merge else leaf

    return trace.bound_outputs(device, merged)


def _block_result(cell, mesh, results, merge, run_ms) -> BlockResult:
    """The run's outputs as the user's types (complete() adds its facts)."""
    device, trace = results[0], results[TRACE]
    final, on_devices = trace.final_of(results[1])
    return BlockResult(
        outputs=_outputs(trace, device, mesh, merge),
        device_outputs=trace.device_outputs,
        final=final,
        final_per_device=on_devices,
        has_final=cell.has_final_expression,
        mesh=mesh,
        facts=None,
        run_ms=run_ms,
        cell=cell,
        per_device=trace.outputs_of(device),
    )


def replayer(cell: cells.Cell, mesh, broadcast=(), split=(), merge=()):
    """The re-run of a --no-show block-mode cell with these resolved options
    (program.replay_function): binds the outputs and returns (the final value,), or None when the
    cell must take the full path again."""

    def finish(rerun, args, results, namespace):
        return _outputs(results[TRACE], results[0], mesh, merge), None

    def note(exc, namespace):
        _note_devices(exc, cell, namespace, mesh, broadcast)

    return replay_function(_reruns, _block_cache, rerun_key(cell, mesh, broadcast, split, merge), cell, mesh,
                           finish, note=note)


def clear_cache() -> None:
    _block_cache.clear()
    _reruns.clear()


def bind_functions(cell: cells.Cell, namespace: dict, mesh, **options) -> dict:
    """Function mode: define the cell's functions, each bound as its parallel version."""
    scope: dict = {}
    exec(compile(cell.tree, cell.filename, "exec"), namespace, scope)  # definitions and imports only
    bound = {}
    for name, value in scope.items():
        bound[name] = ParallelFunction(value, mesh, **options) if name in cell.functions else value
    return bound


def pmap_cell(source: str, namespace: dict, *, axis_name: str = "i", devices=None, mesh=None,
              broadcast=(), split=(), merge=(), in_axes=0, out_axes=0, static_broadcasted_argnums=(),
              donate_argnums=(), want_facts: bool = False, bind: bool = True, collectives: bool = False,
              wait: bool = False, profile: int = 0, hardware=None):
    """Run `source` as `%%pmap` would: per-device code (block mode) or pmapped definitions.

    Returns a BlockResult (block mode) or the dict of bound functions (function mode). With
    `bind`, outputs go into `namespace` only after the whole cell succeeded. A block-mode re-run
    returns once its program is dispatched, as `jax.jit` does; `wait` waits for the result (its
    run_ms is then the run's, as --report shows it). `profile` (a line's --profile-steps, block
    mode): run the compiled program that many more times under the profiler, the result's `profile`
    (with the plan on `hardware` beside it, where it has a time).
    """
    cell = analyse_cached(source, "pmap-cell")
    shape = mesh
    mesh = mesh_for(axis_name, devices, mesh)
    if profile:
        from ..profile.profile_cell import check_profile

        check_profile(profile, "%%pmap", collectives=collectives, function=cell.mode == "function")
    if cell.mode == "function":
        bound = bind_functions(cell, namespace, mesh, in_axes=in_axes, out_axes=out_axes,
                               static_broadcasted_argnums=static_broadcasted_argnums,
                               donate_argnums=donate_argnums, collectives=collectives)
        if bind:
            bind_results(namespace, bound)  # one step: an interrupt leaves all or nothing
        return bound
    check_block_options(in_axes, out_axes, static_broadcasted_argnums, donate_argnums)
    result = run_block(cell, namespace, mesh, broadcast=tuple(broadcast), split=tuple(split),
                       merge=tuple(merge), want_facts=want_facts, collectives=collectives, wait=wait)
    if profile:
        from ..profile.profile_cell import profile_cell

        result.profile = profile_cell(result, profile, "pmap", source, namespace, hardware, axis_name=axis_name,
                                      devices=devices, mesh=shape, broadcast=tuple(broadcast), split=tuple(split),
                                      merge=tuple(merge))
    if bind:
        bind_results(namespace, result.bindings)
    return result
