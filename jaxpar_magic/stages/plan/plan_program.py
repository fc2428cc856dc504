"""Plan a program without running it: compile it for a mesh over abstract inputs and read what the
compiler says it costs, per device.

`compile_plan(fn, args, mesh)` lowers and compiles `fn` over `jax.ShapeDtypeStruct`s (concrete
arrays stand in by their shapes and shardings), never runs it and allocates neither inputs nor
outputs. The `Plan` it returns carries the figures as attributes: memory (`compiled.memory_analysis()`),
FLOPs and bytes accessed (`cost_analysis()`), every collective with its mesh axes and source line,
the roofline of a hardware profile, and the outputs as ShapeDtypeStructs with their shardings, so the
next plan can take them as inputs. `Plan.state(title)` is the plan view's state.

This module compiles and reads the compiled program; the Plan record is in stages/plan/plan.py, a plan's
inputs and limits (scale, device memory) in stages/plan/abstract_inputs.py, its collectives on the mesh in
stages/plan/mesh_collectives.py, and their names stay importable from here. Plain Python over JAX; no IPython.
"""
from __future__ import annotations

import inspect
import linecache
import os
import time
from collections.abc import Callable

from ...cell.hlo import collectives, runs_outside_loops
from ...cell.hlo_dtypes import Upcasts, program_facts, upcasts
from ...cell.hlo_text import entry_name, instructions
from ...cell.work import loop_work
from ...cell.meshes import on_cell_mesh
from ...cell.programs import TRACE
from ...cell.xla_dump import RefusedForMemory
from ...cell.scatter import reduce_scatters
from ...errors import UsageError, explain_trace_error, user_line
from .abstract_inputs import CPU_DEVICE_CEILING, abstract_inputs, check_scale, device_capacity, smaller_slice, warn_concrete
from .compiled_plans import compile_plan_program, key_of, same_operations
from .costs import estimate
from .hardware import Hardware, parse_hardware
from .mesh_collectives import is_user_file, plan_collectives
from .peak import argument_labels, memory_peak
from .layout_changes import layout_changes
from .advice import advice_note, advise, parameter_shardings
from .refused import available, refused_program
from .pipeline import bubble
from .why import partitioner_rows, reasons
from .plan import (CAVEATS, attached_caveats, CPU_SCHEDULE_CAVEAT, GPU_CAVEAT, LOOP_CAVEAT, MAX_COLLECTIVES, REMAT, RESERVED_CPU, RESERVED_TPU, ROOFLINE_CAVEAT,
                   SCATTER_CAVEAT, TPU_CAVEATS, EXPOSED_CAVEAT, UNKNOWN_LOOP_CAVEAT, UPCAST_CAVEAT, Plan, PlannedCollective, PlanWarning, format_bytes,
                   remat_caveat)
from .topology import placed, topology_for

__all__ = [  # the names this module has always offered, wherever they now live
    "CAVEATS", "CPU_DEVICE_CEILING", "GPU_CAVEAT", "LOOP_CAVEAT", "MAX_COLLECTIVES", "ROOFLINE_CAVEAT", "UPCAST_CAVEAT",
    "Plan", "PlanWarning", "PlannedCollective", "abstract_inputs", "check_scale", "compile_plan", "device_capacity",
    "format_bytes", "output_structs", "parse_hardware", "plan_program", "smaller_slice",
]

_NO_VALUES = (
    "ConcretizationTypeError", "TracerBoolConversionError", "TracerIntegerConversionError",
    "TracerArrayConversionError",
)


# --- compiling ---------------------------------------------------------------------------------

def _source_file(fn) -> str | None:
    code = getattr(inspect.unwrap(fn), "__code__", None)
    return code.co_filename if code is not None else None


def _where(exc: BaseException, filename: str | None) -> str:
    """`line 3 of the cell (...)` for a cell's named filename, `line 12 of train.py (...)` for a file."""
    hit = user_line(exc, filename) if filename else None
    if hit is None:
        return "the planned function"
    is_cell = filename.startswith("<") and filename in linecache.cache  # cells register their source there
    place = "the cell" if is_cell else os.path.basename(filename)
    quoted = f" (`{hit[1]}`)" if hit[1] else ""
    return f"line {hit[0]} of {place}{quoted}"


