"""The `%%pmap` engine: per-device code over a mesh, as `jit(shard_map(...))` with pmap's meaning.

Plain Python, no IPython: `run_block(cell, namespace, mesh, ...)` runs a block-mode cell and
`ParallelFunction(fn, mesh, ...)` is our `jax.pmap` that also works over multi-axis meshes.

pmap semantics, kept exactly:
- a mapped input carries one leading axis per mesh axis; each device sees its slice without it;
- outputs come back with those leading axes;
- `shard_map` runs with `check_vma=False`, as `jax.pmap` does on JAX 0.10. With the default
  checks, grad of a per-device loss with respect to a *replicated* input is summed across devices
  automatically, and a following `lax.pmean` makes gradients N times too large.
"""
from __future__ import annotations

import functools
import linecache
from collections import OrderedDict
from dataclasses import dataclass

from . import cell as cells
from .errors import UsageError, explaining
from .fingerprints import fingerprint
from .inputs import absent_builtins, classify
from .pmap_inputs import check_same_leading, mapped_arrays, per_device_note
from .prepared import PreparedCell
from .runner import (
    CACHE_SIZE, BoundedCache, CellProgram, ProgramFacts, Rerun, analyse_cached, block_on_cpu_collectives,
    capture_outputs, cell_function, collectives_view_state, compile_progress, facts_for, has_collectives_on_cpu,
    program_facts, recording, run_program, traced,
)

# --- block mode --------------------------------------------------------------------------------

@dataclass
class BlockResult:
    outputs: dict  # name -> jax.Array with leading mesh axes (or a static Python value)
    device_outputs: tuple[str, ...]  # which outputs were computed per device
    final: object  # the final expression's value (per device when traced), or None
    final_per_device: bool
    has_final: bool
    mesh: object
    facts: ProgramFacts | None
    run_ms: float
    cell: cells.Cell | None = None
    per_device: dict | None = None  # device outputs before --merge: what the view shows per device
    collectives: dict | None = None  # the collective cards' view state (--collectives)

    @property
    def bindings(self) -> dict:
        """What a successful cell binds in the user's namespace."""
        return self.outputs


_block_cache = BoundedCache()
_reruns = BoundedCache()  # (source, mesh, options) -> Rerun of the last successful run


def _squeeze(k):
    import jax

    return lambda tree: jax.tree.map(lambda a: a.reshape(a.shape[k:]), tree)


def _expand(k):
    import jax
    import jax.numpy as jnp

    return lambda tree: jax.tree.map(lambda a: jnp.asarray(a).reshape((1,) * k + jnp.shape(a)), tree)


def _compile_block(cell, inputs, broadcast, mesh, namespace, collectives: bool = False) -> CellProgram:
    import jax
    from jax.sharding import PartitionSpec as P

    fn = cell_function(cell, inputs, namespace)
    k = len(mesh.axis_names)
    squeeze, expand = _squeeze(k), _expand(k)
    mapped_flags = [tree.name not in broadcast for tree in inputs]
    program = CellProgram(jitted=None)
    # --collectives: the same cell, evaluated so that every collective also hands out a small
    # preview of its input and output, as extra outputs of this one program.
    program.recording = recording(fn, inputs, mesh.axis_names) if collectives else None

    def per_device(*blocks):
        values = [squeeze(b) if mapped else b for b, mapped in zip(blocks, mapped_flags)]
        if program.recording is None:
            outs, final = fn(*values)
            return capture_outputs(program, outs, final, expand)
        (outs, final), records = program.recording(*values)
        return (*capture_outputs(program, outs, final, expand), expand(records))

    axes = P(*mesh.axis_names)
    in_specs = tuple(axes if m else P() for m in mapped_flags)
    program.jitted = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=in_specs, out_specs=axes, check_vma=False))
    return program


