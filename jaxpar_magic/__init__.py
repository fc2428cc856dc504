"""jaxpar_magic: see and touch JAX parallelism in a notebook.

`%load_ext jaxpar_magic` registers the magics; importing this package is cheap and never starts
the JAX backend, so `%devices --simulate 8` still works afterwards. Every magic has a plain-Python
twin, importable from here: `pmap`, `pmap_cell`, `simulate`, `show_devices`, `make_mesh`,
`show_mesh`, `show_sharding`, `shard_cell`, `place`, `plan`, `split`, `shard_map_cell`,
`compile_plan`, `plan_cell`, `explore_cell` (the layout explorer), `profile` (a function's measured
timeline, as `--profile` measures a cell), and `Cluster` (the multi-process cluster behind `%cluster`);
`check` is the exercises' one-line answer check, and `attempt(NAME)` the latest run of the
`%%exercise NAME` cell it reads (face/exercises/ documents the contract).
"""
from __future__ import annotations

__version__ = "0.1.0"

_TWINS = {
    "pmap": ("stages.run.pmap_function", "pmap"),
    "pmap_cell": ("stages.run.pmap", "pmap_cell"),
    "ParallelFunction": ("stages.run.pmap_function", "ParallelFunction"),
    "simulate": ("cell.devices", "simulate"),
    "show_devices": ("face.magics", "show_devices"),
    "show_mesh": ("face.magics", "show_mesh"),
    "show_sharding": ("face.magics", "show_sharding"),
    "make_mesh": ("engines.shard", "make_mesh"),
    "shard_cell": ("stages.run.shard", "shard_cell"),
    "place": ("engines.shard", "place"),
    "plan": ("engines.shard", "plan"),
    "split": ("engines.shard", "split"),
    "shard_map_cell": ("stages.run.shard_map", "shard_map_cell"),
    "compile_plan": ("stages.plan.plan_program", "compile_plan"),
    "plan_cell": ("stages.plan.plan_cell", "plan_cell"),
    "explore_cell": ("stages.explore.explorer", "explore_cell"),
    "profile": ("stages.profile.profile_cell", "profile"),
    "Cluster": ("cluster.lifecycle", "Cluster"),
    "check": ("face.checks", "check"),
    "attempt": ("face.exercises", "attempt"),
}


def __getattr__(name: str):
    # Twins import JAX; resolving them lazily keeps `import jaxpar_magic` light.
    if name in _TWINS:
        import importlib

        module, attr = _TWINS[name]
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_ipython_extension(ipython) -> None:
    from .cell.devices import cpu_when_nothing_attached

    cpu_when_nothing_attached()  # libtpu installed, nothing attached: no TPU probe, no libtpu warnings
    from .face.exercises import watch_cells
    from .face.magics import JaxparMagics

    ipython.register_magics(JaxparMagics)  # registering again replaces: loading twice is harmless
    watch_cells(ipython)  # %%exercise's bookkeeping (face/exercises/); again: replaced, not doubled


def unload_ipython_extension(ipython) -> None:
    from .face.exercises import unwatch_cells
    from .face.magics import JaxparMagics

    unwatch_cells(ipython)
    manager = ipython.magics_manager
    for kind, names in JaxparMagics.magics.items():
        for name in names:
            manager.magics[kind].pop(name, None)
    manager.registry.pop("JaxparMagics", None)