def _no_values_error(exc: BaseException, filename: str | None) -> UsageError:
    at = _where(exc, filename)
    return UsageError(
        f"{at}: this needs a concrete value ({type(exc).__name__}), but a plan has no values: its inputs "
        f"are shapes and shardings only, and nothing runs. Compute it from shapes (`x.shape[0]`), write "
        f"Python `if x > 0` as `jnp.where(x > 0, a, b)` or `jax.lax.cond`, and `float(x)` as a jnp "
        f"expression; or run the cell without --plan on real arrays."
    )


def _figure(cost: dict, key: str) -> float | None:
    value = cost.get(key)
    return float(value) if value is not None and value >= 0 else None


def output_structs(compiled):
    """The compiled (or, where XLA refused it, lowered) program's outputs as plain ShapeDtypeStructs
    with their shardings."""
    import jax

    def plain(info):
        sharding = info.sharding if isinstance(info.sharding, jax.sharding.Sharding) else None
        return jax.ShapeDtypeStruct(info.shape, info.dtype, sharding=sharding,
                                    weak_type=getattr(info, "weak_type", False))

    return jax.tree.map(plain, compiled.out_info)


def compile_plan(fn, abstract_args, mesh, *, names=None, filename: str | None = None,
                 line_text: Callable[[int], str] | None = None, hardware: Hardware | str | None = None,
                 device_memory=None, set_mesh: bool = True, topology: str | None = None, leaf_labels=None,
                 compiler: str = "auto", target=None, output_labels=None, magic: str | None = None) -> Plan:
    """Compile `fn(*abstract_args)` for `mesh` without running it, and say what it costs per device.

    `fn`: a `jax.jit`-ed function (anything with `.lower`), or a function to jit. `abstract_args`:
    pytrees of ShapeDtypeStructs or arrays (which stand in by shape and sharding; unsharded ones are
    replicated). `names`: one label per argument, for messages. `filename`: the file (or cell
    filename) whose lines name the collectives and buffers, by default `fn`'s own; `line_text(n)`
    gives line n's text (default: linecache). `hardware`: a profile or its name, for the step time and
    the memory; `device_memory` (bytes or "16GiB") overrides the memory; `topology` ("4x8") the
    physical slice the mesh is laid onto (default: as jax.make_mesh would lay it). With `set_mesh`,
    traces under `jax.set_mesh(mesh)`, as the %%shard engine runs.

    `compiler`: "auto" compiles with XLA:TPU for compile-only devices of the `topology` slice when the
    profile is a TPU and libtpu is installed (stages/plan/target.py), else with XLA:CPU; "tpu" insists
    on XLA:TPU, "cpu" on XLA:CPU. `target` (a `target.Target`) gives the choice already made.
    """
    import jax

    from .target import choose
    from .topology import with_topology

    if isinstance(hardware, str):
        hardware = parse_hardware(hardware)
    if topology is not None:
        hardware = with_topology(hardware, topology)
    if target is None:
        target = choose(mesh, hardware, compiler)
    mesh = target.mesh
    check_scale(mesh)
    if not isinstance(mesh, jax.sharding.Mesh):
        raise UsageError(
            "A plan compiles for devices, so it needs a Mesh of devices, not an AbstractMesh: simulate them "
            "first (`%devices --simulate 512`, or jax.config.update('jax_num_cpu_devices', 512) before JAX "
            "starts) and build the mesh over them (`%mesh data=64 model=8`, or jaxpar_magic.make_mesh); or "
            "compile for a TPU slice with XLA:TPU (`--hardware tpu-v5e --topology 16x16`, with libtpu installed)."
        )
    sizes = {str(n): int(s) for n, s in mesh.shape.items()}
    laid_out = topology_for(hardware, sizes, hardware.topology) if hardware is not None else None  # before compiling
    laid_out = placed(laid_out, mesh) if laid_out is not None else None  # each device where it sits
    capacity, capacity_source = device_capacity(mesh, hardware, device_memory)
    memory_note = None
    if hardware is not None and hardware.preallocate and device_memory is None and capacity:
        usable = int(capacity * hardware.preallocate)
        memory_note = (f"JAX preallocates {hardware.preallocate:.0%} of a GPU's memory by default: "
                       f"{format_bytes(usable)} of the {format_bytes(capacity)}. To use more, set "
                       f"XLA_PYTHON_CLIENT_MEM_FRACTION=.95 (or XLA_PYTHON_CLIENT_PREALLOCATE=false) before JAX "
                       f"starts, and plan with --device-memory {format_bytes(capacity).replace(' ', '')}.")
        capacity, capacity_source = usable, f"{hardware.name} profile, {hardware.preallocate:.0%} JAX preallocates"
    args, concrete = abstract_inputs(abstract_args, mesh, names, leaf_labels)
    warn_concrete(concrete, capacity)
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    if filename is None:
        filename = _source_file(fn)
    start = time.perf_counter()
    try:
        # The engines' programs enter their mesh while traced; a mesh set globally is set aside (on_cell_mesh).
        with jax.set_mesh(mesh) if set_mesh else on_cell_mesh(mesh):
            lowered = jitted.lower(*args)
        program = lowered.as_text(dialect="hlo", debug_info=True)  # the program's own dtypes, before XLA's passes
        try:
            made, kept = compile_plan_program(lowered, key_of(program, mesh, filename))
            refused = None
        except RefusedForMemory as exc:  # the step that does not fit: planned from what XLA wrote
            made, kept, refused = refused_program(exc), False, exc
    except UsageError:
        raise
    except Exception as exc:
        if isinstance(exc, tuple(getattr(jax.errors, name) for name in _NO_VALUES)):
            raise _no_values_error(exc, filename) from None
        explained = explain_trace_error(exc, filename or "", tuple(str(n) for n in mesh.axis_names))
        if explained is not None:
            raise explained from None
        if target.is_tpu and isinstance(exc, jax.errors.JaxRuntimeError):
            raise tpu_compile_error(exc, target) from None
        raise
    compile_ms = (time.perf_counter() - start) * 1e3
    memory, cost, text = made.memory, made.cost, made.text
    types, matmuls = program_facts(program)
    read = instructions(text)  # the compiled program's instructions, read once for the three readers below
    read, types = same_operations(read, types, filename)  # a kept compile has its first plan's callers
    upcast = upcasts(text, types, read) if target.is_cpu else Upcasts({}, set(), 0.0)  # XLA:TPU keeps bf16
    found = reduce_scatters(text, collectives(text, None, filename, upcast.shadows, is_user_file, read), read,
                            own_only=not target.is_cpu)  # XLA:TPU's program has its own
    planned = plan_collectives(found, mesh, line_text, filename, rewritten=target.is_cpu)
    entry = entry_name(text)
    labels = argument_labels(read, entry, leaf_labels)
    planned = reasons(found, planned, read, labels)
    trips = loop_work(text, read)  # the loop trips after the first, which cost_analysis leaves out
    flops, target_bytes = _figure(cost, "flops"), _figure(cost, "bytes accessed")
    flops = flops + trips.flops if flops is not None else None
    target_bytes = target_bytes + trips.bytes if target_bytes is not None else None
    bytes_accessed = max(0.0, target_bytes - upcast.traffic_bytes) if target_bytes is not None else None
    caveats = list(attached_caveats(target) if target.attached else TPU_CAVEATS if target.is_tpu else CAVEATS)
    if target.note:
        caveats.insert(0, target.note)
    if target.is_cpu and runs_outside_loops(program, REMAT):  # in a loop's body XLA:CPU keeps it
        caveats.insert(0, remat_caveat(hardware))
    if upcast.shadows:
        caveats.append(UPCAST_CAVEAT)
    if any(c.sliced_from for c in found) and target.is_cpu:
        caveats.append(SCATTER_CAVEAT)
    if " while(" in text:
        caveats.append(LOOP_CAVEAT)
    if trips.unknown or any(c.count is None for c in found):
        caveats.append(UNKNOWN_LOOP_CAVEAT)
    if not target.is_cpu and any(c.overlapped is False for c in planned if c.group_size > 1):
        caveats.append(EXPOSED_CAVEAT)
    times = None
    if hardware is not None and refused is None:  # a refused compile has no FLOPs to time
        times, planned = estimate(flops, bytes_accessed, planned, hardware, laid_out, matmuls)
        caveats.append(ROOFLINE_CAVEAT)
        if target.is_cpu:
            caveats.append(CPU_SCHEDULE_CAVEAT)
        if hardware.kind == "gpu":
            caveats.append(GPU_CAVEAT)
    outputs = output_structs(made.compiled if refused is None else lowered)
    if refused is not None:
        capacity, capacity_source = _refusing_capacity(refused, target, capacity, capacity_source)
        caveats.insert(0, f"{target.compiler} refused to compile this step: {refused.said}. Its figures come from the "
                          f"buffers it had assigned before refusing; with no executable there are no FLOPs or bytes "
                          f"accessed, so no step time.")
    plan = Plan(
        mesh=mesh,
        argument_bytes=int(memory.argument_size_in_bytes),
        output_bytes=int(memory.output_size_in_bytes),
        temp_bytes=int(memory.temp_size_in_bytes),
        alias_bytes=int(memory.alias_size_in_bytes),
        flops=flops,
        bytes_accessed=bytes_accessed,
        compile_ms=compile_ms,
        collectives=planned,
        outputs=outputs,
        hardware=hardware,
        capacity=capacity,
        capacity_source=capacity_source,
        roofline=times,
        topology=laid_out,
        cpu_bytes_accessed=target_bytes,
        memory_note=memory_note,
        caveats=tuple(caveats),
        compiled=made.compiled,
        target=target,
        xla_peak_bytes=_reported_peak(memory) if target.is_tpu else None,
        reused=kept,
        refused=refused.said if refused is not None else None,
    )
    plan.partitioner = partitioner_rows(made.said, mesh, leaf_labels, filename, line_text)
    plan.pipeline = bubble(read, found, planned, sizes, filename) if " while(" in text else None
    plan.peak = memory_peak(made.dump, read, entry, plan.total_bytes,
                            leaf_labels=leaf_labels, output_labels=_labels(output_labels, outputs),
                            filename=filename, line_text=line_text,
                            rest_note=RESERVED_TPU if target.is_tpu else RESERVED_CPU, shadows=upcast.shadows,
                            counted_temp=plan.temp_bytes)
    if plan.peak.upcast_bytes:
        plan.notes.append(upcast_note(plan.peak, plan.total_bytes))
    plan.notes += other_spaces(plan, target)
    if plan.fits is False:  # what to do about it, computed from what fills the peak
        plan.advice = advise(plan, parameter_shardings(read, entry, labels), magic)
        plan.notes.append(advice_note(plan.advice))
    return plan


