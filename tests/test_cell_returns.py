"""Which names a cell returns. Without --out, every name it assigns; with --out, only the names it
lists, like a function's `return`: the others are temporaries (a shard_map body's per-device values,
a training step's gradients). `del name` keeps working. And a `print` in a %%shard_map cell prints
once, as plain `jax.jit(jax.shard_map(...))` does.
"""
from __future__ import annotations

import contextlib
import io
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxpar_magic
from shell_helpers import snapshot


def run(ip, magic: str, line: str, source: str):
    with capture_output() as captured:
        value = ip.run_cell_magic(magic, line, textwrap.dedent(source))
    return value, captured


@pytest.fixture
def mesh8(jx):
    with capture_output():
        jx.run_line_magic("mesh", "d=8 --no-show")
    return jx.user_ns["mesh"]


BODY = """\
local = x * 2                     # this device's block: varies over d
partial = jnp.sum(local)
total = lax.psum(partial, 'd')
y = local / total
"""


def plain_body(x):
    local = x * 2
    partial = jnp.sum(local)
    total = lax.psum(partial, "d")
    return local / total, total


@pytest.mark.parametrize("show", ["--show", "--no-show"])
def test_a_shard_map_body_with_temporaries(jx, mesh8, show):
    """A shard_map body pasted as it is: --out lists what it returns, as out_specs does."""
    x = jnp.arange(16.0)
    jx.push({"x": x})
    for _ in range(2):  # and its re-run
        run(jx, "shard_map", f"--in x=d --out y=d total {show}", BODY)
        expected_y, expected_total = jax.jit(jax.shard_map(plain_body, mesh=mesh8, in_specs=P("d"),
                                                           out_specs=(P("d"), P())))(
            jax.device_put(x, NamedSharding(mesh8, P("d"))))
        np.testing.assert_allclose(jx.user_ns["y"], expected_y)
        np.testing.assert_allclose(jx.user_ns["total"], expected_total)
        assert not {"local", "partial"} & set(jx.user_ns)


def test_without_out_a_varying_temporary_is_still_named(jx, mesh8):
    jx.push({"x": jnp.arange(16.0)})
    with pytest.raises(UsageError, match="'local'.*differs between devices"):
        run(jx, "shard_map", "--in x=d --no-show", BODY)


def test_a_bare_out_name_that_varies_is_told_its_spec(jx, mesh8):
    jx.push({"x": jnp.arange(16.0)})
    before = snapshot(jx.user_ns)
    with pytest.raises(UsageError, match=r"--out y=d"):
        run(jx, "shard_map", "--in x=d --out y --no-show", BODY)
    assert snapshot(jx.user_ns) == before


@pytest.mark.parametrize("magic, line", [("shard", "--out nothing"), ("shard_map", "--in x=d --out nothing")])
def test_an_out_name_the_cell_does_not_assign(jx, mesh8, magic, line):
    jx.push({"x": jnp.arange(16.0)})
    before = snapshot(jx.user_ns)
    with pytest.raises(UsageError, match="does not assign 'nothing'"):
        run(jx, magic, line + " --no-show", "y = x * 2")
    assert snapshot(jx.user_ns) == before


def test_shard_out_bare_names_and_specs(jx, mesh8):
    jx.push({"x": jnp.arange(16.0)})
    run(jx, "shard", "--in x=d --out s y=d --no-show", "t = x * 2\ny = t + 1\ns = jnp.sum(t)\nlabel = 'kept?'")
    np.testing.assert_allclose(jx.user_ns["y"], np.arange(16.0) * 2 + 1)
    assert float(jx.user_ns["s"]) == float(np.sum(np.arange(16.0) * 2))
    assert jx.user_ns["y"].sharding.spec == P("d")
    assert "t" not in jx.user_ns and "label" not in jx.user_ns