def run_block(cell: cells.Cell, namespace: dict, mesh, *, broadcast=(), split=(), merge=(),
              want_facts: bool = False, collectives: bool = False) -> BlockResult:
    """Run a block-mode cell on every device of `mesh`; the namespace is read, never written."""
    rerun_key = (cell.source, mesh, tuple(broadcast), tuple(split), tuple(merge), collectives)
    rerun = _reruns.get(rerun_key)
    args = rerun.args(namespace) if rerun is not None else None
    if args is None:
        rerun, args = _plan_block(cell, namespace, mesh, broadcast, split, merge, collectives)
    program = rerun.program
    try:
        results, run_ms, signature = run_program(
            _block_cache, rerun.key, program, args, cell, mesh.axis_names, signature=rerun.signature)
    except UsageError:
        raise
    except Exception as exc:  # the user's own error: unchanged, with what each device saw
        if hasattr(exc, "add_note"):
            exc.add_note(per_device_note(cell, namespace, mesh, broadcast))
        raise
    rerun.remember(_reruns, rerun_key, signature)
    device, final = results[0], results[1]
    facts = facts_for(program, signature, args, mesh, cell) if want_facts or collectives else None
    result = _block_result(cell, mesh, program, device, final, merge, facts if want_facts else None, run_ms)
    if collectives:
        result.collectives = collectives_view_state(
            program, results[2], f"collectives of the %%pmap cell ({', '.join(mesh.axis_names)})", mesh, cell, facts)
    return result


def prepare(cell: cells.Cell, namespace: dict, mesh, *, broadcast=(), split=(), merge=(),
            abstract: bool = False) -> PreparedCell:
    """The %%pmap engine's prepare step: names against the cell, mapped inputs against the mesh.

    Every array leaf of a mapped input is checked (and with --split, reshaped) to carry one slice
    per device on its leading axes; broadcast inputs go whole. With `abstract` (--plan, --as-code)
    ShapeDtypeStructs count as arrays and are reshaped without computing anything."""
    from jax.sharding import PartitionSpec as P

    broadcast, split, merge = tuple(broadcast), tuple(split), tuple(merge)
    cells.check_axis_names(cell.source, tuple(mesh.axis_names))
    inputs, constants = classify(cell, namespace, {"--broadcast": broadcast, "--split": split}, abstract)
    for name in merge:
        if name not in cell.writes:
            raise UsageError(
                f"--merge {name}: the cell does not assign {name!r}; --merge takes outputs the cell assigns "
                f"({', '.join(cell.writes) or 'none'})."
            )
    arrays = [tree.arrays(namespace[tree.name]) for tree in inputs]
    # Inputs that disagree with each other are named together, before either is held to the mesh.
    check_same_leading([(t, a) for t, a in zip(inputs, arrays) if t.name not in broadcast and t.name not in split],
                        mesh.devices.size)
    args = [a if t.name in broadcast else mapped_arrays(t, a, mesh, t.name in split) for t, a in zip(inputs, arrays)]
    mapped = tuple(P(*mesh.axis_names))
    leaf_specs = tuple((() if t.name in broadcast else mapped,) * len(a) for t, a in zip(inputs, args))
    prepared = PreparedCell("pmap", cell, mesh, inputs, constants, args, leaf_specs,
                            options={"broadcast": broadcast, "split": split, "merge": merge})
    prepared.compile = lambda collectives=False: _compile_block(cell, inputs, frozenset(broadcast), mesh, namespace,
                                                               collectives)
    return prepared


