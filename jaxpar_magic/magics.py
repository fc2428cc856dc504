"""The IPython layer: parse the magic line, call the plain-Python core, display a view.

Nothing here computes anything the twins in `pmap.py` / `devices.py` don't.
"""
from __future__ import annotations

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, needs_local_scope, no_var_expand
from IPython.core.magic import output_can_be_silenced
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display
from traitlets import Bool, Unicode
from traitlets.config import Configurable

from .errors import UsageError
from .specs import parse_device_selection, parse_literal


def show_devices(simulate: int | None = None):
    """Plain-Python twin of `%devices`: the device view (asking for simulated devices first)."""
    from .devices import devices_state, simulate as ask_for
    from .views.devices import DevicesView

    if simulate is not None:
        ask_for(simulate)
    return DevicesView(state=devices_state())


def result_view(result, title: str, report: bool):
    from .summaries import result_state
    from .views.results import ResultView

    outputs = {n: result.outputs[n] for n in result.device_outputs}
    if result.has_final and result.final_per_device:
        outputs["(result)"] = result.final
    facts = result.facts
    figures = None
    if report and facts is not None:
        figures = {"compile_ms": facts.compile_ms, "run_ms": result.run_ms,
                   "flops": facts.flops, "bytes_accessed": facts.bytes_accessed}
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
    def devices(self, line=""):
        """Show the devices JAX sees: id, platform, kind, process, coords, memory; counts per platform."""
        args = parse_argstring(self.devices, line)
        display(show_devices(args.simulate))

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
    @no_var_expand
    @needs_local_scope
    @output_can_be_silenced
    def pmap(self, line, cell, local_ns=None):
        """Run the cell as what ONE device runs, on every device at once.

        Block mode: arrays the cell reads are split over their leading axis (one slice per device);
        names it assigns come back with a leading device axis. Function mode (a cell that only
        defines functions): each function is bound as its pmapped version.
        """
        from .pmap import pmap_cell

        args = parse_argstring(self.pmap, line)
        show = self.show if args.show is None else args.show
        namespace = local_ns if local_ns is not None else self.shell.user_ns
        source = self.shell.transform_cell(cell)
        result = pmap_cell(
            source,
            namespace,
            axis_name=args.axis_name or self.axis_name,
            devices=parse_device_selection(args.devices),
            mesh=args.mesh,
            broadcast=args.broadcast,
            split=args.split,
            merge=args.merge,
            in_axes=_literal(args.in_axes, "--in-axes", 0),
            out_axes=_literal(args.out_axes, "--out-axes", 0),
            static_broadcasted_argnums=_literal(args.static_broadcasted_argnums, "--static-broadcasted-argnums", ()),
            donate_argnums=_literal(args.donate_argnums, "--donate-argnums", ()),
            want_facts=show or args.report,
        )
        if isinstance(result, dict):  # function mode
            if show:
                mesh = next(iter(result.values())).mesh if result else None
                for name, fn in result.items():
                    if hasattr(fn, "axis_names"):
                        print(f"{name}: pmapped over {mesh.devices.size} devices, axes {fn.axis_names}; original at {name}.__wrapped__")
            return None
        if show:
            sizes = "x".join(str(s) for s in result.mesh.devices.shape)
            axes = ", ".join(result.mesh.axis_names)
            display(result_view(result, f"%%pmap over {sizes} devices (axis {axes})", args.report))
        elif args.report and result.facts is not None:
            f = result.facts
            print(f"compile {f.compile_ms:.1f} ms, run {result.run_ms:.2f} ms, flops {f.flops}, bytes {f.bytes_accessed}, "
                  f"collectives {[c.op for c in f.collectives]}")
        return result.final if result.has_final else None


def _literal(text, option, default):
    value = parse_literal(text, option)
    return default if value is None and text is None else value