def test_del_keeps_working(jx, mesh8):
    jx.push({"x": jnp.arange(16.0)})
    run(jx, "shard", "--in x=d --no-show", "t = x * 2\ny = t + 1\ndel t")
    assert "t" not in jx.user_ns and "y" in jx.user_ns


def test_the_twins_take_the_outputs(jx, mesh8):
    ns = {"x": jnp.arange(16.0), "jnp": jnp, "lax": lax}
    jaxpar_magic.shard_map_cell(BODY, ns, mesh=mesh8, in_specs={"x": ("d",)}, out_specs={"y": ("d",)},
                                outputs=("y", "total"))
    assert {"y", "total"} <= set(ns) and "local" not in ns
    ns = {"x": jnp.arange(16.0), "jnp": jnp}
    jaxpar_magic.shard_cell("t = x * 2\ny = t + 1", ns, mesh=mesh8, outputs=("y",))
    assert "y" in ns and "t" not in ns


@pytest.mark.parametrize("magic, line", [("shard", "--in x=d --out y=d total"),
                                         ("shard_map", "--in x=d --out y=d total")])
def test_as_code_returns_what_out_lists(jx, mesh8, magic, line):
    x = jnp.arange(16.0)
    jx.push({"x": x})
    _, captured = run(jx, magic, line + " --as-code", BODY if magic == "shard_map" else
                      "local = x * 2\ntotal = jnp.sum(local)\ny = local / total")
    scope = {"x": x, "jnp": jnp, "lax": lax}
    exec(captured.stdout, scope)
    run(jx, magic, line + " --no-show", BODY if magic == "shard_map" else
        "local = x * 2\ntotal = jnp.sum(local)\ny = local / total")
    np.testing.assert_allclose(scope["y"], jx.user_ns["y"])
    np.testing.assert_allclose(scope["total"], jx.user_ns["total"])
    assert "local" not in scope


def test_the_rule_is_in_the_help(ip):
    for magic in ("shard", "shard_map"):
        doc = ip.find_cell_magic(magic).__doc__
        assert "temporaries" in doc and "--out" in doc and "del name" in doc


# --- a print in a %%shard_map cell -----------------------------------------------------------------

def test_a_print_in_a_shard_map_cell_prints_once_as_plain_jax(jx, mesh8):
    x = jnp.arange(16.0)
    jx.push({"x": x})

    def body(v):
        print("tracing the body")
        return v * 2

    plain = io.StringIO()
    with contextlib.redirect_stdout(plain):
        jax.jit(jax.shard_map(body, mesh=mesh8, in_specs=P("d"), out_specs=P("d")))(
            jax.device_put(x, NamedSharding(mesh8, P("d"))))
    source = "print('tracing the body')\ny = x * 2"
    _, first = run(jx, "shard_map", "--in x=d --out y=d --no-show", source)
    assert first.stdout.count("tracing the body") == plain.getvalue().count("tracing the body") == 1
    _, again = run(jx, "shard_map", "--in x=d --out y=d --no-show", source)  # cached: no trace, as jit
    assert again.stdout.count("tracing the body") == 0


def test_what_the_cell_printed_before_it_failed_is_still_printed(jx, mesh8):
    jx.push({"x": jnp.arange(16.0)})
    with pytest.raises(UsageError):
        with capture_output() as captured:
            jx.run_cell_magic("shard_map", "--in x=d --no-show", "print('before the mistake')\ny = x * 2")
    assert captured.stdout.count("before the mistake") == 1


# --- objects and closures holding a value traced in the cell (issue 33, item 5) -------------------------

class Scaler:
    def __init__(self, w):
        self.w = w

    def __call__(self, v):
        return v * self.w


@jax.tree_util.register_dataclass
@__import__("dataclasses").dataclass
class TreeScaler:
    w: jax.Array


