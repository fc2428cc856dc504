"""Changing a global that a helper reads takes effect on the next run (jax.jit alone would keep the
first run's value), in block mode, function mode and %%shard; unchanged values keep the fast path.
"""
from __future__ import annotations

import textwrap

import jax.numpy as jnp
import numpy as np
import pytest
from IPython.utils.capture import capture_output

from jaxpar_magic.cell.fingerprints import MAX_DEPTH, Ref, fingerprint
from shell_helpers import N_DEVICES


def run(ip, source: str):
    ip.run_cell(textwrap.dedent(source), store_history=False).raise_error()


def pmap(ip, source: str, line: str = "--no-show"):
    return ip.run_cell_magic("pmap", line, textwrap.dedent(source))


@pytest.fixture
def x(jx):
    jx.push({"x": jnp.arange(float(N_DEVICES))})
    return np.arange(float(N_DEVICES))


def test_the_issues_example_a_helpers_global_changes(jx, x, compiles):
    run(jx, "scale = 2.0\ndef f(v):\n    return v * scale\n")
    pmap(jx, "y = f(x)")
    np.testing.assert_allclose(jx.user_ns["y"], x * 2.0)
    run(jx, "scale = 3.0")
    pmap(jx, "y = f(x)")
    np.testing.assert_allclose(jx.user_ns["y"], x * 3.0)
    before = compiles.count
    pmap(jx, "y = f(x)")  # unchanged: the cached program, no compile
    assert compiles.count == before
    np.testing.assert_allclose(jx.user_ns["y"], x * 3.0)


def test_followed_through_a_chain_of_helpers(jx, x):
    run(jx, "offset = 1.0\ndef g(v):\n    return v + offset\ndef f(v):\n    return g(v) * 2\n")
    pmap(jx, "y = f(x)")
    np.testing.assert_allclose(jx.user_ns["y"], (x + 1.0) * 2)
    run(jx, "offset = 10.0")
    pmap(jx, "y = f(x)")
    np.testing.assert_allclose(jx.user_ns["y"], (x + 10.0) * 2)


def test_a_helper_redefined_in_a_later_cell(jx, x):
    run(jx, "def g(v):\n    return v + 1\ndef f(v):\n    return g(v)\n")
    pmap(jx, "y = f(x)")
    run(jx, "def g(v):\n    return v - 1\n")
    pmap(jx, "y = f(x)")
    np.testing.assert_allclose(jx.user_ns["y"], x - 1)


def test_closure_cells_count_as_constants(jx, x):
    run(jx, """
        def make():
            k = 2.0
            def f(v):
                return v * k
            def set_k(value):
                nonlocal k
                k = value
            return f, set_k
        f, set_k = make()
    """)
    pmap(jx, "y = f(x)")
    np.testing.assert_allclose(jx.user_ns["y"], x * 2.0)
    run(jx, "set_k(5.0)")
    pmap(jx, "y = f(x)")
    np.testing.assert_allclose(jx.user_ns["y"], x * 5.0)


def test_small_containers_and_numpy_arrays_are_read_by_content(jx, x):
    run(jx, "cfg = {'scale': 2.0}\nw = np.array([1.0])\ndef f(v):\n    return v * cfg['scale'] + w[0]\n")
    pmap(jx, "y = f(x)")
    run(jx, "cfg['scale'] = 4.0\nw[:] = 3.0")  # changed in place, not rebound
    pmap(jx, "y = f(x)")
    np.testing.assert_allclose(jx.user_ns["y"], x * 4.0 + 3.0)


def test_a_global_the_cell_reads_directly(jx, x):
    run(jx, "k = 2")
    pmap(jx, "y = x * k")
    run(jx, "k = 7")
    pmap(jx, "y = x * k")
    np.testing.assert_allclose(jx.user_ns["y"], x * 7)


def test_function_mode_sees_a_changed_global(jx, x):
    run(jx, "scale = 2.0")
    with capture_output():
        pmap(jx, "def step(v):\n    return v * scale\n", "")
    np.testing.assert_allclose(jx.user_ns["step"](jnp.asarray(x)), x * 2.0)
    run(jx, "scale = 5.0")
    np.testing.assert_allclose(jx.user_ns["step"](jnp.asarray(x)), x * 5.0)


def test_function_mode_keeps_its_program_while_nothing_changes(jx, x, compiles):
    run(jx, "scale = 2.0")
    with capture_output():
        pmap(jx, "def step(v):\n    return v * scale\n", "")
    step = jx.user_ns["step"]
    step(jnp.asarray(x))
    before = compiles.count
    for _ in range(3):
        step(jnp.asarray(x))
    assert compiles.count == before


def test_shard_sees_a_changed_helper_global(jx, compiles):
    run(jx, "bias = 1.0\ndef f(v):\n    return v + bias\nv = jnp.zeros(8)")
    jx.run_cell_magic("shard", "--mesh data=8 --in v=data --no-show", "y = f(v)")
    np.testing.assert_allclose(jx.user_ns["y"], np.ones(8))
    run(jx, "bias = 2.5")
    jx.run_cell_magic("shard", "--mesh data=8 --in v=data --no-show", "y = f(v)")
    np.testing.assert_allclose(jx.user_ns["y"], np.full(8, 2.5))
    before = compiles.count
    jx.run_cell_magic("shard", "--mesh data=8 --in v=data --no-show", "y = f(v)")
    assert compiles.count == before


# --- the fingerprint itself ---------------------------------------------------------------------

def test_fingerprint_ends_on_recursive_helpers():
    ns: dict = {}
    exec("def even(n):\n    return n == 0 or odd(n - 1)\ndef odd(n):\n    return n != 0 and even(n - 1)\n", ns)
    assert fingerprint(ns["even"]) == fingerprint(ns["even"])


def test_fingerprint_follows_helpers_only_so_deep():
    ns: dict = {"leaf": 1}
    source = "def h0(v):\n    return v + leaf\n"
    for depth in range(1, MAX_DEPTH + 3):
        source += f"def h{depth}(v):\n    return h{depth - 1}(v)\n"
    exec(source, ns)
    near, far = ns["h1"], ns[f"h{MAX_DEPTH + 2}"]
    a_near, a_far = fingerprint(near), fingerprint(far)
    ns["leaf"] = 2
    assert fingerprint(near) != a_near  # within the bound: seen
    assert fingerprint(far) == a_far  # past the bound: keyed by identity only (the README says so)


def test_refs_hold_weakly_and_die_unequal():
    import gc

    def helper():
        return 1

    ref = Ref(helper)
    assert ref == Ref(helper)
    del helper
    gc.collect()
    assert ref.get() is None
    assert ref != ref  # a dead reference matches nothing, not even itself
