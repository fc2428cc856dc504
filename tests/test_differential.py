"""The magics against plain JAX over random notebook sessions (issue 22: keep silent wrong results out).

A hypothesis state machine plays a notebook in one real IPython shell with the extension loaded:
it rebinds the input `x` (shapes, dtypes and values from small sets, so shapes come back), changes
the global `sg` that the helper `h` reads (also to -0.0, 1, True), changes an attribute of a
callable object, defines or redefines `h` (a plain function, or one reached through jax.grad,
jax.vmap, jax.value_and_grad, jax.jit, functools.partial, jax.tree_util.Partial, a callable object,
a lax.scan body), and runs cells under %%shard (with and without --in), %%pmap (block and function
mode) and %%shard_map, with the view and without it (the replayed re-run). Issue 33 added: cells that
read and assign typed PRNG key arrays (`ks`, through jax.random.split, fold_in, uniform) under every
engine; `--donate xd` against jax.jit(donate_argnums=0), including whether xd's buffers are gone and
that a donated xd read again fails (the magic's UsageError) with the namespace untouched; and
`--plan` cells under every engine, which must bind ShapeDtypeStructs of plain JAX's shapes and
dtypes and leave every name that held a concrete value holding the very same object. Issue 40 item
12 added: %%shard and %%shard_map cells calling the %%pmap-defined functions (`total` reduces with
lax.psum over 'i'), against jax.pmap called inside jax.jit, and inside jax.shard_map (which plain JAX
refuses: the magic must raise a UsageError). Issue 40 items 7-8 added `--out out=@specs` cells run,
`specs` rebound (also to `5`, `{'y': 3}`, `{'y': 'data,None'}`), and run again: the layout must be
jax.device_put's by the current `specs`, and what device_put refuses the magic's UsageError (a re-run
kept the old layout; a leaf that is no spec was a raw TypeError).

The oracle is the same cell run as plain Python and JAX, eagerly, in a fresh namespace where every
plain step of the session so far was executed again: its helpers are new function objects, so no
trace JAX kept for the notebook's own (with an old global) can answer for them. A %%pmap cell runs
once per device slice and the results are stacked, a %%shard_map cell once per block and
concatenated by its --out spec. Every name the cell binds and its final value must match: values,
shapes, dtypes, Python types, the bits of Python floats (-0.0) and the sign of infinities (not of
an array's zeros: compiled XLA may fold them, as plain jax.jit does). When the oracle raises, the
magic must raise too and leave the namespace exactly as it was (checked by identity).

In CI it runs a fixed, derandomized budget (50 sequences of up to 10 steps: about 1 to 2 minutes on
two busy cores); `JPM_DIFFERENTIAL_EXAMPLES=500` (sequences) and `JPM_DIFFERENTIAL_STEPS=40` (steps per
sequence at most) run more by hand, and `JPM_DIFFERENTIAL_RANDOM=1` draws new sequences each run
instead of the fixed ones. A failure prints the notebook's cells in order, the failing one last.
With the -0.0 key of cell/fingerprints.py reverted to the float itself, 60 sequences find it.
The --donate steps found that a cell run again on a donated input crashed the kernel (JAX 0.10's jit
segfaults on a deleted argument on CPU): it is now the UsageError the README promises.

tests/test_differential_objects.py plays the same sessions with cells that assign objects and closures,
and exercise answers changed in place; tests/test_differential_donation.py with aliased and interrupted
--donate cells and a donated Flax NNX model.
"""
from __future__ import annotations

import ast
import functools
import os
import struct
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from shell_helpers import N_DEVICES, snapshot

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("JPM_DIFFERENTIAL_EXAMPLES", "50"))
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
FUNCTION_CELL = "def step(v):\n    return h(v * 1.0) + sg\n\ndef total(v):\n    return lax.psum(h(v * 1.0), 'i') + sg\n"

