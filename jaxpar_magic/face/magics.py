"""The IPython layer: parse the magic line, decide where the magic runs (this kernel, or every
process of a running cluster), show the outcome, bind its names.

What each magic computes lives in face/actions.py (and the engines below it); nothing here computes.
"""
from __future__ import annotations

import functools
import sys
from collections import OrderedDict

from IPython.core.magic import (
    MAGIC_OUTPUT_CAN_BE_SILENCED, Magics, cell_magic, line_cell_magic, line_magic, magics_class, no_var_expand,
)
from IPython.core.magic_arguments import argument, magic_arguments
from traitlets import Bool, CaselessStrEnum, Float, Unicode, observe
from traitlets.config import Configurable

from ..errors import UsageError
from ..views import later
from . import lines
from .cluster_magic import HELP as CLUSTER_HELP
from .exercises import WATCHERS

#: Magics that run in every process while a cluster is running (the others always run here).
ON_CLUSTER = ("devices", "mesh", "sharding", "pmap", "shard", "shard_map")


def show_devices(simulate: int | None = None):
    """Plain-Python twin of `%devices`: the device view (asking for simulated devices first)."""
    from ..cell.devices import devices_state, simulate as ask_for
    from ..views.devices import DevicesView

    if simulate is not None:
        ask_for(simulate)
    return DevicesView(state=devices_state())


def show_mesh(mesh, name: str = "mesh"):
    """Plain-Python twin of `%mesh`: the mesh view of a Mesh or AbstractMesh."""
    from ..views.summaries import mesh_state
    from ..views.mesh import MeshView

    return MeshView(state=mesh_state(mesh, name))


def show_sharding(value, name: str = "array"):
    """Plain-Python twin of `%sharding x`: where every piece of `value` (an array, or any pytree) lives."""
    from .actions import sharding_views

    ((kind, state),) = sharding_views(name, value)
    return view_of(kind, state)


def view_of(kind: str, state: dict):
    """The widget that shows a view state of `kind` (actions.Outcome.views). A layout's state shown
    again (the very same dict: views.summaries.shown_sharding_state) gets its widget again: the same
    model, its static forms already drawn, nothing new to sync."""
    from .. import views

    if kind in _REUSED_KINDS:
        shown = _shown_views.get(id(state))
        if shown is not None and shown[0] is state and shown[1].comm is not None:
            _shown_views.move_to_end(id(state))
            return shown[1]
    if kind == "explorer":  # a live view over its explorer (stages/explore/explorer.py), not a state alone
        return views.ExplorerView(explorer=state)
    view = _view_class(kind)(state=state)
    if kind in _REUSED_KINDS:
        _shown_views[id(state)] = (state, view)
        while len(_shown_views) > 64:
            _shown_views.popitem(last=False)
    return view


@functools.cache
def _view_class(kind: str) -> type:
    from .. import views

    return {"devices": views.DevicesView, "mesh": views.MeshView, "sharding": views.ShardingView,
            "results": views.ResultView, "collectives": views.CollectivesView, "plan": views.PlanView,
            "tree": views.TreeView, "profile": views.ProfileView}[kind]


_REUSED_KINDS = ("sharding",)  # view kinds whose states are shared per layout (read-only)
_shown_views: OrderedDict = OrderedDict()  # id(state) -> (state, its widget)


def _applying(*decorators):
    """One decorator applying several `argument(...)`s: options that several magics share."""
    def apply(function):
        for decorator in reversed(decorators):
            function = decorator(function)
        return function
    return apply


