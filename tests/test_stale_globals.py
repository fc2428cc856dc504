"""Changing a global that a helper reads takes effect on the next run (jax.jit alone would keep the
first run's value), in block mode, function mode, %%shard and %%shard_map: directly, through the
wrappers JAX and functools make (jax.grad, vmap, jit, checkpoint, partial, Partial, a lax.scan body,
a callable object), and by what the program is compiled for (-0.0 is not 0.0, 1 is not True or
1.0, NaNs by their bits); unchanged values keep the fast path.
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


# --- a helper reached through a wrapper (issue 22, item 2) ---------------------------------------

WRAPPERS = {  # name -> (definitions, the cell, y as a function of x and sg)
    "jax.grad": ("h = jax.grad(lambda v: jnp.sum(v * sg))", "y = h(x)", lambda x, sg: np.full_like(x, sg)),
    "jax.vmap": ("def f(v):\n    return v * sg\nh = jax.vmap(f)", "y = h(x)", lambda x, sg: x * sg),
    "jax.value_and_grad": ("def f(v):\n    return jnp.sum(v * sg)\nh = jax.value_and_grad(f)", "y = h(x)[1]",
                           lambda x, sg: np.full_like(x, sg)),
    "jax.jit": ("def f(v):\n    return v * sg\nh = jax.jit(f)", "y = h(x)", lambda x, sg: x * sg),
    "jax.jit(jax.grad)": ("h = jax.jit(jax.grad(lambda v: jnp.sum(v * sg)))", "y = h(x)",
                          lambda x, sg: np.full_like(x, sg)),
    "functools.partial": ("import functools\ndef f(v, k):\n    return v * sg * k\nh = functools.partial(f, k=2.0)",
                          "y = h(x)", lambda x, sg: x * sg * 2.0),
    "jax.tree_util.Partial": ("def f(v, k):\n    return v * sg * k\nh = jax.tree_util.Partial(f, k=2.0)",
                              "y = h(x)", lambda x, sg: x * sg * 2.0),
    "a callable object": ("class Scaled:\n    def __call__(self, v):\n        return v * sg\nh = Scaled()", "y = h(x)",
                          lambda x, sg: x * sg),
    "a method": ("class Model:\n    def apply(self, v):\n        return v * sg\nm = Model()", "y = m.apply(x)",
                 lambda x, sg: x * sg),
    "jax.checkpoint": ("def f(v):\n    return v * sg\nh = jax.checkpoint(f)", "y = h(x)", lambda x, sg: x * sg),
    "a lax.scan body": ("def body(c, v):\n    return c, v * sg\ndef h(v):\n    return lax.scan(body, 0.0, v)[1]",
                        "y = h(x)", lambda x, sg: x * sg),
    "a lax.cond branch": ("def f(v):\n    return v * sg\ndef h(v):\n    return lax.cond(True, f, lambda v: v, v)",
                          "y = h(x)", lambda x, sg: x * sg),
}
MAGICS = {  # name -> (magic, line)
    "shard": ("shard", "--mesh data=8 --in x=data --no-show"),
    "shard with the view": ("shard", "--mesh data=8 --in x=data"),
    "pmap": ("pmap", "--no-show"),
    "shard_map": ("shard_map", "--mesh data=8 --in x=data --out y=data --no-show"),
}


@pytest.mark.parametrize("magic", list(MAGICS))
@pytest.mark.parametrize("wrapper", list(WRAPPERS))
def test_a_changed_global_is_seen_through_a_wrapper(jx, wrapper, magic):
    definitions, cell, expected = WRAPPERS[wrapper]
    name, line = MAGICS[magic]
    if wrapper in ("a lax.scan body", "jax.vmap") and name == "pmap":
        cell = "y = h(x[None])[0]"  # per device x is a scalar: map over a one-row block
    values = np.arange(1.0, N_DEVICES + 1)
    run(jx, "sg = 2.0\n" + definitions)
    for sg in (2.0, 3.0, -0.0, 3.0):
        jx.user_ns["sg"] = sg
        jx.push({"x": jnp.asarray(values)})
        with capture_output():
            jx.run_cell_magic(name, line, cell)
        y = np.asarray(jx.user_ns["y"])
        np.testing.assert_array_equal(y, expected(values, sg))
        np.testing.assert_array_equal(np.signbit(y), np.signbit(expected(values, sg)))  # -0.0 is not 0.0


INPUTS_HOLDING_FUNCTIONS = {  # an input (it has array leaves) whose structure holds a function of the user's
    "jax.tree_util.Partial": "def f(v, w):\n    return v * w * sg\nh = jax.tree_util.Partial(f, w=jnp.float32(2.0))",
    "an Equinox module": ("import equinox as eqx\nclass Scaled(eqx.Module):\n    w: jax.Array\n"
                          "    def __call__(self, v):\n        return v * self.w * sg\nh = Scaled(jnp.float32(2.0))"),
    "an Equinox static field": ("import equinox as eqx\ndef act(v):\n    return v * sg\nclass Layer(eqx.Module):\n"
                                "    w: jax.Array\n    fn: object = eqx.field(static=True)\n"
                                "    def __call__(self, v):\n        return self.fn(v * self.w)\nh = Layer(jnp.float32(2.0), act)"),
    "a Flax NNX module": ("from flax import nnx\nclass Scaled(nnx.Module):\n    def __init__(self):\n"
                          "        self.w = nnx.Param(jnp.float32(2.0))\n    def __call__(self, v):\n"
                          "        return v * self.w[...] * sg\nh = Scaled()"),
    "a function an NNX module holds": ("from flax import nnx\ndef act(v):\n    return v * sg\n"
                                       "class Layer(nnx.Module):\n    def __init__(self):\n"
                                       "        self.w = nnx.Param(jnp.float32(2.0))\n        self.fn = act\n"
                                       "    def __call__(self, v):\n        return self.fn(v * self.w[...])\nh = Layer()"),
}


@pytest.mark.parametrize("magic, line", [("shard", "--mesh data=8 --no-show"), ("pmap", "--broadcast h --no-show")])
@pytest.mark.parametrize("holder", list(INPUTS_HOLDING_FUNCTIONS))
def test_a_global_read_by_a_function_an_input_holds(jx, x, holder, magic, line):
    """The function is part of the input's pytree structure, which == compares by identity only."""
    run(jx, "sg = 1.0\n" + INPUTS_HOLDING_FUNCTIONS[holder])
    for sg in (1.0, 3.0, -0.0):
        jx.user_ns["sg"] = sg
        jx.push({"x": jnp.asarray(x + 1)})
        jx.run_cell_magic(magic, line, "y = h(x)")
        np.testing.assert_array_equal(jx.user_ns["y"], (x + 1) * 2.0 * sg)
        np.testing.assert_array_equal(np.signbit(jx.user_ns["y"]), np.signbit((x + 1) * 2.0 * sg))


