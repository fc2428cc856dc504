"""Section 13 of bench/run.py: a training step over a 64-leaf params pytree on 8 simulated devices
(issue 13: pytrees cost what they cost in JAX).

13. a cached `%%shard` re-run of the step (data-parallel: x and y split over `data`, params
    replicated; every run binds a *new* params dict of the same structure, as a training loop does)
    vs the same step under a hand-written `jax.jit`; 13b: both through `shell.run_cell`.
13c. the step defined in a `%%pmap` cell (function mode, params broadcast with in_axes=None) called
    per step vs `jax.pmap` of the same function.
"""
from __future__ import annotations

from benchkit import DEVICES, compare_row, detail, interleaved, log

SHARD_TARGET = 1.05  # issue 13: the %%shard re-run
FUNCTION_TARGET = 1.03  # issue 13: the function call, the training-loop path
LAYERS = 32  # 32 x (w, b) = 64 leaves

STEP_HELPERS = """\
def loss_fn(params, x, y):
    h = x
    for i in range(LAYERS):
        h = jnp.tanh(h @ params[f"w{i}"] + params[f"b{i}"])
    return ((h - y) ** 2).mean()
"""
# Names of their own: the shell is shared with the other sections (and their profiles run later).
SHARD_STEP = """\
mlp_loss, mlp_grads = jax.value_and_grad(loss_fn)(mlp_params, mlp_x, mlp_y)
mlp_params = jax.tree.map(lambda p, g: p - 0.01 * g, mlp_params, mlp_grads)
"""
SHARD_LINE = "--mesh data=8 --in mlp_x=data mlp_y=data --no-show"
PMAP_STEP = """\
def pstep(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    grads = lax.pmean(grads, 'i')
    return lax.pmean(loss, 'i'), jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)
"""


def bench_pytrees(jax, sh, args) -> dict:
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    width, batch = 32, 64
    keys = jax.random.split(jax.random.key(0), LAYERS)
    params = {}
    for i, k in enumerate(keys):
        params[f"w{i}"] = jax.random.normal(k, (width, width)) * 0.1
        params[f"b{i}"] = jnp.zeros(width)
    x = jax.random.normal(jax.random.key(1), (batch, width))
    y = jnp.tanh(x)
    ns = sh.user_ns
    ns.update(jax=jax, jnp=jnp, lax=lax, LAYERS=LAYERS, mlp_params=params, mlp_x=x, mlp_y=y)
    sh.run_cell(STEP_HELPERS)
    loss_fn = ns["loss_fn"]
    detail(f"13. workload: a {LAYERS}-layer tanh MLP, params a dict of {2 * LAYERS} leaves ({width}x{width} and "
           f"{width}), batch {batch}x{width}; one SGD step per call. %%shard: `%%shard {SHARD_LINE}` binding a new "
           f"params dict every run; hand-written: `jax.jit(step)` returning what the cell binds (loss, grads, "
           f"params) on x, y placed the same way.")

    log("13: %%shard re-run of a 64-leaf training step")
    sh.run_cell_magic("shard", SHARD_LINE, SHARD_STEP)  # the first run places x, y and compiles
    sh.run_cell_magic("shard", SHARD_LINE, SHARD_STEP)  # params now carries the program's own sharding
    mesh = ns["mlp_x"].sharding.mesh
    placed_x = jax.device_put(x, NamedSharding(mesh, P("data")))
    placed_y = jax.device_put(y, NamedSharding(mesh, P("data")))

    # The cell's twin returns what the cell binds: loss, grads and the new params.
    @jax.jit
    def step(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return loss, grads, jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)

    # On Explicit axes (what `--mesh` makes on JAX 0.10) the hand-written step needs params on the mesh too:
    # a single-device params tree leaves the gradient's contraction over `data` ambiguous (ShardingTypeError).
    placed_params = jax.device_put(params, NamedSharding(mesh, P()))
    hand = {"params": placed_params}

    def hand_call():
        hand["loss"], hand["grads"], hand["params"] = step(hand["params"], placed_x, placed_y)
        jax.block_until_ready(hand["params"])

    ns.update(shard_step=step, hand_params=placed_params, placed_x=placed_x, placed_y=placed_y)
    hand_cell = ("loss2, grads2, hand_params = shard_step(hand_params, placed_x, placed_y)\n"
                 "_ = jax.block_until_ready(hand_params)")
    t = interleaved({
        "ours": lambda: sh.run_cell_magic("shard", SHARD_LINE, SHARD_STEP),
        "hand": hand_call,
        "ours (run_cell)": lambda: sh.run_cell(f"%%shard {SHARD_LINE}\n{SHARD_STEP}"),
        "hand (run_cell)": lambda: sh.run_cell(hand_cell),
    }, reps=args.reps, batch=20)
    r13 = compare_row(13, f"cached `%%shard` re-run of a training step over a {2 * LAYERS}-leaf params dict "
                          "(a new dict each run) vs `jax.jit` + block", t, "ours", "hand", target=SHARD_TARGET)
    compare_row("13b", "same, both through `shell.run_cell`", t, "ours (run_cell)", "hand (run_cell)", target=None)

    log("13c: %%pmap-defined step over the 64-leaf pytree")
    sh.run_cell_magic("pmap", "--no-show --in-axes '(None, 0, 0)'", PMAP_STEP)
    ours_step = ns["pstep"]
    hand_pmap = jax.pmap(ours_step.__wrapped__, axis_name="i", in_axes=(None, 0, 0))
    xs, ys = x.reshape(DEVICES, -1, width), y.reshape(DEVICES, -1, width)
    jax.block_until_ready(ours_step(params, xs, ys))
    jax.block_until_ready(hand_pmap(params, xs, ys))
    t2 = interleaved({
        "ours": lambda: jax.block_until_ready(ours_step(params, xs, ys)),
        "hand": lambda: jax.block_until_ready(hand_pmap(params, xs, ys)),
    }, reps=args.reps, batch=20)
    r13c = compare_row("13c", f"`%%pmap`-defined training step over the {2 * LAYERS}-leaf params (in_axes=(None, 0, 0)) "
                              "vs `jax.pmap`, per call", t2, "ours", "hand", target=FUNCTION_TARGET)
    return {"13": (r13, SHARD_TARGET), "13c": (r13c, FUNCTION_TARGET)}
