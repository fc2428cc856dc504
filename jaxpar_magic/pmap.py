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
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from . import cell as cells
from .errors import UsageError, explain_trace_error
from .hlo import Collective, collectives

CACHE_SIZE = 64


# --- inputs ------------------------------------------------------------------------------------

def is_array(value) -> bool:
    import jax
    import numpy as np

    return isinstance(value, (jax.Array, np.ndarray))


def is_array_tree(value) -> bool:
    """An array, or a (non-empty) tuple/list/dict pytree whose leaves are all arrays."""
    import jax

    if is_array(value):
        return True
    if not isinstance(value, (tuple, list, dict)):
        return False
    leaves = jax.tree.leaves(value)
    return bool(leaves) and all(is_array(leaf) for leaf in leaves)


def fingerprint(value):
    """What a constant contributes to the cache key: its value where cheap, else its identity.

    A cache keyed on the source alone would bake the constants of the first run into every later
    run, since jit reads globals once, at trace time.
    """
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return (type(value).__name__, value)
    if isinstance(value, tuple) and len(value) <= 64:
        return ("tuple",) + tuple(fingerprint(v) for v in value)
    if isinstance(value, (list, dict, set)) and len(value) <= 64:
        return ("repr", type(value).__name__, repr(value))
    return ("id", id(value))


# --- the collectives view's facts, shared with %%shard -------------------------------------------

@dataclass
class ProgramFacts:
    collectives: list[Collective]
    compile_ms: float | None = None
    flops: float | None = None
    bytes_accessed: float | None = None


def program_facts(jitted, args, device_ids, filename=None) -> ProgramFacts:
    """Collectives and costs of the program `jitted(*args)` runs (jit's cache makes this cheap)."""
    start = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    compile_ms = (time.perf_counter() - start) * 1e3
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


def shape_signature(args) -> tuple:
    import jax

    return tuple((tuple(a.shape), str(a.dtype)) for a in jax.tree.leaves(args))


def block_on_cpu_collectives(values, facts_or_flag) -> None:
    """Wait for a result when the program has collectives on the CPU backend.

    On a 2-core machine, XLA's CPU collectives deadlock once 50-70 such programs are queued back to
    back ("Expected 8 threads to join the rendezvous ...") and the process aborts a minute later.
    Waiting for each result keeps one program in flight at a time; it costs the overlap of Python
    dispatch with device work (a few microseconds a call, measured in bench/).
    """
    import jax

    if facts_or_flag:
        jax.block_until_ready(values)


def _has_collectives_on_cpu(mesh, jitted, args) -> bool:
    if mesh.devices.flat[0].platform != "cpu":
        return False
    return bool(collectives(jitted.lower(*args).compile().as_text()))


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


@dataclass
class _Compiled:
    jitted: object
    static_outputs: dict = field(default_factory=dict)
    static_final: list = field(default_factory=list)
    device_outputs: list = field(default_factory=list)
    final_per_device: list = field(default_factory=list)
    facts: dict = field(default_factory=dict)  # shape signature -> ProgramFacts
    needs_block: dict = field(default_factory=dict)


_block_cache: OrderedDict = OrderedDict()


def _leading(value, k: int):
    import jax

    return {tuple(leaf.shape[:k]) for leaf in jax.tree.leaves(value)}


def plan_inputs(cell: cells.Cell, namespace: dict, broadcast=(), split=()):
    """Split the names a cell reads into array inputs and constants; undefined names are errors."""
    import builtins

    inputs, constants = [], []
    for name in cell.reads:
        if name in namespace:
            value = namespace[name]
            (inputs if is_array_tree(value) else constants).append(name)
        elif not hasattr(builtins, name):
            lineno = _first_line_reading(cell, name)
            raise UsageError(
                f"name {name!r} is not defined (line {lineno} of the cell: `{cell.line(lineno)}`). Define it "
                f"in an earlier cell, or fix the spelling."
            )
    for option, names in (("--broadcast", broadcast), ("--split", split)):
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


def check_axis_names(source: str, axis_names: tuple[str, ...]) -> None:
    for lineno, text, axis in cells.collective_axis_literals(source):
        if axis not in axis_names:
            raise UsageError(
                f"line {lineno} of the cell (`{text}`): unknown axis name {axis!r}. This cell runs over "
                f"the axis {'names' if len(axis_names) > 1 else 'name'} {', '.join(map(repr, axis_names))}; "
                f"use {'one of them' if len(axis_names) > 1 else 'it'}, or run the cell with "
                f"`--axis-name {axis}` (or `--mesh {axis}=N,...`)."
            )


