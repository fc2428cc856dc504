"""`%%pmap` function mode: ParallelFunction, our `jax.pmap` (pmap's in_axes/out_axes meaning, over
multi-axis meshes too), built as jit(shard_map) and compiled once per configuration; with
--collectives its first call records what each collective did.

Plain Python, no IPython.
"""
from __future__ import annotations

import functools
import linecache
from collections import OrderedDict

from ...cell.fingerprints import fingerprint, traced_callables
from ...cell.jax_traces import forget_traces
from ...cell.meshes import describe_mesh, is_explicit, on_cell_mesh, on_other_mesh, spec_on
from ...cell.bounded_cache import CACHE_SIZE
from ...errors import UsageError, explaining
from .program import ProgramFacts, block_on_cpu_collectives, compile_progress, has_collectives_on_cpu, program_facts
from .static_leaves import has_partitioned, rebuilt, split, split_all


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
        # With keep_facts (an exercise's answer: face/exercises/), each call keeps the facts of the
        # program it ran, for the check to read; off, a call pays one attribute test.
        self.keep_facts = False
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
                rebuilt(b if axis is None else jax.tree.map(
                    lambda a, ax=axis: a.reshape(a.shape[:ax] + a.shape[ax + k:]), b))
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
                return type(out)(jax.tree.map(lambda a, ax=ax: expand(a, ax), static_apart(o))
                                 for o, ax in zip(out, out_axes))
            return jax.tree.map(lambda a: expand(a, out_axes), static_apart(out))

        def static_apart(value):  # an output's untraceable leaves (a module's activation) leave as structure
            value = split(value)
            statics_out[0] = statics_out[0] or has_partitioned(value)
            return value

        statics_out = [False]  # set while jit traces: does the result carry static leaves to rebuild?

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

        return jax.jit(checked, donate_argnums=donate), statics_out

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

    def _statics(self, args) -> tuple:
        """((position, value), ...) of the static arguments: part of the compiled program's key, so
        each must be hashable, as jax.pmap requires (a list is not; a tuple is)."""
        statics = tuple((i, args[i]) for i in self.static_argnums if i < len(args))
        for i, value in statics:
            try:
                hash(value)
            except TypeError:
                name = self._arg_names(i + 1)[i]
                raise UsageError(
                    f"{self.__name__}: argument {name!r} (position {i}) is static (--static-broadcasted-argnums), and "
                    f"static arguments must be hashable, as jax.pmap requires; this one is a {type(value).__name__}, "
                    f"which is not. Pass a hashable value (a tuple instead of a list, a frozen dataclass), or drop "
                    f"{i} from --static-broadcasted-argnums and pass it as an array."
                ) from None
        return statics

    def _jitted_for(self, args, parts=None):
        """(the program's slot, its dynamic arguments); `parts`: the arguments as split_all gave them."""
        statics = self._statics(args)
        parts = split_all(args)[0] if parts is None else parts
        dynamic = tuple(a for i, a in enumerate(parts) if i not in self.static_argnums)
        in_axes = self._effective_in_axes(args)
        key = (statics, in_axes)
        # jit reads the function's globals once, at trace time: a changed global (a helper's
        # `scale`) must give a new program, not the first one's baked-in value.
        reads = fingerprint(self.__wrapped__)
        slot = self._jitted.get(key)
        if slot is None or slot[2] != reads:
            forget_traces(traced_callables((self.__wrapped__,)))  # its helpers trace again in the new program
            jitted, statics_out = self._build(statics, in_axes)
            slot = self._jitted[key] = [jitted, None, reads, statics_out]
            while len(self._jitted) > CACHE_SIZE:
                self._jitted.popitem(last=False)
        return slot, dynamic

    def __call__(self, *args):
        # Leaves JAX cannot trace (an Equinox module's activation) are static, as eqx.filter_pmap keeps them.
        parts, is_traced = split_all(args)
        if is_traced:
            return self._traced_call(args, parts)
        if self._record_next:
            return self._recorded_call(args)
        slot, dynamic = self._jitted_for(args, parts)
        jitted = slot[0]
        if slot[1] is None:  # the first call of this configuration compiles: say so if it takes a while
            import jax

            with compile_progress():
                out, dynamic = self._explained(jitted, dynamic)
                jax.block_until_ready(out)
        else:
            out, dynamic = self._explained(jitted, dynamic)
        if slot[1] is None:  # once per configuration: does this program need the CPU guard?
            slot[1] = has_collectives_on_cpu(self.mesh, jitted, dynamic)
        block_on_cpu_collectives(out, slot[1])
        if self.keep_facts:
            with on_cell_mesh(self.mesh):
                self.facts = program_facts(jitted, dynamic, [d.id for d in self.mesh.devices.flat],
                                           self.__wrapped__.__code__.co_filename)
        return rebuilt(out) if slot[3][0] else out

    def _traced_call(self, args, parts):
        """A call from code being traced. In per-device code over this function's axes (a %%pmap
        cell, another %%pmap function, jax.grad(loss) inside train_step) it is the plain per-device
        function, which is what the seed's code means (jax.pmap nested in jax.pmap fails on JAX 0.10).
        Outside per-device code (a %%shard cell, jax.jit, jax.grad of it) it is jax.pmap called
        inside jax.jit (`_mapped_in_trace`). Per-device code over other axes (a %%shard_map body) has
        neither meaning, and plain JAX refuses jax.pmap there too."""
        import jax

        context = jax.sharding.get_abstract_mesh()
        manual = () if context.empty else tuple(
            name for name, kind in zip(context.axis_names, context.axis_types) if kind == jax.sharding.AxisType.Manual)
        if set(self.axis_names) <= set(manual):
            return self.__wrapped__(*args)
        if manual:
            raise self._inside_other_axes(manual)
        return self._mapped_in_trace(args, parts)

    def _mapped_in_trace(self, args, parts):
        """jax.pmap's values inside the caller's trace: one jax.vmap per mesh axis, named as the axis,
        so that a collective over it reduces over the mapped entries as over pmap's devices. Not
        our jit(shard_map): under a %%shard cell's mesh (another mesh than ours, Explicit axes) JAX
        refuses a shard_map on our mesh, and its gradient across the two meshes. The caller's jit
        places the work. Each mapped leaf must still have one entry per device, as for jax.pmap."""
        import jax

        statics = dict(self._statics(args))
        in_axes = self._effective_in_axes(args)
        dynamic = [i for i in range(len(args)) if i not in statics]
        axes = tuple(in_axes[i] for i in dynamic)
        values = [_replicated(parts[i]) for i in dynamic]
        self._check_shapes(dynamic, axes, values)
        has_statics = [False]

        def per_entry(*blocks):
            found = iter(blocks)
            full = [statics[i] if i in statics else rebuilt(next(found)) for i in range(len(args))]
            out = self.__wrapped__(*full)
            if isinstance(self.out_axes, (tuple, list)) and isinstance(out, (tuple, list)):
                out = type(out)(split(o) for o in out)
            else:
                out = split(out)
            has_statics[0] = has_statics[0] or has_partitioned(out)
            return out

        mapped = per_entry
        for name in reversed(self.axis_names):  # the first mesh axis outermost: pmap's leading axes, in order
            mapped = jax.vmap(mapped, in_axes=axes, out_axes=self.out_axes, axis_name=name)
        out = mapped(*values)
        return rebuilt(out) if has_statics[0] else out

    def _inside_other_axes(self, manual: tuple) -> UsageError:
        name, axes = self.__name__, self.axis_names
        ours = ", ".join(repr(a) for a in axes)
        mesh = ",".join(f"{a}={n}" for a, n in zip(axes, self.mesh.devices.shape))
        how = f"`--mesh {mesh}`" + (f" in %%shard_map, `--axis-name {axes[0]}` in %%pmap" if len(axes) == 1 else "")
        return UsageError(
            f"`{name}` is a %%pmap function (its code runs on each device, over the mesh axis {ours}), called here "
            f"inside code that already runs on each device over the axis {', '.join(repr(a) for a in manual)} (a "
            f"%%shard_map cell, or a %%pmap cell or function of other axis names), where the axis {ours} does not "
            f"exist: plain JAX refuses jax.pmap inside jax.shard_map too. Call `{name}(...)` in a plain or %%shard "
            f"cell (it runs as jax.pmap does inside jax.jit), or name this cell's mesh axes as {name}'s ({how}) "
            f"so that `{name}(...)` runs its per-device code on this device's block."
        )

    def _explained(self, jitted, dynamic):
        """The call's result, and the arguments it ran on (laid out again when from another mesh)."""
        with explaining(self.__wrapped__.__code__.co_filename, self.axis_names), on_cell_mesh(self.mesh):
            try:
                return jitted(*dynamic), dynamic
            except Exception:
                # An argument laid out on another mesh of these devices (Explicit axes of other names):
                # shard_map cannot take it as it is. Checked only on failure, so calls pay nothing.
                moved = self._laid_out_again(dynamic)
                if moved is None:
                    raise
                return jitted(*moved), moved

    def _laid_out_again(self, dynamic):
        """`dynamic` with each leaf from another mesh put on this function's mesh, as
        `jax.device_put` does (its own spec where this mesh has its axes, else replicated), with a
        note; None when no leaf is on another mesh."""
        import jax
        from jax.sharding import NamedSharding, PartitionSpec as P

        leaves, treedef = jax.tree.flatten(dynamic)
        elsewhere = [on_other_mesh(leaf, self.mesh) for leaf in leaves]
        others = [leaf for leaf, moved in zip(leaves, elsewhere) if moved]
        if not others:
            return None
        print(f"jaxpar_magic: {len(others)} argument array(s) of `{self.__wrapped__.__name__}` are laid out on "
              f"another {describe_mesh(others[0].sharding.mesh)}; it runs on {describe_mesh(self.mesh)}, so they "
              f"were laid out again here as jax.device_put does. To skip the move, put them on the function's "
              f"mesh once (`jax.device_put(x, NamedSharding({self.__wrapped__.__name__}.mesh, P()))`).")
        return jax.tree.unflatten(treedef, [
            jax.device_put(leaf, NamedSharding(self.mesh, P(*spec_on(leaf, self.mesh))))
            if moved else leaf for leaf, moved in zip(leaves, elsewhere)])

    def _recorded_call(self, args):
        """The first call after `%%pmap --collectives`: run a recording program once, show its cards."""
        import jax
        from IPython.display import display

        from ..record.cards import collectives_state
        from ..record.recorder import record_collectives
        from ...views.summaries import to_host
        from ...views.collectives import CollectivesView

        statics = self._statics(args)
        dynamic = tuple(split(a) for i, a in enumerate(args) if i not in self.static_argnums)
        names = self._arg_names(len(args))

        def argument(path):  # `params['w1']`: the argument's name and the leaf's path
            return names[path[0].idx] + jax.tree_util.keystr(tuple(path[1:])) if path else None

        recording = record_collectives(self.__wrapped__, self.axis_names, label_input=argument,
                                       label_output=lambda path: "returned" + jax.tree_util.keystr(tuple(path)))
        jitted, statics_out = self._build(statics, self._effective_in_axes(args), recording)
        (out, records), dynamic = self._explained(jitted, dynamic)
        jax.block_until_ready(out)
        filename = self.__wrapped__.__code__.co_filename
        with on_cell_mesh(self.mesh):
            facts = program_facts(jitted, dynamic, [d.id for d in self.mesh.devices.flat], filename)
        self._cards = collectives_state(
            f"collectives of {self.__name__}()", recording.sites, jax.tree.map(to_host, records), self.mesh,
            filename=filename, line_text=lambda n: linecache.getline(filename, n).strip(), compiled=facts.collectives)
        self._record_next = False
        if self.keep_facts:
            self.facts = facts
        self._keep_recorded(args, statics, jitted, statics_out)
        display(CollectivesView(state=self._cards))
        return rebuilt(out) if statics_out[0] else out

    def _keep_recorded(self, args, statics, recorded, statics_out) -> None:
        """Later calls of this configuration run the recording program's outputs alone (a jit around
        it: JAX reuses its trace, and drops the records), so the function is traced once, as
        jax.pmap traces it: a `print` in it prints on the first call only."""
        import jax

        dynamic = [i for i in range(len(args)) if i not in dict(statics)]
        donate = tuple(dynamic.index(i) for i in self.donate_argnums if i in dynamic)
        plain = jax.jit(lambda *values: recorded(*values)[0], donate_argnums=donate)
        key = (statics, self._effective_in_axes(args))
        self._jitted[key] = [plain, None, fingerprint(self.__wrapped__), statics_out]

    def collectives(self):
        """The collective cards recorded by the first call after `%%pmap --collectives`, shown again."""
        from ...views.collectives import CollectivesView

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
        with on_cell_mesh(self.mesh):
            return program_facts(slot[0], dynamic, ids, self.__wrapped__.__code__.co_filename)


def _replicated(value):
    """`value` with each leaf whose type says it is split over Explicit mesh axes (a %%shard cell's
    `--in x=data`) made replicated: vmap cannot map such an axis (it would need that axis's name as
    spmd_axis_name). Same values."""
    import jax
    from jax.sharding import PartitionSpec as P

    def plain(leaf):
        sharding = getattr(jax.typeof(leaf), "sharding", None)
        spec, mesh = getattr(sharding, "spec", None), getattr(sharding, "mesh", None)
        if spec is None or not any(part is not None for part in spec) or not is_explicit(mesh):
            return leaf
        with jax.sharding.use_abstract_mesh(getattr(mesh, "abstract_mesh", mesh)):
            return jax.sharding.reshard(leaf, P())

    return jax.tree.map(plain, value)


def pmap(fn=None, *, mesh=None, axis_name: str = "i", devices=None, **options):
    """Plain-Python twin of `%%pmap` in function mode: `pmap(f, axis_name='batch')`."""
    from ...cell.meshes import single_axis

    if fn is None:
        return functools.partial(pmap, mesh=mesh, axis_name=axis_name, devices=devices, **options)
    return ParallelFunction(fn, mesh if mesh is not None else single_axis(axis_name, devices), **options)
