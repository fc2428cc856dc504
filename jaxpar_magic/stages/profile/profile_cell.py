"""The profile stage's entries: `profile_cell` profiles the program a cell's run just called (the
magics' `--profile`, the twins' `profile=`), `profile(fn, *args)` a function.

A cell runs as usual first (its bindings are that run's); then its compiled program runs N more
times under the profiler on the same arguments, without compiling anything again (trace.py), and
the trace becomes a Profile (summary.py) with, where a plan can price the step, the plan's estimate
beside it (beside.py; the plan stage makes the plan).

Donated inputs: a cell's `--donate` gives its inputs' buffers to the program, so after the run they
are gone and its program cannot run again on them: `--profile` refuses it before anything runs.
`profile(fn, *args)` owns its calls, so it copies the arguments `fn` donates before each one.
"""
from __future__ import annotations

import os

from ...errors import UsageError
from .beside import beside, device_profile
from .ops import ProgramOps
from .summary import Profile, summarise
from .trace import check_steps, traced_steps

DEFAULT_STEPS = 5


def check_profile(steps, magic: str, *, donate=(), collectives: bool = False, function: bool = False) -> int:
    """Before a cell runs: the step count, and the options a profile cannot follow."""
    steps = check_steps(steps, "--profile-steps")
    if function:
        raise UsageError(f"{magic} --profile: this cell only defines functions, so no program runs to be "
                         f"profiled. Profile a call instead: `jaxpar_magic.profile(f, x)`, or a block-mode cell "
                         f"that calls it.")
    if donate:
        names = ", ".join(f"`{n}`" for n in donate)
        raise UsageError(
            f"{magic} --profile --donate: the cell gives {names} to its program, so once it has run their buffers "
            f"are gone and the program cannot run again on the same inputs. Profile the cell without --donate (the "
            f"same computation; only the reuse of those buffers differs), or profile the step as a function: "
            f"`jaxpar_magic.profile(step, *args)` copies the arguments it donates before each profiled call.")
    if collectives:
        raise UsageError(f"{magic} --profile --collectives: --collectives runs a program with extra outputs (each "
                         f"collective's operands), which is not the cell's own program; profile without --collectives.")
    return steps


def cores() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def profile_cell(result, steps: int, magic: str, source: str, namespace: dict, hardware=None,
                 **engine_options) -> Profile:
    """Profile the program `result`'s run called (RunResult.ran), on the same arguments; with the
    plan of the same cell beside it where its devices (or `hardware`) give the plan a time."""
    from ...cell.meshes import on_cell_mesh
    from ..plan.mesh_collectives import is_user_file

    program, args = result.ran
    with on_cell_mesh(result.mesh):
        text = program.jitted.lower(*args).compile().as_text()  # jit's caches: nothing is compiled again
        ops = ProgramOps(text, result.cell.filename, is_user_file)
        trace, walls = traced_steps(lambda: program.jitted(*args), steps, ops.module)
    profile = summarise(trace, walls, ops, cores=cores())
    profile.filename = result.cell.filename
    _plan_beside(profile, result.mesh, hardware, magic, source, namespace, engine_options)
    return profile


def _plan_beside(profile: Profile, mesh, hardware, magic: str, source: str, namespace: dict, engine_options) -> None:
    from ..plan.hardware import parse_hardware
    from ..plan.plan_cell import plan_cell

    devices = list(mesh.devices.flat)
    own = device_profile(devices)
    if isinstance(hardware, str):
        hardware = parse_hardware(hardware)
    chosen = hardware if hardware is not None else (parse_hardware(own) if own else None)
    if chosen is None:
        profile.notes.append("No plan beside it: on simulated CPU devices a plan's time needs a hardware profile "
                             "(add `--hardware tpu-v5e`, say), and its estimate is then for that hardware, not for "
                             "this CPU.")
        return
    plan = plan_cell(source, namespace, magic=magic, hardware=chosen, bind=False, **engine_options)
    platform = devices[0].platform
    what = f"{len(devices)} simulated CPU devices" if platform == "cpu" else f"{len(devices)} {platform} devices"
    profile.beside = beside(profile, plan, own is not None and own == chosen.name, what)


def profile(fn, *args, steps: int = DEFAULT_STEPS, **kwargs) -> Profile:
    """Profile a function: call it once as usual (compiling it; its value is the profile's
    `result`), then run its compiled program `steps` more times under the profiler on the same
    arguments. `fn` may be jitted already (`jax.jit(step, donate_argnums=0)`) or plain (it is
    jitted). Arguments `fn` donates are copied before each profiled call (one copy held meanwhile)."""
    import inspect

    import jax

    from ..plan.mesh_collectives import is_user_file

    steps = check_steps(steps, "profile(steps=...)")
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    lowered = jitted.lower(*args, **kwargs)
    leaves, tree = jax.tree.flatten((args, kwargs))
    donated = [bool(getattr(info, "donated", False)) for info in jax.tree.leaves(lowered.args_info)]
    keep = None
    if any(donated):
        if len(donated) != len(leaves):  # static arguments: the donated ones cannot be told apart here
            raise UsageError("profile(fn, ...): fn donates some of its arguments and also takes static ones, so "
                             "the profile cannot tell which to copy before each call. Profile it without "
                             "donate_argnums (the same computation), or wrap it so that every argument is an array.")
        keep = [jax.device_put(leaf, may_alias=False) if gives else None for leaf, gives in zip(leaves, donated)]
    result = jitted(*args, **kwargs)
    jax.block_until_ready(result)
    text = lowered.compile().as_text()
    try:
        filename = inspect.getsourcefile(inspect.unwrap(getattr(fn, "__wrapped__", fn)))
    except TypeError:  # a builtin or a callable object without source
        filename = None
    ops = ProgramOps(text, filename, is_user_file)

    def fresh():
        if keep is None:
            return ()
        copies = [jax.device_put(k, may_alias=False) if k is not None else leaf for leaf, k in zip(leaves, keep)]
        return (jax.tree.unflatten(tree, copies),)

    if keep is None:
        trace, walls = traced_steps(lambda: jitted(*args, **kwargs), steps, ops.module)
    else:
        trace, walls = traced_steps(lambda both: jitted(*both[0], **both[1]), steps, ops.module, fresh)
    found = summarise(trace, walls, ops, cores=cores())
    found.filename = filename
    found.result = result
    if keep is not None:
        found.notes.append("The function donates some arguments: each profiled call ran on fresh copies of them.")
    return found
