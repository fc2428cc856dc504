"""The one place that reaches into JAX's private staging caches (fingerprints.traced_callables
finds what to forget).

JAX keeps the jaxpr it traced for a function in caches keyed weakly by the function object, with
the argument shapes: jit's (`jax.jit(f)` called from a trace), `lax.scan`'s and `lax.cond`'s
bodies, `jax.checkpoint`'s. No public API empties them for one function: `jax.jit(f).clear_cache()`
reaches only jit's, and `jax.clear_caches()` also drops every compiled program, so every cell of
the notebook, and every eager operation, would compile again. So we ask each of JAX's registered
caches (`jax._src.util._caches`, what `jax.clear_caches()` walks) to evict the entries keyed by
these functions, as `clear_cache()` does for jit's own; compiled programs stay.
tests/test_stale_globals.py fails loudly when this stops making a `lax.scan` body, a `lax.cond`
branch, a checkpointed and a jitted helper trace again. If a JAX release moves the registry, the
public `jax.clear_caches()` is the fallback: heavier, still right.
"""
from __future__ import annotations


def forget_traces(callables) -> None:
    """JAX's staging caches forget what they traced for `callables` (compiled programs are kept)."""
    if not callables:
        return
    try:
        from jax._src.util import _caches
    except ImportError:
        import jax

        jax.clear_caches()
        return
    for cache in list(_caches):
        evict = getattr(cache, "evict_weakref", None) or getattr(cache, "evict_function", None)
        if evict is None:
            continue
        for fn in callables:
            try:
                evict(fn)
            except TypeError:  # not weakly referenceable: never a key of these caches
                pass
