"""Where an MLP training step's time goes (issue 43): `%%shard --profile` of the issue's 8-layer f32
MLP step on the devices JAX has, beside a wall-clock median of the same step hand-written as
`jax.jit(mlp_step)`, and the plan's estimate beside the measurement.

    python bench/profile_mlp.py                    # on the machine's devices (a TPU: the chip's figures)
    python bench/profile_mlp.py --cpu              # a dry run on 8 simulated CPU devices, small sizes
    python bench/profile_mlp.py --json out.json    # also the figures as JSON (tests/device/test_device_profile.py)

Prints the profile (the step, its shares, the top ops with their lines, the plan beside it), the
hand-written step's wall-clock median and the ratio, and whether every op the profile names is an
instruction of the compiled program. Record the chip's run in bench/RESULTS.md. On a TPU v5e the
default sizes (width 4096, 8192 rows) take about 40 ms a step and the whole script about a minute.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import textwrap
import time

MLP = """
import jax, jax.numpy as jnp
N, W, ROWS = {layers}, {width}, {rows}

def mlp_loss(ws, x):
    for w in ws:
        x = jax.nn.relu(x @ w)
    return jnp.mean(x ** 2)

def mlp_step(ws, x):
    g = jax.grad(mlp_loss)(ws, x)
    return [w - 0.01 * gw for w, gw in zip(ws, g)]

key = jax.random.key(0)
ws = [jax.random.normal(jax.random.fold_in(key, i), (W, W)) / W ** 0.5 for i in range(N)]
x = jax.random.normal(key, (ROWS, W))
"""
CELL = "ws = mlp_step(ws, x)\n"


def _median_wall(call, runs: int = 10) -> float:
    import jax

    jax.block_until_ready(call())
    walls = []
    for _ in range(runs):
        began = time.perf_counter()
        jax.block_until_ready(call())
        walls.append(time.perf_counter() - began)
    return statistics.median(walls)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="8 simulated CPU devices and small sizes (a dry run)")
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    ip = InteractiveShell.instance(history_length=0)
    with capture_output():
        ip.run_line_magic("load_ext", "jaxpar_magic")
        if args.cpu:
            ip.run_line_magic("devices", "--simulate 8")
    width = args.width or (256 if args.cpu else 4096)
    rows = args.rows or (512 if args.cpu else 8192)
    ip.run_cell(textwrap.dedent(MLP.format(layers=args.layers, width=width, rows=rows)),
                store_history=False).raise_error()
    import jax

    import jaxpar_magic
    from jaxpar_magic.cell.hlo_text import instructions

    with capture_output():
        ip.run_line_magic("mesh", "data=%d --no-show" % len(jax.devices()))
    ns = ip.user_ns
    started = time.perf_counter()
    result = jaxpar_magic.shard_cell(CELL, ns, mesh=ns["mesh"], in_specs={"x": ("data", None)}, outputs=("ws",),
                                     bind=False, profile=args.steps)
    cell_s = time.perf_counter() - started
    profile = result.profile
    program, program_args = result.ran
    names = {i.name for i in instructions(program.jitted.lower(*program_args).compile().as_text())}
    # The same jitted step, outside the profiler: the cell's own compiled program on its own arguments,
    # and the step hand-written as jax.jit(mlp_step) on the same placed arrays (one more compile).
    wall = _median_wall(lambda: program.jitted(*program_args))
    hand_args = [jax.device_put(ns["ws"], jax.sharding.NamedSharding(ns["mesh"], jax.sharding.PartitionSpec())),
                 jax.device_put(ns["x"], jax.sharding.NamedSharding(ns["mesh"], jax.sharding.PartitionSpec("data")))]
    hand = jax.jit(ns["mlp_step"])
    hand_wall = _median_wall(lambda: hand(*hand_args))
    named = {op.name for op in profile.ops} | {e.name for lane in profile.lanes for e in lane.events}
    unmatched = sorted(named - names)
    figures = {
        "devices": [str(d) for d in jax.devices()], "device_kind": jax.devices()[0].device_kind,
        "sizes": {"layers": args.layers, "width": width, "rows": rows}, "source": profile.source,
        "step_s": profile.step_s, "step_times_s": profile.step_times_s, "call_wall_s": profile.wall_s,
        "program_wall_median_s": wall, "hand_wall_median_s": hand_wall, "ratio": profile.step_s / wall,
        "shares": profile.shares,
        "lanes": [lane.label for lane in profile.lanes], "ops_named": len(named), "unmatched": unmatched,
        "top_ops": [{"name": o.name, "kind": o.kind, "what": o.what, "line": o.line, "count": o.count,
                     "total_s": o.total_s} for o in profile.ops[:10]],
        "beside": profile.beside.sentence() if profile.beside is not None else None,
        "beside_same_machine": profile.beside.same_machine if profile.beside is not None else None,
        "estimate_s": profile.beside.estimate_s if profile.beside is not None else None,
        "notes": profile.notes, "cell_with_profile_s": cell_s,
    }
    print(profile.view("%%shard --profile of the MLP step").to_text(width=100))
    print()
    print(f"the same jitted step outside the profiler: wall-clock median of 10 {wall * 1e3:.2f} ms (hand-written "
          f"jax.jit(mlp_step): {hand_wall * 1e3:.2f} ms); the profile's step {profile.step_s * 1e3:.2f} ms (ratio "
          f"{profile.step_s / wall:.3f}); ops named {len(named)}, not in the compiled program: {unmatched or 'none'}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=1)
    return figures


if __name__ == "__main__":
    main()