def _mapped_value(name, value, mesh, split: bool):
    """Validate (and with --split, reshape) a mapped input's leading axes against the mesh."""
    import jax

    sizes = tuple(mesh.devices.shape)
    k, total = len(sizes), mesh.devices.size
    if split:
        def reshape(leaf):
            if leaf.ndim == 0 or leaf.shape[0] % total:
                raise UsageError(
                    f"--split {name}: its leading axis has {leaf.shape[0] if leaf.ndim else 'no'} rows, which "
                    f"does not divide evenly over {total} devices. Use a batch that is a multiple of {total} "
                    f"(e.g. {total * max(1, (leaf.shape[0] if leaf.ndim else 1) // total)}), or trim it "
                    f"(`{name}[:{total * ((leaf.shape[0] if leaf.ndim else 0) // total)}]`)."
                )
            return leaf.reshape(sizes + (leaf.shape[0] // total,) + leaf.shape[1:])
        return jax.tree.map(reshape, value)
    for leaf in jax.tree.leaves(value):
        if tuple(leaf.shape[:k]) != sizes:
            have = "x".join(map(str, leaf.shape[:k])) or "no leading axis (a scalar)"
            want = "x".join(map(str, sizes))
            hint = (f"pass `--split {name}` to split its {leaf.shape[0]} rows into {total} blocks, "
                    if leaf.ndim and leaf.shape[0] % total == 0 else "")
            axes = ", ".join(f"{n}={s}" for n, s in zip(mesh.axis_names, sizes))
            raise UsageError(
                f"input {name!r} has shape {tuple(leaf.shape)}: its leading axis is {have} but the cell runs "
                f"over {want} devices ({axes}), and a mapped input needs one slice per device. Give {name!r} "
                f"a leading axis of {want}, {hint}or pass `--broadcast {name}` to give every device the whole array."
            )
    return value


def _check_same_leading(mapped: dict, k: int) -> None:
    seen = {}
    for name, value in mapped.items():
        for lead in _leading(value, k):
            seen.setdefault(lead, name)
    if len(seen) > 1:
        (a, na), (b, nb) = list(seen.items())[:2]
        raise UsageError(
            f"mapped inputs disagree on their leading axis: {na!r} has {a[0] if len(a) == 1 else a} and {nb!r} has "
            f"{b[0] if len(b) == 1 else b}. Every mapped input needs one slice per device; reshape them to agree, "
            f"use `--split` on a batch, or `--broadcast` an input every device should see whole."
        )


def _squeeze(k):
    import jax

    return lambda tree: jax.tree.map(lambda a: a.reshape(a.shape[k:]), tree)


def _expand(k):
    import jax
    import jax.numpy as jnp

    return lambda tree: jax.tree.map(lambda a: jnp.asarray(a).reshape((1,) * k + jnp.shape(a)), tree)


def _traced(value) -> bool:
    import jax

    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(value))


def _compile_block(cell, inputs, broadcast, mesh, namespace) -> _Compiled:
    import jax
    from jax.sharding import PartitionSpec as P

    fn = cells.build_function(cell, inputs, namespace)
    k = len(mesh.axis_names)
    squeeze, expand = _squeeze(k), _expand(k)
    mapped_flags = [name not in broadcast for name in inputs]
    entry = _Compiled(jitted=None)

    def per_device(*blocks):
        values = [squeeze(b) if mapped else b for b, mapped in zip(blocks, mapped_flags)]
        outs, final = fn(*values)
        # Trace-time facts: which outputs depend on device data, and the plain Python ones.
        entry.static_outputs = {n: v for n, v in outs.items() if not _traced(v)}
        entry.device_outputs = [n for n, v in outs.items() if _traced(v)]
        traced_final = _traced(final)
        entry.final_per_device[:] = [traced_final]
        entry.static_final[:] = [None if traced_final else final]
        device = {n: expand(outs[n]) for n in entry.device_outputs}
        return device, (expand(final) if traced_final else None)

    axes = P(*mesh.axis_names)
    in_specs = tuple(axes if m else P() for m in mapped_flags)
    entry.jitted = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=in_specs, out_specs=axes, check_vma=False))
    return entry