# Typed PRNG key arrays (issue 33 item 8): `ks` holds 8 keys; cells derive keys and numbers from them.
KEY_WHOLE_CELLS = [  # %%shard --in ks=data: the whole key array
    ("kk = jax.vmap(lambda k: jax.random.fold_in(k, 7))(ks)", ("kk",)),
    ("r = jax.vmap(lambda k: jax.random.uniform(k, (2,)))(ks) * sg", ("r",)),
    ("kk = jax.vmap(lambda k: jax.random.split(k)[1])(ks)\nr = jax.random.key_data(kk).sum()", ("kk", "r")),
]
KEY_DEVICE_CELLS = [  # %%pmap: one key per device
    ("kk = jax.random.fold_in(ks, 7)", ("kk",)),
    ("r = jax.random.uniform(ks, (2,)) * sg", ("r",)),
    ("kk = jax.random.split(ks)[1]\nr = jax.random.normal(kk, (3,))", ("kk", "r")),
]
KEY_BLOCK_CELLS = [  # %%shard_map --in ks=data: a block of one key per device, --out by blocks
    ("kk = jax.vmap(lambda k: jax.random.fold_in(k, 7))(ks)", ("kk",)),
    ("r = jax.vmap(lambda k: jax.random.uniform(k, (2,)))(ks) * sg", ("r",)),
]
# --donate xd (issue 33): against jax.jit(donate_argnums=0) on the same placed input. An output of
# xd's shape and dtype takes its buffer (xd deleted, in both); a float result of an int xd cannot.
DONATE_CELLS = [
    ("yd = h(xd * 1.0) + 1", ("yd",)),
    ("yd = xd * 2\nq = yd.sum()", ("yd", "q")),
    ("q = (xd * 1.0).sum() + sg", ("q",)),
]

# --out out=@specs (issue 40 items 7-8): a spec tree from the namespace, rebound between runs (also to
# what is no spec tree); the oracle lays the cell's `out` out by it with jax.device_put.
SPEC_TREES = ["{'y': jax.P('data')}", "{'y': jax.P()}", "{'y': None}", "jax.P('data')", "{'y': jax.P(None, 'data')}",
              "{'y': jax.P('data', None)}", "{'z': jax.P()}", "5", "{'y': 3}", "{'y': 'data,None'}",
              "{'y': ('data', None)}"]
OUT_TREE_CELLS = [
    ("out = {'y': x * 2}", ("out",)),
    ("out = {'y': h(x) + sg}\nq = out['y'].sum()", ("out",)),  # q: a temporary, as --out lists `out` only
]


class MustBeUsageError(Exception):
    """An oracle's error that the magic must give as its UsageError (a mistake we can foresee)."""


class Found:
    """What the runs met, for the closing note (printed by the test; `pytest -s` shows it)."""

    sequences = 0
    steps = 0
    checks = 0
    raised = 0
    kinds: dict = {}  # checks per kind of step (the magic, with --plan / --donate / keys told apart)


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
        def joined(*leaves):
            if _is_keys(leaves[0]):  # keys join as keys: jnp's stack and concatenate take them
                return (jnp.stack if join is np.stack else jnp.concatenate)(leaves)
            return join([np.asarray(leaf) for leaf in leaves])

        return jax.tree.map(joined, *per_part)
    for other in per_part[1:]:
        _assert_same(other, per_part[0], "a plain value that differs between devices")
    return per_part[0]


def _bits(value: float) -> bytes:
    return struct.pack("<d", value)


def _is_keys(value) -> bool:
    return isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key)


def _assert_same(actual, expected, where: str) -> None:
    if _is_keys(expected):  # a key array: its dtype (key<fry>), shape and key data
        assert _is_keys(actual), f"{where}: {type(actual).__name__} {getattr(actual, 'dtype', '')}, plain JAX keys"
        assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape), \
            f"{where}: {actual.dtype}{actual.shape}, plain JAX {expected.dtype}{expected.shape}"
        np.testing.assert_array_equal(np.asarray(jax.random.key_data(actual)),
                                      np.asarray(jax.random.key_data(expected)), err_msg=where)
    elif isinstance(expected, (jax.Array, np.ndarray)):
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
    elif isinstance(expected, dict):
        assert type(actual) is type(expected) and list(actual) == list(expected), \
            f"{where}: {type(actual).__name__} of keys {list(actual)}, plain JAX {list(expected)}"
        for key, e in expected.items():
            _assert_same(actual[key], e, f"{where}[{key!r}]")
    else:
        assert type(actual) is type(expected), f"{where}: {actual!r} ({type(actual).__name__}), plain JAX {expected!r}"
        if isinstance(expected, float):
            assert _bits(actual) == _bits(expected), f"{where}: {actual!r}, plain JAX {expected!r}"
        else:
            assert actual == expected, f"{where}: {actual!r}, plain JAX {expected!r}"


