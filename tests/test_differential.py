"""The magics against plain JAX over random notebook sessions (issue 22: keep silent wrong results out).

A hypothesis state machine plays a notebook in one real IPython shell with the extension loaded:
it rebinds the input `x` (shapes, dtypes and values from small sets, so shapes come back), changes
the global `sg` that the helper `h` reads (also to -0.0, 1, True), changes an attribute of a
callable object, defines or redefines `h` (a plain function, or one reached through jax.grad,
jax.vmap, jax.value_and_grad, jax.jit, functools.partial, jax.tree_util.Partial, a callable object,
a lax.scan body), and runs cells under %%shard (with and without --in), %%pmap (block and function
mode) and %%shard_map, with the view and without it (the replayed re-run).

The oracle is the same cell run as plain Python and JAX, eagerly, in a fresh namespace where every
plain step of the session so far was executed again: its helpers are new function objects, so no
trace JAX kept for the notebook's own (with an old global) can answer for them. A %%pmap cell runs
once per device slice and the results are stacked, a %%shard_map cell once per block and
concatenated by its --out spec. Every name the cell binds and its final value must match: values,
shapes, dtypes, Python types, the bits of Python floats (-0.0) and the sign of infinities (not of
an array's zeros: compiled XLA may fold them, as plain jax.jit does). When the oracle raises, the
magic must raise too and leave the namespace exactly as it was (checked by identity).

In CI it runs a fixed, derandomized budget (20 sequences of up to 10 steps: about 2 minutes on two
busy cores); `JPM_DIFFERENTIAL_EXAMPLES=500` (sequences) and `JPM_DIFFERENTIAL_STEPS=40` (steps per
sequence at most) run more by hand, and `JPM_DIFFERENTIAL_RANDOM=1` draws new sequences each run
instead of the fixed ones. A failure prints the notebook's cells in order, the failing one last.
With the -0.0 key of cell/fingerprints.py reverted to the float itself, 60 sequences find it.
"""
from __future__ import annotations

import ast
import os
import struct
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test
from IPython.utils.capture import capture_output

from shell_helpers import N_DEVICES, snapshot

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("JPM_DIFFERENTIAL_EXAMPLES", "20"))
STEPS = int(os.environ.get("JPM_DIFFERENTIAL_STEPS", "10"))
RANDOM = os.environ.get("JPM_DIFFERENTIAL_RANDOM") == "1"

IMPORTS = "import functools\nimport jax\nimport jax.numpy as jnp\nimport numpy as np\nfrom jax import lax\n"
# The cells' mesh has Auto axes: the oracle runs without layouts, and on Explicit axes (what
# jax.make_mesh gives by default) a cell slicing its sharded `x` needs an out_sharding, in plain JAX too.
MESH = 'mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))\n'

SHAPES = [(8,), (16,), (8, 2)]  # few, so that a shape comes back after another
DTYPES = ["float32", "int32"]
FILLS = ["arange", "ones", "negative"]
GLOBALS = [2.0, -0.0, 0.0, 1, True, 1.0]  # values that == calls equal, and -0.0
ATTRIBUTES = [1.5, -0.0, 2, 0.5]
OPERATORS = ["*", "+", "-"]

# The helper `h`, elementwise so that a device slice, a block and the whole array agree; `{op}` is
# how it combines its argument with `sg`.
HELPERS = {
    "plain": "def f(v):\n    return v {op} sg\nh = f",
    "jax.grad": "def f(v):\n    return jnp.sum(v {op} sg)\nh = jax.grad(f)",
    "jax.vmap": "def f(v):\n    return v {op} sg\nh = jax.vmap(f)",
    "jax.value_and_grad": "def f(v):\n    return jnp.sum((v {op} sg) * v)\n_vg = jax.value_and_grad(f)\n"
                          "def h(v):\n    return _vg(v)[1]",
    "jax.jit": "def f(v):\n    return v {op} sg\nh = jax.jit(f)",
    "functools.partial": "def f2(v, k):\n    return (v {op} sg) * k\nh = functools.partial(f2, k=2.0)",
    "jax.tree_util.Partial": "def f2(v, k):\n    return (v {op} sg) * k\nh = jax.tree_util.Partial(f2, k=2.0)",
    "a callable object": "class Scaled:\n    def __init__(self):\n        self.k = 1.5\n"
                         "    def __call__(self, v):\n        return (v {op} sg) * self.k\nh = Scaled()",
    "a lax.scan body": "def body(c, v):\n    return c, v {op} sg\n"
                       "def h(v):\n    return lax.scan(body, 0.0, v.reshape(-1))[1].reshape(jnp.shape(v))",
}