_code_and_plan_options = _applying(
    argument("--as-code", action="store_true",
             help="Do not run the cell: print the plain JAX it stands for, a self-contained snippet."),
    argument("--plan", action="store_true",
             help="Compile for the mesh without running: per-device memory, collectives, FLOPs; names are bound as "
                  "jax.ShapeDtypeStructs. Inputs may be abstract (jaxpar_magic.plan(...))."),
    argument("--hardware", metavar="NAME",
             help="With --plan (or --profile: the plan beside the measurement): a device profile for the fit and a modelled step time: tpu-v4, tpu-v5e, tpu-v5p, "
                  "tpu-v6e, h100, a100, b200, or custom:flops=...,hbm=...,bw=...,memory=..."),
    argument("--device-memory", metavar="SIZE",
             help="With --plan: the device's memory, e.g. 16GiB (overrides the profile's)."),
    argument("--topology", metavar="SHAPE",
             help="With --plan --hardware: the physical slice the mesh is laid onto, e.g. 4x8 (TPU ICI slice) or 8 "
                  "(GPUs per NVLink domain); devices beyond it are further slices (DCN) or nodes."),
    argument("--compare", metavar="NAME",
             help="With --plan: plan the cell under every layout of the dict NAME ({label: {'mesh': mesh, 'in': "
                  "{input: PartitionSpec}}}) and rank them by estimated step time."),
    argument("--explore", action="store_true",
             help="With %%shard --plan: an explorer of layouts (each input's dimensions cut by mesh axes, the mesh's "
                  "shape, the target), re-planned as you choose; bound as `_explorer` (choose, reshape, tried, line, best)."),
    argument("--search", metavar="BATCH", nargs="+",
             help="With --plan: propose DP, FSDP, TP and FSDP x TP layouts over the mesh's devices (BATCH: the inputs "
                  "whose first dimension is the batch) and rank them."),
)
_profile_option = _applying(
    argument("--profile", action="store_true",
             help="Run the cell, then its compiled program --profile-steps more times under JAX's profiler: a timeline "
                  "of every device (compute, collectives, copies, waits), the top ops with their lines, and the plan's "
                  "estimate beside it where the devices (or --hardware) give it a time; bound as `_profile`."),
    argument("--profile-steps", type=int, metavar="N", help="With --profile: how many profiled runs (default 5)."),
)
_inline_mesh_options = _applying(
    argument("--axis-types", default=None, metavar="TYPES",
             help="With an inline --mesh: its axis types, as %%mesh takes them: auto, explicit or manual for every "
                  "axis, or one per axis (explicit,auto) (default: what jax.make_mesh gives)."),
    argument("--devices", nargs="+", metavar="N_OR_IDS",
             help="With an inline --mesh: over the first N devices, or these device ids, as %%mesh takes them."),
    argument("--abstract", action="store_true",
             help="With an inline --mesh and --plan: an AbstractMesh, as `%%mesh --abstract` builds."),
)
_collectives_option = _applying(
    argument("--collectives", action="store_true",
             help="Show one card per collective call: what every device held before and after it, and the data "
                  "movement (function mode: the first call records them; fn.collectives() shows them again)."),
)


