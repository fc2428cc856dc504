"""Library code is known by its origin, not its folder (issue 39): wherever Flax, optax and Equinox are
installed, a cached training step through each compiles once over its re-runs (cell/origins.py;
tests/test_origins.py checks the rule itself, and that the user's own modules in a plain folder keep
every re-run guarantee).

Each layout (tests/install_layouts.py: `pip install --target` on PYTHONPATH, `--user`, Debian's
dist-packages, an editable install) runs in a fresh interpreter, which imports the libraries from
it, and counts XLA compiles through jax.monitoring. On a TPU VM, where Flax sits in a --target
folder, the first of them made an NNX step recompile on every run (2.28 s a step against nnx.jit's
3.0 ms); each layout here fails that way with the rule by folder. Each test takes ~9-15 s on 2
loaded cores (a fresh interpreter imports JAX, IPython and the three libraries): `slow`.
"""
from __future__ import annotations

import json

import pytest

import install_layouts
from shell_helpers import COMPILE_EVENT, in_a_fresh_shell

pytest.importorskip("flax")
pytest.importorskip("optax")
pytest.importorskip("equinox")

RUNS = 5  # the first two may compile (the first run places the inputs on the mesh); the rest must not

STEPS = f"""
import json, sys
assert not {{"flax", "optax", "equinox"}} & set(sys.modules), "imported before the layout was in place"
import jax.monitoring
compiles = [0]
def on_event(event, duration, **kwargs):
    if event == {COMPILE_EVENT!r}:
        compiles[0] += 1
jax.monitoring.register_event_duration_secs_listener(on_event)

ip.run_cell('''
import equinox as eqx, flax, numpy as np, optax
from flax import nnx

class MLP(nnx.Module):  # the user's class over Flax's layers, optimizer and variables
    def __init__(self, rngs):
        self.a = nnx.Linear(4, 8, rngs=rngs, kernel_init=nnx.initializers.constant(0.1))
        self.b = nnx.Linear(8, 2, rngs=rngs, kernel_init=nnx.initializers.constant(-0.2))
    def __call__(self, x):
        return self.b(jax.nn.relu(self.a(x)))

def nnx_loss(model, x, y):
    return jnp.mean((model(x) - y) ** 2)

# Constant initial values: random ones would compile a program per operation before the steps.
model = MLP(nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

class Affine(eqx.Module):  # the user's Equinox module
    w: jax.Array
    b: jax.Array
    def __call__(self, x):
        return jnp.tanh(x @ self.w + self.b)

def eqx_loss(m, x, y):
    return jnp.mean((m(x) - y) ** 2)

emodel = Affine(jnp.full((4, 2), 0.1), jnp.zeros(2))
etx = optax.adam(1e-2)
estate = etx.init(eqx.filter(emodel, eqx.is_array))

def tree_loss(p, x, y):
    return jnp.mean((jnp.tanh(x @ p["w"] + p["b"]) - y) ** 2)

params = {{"w": jnp.full((4, 2), -0.1), "b": jnp.zeros(2)}}
ptx = optax.adam(1e-2)
pstate = ptx.init(params)
x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(8, 4)
y = np.ones((8, 2), np.float32)
''').raise_error()
STEPS = {{
    "nnx": ("--mesh data=8 --in x=data y=data --out loss --no-show",
            "loss, grads = nnx.value_and_grad(nnx_loss)(model, x, y)\\noptimizer.update(model, grads)\\n"),
    "equinox": ("--mesh data=8 --in x=data y=data --out eloss emodel estate --no-show",
                "eloss, g = eqx.filter_value_and_grad(eqx_loss)(emodel, x, y)\\n"
                "u, estate = etx.update(g, estate, eqx.filter(emodel, eqx.is_array))\\n"
                "emodel = eqx.apply_updates(emodel, u)\\n"),
    "optax": ("--mesh data=8 --in x=data y=data --out ploss params pstate --no-show",
              "ploss, g = jax.value_and_grad(tree_loss)(params, x, y)\\n"
              "u, pstate = ptx.update(g, pstate, params)\\n"
              "params = optax.apply_updates(params, u)\\n"),
}}
counts, losses = {{}}, {{}}
for name, (line, source) in STEPS.items():
    counts[name] = []
    for _ in range({RUNS}):
        before = compiles[0]
        ip.run_cell_magic("shard", line, source)
        counts[name].append(compiles[0] - before)
    losses[name] = float(ip.user_ns[{{"nnx": "loss", "equinox": "eloss", "optax": "ploss"}}[name]])
import equinox, flax, optax
from jaxpar_magic.cell.origins import is_library_file
files = {{m.__name__: m.__file__ for m in (flax, optax, equinox)}}
print("RESULT", json.dumps({{"counts": counts, "losses": losses, "files": files,
                            "library": {{n: is_library_file(f) for n, f in files.items()}}}}))
"""


def run_steps(layout: install_layouts.Layout) -> dict:
    done = in_a_fresh_shell(layout.preamble + STEPS, timeout=300, env=layout.env)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(install_layouts.LAYOUTS))
def test_cached_library_steps_compile_once_wherever_the_libraries_are_installed(name, tmp_path):
    layout = install_layouts.LAYOUTS[name](tmp_path)
    found = run_steps(layout)
    for module, file in found["files"].items():
        assert file.startswith(str(layout.folder)), f"{module} came from {file}, not from the {name} layout"
    for step, counts in found["counts"].items():
        assert counts[2:] == [0] * (RUNS - 2), f"{step} step compiled again on re-runs in the {name} layout: {counts}"
        assert counts[0] >= 1, counts  # it did compile: the counter counts
    assert all(found["library"].values()), found["library"]
