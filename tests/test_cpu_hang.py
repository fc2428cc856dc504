"""The 2-core deadlock regression: a pmapped training loop on 8 simulated CPU devices runs to its end.

XLA's CPU collectives used to deadlock once 50-70 programs with collectives were queued back to
back on a 2-core machine ("Expected 8 threads to join the rendezvous"), and the process aborted a
minute later. The loop below never waits on a result itself, as a user's loop wouldn't, so only
the package can keep it from piling programs up. It runs in its own process: a fresh backend, and
a hang there cannot take the test session down with it.
"""
from __future__ import annotations

import re

from shell_helpers import run_python

LOOP = r'''
import numpy as np
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from traitlets.config import Config

config = Config()
config.HistoryManager.enabled = False
ip = InteractiveShell.instance(config=config)
ip.run_line_magic("load_ext", "jaxpar_magic")
with capture_output():
    ip.run_line_magic("devices", "--simulate 8")

ip.run_cell_magic("pmap", "--no-show --axis-name batch", """
import jax.numpy as jnp
from jax import grad
import jax.lax as lax

def loss(params, batch):
    x, y = batch
    pred = x @ params
    return jnp.mean((pred - y) ** 2)

def train_step(params, batch, lr):
    grads = grad(loss)(params, batch)
    grads = lax.pmean(grads, axis_name='batch')
    new_params = params - lr * grads
    return new_params, loss(params, batch)
""")
train_step = ip.user_ns["train_step"]

import jax
assert jax.device_count() == 8, jax.device_count()
rng = np.random.default_rng(0)
# Big enough that a step's collectives take longer than Python takes to dispatch the next step:
# with tiny arrays every program finishes before the next is queued, and nothing piles up.
true_w = rng.normal(size=256).astype(np.float32)
X = rng.normal(size=(8, 2048, 256)).astype(np.float32)
Y = (X @ true_w).astype(np.float32)
params = np.zeros((8, 256), np.float32)
first = None
for step in range(200):
    params, loss = train_step(params, (X, Y), 0.05)
    if first is None:
        first = loss
print("steps", step + 1)
print("first loss", float(np.mean(first)))
print("final loss", float(np.mean(loss)))
print("error", float(np.abs(np.asarray(params) - true_w).max()))
'''


def test_two_hundred_pmapped_training_steps_finish():
    result = run_python(LOOP, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    out = result.stdout
    assert "steps 200" in out
    first = float(re.search(r"first loss (\S+)", out).group(1))
    final = float(re.search(r"final loss (\S+)", out).group(1))
    assert final < first / 100  # it trained: a noiseless linear model fits almost exactly
    assert float(re.search(r"error (\S+)", out).group(1)) < 0.05
