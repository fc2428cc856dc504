"""What each magic does, as data: run the engines on an options record (face/lines.py) and say what to
show, print and bind. No display, no IPython.

The magic layer (face/magics.py) decides *where* an action runs: in the kernel, where it displays the
outcome and binds its names, or in every process of a cluster (face/remote.py), where each process
binds its names and the kernel shows one outcome built from theirs.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..cell.bindings import bind_results
from ..cell.meshes import moved_text, moved_title
from ..errors import UsageError

ARRAY_VIEWS = ("results", "sharding", "collectives")  # views whose devices may span processes
PLAN_NAME = "_plan"  # where a planning magic leaves its Plan
PROFILE_NAME = "_profile"  # where --profile leaves its Profile
EXPLORER_NAME = "_explorer"  # where --explore leaves its Explorer


@dataclass
class Outcome:
    """What a magic's run produced."""

    views: list = field(default_factory=list)  # (kind, state): devices, mesh, sharding, results, collectives, plan
    text: str = ""  # what it prints
    bindings: dict = field(default_factory=dict)  # names for the namespace, bound in one step once shown
    final: object = None  # the cell's value (IPython's Out), when it has one
    has_final: bool = False
    # The same magic run again on a namespace, with this run's cell analysis and mesh already
    # resolved (re-runs are the hot path): it binds and returns (final,), or None when it declines
    # (program.replay_function). None where a re-run must start from the line again.
    replay: Callable[[dict], object] | None = None
    # Run right after the bindings (same step): writes Flax NNX objects' new state into them.
    commit: Callable[[dict], None] | None = None
    # The compiled program's collectives and costs (stages/run/program.ProgramFacts), when computed:
    # for a view, --report, or an exercise's check (Defaults.facts).
    facts: object = None
    # Views whose values are still on the devices (Defaults.later): the index of the view in `views`
    # -> its views.values.PendingValues; the magic layer shows the view at once and fills it later.
    pending: dict = field(default_factory=dict)

    def bind(self, namespace: dict) -> None:
        """Bind the names in one step, then write back what the cell changed in place."""
        bind_results(namespace, self.bindings)
        if self.commit is not None:
            self.commit(namespace)


@dataclass(frozen=True)
class Defaults:
    """The magics' configurable defaults (%config JaxparMagics.*), passed along to where a magic runs."""

    axis_name: str = "i"
    show: bool = True
    facts: bool = False  # read the compiled program's facts even when nothing shows them (an exercise's check)
    later: bool = False  # a result view's values may come after the cell returns (Outcome.pending), else it waits


def run(magic: str, options, source: str | None, namespace: dict, defaults: Defaults) -> Outcome:
    """Run `magic` with its parsed `options` over `namespace` (read, never written)."""
    return _ACTIONS[magic](options, source, namespace, defaults)


# --- line magics ---------------------------------------------------------------------------------

def devices(options, source, namespace, defaults) -> Outcome:
    from ..cell.devices import devices_state, simulate

    if options.simulate is not None:
        simulate(options.simulate)
    return Outcome(views=[("devices", devices_state())])


def mesh(options, source, namespace, defaults) -> Outcome:
    from ..engines.shard import is_mesh, make_mesh
    from ..views.summaries import mesh_state

    if options.shape is None:
        name = options.show_name
        if not is_mesh(namespace.get(name)):
            raise UsageError(f"%mesh {name}: no mesh called {name!r} in your namespace. Build one with `%mesh data=4 model=2`.")
        return Outcome(views=[("mesh", mesh_state(namespace[name], name))])
    built = make_mesh(options.shape, options.devices, options.axis_types, options.abstract)
    views = [("mesh", mesh_state(built, options.name))] if options.show else []
    return Outcome(views=views, bindings={options.name: built})


