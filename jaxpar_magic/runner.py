"""What both engines share: planning a cell's inputs, a bounded compile cache, running a traced
cell with its trace-time facts, and reading the compiled program.

Plain Python over JAX; no IPython.
"""
from __future__ import annotations

import functools
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from . import cell as cells
from .errors import UsageError, explain_trace_error
from .fingerprints import Ref, fingerprint
from .hlo import Collective, collectives
from .progress import Progress

CACHE_SIZE = 64


# --- inputs ------------------------------------------------------------------------------------

def is_array(value) -> bool:
    import jax
    import numpy as np

    return isinstance(value, (jax.Array, np.ndarray))


def is_abstract(value) -> bool:
    """A jax.ShapeDtypeStruct: a shape, a dtype and maybe a sharding, no values (what --plan takes)."""
    import jax

    return isinstance(value, jax.ShapeDtypeStruct)


def is_array_tree(value, abstract: bool = False) -> bool:
    """An array, or a (non-empty) tuple/list/dict pytree whose leaves are all arrays (with
    `abstract`, ShapeDtypeStructs count as arrays)."""
    import jax

    def leaf_ok(leaf):
        return is_array(leaf) or (abstract and is_abstract(leaf))

    if leaf_ok(value):
        return True
    if not isinstance(value, (tuple, list, dict)):
        return False
    leaves = jax.tree.leaves(value)
    return bool(leaves) and all(leaf_ok(leaf) for leaf in leaves)


# --- the collectives view's facts, shared with %%shard -------------------------------------------

@dataclass
class ProgramFacts:
    collectives: list[Collective]
    compile_ms: float | None = None
    flops: float | None = None
    bytes_accessed: float | None = None


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
    return ProgramFacts(
        collectives(compiled.as_text(), device_ids, filename),
        compile_ms,
        cost.get("flops"),
        cost.get("bytes accessed"),
    )


def within_mesh(mesh):
    """The mesh as the context a cell's code is traced in (so `P('data')` alone means this mesh).

    Entered inside the traced function, not around the call: `jax.set_mesh` around every call
    takes jit off its fast C++ dispatch path (about 40 µs a call here, bench section 9)."""
    import jax

    return jax.sharding.use_abstract_mesh(getattr(mesh, "abstract_mesh", mesh))


def shape_signature(args) -> tuple:
    import jax

    return tuple((tuple(a.shape), str(a.dtype)) for a in jax.tree.leaves(args))


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
    return bool(collectives(jitted.lower(*args).compile().as_text()))


@dataclass
class CellProgram:
    """A cell compiled for one mesh and set of constants, with what its trace revealed."""

    jitted: object
    static_outputs: dict = field(default_factory=dict)
    static_final: list = field(default_factory=list)
    device_outputs: list = field(default_factory=list)
    final_per_device: list = field(default_factory=list)
    facts: dict = field(default_factory=dict)  # shape signature -> ProgramFacts
    compile_ms: dict = field(default_factory=dict)  # shape signature -> first call's compile time
    recording: object = None  # recorder.Recording when compiled with --collectives

    def final_of(self, traced_final) -> tuple[object, bool]:
        """The cell's final expression, and whether it was computed on the devices (traced)
        or is the plain Python value the trace saw."""
        on_devices = bool(self.final_per_device and self.final_per_device[0])
        return (traced_final if on_devices else (self.static_final[0] if self.static_final else None)), on_devices