class Session(RuleBasedStateMachine):
    """One notebook session, without rules: the shell, the plain steps, the check of a magic cell against
    an oracle, and the oracles. `shell` and `baseline` are set by the test before it runs; the machines
    (Notebook below, tests/test_differential_paths.py) add the rules."""

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
        self.last = None  # (magic, line, cell, oracle[, refusal]) of the last magic cell run
        self.has_keys = False  # `ks` (8 PRNG keys) is defined
        self.donor = None  # None: no `xd`; "fresh": a new one; "donated": a --donate run deleted it
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

    # --- the check ----------------------------------------------------------------------------

    def check(self, magic: str, line: str, cell, oracle, refusal: type = Exception) -> None:
        """`refusal`: what the magic must raise where plain JAX raises (a UsageError, for a mistake we foresee)."""
        self.last = (magic, line, cell, oracle, refusal)
        source, names = cell
        Found.steps += 1
        Found.checks += 1
        kind = (f"{magic}{' --donate' if '--donate' in line else ''}{' @specs' if '@specs' in line else ''}"
                f"{' keys' if 'ks' in source else ''}")
        Found.kinds[kind] = Found.kinds.get(kind, 0) + 1
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
            assert isinstance(exc, refusal), f"%%{magic} {line} raised {exc!r}, not a {refusal.__name__}{self.context()}"
            assert snapshot(self.ns) == before, f"a failed cell changed the namespace{self.context()}"
            if isinstance(error, MustBeUsageError):
                assert isinstance(exc, UsageError), f"raised {exc!r}, not a UsageError ({error}){self.context()}"
            return
        assert error is None, f"plain JAX raised {error!r}, %%{magic} {line} did not{self.context()}"
        for name in names:
            self.compare(self.ns[name], expected[name], f"{name} bound by the last cell")
        self.compare(final, expected["(final)"], "the last cell's final value")
        for name, shardings in expected.get("(layout)", {}).items():  # --out @specs: where each leaf lies
            for leaf, sharding in zip(jax.tree.leaves(self.ns[name]), jax.tree.leaves(shardings)):
                assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim), \
                    f"{name} laid out as {leaf.sharding.spec}, jax.device_put by `specs`: {sharding.spec}{self.context()}"
        if "(deleted)" in expected:  # --donate: the input's buffers went where jax.jit's went
            gone = self.ns["xd"].is_deleted()
            assert gone == expected["(deleted)"], \
                f"xd.is_deleted() is {gone} after --donate, {expected['(deleted)']} after jax.jit{self.context()}"
            if gone:  # here, or in rerun_last's run of the same cell
                self.donor = "donated"

    def check_plan(self, magic: str, line: str, cell, oracle) -> None:
        source, names = cell
        Found.steps += 1
        Found.checks += 1
        Found.kinds[f"{magic} --plan"] = Found.kinds.get(f"{magic} --plan", 0) + 1
        expected, error = oracle(source, names)
        self.session.append(f"%%{magic} {line}\n{source}")
        before = dict(self.ns)
        concrete = {n: v for n, v in before.items() if n != "_plan" and not _planned(v)}  # _plan: the last plan
        try:
            with capture_output():
                self.shell.run_cell_magic(magic, line, self.tag + source)
        except Exception as exc:  # noqa: BLE001
            if error is None:
                raise AssertionError(f"%%{magic} {line} raised {exc!r} where plain JAX gives a result"
                                     f"{self.context()}") from exc
            Found.raised += 1
            assert snapshot(self.ns) == snapshot(before), f"a failed plan changed the namespace{self.context()}"
            return
        assert error is None, f"plain JAX raised {error!r}, %%{magic} {line} did not{self.context()}"
        replaced = sorted(n for n, v in concrete.items() if self.ns.get(n, _GONE) is not v)
        assert not replaced, f"a plan replaced or removed concrete values: {replaced}{self.context()}"
        for name in names:  # the ones it bound: ShapeDtypeStructs of plain JAX's shapes and dtypes
            if name in concrete:
                continue
            planned = jax.tree.leaves(self.ns[name])
            computed = jax.tree.leaves(expected[name])
            assert len(planned) == len(computed), f"{name}: {len(planned)} leaves planned, {len(computed)} computed"
            for leaf, value in zip(planned, computed):
                if isinstance(leaf, jax.ShapeDtypeStruct):
                    assert (leaf.shape, leaf.dtype) == (jnp.shape(value), jnp.result_type(value)), \
                        f"{name}: planned {leaf.dtype}{leaf.shape}, plain JAX {jnp.result_type(value)}" \
                        f"{jnp.shape(value)}{self.context()}"

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

    def oracle_out_tree(self, source: str, names):
        """%%shard --out out=@specs: the cell on the whole arrays, and each leaf of `out` laid out by
        jax.device_put with the spec tree's spec for it; what device_put cannot do is our UsageError."""
        from jax.sharding import NamedSharding, PartitionSpec as P

        expected, error = self.oracle_whole(source, names)
        if error is not None:
            return None, error
        ns = self.fresh_namespace()

        def lay_out(spec, sub):
            return jax.tree.map(lambda leaf: jax.device_put(leaf, NamedSharding(ns["mesh"], spec or P())).sharding,
                                sub)

        try:
            specs = ns["specs"]
            if isinstance(specs, dict) and any(isinstance(v, tuple) for v in specs.values()):
                raise TypeError("a tuple is a node of a pytree, not a spec")  # device_put would take it for P(...)
            layout = jax.tree.map(lay_out, specs, expected["out"], is_leaf=lambda v: v is None or isinstance(v, P))
        except Exception as exc:  # noqa: BLE001
            return None, MustBeUsageError(f"jax.device_put by `specs` raised {exc!r}")
        return {**expected, "(layout)": {"out": layout}}, None

    def oracle_per_device(self, source: str, names, mapped: str = "x"):
        """%%pmap: the cell once per device on its slice of `mapped` (one row of 8), results stacked."""
        ns = self.fresh_namespace()
        x = ns[mapped]
        if x.shape[0] != N_DEVICES:
            return None, ValueError("no slice per device: the magic's UsageError")
        runs = []
        try:
            for i in range(N_DEVICES):
                mine = dict(ns, **{mapped: x[i]})
                final = _run_plain(source, mine)
                runs.append({**{n: mine[n] for n in names}, "(final)": final})
        except Exception as exc:  # noqa: BLE001
            return None, exc
        return {key: _stacked([run[key] for run in runs], np.stack) for key in runs[0]}, None

    def oracle_per_block(self, source: str, names, mapped: str = "x"):
        """%%shard_map --in x=data --out y=data: the cell once per block of rows, y concatenated."""
        ns = self.fresh_namespace()
        x = ns[mapped]
        rows = x.shape[0] // N_DEVICES
        runs = []
        try:
            for i in range(N_DEVICES):
                mine = dict(ns, **{mapped: x[i * rows:(i + 1) * rows]})
                final = _run_plain(source, mine)
                runs.append({**{n: mine[n] for n in names}, "(final)": final})
        except Exception as exc:  # noqa: BLE001
            return None, exc
        return {key: _stacked([run[key] for run in runs], np.concatenate) for key in runs[0]}, None


    def oracle_pmap_inside(self, fn: str, magic: str, source: str, names):
        """`out = fn(x)` with fn the %%pmap function: jax.pmap(fn, axis_name='i') called inside jax.jit
        (%%shard), or inside jax.shard_map's per-device body (%%shard_map), which plain JAX refuses."""
        from jax.sharding import PartitionSpec as P

        ns = self.fresh_namespace()
        exec(FUNCTION_CELL, ns)
        mapped = jax.pmap(ns[fn], axis_name="i")
        if magic == "shard":
            call = jax.jit(lambda v: mapped(v))
        else:
            call = jax.jit(jax.shard_map(lambda v: mapped(v), mesh=ns["mesh"], in_specs=P("data"), out_specs=P("data")))
        try:
            out = call(ns["x"])
        except Exception as exc:  # noqa: BLE001
            return None, exc
        return {"out": out, "(final)": None}, None

    def oracle_donated(self, source: str, names):
        """--donate xd: the cell under jax.jit(donate_argnums=0), on xd placed as --in places it; with
        whether that deleted the placed array. A donated xd read again raises (plain JAX: "Array has
        been deleted", or a crash; the magic: its UsageError)."""
        if self.donor == "donated":
            return None, RuntimeError("xd was donated")
        from jax.sharding import NamedSharding, PartitionSpec as P

        ns = self.fresh_namespace()
        body, final = _split_final(source)

        def cell(xd):
            local = dict(ns, xd=xd)
            exec(body, local)
            return {n: local[n] for n in names}, (eval(final, local) if final is not None else None)

        placed = jax.device_put(ns["xd"], NamedSharding(ns["mesh"], P("data")))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "Some donated buffers were not usable": as the magic's run
                out, last = jax.jit(cell, donate_argnums=0)(placed)
        except Exception as exc:  # noqa: BLE001
            return None, exc
        return {**out, "(final)": last, "(deleted)": placed.is_deleted()}, None


