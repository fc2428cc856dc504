"""Section 14 of bench/run.py: a Flax NNX training step through `%%shard`, returning only what the
training loop uses (issue 23: temporaries), vs the same step under `nnx.jit` in the same run.

14. `%%shard --in x=data y=data --out loss`: the step's loss comes back, its gradients stay a
    temporary, the model and the optimizer are updated in place (as nnx.jit updates them). Hand-
    written: `nnx.jit(train_step)` returning the loss. Both block on the loss every call;
    both models are replicated on the mesh first.
14b. the same cell without --out, binding `grads` too: what returning a temporary costs (no target).
"""
from __future__ import annotations

from benchkit import compare_row, detail, interleaved, log

FLAX_TARGET = 1.05  # issue 23
WIDTH, BATCH, LAYERS = 128, 256, 4
STEP = """\
flax_loss, flax_grads = nnx.value_and_grad(flax_loss_fn)(flax_model, flax_x, flax_y)
flax_optimizer.update(flax_model, flax_grads)
"""
LINE = "--mesh data=8 --in flax_x=data flax_y=data --out flax_loss --no-show"
LINE_ALL = "--mesh data=8 --in flax_x=data flax_y=data --no-show"


def bench_flax(jax, sh, args) -> dict:
    import jax.numpy as jnp
    import optax
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec as P

    from jaxpar_magic.engines.shard import make_mesh

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.layers = nnx.List([nnx.Linear(WIDTH, WIDTH, rngs=rngs) for _ in range(LAYERS)])

        def __call__(self, x):
            for layer in self.layers:
                x = jnp.tanh(layer(x))
            return x

    def loss_fn(model, x, y):
        return jnp.mean((model(x) - y) ** 2)

    mesh = make_mesh("data=8")  # the mesh `--mesh data=8` builds (the same object: meshes are cached)

    def fresh():
        """The model replicated on the mesh, then its optimizer (whose state takes the same layout): on
        Explicit axes a plain `nnx.jit` step needs its parameters on the mesh, as the magic puts them."""
        model = Net(nnx.Rngs(0))
        nnx.update(model, jax.device_put(nnx.state(model), NamedSharding(mesh, P())))
        return model, nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

    x = jax.random.normal(jax.random.key(1), (BATCH, WIDTH))
    y = jnp.tanh(x)
    ours_model, ours_optimizer = fresh()
    ns = sh.user_ns
    ns.update(nnx=nnx, flax_loss_fn=loss_fn, flax_model=ours_model, flax_optimizer=ours_optimizer, flax_x=x,
              flax_y=y)
    log("14: Flax NNX step through %%shard --out loss vs nnx.jit")
    sh.run_cell_magic("shard", LINE, STEP)  # places x, y (rebound, placed) and compiles
    sh.run_cell_magic("shard", LINE, STEP)
    placed_x, placed_y = ns["flax_x"], ns["flax_y"]

    @nnx.jit
    def train_step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
        optimizer.update(model, grads)
        return loss

    hand_model, hand_optimizer = fresh()
    for _ in range(2):  # the same two steps the cell took: the same loss
        hand_loss = train_step(hand_model, hand_optimizer, placed_x, placed_y)
    assert abs(float(hand_loss) - float(ns["flax_loss"])) <= 1e-6 * max(1.0, abs(float(hand_loss)))

    def hand_call():
        jax.block_until_ready(train_step(hand_model, hand_optimizer, placed_x, placed_y))

    def ours_call():
        sh.run_cell_magic("shard", LINE, STEP)
        jax.block_until_ready(ns["flax_loss"])

    def ours_all_call():
        sh.run_cell_magic("shard", LINE_ALL, STEP)
        jax.block_until_ready(ns["flax_loss"])

    ours_all_call()  # compiles the variant that returns grads
    detail(f"14. workload: a {LAYERS}-layer tanh MLP ({WIDTH}x{WIDTH} nnx.Linear layers) trained with "
           f"nnx.Optimizer(adam) on a batch {BATCH}x{WIDTH} split over `data` (8 devices); one step per call. "
           f"Ours: `%%shard {LINE}` (grads a temporary, model and optimizer written back in place); "
           f"hand-written: `nnx.jit(train_step)` returning the loss, on the same placed batch.")
    t = interleaved({"ours": ours_call, "hand": hand_call, "ours (all names)": ours_all_call},
                    reps=args.reps, batch=10)
    ratio = compare_row(14, "Flax NNX training step: cached `%%shard --out loss` re-run (model and optimizer "
                            "updated in place) vs `nnx.jit` + block", t, "ours", "hand", target=FLAX_TARGET)
    compare_row("14b", "same cell without --out (binds `grads` too) vs `nnx.jit` + block", t,
                "ours (all names)", "hand", target=None)
    assert "flax_grads" in ns  # 14b's cell binds it
    return {"14": (ratio, FLAX_TARGET)}