def plan_inputs(cell: cells.Cell, namespace: dict, named: dict | None = None, abstract: bool = False):
    """Split the names a cell reads into array inputs and constants; undefined names are errors.

    With `abstract` (--plan), jax.ShapeDtypeStructs are inputs too; without it, reading one is a
    mistake we can explain (it has no values to compute with).
    """
    import builtins

    inputs, constants = [], []
    for name in cell.reads:
        if name in namespace:
            value = namespace[name]
            if is_array_tree(value, abstract=True) and not is_array_tree(value) and not abstract:
                lineno = _first_line_reading(cell, name)
                raise UsageError(
                    f"{name!r} is an abstract array (jax.ShapeDtypeStruct: a shape and a layout, no values), read on "
                    f"line {lineno} of the cell (`{cell.line(lineno)}`). A cell can only plan with it: add --plan to "
                    f"the magic line to see what the program would cost, or give {name!r} real values first."
                )
            (inputs if is_array_tree(value, abstract) else constants).append(name)
        elif not hasattr(builtins, name):
            lineno = _first_line_reading(cell, name)
            raise UsageError(
                f"name {name!r} is not defined (line {lineno} of the cell: `{cell.line(lineno)}`). Define it "
                f"in an earlier cell, or fix the spelling."
            )
    for option, names in (named or {}).items():
        for name in names:
            if name not in inputs:
                why = "is not defined" if name not in namespace else "is not an array input the cell reads"
                raise UsageError(
                    f"{option} {name}: {name!r} {why}. {option} takes names of arrays the cell reads "
                    f"before assigning them; this cell's array inputs are: {', '.join(inputs) or 'none'}."
                )
    return tuple(inputs), tuple(constants)


def _first_line_reading(cell: cells.Cell, name: str) -> int:
    import ast

    for node in ast.walk(cell.tree):
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load):
            return node.lineno
    return 1


def traced(value) -> bool:
    import jax

    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(value))




@functools.lru_cache(maxsize=CACHE_SIZE)
def analyse_cached(source: str, label: str) -> cells.Cell:
    """A cell's analysis, computed once per source (a re-run skips parsing)."""
    return cells.analyse(source, label)


class BoundedCache(OrderedDict):
    """Least-recently-used cache of compiled cells: re-runs hit it, it never grows past `size`.

    A `family` groups the variants of one cell (same source and options, other constants): a new
    variant replaces the old one, so the values the old program baked in (a helper's global array,
    say) are released as soon as the user changes them, not 64 cells later.
    """

    def __init__(self, size: int = CACHE_SIZE):
        super().__init__()
        self.size = size
        self._families: dict = {}  # family -> the key of its live variant

    def lookup(self, key, build, family=None):
        entry = self.get(key)
        if entry is None:
            entry = build()
            self.put(key, entry, family)
        else:
            self.move_to_end(key)
        return entry

    def put(self, key, entry, family=None) -> None:
        if family is not None:
            previous = self._families.get(family)
            if previous is not None and previous != key:
                self.pop(previous, None)
            self._families[family] = key
        self[key] = entry
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)
        if len(self._families) > 4 * self.size:  # forget families whose entry is gone
            self._families = {f: k for f, k in self._families.items() if k in self}

    def clear(self) -> None:
        super().clear()
        self._families.clear()


def capture_outputs(program: CellProgram, outs: dict, final, to_device):
    """Split a traced cell's results: device values go out through `to_device`, plain Python values
    (a number assigned in the cell, a helper function) are remembered and bound as they are."""
    program.static_outputs = {n: v for n, v in outs.items() if not traced(v)}
    program.device_outputs = [n for n, v in outs.items() if traced(v)]
    traced_final = traced(final)
    program.final_per_device[:] = [traced_final]
    program.static_final[:] = [None if traced_final else final]
    device = {n: to_device(outs[n]) for n in program.device_outputs}
    return device, (to_device(final) if traced_final else None)


def run_program(cache: BoundedCache, key, program: CellProgram, args, cell: cells.Cell, axis_names, signature=None):
    """Call a compiled cell, explaining foreseeable errors; returns (results, run_ms, shape signature).

    A first run for these input shapes shows a status line while it compiles and records the
    compile time. Whatever stops the run (an error, Kernel -> Interrupt) removes the program from
    the cache: no half-built entry. Later runs take the shortest path: the bench's re-runs.
    """
    import jax

    if signature is None:
        signature = shape_signature(args)
    first = signature not in program.compile_ms
    compiled_before = compile_clock() if first else 0.0
    start = time.perf_counter()
    try:
        if first:
            with compile_progress():
                results = program.jitted(*args)
                jax.block_until_ready(results)
        else:
            results = program.jitted(*args)
            jax.block_until_ready(results)  # the views read them; also avoids the 2-core CPU hang
    except UsageError:
        cache.pop(key, None)
        raise
    except Exception as exc:
        cache.pop(key, None)
        explained = explain_trace_error(exc, cell.filename, tuple(axis_names))
        if explained is not None:
            raise explained from None
        raise
    except BaseException:  # KeyboardInterrupt: the next run starts from a clean cache
        cache.pop(key, None)
        raise
    elapsed = (time.perf_counter() - start) * 1e3
    if not first:
        return results, elapsed, signature
    compile_ms = (compile_clock() - compiled_before) * 1e3
    program.compile_ms[signature] = compile_ms
    return results, max(0.0, elapsed - compile_ms), signature


