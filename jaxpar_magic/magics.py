"""The IPython layer: parse the magic line, call the plain-Python core, display a view.

Nothing here computes anything the twins in `pmap.py` / `devices.py` don't.
"""
from __future__ import annotations

import functools

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display
from traitlets import Bool, Unicode
from traitlets.config import Configurable

from . import lines
from .errors import UsageError


def show_devices(simulate: int | None = None):
    """Plain-Python twin of `%devices`: the device view (asking for simulated devices first)."""
    from .devices import devices_state, simulate as ask_for
    from .views.devices import DevicesView

    if simulate is not None:
        ask_for(simulate)
    return DevicesView(state=devices_state())


def show_mesh(mesh, name: str = "mesh"):
    """Plain-Python twin of `%mesh`: the mesh view of a Mesh or AbstractMesh."""
    from .summaries import mesh_state
    from .views.mesh import MeshView

    return MeshView(state=mesh_state(mesh, name))


def show_sharding(value, name: str = "array"):
    """Plain-Python twin of `%sharding x`: where every piece of `value` lives."""
    from .summaries import sharding_state
    from .views.sharding import ShardingView

    return ShardingView(state=sharding_state(name, value))


def result_view(result, title: str, report: bool):
    from .summaries import report_figures, result_state
    from .views.results import ResultView

    outputs = dict(result.per_device)
    if result.has_final and result.final_per_device and not result.cell.final_is_output:
        outputs["(result)"] = result.final
    facts = result.facts
    figures = report_figures(facts, result.run_ms) if report and facts is not None else None
    return ResultView(state=result_state(title, result.mesh, outputs, facts, result.cell.line, figures))


