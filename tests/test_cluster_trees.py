"""Pytrees as they cross the kernel/cluster boundary (`jaxpar_magic.cluster.trees`), without a cluster:
the skeleton and leaves that travel, and the value rebuilt from them in a fresh interpreter, the
way an engine receives it (only the bytes cross)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxpar_magic.cluster import trees
from jaxpar_magic.errors import UsageError


def test_paths_name_each_leaf_as_python_spells_it():
    state = optax.adam(0.1).init({"w": jnp.zeros((4, 2))})
    _, leaves = trees.flatten("opt", state)
    assert [path for path, _ in leaves] == ["opt[0].count", "opt[0].mu['w']", "opt[0].nu['w']"]
    _, leaves = trees.flatten("x", np.arange(3))
    assert [path for path, _ in leaves] == ["x"] and trees.label("x", "x") == "'x'"
    assert trees.label("opt[0].count", "opt") == "`opt[0].count`"


def test_a_value_jax_cannot_take_apart_travels_whole():
    odd = {1: "one", "two": 2}  # keys that do not sort
    skeleton, leaves = trees.flatten("odd", odd)
    assert leaves == [("odd", odd)]
    assert trees.rebuild("odd", skeleton, [odd]) == odd


REBUILD = textwrap.dedent("""
    import pickle, sys
    import jax, numpy as np
    from jaxpar_magic.cluster import trees
    skeleton, leaves = pickle.load(sys.stdin.buffer)
    value = trees.rebuild("v", skeleton, leaves)
    print(type(value).__name__, [type(leaf).__name__ for leaf in jax.tree.leaves(value)],
          float(sum(np.sum(leaf) for leaf in jax.tree.leaves(value))))
""")


@pytest.mark.parametrize("make, kind", [
    (lambda: eqx.nn.Linear(3, 2, key=jax.random.key(0)), "Linear"),
    (lambda: optax.adam(0.1).init({"w": jnp.ones((4, 2))}), "tuple"),
    (lambda: {"w": np.ones((2, 2)), "config": {"depth": 3}}, "dict"),
])
def test_rebuilt_as_the_same_type_in_another_interpreter(make, kind):
    import pickle

    value = make()
    skeleton, leaves = trees.flatten("v", value)
    sent = pickle.dumps((skeleton, [np.asarray(leaf) if isinstance(leaf, jax.Array) else leaf
                                    for _, leaf in leaves]))
    done = subprocess.run([sys.executable, "-c", REBUILD], input=sent, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    words = done.stdout.decode().split()
    name, total = words[0], words[-1]
    assert name == kind
    assert float(total) == pytest.approx(float(sum(np.sum(np.asarray(leaf)) for leaf in jax.tree.leaves(value))))


def test_a_type_unknown_on_the_other_side_is_a_usage_error():
    import pickle

    with pytest.raises(UsageError, match=r"'v' is a pytree whose type is unknown here.*%%cluster cell"):
        trees.rebuild("v", pickle.dumps(trees.Slot()).replace(b"Slot", b"Gone"), [1])
