"""Plans compiled by XLA:TPU itself (stages/plan/target.py), for compile-only devices of a slice.

They need the optional libtpu: skipped with a message without it, failed under CI (tpu_support.py).
An XLA:TPU compile takes seconds (13-27 s for a train step on 2 cores), so the plans are made once
per module and shared: one cell planned through plan_cell (the magics' path), one train step through
compile_plan with its twin compiled by hand, and a pair with and without jax.checkpoint.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxpar_magic
from jaxpar_magic.errors import UsageError
from jaxpar_magic.engines.shard import make_mesh, plan
from jaxpar_magic.stages.plan.plan_program import compile_plan
from jaxpar_magic.views import plan as plan_view
from tpu_support import has_libtpu, require_libtpu

@pytest.fixture(scope="module", autouse=True)
def libtpu():
    require_libtpu()


@pytest.fixture(scope="module")
def grid():
    return make_mesh("data=4 model=2", axis_types="auto")


def step(params, x):
    def loss(p):
        h = x @ p["w1"]
        return jnp.mean((jax.nn.relu(h) @ p["w2"]).astype(jnp.float32) ** 2)

    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda w, g: w - 0.1 * g, params, grads)


def step_args(mesh):
    def spec(shape, dtype, *axes):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P(*axes)))

    params = {"w1": spec((1024, 4096), jnp.bfloat16, "data", "model"),
              "w2": spec((4096, 1024), jnp.bfloat16, "model", "data")}
    return params, spec((1024, 1024), jnp.bfloat16, "data", None)


@pytest.fixture(scope="module")
def fsdp(grid):
    """An FSDP x TP train step planned from the simulated CPU mesh for a v5e 2x4 slice, planned again,
    and compiled by hand for the same slice, as MaxText's train_compile does: two XLA:TPU compiles."""
    from jax.experimental import topologies

    planned = compile_plan(step, step_args(grid), grid, hardware="tpu-v5e", topology="2x4")
    again = compile_plan(step, step_args(grid), grid, hardware="tpu-v5e", topology="2x4")
    devices = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x4")
    by_hand = jax.jit(step).lower(*step_args(topologies.make_mesh(devices, (4, 2), ("data", "model")))).compile()
    return planned, again, by_hand


def test_the_plan_names_its_compiler_and_drops_the_cpu_caveats(fsdp):
    planned, _, _ = fsdp
    assert planned.compiler == "XLA:TPU" and planned.target.is_tpu
    assert planned.target.describe().startswith("compiled by XLA:TPU for a v5e 2x4 slice (libtpu ")
    state = planned.state("plan")
    assert state["compiler"]["name"] == "XLA:TPU" and "v5e 2x4" in plan_view.to_html(state)
    assert not any("CPU" in c for c in planned.caveats), planned.caveats
    assert planned.mesh.devices.flat[0].platform == "tpu" and planned.mesh.axis_names == ("data", "model")


def test_the_machine_keeps_its_own_jax(fsdp):
    assert jax.default_backend() == "cpu" and {d.platform for d in jax.devices()} == {"cpu"}
    assert len(jax.devices()) == 8


def test_a_replan_compiles_nothing(fsdp):
    planned, again, _ = fsdp
    assert not planned.reused and again.reused
    assert again.total_bytes == planned.total_bytes and again.compile_ms < planned.compile_ms / 4


def test_the_rows_add_up_to_the_hbm_peak(fsdp):
    planned, _, by_hand = fsdp
    peak, memory = planned.peak, by_hand.memory_analysis()
    hbm = (memory.argument_size_in_bytes + memory.output_size_in_bytes + memory.temp_size_in_bytes
           - memory.alias_size_in_bytes)
    assert planned.total_bytes == hbm == peak.reported  # HBM's figures: VMEM is not in memory_analysis()
    assert peak.live <= peak.reported and peak.disagreement is None
    assert sum(b.bytes for b in peak.buffers) + peak.other_bytes + peak.reserved_bytes == peak.reported
    names = {b.name for b in peak.buffers if b.kind == "argument"}
    assert {"params['w1']", "params['w2']", "x"} <= names  # the function's own argument paths


