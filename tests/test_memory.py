"""Nothing the user dropped stays alive because of us, and every cache of ours is bounded.

Measured growth over hundreds of cells lives in bench/ (section "memory"), not here.
"""
from __future__ import annotations

import gc
import textwrap
import types
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpar_magic.face import lines, magics
from jaxpar_magic.cell import bounded_cache, programs
from jaxpar_magic.stages.run import pmap as run_pmap, shard as run_shard, program as runner
from shell_helpers import N_DEVICES


def shard_cell(ip, line: str, source: str):
    ip.run_cell_magic("shard", line + " --no-show", textwrap.dedent(source))


def pmap_cell(ip, source: str):
    ip.run_cell_magic("pmap", "--no-show", textwrap.dedent(source))


def other_cells(ip, count: int = 3):
    for k in range(count):
        ip.push({"other": jnp.full(8, float(k))})
        shard_cell(ip, "--mesh data=8 --in other=data", f"z{k} = other * {k + 2}")


def collected(ref) -> bool:
    gc.collect()
    return ref() is None


def test_a_placed_input_is_freed_after_del(jx):
    """The issue's leak: the re-run record kept the placed copy alive after `del x`."""
    jx.push({"x": jnp.arange(64.0)})
    shard_cell(jx, "--mesh data=8 --in x=data", "y = x * 2")
    placed = jx.user_ns["x"]
    ref, buffers = weakref.ref(placed), {id(b) for b in placed.addressable_shards}
    del placed
    del jx.user_ns["x"], jx.user_ns["y"]
    other_cells(jx)
    assert collected(ref)
    assert not any(getattr(a.sharding, "spec", None) == jax.sharding.PartitionSpec("data") and a.shape == (64,)
                   for a in jax.live_arrays()), "the placed array is still on the devices"
    del buffers


def test_a_rebound_input_frees_the_old_placed_copy(jx):
    jx.push({"x": jnp.arange(64.0)})
    shard_cell(jx, "--mesh data=8 --in x=data", "y = x * 2")
    ref = weakref.ref(jx.user_ns["x"])
    jx.push({"x": jnp.ones(64)})  # the user rebinds x; the record must not keep the old copy
    assert collected(ref)


def test_a_dropped_helper_function_is_freed(jx):
    jx.run_cell("def helper(v):\n    return v + 1\n", store_history=False).raise_error()
    jx.push({"x": jnp.arange(float(N_DEVICES))})
    pmap_cell(jx, "y = helper(x)")
    ref = weakref.ref(jx.user_ns["helper"])
    del jx.user_ns["helper"]
    other_cells(jx)
    assert collected(ref)


def test_a_dropped_module_is_freed(jx):
    module = types.ModuleType("settings")
    module.scale = 3.0
    jx.push({"settings": module, "x": jnp.arange(float(N_DEVICES))})
    pmap_cell(jx, "y = x * settings.scale")
    ref = weakref.ref(module)
    del module, jx.user_ns["settings"]
    other_cells(jx)
    assert collected(ref)


def test_a_global_array_read_by_a_helper_is_freed_once_rebound(jx):
    """jit bakes a helper's global array into the program; the next variant replaces that program."""
    jx.push({"table": jnp.arange(float(N_DEVICES)), "x": jnp.ones(N_DEVICES)})
    jx.run_cell("def look(v):\n    return v + table.sum()\n", store_history=False).raise_error()
    pmap_cell(jx, "y = look(x)")
    ref = weakref.ref(jx.user_ns["table"])
    jx.push({"table": jnp.zeros(N_DEVICES)})
    pmap_cell(jx, "y = look(x)")  # a new variant of the same cell
    assert float(jx.user_ns["y"][0]) == 1.0
    assert collected(ref)


def test_every_cache_is_bounded(jx):
    jx.push({"x": jnp.arange(float(N_DEVICES)), "v": jnp.arange(8.0)})
    for k in range(bounded_cache.CACHE_SIZE + 12):
        pmap_cell(jx, f"y = x + {k}")
        shard_cell(jx, f"--mesh data=8 --in v=data --out w=data", f"w = v * {k}")
    for cache in (run_pmap._block_cache, run_pmap._reruns, run_shard._cache, run_shard._reruns):
        assert len(cache) <= bounded_cache.CACHE_SIZE
    assert len(magics._replays) <= magics.REPLAYS
    for cached in (magics.parse_line, magics._transformed, lines._parsed, programs.analyse_cached):
        info = cached.cache_info()
        assert info.maxsize is not None and info.currsize <= info.maxsize


def test_cache_families_keep_one_variant_per_cell():
    cache = bounded_cache.BoundedCache(size=8)
    cache.lookup(("cell", 1), lambda: "first", family="cell")
    cache.lookup(("cell", 2), lambda: "second", family="cell")
    assert list(cache) == [("cell", 2)]
    cache.lookup(("other", 1), lambda: "other", family="other")
    assert set(cache) == {("cell", 2), ("other", 1)}


@pytest.mark.parametrize("kind", ["pmap", "shard"])
def test_an_interrupted_run_leaves_no_cache_entry(jx, kind, monkeypatch):
    """A KeyboardInterrupt inside the compiled call (a stand-in for Kernel -> Interrupt; the real
    signal is tested against a kernel in tests/test_interrupts.py) removes the half-built entry."""
    jx.push({"x": jnp.arange(float(N_DEVICES))})
    cache = run_pmap._block_cache if kind == "pmap" else run_shard._cache
    original = runner.compile_progress

    def interrupting():
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "compile_progress", interrupting)
    source = "y_interrupted = x * 41"
    with pytest.raises(KeyboardInterrupt):
        if kind == "pmap":
            pmap_cell(jx, source)
        else:
            shard_cell(jx, "--mesh data=8 --in x=data", source)
    assert not any(key[0] == source for key in cache), "a half-built entry stayed in the cache"
    assert "y_interrupted" not in jx.user_ns
    monkeypatch.setattr(runner, "compile_progress", original)
    if kind == "pmap":
        pmap_cell(jx, source)
    else:
        shard_cell(jx, "--mesh data=8 --in x=data", source)
    assert float(np.asarray(jx.user_ns["y_interrupted"])[1]) == 41.0  # (Explicit axes: no eager gather)
