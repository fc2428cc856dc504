"""Every magic reads its line as POSIX shell words: quotes group and are removed, an unbalanced
quote is a UsageError that shows the line, and `{...}`/`$name` are never expanded (evaluated).
Also the small mistakes issue 6 named: `--devices 0`, an empty `--in x=`, and a final expression
that names an output shown twice.
"""
from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from jax.sharding import PartitionSpec as P

from shell_helpers import N_DEVICES, shown_state, shown_widgets, snapshot


def cell(ip, magic: str, line: str, source: str):
    return ip.run_cell_magic(magic, line, textwrap.dedent(source))


@pytest.fixture
def readings(jx):
    jx.push({"x": jnp.arange(float(N_DEVICES))})
    return jx


@pytest.mark.parametrize("line", ["-a 'batch'", '-a "batch"', "--axis-name 'batch'", "-a batch"])
def test_a_quoted_axis_name_means_the_name_without_quotes(readings, line):
    cell(readings, "pmap", line + " --no-show", "total = lax.psum(x, 'batch')")
    np.testing.assert_allclose(readings.user_ns["total"], np.full(N_DEVICES, 28.0))


def test_quoted_mesh_with_spaces_after_commas(readings):
    readings.push({"x": jnp.arange(8.0).reshape(2, 4)})
    cell(readings, "pmap", '--mesh "outer=2, inner=4" --no-show', "s = lax.psum(x, ('outer', 'inner'))")
    np.testing.assert_allclose(readings.user_ns["s"], np.full((2, 4), 28.0))


def test_quoted_partition_spec_with_quotes_inside(jx):
    jx.push({"w": jnp.ones((8, 4))})
    with capture_output():
        cell(jx, "shard", "--mesh data=4,model=2 --in \"w=P('data', None)\" --no-show", "y = w * 2")
    assert jx.user_ns["w"].sharding.spec == P("data", None)
    np.testing.assert_allclose(jx.user_ns["y"], np.full((8, 4), 2.0))


def test_quoted_mesh_for_shard_and_mesh_magics(jx):
    with capture_output():
        jx.run_line_magic("mesh", "'data=4, model=2' --no-show")
    assert dict(jx.user_ns["mesh"].shape) == {"data": 4, "model": 2}
    jx.push({"v": jnp.arange(16.0)})
    cell(jx, "shard", '--mesh "data=8" --in v=data --no-show', "t = v + 1")
    assert jx.user_ns["v"].sharding.spec == P("data")


def test_quoted_literal_still_works(jx):
    src = "def scale(x, k):\n    return x * k\n"
    with capture_output():
        cell(jx, "pmap", "--in-axes '(0, None)'", src)
    out = jx.user_ns["scale"](jnp.arange(float(N_DEVICES)), jnp.float32(3.0))
    np.testing.assert_allclose(out, np.arange(N_DEVICES) * 3.0)


def test_quoted_names_for_sharding_and_devices(jx):
    jx.push({"v": jax.device_put(jnp.arange(8.0))})
    with capture_output() as captured:
        jx.run_line_magic("sharding", "'v'")
        jx.run_line_magic("devices", "--simulate '8'")
    kinds = [type(w).__name__ for w in shown_widgets(captured)]
    assert kinds == ["ShardingView", "DevicesView"]


@pytest.mark.parametrize(
    "magic, line",
    [
        ("pmap", "-a 'batch"),
        ("pmap", '--mesh "outer=2,inner=4'),
        ("shard", "--in \"w=P('data', None)"),
    ],
)
def test_an_unbalanced_quote_is_a_usage_error_that_shows_the_line(readings, magic, line):
    before = snapshot(readings.user_ns)
    with pytest.raises(UsageError) as err:
        cell(readings, magic, line, "y = x")
    message = str(err.value)
    assert line.strip() in message and "quot" in message
    assert snapshot(readings.user_ns) == before


@pytest.mark.parametrize("magic", ["mesh", "sharding", "devices"])
def test_an_unbalanced_quote_in_a_line_magic(jx, magic):
    with pytest.raises(UsageError, match="close the quote"):
        jx.run_line_magic(magic, "'oops")


def test_braces_and_dollars_are_never_expanded(readings):
    """IPython evaluates `{expr}` and `$name` in magic lines unless the magic opts out: ours do."""
    calls = []
    readings.push({"canary": lambda: calls.append(1) or "i"})
    for magic, line in [("pmap", "-a {canary()}"), ("shard", "--mesh {canary()}")]:
        with pytest.raises(UsageError):
            cell(readings, magic, line, "y = x")
    for magic, line in [("mesh", "data={canary()}"), ("sharding", "{canary()}"), ("devices", "--simulate {canary()}"),
                        ("mesh", "$canary")]:
        with pytest.raises(UsageError):
            readings.run_line_magic(magic, line)
    assert calls == []


# --- the small things -------------------------------------------------------------------------

def test_zero_devices_is_simply_invalid(readings):
    with pytest.raises(UsageError) as err:
        cell(readings, "pmap", "--devices 0", "y = x")
    assert "at least one device" in str(err.value)
    assert "--simulate 0" not in str(err.value)


def test_an_empty_spec_is_an_error_that_says_how_to_replicate(jx):
    jx.push({"x": jnp.ones(8)})
    before = snapshot(jx.user_ns)
    with pytest.raises(UsageError) as err:
        cell(jx, "shard", "--mesh data=8 --in x=", "y = x * 2")
    assert "x=None" in str(err.value) and "x=P()" in str(err.value)
    assert snapshot(jx.user_ns) == before


@pytest.mark.parametrize("spec", ["None", "P()"])
def test_explicit_replication_is_accepted(jx, spec):
    jx.push({"x": jnp.ones(8)})
    cell(jx, "shard", f"--mesh data=8 --in x={spec} --no-show", "y = x * 2")
    assert jx.user_ns["x"].sharding.is_fully_replicated


def test_a_final_name_that_is_an_output_is_shown_once(readings):
    value, state = shown_state(readings, "", "y = x * 2\ny")
    names = [o["name"] for o in state["outputs"]]
    assert names == ["y"]
    np.testing.assert_allclose(value, np.arange(N_DEVICES) * 2.0)


def test_a_final_expression_that_is_not_an_output_keeps_its_tile(readings):
    _, state = shown_state(readings, "", "y = x * 2\ny + 1")
    assert [o["name"] for o in state["outputs"]] == ["y", "(result)"]


def test_shard_final_name_is_shown_once(jx):
    jx.push({"x": jnp.ones(8)})
    with capture_output() as captured:
        cell(jx, "shard", "--mesh data=8 --in x=data", "y = x * 2\ny")
    names = [w.state["name"] for w in shown_widgets(captured) if type(w).__name__ == "ShardingView"]
    assert names == ["x", "y"]