def test_function_mode_sees_a_global_through_a_wrapper(jx, x):
    run(jx, "sg = 2.0\nh = jax.grad(lambda v: jnp.sum(v * sg))")
    with capture_output():
        pmap(jx, "def step(v):\n    return h(v)\n", "")
    for sg in (2.0, 5.0):
        jx.user_ns["sg"] = sg
        np.testing.assert_array_equal(jx.user_ns["step"](jnp.asarray(x)), np.full(N_DEVICES, sg))


def test_an_attribute_of_a_callable_object_is_part_of_the_key(jx, x, compiles):
    run(jx, "class Scaled:\n    def __init__(self, k):\n        self.k = k\n    def __call__(self, v):\n"
            "        return v * self.k\nh = Scaled(2.0)")
    pmap(jx, "y = h(x)")
    run(jx, "h.k = 3.0")  # changed in place: a plain jax.jit would keep 2.0
    pmap(jx, "y = h(x)")
    np.testing.assert_array_equal(jx.user_ns["y"], x * 3.0)
    before = compiles.count
    pmap(jx, "y = h(x)")  # unchanged: no compile
    assert compiles.count == before


def test_a_jitted_helper_gives_the_fresh_value_even_when_jit_traced_it_before(jx, x):
    """jit keeps the trace it made with the old global; the magic's promise is stronger."""
    run(jx, "sg = 1.0\ndef f(v):\n    return v * sg\nh = jax.jit(f)\nplain = h(x)")
    line = "--mesh data=8 --no-show"
    jx.run_cell_magic("shard", line, "y = h(x)")  # traces h for x's shape under the mesh
    run(jx, "sg = 2.0\nstill = h(x)")
    np.testing.assert_array_equal(jx.user_ns["still"], x * 1.0)  # plain JAX: jit's cached program
    jx.run_cell_magic("shard", line, "z = h(x)")  # a new cell: jit would hand it the sg = 1 trace
    np.testing.assert_array_equal(jx.user_ns["z"], x * 2.0)
    jx.run_cell_magic("shard", line, "y = h(x)")  # the first cell, compiled again
    np.testing.assert_array_equal(jx.user_ns["y"], x * 2.0)
    pmap(jx, "w = h(x)")
    np.testing.assert_array_equal(jx.user_ns["w"], x * 2.0)