@magics_class
class JaxparMagics(Magics, Configurable):
    """%devices, %%pmap (and friends): JAX parallelism you can see."""

    axis_name = Unicode("i", help="Default axis name of a %%pmap cell (-a/--axis-name overrides it).").tag(config=True)
    show = Bool(True, help="Show the per-device result view after a %%pmap cell (--show/--no-show override it).").tag(
        config=True
    )

    def __init__(self, shell=None, **kwargs):
        super().__init__(shell=shell, config=shell.config if shell is not None else None, **kwargs)

    # --- %devices --------------------------------------------------------------------------------
    @line_magic
    @magic_arguments()
    @argument("--simulate", type=int, metavar="N",
              help="Ask for N simulated CPU devices; must come before any JAX computation in this kernel.")
    @no_var_expand
    def devices(self, line=""):
        """Show the devices JAX sees: id, platform, kind, process, coords, memory; counts per platform."""
        options = parse_line("devices", line)
        display(show_devices(options.simulate))

    # --- %%pmap ----------------------------------------------------------------------------------
    @cell_magic
    @magic_arguments()
    @argument("-a", "--axis-name", help="Name of the device axis used in collectives (default: %%config JaxparMagics.axis_name, 'i').")
    @argument("--devices", nargs="+", metavar="N_OR_IDS", help="The first N local devices, or a list of device ids.")
    @argument("--mesh", nargs="+", metavar="AXIS=SIZE", help="Run over a multi-axis mesh, e.g. --mesh outer=2,inner=4; every axis name works in collectives.")
    @argument("--broadcast", nargs="+", default=[], metavar="NAME", help="Give every device these inputs whole (pmap's in_axes=None).")
    @argument("--split", nargs="+", default=[], metavar="NAME", help="Split these inputs' leading axis of n*k rows into n blocks of k.")
    @argument("--merge", nargs="+", default=[], metavar="NAME", help="Flatten these outputs' device and block axes back into one.")
    @argument("--in-axes", help="Function mode: pmap's in_axes, a Python literal, e.g. '(0, None)'.")
    @argument("--out-axes", help="Function mode: pmap's out_axes, a Python literal.")
    @argument("--static-broadcasted-argnums", help="Function mode: positions of static arguments, e.g. '(2,)'.")
    @argument("--donate-argnums", help="Function mode: positions of arguments whose buffers may be reused.")
    @argument("--show", dest="show", action="store_const", const=True, default=None, help="Show the per-device result view.")
    @argument("--no-show", dest="show", action="store_const", const=False, help="Do not show the result view.")
    @argument("--report", action="store_true", help="Add compile time, run time, flops and bytes to the view.")
    @argument("--collectives", action="store_true", help="Show one card per collective call: what every device held before and after it, and the data movement (function mode: the first call records them; fn.collectives() shows them again).")
    @argument("--as-code", action="store_true", help="Do not run the cell: print the plain JAX it stands for, a self-contained snippet.")
    @argument("--plan", action="store_true", help="Compile for the mesh without running: per-device memory, collectives, FLOPs; names are bound as jax.ShapeDtypeStructs. Inputs may be abstract (jaxpar_magic.plan(...)).")
    @argument("--hardware", metavar="NAME", help="With --plan: a device profile for the fit and a roofline step time: tpu-v4, tpu-v5e, tpu-v5p, h100, a100, or custom:flops=...,hbm=...,bw=...,memory=...")
    @argument("--device-memory", metavar="SIZE", help="With --plan: the device's memory, e.g. 16GiB (overrides the profile's).")
    @no_var_expand
    def pmap(self, line, cell):
        """Run the cell as what ONE device runs, on every device at once.

        Block mode: arrays the cell reads are split over their leading axis (one slice per device);
        names it assigns come back with a leading device axis. Function mode (a cell that only
        defines functions): each function is bound as its pmapped version.
        """
        from .pmapping import pmap_cell

        options = parse_line("pmap", line)
        if options.as_code:
            return _print_code("pmap", options, self.shell, cell, axis_name=options.axis_name or self.axis_name)
        if options.plan is not None:
            return _show_plan("pmap", options, self.shell, cell, axis_name=options.axis_name or self.axis_name,
                              devices=options.devices, mesh=options.mesh, broadcast=options.broadcast,
                              split=options.split, merge=options.merge)
        show = self.show if options.show is None else options.show
        namespace = self.shell.user_ns
        result = pmap_cell(
            _transformed(self.shell, cell),
            namespace,
            axis_name=options.axis_name or self.axis_name,
            devices=options.devices,
            mesh=options.mesh,
            broadcast=options.broadcast,
            split=options.split,
            merge=options.merge,
            in_axes=options.in_axes,
            out_axes=options.out_axes,
            static_broadcasted_argnums=options.static_broadcasted_argnums,
            donate_argnums=options.donate_argnums,
            want_facts=show or options.report,
            bind=False,
            collectives=options.collectives,
        )
        if isinstance(result, dict):  # function mode
            if show:
                from .pmapping import ParallelFunction

                for name, fn in result.items():
                    if isinstance(fn, ParallelFunction):
                        recorded = "; its first call shows what each collective did" if options.collectives else ""
                        print(f"{name}: pmapped over {fn.mesh.devices.size} devices, axes {fn.axis_names}; "
                              f"original at {name}.__wrapped__{recorded}")
            namespace.update(result)
            return None
        if show:
            sizes = "x".join(str(s) for s in result.mesh.devices.shape)
            axes = ", ".join(result.mesh.axis_names)
            display(result_view(result, f"%%pmap over {sizes} devices (axis {axes})", options.report))
        elif options.report and result.facts is not None:
            f = result.facts
            print(f"compile {f.compile_ms:.1f} ms, run {result.run_ms:.2f} ms, flops {f.flops}, bytes {f.bytes_accessed}, "
                  f"collectives {[c.op for c in f.collectives]}")
        _show_cards(result.collectives)
        # Bound last, in one step: an interrupt at any earlier moment leaves the namespace as it was.
        namespace.update(result.bindings)
        return result.final if result.has_final and not _silenced(cell) else None

    # --- %mesh ------------------------------------------------------------------------------------
    @line_magic
    @magic_arguments()
    @argument("axes", nargs="*", metavar="AXIS=SIZE",
              help="Axis sizes, e.g. `data=4 model=2`; or the name of an existing mesh to show it.")
    @argument("--name", default="mesh", help="Bind the mesh under this name (default: mesh).")
    @argument("--axis-types", default="auto", choices=["auto", "explicit", "manual"],
              help="Mesh axis types (default auto: the compiler partitions plain code).")
    @argument("--devices", nargs="+", metavar="N_OR_IDS", help="Use the first N devices, or these device ids.")
    @argument("--abstract", action="store_true", help="An AbstractMesh: plan layouts for devices you don't have.")
    @argument("--no-show", dest="show", action="store_false", help="Do not show the mesh view.")
    @no_var_expand
    def mesh(self, line=""):
        """Build a device mesh (binds `mesh`) and show it: devices laid out by mesh coordinates."""
        from .shard import is_mesh, make_mesh

        options = parse_line("mesh", line)
        namespace = self.shell.user_ns
        if options.shape is None:
            name = options.show_name
            if not is_mesh(namespace.get(name)):
                raise UsageError(
                    f"%mesh {name}: no mesh called {name!r} in your namespace. Build one with `%mesh data=4 model=2`."
                )
            display(show_mesh(namespace[name], name))
            return
        mesh = make_mesh(options.shape, options.devices, options.axis_types, options.abstract)
        namespace[options.name] = mesh
        if options.show:
            display(show_mesh(mesh, options.name))

    # --- %sharding ---------------------------------------------------------------------------------
    @line_magic
    @magic_arguments()
    @argument("names", nargs="+", metavar="NAME", help="Arrays (jax.Array, ShapeDtypeStruct) to show.")
    @no_var_expand
    def sharding(self, line=""):
        """Show how each array is laid out over devices: tiles coloured by device, the PartitionSpec."""
        options = parse_line("sharding", line)
        namespace = self.shell.user_ns
        from .runner import is_array_tree

        for name in options.names:
            if name not in namespace:
                raise UsageError(f"%sharding {name}: {name!r} is not defined.")
            if not is_array_tree(namespace[name], abstract=True):
                raise UsageError(
                    f"%sharding {name}: {name!r} is a {type(namespace[name]).__name__}; %sharding shows arrays "
                    "(jax.Array, or jax.ShapeDtypeStruct with a sharding), or a dict/list/tuple of them."
                )
        for name in options.names:
            for label, leaf in _array_leaves(name, namespace[name]):
                display(show_sharding(leaf, label))

    # --- %%shard -----------------------------------------------------------------------------------
    @cell_magic
    @magic_arguments()
    @argument("--mesh", nargs="+", metavar="NAME_OR_AXES", help="A Mesh by name (`--mesh mesh`) or inline (`--mesh data=4,model=2`).")
    @argument("--in", dest="ins", nargs="+", metavar="NAME=SPEC",
              help="Place inputs: `v=data`, `w=data,None`, `w=(data,model),None`, `w=P('data', None)`, or `v=8` (split axis 0 over 8 devices).")
    @argument("--out", dest="outs", nargs="+", metavar="NAME=SPEC", help="Constrain outputs' layout, same syntax.")
    @argument("--show", dest="show", action="store_const", const=True, default=None, help="Show the sharding views.")
    @argument("--no-show", dest="show", action="store_const", const=False, help="Do not show the views.")
    @argument("--report", action="store_true", help="Show the compiled program's collectives, compile and run time.")
    @argument("--as-code", action="store_true", help="Do not run the cell: print the plain JAX it stands for, a self-contained snippet.")
    @argument("--plan", action="store_true", help="Compile for the mesh without running: per-device memory, collectives, FLOPs; names are bound as jax.ShapeDtypeStructs. Inputs may be abstract (jaxpar_magic.plan(...)).")
    @argument("--hardware", metavar="NAME", help="With --plan: a device profile for the fit and a roofline step time: tpu-v4, tpu-v5e, tpu-v5p, h100, a100, or custom:flops=...,hbm=...,bw=...,memory=...")
    @argument("--device-memory", metavar="SIZE", help="With --plan: the device's memory, e.g. 16GiB (overrides the profile's).")
    @no_var_expand
    def shard(self, line, cell):
        """Run the cell's code unchanged on sharded inputs: the compiler partitions the work.

        Inputs named in --in are placed with those PartitionSpecs (and rebound, placed); outputs come
        back as sharded arrays; the views show where every piece lives.
        """
        from .shard import shard_cell

        options = parse_line("shard", line)
        if options.as_code:
            return _print_code("shard", options, self.shell, cell)
        if options.plan is not None:
            return _show_plan("shard", options, self.shell, cell, mesh=options.mesh, in_specs=options.in_specs,
                              out_specs=options.out_specs)
        show = self.show if options.show is None else options.show
        namespace = self.shell.user_ns
        result = shard_cell(
            _transformed(self.shell, cell),
            namespace,
            mesh=options.mesh,
            in_specs=options.in_specs,
            out_specs=options.out_specs,
            want_facts=options.report,
            bind=False,
        )
        if show:
            for name, value in result.placed.items():
                display(show_sharding(value, name))
            for name in result.device_outputs:
                for label, leaf in _array_leaves(name, result.outputs[name]):
                    display(show_sharding(leaf, label))
            if result.has_final and result.final_is_array and not result.cell.final_is_output:
                for label, leaf in _array_leaves("(result)", result.final):
                    display(show_sharding(leaf, label))
        if options.report and result.facts is not None:
            from .summaries import program_report_state
            from .views.results import ResultView

            display(ResultView(state=program_report_state(
                "%%shard program", result.mesh, result.facts, result.run_ms, result.cell.line)))
        namespace.update(result.bindings)  # last, in one step (see %%pmap)
        return result.final if result.has_final and not _silenced(cell) else None


    # --- %%shard_map -------------------------------------------------------------------------------
    @cell_magic
    @magic_arguments()
    @argument("--mesh", nargs="+", metavar="NAME_OR_AXES", help="A Mesh by name (`--mesh mesh`) or inline (`--mesh x=4,y=2`); default: the namespace's `mesh`.")
    @argument("--in", dest="ins", nargs="+", metavar="NAME=SPEC",
              help="Split these inputs into blocks by PartitionSpec: `a=x,y`, `b=y,None`, `w=P('x', None)`. Other arrays the cell reads are replicated (every device sees them whole).")
    @argument("--out", dest="outs", nargs="+", metavar="NAME=SPEC",
              help="Assemble these outputs from their blocks: `c=x,None` concatenates the blocks along dimension 0 over x. An output without --out must be provably the same on every device (P()).")
    @argument("--no-check-vma", dest="check_vma", action="store_false",
              help="Turn off JAX's varying-axes checks (jax.shard_map's check_vma=False); every output then needs --out.")
    @argument("--show", dest="show", action="store_const", const=True, default=None, help="Show the per-device blocks and the outputs' layouts.")
    @argument("--no-show", dest="show", action="store_const", const=False, help="Do not show the views.")
    @argument("--report", action="store_true", help="Add the compiled program's collectives, compile and run time.")
    @argument("--collectives", action="store_true", help="Show one card per collective call: what every device held before and after it, and the data movement (function mode: the first call records them; fn.collectives() shows them again).")
    @argument("--as-code", action="store_true", help="Do not run the cell: print the plain JAX it stands for, a self-contained snippet.")
    @argument("--plan", action="store_true", help="Compile for the mesh without running: per-device memory, collectives, FLOPs; names are bound as jax.ShapeDtypeStructs. Inputs may be abstract (jaxpar_magic.plan(...)).")
    @argument("--hardware", metavar="NAME", help="With --plan: a device profile for the fit and a roofline step time: tpu-v4, tpu-v5e, tpu-v5p, h100, a100, or custom:flops=...,hbm=...,bw=...,memory=...")
    @argument("--device-memory", metavar="SIZE", help="With --plan: the device's memory, e.g. 16GiB (overrides the profile's).")
    @no_var_expand
    def shard_map(self, line, cell):
        """Run the cell as the body of `jax.shard_map`: every device runs it on its own blocks.

        Names in --in are split by their specs (each device sees its block, of the same rank); names
        in --out are assembled from the blocks by theirs; the cell uses collectives (lax.psum,
        all_gather, ...) over the mesh's axis names explicitly. Runs under jax.jit, cached.
        """
        from .shardmap import shard_map_cell

        options = parse_line("shard_map", line)
        if options.as_code:
            return _print_code("shard_map", options, self.shell, cell)
        if options.plan is not None:
            return _show_plan("shard_map", options, self.shell, cell, mesh=options.mesh, in_specs=options.in_specs,
                              out_specs=options.out_specs, check_vma=options.check_vma)
        show = self.show if options.show is None else options.show
        namespace = self.shell.user_ns
        result = shard_map_cell(
            _transformed(self.shell, cell),
            namespace,
            mesh=options.mesh,
            in_specs=options.in_specs,
            out_specs=options.out_specs,
            check_vma=options.check_vma,
            want_facts=show or options.report,
            bind=False,
            collectives=options.collectives,
        )
        if show:
            from .summaries import report_figures, result_state
            from .views.results import ResultView

            device = {n: result.outputs[n] for n in result.device_outputs}
            if result.has_final and result.final_is_array and not result.cell.final_is_output:
                device["(result)"] = result.final
            sizes = ", ".join(f"{n}={s}" for n, s in result.mesh.shape.items())
            figures = report_figures(result.facts, result.run_ms) if options.report and result.facts else None
            display(ResultView(state=result_state(
                f"%%shard_map over {result.mesh.devices.size} devices ({sizes}): each device's block", result.mesh,
                device, result.facts, result.cell.line, figures, blocks=True)))
            for name, value in device.items():
                for label, leaf in _array_leaves(name, value):
                    display(show_sharding(leaf, label))
        elif options.report and result.facts is not None:
            from .summaries import program_report_state
            from .views.results import ResultView

            display(ResultView(state=program_report_state(
                "%%shard_map program", result.mesh, result.facts, result.run_ms, result.cell.line)))
        _show_cards(result.collectives)
        namespace.update(result.bindings)  # last, in one step (see %%pmap)
        return result.final if result.has_final and not _silenced(cell) else None


