"""The planner's memory against a hand compile, over generated small programs (issue 29).

Each example is a training or forward step drawn from: 1-3 layers, a Python loop, `lax.scan` or
`lax.fori_loop` over them, `jax.checkpoint` on each layer or not, `jax.grad` or the forward pass only,
f32 or bf16, a one- or two-axis mesh, planned as a `%%shard` cell (its inputs donated or not) or a
`%%shard_map` cell. The oracle is the same function compiled by hand, as a user would:
`jax.jit(step, donate_argnums=...)` (or `jax.jit(jax.shard_map(step, ...))`) `.lower(...).compile()
.memory_analysis()`. For each example:
- the plan's arguments, outputs, aliased bytes and temporaries equal memory_analysis()'s, and its
  peak is their sum (arguments + outputs + temporaries - aliased);
- the rows at the peak add up to the peak exactly and the buffers live there never exceed it.

XLA:CPU in CI: a fixed, derandomized budget (12 examples, about 30 s on two busy cores);
`JPM_PLAN_MEMORY_EXAMPLES=200` runs more. A fixed handful runs on XLA:TPU where libtpu is installed
(compile-only devices of a v5e 2x4 slice).
"""
from __future__ import annotations

import os
import re
import textwrap
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxpar_magic
from tpu_support import has_libtpu

EXAMPLES = int(os.environ.get("JPM_PLAN_MEMORY_EXAMPLES", "12"))
WIDTH, BATCH = 256, 512


@dataclass(frozen=True)
class Program:
    layers: int
    loop: str  # "python" | "scan" | "fori"
    remat: bool
    grad: bool
    dtype: str  # "float32" | "bfloat16"
    two_axes: bool
    magic: str  # "shard" | "shard_map"
    donate: bool

    def source(self) -> str:
        """The step's own module text: `step(params, x)`, as a user would write it."""
        layer = "jax.checkpoint(layer)" if self.remat else "layer"
        if self.loop == "python":
            body = f"    for w in ws:\n        h = {layer}(h, w)\n"
        elif self.loop == "scan":
            body = f"    h, _ = jax.lax.scan(lambda c, w: ({layer}(c, w), None), h, jnp.stack(ws))\n"
        else:
            body = (f"    stacked = jnp.stack(ws)\n"
                    f"    h = jax.lax.fori_loop(0, {self.layers}, lambda i, c: {layer}(c, stacked[i]), h)\n")
        reduce = "    loss = jax.lax.pmean(loss, 'data')\n" if self.magic == "shard_map" else ""
        mean_grads = ("    grads = jax.lax.pmean(grads, 'data')\n" if self.magic == "shard_map" else "")
        update = (f"    loss, grads = jax.value_and_grad(forward)(params, x)\n{mean_grads}"
                  f"    params = jax.tree.map(lambda w, g: w - 0.01 * g.astype(w.dtype), params, grads)\n"
                  f"{reduce}    return params, loss\n") if self.grad else (
                  f"    loss = forward(params, x)\n{reduce}    return params, loss\n")
        return (
            "def layer(h, w):\n"
            "    a = jnp.tanh(h @ w)\n"
            "    return a * 0.5 + h\n"
            "def forward(params, x):\n"
            "    ws = [params[k] for k in sorted(params)]\n"
            "    h = x\n" + body +
            "    return jnp.mean(h.astype(jnp.float32) ** 2)\n"
            "def step(params, x):\n" + update)


def programs():
    return st.builds(Program, layers=st.integers(1, 3), loop=st.sampled_from(["python", "scan", "fori"]),
                     remat=st.booleans(), grad=st.booleans(), dtype=st.sampled_from(["float32", "bfloat16"]),
                     two_axes=st.booleans(), magic=st.sampled_from(["shard", "shard_map"]), donate=st.booleans())


def setting(program: Program, mesh=None):
    """(namespace, mesh, in specs): the step's inputs on a mesh of 8 simulated devices, or on `mesh`."""
    axes = {"data": 4, "model": 2} if program.two_axes else {"data": 8}
    if mesh is None:
        mesh = jax.make_mesh(tuple(axes.values()), tuple(axes), axis_types=(jax.sharding.AxisType.Auto,) * len(axes))
    dtype = jnp.dtype(program.dtype)
    weight = P() if program.magic == "shard_map" else P(None, "model" if program.two_axes else None)
    params = {f"w{i}": jax.ShapeDtypeStruct((WIDTH, WIDTH), dtype, sharding=NamedSharding(mesh, weight))
              for i in range(program.layers)}
    x = jax.ShapeDtypeStruct((BATCH, WIDTH), dtype, sharding=NamedSharding(mesh, P("data", None)))
    ns = {"jax": jax, "jnp": jnp, "params": params, "x": x}
    exec(compile(program.source(), f"<plan-memory-{abs(hash(program))}>", "exec"), ns)
    return ns, mesh, weight


CELL = "params, loss = step(params, x)"


