"""An all-reduce says what it combines by (sum, max, ...): read from the compiled program's
reduction computation, shown by the result view in its HTML, text and widget."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from jaxpar_magic.cell.hlo import collectives
from jaxpar_magic.views import results


def compiled_text(reduce) -> str:
    mesh = jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
    f = jax.jit(jax.shard_map(lambda x: reduce(x, "i"), mesh=mesh, in_specs=P("i"), out_specs=P()))
    return f.lower(jnp.arange(8.0)).compile().as_text()


def test_the_compiled_reduction_is_named() -> None:
    (summed,) = [c for c in collectives(compiled_text(lax.psum)) if c.op == "all-reduce"]
    (largest,) = [c for c in collectives(compiled_text(lax.pmax)) if c.op == "all-reduce"]
    assert (summed.reduction, largest.reduction) == ("sum", "max")


def test_the_result_view_says_it() -> None:
    state = {"title": "t", "axes": [{"name": "i", "size": 8}], "device_ids": list(range(8)), "outputs": [],
             "collectives": [{"op": "all-reduce", "reduction": "max", "shape": "f32[]", "bytes": 4, "groups": [list(range(8))],
                              "groups_text": "1 group of 8", "pairs": [], "pairs_omitted": 0, "source_line": None}]}
    assert "combines by <b>max</b>" in results.to_html(state)
    assert "all-reduce (max) · f32[]" in results.to_text(state)