def sharding(options, source, namespace, defaults) -> Outcome:
    from ..cell.programs import is_array_tree

    for name in options.names:
        if name not in namespace:
            raise UsageError(f"%sharding {name}: {name!r} is not defined.")
        if not is_array_tree(namespace[name], abstract=True):
            raise UsageError(
                f"%sharding {name}: {name!r} is a {type(namespace[name]).__name__}; %sharding shows arrays "
                "(jax.Array, or jax.ShapeDtypeStruct with a sharding), or a dict/list/tuple of them."
            )
    return Outcome(views=[v for name in options.names for v in sharding_views(name, namespace[name])])


# --- cell magics -------------------------------------------------------------------------------

def pmap(options, source, namespace, defaults) -> Outcome:
    from ..cell.programs import analyse_cached
    from ..engines.pmap import check_block_options
    from ..stages.run.pmap_function import ParallelFunction
    from ..stages.run.pmap import pmap_cell
    from ..views.summaries import report_figures

    axis_name = options.axis_name or defaults.axis_name
    if (options.as_code or options.plan is not None) and analyse_cached(source, "pmap-cell").mode != "function":
        check_block_options(options.in_axes, options.out_axes, options.static_broadcasted_argnums,
                            options.donate_argnums)  # the run checks its own (stages/run/pmap.py)
    if options.as_code:
        return _as_code("pmap", options, source, namespace, axis_name=axis_name)
    if options.plan is not None:
        return _plan("pmap", options, source, namespace, axis_name=axis_name, devices=options.devices,
                     mesh=options.mesh, broadcast=options.broadcast, split=options.split, merge=options.merge)
    show = defaults.show if options.show is None else options.show
    result = pmap_cell(
        source, namespace, axis_name=axis_name, devices=options.devices, mesh=options.mesh,
        broadcast=options.broadcast, split=options.split, merge=options.merge, in_axes=options.in_axes,
        out_axes=options.out_axes, static_broadcasted_argnums=options.static_broadcasted_argnums,
        donate_argnums=options.donate_argnums, want_facts=show or options.report or defaults.facts, bind=False,
        collectives=options.collectives, wait=options.report, **_profile_arguments(options),
    )
    if isinstance(result, dict):  # function mode
        lines = []
        if show:
            recorded = "; its first call shows what each collective did" if options.collectives else ""
            lines = [f"{name}: pmapped over {fn.mesh.devices.size} devices, axes {fn.axis_names}; original at "
                     f"{name}.__wrapped__{recorded}" for name, fn in result.items() if isinstance(fn, ParallelFunction)]
        return Outcome(text="\n".join(lines), bindings=result)
    outcome = Outcome(bindings=result.bindings, final=result.final, has_final=result.has_final, facts=result.facts,
                      text=moved_text(result.moved, result.mesh))
    if not (show or options.report or options.collectives):
        from ..stages.run.pmap import replayer

        outcome.replay = replayer(result.cell, result.mesh, tuple(options.broadcast), tuple(options.split),
                                  tuple(options.merge))
    if show:
        outputs = dict(result.per_device)
        if result.has_final and result.final_per_device and not result.cell.final_is_output \
                and not result.cell.silenced:
            outputs["(result)"] = result.final
        figures = report_figures(result.facts, result.run_ms) if options.report and result.facts else None
        sizes = "x".join(str(s) for s in result.mesh.devices.shape)
        title = f"%%pmap over {sizes} devices (axis {', '.join(result.mesh.axis_names)})" + moved_title(result.moved)
        _result_view(outcome, defaults, title, result.mesh, outputs, result.facts, result.cell.line, figures)
    elif options.report and result.facts is not None:
        f = result.facts
        figures = (f"compile {f.compile_ms:.1f} ms, run {result.run_ms:.2f} ms (waited for its result), flops {f.flops}, bytes "
                   f"{f.bytes_accessed}, collectives {[c.op for c in f.collectives]}")
        outcome.text = "\n".join(t for t in (outcome.text, figures) if t)
    if result.collectives is not None:
        outcome.views.append(("collectives", result.collectives))
    return _profiled(outcome, result, namespace, "%%pmap")