def plan_and_oracle(program: Program, **target):
    ns, mesh, weight = setting(program)
    donate = ("params",) if program.donate and program.magic == "shard" else ()
    if program.magic == "shard":
        plan = jaxpar_magic.plan_cell(CELL, ns, mesh=mesh, donate=donate, bind=False, **target)
        with jax.set_mesh(mesh):
            lowered = jax.jit(ns["step"], donate_argnums=(0,) if donate else ()).lower(ns["params"], ns["x"])
    else:
        plan = jaxpar_magic.plan_cell(CELL, ns, magic="shard_map", mesh=mesh, in_specs={"x": P("data", None)},
                                      out_specs={"params": P(), "loss": P()}, bind=False, **target)
        mapped = jax.shard_map(ns["step"], mesh=mesh, in_specs=(P(), P("data", None)), out_specs=(P(), P()))
        lowered = jax.jit(mapped).lower(ns["params"], ns["x"])
    if "topology" in target:
        return plan, None  # compile-only TPU devices: the oracle compiles for them below
    return plan, lowered.compile().memory_analysis()


def check(plan, memory) -> None:
    figures = (plan.argument_bytes, plan.output_bytes, plan.alias_bytes, plan.temp_bytes)
    assert figures == (memory.argument_size_in_bytes, memory.output_size_in_bytes, memory.alias_size_in_bytes,
                       memory.temp_size_in_bytes)
    assert plan.total_bytes == sum(figures[:2]) + figures[3] - figures[2]
    check_rows(plan)


def check_rows(plan) -> None:
    peak = plan.peak
    assert sum(b.bytes for b in peak.buffers) + peak.other_bytes + peak.reserved_bytes == peak.reported == plan.total_bytes
    assert peak.live <= peak.reported and peak.disagreement is None
    assert peak.other_bytes <= 0.10 * peak.reported  # nothing large hides in "other"
    check_outputs(plan)


def returned_values(text: str) -> set[tuple[str, str]]:
    """The oracle for issue 42's outputs: (instruction, element) of what the ENTRY's ROOT returns, each read
    through the get-tuple-elements and bitcasts that name no buffer of their own (a multi-output
    fusion's outputs are its elements)."""
    entry = text[text.index("\nENTRY "):]
    moves = {m.group(1): (m.group(2), m.group(3), m.group(4)) for m in re.finditer(
        r"%([\w.\-]+) = \S+ (get-tuple-element|bitcast)\(%([\w.\-]+)\)(?:, index=(\d+))?", entry)}
    root = next(line for line in entry.splitlines() if line.lstrip().startswith("ROOT"))
    names = re.findall(r"%([\w.\-]+)", root.split(" tuple(", 1)[1]) if " tuple(" in root else [root.split()[1].lstrip("%")]
    found = set()
    for name in names:
        index: list[str] = []
        found.add((name, "{}"))
        while name in moves:
            op, name, element = moves[name]
            if op == "get-tuple-element":
                index.insert(0, element)
            found.add((name, "{" + ",".join(index) + "}"))
    return found


def check_outputs(plan) -> None:
    """Every value the program returns that is live at the peak is an output row (never "temporary from
    div", issue 42), and the output rows never exceed the header's outputs."""
    peak, returned = plan.peak, returned_values(plan.compiled.as_text())
    assert not [r for r in peak.live_rows if r.kind == "temporary" and (r.instruction, r.index) in returned]
    assert sum(r.bytes for r in peak.live_rows if r.kind == "output") <= plan.output_bytes


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("JPM_DIFFERENTIAL_RANDOM"),
          database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(program=programs())
def test_plan_memory_is_the_hand_compiles(jx, program):
    plan, memory = plan_and_oracle(program)
    try:
        check(plan, memory)
    except AssertionError as failed:
        raise AssertionError(f"{failed}\n{program}\n{textwrap.indent(program.source(), '    ')}") from None


TPU_HANDFUL = [
    Program(2, "scan", True, True, "bfloat16", True, "shard", True),
    Program(3, "python", False, True, "float32", False, "shard", False),
    Program(2, "fori", False, True, "bfloat16", False, "shard_map", False),
]


@pytest.mark.skipif(not has_libtpu(), reason="needs libtpu")
@pytest.mark.parametrize("program", TPU_HANDFUL, ids=lambda p: f"{p.magic}-{p.loop}-{p.layers}")
def test_plan_memory_is_the_hand_compiles_on_xla_tpu(jx, program):
    plan, _ = plan_and_oracle(program, hardware="tpu-v5e", topology="2x4")
    assert plan.compiler == "XLA:TPU"
    ns, mesh, _ = setting(program, plan.mesh)  # the same compile-only devices, in the plan's order
    if program.magic == "shard":
        with jax.set_mesh(mesh):
            lowered = jax.jit(ns["step"], donate_argnums=(0,) if program.donate else ()).lower(ns["params"], ns["x"])
    else:
        lowered = jax.jit(jax.shard_map(ns["step"], mesh=mesh, in_specs=(P(), P("data", None)),
                                        out_specs=(P(), P()))).lower(ns["params"], ns["x"])
    check(plan, lowered.compile().memory_analysis())