def plan_block(cell: cells.Cell, namespace: dict, mesh, *, broadcast=(), split=(), merge=(), hardware=None,
               device_memory=None):
    """The --plan stage of a block-mode cell: its program compiled over abstract inputs (each mapped
    input one slice per device, as a global array split over the mesh), never run."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    from .planning import plan_program

    prepared = prepare(cell, namespace, mesh, broadcast=broadcast, split=split, merge=merge, abstract=True)
    per_device = NamedSharding(mesh, P(*mesh.axis_names))
    prepared.arguments = [
        a if t.name in broadcast else [jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=per_device) for leaf in a]
        for t, a in zip(prepared.inputs, prepared.arguments)]
    k = len(mesh.axis_names)
    merged = NamedSharding(mesh, P(tuple(mesh.axis_names)))

    def merge_output(name, leaf):
        """--merge: the device and block axes flattened into one, split over all mesh axes."""
        if name not in merge:
            return leaf
        rows = _product(leaf.shape[:k + 1])
        return jax.ShapeDtypeStruct((rows,) + tuple(leaf.shape[k + 1:]), leaf.dtype, sharding=merged)

    return plan_program(prepared, hardware=hardware, device_memory=device_memory, set_mesh=False,
                        reshape=merge_output)


def _product(sizes) -> int:
    total = 1
    for s in sizes:
        total *= int(s)
    return total


def _plan_block(cell, namespace, mesh, broadcast, split, merge, collectives=False):
    """The full path: prepare, find or compile the program, and remember what was checked."""
    prepared = prepare(cell, namespace, mesh, broadcast=broadcast, split=split, merge=merge)
    fingerprints = prepared.fingerprints(namespace)
    key = (cell.source, tuple(t.key for t in prepared.inputs), tuple(sorted(broadcast)), mesh, collectives,
           fingerprints)
    program = _block_cache.lookup(key, lambda: prepared.program(collectives), family=key[:-1])
    reshape = tuple(tuple(tuple(a.shape) for a in arrays) if t.name in split else None
                    for t, arrays in zip(prepared.inputs, prepared.arguments))
    rerun = Rerun(prepared.inputs, reshape, fingerprints, absent_builtins(cell, namespace), program, key)
    return rerun, prepared.arguments


def _block_result(cell, mesh, program, device, final, merge, facts, run_ms) -> BlockResult:
    k = len(mesh.axis_names)

    def merged(name, leaf):
        return leaf.reshape((-1,) + leaf.shape[k + 1:]) if name in merge else leaf

    outputs = dict(program.static_outputs)
    outputs.update(program.outputs_of(device, merged))
    final, on_devices = program.final_of(final)
    return BlockResult(
        outputs=outputs,
        device_outputs=tuple(program.device_outputs),
        final=final,
        final_per_device=on_devices,
        has_final=cell.has_final_expression,
        mesh=mesh,
        facts=facts,
        run_ms=run_ms,
        cell=cell,
        per_device=program.outputs_of(device),
    )


def clear_cache() -> None:
    _block_cache.clear()
    _reruns.clear()


# --- function mode: our pmap -------------------------------------------------------------------

def _per_arg(value, count: int, option: str):
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise UsageError(f"{option} has {len(value)} entries but the function takes {count} arguments.")
        return tuple(value)
    return (value,) * count


class ParallelFunction:
    """`fn` mapped over the devices of `mesh` with `jax.pmap`'s meaning, multi-axis meshes included.

    `in_axes`/`out_axes` name the position of the device axis (or axes, one per mesh axis) in each
    argument/output; `None` broadcasts (replicates). The original stays at `.__wrapped__`.
    """

    def __init__(self, fn, mesh, in_axes=0, out_axes=0, static_broadcasted_argnums=(), donate_argnums=(),
                 collectives: bool = False):
        functools.update_wrapper(self, fn)
        self.mesh = mesh
        self.in_axes = in_axes
        self.out_axes = out_axes
        self.static_argnums = tuple(
            (static_broadcasted_argnums,) if isinstance(static_broadcasted_argnums, int) else static_broadcasted_argnums
        )
        self.donate_argnums = tuple((donate_argnums,) if isinstance(donate_argnums, int) else donate_argnums)
        self._jitted: OrderedDict = OrderedDict()  # (static args, in_axes) -> [jitted, needs CPU guard, reads]
        self.facts: ProgramFacts | None = None
        # --collectives: the first call runs a recording program and keeps its cards; later calls
        # run the plain one, so only that first call pays for the extra outputs.
        self._record_next = collectives
        self._cards: dict | None = None
        self._parameters: list[str] | None = None

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(self.mesh.axis_names)

    def _build(self, statics: tuple, all_in_axes: tuple, recording=None):
        import jax
        import jax.numpy as jnp
        from jax.sharding import PartitionSpec as P

        k = len(self.axis_names)
        total = len(all_in_axes)
        dynamic = [i for i in range(total) if i not in dict(statics)]
        in_axes = [all_in_axes[i] for i in dynamic]
        fn = self.__wrapped__
        static_values = dict(statics)

        def spec(axis):
            return P() if axis is None else P(*([None] * axis + list(self.axis_names)))

        def per_device(*blocks):
            values = [
                b if axis is None else jax.tree.map(
                    lambda a, ax=axis: a.reshape(a.shape[:ax] + a.shape[ax + k:]), b)
                for b, axis in zip(blocks, in_axes)
            ]
            full, it = [], iter(values)
            for i in range(total):
                full.append(static_values[i] if i in static_values else next(it))
            if recording is not None:
                out, records = recording(*full)
                return expand_out(out), jax.tree.map(lambda a: expand(a, 0), records)
            return expand_out(fn(*full))

        def expand(a, ax):
            a = jnp.asarray(a)
            return a if ax is None else a.reshape(a.shape[:ax] + (1,) * k + a.shape[ax:])

        def expand_out(out):
            out_axes = self.out_axes
            if isinstance(out_axes, (tuple, list)) and isinstance(out, (tuple, list)):
                return type(out)(jax.tree.map(lambda a, ax=ax: expand(a, ax), o) for o, ax in zip(out, out_axes))
            return jax.tree.map(lambda a: expand(a, out_axes), out)

        def out_spec_tree():
            if isinstance(self.out_axes, (tuple, list)):
                return tuple(spec(ax) for ax in self.out_axes)
            return spec(self.out_axes)

        donate = tuple(dynamic.index(i) for i in self.donate_argnums if i in dynamic)
        out_specs = out_spec_tree() if recording is None else (out_spec_tree(), P(*self.axis_names))
        mapped = jax.shard_map(per_device, mesh=self.mesh, in_specs=tuple(spec(a) for a in in_axes),
                               out_specs=out_specs, check_vma=False)

        def checked(*values):  # runs when jit traces: the leaves' shapes cost nothing per call
            self._check_shapes(dynamic, in_axes, values)
            return mapped(*values)

        return jax.jit(checked, donate_argnums=donate)

    def _arg_names(self, count: int) -> list[str]:
        names = self._parameters
        if names is None:  # read once: inspect.signature costs ~60 µs, and this runs on every call
            import inspect

            try:
                names = list(inspect.signature(self.__wrapped__).parameters)
            except (TypeError, ValueError):
                names = []
            self._parameters = names
        return [names[i] if i < len(names) else f"argument {i}" for i in range(count)]

    def _effective_in_axes(self, args) -> tuple:
        """pmap's in_axes per argument, with plain Python numbers broadcast (pmap would reject them).

        Per call this looks at the arguments themselves only, never at their leaves: the leaves'
        shapes are checked once per compiled program, when jit traces it (`_check_shapes`)."""
        axes = _per_arg(self.in_axes, len(args), "--in-axes")
        effective = []
        for i, (arg, axis) in enumerate(zip(args, axes)):
            if i in self.static_argnums or (axis is not None and isinstance(arg, (bool, int, float, complex))):
                axis = None  # static, or a learning rate, a step count: every device gets the same value
            effective.append(axis)
        return tuple(effective)

    def _check_shapes(self, dynamic_positions, in_axes, values) -> None:
        """Each mapped leaf has one entry per device along its axis (run while jit traces)."""
        import jax

        names = self._arg_names(max(dynamic_positions, default=-1) + 1)
        sizes = tuple(self.mesh.devices.shape)
        k = len(sizes)
        for i, axis, value in zip(dynamic_positions, in_axes, values):
            if axis is None:
                continue
            for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
                shape = tuple(getattr(leaf, "shape", ()))
                if shape[axis:axis + k] != sizes:
                    want = "x".join(map(str, sizes))
                    label = names[i] + jax.tree_util.keystr(path)
                    raise UsageError(
                        f"{self.__name__}: argument {label!r} has shape {shape}, but axis {axis} must have "
                        f"{want} entries (one per device of the mesh {dict(zip(self.axis_names, sizes))}). "
                        f"Reshape it, or broadcast it with in_axes=None (`--in-axes` with None at position {i})."
                    )

    def _jitted_for(self, args):
        statics = tuple((i, args[i]) for i in self.static_argnums if i < len(args))
        dynamic = tuple(a for i, a in enumerate(args) if i not in self.static_argnums)
        in_axes = self._effective_in_axes(args)
        key = (statics, in_axes)
        # jit reads the function's globals once, at trace time: a changed global (a helper's
        # `scale`) must give a new program, not the first one's baked-in value.
        reads = fingerprint(self.__wrapped__)
        slot = self._jitted.get(key)
        if slot is None or slot[2] != reads:
            slot = self._jitted[key] = [self._build(statics, in_axes), None, reads]
            while len(self._jitted) > CACHE_SIZE:
                self._jitted.popitem(last=False)
        return slot, dynamic

    def __call__(self, *args):
        if traced(args):
            # Called from code that is already being traced per device (another cell function, or
            # jax.grad(loss) inside train_step): run as the plain per-device function, which is what
            # the seed's code means. jax.pmap nested in jax.pmap fails on JAX 0.10; use --mesh.
            return self.__wrapped__(*args)
        if self._record_next:
            return self._recorded_call(args)
        slot, dynamic = self._jitted_for(args)
        jitted = slot[0]
        if slot[1] is None:  # the first call of this configuration compiles: say so if it takes a while
            import jax

            with compile_progress():
                out = self._explained(jitted, dynamic)
                jax.block_until_ready(out)
        else:
            out = self._explained(jitted, dynamic)
        if slot[1] is None:  # once per configuration: does this program need the CPU guard?
            slot[1] = has_collectives_on_cpu(self.mesh, jitted, dynamic)
        block_on_cpu_collectives(out, slot[1])
        return out

    def _explained(self, jitted, dynamic):
        with explaining(self.__wrapped__.__code__.co_filename, self.axis_names):
            return jitted(*dynamic)

    def _recorded_call(self, args):
        """The first call after `%%pmap --collectives`: run a recording program once, show its cards."""
        import jax
        from IPython.display import display

        from .recorder import collectives_state, record_collectives
        from .summaries import to_host
        from .views.collectives import CollectivesView

        statics = tuple((i, args[i]) for i in self.static_argnums if i < len(args))
        dynamic = tuple(a for i, a in enumerate(args) if i not in self.static_argnums)
        names = self._arg_names(len(args))

        def argument(path):  # `params['w1']`: the argument's name and the leaf's path
            return names[path[0].idx] + jax.tree_util.keystr(tuple(path[1:])) if path else None

        recording = record_collectives(self.__wrapped__, self.axis_names, label_input=argument,
                                       label_output=lambda path: "returned" + jax.tree_util.keystr(tuple(path)))
        jitted = self._build(statics, self._effective_in_axes(args), recording)
        out, records = self._explained(jitted, dynamic)
        jax.block_until_ready(out)
        filename = self.__wrapped__.__code__.co_filename
        facts = program_facts(jitted, dynamic, [d.id for d in self.mesh.devices.flat], filename)
        self._cards = collectives_state(
            f"collectives of {self.__name__}()", recording.sites, jax.tree.map(to_host, records), self.mesh,
            filename=filename, line_text=lambda n: linecache.getline(filename, n).strip(), compiled=facts.collectives)
        self._record_next = False
        display(CollectivesView(state=self._cards))
        return out

    def collectives(self):
        """The collective cards recorded by the first call after `%%pmap --collectives`, shown again."""
        from .views.collectives import CollectivesView

        if self._cards is None:
            raise UsageError(
                f"{self.__name__}.collectives(): nothing was recorded. Define {self.__name__} in a `%%pmap --collectives` "
                f"cell, then call it once: that call records what each collective did."
            )
        return CollectivesView(state=self._cards)

    def program_facts(self, *args) -> ProgramFacts:
        """Collectives, compile time and costs of the program a call with `args` runs."""
        slot, dynamic = self._jitted_for(args)
        ids = [d.id for d in self.mesh.devices.flat]
        return program_facts(slot[0], dynamic, ids, self.__wrapped__.__code__.co_filename)


def pmap(fn=None, *, mesh=None, axis_name: str = "i", devices=None, **options):
    """Plain-Python twin of `%%pmap` in function mode: `pmap(f, axis_name='batch')`."""
    from .meshes import single_axis

    if fn is None:
        return functools.partial(pmap, mesh=mesh, axis_name=axis_name, devices=devices, **options)
    return ParallelFunction(fn, mesh if mesh is not None else single_axis(axis_name, devices), **options)


# --- the plain-Python twin of %%pmap -----------------------------------------------------------

def mesh_for(axis_name: str = "i", devices=None, mesh=None):
    """The mesh a cell runs over: `mesh` (a Mesh, or 'outer=2,inner=4'), else one named axis."""
    from .meshes import build_mesh, single_axis
    from .specs import MeshShape, parse_mesh_shape

    if mesh is None:
        return single_axis(axis_name, devices)
    if isinstance(mesh, (str, list)):
        mesh = parse_mesh_shape(mesh)
    if isinstance(mesh, MeshShape):
        return build_mesh(mesh, devices)
    return mesh


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
              donate_argnums=(), want_facts: bool = False, bind: bool = True, collectives: bool = False):
    """Run `source` as `%%pmap` would: per-device code (block mode) or pmapped definitions.

    Returns a BlockResult (block mode) or the dict of bound functions (function mode). With
    `bind`, outputs go into `namespace` only after the whole cell succeeded.
    """
    cell = analyse_cached(source, "pmap-cell")
    mesh = mesh_for(axis_name, devices, mesh)
    if cell.mode == "function":
        bound = bind_functions(cell, namespace, mesh, in_axes=in_axes, out_axes=out_axes,
                               static_broadcasted_argnums=static_broadcasted_argnums,
                               donate_argnums=donate_argnums, collectives=collectives)
        if bind:
            namespace.update(bound)  # one step: an interrupt leaves all or nothing
        return bound
    result = run_block(cell, namespace, mesh, broadcast=tuple(broadcast), split=tuple(split),
                       merge=tuple(merge), want_facts=want_facts, collectives=collectives)
    if bind:
        namespace.update(result.bindings)
    return result
