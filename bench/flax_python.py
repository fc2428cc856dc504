"""Section 14's step, Python alone: what a re-run of the Flax NNX cell costs around its compiled
program, next to what `nnx.jit` costs around its own (bench/RESULTS.md, 2026-12-04).

On a loaded 2-core machine the step's ratio moves by ±0.1 from run to run; with each side's compiled
program replaced by a stub that hands back its last real results, only the Python around it is timed,
and that holds still. Three paths, best of 7 repetitions of 300 calls each:

- our re-run as it is (the record of cell/nnx_replay.py);
- our re-run forced onto the full check and `nnx.update` (what every re-run did before that record);
- `nnx.jit`'s call with its inner `jax.jit` stubbed. This reads two attributes of Flax's JitWrapped that
  are not public API (`jitted_fn`, `_get_pure_args_kwargs`); if Flax renames them, that line fails.

    .venv/bin/python bench/flax_python.py
"""
from __future__ import annotations

import argparse
import os
import timeit

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # as run.py: no TPU probe when libtpu is installed

from benchkit import make_shell, start_jax  # noqa: E402


def best_us(fn, calls: int = 300) -> float:
    return min(timeit.repeat(fn, number=calls, repeat=7)) / calls * 1e6


def main() -> None:
    jax = start_jax()
    sh = make_shell()
    sh.run_line_magic("load_ext", "jaxpar_magic")
    import sections_flax
    from flax import nnx

    import jaxpar_magic.stages.run.shard as shard_run

    sections_flax.bench_flax(jax, sh, argparse.Namespace(reps=2))  # section 14's cells, run and compiled
    ns = sh.user_ns
    key = next(k for k in shard_run._reruns if k[0] == sections_flax.STEP and "flax_loss" in (k[4] or ()))
    rerun = shard_run._reruns[key]
    results = rerun.program.jitted(*rerun.args(ns))
    jax.block_until_ready(results)
    rerun.program.jitted = lambda *args: results

    def ours():
        sh.run_cell_magic("shard", sections_flax.LINE, sections_flax.STEP)

    print(f"ours, as it is: {best_us(ours):.0f} µs")
    record, rerun.graph_replay, rerun.graph_attempts = rerun.graph_replay, None, 1 << 30
    print(f"ours, full check and nnx.update: {best_us(ours):.0f} µs")
    rerun.graph_replay = record
    print(f"ours, as it is (again): {best_us(ours):.0f} µs")

    @nnx.jit
    def train_step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(ns["flax_loss_fn"])(model, x, y)
        optimizer.update(model, grads)
        return loss

    model, optimizer, x, y = ns["flax_model"], ns["flax_optimizer"], ns["flax_x"], ns["flax_y"]
    train_step(model, optimizer, x, y)
    with nnx.update_context(train_step):
        pure_args, pure_kwargs = train_step._get_pure_args_kwargs((model, optimizer, x, y), {})
        pure = train_step.jitted_fn(*pure_args, **pure_kwargs)
    jax.block_until_ready(pure)
    train_step.jitted_fn = lambda *args, **kwargs: pure
    print(f"nnx.jit's own Python: {best_us(lambda: train_step(model, optimizer, x, y)):.0f} µs")


if __name__ == "__main__":
    main()