def test_memory_is_what_memory_analysis_says_for_the_same_step_compiled_by_hand(fsdp):
    planned, _, by_hand = fsdp
    memory = by_hand.memory_analysis()
    assert (planned.argument_bytes, planned.output_bytes, planned.temp_bytes, planned.alias_bytes) == (
        memory.argument_size_in_bytes, memory.output_size_in_bytes, memory.temp_size_in_bytes,
        memory.alias_size_in_bytes)
    assert planned.xla_peak_bytes == memory.peak_memory_in_bytes  # kept, and said beside the VMEM it counts
    assert planned.flops == by_hand.cost_analysis()["flops"]


def test_collectives_are_those_of_the_compiled_program(fsdp):
    planned, _, by_hand = fsdp
    text = by_hand.as_text()
    # XLA:TPU makes FSDP's gradient a reduce-scatter: a kCustom fusion calling %all-reduce-scatter
    fused = re.findall(r"kind=kCustom, calls=%all-reduce-scatter", text)
    scattered = [c for c in planned.collectives if c.op == "reduce-scatter"]
    assert fused and len(scattered) == len(fused)
    assert all(c.sliced_from is None for c in planned.collectives)  # XLA:TPU's own, not a rewrite of ours
    gathers = set(re.findall(r"all-gather(?:-start)?\(.*?channel_id=(\d+)", text))
    assert len([c for c in planned.collectives if c.op == "all-gather"]) == len(gathers)
    shown = plan_view.to_text(planned.state("fsdp"))
    assert "reduce-scatter (sum) · bf16[" in shown and "XLA:CPU: all-reduce + slice" not in shown


MLP = """def block(h, w):
    a = jnp.tanh(h @ w[0])
    return jnp.tanh(a @ w[1])
def loss(ws, x):
    for w in ws:
        x = BLOCK(x, w)
    return jnp.mean(x ** 2)
grads = jax.grad(loss)(ws, x)
"""
# Large enough that XLA:TPU keeps the blocks' activations in HBM (at 1024x128x512 they all fit in the
# chip's 128 MiB of VMEM, which memory_analysis() and the plan's HBM figures leave out); 7-43 s per compile.
ROWS, WIDTH, HIDDEN = 2048, 128, 4096


@pytest.fixture(scope="module")
def remat():
    """The same MLP step with and without jax.checkpoint on each block, through plan_cell (the magics'
    path), for one v5e chip (no collectives, a quick compile): two XLA:TPU compiles."""
    import numpy as np
    from jax.sharding import Mesh

    one = Mesh(np.array(jax.devices()[:1]), ("data",))
    ns = {"jnp": jnp, "jax": jax, "x": plan((ROWS, WIDTH), "float32", one, ("data", None)),
          "ws": [(plan((WIDTH, HIDDEN), "float32", one, ()), plan((HIDDEN, WIDTH), "float32", one, ()))
                 for _ in range(3)]}
    return [jaxpar_magic.plan_cell(MLP.replace("BLOCK", block), ns, mesh=one, bind=False, hardware="tpu-v5e",
                                   topology="1x1") for block in ("block", "jax.checkpoint(block)")]


def test_jax_checkpoint_lowers_xla_tpus_hbm_peak(remat):
    plain, checkpointed = remat
    assert checkpointed.compiler == "XLA:TPU" and checkpointed.total_bytes < plain.total_bytes
    assert checkpointed.temp_bytes < plain.temp_bytes  # the activations saved for the backward pass
    assert not any("jax.checkpoint" in c for c in checkpointed.caveats)  # XLA:TPU keeps it: no CPU warning
    for p in remat:  # VMEM is said apart, never in the HBM figures
        assert any("on-chip vector memory (VMEM) (not HBM" in n for n in p.memory_notes())
        # XLA's own names for its spaces (SMEM, COLOR_6) are said in words, or not at all
        assert not re.search(r"\b(?:COLOR|color)_\d|on-chip SMEM|on-chip VMEM", " ".join(p.memory_notes()))


def test_the_largest_activation_is_named_with_its_bytes_and_its_line(remat):
    plain, _ = remat
    top = plain.peak.buffers[0]
    assert top.kind == "temporary" and top.shape == (ROWS, HIDDEN)  # an activation of a block, saved for backward
    assert top.line in (2, 3) and top.source in ("a = jnp.tanh(h @ w[0])", "return jnp.tanh(a @ w[1])")
    assert sum(b.bytes for b in plain.peak.buffers) + plain.peak.other_bytes + plain.peak.reserved_bytes == \
        plain.total_bytes