def test_an_unchanged_wrapped_helper_keeps_the_compiled_program(jx, x, compiles):
    run(jx, "sg = 2.0\nh = jax.jit(jax.grad(lambda v: jnp.sum(v * sg)))")
    pmap(jx, "y = h(x)")
    before = compiles.count
    for _ in range(3):
        pmap(jx, "y = h(x)")
    assert compiles.count == before


@pytest.mark.parametrize("use", ["scan", "cond", "checkpoint", "jit", "jit of grad"])
def test_forget_traces_makes_a_kept_trace_go(use):
    """The one reach into JAX's private caches (cell/jax_traces.py): fails loudly when a JAX release
    moves the registry or stops keying these traces by the function."""
    import jax
    from jax import lax
    from jax._src.util import _caches  # noqa: F401  (what forget_traces walks)

    from jaxpar_magic.cell.fingerprints import traced_callables
    from jaxpar_magic.cell.jax_traces import forget_traces

    ns = {"lax": lax, "jnp": jnp, "sg": 1.0}
    exec("def f(v):\n    return v * sg\ndef body(c, v):\n    return c, v * sg\n"
         "def g(v):\n    return jnp.sum(v * sg)\n", ns)
    helper = {"scan": ns["body"], "cond": ns["f"], "checkpoint": jax.checkpoint(ns["f"]), "jit": jax.jit(ns["f"]),
              "jit of grad": jax.jit(jax.grad(ns["g"]))}[use]
    call = {"scan": lambda v: lax.scan(helper, 0.0, v)[1], "cond": lambda v: lax.cond(True, helper, lambda u: u, v)}
    call = call.get(use, helper)
    x = jnp.arange(1.0, 4.0)
    first = jax.jit(lambda v: call(v))(x)
    ns["sg"] = 2.0
    stale = jax.jit(lambda v: call(v))(x)  # a new program, as a recompiled cell is
    np.testing.assert_array_equal(stale, first)  # JAX kept the trace: why forget_traces exists
    forget_traces(traced_callables([helper]))
    fresh = jax.jit(lambda v: call(v))(x)
    np.testing.assert_array_equal(fresh, 2.0 * np.asarray(first))


def test_fingerprints_follow_wrappers_without_walking_library_code():
    import functools

    import jax

    ns: dict = {"jnp": jnp, "sg": 1.0}
    exec("def f(v):\n    return jnp.sum(v * sg)\n", ns)
    for wrap in (jax.grad, jax.vmap, jax.jit, jax.checkpoint, jax.value_and_grad, lambda f: functools.partial(f),
                 lambda f: jax.tree_util.Partial(f)):
        wrapped = wrap(ns["f"])
        before = fingerprint(wrapped)
        assert len(repr(before)) < 1000  # f's own reads, not JAX's internals
        ns["sg"] = 2.0
        assert fingerprint(wrapped) != before
        ns["sg"] = 1.0
        assert fingerprint(wrapped) == before


# --- values that compare equal but are not (issue 22, item 3) ------------------------------------