def upcast_note(peak, total: int) -> str:
    """How much of an XLA:CPU peak is f32 copies of the program's bf16/f16 arrays (its converts widen them)."""
    count = peak.upcast_count
    return (f"{format_bytes(peak.upcast_bytes)} of this {format_bytes(total)} peak ({count} buffer{'s' if count != 1 else ''}) "
            f"are XLA:CPU's f32 copies of arrays the program holds in bf16 or f16 (its converts widen them). XLA:TPU "
            f"and XLA:GPU compute in the program's own dtype, so on the target these take half as much memory, or "
            f"none: the target's peak may be up to {format_bytes(peak.upcast_bytes)} lower.")


#: XLA:TPU's memory spaces (its memory-usage report's names), in words: the TensorCore's on-chip memories,
#: as JAX's Pallas TPU guide names them (docs.jax.dev/en/latest/pallas/tpu/pipelining.html, "TPU and its
#: memory spaces": vector memory VMEM, scalar memory SMEM; pallas.tpu.MemorySpace also lists CMEM).
SPACE_WORDS = {"vmem": "on-chip vector memory (VMEM)", "smem": "on-chip scalar memory (SMEM)",
               "cmem": "on-chip common memory (CMEM)"}


def other_spaces(plan, target) -> list[str]:
    """What the program keeps outside HBM (XLA:TPU's on-chip VMEM, SMEM), said apart from the HBM figures;
    spaces XLA names only by number (`color_6`) in one sentence, as what they are: neither HBM nor counted."""
    said, unnamed = [], []
    for space, busiest in (plan.peak.elsewhere if plan.peak is not None else {}).items():
        if space == "host":
            continue
        words = SPACE_WORDS.get(space.lower())
        if words is None:
            unnamed.append(busiest)
            continue
        own = (f"; XLA:TPU's own peak_memory_in_bytes ({format_bytes(plan.xla_peak_bytes)}) counts it with HBM"
               if plan.xla_peak_bytes and space.lower() == "vmem" else "")
        said.append(f"{target.compiler} also keeps up to {format_bytes(busiest)} at once in its {words} "
                    f"(not HBM: outside these figures and the fit){own}.")
    if unnamed:
        count = len(unnamed)
        said.append(f"{target.compiler} also keeps up to {format_bytes(sum(unnamed))} in {count} more memory "
                    f"space{'s' if count != 1 else ''} it names only by number (not HBM: outside these figures and the fit).")
    return said