class Notebook(Session):
    """The sessions of this file: the rules that change the inputs and run the magic cells."""

    @initialize(shape=st.sampled_from(SHAPES), dtype=st.sampled_from(DTYPES), fill=st.sampled_from(FILLS),
                sg=st.sampled_from(GLOBALS), helper=st.sampled_from(list(HELPERS)), op=st.sampled_from(OPERATORS))
    def start(self, shape, dtype, fill, sg, helper, op):
        self.rebind_x(shape, dtype, fill)
        self.change_sg(sg)
        self.define_h(helper, op)
        self.make_keys(0)
        self.make_donor()
        self.plain_step(f"specs = {SPEC_TREES[0]}")  # not a draw: the sequences before issue 40 stay the same

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

    @rule(seed=st.sampled_from([0, 1, 42]))
    def make_keys(self, seed):
        self.has_keys = True
        self.plain_step(f"ks = jax.random.split(jax.random.key({seed}), 8)")

    @rule()
    def make_donor(self):
        """A fresh array of x's values for a --donate cell to give away."""
        self.donor = "fresh"
        self.plain_step("xd = x * 1")

    @rule(pick=st.integers(0, len(SPEC_TREES) - 1))
    def rebind_specs(self, pick):
        self.plain_step(f"specs = {SPEC_TREES[pick]}")

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

    @rule(cell=st.sampled_from(OUT_TREE_CELLS), pick=st.integers(0, len(SPEC_TREES) - 1), place=st.booleans(),
          show=st.booleans())
    def shard_out_tree(self, cell, pick, place, show):
        """`--out out=@specs`: the values of the cell, laid out as jax.device_put lays them out by `specs`;
        then `specs` rebound and the same cell again (a re-run kept the old layout: issue 40 item 7)."""
        line = "--mesh mesh" + (" --in x=data" if place else "") + " --out out=@specs" + ("" if show else " --no-show")
        self.check("shard", line, cell, self.oracle_out_tree)
        self.rebind_specs(pick)
        self.check("shard", line, cell, self.oracle_out_tree)

    @rule(cell=st.sampled_from(BLOCK_CELLS), show=st.booleans())
    def shard_map(self, cell, show):
        line = "--mesh mesh --in x=data --out y=data" + ("" if show else " --no-show")
        self.check("shard_map", line, cell, self.oracle_per_block)

    # Cells that read and assign key arrays (jax.random.key, split, fold_in): issue 33 item 8.
    @precondition(lambda self: self.has_keys)
    @rule(cell=st.sampled_from(KEY_WHOLE_CELLS), show=st.booleans())
    def shard_keys(self, cell, show):
        self.check("shard", "--mesh mesh --in ks=data" + ("" if show else " --no-show"), cell, self.oracle_whole)

    @precondition(lambda self: self.has_keys)
    @rule(cell=st.sampled_from(KEY_DEVICE_CELLS), show=st.booleans())
    def pmap_keys(self, cell, show):
        self.check("pmap", "" if show else "--no-show", cell, functools.partial(self.oracle_per_device, mapped="ks"))

    @precondition(lambda self: self.has_keys)
    @rule(cell=st.sampled_from(KEY_BLOCK_CELLS), show=st.booleans())
    def shard_map_keys(self, cell, show):
        line = f"--mesh mesh --in ks=data --out {cell[1][0]}=data" + ("" if show else " --no-show")
        self.check("shard_map", line, cell, functools.partial(self.oracle_per_block, mapped="ks"))

    @precondition(lambda self: self.donor is not None)
    @rule(cell=st.sampled_from(DONATE_CELLS), show=st.booleans())
    def donate(self, cell, show):
        """`--donate xd` against jax.jit(donate_argnums=0): the values, and whether xd's buffers are gone."""
        line = "--mesh mesh --in xd=data --donate xd" + ("" if show else " --no-show")
        self.check("shard", line, cell, self.oracle_donated)

    @rule(engine=st.sampled_from(["shard", "pmap", "shard_map"]), pick=st.integers(0, 3))
    def plan(self, engine, pick):
        """A --plan cell: it binds ShapeDtypeStructs of the shapes plain JAX computes, and never
        replaces a concrete value (every name that held one holds the very same object after)."""
        if engine == "shard":
            line, cell, oracle = "--plan --mesh mesh --in x=data", GLOBAL_CELLS[pick], self.oracle_whole
        elif engine == "pmap":
            line, cell, oracle = "--plan", GLOBAL_CELLS[pick], self.oracle_per_device
        else:
            line, cell, oracle = "--plan --mesh mesh --in x=data --out y=data", BLOCK_CELLS[pick % 2], self.oracle_per_block
        self.check_plan(engine, line, cell, oracle)

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
    @rule(fn=st.sampled_from(["step", "total"]), magic=st.sampled_from(["shard", "shard_map"]), place=st.booleans(),
          show=st.booleans())
    def call_step_inside(self, fn, magic, place, show):
        """A cell of another magic calls a %%pmap-defined function (issue 40 item 12): in %%shard it is
        jax.pmap inside jax.jit; in a %%shard_map body plain JAX refuses jax.pmap, and the magic must
        refuse with a UsageError, the namespace untouched."""
        Found.kinds[f"{magic} calling {fn}"] = Found.kinds.get(f"{magic} calling {fn}", 0) + 1
        if magic == "shard":
            line = "--mesh mesh" + (" --in x=data" if place else "")
        else:
            line = "--mesh mesh --in x=data --out out=data"
        # Where plain JAX raises in %%shard, it is the cell's own code that fails (h = jax.vmap(f) over one
        # device's scalar slice): the magic raises what JAX raises. The refusal of jax.pmap inside a
        # shard_map body is ours to explain: a UsageError.
        self.check(magic, line + ("" if show else " --no-show"), (f"out = {fn}(x)", ("out",)),
                   functools.partial(self.oracle_pmap_inside, fn, magic),
                   UsageError if magic == "shard_map" else Exception)

    @rule(fn=st.sampled_from(["step", "total"]), magic=st.sampled_from(["shard", "shard_map"]), place=st.booleans(),
          show=st.booleans())
    def define_and_call_inside(self, fn, magic, place, show):
        """The two cells in a row (the rules above also come apart, with other cells between)."""
        self.pmap_function(show)
        self.call_step_inside(fn, magic, place, show)

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