def test_negative_zero_is_its_own_program(jx, x):
    run(jx, "s = 0.0")
    pmap(jx, "y = (x + 1) / s")
    assert np.all(np.isposinf(jx.user_ns["y"]))
    run(jx, "s = -0.0")  # -0.0 == 0.0, but x / s is -inf
    pmap(jx, "y = (x + 1) / s")
    assert np.all(np.isneginf(jx.user_ns["y"]))
    jx.run_cell_magic("shard", "--mesh data=8 --no-show", "z = (x + 1) / s")
    assert np.all(np.isneginf(jx.user_ns["z"]))
    run(jx, "s = 0.0\ndef f(v):\n    return v / s\n")
    jx.run_cell_magic("shard", "--mesh data=8 --no-show", "z = f(x + 1)")
    run(jx, "s = -0.0")  # through a helper
    jx.run_cell_magic("shard", "--mesh data=8 --no-show", "z = f(x + 1)")
    assert np.all(np.isneginf(jx.user_ns["z"]))


def _nan(payload: int) -> float:
    import struct

    return struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000000 | payload))[0]


def test_nans_are_compared_by_their_bits(jx, x, compiles):
    run(jx, "s = float('nan')")
    pmap(jx, "y = x * 0 + s")
    before = compiles.count
    jx.user_ns["s"] = float("nan")  # another NaN object with the same bits: the same program
    pmap(jx, "y = x * 0 + s")
    assert compiles.count == before
    assert fingerprint(_nan(1 << 40)) != fingerprint(_nan(0))  # another payload: another program
    assert fingerprint(_nan(1 << 40)) == fingerprint(_nan(1 << 40))


@pytest.mark.parametrize("values", [(1, True, 1.0), (0, False, 0.0)])
def test_python_types_are_part_of_the_key(jx, x, values):
    for value in values + values[:1]:
        jx.user_ns["s"] = value
        pmap(jx, "y = jnp.asarray(s) + jnp.zeros((), jnp.asarray(s).dtype)")
        assert jx.user_ns["y"].dtype == jnp.asarray(value).dtype
        jx.run_cell_magic("shard", "--mesh data=8 --no-show", "z = jnp.asarray(s)\nt = s")
        assert jx.user_ns["z"].dtype == jnp.asarray(value).dtype and type(jx.user_ns["t"]) is type(value)


def test_fingerprints_of_equal_but_different_values():
    assert fingerprint(0.0) != fingerprint(-0.0)
    assert fingerprint(1) != fingerprint(True) != fingerprint(1.0) != fingerprint(1)
    assert fingerprint(complex(0.0, 0.0)) != fingerprint(complex(0.0, -0.0))
    assert fingerprint((0.0, {"a": 1})) != fingerprint((-0.0, {"a": 1})) != fingerprint((0.0, {"a": True}))
    assert fingerprint(np.float32(0.0)) != fingerprint(np.float32(-0.0)) != fingerprint(np.float64(0.0))
    assert fingerprint(np.float32(2.0)) == fingerprint(np.float32(2.0))  # a NumPy scalar by content
    assert fingerprint(np.array([0.0])) != fingerprint(np.array([-0.0]))


def test_large_containers_and_arrays_are_keyed_by_identity_as_the_readme_says():
    """The README's limit: a list of more than 64 items, or a NumPy array over 64 KiB, mutated in
    place is not seen (rebind the name); smaller ones are read by content."""
    from jaxpar_magic.cell.fingerprints import MAX_ITEMS, SMALL_ARRAY_BYTES

    for size, seen in ((MAX_ITEMS, True), (MAX_ITEMS + 1, False)):
        items = [1.0] * size
        before = fingerprint(items)
        items[0] = 2.0
        assert (fingerprint(items) != before) is seen, size
    for count, seen in ((SMALL_ARRAY_BYTES // 8, True), (SMALL_ARRAY_BYTES // 8 + 1, False)):
        array = np.zeros(count)
        before = fingerprint(array)
        array[0] = 1.0
        assert (fingerprint(array) != before) is seen, count