def _refusing_capacity(refused, target, capacity, capacity_source):
    """The memory XLA said the program may use ("exceeds available HBM (15.75G)"), else the profile's."""
    said, memory = available(refused.said)
    if said is None:
        return capacity, capacity_source
    return said, f"{target.compiler}: {memory} available to the program"


def largest_words(buffer) -> str:
    """`temporary from dot_general, line 3: h = x @ w` / `argument params['w1']`."""
    what = buffer.name if buffer.kind != "temporary" else f"from {buffer.op or buffer.instruction}"
    where = f", line {buffer.line}: {buffer.source}" if buffer.line is not None and buffer.source else (
        f", line {buffer.line}" if buffer.line is not None else "")
    return f"{buffer.kind} {what}{where}"


def tpu_compile_error(exc: BaseException, target) -> UsageError:
    """XLA:TPU refusing a slice (measured: a v5e 2x16 fails in its DMA routing), said as a UsageError."""
    said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return UsageError(
        f"XLA:TPU could not compile this cell for {target.where}: {said[:300]}. Plan a slice shape Google Cloud "
        f"offers (v5e and v6e: 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16; v4 and v5p: 2x2x1, 2x2x2, 2x2x4, 2x4x4, "
        f"4x4x4 and larger multiples of 4), or plan with XLA:CPU: drop --topology (or plan_cell(..., compiler=\"cpu\"))."
    )