def run_block(cell: cells.Cell, namespace: dict, mesh, *, broadcast=(), split=(), merge=(),
              want_facts: bool = False) -> BlockResult:
    """Run a block-mode cell on every device of `mesh`; the namespace is read, never written."""
    import jax

    axis_names = tuple(mesh.axis_names)
    check_axis_names(cell.source, axis_names)
    inputs, constants = plan_inputs(cell, namespace, broadcast, split)
    for name in merge:
        if name not in cell.writes:
            raise UsageError(
                f"--merge {name}: the cell does not assign {name!r}; --merge takes outputs the cell assigns "
                f"({', '.join(cell.writes) or 'none'})."
            )
    k = len(axis_names)
    args = []
    mapped = {}
    for name in inputs:
        value = namespace[name]
        if name not in broadcast:
            value = _mapped_value(name, value, mesh, name in split)
            mapped[name] = value
        args.append(value)
    _check_same_leading(mapped, k)

    key = (cell.source, inputs, tuple(sorted(broadcast)), mesh,
           tuple((n, fingerprint(namespace[n])) for n in constants))
    entry = _block_cache.get(key)
    if entry is None:
        entry = _compile_block(cell, inputs, frozenset(broadcast), mesh, namespace)
        _block_cache[key] = entry
        while len(_block_cache) > CACHE_SIZE:
            _block_cache.popitem(last=False)
    else:
        _block_cache.move_to_end(key)

    signature = shape_signature(args)
    start = time.perf_counter()
    try:
        device, final = entry.jitted(*args)
        jax.block_until_ready((device, final))  # the view reads them; also avoids the CPU hang
    except UsageError:
        raise
    except Exception as exc:
        _block_cache.pop(key, None)
        explained = explain_trace_error(exc, cell.filename, axis_names)
        if explained is not None:
            raise explained from None
        raise
    run_ms = (time.perf_counter() - start) * 1e3

    facts = None
    if want_facts:
        facts = entry.facts.get(signature)
        if facts is None:
            ids = [d.id for d in mesh.devices.flat]
            facts = entry.facts[signature] = program_facts(entry.jitted, args, ids, cell.filename)

    outputs = dict(entry.static_outputs)
    for name in entry.device_outputs:
        value = device[name]
        if name in merge:
            value = jax.tree.map(lambda a: a.reshape((-1,) + a.shape[k + 1:]), value)
        outputs[name] = value
    per_device = bool(entry.final_per_device and entry.final_per_device[0])
    return BlockResult(
        outputs=outputs,
        device_outputs=tuple(entry.device_outputs),
        final=final if per_device else (entry.static_final[0] if entry.static_final else None),
        final_per_device=per_device,
        has_final=cell.has_final_expression,
        mesh=mesh,
        facts=facts,
        run_ms=run_ms,
        cell=cell,
    )


