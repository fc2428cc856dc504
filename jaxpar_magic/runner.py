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
from .inputs import OutputTree, TreeInput, rebuilt
from .progress import Progress

CACHE_SIZE = 64


# --- inputs (the model itself is inputs.py) -------------------------------------------------------

def is_array_tree(value, abstract: bool = False) -> bool:
    """A value with array leaves (with `abstract`, ShapeDtypeStructs count as arrays): an input."""
    return TreeInput.of("value", value, abstract) is not None


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
    output_trees: dict = field(default_factory=dict)  # device output name -> OutputTree (its type, its statics)
    final_tree: list = field(default_factory=list)  # [OutputTree] when the final expression is computed on devices
    assembled: dict = field(default_factory=dict)  # %%shard_map: device output name -> the spec it is assembled by

    def final_of(self, traced_final) -> tuple[object, bool]:
        """The cell's final expression, and whether it was computed on the devices (traced)
        or is the plain Python value the trace saw."""
        on_devices = bool(self.final_per_device and self.final_per_device[0])
        if on_devices:
            return self.final_tree[0].rebuild(traced_final), True
        return (self.static_final[0] if self.static_final else None), False

    def outputs_of(self, device: dict, leaf_map=None) -> dict:
        """The device outputs rebuilt as the user's types around the program's leaves (each leaf
        first passed through `leaf_map`, e.g. --merge's reshape)."""
        rebuilt = {}
        for name in self.device_outputs:
            leaves = device[name]
            if leaf_map is not None:
                leaves = [leaf_map(name, leaf) for leaf in leaves]
            rebuilt[name] = self.output_trees[name].rebuild(leaves)
        return rebuilt


WRITE_BACK = "<state of {}>"  # an output carrying an NNX input's new state (never a Python name)


def cell_function(cell: cells.Cell, inputs, namespace: dict, write_back: bool = False):
    """The cell as a function of its inputs' traced leaves (one list per input): each input is
    rebuilt as the user's own type (inputs.py) before the cell's code sees it.

    NNX objects the cell changes in place (`optimizer.update(model, grads)`): with `write_back`,
    their new state leaves the program as an output named WRITE_BACK.format(name), written into the
    user's objects once the cell succeeded (`apply_write_backs`); without it (a per-device engine,
    where each device would hold its own copy), the change is refused with what to do instead.
    """
    fn = cells.build_function(cell, tuple(tree.name for tree in inputs), namespace)
    graphs = [i for i, tree in enumerate(inputs) if tree.graphdef is not None]
    if not graphs:
        return lambda *args: fn(*rebuilt(inputs, args))

    def on_leaves(*args):
        import jax

        from . import nnx_graphs

        values = rebuilt(inputs, args)
        outs, final = fn(*values)
        for i in graphs:
            tree = inputs[i]
            leaves, treedef = jax.tree.flatten(nnx_graphs.state(values[i]))
            if treedef == tree.treedef and all(leaves[j] is a for j, a in zip(tree.positions, args[i])):
                continue  # read, not changed
            if not write_back:
                raise UsageError(
                    f"the cell changes the Flax NNX object {tree.name!r} in place (its state after the cell differs "
                    f"from before). Here every device runs the cell on its own copy, so there is no one new state to "
                    f"write back. Run the training step with %%shard (it writes {tree.name!r}'s new state back, like "
                    f"nnx.jit), or use the functional form: `graphdef, state = nnx.split({tree.name})` before the "
                    f"cell, `nnx.merge(graphdef, state)` inside it, and assign the new `nnx.state(...)` to a name."
                )
            outs = dict(outs)
            outs[WRITE_BACK.format(tree.name)] = nnx_graphs.state(values[i])
        return outs, final

    return on_leaves