def shard(options, source, namespace, defaults) -> Outcome:
    if options.as_code:
        return _as_code("shard", options, source, namespace)
    if options.plan is not None:
        return _plan("shard", options, source, namespace, mesh=options.mesh, in_specs=options.in_specs,
                     out_specs=options.out_specs, donate=options.donate, outputs=options.outputs)
    from ..stages.run.shard import shard_cell  # here: a plan imports no run stage (bench section 11)

    show = defaults.show if options.show is None else options.show
    result = shard_cell(source, namespace, mesh=options.mesh, in_specs=options.in_specs,
                        out_specs=options.out_specs, want_facts=options.report or defaults.facts, bind=False,
                        outputs=options.outputs, donate=options.donate, wait=options.report,
                        **_profile_arguments(options))
    outcome = Outcome(bindings=result.bindings, final=result.final, has_final=result.has_final, commit=result.commit,
                      facts=result.facts, text=moved_text(result.moved, result.mesh))
    if not (show or options.report):
        from ..stages.run.shard import replayer

        outcome.replay = replayer(result.cell, result.mesh, options.in_specs, options.out_specs,
                                  mesh_name=_namespace_mesh(options), outputs=options.outputs,
                                  donate=options.donate)
    if show:
        shown = dict(result.placed)
        shown.update({n: result.outputs[n] for n in result.device_outputs})
        if result.has_final and result.final_is_array and not result.cell.final_is_output \
                and not result.cell.silenced:
            shown["(result)"] = result.final
        outcome.views += [v for name, value in shown.items() for v in sharding_views(name, value)]
    if options.report and result.facts is not None:
        outcome.views.append(_program_report("%%shard program", result))
    return _profiled(outcome, result, namespace, "%%shard")


def shard_map(options, source, namespace, defaults) -> Outcome:
    if options.as_code:
        return _as_code("shard_map", options, source, namespace)
    if options.plan is not None:
        return _plan("shard_map", options, source, namespace, mesh=options.mesh, in_specs=options.in_specs,
                     out_specs=options.out_specs, check_vma=options.check_vma, outputs=options.outputs)
    from ..stages.run.shard_map import shard_map_cell
    from ..views.summaries import report_figures

    show = defaults.show if options.show is None else options.show
    result = shard_map_cell(source, namespace, mesh=options.mesh, in_specs=options.in_specs,
                            out_specs=options.out_specs, check_vma=options.check_vma,
                            want_facts=show or options.report or defaults.facts, bind=False,
                            collectives=options.collectives, outputs=options.outputs, wait=options.report,
                            **_profile_arguments(options))
    outcome = Outcome(bindings=result.bindings, final=result.final, has_final=result.has_final, facts=result.facts,
                      text=moved_text(result.moved, result.mesh))
    if not (show or options.report or options.collectives):
        from ..stages.run.shard_map import replayer

        outcome.replay = replayer(result.cell, result.mesh, options.in_specs, options.out_specs, options.check_vma,
                                  mesh_name=_namespace_mesh(options), outputs=options.outputs)
    if show:
        device = {n: result.outputs[n] for n in result.device_outputs}
        if result.has_final and result.final_is_array and not result.cell.final_is_output \
                and not result.cell.silenced:
            device["(result)"] = result.final
        sizes = ", ".join(f"{n}={s}" for n, s in result.mesh.shape.items())
        figures = report_figures(result.facts, result.run_ms) if options.report and result.facts else None
        title = f"%%shard_map over {result.mesh.devices.size} devices ({sizes}): each device's block" + \
            moved_title(result.moved)
        _result_view(outcome, defaults, title, result.mesh, device, result.facts, result.cell.line, figures,
                     blocks=True)
        outcome.views += [v for name, value in device.items() for v in sharding_views(name, value)]
    elif options.report and result.facts is not None:
        outcome.views.append(_program_report("%%shard_map program", result))
    if result.collectives is not None:
        outcome.views.append(("collectives", result.collectives))
    return _profiled(outcome, result, namespace, "%%shard_map")