def _show_plan(magic: str, options, shell, cell: str, **engine_options) -> None:
    """--plan: compile the cell for its mesh without running it, show the plan view, bind the
    names it assigns as ShapeDtypeStructs (last, in one step)."""
    from .planned import plan_cell
    from .views.plan import PlanView

    plan = plan_cell(_transformed(shell, cell), shell.user_ns, magic=magic, hardware=options.plan.hardware,
                     device_memory=options.plan.device_memory, bind=False, **engine_options)
    sizes = ", ".join(f"{n}={s}" for n, s in plan.axes.items())
    show = options.show is not False
    if show:
        display(PlanView(state=plan.state(f"%%{magic} --plan over {plan.mesh.devices.size} devices ({sizes})")))
    shell.user_ns.update(plan.bindings)
    return None


def _show_cards(state: dict | None) -> None:
    """--collectives: one card per collective call, below the cell's other views."""
    if state is not None:
        from .views.collectives import CollectivesView

        display(CollectivesView(state=state))


def _print_code(magic: str, options, shell, cell: str, **extra) -> None:
    """--as-code: print the plain JAX the cell stands for; nothing runs, nothing is bound."""
    from .ascode import as_code

    print(as_code(magic, options, _transformed(shell, cell), shell.user_ns, **extra))


def _array_leaves(name, value):
    import jax

    for path, leaf in jax.tree_util.tree_leaves_with_path(value):
        yield name + jax.tree_util.keystr(path), leaf


_LINE_READERS = {
    "devices": lines.devices_line,
    "mesh": lines.mesh_line,
    "sharding": lines.sharding_line,
    "pmap": lines.pmap_line,
    "shard": lines.shard_line,
    "shard_map": lines.shard_map_line,
}


@functools.lru_cache(maxsize=256)
def parse_line(magic: str, line: str):
    """The options record of `%magic line` (jaxpar_magic.lines): shell words, the magic's own
    parser, our grammars. Any line gives a record or a UsageError. Cached by text: re-runs are the
    hot path."""
    method = getattr(JaxparMagics, magic)
    prefix = "%%" if magic in JaxparMagics.magics["cell"] else "%"
    return _LINE_READERS[magic](lines.parse_args(method, prefix + magic, line))


@functools.lru_cache(maxsize=256)
def _transformed(shell, cell: str) -> str:
    return shell.transform_cell(cell)


def _silenced(cell: str) -> bool:
    """A trailing `;` silences the cell's value, as for any IPython cell."""
    return cell.rstrip().endswith(";")