LEAKS = [
    ("sc = Scaler(x * 2)\nq = x + 1", "`sc`", "Scaler object", "`sc.w`"),
    ("fn = lambda v: v + x\nq = x + 1", "`fn`", "function", "`fn`'s closure variable `x`"),
    ("import functools\npart = functools.partial(jnp.add, x)\nq = x + 1", "`part`", "function", "`part.args[0]`"),
    ("box = {'s': Scaler(x)}\nq = x + 1", "`box`", "Scaler object", "`box['s'].w`"),
]
ENGINES = [("shard", "--mesh mesh --in x=d --no-show"), ("pmap", "--no-show"),
           ("shard_map", "--mesh mesh --in x=d --out q=d --no-show"), ("shard", "--mesh mesh --in x=d --plan --no-show")]


@pytest.mark.parametrize("magic, line", ENGINES, ids=["shard", "pmap", "shard_map", "plan"])
@pytest.mark.parametrize("source, name, kind, where", LEAKS, ids=["object", "closure", "partial", "nested"])
def test_an_object_or_closure_holding_a_traced_value_is_refused(jx, mesh8, magic, line, source, name, kind, where):
    """It would bind a tracer (UnexpectedTracerError when used later); plain jax.jit refuses the return
    type at once. Every engine refuses it, naming the value and where the tracer is, and binds nothing."""
    jx.push({"x": jnp.arange(8.0), "Scaler": Scaler})
    if magic == "shard_map":  # --out lists the name: the others are temporaries, never refused
        source = source.replace("q = x + 1", "q = x + 1\n")
        line = line.replace("--out q=d", "--out q=d " + name.strip("`"))
    before = snapshot(jx.user_ns)
    with pytest.raises(UsageError) as raised:
        run(jx, magic, line, source)
    message = str(raised.value)
    assert f"the cell's output {name}" in message and kind in message and where in message, message
    assert snapshot(jx.user_ns) == before


def test_plain_values_pytree_objects_and_closures_over_plain_values_are_returned(jx, mesh8):
    """What a cell may return besides arrays (README, "What a cell returns"): each as plain Python
    would make it, and a pytree object's arrays computed like jax.jit's."""
    jx.push({"x": jnp.arange(8.0), "Scaler": Scaler, "TreeScaler": TreeScaler})
    run(jx, "shard", "--mesh mesh --in x=d --no-show",
        "k = 3\nname = 'run'\nfn = lambda v: v * k\nsc = Scaler(2.0)\nts = TreeScaler(x * 2)\nkey = jax.random.key(0)")
    ns = jx.user_ns
    assert ns["k"] == 3 and ns["name"] == "run" and ns["fn"](2.0) == 6.0 and ns["sc"](2.0) == 4.0
    expected = jax.jit(lambda v: TreeScaler(v * 2))(jnp.arange(8.0))
    assert isinstance(ns["ts"], TreeScaler)
    np.testing.assert_array_equal(np.asarray(ns["ts"].w), np.asarray(expected.w))
    assert jax.random.key_data(ns["key"]).tolist() == jax.random.key_data(jax.random.key(0)).tolist()


# --- a print prints once, as under jax.jit (issue 33, item 7) ------------------------------------------

def test_a_print_prints_once_when_an_input_moved_to_another_mesh(jx):
    """The re-run meets `x` on another mesh of the same devices: it takes the full path, which lays x
    out again, without first tracing the cell on x where it was (a second print). Auto axes: on
    Explicit ones JAX refuses the call before tracing it."""
    from jax.sharding import AxisType

    jx.push({"AxisType": AxisType, "NamedSharding": NamedSharding, "P": P})
    jx.run_cell("ma = jax.make_mesh((8,), ('d',), axis_types=(AxisType.Auto,))\n"
                "other = jax.make_mesh((4, 2), ('a', 'b'), axis_types=(AxisType.Auto,) * 2)\n"
                "x = jnp.arange(16.0)")
    source = "print('traced now')\ny = x * 2"
    _, first = run(jx, "shard", "--mesh ma --no-show", source)
    jx.run_cell("x = jax.device_put(x, NamedSharding(other, P('a')))")
    _, moved = run(jx, "shard", "--mesh ma --no-show", source)
    _, again = run(jx, "shard", "--mesh ma --no-show", source)
    # The run on the moved x traces at most once (for x laid out on the cell's mesh); it printed twice.
    assert [c.stdout.count("traced now") for c in (first, moved, again)] in ([1, 0, 0], [1, 1, 0])
    np.testing.assert_array_equal(np.asarray(jx.user_ns["y"]), np.arange(16.0) * 2)