def clear_cache() -> None:
    _block_cache.clear()


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

    def __init__(self, fn, mesh, in_axes=0, out_axes=0, static_broadcasted_argnums=(), donate_argnums=()):
        functools.update_wrapper(self, fn)
        self.mesh = mesh
        self.in_axes = in_axes
        self.out_axes = out_axes
        self.static_argnums = tuple(
            (static_broadcasted_argnums,) if isinstance(static_broadcasted_argnums, int) else static_broadcasted_argnums
        )
        self.donate_argnums = tuple((donate_argnums,) if isinstance(donate_argnums, int) else donate_argnums)
        self._jitted: OrderedDict = OrderedDict()  # (static args, in_axes) -> [jitted, needs CPU guard]
        self.facts: ProgramFacts | None = None

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(self.mesh.axis_names)

    def _build(self, statics: tuple, all_in_axes: tuple):
        import jax
        import jax.numpy as jnp
        from jax.sharding import PartitionSpec as P

        k = len(self.axis_names)
        total = len(all_in_axes)
        count = total - len(statics)
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
            out = fn(*full)
            out_axes = self.out_axes

            def expand(a, ax):
                a = jnp.asarray(a)
                return a if ax is None else a.reshape(a.shape[:ax] + (1,) * k + a.shape[ax:])

            if isinstance(out_axes, (tuple, list)) and isinstance(out, (tuple, list)):
                return type(out)(jax.tree.map(lambda a, ax=ax: expand(a, ax), o) for o, ax in zip(out, out_axes))
            return jax.tree.map(lambda a: expand(a, out_axes), out)

        def out_spec_tree():
            if isinstance(self.out_axes, (tuple, list)):
                return tuple(spec(ax) for ax in self.out_axes)
            return spec(self.out_axes)

        donate = tuple(dynamic.index(i) for i in self.donate_argnums if i in dynamic)
        mapped = jax.shard_map(per_device, mesh=self.mesh, in_specs=tuple(spec(a) for a in in_axes),
                               out_specs=out_spec_tree(), check_vma=False)
        return jax.jit(mapped, donate_argnums=donate)

    def _arg_names(self, count: int) -> list[str]:
        import inspect

        try:
            names = list(inspect.signature(self.__wrapped__).parameters)
        except (TypeError, ValueError):
            names = []
        return [names[i] if i < len(names) else f"argument {i}" for i in range(count)]

    def _effective_in_axes(self, args) -> tuple:
        """pmap's in_axes per argument, with plain Python numbers broadcast (pmap would reject them)."""
        axes = _per_arg(self.in_axes, len(args), "--in-axes")
        names = self._arg_names(len(args))
        sizes = tuple(self.mesh.devices.shape)
        k = len(sizes)
        effective = []
        for i, (arg, axis) in enumerate(zip(args, axes)):
            if i in self.static_argnums:
                effective.append(None)
                continue
            if axis is not None and isinstance(arg, (bool, int, float, complex)):
                axis = None  # a learning rate, a step count: every device gets the same number
            if axis is not None:
                import jax

                for leaf in jax.tree.leaves(arg):
                    shape = tuple(getattr(leaf, "shape", ()))
                    if shape[axis:axis + k] != sizes:
                        want = "x".join(map(str, sizes))
                        raise UsageError(
                            f"{self.__name__}: argument {names[i]!r} has shape {shape}, but axis {axis} must have "
                            f"{want} entries (one per device of the mesh {dict(zip(self.axis_names, sizes))}). "
                            f"Reshape it, or broadcast it with in_axes=None (`--in-axes` with None at position {i})."
                        )
            effective.append(axis)
        return tuple(effective)

    def _jitted_for(self, args):
        statics = tuple((i, args[i]) for i in self.static_argnums if i < len(args))
        dynamic = tuple(a for i, a in enumerate(args) if i not in self.static_argnums)
        in_axes = self._effective_in_axes(args)
        key = (statics, in_axes)
        slot = self._jitted.get(key)
        if slot is None:
            slot = self._jitted[key] = [self._build(statics, in_axes), None]
            while len(self._jitted) > CACHE_SIZE:
                self._jitted.popitem(last=False)
        return slot, dynamic

    def __call__(self, *args):
        if _traced(args):
            # Called from code that is already being traced per device (another cell function, or
            # jax.grad(loss) inside train_step): run as the plain per-device function, which is what
            # the seed's code means. jax.pmap nested in jax.pmap fails on JAX 0.10; use --mesh.
            return self.__wrapped__(*args)
        slot, dynamic = self._jitted_for(args)
        jitted = slot[0]
        try:
            out = jitted(*dynamic)
        except UsageError:
            raise
        except Exception as exc:
            explained = explain_trace_error(exc, self.__wrapped__.__code__.co_filename, self.axis_names)
            if explained is not None:
                raise explained from None
            raise
        if slot[1] is None:  # once per configuration: does this program need the CPU guard?
            slot[1] = _has_collectives_on_cpu(self.mesh, jitted, dynamic)
        block_on_cpu_collectives(out, slot[1])
        return out

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

@functools.lru_cache(maxsize=CACHE_SIZE)
def analyse_cached(source: str, label: str) -> cells.Cell:
    return cells.analyse(source, label)


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
              donate_argnums=(), want_facts: bool = False, bind: bool = True):
    """Run `source` as `%%pmap` would: per-device code (block mode) or pmapped definitions.

    Returns a BlockResult (block mode) or the dict of bound functions (function mode). With
    `bind`, outputs go into `namespace` only after the whole cell succeeded.
    """
    cell = analyse_cached(source, "pmap-cell")
    mesh = mesh_for(axis_name, devices, mesh)
    if cell.mode == "function":
        bound = bind_functions(cell, namespace, mesh, in_axes=in_axes, out_axes=out_axes,
                               static_broadcasted_argnums=static_broadcasted_argnums,
                               donate_argnums=donate_argnums)
        if bind:
            namespace.update(bound)
        return bound
    result = run_block(cell, namespace, mesh, broadcast=tuple(broadcast), split=tuple(split),
                       merge=tuple(merge), want_facts=want_facts)
    if bind:
        namespace.update(result.outputs)
    return result
