"""jaxpar_magic: see and touch JAX parallelism in a notebook.

`%load_ext jaxpar_magic` registers the magics; importing this package is cheap and never starts
the JAX backend, so `%devices --simulate 8` still works afterwards. Every magic has a plain-Python
twin, importable from here: `pmap`, `pmap_cell`, `simulate`, `show_devices`, `make_mesh`,
`show_mesh`, `show_sharding`, `shard_cell`, `place`, `plan`, `split`, `shard_map_cell`,
`compile_plan`, `plan_cell`, and `Cluster` (the multi-process cluster behind `%cluster`);
`check` is the exercises' one-line answer check.
"""
from __future__ import annotations

__version__ = "0.1.0"

_TWINS = {
    "pmap": ("pmap_function", "pmap"),
    "pmap_cell": ("run_pmap", "pmap_cell"),
    "ParallelFunction": ("pmap_function", "ParallelFunction"),
    "simulate": ("devices", "simulate"),
    "show_devices": ("magics", "show_devices"),
    "show_mesh": ("magics", "show_mesh"),
    "show_sharding": ("magics", "show_sharding"),
    "make_mesh": ("shard", "make_mesh"),
    "shard_cell": ("run_shard", "shard_cell"),
    "place": ("shard", "place"),
    "plan": ("shard", "plan"),
    "split": ("shard", "split"),
    "shard_map_cell": ("run_shard_map", "shard_map_cell"),
    "compile_plan": ("planning", "compile_plan"),
    "plan_cell": ("planned", "plan_cell"),
    "Cluster": ("cluster", "Cluster"),
    "check": ("exercises", "check"),
}


def __getattr__(name: str):
    # Twins import JAX; resolving them lazily keeps `import jaxpar_magic` light.
    if name in _TWINS:
        import importlib

        module, attr = _TWINS[name]
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_ipython_extension(ipython) -> None:
    from .magics import JaxparMagics

    ipython.register_magics(JaxparMagics)  # registering again replaces: loading twice is harmless


def unload_ipython_extension(ipython) -> None:
    from .magics import JaxparMagics

    manager = ipython.magics_manager
    for kind, names in JaxparMagics.magics.items():
        for name in names:
            manager.magics[kind].pop(name, None)
    manager.registry.pop("JaxparMagics", None)
