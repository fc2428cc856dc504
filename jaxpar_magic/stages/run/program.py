"""The run stage's core: call a cell's compiled program (compiling it on the first call, with a
status line), time it, and read what the compiled program does (its collectives and costs).

Plain Python over JAX; no IPython.
"""
from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass

from ...cell import analysis as cells
from ...cell.bindings import bind_results
from ...cell.bounded_cache import BoundedCache
from ...cell.hlo import Collective, collectives
from ...cell.work import loop_work
from ...cell.meshes import DEFAULT_MESH, InputOnOtherMesh, default_mesh, on_cell_mesh
from ...cell.programs import TRACE, CellProgram, Rerun, shape_signature
from ...errors import UsageError, explain_trace_error
from ...views.progress import Progress
from ..record.cell_recording import collectives_view_state
from .donation import call_donating, failed_with_donated, results_bound


@dataclass
class ProgramFacts:
    collectives: list[Collective]
    compile_ms: float | None = None
    flops: float | None = None
    bytes_accessed: float | None = None


@dataclass
class RunResult:
    """What every engine's run hands back, before anything is bound: the outputs (rebuilt as the
    user's own types), which of them the devices computed, the final expression, and the run's facts."""

    outputs: dict  # name -> its value: arrays as the engine assembles them, or a plain Python value
    device_outputs: tuple[str, ...]  # which outputs were computed on the devices
    final: object  # the final expression's value, or None
    has_final: bool
    mesh: object
    facts: ProgramFacts | None  # the compiled program's collectives and costs (--report and the views)
    run_ms: float
    cell: object  # cell.analysis.Cell

    ran = None  # (the CellProgram, its arguments): what the run called, for --profile to call again
    profile = None  # with --profile (a twin's `profile=N`): the measured profile (stages/profile/)

    @property
    def bindings(self) -> dict:
        """What a successful cell binds in the user's namespace."""
        return self.outputs


_HELD, _UNHELD = results_bound(), contextlib.nullcontext()  # a replay's scope, with --donate and without

_compile_seconds = [0.0]  # running total of JAX's trace+lower+compile time in this process
_backend_compiles = [0]  # XLA compiles finished in this process
_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                   _BACKEND_COMPILE)


@functools.lru_cache(maxsize=1)
def _listen_to_compiles() -> None:
    import jax.monitoring

    def record(event: str, seconds: float, **kwargs) -> None:
        if event in _COMPILE_EVENTS:
            _compile_seconds[0] += seconds
            _backend_compiles[0] += event == _BACKEND_COMPILE

    jax.monitoring.register_event_duration_secs_listener(record)


def compile_clock() -> float:
    """Seconds JAX has spent tracing, lowering and compiling so far (public jax.monitoring events)."""
    _listen_to_compiles()
    return _compile_seconds[0]


def compile_progress() -> Progress:
    """The status line of a first run: "compiling… 3 s", then "running… 5 s" once XLA is done."""
    _listen_to_compiles()
    before = _backend_compiles[0]
    return Progress(lambda: "compiling" if _backend_compiles[0] == before else "running")


def program_facts(jitted, args, device_ids, filename=None, compile_ms=None) -> ProgramFacts:
    """Collectives and costs of the program `jitted(*args)` runs (jit's cache makes this cheap)."""
    compiled = jitted.lower(*args).compile()
    try:
        cost = compiled.cost_analysis() or {}
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    except Exception:  # not every backend implements cost analysis
        cost = {}
    text = compiled.as_text()
    trips = loop_work(text)  # the loop trips after the first, which cost_analysis leaves out
    flops, moved = cost.get("flops"), cost.get("bytes accessed")
    return ProgramFacts(
        collectives(text, device_ids, filename),
        compile_ms,
        flops + trips.flops if flops is not None else None,
        moved + trips.bytes if moved is not None else None,
    )


def block_on_cpu_collectives(values, needed: bool) -> None:
    """Wait for a result when the program has collectives on the CPU backend.

    On a 2-core machine, XLA's CPU collectives deadlock once 50-70 such programs are queued back to
    back ("Expected 8 threads to join the rendezvous ...") and the process aborts a minute later.
    Waiting for each result keeps one program in flight at a time; it costs the overlap of Python
    dispatch with device work (a few microseconds a call, measured in bench/).
    """
    import jax

    if needed:
        jax.block_until_ready(values)


def has_collectives_on_cpu(mesh, jitted, args) -> bool:
    if mesh.devices.flat[0].platform != "cpu":
        return False
    with on_cell_mesh(mesh):
        return bool(collectives(jitted.lower(*args).compile().as_text()))


def must_wait(program: CellProgram, signature, args, mesh) -> bool:
    """Whether a run of `program` on arguments of this shape signature waits for its result: only
    where it has collectives on the CPU backend (block_on_cpu_collectives). Every other run returns
    once its program is dispatched, as `jax.jit` does. Read once per signature (on the CPU backend
    that reads the compiled program, which jit's cache already holds), then a dict look-up."""
    wait = program.waits.get(signature)
    if wait is None:
        wait = program.waits[signature] = has_collectives_on_cpu(mesh, program.jitted, args)
    return wait