_ACTIONS = {"devices": devices, "mesh": mesh, "sharding": sharding, "pmap": pmap, "shard": shard,
            "shard_map": shard_map}


# --- shared steps --------------------------------------------------------------------------------

def _namespace_mesh(options) -> str | None:
    """The name of the namespace's mesh a %%shard/%%shard_map line uses, if it uses one (DEFAULT_MESH:
    no --mesh, so the context mesh, else `mesh`): a replay of the cell declines once that name is
    bound to another mesh (the magic then starts from the line)."""
    from ..cell.meshes import DEFAULT_MESH

    if isinstance(options.mesh, str):
        return options.mesh
    counted = any(isinstance(e, int) for spec in [*options.in_specs.values(), *options.out_specs.values()]
                  if isinstance(spec, tuple) for e in spec)
    return DEFAULT_MESH if options.mesh is None and not counted else None


def sharding_views(name: str, value) -> list:
    """The one view of a named value: a sharding view of an array, a tree view (its leaves by
    layout, each layout's picture on demand) of any other pytree."""
    from ..views.tree_summary import is_bare_array, tree_state

    if is_bare_array(value):
        from ..views.summaries import shown_sharding_state

        return [("sharding", shown_sharding_state(name, value))]
    return [("tree", tree_state(name, value))]


def _result_view(outcome: Outcome, defaults: Defaults, title: str, mesh, outputs: dict, facts, line_text, report,
                 blocks: bool = False) -> None:
    """Add the per-device result view: with Defaults.later its values still pending (Outcome.pending),
    else read now (which waits for the cell's program)."""
    from ..views.values import result_parts

    state, pending = result_parts(title, mesh, outputs, facts, line_text, report, blocks)
    if defaults.later and pending.parts:
        outcome.pending[len(outcome.views)] = pending
    else:
        state["outputs"] = pending.outputs()
    outcome.views.append(("results", state))


def _profile_arguments(options) -> dict:
    """A twin's `profile` and `hardware` from a line's --profile record (none without --profile)."""
    if options.profile is None:
        return {}
    return {"profile": options.profile.steps, "hardware": options.profile.hardware}


def _profiled(outcome: Outcome, result, namespace, magic: str) -> Outcome:
    """--profile: the profile's view (shown with --no-show too, as --collectives' cards are), bound as
    `_profile` (only if that name is new or holds an earlier profile); a profiled cell is never replayed
    without its profile."""
    profile = getattr(result, "profile", None)
    if profile is None:
        return outcome
    outcome.replay = None
    if isinstance(namespace.get(PROFILE_NAME, profile), type(profile)):
        outcome.bindings = {**outcome.bindings, PROFILE_NAME: profile}
    else:
        profile.notes.append(f"`{PROFILE_NAME}` holds your own {type(namespace[PROFILE_NAME]).__name__}, so the "
                             f"profile is not bound under it.")
    devices = result.mesh.devices.size
    title = f"{magic} --profile over {devices} device{'s' if devices != 1 else ''}: {profile.steps} profiled runs"
    outcome.views.append(("profile", profile.state(title)))
    return outcome


def _program_report(title: str, result) -> tuple:
    from ..views.summaries import program_report_state

    return ("results", program_report_state(title, result.mesh, result.facts, result.run_ms, result.cell.line))