@magics_class
class JaxparMagics(Magics, Configurable):
    """%devices, %%pmap (and friends): JAX parallelism you can see."""

    axis_name = Unicode("i", help="Default axis name of a %%pmap cell (-a/--axis-name overrides it).").tag(config=True)
    show = Bool(True, help="Show the per-device result view after a %%pmap cell (--show/--no-show override it).").tag(
        config=True
    )
    view_values = CaselessStrEnum(
        ["auto", "later", "wait"], "auto",
        help="When a result view gets its per-device values: 'later' (the cell returns once its program is "
             "dispatched and the view fills in when they are ready), 'wait' (the cell waits for them), 'auto' "
             "(later in a kernel whose front end can answer input(), such as JupyterLab; wait in a terminal and "
             "under nbconvert --execute, which keep only what a cell shows before it ends).").tag(config=True)
    cluster_timeout = Float(
        120.0, help="Seconds a cluster cell may take before its processes are interrupted (--timeout overrides it)."
    ).tag(config=True)

    def __init__(self, shell=None, **kwargs):
        super().__init__(shell=shell, config=shell.config if shell is not None else None, **kwargs)
        self._settings_changed()

    @observe("axis_name", "show")
    def _settings_changed(self, change=None) -> None:
        # What a replay depends on, as a plain tuple: reading traits costs ~1 µs each on the hot path.
        self._settings = (self.axis_name, self.show)

    def _run(self, magic: str, line: str, cell: str | None = None):
        """Parse, run here or on the cluster, show the outcome, then bind its names (last, in one
        step: an interrupt at any earlier moment leaves the namespace as it was)."""
        replay_key = (magic, line, cell, self._settings)
        known = _replays.get(replay_key)
        if known is not None and not WATCHERS and _running_cluster() is None:
            try:  # inline, not a helper: each call on this path costs microseconds in place (bench section 9)
                replayed = known[0](self.shell.user_ns)  # binds, as the full path does below
            except BaseException:
                _replays.pop(replay_key, None)  # a replay that raised is forgotten
                raise
            if replayed is not None:
                _replays.move_to_end(replay_key)
                return None if known[1] else replayed[0]
            _replays.pop(replay_key, None)  # it declined: the full path below remembers it again

        later.magic_started()  # the values thread fills shown views in the magics' pauses (views/later.py)
        try:
            return self._full_run(magic, line, cell, replay_key)
        finally:
            later.magic_ended()

    def _full_run(self, magic: str, line: str, cell: str | None, replay_key: tuple):
        """_run's full path: parse the line, run, show, bind, and remember the replay."""
        from ..stages.run.donation import results_bound
        from ..views.progress import kept_lines
        from . import actions

        options = parse_line(magic, line)
        source = _transformed(self.shell, cell) if cell is not None else None
        namespace = self.shell.user_ns
        cluster = _running_cluster()
        defaults = actions.Defaults(axis_name=self.axis_name, show=self.show, facts=bool(WATCHERS),
                                    later=cluster is None and self._values_later())
        # --donate: once the program has the inputs, an interrupt waits until they are bound (stages/run/donation.py)
        with results_bound():
            with kept_lines() as status_lines:  # a "compiling… 3 s" line is replaced by the first view
                if cluster is not None and magic in ON_CLUSTER:
                    from .remote import on_cluster

                    if getattr(getattr(options, "plan", None), "explore", False):
                        raise UsageError("%%shard --plan --explore: the explorer plans in this kernel, and a cluster is "
                                         "running, where %%shard runs on every process. Explore before `%cluster start` "
                                         "(or after `%cluster stop`), over simulated devices of the same count.")

                    if getattr(options, "profile", None) is not None:
                        raise UsageError(f"%%{magic} --profile: a cluster is running, where the cell runs on every process "
                                         f"and each process could trace only its own devices. Profile before `%cluster "
                                         f"start` (or after `%cluster stop`), over simulated devices of the same count.")
                    outcome = on_cluster(cluster, magic, line, source, defaults, self.cluster_timeout, namespace)
                else:
                    outcome = actions.run(magic, options, source, namespace, defaults)
                if outcome.text:
                    print(outcome.text)
                for index, (kind, state) in enumerate(outcome.views):
                    view = view_of(kind, state)
                    pending = outcome.pending.get(index)
                    if pending is not None:  # its values come later: its static twin gets an id to be rewritten by
                        view.static_display_id = f"jpm-{view._jpm_twin}"
                    if not status_lines.fill(view):
                        # What IPython's display(view) ends up calling, without its formatters' look-ups for
                        # the view's type (~20 µs a view, bench section 15): every view draws itself.
                        view._ipython_display_()
                    if pending is not None:
                        later.fill_later(view, pending, static=getattr(self.shell, "kernel", None) is not None)
                status_lines.close()
            outcome.bind(namespace)
        for watcher in WATCHERS:  # an exercise cell running this magic reads what it ran (face/exercises/)
            watcher(magic, options, outcome)
        silenced = cell is not None and _silenced(cell)
        _remember_replay(replay_key, outcome.replay if cluster is None else None, silenced)
        if cell is not None and outcome.has_final and not silenced:
            return outcome.final
        return None

    def _values_later(self) -> bool:
        """Whether a result view's values may come after its cell returns (JaxparMagics.view_values)."""
        if self.view_values != "auto":
            return self.view_values == "later"
        kernel = getattr(self.shell, "kernel", None)
        if kernel is None:  # a terminal prints the view's text once: it must hold the values
            return False
        # A front end that can answer input() is one a person works in, which applies later updates;
        # nbclient (nbconvert --execute, papermill) says it cannot, and keeps only what a cell sent
        # before it ended.
        return bool(kernel.get_parent().get("content", {}).get("allow_stdin", False))

    # --- %cluster / %%cluster ---------------------------------------------------------------------
    @line_cell_magic
    @no_var_expand
    def cluster(self, line="", cell=None):
        from . import cluster_magic

        if cell is None:
            return cluster_magic.line(self.shell, line, self.cluster_timeout)
        return cluster_magic.cell(self.shell, line, cell, self.cluster_timeout)

    cluster.__doc__ = CLUSTER_HELP

    # --- %%exercise -------------------------------------------------------------------------------
    @cell_magic
    @magic_arguments()
    @argument("answers", nargs="+", metavar="NAME", help="The names the exercise's check reads.")
    @no_var_expand
    def exercise(self, line, cell):
        """An exercise cell: forget the answers, run the rest of the cell (plain Python or a cell magic
        such as %%pmap), and record the run for the check cell (`jaxpar_magic.attempt(NAME)`).

        A run that stops with an error leaves the answers forgotten, so a check never reads an
        answer an earlier run left behind.
        """
        from .exercises import run_exercise

        answers = parse_line("exercise", line).answers
        run_exercise(self.shell, answers, cell, cluster=_running_cluster())

    # --- %devices --------------------------------------------------------------------------------
    @line_magic
    @magic_arguments()
    @argument("--simulate", type=int, metavar="N",
              help="Ask for N simulated CPU devices; must come before any JAX computation in this kernel.")
    @no_var_expand
    def devices(self, line=""):
        """Show the devices JAX sees: id, platform, kind, process, coords, memory; counts per platform."""
        self._run("devices", line)

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
    @_collectives_option
    @_profile_option
    @_code_and_plan_options
    @no_var_expand
    def pmap(self, line, cell):
        """Run the cell as what ONE device runs, on every device at once.

        Block mode: arrays the cell reads are split over their leading axis (one slice per device);
        names it assigns come back with a leading device axis. Function mode (a cell that only
        defines functions): each function is bound as its pmapped version.
        """
        return self._run("pmap", line, cell)

    # --- %mesh ------------------------------------------------------------------------------------
    @line_magic
    @magic_arguments()
    @argument("axes", nargs="*", metavar="AXIS=SIZE",
              help="Axis sizes, e.g. `data=4 model=2`; or the name of an existing mesh to show it.")
    @argument("--name", default="mesh", help="Bind the mesh under this name (default: mesh).")
    @argument("--axis-types", default=None, metavar="TYPES",
              help="Mesh axis types: auto, explicit or manual for every axis, or one per axis (explicit,auto) "
                   "(default: what jax.make_mesh gives, Explicit on JAX 0.10: shardings are part of each array's "
                   "type; auto: the compiler chooses layouts for plain code).")
    @argument("--devices", nargs="+", metavar="N_OR_IDS", help="Use the first N devices, or these device ids.")
    @argument("--abstract", action="store_true", help="An AbstractMesh: plan layouts for devices you don't have.")
    @argument("--no-show", dest="show", action="store_false", help="Do not show the mesh view.")
    @no_var_expand
    def mesh(self, line=""):
        """Build a device mesh (binds `mesh`) and show it: devices laid out by mesh coordinates."""
        self._run("mesh", line)

    # --- %sharding ---------------------------------------------------------------------------------
    @line_magic
    @magic_arguments()
    @argument("names", nargs="+", metavar="NAME", help="Arrays (jax.Array, ShapeDtypeStruct), or pytrees of them, to show.")
    @no_var_expand
    def sharding(self, line=""):
        """Show how each array is laid out over devices: tiles coloured by device, the PartitionSpec.
        A pytree is one view: its leaves grouped by layout, a layout's picture on hover or click."""
        self._run("sharding", line)

    # --- %%shard -----------------------------------------------------------------------------------
    @cell_magic
    @magic_arguments()
    @argument("--mesh", nargs="+", metavar="NAME_OR_AXES", help="A Mesh by name (`--mesh mesh`) or inline (`--mesh data=4,model=2`).")
    @argument("--in", dest="ins", nargs="+", metavar="NAME=SPEC",
              help="Place inputs: `v=data`, `w=data,None`, `w=(data,model),None`, `w=P('data', None)`, or `v=8` (split axis 0 over 8 devices); "
                   "one leaf of a pytree by its path: `\"params['w1']=None,model\"`.")
    @argument("--out", dest="outs", nargs="+", metavar="NAME[=SPEC]",
              help="What the cell returns, like a `return` statement: only these names are bound; the other names "
                   "it assigns are temporaries. NAME=SPEC also lays the output out by SPEC (same syntax as --in); a bare "
                   "NAME comes back as the compiler lays it out. Without --out every name the cell assigns is bound.")
    @argument("--donate", nargs="+", default=[], metavar="NAME",
              help="Give these inputs' buffers to the program to reuse for its outputs, as jax.jit's donate_argnums; "
                   "rebind the names to what the cell returns (`model, opt_state = step(model, opt_state, batch)`).")
    @argument("--show", dest="show", action="store_const", const=True, default=None, help="Show the sharding views.")
    @argument("--no-show", dest="show", action="store_const", const=False, help="Do not show the views.")
    @argument("--report", action="store_true", help="Show the compiled program's collectives, compile and run time.")
    @_inline_mesh_options
    @_profile_option
    @_code_and_plan_options
    @no_var_expand
    def shard(self, line, cell):
        """Run the cell's code unchanged on sharded inputs: the compiler partitions the work.

        Inputs named in --in are placed with those PartitionSpecs (and rebound, placed); outputs come
        back as sharded arrays; the views show where every piece lives.

        Which names a cell returns: every name it assigns, unless --out lists them (then only those,
        as a function's `return`; the rest are temporaries); `del name` at the end also drops one.
        The mesh: --mesh, else the one `jax.set_mesh` set, else the namespace's `mesh`; the cell runs
        under it (as `with jax.set_mesh(mesh):`) whatever mesh is set globally.
        """
        return self._run("shard", line, cell)

    # --- %%shard_map -------------------------------------------------------------------------------
    @cell_magic
    @magic_arguments()
    @argument("--mesh", nargs="+", metavar="NAME_OR_AXES", help="A Mesh by name (`--mesh mesh`) or inline (`--mesh x=4,y=2`); default: the namespace's `mesh`.")
    @argument("--in", dest="ins", nargs="+", metavar="NAME=SPEC",
              help="Split these inputs into blocks by PartitionSpec: `a=x,y`, `b=y,None`, `w=P('x', None)`. Other arrays the cell reads are replicated (every device sees them whole).")
    @argument("--out", dest="outs", nargs="+", metavar="NAME[=SPEC]",
              help="What the cell returns, as shard_map's out_specs: only these names are bound, the other names it "
                   "assigns are per-device temporaries. `c=x,None` assembles c from its blocks along dimension 0 over x; "
                   "a bare NAME must be provably the same on every device (P()). Without --out every name the cell "
                   "assigns is returned, and each must be provably the same on every device.")
    @argument("--no-check-vma", dest="check_vma", action="store_false",
              help="Turn off JAX's varying-axes checks (jax.shard_map's check_vma=False); every output then needs --out.")
    @argument("--show", dest="show", action="store_const", const=True, default=None, help="Show the per-device blocks and the outputs' layouts.")
    @argument("--no-show", dest="show", action="store_const", const=False, help="Do not show the views.")
    @argument("--report", action="store_true", help="Add the compiled program's collectives, compile and run time.")
    @_inline_mesh_options
    @_collectives_option
    @_profile_option
    @_code_and_plan_options
    @no_var_expand
    def shard_map(self, line, cell):
        """Run the cell as the body of `jax.shard_map`: every device runs it on its own blocks.

        Names in --in are split by their specs (each device sees its block, of the same rank); names
        in --out are assembled from the blocks by theirs; the cell uses collectives (lax.psum,
        all_gather, ...) over the mesh's axis names explicitly. Runs under jax.jit, cached.

        Which names a cell returns: with --out, only those it lists (the rest are temporaries, as in
        the body of a shard_map); without it, every name it assigns. `del name` also drops one.
        The mesh: --mesh, else the one `jax.set_mesh` set, else the namespace's `mesh`.
        """
        return self._run("shard_map", line, cell)