def run_program(cache: BoundedCache, rerun: Rerun, args, cell: cells.Cell, mesh, note=None, wait: bool = False):
    """Call a cell's compiled program (rerun.program) on `args`, explaining foreseeable errors;
    returns (results, run_ms, shape signature).

    A later run returns once its program is dispatched, as `jax.jit` does (its run_ms is then the
    dispatch's): it waits for the result only with `wait` (--report times the run) or where the
    program has collectives on the CPU backend (must_wait). A first run for these input shapes
    waits: its status line says "compiling… 3 s", then "running… 5 s" until the result is there,
    and it records the compile time. Whatever stops the run (an error, Kernel -> Interrupt) removes
    the program from the cache: no half-built entry; `note(exc)` annotates an error the cell's code
    raised. An error the program raises while it runs on the devices after a later run returned
    comes, as with `jax.jit`, when a value is read. Later runs take the shortest path: the bench's
    re-runs.
    """
    import jax

    program, signature = rerun.program, rerun.signature
    deleted = None if rerun.live else rerun.deleted_error(args, cell)
    if deleted is not None:  # before the call: a deleted argument would crash the kernel, not raise
        raise deleted
    if signature is None:
        signature = shape_signature(args)
        first = signature not in program.compile_ms
    else:  # a Rerun's signature: that run compiled it (hashing the signature costs ~1 µs per 10 leaves)
        first = False
    compiled_before = compile_clock() if first else 0.0
    start = time.perf_counter()
    try:
        with on_cell_mesh(mesh):  # the cell's own mesh, whatever jax.set_mesh set
            if program.donated:
                results = _run_donating(program, args, rerun.inputs, signature, mesh, first, wait)
            elif first:
                with compile_progress():
                    results = program.jitted(*args)
                    jax.block_until_ready(results)
            else:
                results = program.jitted(*args)
                if wait or must_wait(program, signature, args, mesh):
                    jax.block_until_ready(results)
    except BaseException as exc:
        _forget_and_raise(cache, rerun, args, exc, cell, mesh, note)
    elapsed = (time.perf_counter() - start) * 1e3
    if not first:
        return results, elapsed, signature
    compile_ms = (compile_clock() - compiled_before) * 1e3
    program.compile_ms[signature] = compile_ms
    return results, max(0.0, elapsed - compile_ms), signature


def _run_donating(program: CellProgram, args, inputs, signature, mesh, first: bool, wait: bool):
    """A --donate run: compiled first (an interrupt there leaves the inputs whole), then called with
    its inputs checked and an interrupt deferred until the caller's donation.results_bound scope has
    bound the results (donation.call_donating). A first run waits for the
    result, a later one only as run_program's do (`wait`, must_wait), decided before the inputs go."""
    if first:
        with compile_progress():
            program.jitted.lower(*args).compile()  # jit's caches keep it for the call below
    wait = wait or first or must_wait(program, signature, args, mesh)
    return call_donating(program, args, inputs, program.donated, wait)


def run_cell(cache: BoundedCache, rerun: Rerun | None, namespace: dict, cell: cells.Cell, mesh, full_path,
             note=None, wait: bool = False):
    """A cell's run: the short path of a re-run (rerun.args) when nothing it checked changed, else
    `full_path()` (prepare, find or compile: (rerun, args, inputs laid out again)); then run_program
    (`wait`: wait for the result, as --report does to time the run).
    A re-run that meets an input on another mesh of its devices takes the full path once more, which
    lays that input out again. Returns (rerun, args, moved, (results, run_ms, signature))."""
    args = rerun.args(namespace) if rerun is not None else None
    moved = []
    if args is None:
        rerun, args, moved = full_path()
        rerun.mesh = mesh
    try:
        return rerun, args, moved, run_program(cache, rerun, args, cell, mesh, note, wait)
    except InputOnOtherMesh:
        rerun, args, moved = full_path()
        return rerun, args, moved, run_program(cache, rerun, args, cell, mesh, note, wait)


def outputs_of(outputs, out_specs: dict) -> tuple[str, ...] | None:
    """The names a %%shard / %%shard_map cell returns, as its line's --out says: `outputs` (names
    listed without a spec) and every name given a spec; None (every name the cell assigns) when
    neither lists any."""
    listed = tuple(outputs or ())
    listed += tuple(n for n in out_specs if n not in listed)
    return listed or None


def moved_placements(moved: list, inputs, args) -> dict:
    """The layouts the inputs laid out again were given (Rerun.remember's `placements`): a re-run on
    the same array from the other mesh takes the full path directly, instead of failing once first."""
    names = {name for name, _, _ in moved}
    return {tree.name: [leaf.sharding for leaf in arrays] for tree, arrays in zip(inputs, args) if tree.name in names}


