"""Binding a cell's results: one step, and the values they replace let go of off the cell's time
(cell/bindings.py): arrays and plain containers of arrays on the release thread, anything else at
once on the caller's thread."""
from __future__ import annotations

import collections
import threading
import time
import weakref

import jax.numpy as jnp

from jaxpar_magic.cell.bindings import RELEASE_MIN_ARRAYS, bind_results

TIMEOUT_S = 10


def freed(ref) -> bool:
    """Whether the object behind `ref` is gone within TIMEOUT_S (the release thread runs soon, not now)."""
    deadline = time.monotonic() + TIMEOUT_S
    while ref() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    return ref() is None


def test_replaced_arrays_and_containers_of_arrays_are_freed_on_the_release_thread():
    State = collections.namedtuple("State", "mu nu")
    old = {"params": {f"w{i}": jnp.ones((4, 4)) for i in range(8)}, "opt": State(jnp.ones(2), jnp.ones(2)),
           "loss": jnp.float32(3.0)}
    refs = [weakref.ref(old["params"]["w0"]), weakref.ref(old["opt"].mu), weakref.ref(old["loss"])]
    namespace = dict(old, kept="unchanged")
    del old
    new = {"params": {f"w{i}": jnp.zeros((4, 4)) for i in range(8)}, "opt": State(jnp.zeros(2), jnp.zeros(2)),
           "loss": jnp.float32(1.0)}
    bind_results(namespace, new)
    assert namespace["params"] is new["params"] and namespace["opt"] is new["opt"] and namespace["kept"] == "unchanged"
    assert all(freed(ref) for ref in refs)
    assert any(t.name == "jaxpar-release" for t in threading.enumerate())


def test_a_few_replaced_arrays_are_freed_at_once():
    """Below RELEASE_MIN_ARRAYS, handing over would cost more than freeing here."""
    old = [jnp.ones(3) for _ in range(RELEASE_MIN_ARRAYS - 1)]
    refs = [weakref.ref(a) for a in old]
    namespace = {"x": old}
    del old
    bind_results(namespace, {"x": 0})
    assert all(ref() is None for ref in refs)  # already, without waiting


def test_other_values_are_finalized_at_once_on_the_callers_thread():
    finalized = []

    class Figure:  # a user's object whose finalizer may expect the main thread
        def __del__(self):
            finalized.append(threading.current_thread())

    namespace = {"fig": Figure(), "pair": [Figure(), jnp.ones(2)]}  # a list with a non-array leaf
    bind_results(namespace, {"fig": 1, "pair": 2})
    assert finalized == [threading.current_thread()] * 2  # already, and here
    assert namespace == {"fig": 1, "pair": 2}


def test_a_value_still_referenced_elsewhere_survives():
    kept = jnp.arange(3.0)
    namespace = {"x": kept}
    bind_results(namespace, {"x": jnp.zeros(3)})
    time.sleep(0.1)
    assert float(kept.sum()) == 3.0


def test_a_training_loop_cell_frees_the_previous_params(jx):
    """Through the magic: each %%shard re-run binds new params; the old ones do not pile up."""
    jx.push({"params": {"w": jnp.ones((8, 8)), "b": jnp.zeros(8)}, "x": jnp.ones((16, 8))})
    cell = ("grads = jax.grad(lambda p: ((x @ p['w'] + p['b']) ** 2).mean())(params)\n"
            "params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)\n")
    jx.run_cell_magic("shard", "--mesh data=8 --in x=data --no-show", cell)
    refs = [weakref.ref(jx.user_ns["params"]["w"]), weakref.ref(jx.user_ns["grads"]["b"])]
    jx.run_cell_magic("shard", "--mesh data=8 --in x=data --no-show", cell)
    assert all(freed(ref) for ref in refs)
    assert jx.user_ns["params"]["w"].shape == (8, 8)


def test_a_process_that_released_arrays_exits_cleanly():
    """The release thread is stopped at exit: freeing buffers while Python finalizes would abort."""
    import subprocess
    import sys

    code = ("import jax.numpy as jnp\n"
            "from jaxpar_magic.cell.bindings import RELEASE_MIN_ARRAYS, bind_results\n"
            "ns = {}\n"
            "for k in range(200):\n"
            "    bind_results(ns, {'params': {f'w{i}': jnp.full((64, 64), float(k)) for i in range(16)}})\n"
            "print('done')\n")
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                              env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
        assert (done.returncode, done.stdout.strip()) == (0, "done"), done.stderr[-2000:]