def _answer_ipythons_questions(magics_type) -> None:
    """IPython asks every magic it runs for `needs_local_scope` and MAGIC_OUTPUT_CAN_BE_SILENCED
    with a default of False; on a bound method each missing one costs an AttributeError made and
    dropped, ~1 µs a cell together (bench section 9's re-run). Saying False is what the default
    already means: ours take no local scope, and a trailing `;` is handled by _silenced."""
    for kind in magics_type.magics.values():
        for method in kind.values():
            function = getattr(magics_type, method)
            function.needs_local_scope = False
            setattr(function, MAGIC_OUTPUT_CAN_BE_SILENCED, False)


_answer_ipythons_questions(JaxparMagics)

# Identical re-runs of a --no-show cell skip the line's resolution (bench sections 1, 4, 9).
_replays: OrderedDict = OrderedDict()
REPLAYS = 64


def _remember_replay(key, replay, silenced: bool) -> None:
    """Keep a --no-show cell's replay, with whether its final value is silenced (a trailing ';')."""
    if replay is None:
        _replays.pop(key, None)
        return
    _replays[key] = (replay, silenced)
    _replays.move_to_end(key)
    while len(_replays) > REPLAYS:
        _replays.popitem(last=False)


def _running_cluster():
    """The cluster this kernel drives, or None. Never imports ipyparallel when no cluster was made."""
    if "jaxpar_magic.cluster.lifecycle" not in sys.modules:
        return None
    from ..cluster.lifecycle import current

    return current()


_LINE_READERS = {
    "devices": lines.devices_line,
    "mesh": lines.mesh_line,
    "sharding": lines.sharding_line,
    "pmap": lines.pmap_line,
    "shard": lines.shard_line,
    "shard_map": lines.shard_map_line,
    "exercise": lines.exercise_line,
}


@functools.lru_cache(maxsize=256)
def parse_line(magic: str, line: str):
    """The options record of `%magic line` (jaxpar_magic.face.lines): shell words, the magic's own
    parser, our grammars. Any line gives a record or a UsageError. Cached by text: re-runs are the
    hot path."""
    method = getattr(JaxparMagics, magic)
    prefix = "%%" if magic in JaxparMagics.magics["cell"] else "%"
    return _LINE_READERS[magic](lines.parse_args(method, prefix + magic, line))


@functools.lru_cache(maxsize=256)
def _transformed(shell, cell: str) -> str:
    return shell.transform_cell(cell)


def _silenced(cell: str) -> bool:
    from ..cell.analysis import silenced

    return silenced(cell)
