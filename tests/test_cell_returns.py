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
