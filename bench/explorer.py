"""The layout explorer's speed (issue 32): seconds to plan one new layout of a 10-array MLP train step
(4 weights, 4 biases, a batch and its targets) on 64 simulated devices, against a bare
`jax.jit(step).lower(...).compile()` of the same layout (the same abstract inputs, the same mesh).

Each layout is new to the explorer (no cache hit) and to the process (each bare compile is a new
`jax.jit` of the same function, lowered and compiled afresh; JAX's persistent cache is off). The two
are interleaved layout by layout, so a change in the machine's load hits both. Aim: at most 3 s per
layout on 2 cores.

    PYTHONPATH=$PWD .venv/bin/python bench/explorer.py            # prints one line per layout, then medians
"""
from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

DEVICES = 64
WIDTH, BATCH = 1024, 512
STEP = """
def loss(params, x, y):
    h = x
    for i in range(1, 5):
        h = jnp.tanh(h @ params[f"w{i}"] + params[f"b{i}"])
    return jnp.mean((h - y) ** 2)
"""
CELL = "grads = jax.grad(loss)(params, x, y)\n"
LAYOUTS = [  # one change each, so each row plans exactly one layout new to the explorer
    ("choose", "params['w1']", "P('data',None)"),  # FSDP of w1
    ("choose", "params['w2']", "P('data',None)"),
    ("reshape", "data=8,model=8"),
    ("choose", "params['w3']", "P(None,'model')"),  # tensor parallel
    ("choose", "params['w4']", "P('model',None)"),
    ("reshape", "data=16,model=4"),
]


def main() -> None:
    import jax

    jax.config.update("jax_num_cpu_devices", DEVICES)
    import jax.numpy as jnp
    from jax.sharding import NamedSharding

    import jaxpar_magic
    from jaxpar_magic.stages.explore.controls import partition_spec

    mesh = jaxpar_magic.make_mesh(f"data={DEVICES} model=1", axis_types="auto")
    f32 = jnp.float32
    params = {f"w{i}": jax.ShapeDtypeStruct((WIDTH, WIDTH), f32) for i in range(1, 5)}
    params.update({f"b{i}": jax.ShapeDtypeStruct((WIDTH,), f32) for i in range(1, 5)})
    namespace = {"jax": jax, "jnp": jnp, "mesh": mesh, "params": params,
                 "x": jax.ShapeDtypeStruct((BATCH, WIDTH), f32), "y": jax.ShapeDtypeStruct((BATCH, WIDTH), f32)}
    exec(STEP, namespace)  # the step's function, defined as a notebook's earlier cell would
    start = time.perf_counter()
    ex = jaxpar_magic.explore_cell(CELL, namespace, in_specs={"x": ("data", None), "y": ("data", None)})[0]
    print(f"first layout (explorer made, view built): {time.perf_counter() - start:.2f} s", flush=True)

    def bare(layout):
        """The same step and layout compiled by hand: jit, lower, compile."""
        mesh_now = ex._mesh_of(layout)
        shard = {leaf.label: NamedSharding(mesh_now, partition_spec(spec)) for leaf, spec in zip(ex.leaves, layout.specs)}
        args = ({k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shard[f"params['{k}']"]) for k, v in params.items()},
                jax.ShapeDtypeStruct((BATCH, WIDTH), f32, sharding=shard["x"]),
                jax.ShapeDtypeStruct((BATCH, WIDTH), f32, sharding=shard["y"]))
        begin = time.perf_counter()
        with jax.set_mesh(mesh_now):
            jax.jit(lambda p, x, y: jax.grad(namespace["loss"])(p, x, y)).lower(*args).compile()
        return time.perf_counter() - begin

    ours, hand = [], []
    for kind, *what in LAYOUTS:
        compiles = ex.compiles
        begin = time.perf_counter()
        getattr(ex, kind)(*what)
        ours.append(time.perf_counter() - begin)
        assert ex.compiles == compiles + 1, "each row plans one new layout"
        hand.append(bare(ex.layout))
        print(f"{ex.describe(ex.layout)[:72]:<72} explorer {ours[-1]:.2f} s · bare {hand[-1]:.2f} s", flush=True)
    ratios = [o / h for o, h in zip(ours, hand)]
    print(f"\n{len(ours)} layouts: explorer median {statistics.median(ours):.2f} s (max {max(ours):.2f} s) per layout; "
          f"bare jit-lower-compile median {statistics.median(hand):.2f} s; explorer/bare median "
          f"{statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f})")
    print(f"load: {os.getloadavg()}", file=sys.stderr)


if __name__ == "__main__":
    main()