_MISSING = object()


class Rerun:
    """What a successful run checked, so that re-running the same cell on the same kind of inputs
    goes straight to the compiled program (the bench's "cached re-run" path).

    It stays valid while every input name holds an array of the same shape and dtype, every constant
    has the same fingerprint, and every name that was undefined (a builtin) is still undefined.
    Anything else takes the full path, which re-checks everything and explains mistakes.
    """

    __slots__ = ("inputs", "shapes", "reshape", "constants", "absent", "program", "key", "signature", "objects")

    def __init__(self, inputs, values, reshape, constants, absent, program, key):
        self.inputs = inputs  # None: never take the short path (pytree inputs)
        self.shapes = tuple((tuple(v.shape), v.dtype) for v in values) if inputs is not None else ()
        self.reshape = reshape  # per input: None, or the shape --split gives it
        self.constants = constants
        self.absent = absent
        self.program = program
        self.key = key
        self.signature = None  # set by the first successful run
        self.objects: dict = {}  # name -> Ref: names that must still hold these very objects (placed inputs)

    @classmethod
    def possible(cls, values) -> bool:
        return all(is_array(v) for v in values)  # pytrees take the full path

    def args(self, namespace: dict):
        """The program's arguments if nothing the first run checked has changed, else None."""
        if self.inputs is None:
            return None
        args = []
        for name, (shape, dtype), reshape in zip(self.inputs, self.shapes, self.reshape):
            value = namespace.get(name)
            if getattr(value, "shape", None) != shape or getattr(value, "dtype", None) != dtype:
                return None
            args.append(value if reshape is None else value.reshape(reshape))
        for name, fp in self.constants:
            value = namespace.get(name, _MISSING)
            if isinstance(fp, Ref):  # keyed by identity (a module, a class): the very object, or a new key
                if value is not fp.get():
                    return None
            elif value is _MISSING or fingerprint(value) != fp:
                return None
        for name in self.absent:
            if name in namespace:
                return None
        for name, ref in self.objects.items():
            value = namespace.get(name)
            if value is None or value is not ref.get():
                return None
        return args

    def remember(self, reruns: "BoundedCache", key, signature, objects=None) -> None:
        """After a successful run: later identical runs may take the short path."""
        if self.inputs is not None and self.signature is None:
            self.signature = signature
            # Held weakly: a placed array the user deletes must be freed, not kept by this record.
            self.objects = {name: Ref(value) for name, value in (objects or {}).items()}
            reruns.put(key, self)


def collectives_view_state(program: CellProgram, records, title: str, mesh, cell: cells.Cell, facts=None) -> dict:
    """The collective cards of a run compiled with --collectives (records: its extra outputs)."""
    import jax

    from .recorder import collectives_state
    from .summaries import to_host

    return collectives_state(title, program.recording.sites, jax.tree.map(to_host, records), mesh,
                             filename=cell.filename, line_text=cell.line,
                             compiled=facts.collectives if facts is not None else None)


def facts_for(program: CellProgram, signature, args, mesh, cell: cells.Cell):
    """The compiled program's collectives and costs, read once per input shapes."""
    facts = program.facts.get(signature)
    if facts is None:
        ids = [d.id for d in mesh.devices.flat]
        facts = program.facts[signature] = program_facts(
            program.jitted, args, ids, cell.filename, program.compile_ms.get(signature))
    return facts
