"""Pytrees across the kernel/cluster boundary: `%cluster push`, `scatter` and `gather` of any pytree
(dicts, registered dataclasses, Equinox modules, optax states), not only arrays.

A value is flattened with `jax.tree_util.tree_flatten_with_path`. Its structure travels once, as a
skeleton: the value itself with every leaf replaced by a `Slot`, pickled here so that the other
side can say which type it lacks. (A pickled PyTreeDef is not enough: Equinox's node data holds
sentinels whose identity pickling loses.) Array leaves travel as NumPy (split by rows for
scatter), other leaves as they are. The other side flattens the skeleton with its own pytree
registry and puts the leaves in the slots: the same type again. Mistakes are named by the leaf's
path, as Python would spell it: `state[0].mu['w']`, `params.w`.

Runs on both sides: nothing here imports JAX at module level (engines configure JAX first).
"""
from __future__ import annotations

import pickle

from ..cell.interrupts import addressable_shards, host_value
from ..errors import UsageError


class Slot:
    """Where a leaf goes back: a leaf to JAX (it is no registered node)."""


def flatten(name: str, value) -> tuple[bytes, list[tuple[str, object]]]:
    """(pickled skeleton, [(path, leaf)]) of a kernel or cluster value; a value JAX cannot flatten
    (a dict with keys that do not sort) is one leaf."""
    import jax

    try:
        pairs, structure = jax.tree_util.tree_flatten_with_path(value)
        skeleton = jax.tree.unflatten(structure, [Slot() for _ in pairs])
    except Exception:  # not a pytree JAX can take apart (or put together again): it travels whole
        pairs, skeleton = [((), value)], Slot()
    paths = [(name + jax.tree_util.keystr(path), leaf) for path, leaf in pairs]
    return pickle.dumps(skeleton), paths


def is_array(leaf) -> bool:
    import jax
    import numpy as np

    return isinstance(leaf, (np.ndarray, np.generic, jax.Array))


def label(path: str, name: str) -> str:
    """How a message names a leaf: the variable itself as 'x', a leaf inside it as `x.w`."""
    return repr(name) if path == name else f"`{path}`"


def rebuild(name: str, skeleton: bytes, leaves: list):
    """The value again, from its pickled skeleton and its leaves (on the other side)."""
    import jax

    try:
        slots, treedef = jax.tree.flatten(pickle.loads(skeleton))
    except (AttributeError, ImportError) as error:
        raise UsageError(
            f"{name!r} is a pytree whose type is unknown here ({type(error).__name__}: {error}). A class defined in "
            "the kernel must be defined on the cluster too (run its definition in a %%cluster cell, registering it "
            "the same way), or imported from a module every process can import."
        ) from None
    if len(slots) != len(leaves) or not all(isinstance(slot, Slot) for slot in slots):
        raise UsageError(f"{name!r}: its pytree type is registered differently here than where it came from "
                         f"({len(slots)} leaves here, {len(leaves)} there). Register it the same way in the kernel "
                         "and on the cluster.")
    return jax.tree.unflatten(treedef, leaves)


def canned(leaf):
    """A leaf ready to travel inside a structure: ipyparallel cans only a call's top-level arguments,
    so a function or class defined interactively, deeper down, is canned here (sent by value).
    Nothing else: canned arrays and bytes keep buffers that only the top level can carry."""
    import types

    from ipyparallel.serialize import can

    return can(leaf) if isinstance(leaf, (types.FunctionType, type)) else leaf


def uncanned(payload):
    from ipyparallel.serialize import uncan

    return uncan(payload)


def unpack_leaf(entry, axis_name: str):
    """An engine's leaf from what the kernel sent for it: ("rows", local rows, global shape) becomes a
    global jax.Array split over every device, ("whole", array) one replicated over every device,
    ("jax", array) a jax.Array of this process, ("value", v) v as it is."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    kind, payload = entry[0], entry[1]
    if kind in ("rows", "whole"):
        mesh = Mesh(np.array(jax.devices()), (axis_name,))
        spec = PartitionSpec(axis_name) if kind == "rows" else PartitionSpec()
        shape = tuple(entry[2]) if kind == "rows" else payload.shape
        return jax.make_array_from_process_local_data(NamedSharding(mesh, spec), payload, shape)
    if kind == "jax":
        return jax.numpy.asarray(payload)
    return uncanned(payload)


def export_leaf(leaf):
    """What gather sends back for one leaf: ("global", shape, dtype, shards) for a jax.Array spanning
    processes (only the replica-0 shards, with their indices), ("value", v) for anything else (a
    process-local jax.Array as NumPy), ("unsendable", type, why) for what cannot travel."""
    import jax
    import numpy as np
    from ipyparallel.serialize import serialize_object

    # (an array is read with the interrupt held while JAX lists its buffers: engines are interrupted with
    # the kernel, and a list cut short would leave the leaf unreadable; cell/interrupts.py)
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
        shards = [(shard.index, np.asarray(shard.data)) for shard in addressable_shards(leaf) if shard.replica_id == 0]
        return ("global", tuple(leaf.shape), str(leaf.dtype), shards)
    if isinstance(leaf, jax.Array):
        return ("value", host_value(leaf))
    try:
        serialize_object(leaf)
    except Exception as error:  # whatever stops it from travelling, the kernel says so for this leaf
        return ("unsendable", type(leaf).__name__, f"{type(error).__name__}: {error}")
    return ("value", canned(leaf))