def _reported_peak(memory) -> int | None:
    """XLA:TPU's own peak (`peak_memory_in_bytes`), None where not reported. It is not HBM's: it counts
    on-chip VMEM too (measured: 60.3 MB for a small MLP whose HBM arguments, outputs and temporaries
    are 17.3 MB, with 45.1 MB of VMEM temporaries), and may be below their sum for a large step."""
    peak = int(getattr(memory, "peak_memory_in_bytes", 0) or 0)
    return peak if peak > 0 else None


def _labels(given, outputs) -> list[str]:
    """Output labels: `given` (a list, or a function of the outputs), else their paths (`out[1]['w']`)."""
    import jax

    if callable(given):
        return given(outputs)
    if given is not None:
        return list(given)
    return ["out" + jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(outputs)[0]]


# --- a planned cell (the engines' --plan stage) ------------------------------------------------

def plan_program(prepared, *, hardware=None, device_memory=None, set_mesh=True, reshape=None, target=None) -> Plan:
    """The --plan stage: compile a prepared cell's program (prepared.PreparedCell) over its abstract
    arguments, never run.

    `reshape` an optional map applied to each device output leaf's ShapeDtypeStruct (--merge). The
    plan carries what the cell would bind: computed outputs as ShapeDtypeStructs with their
    shardings, rebuilt as the user's types (the next planned cell can take them), plain Python
    values as they are.
    """
    from ...views.progress import Progress

    program, cell = prepared.program(), prepared.cell
    label = f"compiling with {target.compiler} for {target.where}" if target is not None and target.is_tpu else "planning"
    with Progress(label):
        plan = compile_plan(program.jitted, prepared.arguments, prepared.mesh, names=list(prepared.names),
                            filename=cell.filename, line_text=cell.line, hardware=hardware,
                            device_memory=device_memory, set_mesh=set_mesh, leaf_labels=prepared.labels(),
                            target=target, output_labels=lambda outputs: _cell_output_labels(outputs, reshape),
                            magic=prepared.magic)
    trace = plan.outputs[TRACE]  # the CellTrace of the trace just compiled
    plan.bindings = trace.bound_outputs(plan.outputs[0], reshape)
    plan.computed = trace.device_outputs
    plan.abstract = dict(plan.bindings)
    plan.layout_changes = layout_changes(prepared, plan)
    return plan


def _cell_output_labels(outputs, reshape) -> list[str]:
    """Each leaf of the program's outputs named as the cell's value it belongs to (`grads['w1']`)."""
    import jax

    named = {}
    for name, value in outputs[TRACE].outputs_of(outputs[0], reshape).items():
        leaves = [p for p, leaf in jax.tree_util.tree_flatten_with_path(value)[0] if hasattr(leaf, "shape")]
        named[name] = [name + jax.tree_util.keystr(p) for p in leaves]
    labels = []
    for path, _ in jax.tree_util.tree_flatten_with_path(outputs)[0]:
        keys = [getattr(k, "key", getattr(k, "idx", None)) for k in path]
        if len(keys) >= 3 and keys[0] == 0 and keys[1] in named and isinstance(keys[2], int) and keys[2] < len(named[keys[1]]):
            labels.append(named[keys[1]][keys[2]])
        elif keys and keys[0] == 1:
            labels.append("the cell's value")
        else:
            labels.append("out" + jax.tree_util.keystr(path))
    return labels