def recording(fn, inputs, axis_names):
    """The --collectives recording of a cell function: its cards name what each call moves, by the
    cell's own names and leaf paths (`pmean grads['w1']`)."""
    import jax

    from .recorder import record_collectives

    def output_label(path):
        if not path or getattr(path[0], "idx", None) not in (0, 1):
            return None
        if path[0].idx == 1:  # the final expression
            return "(result)" + jax.tree_util.keystr(tuple(path[1:]))
        name = getattr(path[1], "key", None) if len(path) > 1 else None
        if not isinstance(name, str) or name.startswith("<"):  # a write-back, not a name of the cell
            return None
        return name + jax.tree_util.keystr(tuple(path[2:]))

    def input_label(path):
        if len(path) != 2:
            return None
        return inputs[path[0].idx].label(path[1].idx)

    return record_collectives(fn, axis_names, label_output=output_label, label_input=input_label)


def split_write_backs(outputs: dict) -> tuple[dict, dict]:
    """(the cell's own outputs, {input name: its new NNX state}) from an engine's rebuilt outputs."""
    prefix, suffix = WRITE_BACK.split("{}")
    states = {n[len(prefix):-len(suffix)]: v for n, v in outputs.items() if n.startswith(prefix) and n.endswith(suffix)}
    own = {n: v for n, v in outputs.items() if not (n.startswith(prefix) and n.endswith(suffix))}
    return own, states


def apply_write_backs(namespace: dict, states: dict) -> None:
    """Write each changed NNX input's new state into the user's very object (after the cell succeeded)."""
    from . import nnx_graphs

    for name, state in states.items():
        nnx_graphs.update(namespace[name], state)


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
    """Split a traced cell's results: the traced leaves of each value computed on the devices go out
    through `to_device` (a list per name); the rest of it (its type, its static leaves) is kept on
    the program to rebuild it; plain Python values (a number assigned in the cell, a helper
    function) are remembered and bound as they are."""
    program.static_outputs, program.device_outputs, program.output_trees = {}, [], {}
    device = {}
    for name, value in outs.items():
        split = OutputTree.split(value)
        if split is None:
            program.static_outputs[name] = value
            continue
        program.output_trees[name], leaves = split
        program.device_outputs.append(name)
        device[name] = to_device(leaves)
    split = OutputTree.split(final)
    program.final_per_device[:] = [split is not None]
    program.static_final[:] = [None if split is not None else final]
    program.final_tree[:] = [split[0]] if split is not None else []
    return device, (to_device(split[1]) if split is not None else None)


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

    It stays valid while every input name holds a value of the same structure, static leaves and
    leaf shapes and dtypes (TreeInput.matching_arrays), every constant has the same fingerprint, and
    every name that was undefined (a builtin) is still undefined. Anything else takes the full path,
    which re-checks everything and explains mistakes.
    """

    __slots__ = ("inputs", "reshape", "constants", "absent", "program", "key", "signature", "placements")

    def __init__(self, inputs, reshape, constants, absent, program, key):
        self.inputs = inputs  # TreeInputs, in argument order
        self.reshape = reshape  # per input: None, or the leaf shapes --split gives it
        self.constants = constants
        self.absent = absent
        self.program = program
        self.key = key
        self.signature = None  # set by the first successful run
        self.placements: dict = {}  # name -> each leaf's sharding: placed inputs must still be laid out so

    def args(self, namespace: dict):
        """The program's arguments if nothing the first run checked has changed, else None."""
        args = []
        for tree, reshape in zip(self.inputs, self.reshape):
            arrays = tree.matching_arrays(namespace.get(tree.name, _MISSING))
            if arrays is None:
                return None
            if reshape is not None:
                arrays = [a.reshape(shape) for a, shape in zip(arrays, reshape)]
            placed = self.placements.get(tree.name)
            if placed is not None and any(getattr(a, "sharding", None) != s for a, s in zip(arrays, placed)):
                return None  # not where --in puts it: the full path places it again
            args.append(arrays)
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
        return args

    def remember(self, reruns: "BoundedCache", key, signature, placements=None) -> None:
        """After a successful run: later identical runs may take the short path. `placements`: the
        shardings --in gave each placed input's leaves (no arrays are kept by this record)."""
        if self.signature is None:
            self.signature = signature
            self.placements = dict(placements or {})
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
