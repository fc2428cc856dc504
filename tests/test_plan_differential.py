"""The planner against the compiled program's own text (issue 29): hypothesis-generated small cells.

Each example is one cell, planned through `plan_cell` (the magics' plain-Python twin) as a `%%shard`
or a `%%shard_map` cell, on a one- or two-axis mesh: a stack of layers run by `lax.scan`,
`lax.fori_loop`, `lax.while_loop` or nested scans, each layer maybe under `jax.checkpoint`, maybe
through `lax.cond`, maybe differentiated with `jax.grad`; the `%%shard_map` layers call a collective
(psum, all_gather, psum_scatter, ppermute) over one mesh axis, the `%%shard` ones get theirs from
the layouts of their inputs. One function per property below, each given the example's `Example`:

- `collectives_per_step`: the plan's collectives, calls per step added up by kind, equal a census
  of the compiled program written here on its own: the collective instruction lines of each
  computation, multiplied along every path of the call graph by the `known_trip_count` each while
  instruction carries (a cond's branches each counted, as the plan counts them); on XLA:TPU, from
  the one constant its condition compares with, and an all-reduce inside XLA:TPU's own
  `all-reduce-scatter` fusion is the reduce-scatter it makes.
- `flops_of_every_trip`: the plan's FLOPs equal XLA's cost analysis of the same cell with its loops
  unrolled into Python for-loops (a straight-line program, which the analysis counts whole), within
  2 %: the two are compiled apart, and XLA may partition or fuse them a little differently.

planmem adds the memory properties beside these. On XLA:CPU it runs a derandomized budget (about
a minute on two busy cores); `JPM_PLAN_DIFFERENTIAL_EXAMPLES=200` runs more. A fixed handful also
runs on XLA:TPU (compile-only devices of a v5e 2x4 slice; tpu_support.py skips them without libtpu).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.utils.capture import capture_output
from jax import lax
from jax.sharding import PartitionSpec as P

import jaxpar_magic
from jaxpar_magic.engines.shard import make_mesh, plan
from jaxpar_magic.views import plan as plan_view
from shell_helpers import shown_widgets
from tpu_support import require_libtpu

EXAMPLES = int(os.environ.get("JPM_PLAN_DIFFERENTIAL_EXAMPLES", "14"))
MESHES = {"data=8": (("data", 8),), "data=4 model=2": (("data", 4), ("model", 2))}
ROWS, WIDTH = 16, 512  # a device's rows of x, and the layers' width (matmuls dwarf the elementwise work)


@dataclass(frozen=True)
class Example:
    magic: str  # "shard" | "shard_map"
    mesh: str  # a key of MESHES
    loop: str  # "scan" | "fori" | "while" | "nested"
    trips: int
    inner: int  # the nested loop's trips
    remat: bool
    cond: bool
    grad: bool
    collective: str  # shard_map: "psum" | "all_gather" | "psum_scatter" | "ppermute" | "none"
    axis: str  # the axis the collective runs over (shard_map), or that shards the weights (shard)

    def layer(self) -> str:
        """The source of `layer(h, wi)`: one layer of the stack, with its collective."""
        n = dict(MESHES[self.mesh])[self.axis]
        moved = {
            "none": "h",
            "psum": f"lax.psum(h, {self.axis!r}) / {n}",
            "all_gather": f"lax.all_gather(h, {self.axis!r}, axis=0, tiled=True)[:h.shape[0]]",
            "psum_scatter": f"jnp.tile(lax.psum_scatter(h, {self.axis!r}, scatter_dimension=1, tiled=True), (1, {n}))",
            "ppermute": f"lax.ppermute(h, {self.axis!r}, [(i, (i + 1) % {n}) for i in range({n})])",
        }[self.collective if self.magic == "shard_map" else "none"]
        body = f"    h = jnp.tanh(h @ wi)\n    h = {moved}\n"
        if self.cond:
            body += "    h = lax.cond(jnp.sum(h) > 0, lambda v: v * 2.0, lambda v: jnp.sin(v) @ wi, h)\n"
        wrap = "jax.checkpoint(_layer)" if self.remat else "_layer"
        return f"def _layer(h, wi):\n{body}    return h\n\nlayer = {wrap}\n"

    def stack(self, unrolled: bool) -> str:
        """`run(w, h)`: the layers over the stacked weights `w`, as a loop or unrolled."""
        if unrolled:
            inner = f"    for i in range({self.trips}):\n        h = layer(h, w[i])\n"
            if self.loop == "nested":
                inner = f"    for _ in range({self.inner}):\n" + "".join("    " + line + "\n" for line in inner.splitlines())
            return f"def run(w, h):\n{inner}    return h\n"
        return {
            "scan": "def run(w, h):\n    return lax.scan(lambda c, wi: (layer(c, wi), None), h, w)[0]\n",
            "fori": f"def run(w, h):\n    return lax.fori_loop(0, {self.trips}, lambda i, c: layer(c, w[i]), h)\n",
            "while": (f"def run(w, h):\n    step = lambda c: (c[0] + 1, layer(c[1], w[c[0]]))\n"
                      f"    return lax.while_loop(lambda c: c[0] < {self.trips}, step, (0, h))[1]\n"),
            "nested": (f"def run(w, h):\n    once = lambda c, _: (lax.scan(lambda d, wi: (layer(d, wi), None), c, w)[0], None)\n"
                       f"    return lax.scan(once, h, None, length={self.inner})[0]\n"),
        }[self.loop]

    def cell(self) -> str:
        if self.grad:  # x's gradient too: else the unrolled program skips the first layer's, which a loop computes
            return "g, gx = jax.grad(lambda v, u: jnp.sum(run(v, u) ** 2), argnums=(0, 1))(w, x)\n"
        return "y = run(w, x)\n"

    def namespace(self, mesh, unrolled: bool) -> dict:
        ns = {"jax": jax, "jnp": jnp, "lax": lax}
        exec(self.layer() + self.stack(unrolled), ns)  # noqa: S102 - the generated helpers, as a notebook defines them
        devices = mesh.devices.size
        if self.magic == "shard_map":
            ns["x"] = plan((devices * ROWS, WIDTH), "float32", mesh, (tuple(mesh.axis_names), None))
            ns["w"] = plan((self.trips, WIDTH, WIDTH), "float32", mesh, ())
        else:
            ns["x"] = plan((devices * ROWS, WIDTH), "float32", mesh, ("data", None))
            ns["w"] = plan((self.trips, WIDTH, WIDTH), "float32", mesh, (None, self.axis, None))
        return ns

    def plan(self, unrolled: bool = False, **target):
        mesh = make_mesh(self.mesh, axis_types="auto")
        ns = self.namespace(mesh, unrolled)
        axes = tuple(mesh.axis_names)
        if self.magic == "shard_map":
            out = {"g": P(axes), "gx": P(axes)} if self.grad else {"y": P(axes)}
            return jaxpar_magic.plan_cell(self.cell(), ns, magic="shard_map", mesh=mesh, in_specs={"x": P(axes)},
                                          out_specs=out, check_vma=False, bind=False, **target)
        return jaxpar_magic.plan_cell(self.cell(), ns, magic="shard", mesh=mesh, bind=False, **target)


@st.composite
def examples(draw) -> Example:
    mesh = draw(st.sampled_from(sorted(MESHES)))
    loop = draw(st.sampled_from(["scan", "fori", "while", "nested"]))
    return Example(
        magic=draw(st.sampled_from(["shard", "shard_map"])), mesh=mesh,
        loop=loop, trips=draw(st.sampled_from([2, 3, 5])),
        inner=draw(st.sampled_from([2, 3])), remat=draw(st.booleans()), cond=draw(st.booleans()),
        grad=loop != "while" and draw(st.booleans()),  # reverse mode needs a loop of static length
        collective=draw(st.sampled_from(["psum", "all_gather", "psum_scatter", "ppermute", "none"])),
        axis=draw(st.sampled_from([name for name, _ in MESHES[mesh]])),
    )


# --- the census: the compiled program's own text, read simply ---------------------------------------

_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_COLLECTIVE = re.compile(r"\s(all-reduce|all-gather|reduce-scatter|collective-permute|all-to-all)(?:-start)?\(")
_EDGE = re.compile(r"\b(calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"\bbranch_computations=\{([^}]*)\}")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def census(text: str) -> dict[str, int]:
    """Collective calls per run of the program, by kind, from its text alone. A loop's trips: its
    `known_trip_count` (XLA:CPU), else the one integer constant its condition compares with (the
    generated loops count from 0 by 1). XLA:TPU prints an async collective again in the fusions that
    continue it (`async_collective_fusion`s, the one ending in `AsyncCollectiveDone`): counted once."""
    own: dict[str, list[str]] = {}
    edges: dict[str, list[tuple[str, object]]] = {}
    bounds: dict[str, list[int]] = {}
    entry = current = None
    for line in text.splitlines():
        header = _HEADER.match(line) if line and not line[0].isspace() and not line.startswith("HloModule") else None
        if header:
            current = header.group(1)
            entry = current if line.startswith("ENTRY") else entry
            own[current], edges[current], bounds[current] = [], [], []
            continue
        if current is None or not line.startswith(" "):
            continue
        found = _COLLECTIVE.search(line.split("metadata=")[0])
        if found:  # XLA:TPU's reduce-scatter: an all-reduce and a slice in its `all-reduce-scatter` fusion
            own[current].append("reduce-scatter" if current.startswith("all-reduce-scatter") else found.group(1))
        if "AsyncCollectiveDone" in line or current.startswith("async_collective_fusion"):
            own[current] = []
        bound = re.search(r"= [su]32\[\]\S* constant\((\d+)\)", line)
        if bound:
            bounds[current].append(int(bound.group(1)))
        trips = _TRIPS.search(line)
        condition = re.search(r"\bcondition=%?([\w.\-]+)", line)
        for kind, callee in _EDGE.findall(line):
            times: object = 1
            if kind == "body":
                times = int(trips.group(1)) if trips else ("bound of", condition.group(1))
            edges[current].append((callee, times))
        branches = _BRANCHES.search(line)
        if branches:
            edges[current].extend((b.strip().lstrip("%"), 1) for b in branches.group(1).split(","))
    totals: dict[str, int] = {}

    def visit(computation: str, times: int) -> None:
        for op in own.get(computation, []):
            totals[op] = totals.get(op, 0) + times
        for callee, more in edges.get(computation, []):
            if isinstance(more, tuple):
                (more,) = set(bounds[more[1]])  # the condition's one bound
            visit(callee, times * more)

    visit(entry, 1)
    return totals


# --- the properties -----------------------------------------------------------------------------------

def collectives_per_step(example: Example, planned, **target) -> None:
    counted: dict[str, int] = {}
    for c in planned.collectives:
        assert c.count is not None, (example, c.groups_text)
        compiled_op = c.sliced_from or c.op  # XLA:CPU plans show the target's reduce-scatter, marked
        counted[compiled_op] = counted.get(compiled_op, 0) + c.count
    assert counted == census(planned.compiled.as_text()), example


def flops_of_every_trip(example: Example, planned, **target) -> None:
    if example.remat and example.grad:
        return  # unrolled, XLA:CPU merges the recomputation with the forward pass (memory chapter, section 2)
    unrolled = example.plan(unrolled=True, **target)
    assert " while(" not in unrolled.compiled.as_text()
    want = unrolled.compiled.cost_analysis()["flops"]
    assert unrolled.flops == want  # no loops: the plan's figure is XLA's
    # The looped and the unrolled programs are two programs: XLA may partition and fuse them a little
    # differently (an all-to-all for an all-reduce, a scan's backward writing each layer's gradient into
    # the stack). Their matmuls are the same; the rest is small beside them (tests/test_loop_census.py
    # checks simple loops to a few scalar FLOPs a trip). Counting one trip would be off by 2x or more.
    assert planned.flops == pytest.approx(want, rel=0.02), (example, planned.flops, want)


def asynchronous(text: str) -> set[str]:
    """The oracle for the schedule: computations whose collective runs asynchronously (an XLA:TPU async
    collective fusion's start, whose root is the custom-call AsyncCollectiveStart, or a `-start` op's)."""
    found, current = set(), None
    for line in text.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            current = line.split()[1 if line.startswith("ENTRY") else 0].lstrip("%")
        elif 'custom_call_target="AsyncCollectiveStart"' in line or re.search(
                r"(all-gather|all-reduce|collective-permute|reduce-scatter|all-to-all)-start\(", line):
            found.add(current)
    return found


def schedule_and_why(example: Example, planned, **target) -> None:
    """Each row's `overlapped` is the compiled schedule's (None for XLA:CPU, whose schedule is not the
    target's), and its `why` names the operation the instruction's own metadata names."""
    from jaxpar_magic.cell.hlo import collectives

    text = planned.compiled.as_text()
    found = collectives(text)
    assert len(found) == len(planned.collectives), example
    started = asynchronous(text)
    for f, c in zip(found, planned.collectives):
        if planned.target.is_cpu:
            assert c.overlapped is None, example
        else:
            assert c.overlapped == (f.computation in started), (example, f.name)
        line = next(l for l in text.splitlines() if re.match(rf"\s*(?:ROOT )?%?{re.escape(f.name)} = ", l))
        named = re.search(r'op_name="([^"]*)"', line)
        if named and c.why is not None:
            last = re.sub(r"\)+$", "", named.group(1).rsplit("/", 1)[-1]).rsplit("(", 1)[-1]
            assert c.why["op"] == last.removesuffix("_invariant"), (example, named.group(1), c.why)


PROPERTIES = (collectives_per_step, flops_of_every_trip, schedule_and_why)


@pytest.mark.slow
@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(examples())
def test_the_plan_is_the_compiled_programs(example):
    planned = example.plan()
    for check in PROPERTIES:
        check(example, planned)


TPU_HANDFUL = [
    Example("shard_map", "data=8", "scan", 3, 2, True, False, True, "all_gather", "data"),
    Example("shard_map", "data=4 model=2", "nested", 2, 3, False, True, False, "psum", "model"),
    Example("shard", "data=4 model=2", "fori", 5, 2, False, False, True, "none", "model"),
]


@pytest.mark.parametrize("example", TPU_HANDFUL, ids=lambda e: f"{e.magic}-{e.loop}-{e.collective}")
def test_the_plan_is_xla_tpus_program(example):
    require_libtpu()
    planned = example.plan(hardware="tpu-v5e", topology="2x4")
    assert planned.target.is_tpu
    for check in PROPERTIES:
        check(example, planned, hardware="tpu-v5e", topology="2x4")


# --- one instruction, one row -----------------------------------------------------------------------

COMBINED = "g = jax.grad(lambda v, c: jnp.mean(jnp.tanh(x @ v + c)), argnums=(0, 1))(w, b)\n"


def combined_namespace():
    mesh = make_mesh("data=8")  # Explicit axes: w's gradient keeps w's layout
    return mesh, {"jax": jax, "jnp": jnp, "x": plan((128, 64), "float32", mesh, ("data", None)),
                  "w": plan((64, 64), "float32", mesh, ("data", None)), "b": plan((64,), "float32", mesh, ())}


def test_a_combined_all_reduce_is_one_row_paying_its_latency_once():
    # XLA:CPU sums w's gradient (FSDP: each device keeps its rows) and b's (replicated) in one
    # all-reduce over a tuple. The plan showed the first as the target's reduce-scatter and the second
    # as an all-reduce: two rows for one instruction, its latency counted 1 + 2 times instead of 2.
    mesh, ns = combined_namespace()
    planned = jaxpar_magic.plan_cell(COMBINED, ns, magic="shard", mesh=mesh, bind=False, hardware="tpu-v5e",
                                     compiler="cpu")
    text = planned.compiled.as_text()
    (instruction,) = [line for line in text.splitlines() if re.search(r"= \(f32\[64,64\]\S*, f32\[64\]\S*\) all-reduce\(", line)]
    collectives_per_step("combined", planned)  # the census counts instructions, one line each
    (row,) = [c for c in planned.collectives if (c.sliced_from or c.op) == "all-reduce"]
    assert row.op == "reduce-scatter" and row.operands == 2 and "2 operands" in row.groups_text
    assert row.operand_bytes == 64 * 64 * 4 + 64 * 4 and row.bytes == 64 * 64 * 4 // 8 + 64 * 4
    (gather,) = [c for c in planned.collectives if c.op == "all-gather"]  # w's rows, gathered for the forward pass
    assert row.parts["latency"] == pytest.approx(2 * gather.parts["latency"])  # a reduce-scatter and a gather back
    assert row.seconds == pytest.approx(sum(row.parts.values()))
    assert "2 operands" in plan_view.to_text(planned.state("a plan"))


def test_report_says_how_many_operands_a_collective_instruction_moves(jx):
    jx.push({"jaxpar_magic": jaxpar_magic})
    jx.run_cell("mesh = jaxpar_magic.make_mesh('data=8')\n"
                "x = jnp.ones((128, 64)); w = jnp.ones((64, 64)); b = jnp.ones((64,))", store_history=False).raise_error()
    with capture_output() as captured:
        jx.run_cell_magic("shard", "--mesh mesh --in x=data w=data --report", COMBINED)
    (view,) = [w for w in shown_widgets(captured) if type(w).__name__ == "ResultView"]
    rows = [c for c in view.state["collectives"] if c["op"] == "all-reduce"]
    assert rows and all("2 operands" in c["groups_text"] for c in rows), rows
