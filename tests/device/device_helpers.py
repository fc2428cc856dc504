"""Helpers the device tier's tests import (tests/device/conftest.py holds its fixtures)."""
from __future__ import annotations

import jax
import numpy as np


def assert_bitwise(ours, theirs, what: str = "value") -> None:
    """Two pytrees with the same structure whose array leaves have the same dtype, shape and bytes
    (so -0.0 is not 0.0 and NaNs differ by payload, as the programs' outputs would)."""
    ours_leaves, ours_tree = jax.tree.flatten(ours)
    theirs_leaves, theirs_tree = jax.tree.flatten(theirs)
    assert ours_tree == theirs_tree, f"{what}: {ours_tree} vs {theirs_tree}"
    assert ours_leaves, f"{what}: nothing to compare"
    for i, (a, b) in enumerate(zip(ours_leaves, theirs_leaves)):
        a, b = np.asarray(a), np.asarray(b)
        assert (a.dtype, a.shape) == (b.dtype, b.shape), f"{what}[{i}]: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        if a.tobytes() != b.tobytes():
            worst = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
            raise AssertionError(f"{what}[{i}] {a.dtype}{a.shape}: not bitwise equal (largest difference {worst:.3g})")


def nnx_train_step(loss_fn):
    """The hand-written twin of an NNX training cell: `nnx.jit` of value_and_grad and the optimizer's update."""
    from flax import nnx

    @nnx.jit
    def train_step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
        optimizer.update(model, grads)
        return loss

    return train_step
