"""The bounded previews the recorder keeps of each collective call's input and output, computed
inside the program (in JAX, per device): the first HEAD values, and a HEAT x HEAT block-mean heat
map of 2-D+ values, a few KiB per device and call whatever the array sizes; and the empty records
(zeros) that loops and branches start from.
"""
from __future__ import annotations

import math
from typing import Any

from .sites import Site

HEAD = 64  # values kept per preview (the first ones, flattened)
HEAT = 16  # a preview's heat map is at most HEAT x HEAT block means

def _heat_shape(shape: tuple[int, ...]) -> tuple[int, int] | None:
    if len(shape) < 2 or math.prod(shape) == 0:
        return None
    return min(HEAT, math.prod(shape[:-1])), min(HEAT, shape[-1])


def _bin_sums(m, bins: int):
    """Sums of `bins` runs of consecutive rows of `m` (runs differ in length by at most one)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    length = m.shape[0]
    if length == bins:
        return m
    if length % bins == 0:
        return m.reshape((bins, length // bins) + m.shape[1:]).sum(axis=1)
    if length * bins < 2**31:
        ids = lax.iota(jnp.int32, length) * bins // length
    else:  # i * bins would overflow int32: equal runs of ceil(length / bins), the last one shorter
        ids = lax.iota(jnp.int32, length) // -(-length // bins)
    return jax.ops.segment_sum(m, ids, num_segments=bins, indices_are_sorted=True)


def bin_counts(length: int, bins: int) -> list[int]:
    """How many rows each of `_bin_sums`'s runs holds: run b is rows ceil(b L / bins) up to
    ceil((b + 1) L / bins)."""
    def ceil(b):
        return -(-b * length // bins)

    if length % bins == 0 or length * bins < 2**31:
        return [ceil(b + 1) - ceil(b) for b in range(bins)]
    run = -(-length // bins)
    return [max(0, min(run, length - b * run)) for b in range(bins)]


def _heat(x, shape):
    """Block means of `x` seen as a (rows, last axis) matrix, at most HEAT x HEAT, in float32."""
    import jax.numpy as jnp
    import numpy as np

    rows, cols = _heat_shape(shape)
    m = jnp.reshape(x, (-1, shape[-1]))
    m = jnp.abs(m) if jnp.iscomplexobj(m) else m
    m = m.astype(jnp.float32)
    m = _bin_sums(m, rows)  # (rows, last axis)
    m = _bin_sums(m.T, cols).T  # (rows, cols)
    counts = np.outer(bin_counts(math.prod(shape[:-1]), rows), bin_counts(shape[-1], cols))
    return m / counts.astype(np.float32)


def _varying(x) -> frozenset:
    """The mesh axes `x` varies over, as shard_map's check_vma tracks them (empty without it)."""
    import jax

    aval = jax.typeof(x)
    state = getattr(aval, "manual_axis_type", None)
    return frozenset(getattr(state, "varying", None) or getattr(aval, "vma", None) or ())


def varying_over(tree, axes: tuple[str, ...]):
    """Mark every leaf as varying over all `axes`: records then have one type whether they come
    from a varying input, an invariant psum output or the zeros a loop starts from, which loops
    and branches require. Without check_vma this changes nothing."""
    import jax
    from jax import lax

    def cast(x):
        missing = tuple(a for a in axes if a not in _varying(x))
        return lax.pcast(x, missing, to="varying") if missing else x

    return jax.tree.map(cast, tree)


def value_preview(x, shape, dtype):
    """The preview of one value `x` (per device, of the `shape` the user wrote): its first HEAD
    values, and its heat map when it is 2-D or more."""
    import jax.numpy as jnp

    x = jnp.reshape(jnp.asarray(x), shape)  # the shape the user wrote (an untiled all_to_all's: see stages/record/sites.py)
    preview = {"head": jnp.reshape(x, (-1,))[:HEAD].astype(dtype)}  # astype: never weakly typed
    if _heat_shape(shape) is not None:
        preview["heat"] = _heat(x, shape)
    return preview


def _empty_preview(shape, dtype):
    import jax.numpy as jnp

    preview = {"head": jnp.zeros((min(HEAD, math.prod(shape)),), dtype)}
    heat = _heat_shape(shape)
    if heat is not None:
        preview["heat"] = jnp.zeros(heat, jnp.float32)
    return preview


def empty_record(site: Site):
    """The record a call starts from (count 0, zero previews): what loops and branches carry in."""
    import jax.numpy as jnp

    record: dict[str, Any] = {"count": jnp.zeros((), jnp.int32)}
    if site.recorded:
        parts = {"out": _empty_preview(site.out_shape, site.out_dtype)}
        if site.in_shape is not None:
            parts["in"] = _empty_preview(site.in_shape, site.in_dtype)
        record["first"] = parts
        if site.in_loop:
            record["last"] = dict(parts)
    return record