def _forget_and_raise(cache: BoundedCache, rerun: Rerun, args, exc: BaseException, cell: cells.Cell, mesh,
                      note=None):
    """Whatever stopped a run (an error, Kernel -> Interrupt) removes its program from the cache, so
    the next run starts clean. A foreseeable error is raised as our UsageError instead (an input
    whose buffers were donated, one committed to other devices than the mesh's, a trace error we
    can explain); any other error gets the engine's `note` (pmap: what each device saw) before it
    goes on. An input on another mesh of the same devices raises InputOnOtherMesh, and the program
    stays: the caller takes the full path, which lays the input out again for it."""
    foreign = isinstance(exc, Exception) and not isinstance(exc, UsageError)  # JAX's or the cell's, not ours
    donated = rerun.program.donated
    explained = None
    if foreign:
        explained = (rerun.input_error(args, cell, mesh, deleted=not donated)
                     or explain_trace_error(exc, cell.filename, tuple(mesh.axis_names)))
        if donated and explained is None:
            failed_with_donated(exc, rerun.inputs, donated)
    if not isinstance(explained, InputOnOtherMesh):
        cache.pop(rerun.key, None)
    if explained is not None:
        raise explained from None
    if foreign and note is not None:
        note(exc)
    raise exc


def replay_function(reruns: BoundedCache, cache: BoundedCache, key, cell: cells.Cell, mesh, finish, *,
                    mesh_name: str | None = None, note=None):
    """The re-run of a --no-show cell, its line already resolved: a function of the namespace that
    runs the cached program, binds what the cell binds, and returns `(final,)`: the cell's final
    value (None without one); or None, binding nothing, when anything the last successful run
    checked has changed (an input, a constant, the mesh bound to `mesh_name`), and the caller takes
    the full path.

    `finish(rerun, args, results, namespace)` gives the engine's (bindings, commit); `note(exc,
    namespace)` annotates an error the cell raised. One flat function on purpose: each layer between
    the magic and the program costs a few microseconds a re-run, measured in place (bench section 9),
    where the simulated devices' threads share the machine's cores with this one.
    """
    import jax

    has_final = cell.has_final_expression
    by_default = mesh_name == DEFAULT_MESH  # no --mesh: the context mesh, else `mesh`, as resolve_mesh chose

    def replay(namespace: dict):
        if mesh_name is not None:
            if (default_mesh(namespace) if by_default else namespace.get(mesh_name)) is not mesh:
                return None
        rerun = reruns.get(key)
        if rerun is None:
            return None
        args = rerun.args(namespace)
        if args is None:
            return None
        deleted = None if rerun.live else rerun.deleted_error(args, cell)
        if deleted is not None:  # before the call: a deleted argument would crash the kernel (run_program)
            raise deleted
        # --donate: the input is gone from the call on; an interrupt waits until the results are bound.
        with _HELD if rerun.program.donated else _UNHELD:
            try:
                with on_cell_mesh(mesh):
                    program = rerun.program
                    if program.donated:
                        results = _run_donating(program, args, rerun.inputs, rerun.signature, mesh, False, False)
                    else:
                        results = program.jitted(*args)  # dispatched: the cell returns before the devices finish
                        if must_wait(program, rerun.signature, args, mesh):
                            jax.block_until_ready(results)
            except BaseException as exc:
                noted = None if note is None else (lambda e: note(e, namespace))
                try:
                    _forget_and_raise(cache, rerun, args, exc, cell, mesh, noted)
                except InputOnOtherMesh:  # the full path lays that input out again
                    return None
            bindings, commit = finish(rerun, args, results, namespace)
            bind_results(namespace, bindings)  # one step, after the run succeeded
            if commit is not None:
                commit(namespace)
            return (results[TRACE].final_of(results[1])[0] if has_final else None),

    return replay


def complete(result: RunResult, program: CellProgram, signature, args, mesh, cell: cells.Cell,
             want_facts: bool = False, recorded=None, title: str = "") -> RunResult:
    """Add to a run's result, when asked for (want_facts) or needed (`recorded`: what --collectives
    recorded, as (the trace's recorded sites, the run's records)), the compiled program's facts and
    the collectives' cards (titled `title`)."""
    result.ran = (program, args)
    if want_facts or recorded is not None:
        facts = facts_for(program, signature, args, mesh, cell)
        result.facts = facts if want_facts else None
        if recorded is not None:
            sites, records = recorded
            result.collectives = collectives_view_state(sites, records, title, mesh, cell, facts)
    return result


def facts_for(program: CellProgram, signature, args, mesh, cell: cells.Cell):
    """The compiled program's collectives and costs, read once per input shapes."""
    facts = program.facts.get(signature)
    if facts is None:
        ids = [d.id for d in mesh.devices.flat]
        with on_cell_mesh(mesh):
            facts = program.facts[signature] = program_facts(
                program.jitted, args, ids, cell.filename, program.compile_ms.get(signature))
    return facts