# Cells: (source, the names it binds). All of them read x, sg and h.
GLOBAL_CELLS = [  # %%shard and %%pmap block mode
    ("rows = x.size\nparts = [x.reshape(-1)[i:i + 4] for i in range(0, x.size, 4)]\ny = h(x * 1.0)\nlen(parts)",
     ("rows", "parts", "y")),
    ("y = h(x * 1.0) + 1\nt = sg\nz = y * sg", ("y", "t", "z")),
    ("q = (x * 1.0 + 1) / sg", ("q",)),
    ("h(x * 1.0).sum()", ()),
]
BLOCK_CELLS = [  # %%shard_map --in x=data --out y=data: y assembled by blocks, the final plain;
    # with --out only the names listed are bound (rows and t are the body's temporaries)
    ("rows = x.size\ny = h(x * 1.0)\nrows * 2", ("y",)),
    ("y = h(x * 1.0) + 1\nt = sg", ("y",)),
]
FUNCTION_CELL = "def step(v):\n    return h(v * 1.0) + sg\n"


class Found:
    """What the runs met, for the closing note (printed by the test; `pytest -s` shows it)."""

    sequences = 0
    steps = 0
    checks = 0
    raised = 0


def _values(shape, dtype, fill):
    count = int(np.prod(shape))
    base = {"arange": np.arange(count), "ones": np.ones(count), "negative": -np.arange(count)}[fill]
    return base.reshape(shape).astype(dtype)


def _split_final(source: str):
    """(the cell's statements, its final expression or None), as compiled code objects."""
    tree = ast.parse(source)
    final = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        final = ast.Expression(tree.body.pop().value)
    body = compile(tree, "<oracle>", "exec")
    return body, (compile(final, "<oracle>", "eval") if final is not None else None)


def _run_plain(source: str, ns: dict):
    """Run a cell as plain Python and JAX, op by op (jax.disable_jit: a jitted helper, a scan body
    run as Python; nothing is compiled per helper): returns its final value (None without one)."""
    body, final = _split_final(source)
    with jax.disable_jit():
        exec(body, ns)
        return eval(final, ns) if final is not None else None


def _has_arrays(value) -> bool:
    return any(isinstance(leaf, (jax.Array, np.ndarray)) for leaf in jax.tree.leaves(value))


def _stacked(per_part: list, join):
    """Per-device (or per-block) results as the magic binds them: arrays joined, plain values once."""
    if _has_arrays(per_part[0]):
        return jax.tree.map(lambda *leaves: join([np.asarray(leaf) for leaf in leaves]), *per_part)
    for other in per_part[1:]:
        _assert_same(other, per_part[0], "a plain value that differs between devices")
    return per_part[0]


def _bits(value: float) -> bytes:
    return struct.pack("<d", value)


def _assert_same(actual, expected, where: str) -> None:
    if isinstance(expected, (jax.Array, np.ndarray)):
        assert isinstance(actual, jax.Array), f"{where}: {type(actual).__name__}, plain JAX gives an array"
        assert actual.shape == expected.shape, f"{where}: shape {actual.shape}, plain JAX {expected.shape}"
        assert actual.dtype == expected.dtype, f"{where}: dtype {actual.dtype}, plain JAX {expected.dtype}"
        got, want = np.asarray(actual), np.asarray(expected)
        if np.issubdtype(want.dtype, np.floating):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=0, equal_nan=True, err_msg=where)
            # -inf for inf is what a stale program gets wrong (x / sg after sg = -0.0). Not the sign of
            # an array's zeros: XLA folds `v * 0.0 + 0.0` to `v * 0.0`, so plain jax.jit gives -0.0
            # where eager JAX gives 0.0 (a Python float, t = sg, is still compared by its bits).
            edge = np.isinf(want)
            np.testing.assert_array_equal(np.signbit(got[edge]), np.signbit(want[edge]), err_msg=f"{where}: signs")
        else:
            np.testing.assert_array_equal(got, want, err_msg=where)
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected), \
            f"{where}: {type(actual).__name__} of {len(actual)}, plain JAX {type(expected).__name__} of {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            _assert_same(a, e, f"{where}[{i}]")
    else:
        assert type(actual) is type(expected), f"{where}: {actual!r} ({type(actual).__name__}), plain JAX {expected!r}"
        if isinstance(expected, float):
            assert _bits(actual) == _bits(expected), f"{where}: {actual!r}, plain JAX {expected!r}"
        else:
            assert actual == expected, f"{where}: {actual!r}, plain JAX {expected!r}"


