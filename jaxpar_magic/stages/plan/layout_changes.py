"""Names a planned cell rebinds to a value in another layout: the reshard the next step starts with.

A training step that takes `params` laid out as P('model', 'data') and returns its new `params` as
P(None, 'data') leaves the next call a reshard that no plan of this cell shows (it happens between
steps). `layout_changes(prepared, plan)` lists each such leaf as (label, spec in, spec out), comparing
layouts, not spellings: P() and P(None, None) are one layout of a 2-D array.
"""
from __future__ import annotations


def normalized(sharding, ndim: int):
    """A NamedSharding's spec with one entry per dimension, one-axis tuples unwrapped, () as None;
    None for a sharding without a spec."""
    from jax.sharding import PartitionSpec as P

    spec = getattr(sharding, "spec", None)
    if spec is None:
        return None
    entries = []
    for entry in tuple(spec) + (None,) * (ndim - len(spec)):
        if isinstance(entry, tuple):
            entry = entry[0] if len(entry) == 1 else (entry or None)
        entries.append(entry)
    while entries and entries[-1] is None:
        entries.pop()
    return P(*entries)


def layout_changes(prepared, plan) -> list[tuple]:
    """(label, spec in, spec out) for every leaf of an input the cell binds again in another layout."""
    import jax

    changes = []
    computed = set(plan.computed or ())
    for tree, leaves, labels in zip(prepared.inputs, prepared.arguments, prepared.labels()):
        if tree.name not in computed or tree.name not in (plan.abstract or {}):
            continue
        coming = {label: leaf for label, leaf in zip(labels, leaves)}
        for path, out in jax.tree_util.tree_flatten_with_path(plan.abstract[tree.name])[0]:
            label = tree.name + jax.tree_util.keystr(path)
            came = coming.get(label)
            if came is None or not hasattr(out, "shape") or tuple(came.shape) != tuple(out.shape):
                continue
            before = normalized(getattr(came, "sharding", None), len(came.shape))
            after = normalized(getattr(out, "sharding", None), len(out.shape))
            if before is not None and after is not None and before != after:
                changes.append((label, before, after))
    return changes


def change_text(change) -> str:
    """`params['w2'] comes in as P('model', 'data') and leaves as P(None, 'data')`."""
    label, before, after = change
    return f"{label} comes in as {before} and leaves as {after}"