def _plan(magic: str, options, source, namespace, **engine_options) -> Outcome:
    """--plan: the cell compiled for its mesh, never run; its names bound as ShapeDtypeStructs."""
    from ..stages.plan.plan_cell import plan_cell

    if options.plan.compare is not None or options.plan.search:
        return _compare(magic, options, source, namespace, **engine_options)
    if options.plan.explore:
        return _explore(options, source, namespace, **engine_options)
    quiet = options.show is False  # no view to take a status line's place: show none, print one line
    plan = plan_cell(source, namespace, magic=magic, hardware=options.plan.hardware,
                     device_memory=options.plan.device_memory, bind=False, status=not quiet, **engine_options)
    sizes = ", ".join(f"{n}={s}" for n, s in plan.axes.items())
    title = f"%%{magic} --plan over {plan.mesh.devices.size} devices ({sizes})"
    bindings = dict(plan.bindings)
    if not isinstance(namespace.get(PLAN_NAME, plan), type(plan)):
        plan.left_alone += (PLAN_NAME,)
    else:
        bindings[PLAN_NAME] = plan  # the last plan, like IPython's `_`: `_plan.abstract` chains plans
    if quiet:
        return Outcome(text=plan.summary(), bindings=bindings)
    return Outcome(views=[("plan", plan.state(title))], bindings=bindings)


def _compare(magic: str, options, source, namespace, **engine_options) -> Outcome:
    """--plan --compare NAME / --search BATCH: one plan per layout, ranked; nothing is bound."""
    from ..stages.plan.compare import compare_cell, comparison_state, devices_of, read_layouts, search_layouts, search_note
    from ..cell.programs import analyse_cached, is_array_tree

    for key in ("mesh", "in_specs", "out_specs"):  # each layout brings its own
        engine_options.pop(key, None)
    plan = options.plan
    if plan.compare is not None:
        layouts, what = read_layouts(plan.compare, namespace), f"--compare {plan.compare}"
    else:
        devices = devices_of(options.mesh, namespace)
        reads = analyse_cached(source, f"{magic}-plan").reads
        inputs = tuple(n for n in reads if n in namespace and is_array_tree(namespace[n], abstract=True))
        layouts = read_layouts("layouts", {"layouts": search_layouts(namespace, plan.search, inputs, devices)})
        what = f"--search {' '.join(plan.search)} over {devices} devices"
    rows = compare_cell(source, namespace, layouts, magic=magic, hardware=plan.hardware,
                        device_memory=plan.device_memory, status=True, **engine_options)
    profile = f" on {plan.hardware.name}" if plan.hardware is not None else ""
    title = f"%%{magic} --plan {what}{profile}: {len(rows)} layouts, best first"
    state = comparison_state(title, rows, plan.hardware)
    if not plan.compare:
        state["caveats"] = [search_note(devices)] + state["caveats"]
    return Outcome(views=[] if options.show is False else [("plan", state)])


def _explore(options, source, namespace, **engine_options) -> Outcome:
    """--plan --explore: the layout explorer over the cell, bound as `_explorer` (only if that name is new or
    holds an earlier explorer); the view drives it."""
    from ..stages.explore.explorer import Explorer
    from ..stages.explore.state import summary
    from ..views.progress import Progress

    with Progress("planning the first layout"):
        explorer = Explorer(source, namespace, hardware=options.plan.hardware, device_memory=options.plan.device_memory,
                            **engine_options)
    held = namespace.get(EXPLORER_NAME, explorer)
    bindings = {EXPLORER_NAME: explorer} if isinstance(held, Explorer) else {}
    said = "" if bindings else (f"`{EXPLORER_NAME}` holds your own {type(held).__name__}, so the explorer is not bound "
                                f"under it; drive this one from its view, or `del {EXPLORER_NAME}` and run the cell again.")
    if options.show is False:
        return Outcome(text="\n".join(t for t in (summary(explorer.plan), said) if t), bindings=bindings)
    return Outcome(views=[("explorer", explorer)], bindings=bindings, text=said)


def _as_code(magic: str, options, source, namespace, **extra) -> Outcome:
    """--as-code: the plain JAX the cell stands for; nothing runs, nothing is bound."""
    from ..stages.ascode.as_code import as_code

    return Outcome(text=as_code(magic, options, source, namespace, **extra))