class Notebook(RuleBasedStateMachine):
    """One notebook session; `shell` and `baseline` are set by the test before it runs."""

    shell = None
    baseline: dict = {}

    def __init__(self):
        super().__init__()
        Found.sequences += 1
        self.ns = self.shell.user_ns
        self.ns.clear()
        self.ns.update(self.baseline)
        self.history: list[str] = [IMPORTS + MESH]  # every plain step, in order: the oracle runs them again
        self.session: list[str] = []  # every cell run so far, magics included: a failure prints them
        self.helper = None
        self.defined_step = False
        self.last = None  # (magic, line, cell, oracle) of the last magic cell run
        # Each session's cells are its own (a comment line): the magics' caches do not carry a
        # program from one sequence to the next, so a failure replays, and shrinks, the same way.
        self.tag = f"# session {Found.sequences}\n"
        self.play(IMPORTS + MESH)

    # --- the plain steps --------------------------------------------------------------------

    def play(self, source: str) -> None:
        result = self.shell.run_cell(source, store_history=False, silent=True)
        result.raise_error()

    def plain_step(self, source: str) -> None:
        Found.steps += 1
        self.history.append(source)
        self.session.append(source)
        self.play(source)

    @initialize(shape=st.sampled_from(SHAPES), dtype=st.sampled_from(DTYPES), fill=st.sampled_from(FILLS),
                sg=st.sampled_from(GLOBALS), helper=st.sampled_from(list(HELPERS)), op=st.sampled_from(OPERATORS))
    def start(self, shape, dtype, fill, sg, helper, op):
        self.rebind_x(shape, dtype, fill)
        self.change_sg(sg)
        self.define_h(helper, op)

    @rule(shape=st.sampled_from(SHAPES), dtype=st.sampled_from(DTYPES), fill=st.sampled_from(FILLS))
    def rebind_x(self, shape, dtype, fill):
        values = _values(shape, dtype, fill).tolist()
        self.plain_step(f"x = jnp.asarray(np.array({values!r}, dtype={dtype!r}))")

    @rule(sg=st.sampled_from(GLOBALS))
    def change_sg(self, sg):
        self.plain_step(f"sg = {sg!r}")

    @rule(helper=st.sampled_from(list(HELPERS)), op=st.sampled_from(OPERATORS))
    def define_h(self, helper, op):
        self.helper = helper
        self.plain_step(HELPERS[helper].format(op=op))

    @precondition(lambda self: self.helper == "a callable object")
    @rule(k=st.sampled_from(ATTRIBUTES))
    def change_attribute(self, k):
        self.plain_step(f"h.k = {k!r}")

    # --- the magics ---------------------------------------------------------------------------

    @rule(cell=st.sampled_from(GLOBAL_CELLS), place=st.booleans(), show=st.booleans())
    def shard(self, cell, place, show):
        line = "--mesh mesh" + (" --in x=data" if place else "") + ("" if show else " --no-show")
        self.check("shard", line, cell, self.oracle_whole)

    @rule(cell=st.sampled_from(GLOBAL_CELLS), show=st.booleans())
    def pmap_block(self, cell, show):
        self.check("pmap", "" if show else "--no-show", cell, self.oracle_per_device)

    @rule(cell=st.sampled_from(BLOCK_CELLS), show=st.booleans())
    def shard_map(self, cell, show):
        line = "--mesh mesh --in x=data --out y=data" + ("" if show else " --no-show")
        self.check("shard_map", line, cell, self.oracle_per_block)

    @precondition(lambda self: self.last is not None)
    @rule()
    def rerun_last(self):
        """What a notebook does most: change something, run the same cell again."""
        self.check(*self.last)

    @rule(show=st.booleans())
    def pmap_function(self, show):
        Found.steps += 1
        line = "" if show else "--no-show"
        self.session.append(f"%%pmap {line}\n{FUNCTION_CELL}")
        with capture_output():
            self.shell.run_cell_magic("pmap", line, self.tag + FUNCTION_CELL)
        self.defined_step = True

    @precondition(lambda self: self.defined_step)
    @rule()
    def call_step(self):
        """A plain cell calls the %%pmap-defined `step`: jax.pmap's meaning, one slice per device."""
        Found.steps += 1
        Found.checks += 1
        before = snapshot(self.ns)
        expected, error = self.oracle_per_device(FUNCTION_CELL + "out = step(x)", ("out",))
        self.session.append("out = step(x)")
        with capture_output():  # the UsageError's text, when step(x) has no slice per device
            result = self.shell.run_cell("out = step(x)", store_history=False, silent=True)
        if error is not None:
            Found.raised += 1
            assert result.error_in_exec is not None, f"plain JAX raised {error!r}, step(x) did not{self.context()}"
            assert snapshot(self.ns) == before, f"a failed step(x) changed the namespace{self.context()}"
            return
        result.raise_error()
        self.compare(self.ns["out"], expected["out"], "out = step(x)")

    # --- the check ----------------------------------------------------------------------------

    def check(self, magic: str, line: str, cell, oracle) -> None:
        self.last = (magic, line, cell, oracle)
        source, names = cell
        Found.steps += 1
        Found.checks += 1
        expected, error = oracle(source, names)
        self.session.append(f"%%{magic} {line}\n{source}")
        before = snapshot(self.ns)
        try:
            with capture_output():
                final = self.shell.run_cell_magic(magic, line, self.tag + source)
        except Exception as exc:  # noqa: BLE001  (compared with what plain JAX did)
            if error is None:
                    raise AssertionError(f"%%{magic} {line} raised {exc!r} where plain JAX gives a result"
                                     f"{self.context()}") from exc
            Found.raised += 1
            assert snapshot(self.ns) == before, f"a failed cell changed the namespace{self.context()}"
            return
        assert error is None, f"plain JAX raised {error!r}, %%{magic} {line} did not{self.context()}"
        for name in names:
            self.compare(self.ns[name], expected[name], f"{name} bound by the last cell")
        self.compare(final, expected["(final)"], "the last cell's final value")

    def compare(self, actual, expected, where: str) -> None:
        try:
            _assert_same(actual, expected, where)
        except AssertionError as exc:
            raise AssertionError(f"{exc}{self.context()}") from None

    def context(self) -> str:
        """The session so far as notebook cells, the failing one last."""
        cells = "\n".join(f"[{i}]: " + cell.replace("\n", "\n     ") for i, cell in enumerate(self.session, 1))
        return f"; the notebook's cells:\n{cells}\n"

    # --- the oracles: plain Python and JAX --------------------------------------------------------

    def fresh_namespace(self) -> dict:
        """Every plain step again, in a new namespace: new helper objects, the notebook's current values."""
        ns: dict = {}
        for source in self.history:
            exec(source, ns)
        return ns

    def oracle_whole(self, source: str, names):
        """%%shard: the cell on the whole arrays."""
        ns = self.fresh_namespace()
        try:
            final = _run_plain(source, ns)
        except Exception as exc:  # noqa: BLE001
            return None, exc
        return {**{n: ns[n] for n in names}, "(final)": final}, None

    def oracle_per_device(self, source: str, names):
        """%%pmap: the cell once per device on its slice of x (one row of 8), results stacked."""
        ns = self.fresh_namespace()
        x = ns["x"]
        if x.shape[0] != N_DEVICES:
            return None, ValueError("no slice per device: the magic's UsageError")
        runs = []
        try:
            for i in range(N_DEVICES):
                mine = dict(ns, x=x[i])
                final = _run_plain(source, mine)
                runs.append({**{n: mine[n] for n in names}, "(final)": final})
        except Exception as exc:  # noqa: BLE001
            return None, exc
        return {key: _stacked([run[key] for run in runs], np.stack) for key in runs[0]}, None

    def oracle_per_block(self, source: str, names):
        """%%shard_map --in x=data --out y=data: the cell once per block of rows, y concatenated."""
        ns = self.fresh_namespace()
        x = ns["x"]
        rows = x.shape[0] // N_DEVICES
        runs = []
        try:
            for i in range(N_DEVICES):
                mine = dict(ns, x=x[i * rows:(i + 1) * rows])
                final = _run_plain(source, mine)
                runs.append({**{n: mine[n] for n in names}, "(final)": final})
        except Exception as exc:  # noqa: BLE001
            return None, exc
        return {key: _stacked([run[key] for run in runs], np.concatenate) for key in runs[0]}, None


def test_the_magics_give_what_plain_jax_gives_over_random_sessions(jx, capsys):
    Notebook.shell = jx
    Notebook.baseline = dict(jx.user_ns)
    Found.sequences = Found.steps = Found.checks = Found.raised = 0
    run = settings(max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, database=None,
                   derandomize=not RANDOM, suppress_health_check=list(HealthCheck), print_blob=True)
    run_state_machine_as_test(Notebook, settings=run)
    with capsys.disabled():
        print(f"\ndifferential: {Found.sequences} sequences, {Found.steps} steps, {Found.checks} cells checked "
              f"against plain JAX ({Found.raised} raised on both sides)")
    assert Found.checks > 0