_GONE = object()


def _planned(value) -> bool:
    """What an earlier plan bound: a ShapeDtypeStruct, or a pytree of them (a list of planned blocks)."""
    leaves = jax.tree.leaves(value)
    return bool(leaves) and all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in leaves)


def play_sessions(machine, shell, capsys, title: str, examples: int = EXAMPLES) -> None:
    """Run `machine`'s random sessions in `shell` (the budget: JPM_DIFFERENTIAL_*), then print what they
    checked, by kind; at least one cell must have been checked. The machines of every differential file."""
    machine.shell = shell
    machine.baseline = dict(shell.user_ns)
    Found.sequences = Found.steps = Found.checks = Found.raised = 0
    Found.kinds = {}
    run = settings(max_examples=examples, stateful_step_count=STEPS, deadline=None, database=None,
                   derandomize=not RANDOM, suppress_health_check=list(HealthCheck), print_blob=True)
    run_state_machine_as_test(machine, settings=run)
    with capsys.disabled():
        print(f"\n{title}: {Found.sequences} sequences, {Found.steps} steps, {Found.checks} cells checked "
              f"({Found.raised} raised on both sides); by kind: "
              + ", ".join(f"{kind} {count}" for kind, count in sorted(Found.kinds.items())))
    assert Found.checks > 0


def test_the_magics_give_what_plain_jax_gives_over_random_sessions(jx, capsys):
    play_sessions(Notebook, jx, capsys, "differential")
