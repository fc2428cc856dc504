"""A cell as a compiled program, and the cache that keeps it: the cell turned into a function of
its inputs' leaves, its outputs split into traced leaves and what rebuilds them, a bounded compile
cache, and the record that lets an identical re-run skip every check (Rerun).

Plain Python over JAX; no IPython. The engines build these; the run stage calls them.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from .bounded_cache import CACHE_SIZE, BoundedCache
from ..errors import UsageError
from . import analysis as cells, dict_keys, nnx_graphs
from .fingerprints import Ref, fingerprint, traced_callables
from .jax_traces import forget_traces
from .layout import same_layout
from .leaked_tracers import refuse_hidden
from .meshes import on_other_mesh, other_mesh_sharding
from .nnx_replay import ATTEMPTS, DirectWrite, GraphReplay
from .inputs import (
    OutputTree, TreeInput, deleted_input_error, deleted_leaf, jax_array_type, matching_group, merged_inputs,
    misplaced_input_error, misplaced_leaf, rebuilt,
)



def is_array_tree(value, abstract: bool = False) -> bool:
    """A value with array leaves (with `abstract`, ShapeDtypeStructs count as arrays): an input."""
    return TreeInput.of("value", value, abstract) is not None


def within_mesh(mesh):
    """The mesh as the context a cell's code is traced in (so `P('data')` alone means this mesh).

    Entered inside the traced function, not around the call: `jax.set_mesh` around every call
    takes jit off its fast C++ dispatch path (about 40 µs a call here, bench section 9)."""
    import jax

    return jax.sharding.use_abstract_mesh(getattr(mesh, "abstract_mesh", mesh))


def shape_signature(args) -> tuple:
    import jax

    return tuple((tuple(a.shape), str(a.dtype)) for a in jax.tree.leaves(args))


@dataclass
class CellProgram:
    """A cell compiled for one mesh and set of constants. Its program returns, beside the outputs'
    leaves, the CellTrace of the trace that built it: what the cell computed in Python belongs to
    each compiled variant, never to the program as a whole."""

    jitted: object
    facts: dict = field(default_factory=dict)  # shape signature -> ProgramFacts
    compile_ms: dict = field(default_factory=dict)  # shape signature -> first call's compile time
    recording: object = None  # recorder.Recording when compiled with --collectives
    assembled: dict = field(default_factory=dict)  # %%shard_map: device output name -> the spec it is assembled by
    donated: tuple = ()  # --donate: the positions of the arguments whose buffers the program reuses
    waits: dict = field(default_factory=dict)  # shape signature -> must a run wait for its result (run/program.must_wait)


TRACE = 2  # where a program's results hold its CellTrace: (device outputs, final, trace[, records])
RECORDS = 3  # --collectives: the records of the collective calls


@dataclass(eq=False)  # compared and hashed by identity: it sits in the output's treedef
class CellTrace:
    """What one trace of a cell computed in Python: its plain outputs, the shape of each device
    output (its type and static leaves), where the final expression came from, and (--collectives)
    the recorded calls' static facts.

    The program returns it as a leafless pytree node, so it lives in the output's treedef, which
    JAX keeps with the compiled executable of that very trace. Whichever variant jit picks (input
    shapes, dtypes, weak types, shardings), the Python values that come back are the ones its trace
    computed: a cell re-run on an earlier input shape binds that shape's `rows = x.shape[0]`.
    """

    static_outputs: dict
    device_outputs: tuple
    output_trees: dict  # device output name -> OutputTree (its type, its statics)
    final_on_devices: bool
    static_final: object  # the final expression's plain value (None when computed on devices)
    final_tree: object  # OutputTree of the final expression when computed on devices
    sites: tuple = ()  # --collectives: recorder.Site per recorded call of this trace
    input_objects: bool = False  # some output holds NNX objects the cell read (nnx_graphs.NodeRef), bound as them

    def final_of(self, traced_final) -> tuple[object, bool]:
        """The cell's final expression, and whether it was computed on the devices (traced)
        or is the plain Python value the trace saw."""
        if self.final_on_devices:
            return self.final_tree.rebuild(traced_final), True
        return self.static_final, False

    def bound_outputs(self, device: dict, leaf_map=None) -> dict:
        """Everything the cell binds: its plain Python outputs and its device outputs (outputs_of)."""
        outputs = dict(self.static_outputs)
        outputs.update(self.outputs_of(device, leaf_map))
        return outputs

    def outputs_of(self, device: dict, leaf_map=None, graphs: GraphReplay | None = None) -> dict:
        """The device outputs rebuilt as the user's types around the program's leaves (each leaf
        first passed through `leaf_map`, e.g. --merge's reshape). With `graphs` (the GraphReplay
        that checked this call's NNX inputs), a write-back output it can write directly is left a
        DirectWrite, not rebuilt as an nnx.State."""
        rebuilt = {}
        for name in self.device_outputs:
            leaves = device[name]
            if leaf_map is not None:
                leaves = [leaf_map(name, leaf) for leaf in leaves]
            tree = self.output_trees[name]
            if graphs is not None and name.startswith(_WRITE_BACK_PREFIX) and graphs.writes(tree):
                rebuilt[name] = DirectWrite(graphs, leaves)
            else:
                rebuilt[name] = tree.rebuild(leaves)
        return rebuilt


@functools.lru_cache(maxsize=1)
def _register_cell_trace() -> None:
    import jax

    jax.tree_util.register_static(CellTrace)  # no leaves; the object itself is the node's aux data


WRITE_BACK = "<state of {}>"  # an output carrying the new state of the inputs' NNX objects (never a Python name)


def cell_function(cell: cells.Cell, inputs, namespace: dict, write_back: bool = False, donated: bool = False,
                  outputs=None):
    """The cell as a function of its inputs' traced leaves (one list per input): each input is
    rebuilt as the user's own type (cell/inputs.py) before the cell's code sees it, the NNX objects
    of all of them merged as one graph, as `nnx.jit(f)(a, b)` does. `outputs` (--out's names): the
    only names it returns (`returned`); the others are temporaries, never checked or bound.

    NNX objects the cell changes in place (`optimizer.update(model, grads)`, a BatchNorm's
    statistics, an `Rngs` draw): with `write_back`, their new joint state leaves the program as an
    output named WRITE_BACK.format(the names of the inputs holding them), written into the user's
    objects once the cell succeeded (`write_backs_of`, `apply_write_backs`); without it (a
    per-device engine, where each device would hold its own copy), the change is refused with what
    to do instead. `donated` (--donate names an input holding NNX objects): their state leaves the
    program even when unchanged, as nnx.jit(donate_argnums=...) returns it, since the donated
    buffers the objects hold are gone after the run.
    """
    names = tuple(tree.name for tree in inputs)
    fn = cells.build_function(cell, names, namespace)
    # Built only to be traced: the user's helpers must trace again if what they read changed.
    constants = [namespace[n] for n in cell.reads if n in namespace and n not in names]
    held = [part for tree in inputs for part in [held for held, _ in tree.held] + [leaf for _, leaf in tree.statics]]
    forget_traces(traced_callables(constants + held))
    if not any(tree.graphdef is not None for tree in inputs):
        def on_arrays(*args):
            outs, final = fn(*rebuilt(inputs, args))
            outs = returned(outs, outputs)
            refuse_hidden(cell, outs, final)  # an object or closure holding a tracer
            return outs, final

        return on_arrays
    group = next(tree.group for tree in inputs if tree.graphdef is not None)

    def on_leaves(*args):
        values, merged = merged_inputs(inputs, args)
        try:
            outs, final = fn(*values)
            outs = returned(outs, outputs)
            if write_back:  # an output that is an object read binds as that very object, as nnx.jit returns it
                outs = {name: merged.referred(value) for name, value in outs.items()}
            refuse_hidden(cell, outs, final)
            changed = merged.changed()
            if changed is None and not donated:
                return outs, final  # read, not changed
            if changed is not None and not write_back:
                holder, where = changed
                raise UsageError(
                    f"the cell changes the Flax NNX object {where!r} in place (its state or attributes after the "
                    f"cell differ from before: new parameters, BatchNorm statistics, an Rngs draw, `.eval()`...). "
                    f"Here every device runs the cell on its own copy, so there is no one new state to write back. "
                    f"Run the training step with %%shard (it writes the new state back, like nnx.jit), or use the "
                    f"functional form: `graphdef, state = nnx.split({holder})` before the cell, `nnx.merge(graphdef, "
                    f"state)` inside it, and assign the new `nnx.state(...)` to a name (for a BatchNorm, call "
                    f"`.eval()` on it before the cell if the cell should only read its statistics)."
                )
            outs = dict(outs)
            outs[WRITE_BACK.format(", ".join(group))] = merged.written()
            return outs, final
        finally:
            merged.close()

    return on_leaves


_WRITE_BACK_PREFIX, _WRITE_BACK_SUFFIX = WRITE_BACK.split("{}")


def returned(outs: dict, outputs) -> dict:
    """What a cell returns of the names it assigned: all of them, or with --out only those listed
    (the others are temporaries, as a function's locals: a closure over a traced value among them
    is no leak); NNX write-backs always leave."""
    if outputs is None:
        return outs
    return {n: v for n, v in outs.items() if n in outputs or is_write_back(n)}


def is_write_back(name: str) -> bool:
    """Whether an output is the new state of the inputs' NNX objects (WRITE_BACK), not a user's name."""
    return name.startswith(_WRITE_BACK_PREFIX)


def split_write_backs(outputs: dict) -> tuple[dict, dict]:
    """(the cell's own outputs, {names of the inputs holding NNX objects: their new joint state})
    from an engine's rebuilt outputs."""
    prefix, suffix = _WRITE_BACK_PREFIX, _WRITE_BACK_SUFFIX
    for name in outputs:  # a plain loop, not any(...): this runs on every %%shard re-run (bench section 4)
        if name.startswith(prefix):
            break
    else:  # the common case: no NNX object changed
        return outputs, {}
    states = {tuple(n[len(prefix):-len(suffix)].split(", ")): v for n, v in outputs.items()
              if n.startswith(prefix) and n.endswith(suffix)}
    own = {n: v for n, v in outputs.items() if not (n.startswith(prefix) and n.endswith(suffix))}
    return own, states


def write_backs_of(namespace: dict, states: dict) -> list:
    """[(the values holding NNX objects, their new joint state)]: the user's objects are looked up
    now, before the cell's outputs are bound (a cell may rebind a name that held one)."""
    return [([namespace[name] for name in names], state) for names, state in states.items()]


def apply_write_backs(write_backs: list) -> None:
    """Write each new joint state into the user's very objects (after the cell succeeded)."""
    from . import nnx_graphs

    for values, state in write_backs:
        if isinstance(state, DirectWrite):  # the re-run's own check found the Variables (cell/nnx_replay.py)
            state.apply()
        else:
            nnx_graphs.write(values, state)


def traced(value) -> bool:
    import jax

    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(value))


@functools.lru_cache(maxsize=CACHE_SIZE)
def analyse_cached(source: str, label: str) -> cells.Cell:
    """A cell's analysis, computed once per source (a re-run skips parsing)."""
    return cells.analyse(source, label)


def capture_outputs(outs: dict, final, to_device, sites=()):
    """Split a traced cell's results: the traced leaves of each value computed on the devices go out
    through `to_device` (a list per name); the rest of it (its type, its static leaves) and plain
    Python values (a number assigned in the cell, a helper function) go into this trace's CellTrace.
    Returns (device leaves per name, the final expression's leaves or None, the CellTrace): what a
    cell's program returns."""
    _register_cell_trace()
    static_outputs, device_outputs, output_trees = {}, [], {}
    device = {}
    for name, value in outs.items():
        split = _output_split(name, value)
        if split is None and name.startswith(_WRITE_BACK_PREFIX):  # NNX objects left without state: still one
            split = OutputTree.split(value, always=True)
        if split is None:
            static_outputs[name] = value
            continue
        output_trees[name], leaves = split
        device_outputs.append(name)
        device[name] = to_device(leaves)
    split = _output_split(None, final)
    trace = CellTrace(static_outputs, tuple(device_outputs), output_trees, split is not None,
                      None if split is not None else final, split[0] if split is not None else None, tuple(sites),
                      any(nnx_graphs.holds_node_refs(value) for value in outs.values()))
    return device, (to_device(split[1]) if split is not None else None), trace


def _output_split(name: str | None, value):
    """OutputTree.split, with a dict JAX cannot flatten (keys of mixed types) kept as a plain Python
    value when nothing in it was computed on the devices, and named in a UsageError when something was.
    `name` None: the cell's final expression."""
    try:
        return OutputTree.split(value)
    except (ValueError, TypeError):
        found = dict_keys.first_unsortable(value)
        if found is None:
            raise
    import jax

    if not dict_keys.holds(value, lambda leaf: isinstance(leaf, jax.core.Tracer)):
        return None
    path, mapping = found
    what = f"output `{name}{path}`" if name is not None else f"final expression{f' (at {path})' if path else ''}"
    otherwise = f"`del {name}` at the end of the cell if it is only a temporary" if name is not None else \
        "end the cell with another expression"
    raise UsageError(
        f"the cell's {what} is a dict whose keys mix {dict_keys.key_types(mapping)}, and it holds values computed "
        f"on the devices: JAX sorts a dict's keys to flatten a program's results, and cannot order these (plain "
        f"jax.jit cannot return it either). Give its keys one type (e.g. `{{str(k): v for k, v in d.items()}}`), "
        f"or {otherwise}."
    )


_MISSING = object()


def _laid_out_as(arrays, placed: list) -> bool:
    """Whether each array has the layout --in gave its leaf (`placed`: their shardings), however its
    spec is spelled (layout.same_layout). A match spelled otherwise replaces the recorded sharding,
    so that the next re-run on arrays from the same program finds it equal at once."""
    for k, (array, sharding) in enumerate(zip(arrays, placed)):
        got = getattr(array, "sharding", None)
        if got is not sharding and got != sharding:
            if not same_layout(got, sharding, getattr(array, "ndim", 0)):
                return False
            placed[k] = got
    return True


class Rerun:
    """What a successful run checked, so that re-running the same cell on the same kind of inputs
    goes straight to the compiled program (the bench's "cached re-run" path).

    It stays valid while every input name holds a value of the same structure, static leaves and
    leaf shapes and dtypes (TreeInput.matching_arrays), every constant has the same fingerprint, and
    every name that was undefined (a builtin) is still undefined. Anything else takes the full path,
    which re-checks everything and explains mistakes.
    """

    __slots__ = ("inputs", "reshape", "constants", "constants_checked", "absent", "program", "key", "signature",
                 "placements", "checked", "graphs", "graph_replay", "graph_attempts", "graph_call", "mesh", "live")

    def __init__(self, inputs, reshape, constants, absent, program, key):
        self.inputs = inputs  # TreeInputs, in argument order
        self.reshape = reshape  # per input: None, or the leaf shapes --split gives it
        self.constants = constants
        self.constants_checked = tuple((name, fp, isinstance(fp, Ref)) for name, fp in constants)
        self.absent = absent
        self.program = program
        self.key = key
        self.signature = None  # set by the first successful run
        self.placements: dict = {}  # name -> each leaf's sharding: placed inputs must still be laid out so
        # Per bare input: (type, sharding, aval) of the last jax.Array that passed the checks. Every check
        # reads only these (a jax.Array is immutable; avals are interned, so `is` compares shape, dtype and
        # weak type), so an array with the very same three passes them again: re-running a cell on unchanged
        # inputs, or on the arrays its own program returned (`x = f(x)`: the program's output sharding is one
        # object), skips them (the full check costs ~5-15 µs a call, bench sections 9 and 15).
        self.checked: list = [None] * len(inputs)
        self.graphs = tuple(i for i, tree in enumerate(inputs) if tree.graphdef is not None)  # NNX inputs
        # NNX inputs' short check (cell/nnx_replay.py), made from a full check after the first run;
        # `graph_call` is it when it checked the last `args` call that succeeded (its write-back is direct).
        self.graph_replay: GraphReplay | None = None
        self.graph_attempts = 0
        self.graph_call: GraphReplay | None = None
        self.mesh = None  # the cell's mesh (program.run_cell sets it): an input from another one takes the full path
        # Whether the last args() found every input by `checked`, which saw it not deleted: its arguments need
        # no deleted_error (a full path's arguments come with a new Rerun, not live).
        self.live = False

    def args(self, namespace: dict):
        """The program's arguments if nothing the first run checked has changed, else None."""
        joint = graph_call = self.graph_call = None
        if self.graphs:  # the inputs holding NNX objects are split together, as they were, and matched so
            joint, graph_call = self._graph_args([namespace.get(self.inputs[i].name, _MISSING) for i in self.graphs])
            if joint is None:
                return None
            joint = dict(zip(self.graphs, joint))
        args, live = [], True
        for i, (tree, reshape) in enumerate(zip(self.inputs, self.reshape)):
            value = namespace.get(tree.name, _MISSING)
            seen = self.checked[i]
            if seen is not None and type(value) is seen[0] and value.sharding is seen[1] and value.aval is seen[2] \
                    and not value.is_deleted():  # deleted: donated
                arrays = [value]
            else:
                live = False
                arrays = tree.matching_arrays(value) if joint is None or i not in joint else joint[i]
                if arrays is None:
                    return None
                placed = self.placements.get(tree.name)
                if placed is not None and not _laid_out_as(arrays, placed):
                    return None  # not where --in puts it: the full path places it again
                if arrays and self.mesh is not None and on_other_mesh(arrays[0], self.mesh):
                    return None  # the full path lays it out again; calling with it would trace once more for
                    # nothing (a `print` in the cell twice). Its first leaf stands for it: one check per input.
                if tree.bare and self.signature is not None and isinstance(value, jax_array_type()) \
                        and (self.mesh is None or not other_mesh_sharding(value.sharding, self.mesh)):
                    self.checked[i] = (type(value), value.sharding, value.aval)
            if reshape is not None:
                if deleted_leaf(tree, arrays) is not None:
                    return None  # reshaping would raise JAX's error: the full path says what happened
                arrays = [a.reshape(shape) for a, shape in zip(arrays, reshape)]
            args.append(arrays)
        for name, fp, by_identity in self.constants_checked:
            value = namespace.get(name, _MISSING)
            if by_identity:  # keyed by identity (a module, a class): the very object, or a new key
                if value is not fp.get():
                    return None
            elif value is _MISSING or fingerprint(value) != fp:
                return None
        for name in self.absent:
            if name in namespace:
                return None
        self.graph_call, self.live = graph_call, live
        return args

    def _graph_args(self, values) -> tuple[list | None, GraphReplay | None]:
        """(each NNX input's leaves, or None when they no longer match; the GraphReplay that found
        them, or None when the full check did). A full check after the first run tries to make the
        record that later calls take instead (at most ATTEMPTS times for this Rerun)."""
        replay = self.graph_replay
        if replay is not None:
            found = replay.arrays(values)
            if found is not None:
                return found, replay
        members = [self.inputs[i] for i in self.graphs]
        found = matching_group(members, values)
        if found is not None and replay is None and self.signature is not None and self.graph_attempts < ATTEMPTS:
            self.graph_attempts += 1
            self.graph_replay = GraphReplay.of(members, values, found)
        return found, None

    def deleted_error(self, args, cell: cells.Cell) -> Exception | None:
        """The UsageError for the first input leaf whose buffers were deleted (donated), or None.
        Asked before every run: JAX 0.10's jit does not raise on a deleted argument on CPU, it
        crashes the process (SIGSEGV in PJRT's ExecuteLaunch; tests/test_differential.py found it,
        and plain `f(x); f(x)` with donate_argnums=0 does the same). One is_deleted() per leaf."""
        for tree, arrays in zip(self.inputs, args):
            index = deleted_leaf(tree, arrays)
            if index is not None:
                return deleted_input_error(tree, index, cell)
        return None

    def input_error(self, args, cell: cells.Cell, mesh, deleted: bool = True) -> Exception | None:
        """The UsageError naming the first input leaf among `args` that JAX cannot take: one whose
        buffers were deleted (donated), else one committed to other devices than the mesh's (jit moves
        no committed array); InputOnOtherMesh when one is on another mesh of the same devices (the full
        path lays it out again); None when there is none. Asked only once a run has failed: re-runs
        pay nothing for it. `deleted=False`: a donating run, whose inputs were checked before the call
        (a leaf deleted since was given to the program, no mistake of the cell's)."""
        from .meshes import InputOnOtherMesh

        pairs = list(zip(self.inputs, args))
        for tree, arrays in pairs if deleted else ():
            index = deleted_leaf(tree, arrays)
            if index is not None:
                return deleted_input_error(tree, index, cell)
        for tree, arrays in pairs:
            index = misplaced_leaf(tree, arrays, mesh)
            if index is not None:
                return misplaced_input_error(tree, index, arrays[index], cell, mesh)
        for tree, arrays in pairs:
            if any(on_other_mesh(leaf, mesh) for leaf in arrays):
                return InputOnOtherMesh(tree.name)
        return None

    def remember(self, reruns: "BoundedCache", key, signature, placements=None) -> None:
        """After a successful run: later identical runs may take the short path. `placements`: the
        shardings --in gave each placed input's leaves (no arrays are kept by this record)."""
        if self.signature is None:
            self.signature = signature
            self.placements = dict(placements or {})
            reruns.put(key, self)