def test_a_collectives_function_prints_on_its_first_call_only(jx):
    """jax.pmap traces once per argument shapes; so does the function after its recorded first call."""
    with capture_output():
        jx.run_cell_magic("pmap", "--collectives --no-show", "def f(v):\n    print('traced now')\n    return lax.psum(v, 'i')")
    printed = []
    for _ in range(3):
        with capture_output() as captured:
            out = jx.user_ns["f"](jnp.arange(8.0))
        printed.append(captured.stdout.count("traced now"))
        np.testing.assert_array_equal(np.asarray(out), np.full(8, 28.0))
    assert printed == [1, 0, 0]


# --- a closure over the batch is a temporary under --out (issue 40's regression) -------------------

TRAINING = """\
def loss_fn(w):
    return jnp.mean((x @ w) ** 2)
loss, g = jax.value_and_grad(loss_fn)(w)
"""


@pytest.mark.parametrize("magic, line", [
    ("shard", "--mesh mesh --in x=d --out loss --no-show"),
    ("shard", "--mesh mesh --in x=d --out loss g --no-show"),
    ("shard", "--mesh mesh --in x=d --out loss --plan --no-show"),
    ("shard_map", "--mesh mesh --in x=d --out loss --no-show"),
    ("shard_map", "--mesh mesh --in x=d --out loss --collectives --no-show"),
], ids=["shard", "shard-both", "shard-plan", "shard_map", "shard_map-collectives"])
def test_a_loss_closure_over_the_batch_is_a_temporary_under_out(jx, mesh8, magic, line):
    """Flax's tutorials define the loss inside the step, over the batch: with --out, `loss_fn` is a
    temporary (never bound, never refused); the value is plain JAX's, and its re-run too."""
    x = jnp.arange(64.0).reshape(16, 4) / 10
    w = jnp.ones((4, 2))
    jx.push({"x": x, "w": w})
    before = set(jx.user_ns)
    source = TRAINING.replace("jnp.mean", "lax.pmean(jnp.mean", 1).replace("** 2)", "** 2), 'd')", 1) \
        if magic == "shard_map" else TRAINING

    def plain(x, w):
        def loss_fn(w):
            value = jnp.mean((x @ w) ** 2)
            return lax.pmean(value, "d") if magic == "shard_map" else value
        return jax.value_and_grad(loss_fn)(w)

    if magic == "shard_map":
        plain = jax.shard_map(plain, mesh=mesh8, in_specs=(P("d"), P()), out_specs=P())
    with jax.set_mesh(mesh8):
        expected_loss, expected_g = jax.jit(plain)(jax.device_put(x, NamedSharding(mesh8, P("d"))),
                                                   jax.device_put(w, NamedSharding(mesh8, P())))
    for _ in range(2):
        run(jx, magic, line, source)
        assert "loss_fn" not in jx.user_ns
        if "--plan" in line:  # planned, not run: the output as its ShapeDtypeStruct, and nothing else
            assert set(jx.user_ns) - before == {"_plan", "loss"}
            assert jx.user_ns["loss"].shape == () and jx.user_ns["loss"].dtype == expected_loss.dtype
            continue
        np.testing.assert_allclose(np.asarray(jx.user_ns["loss"]), np.asarray(expected_loss), rtol=1e-6)
        if " g " in line:
            np.testing.assert_allclose(np.asarray(jx.user_ns["g"]), np.asarray(expected_g), rtol=1e-6)
        else:
            assert "g" not in jx.user_ns