@pytest.mark.skipif(not has_libtpu(), reason="needs libtpu")
def test_a_kernel_with_libtpu_starts_on_the_cpu_and_a_tpu_plan_prints_nothing_in_the_notebook():
    """A kernel as users start it (JAX_PLATFORMS unset) through nbclient: %load_ext, %devices, a plan
    compiled by XLA:TPU, then JAX's own devices. No output carries libtpu's start-up text."""
    import nbformat

    from notebooks import executed_source

    cells = executed_source([
        "%load_ext jaxpar_magic\n%devices",
        "print('libtpu loaded:', any('libtpu' in line for line in open('/proc/self/maps')))",
        "import jax, jaxpar_magic\nmesh = jaxpar_magic.make_mesh('i=1')\n"
        "x = jaxpar_magic.plan((8, 128), 'float32', mesh, ())",
        "%%shard --plan --mesh mesh --hardware tpu-v5e --topology 1x1\ny = x * 2",
        "print(jax.default_backend(), len(jax.devices()), type(y).__name__)",
    ])
    streams = [o for c in cells for o in c.outputs if o.output_type == "stream"]
    assert not [o for o in streams if o.name == "stderr"], [o.text for o in streams]
    text = "\n".join(nbformat.writes(nbformat.v4.new_notebook(cells=cells)).splitlines())
    for noise in ("TPU_ACCELERATOR_TYPE", "InitGoogle", "TPU_WORKER_HOSTNAMES", "libtpu_init"):
        assert noise not in text
    assert cells[1].outputs[0].text == "libtpu loaded: False\n"  # %devices did not probe for a TPU
    plan_text = next(o for o in cells[3].outputs if "text/plain" in o.get("data", {}))["data"]["text/plain"]
    assert "compiled by XLA:TPU for a v5e 1x1 slice" in plan_text
    assert cells[4].outputs[0].text == "cpu 1 ShapeDtypeStruct\n"


def test_an_abstract_mesh_needs_no_simulated_devices_and_shard_map_plans_too():
    """16 chips from a process with 8 CPU devices: the TPU devices come from the slice. A tiny
    shard_map program, so one quick compile."""
    from jax.sharding import AbstractMesh

    pod = AbstractMesh((8, 2), ("data", "model"))
    x = jax.ShapeDtypeStruct((64, 256), jnp.float32, sharding=NamedSharding(pod, P("data", "model")))
    # no mesh= of its own: shard_map takes the mesh the plan compiles under (jax.set_mesh)
    summed = jax.shard_map(lambda a: jax.lax.psum(a, "data"), in_specs=P("data", "model"), out_specs=P(None, "model"))
    planned = compile_plan(summed, (x,), pod, hardware="tpu-v5e", topology="4x4")
    assert planned.compiler == "XLA:TPU" and planned.mesh.devices.size == 16
    assert [c.op for c in planned.collectives] == ["all-reduce"] and planned.collectives[0].axes == ("data",)
    assert planned.argument_bytes == 64 * 256 * 4 // 16
    with pytest.raises(UsageError, match="needs a Mesh of devices"):
        compile_plan(summed, (x,), pod, hardware="tpu-v5e")  # no slice named: XLA:CPU, which needs devices


def test_a_slice_xla_tpu_cannot_route_is_a_usage_error_naming_the_offered_shapes():
    from jax.sharding import AbstractMesh

    quiz = AbstractMesh((8, 4), ("X", "Y"))  # the scaling book's Pop Quiz 2 on a v5e 2x16 (not a GCP slice)
    x = jax.ShapeDtypeStruct((2048, 8192), jnp.bfloat16, sharding=NamedSharding(quiz, P("Y", None)))
    with pytest.raises(UsageError) as err:
        compile_plan(lambda a: a + 1, (x,), quiz, hardware="tpu-v5e", topology="2x16")
    message = str(err.value)
    assert message.startswith("XLA:TPU could not compile this cell for a v5e 2x16 slice: ")
    assert "2x4, 4x4, 4x8" in message and "drop --topology" in message
