"""Issue 29's own examples, planned through the real magics and checked against hand compiles.

Each case runs in its own Python (a fresh InteractiveShell, `%load_ext jaxpar_magic`, `%devices
--simulate N`), plans a cell with `%%shard --plan`, and compares the plan with an oracle: the same
function compiled by hand for the same slice (`jax.jit(f).lower(...).compile()` on
`jax.experimental.topologies`' devices): its memory_analysis(), cost_analysis() and HLO text; FLOPs
also against a hand count and against the same model with the scan unrolled. The models are the
issue's, scaled down so each XLA:TPU compile takes about a minute on two loaded cores.

    PYTHONPATH=$PWD .venv/bin/python bench/verify_plans.py [--only fsdp remat ...] [--jobs 3] [--json F]

Prints one row per (item, case): holds / DOES NOT HOLD, and the figures. About 14 min with --jobs 3
on 2 loaded cores (the FSDP case alone compiles four times: ~13 min); `--only mlp nofit multislice
cpu` takes about 4. Needs libtpu (ALLOW_MULTIPLE_LIBTPU_LOAD is set for the cases' Pythons).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# The transformer, scaled down: bf16, Adam, embedding -> scan of layers -> unembed.
MODEL = """
import math
import jax, jax.numpy as jnp, optax
from jax.sharding import NamedSharding, PartitionSpec as P
V, D, F, H, L, B, S = {V}, {D}, {F}, {H}, {L}, {B}, {S}
bf = jnp.bfloat16

def rms(x, scale):
    v = jnp.mean(x.astype(jnp.float32) ** 2, axis=-1, keepdims=True)
    return (x * jax.lax.rsqrt(v + 1e-6).astype(x.dtype)) * scale

def layer(x, p):
    h = rms(x, p["ln1"])
    q, k, v = (( h @ p[w]).reshape(B, S, H, D // H) for w in ("wq", "wk", "wv"))
    a = jnp.einsum("bshd,bthd->bhst", q, k) / math.sqrt(D // H)
    a = jnp.where(jnp.tril(jnp.ones((S, S), bool)), a.astype(jnp.float32), -1e9)
    a = jax.nn.softmax(a, axis=-1).astype(bf)
    x = x + jnp.einsum("bhst,bthd->bshd", a, v).reshape(B, S, D) @ p["wo"]
    h = rms(x, p["ln2"])
    return x + jax.nn.gelu(h @ p["w1"]) @ p["w2"], None

BODY = jax.checkpoint(layer) if {REMAT} else layer

def loss_fn(params, tokens):
    x = jax.lax.with_sharding_constraint(params["embed"][tokens], P("data"))  # FSDP: activations by batch
    if {UNROLL}:
        for i in range(L):
            x, _ = BODY(x, jax.tree.map(lambda w: w[i], params["layers"]))
    else:
        x, _ = jax.lax.scan(BODY, x, params["layers"])
    logits = (x @ params["unembed"]).astype(jnp.float32)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), jnp.roll(tokens, -1, 1)[..., None], -1))

opt = optax.adam(1e-4)

def train_step(params, opt_state, tokens):
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

def specs(tp):
    m = "model" if tp else None
    layers = dict(wq=P(None, "data", m), wk=P(None, "data", m), wv=P(None, "data", m), wo=P(None, m, "data"),
                  w1=P(None, "data", m), w2=P(None, m, "data"), ln1=P(), ln2=P())
    return dict(embed=P("data", m), layers=layers, unembed=P("data", m))

def shapes():
    layers = dict(wq=(L, D, D), wk=(L, D, D), wv=(L, D, D), wo=(L, D, D), w1=(L, D, F), w2=(L, F, D),
                  ln1=(L, D), ln2=(L, D))
    return dict(embed=(V, D), layers=layers, unembed=(D, V))

def abstract(mesh, tp):
    sd = lambda shape, spec, dt=bf: jax.ShapeDtypeStruct(shape, dt, sharding=NamedSharding(mesh, spec))
    params = jax.tree.map(sd, shapes(), specs(tp), is_leaf=lambda s: isinstance(s, tuple) and all(isinstance(i, int) for i in s))
    adam = jax.eval_shape(opt.init, params)[0]
    adam = adam._replace(count=sd((), P(), jnp.int32), mu=params, nu=params)
    state = (adam,) + jax.eval_shape(opt.init, params)[1:]
    return params, state, sd((B, S), P("data", None), jnp.int32)
"""

# The 8-layer bf16 MLP (FSDP over 16 devices), and the same made too big for a v5e 4x4.
MLP = """
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
N, W, ROWS = 8, {W}, {ROWS}

def mlp_loss(ws, x):
    for w in ws:
        x = jax.nn.relu(x @ w)
    return jnp.mean(x.astype(jnp.float32) ** 2)

def mlp_step(ws, x):
    g = jax.grad(mlp_loss)(ws, x)
    return [w - (0.01 * gw).astype(w.dtype) for w, gw in zip(ws, g)]

def mlp_abstract(mesh, axis="data"):
    sd = lambda shape, spec: jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, spec))
    return [sd((W, W), P(axis, None)) for _ in range(N)], sd((ROWS, W), P(axis, None))
"""

SMALL = dict(V=8192, D=1024, F=4096, H=8, L=4, B=32, S=512)


def hand_flops(c: dict, remat: bool) -> float:
    """The step's matmul FLOPs over all devices: 2·m·n·k per matmul; backward twice the forward; with
    remat each layer's forward once more. Attention's two einsums are 2·2·B·S²·D per layer."""
    T = c["B"] * c["S"]
    layer = 2 * T * (4 * c["D"] ** 2 + 2 * c["D"] * c["F"]) + 4 * c["B"] * c["S"] ** 2 * c["D"]
    unembed = 2 * T * c["D"] * c["V"]
    forward = c["L"] * layer + unembed
    last = 2 * T * c["D"] * c["F"]  # remat needs no recompute of a layer's last matmul (its backward does not read it)
    return 3 * forward + (c["L"] * (layer - last) if remat else 0)


# ----------------------------------------------------------------------------------------------
# One case, in a fresh Python.

def shell(devices: int):
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    ip = InteractiveShell.instance(history_length=0)
    with capture_output():
        ip.run_line_magic("load_ext", "jaxpar_magic")
        ip.run_line_magic("devices", f"--simulate {devices}")
    return ip


def run(ip, source: str):
    ip.run_cell(textwrap.dedent(source), store_history=False).raise_error()


def magic(ip, line: str, cell: str):
    from IPython.utils.capture import capture_output

    t = time.perf_counter()
    with capture_output() as captured:
        ip.run_cell_magic("shard", line, cell)
    return ip.user_ns["_plan"], time.perf_counter() - t, captured


def tpu_mesh(topology: str, shape: tuple, names: tuple, slices: int = 1):
    from jax.experimental import topologies

    devices = topologies.get_topology_desc(platform="tpu", topology_name=f"v5e:{topology}",
                                           num_slices=slices) if slices > 1 else \
        topologies.get_topology_desc(platform="tpu", topology_name=f"v5e:{topology}")
    return topologies.make_mesh(devices, shape, names)


def moved(tree, mesh):
    import jax
    from jax.sharding import NamedSharding

    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=NamedSharding(mesh, s.sharding.spec)), tree)


def hand(f, args, donate=()):
    import jax

    t = time.perf_counter()
    mesh = jax.tree.leaves(args)[0].sharding.mesh
    with jax.set_mesh(mesh):
        compiled = jax.jit(f, donate_argnums=donate).lower(*args).compile()
    return compiled, time.perf_counter() - t


_DEFINED = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*\w+\[([\d,]*)\]")
_DOT = re.compile(r"=\s*\w+\[([\d,]*)\]\S*\s+dot\(%?([\w.\-]+),.*?lhs_contracting_dims=\{([\d,]*)\}")
_CALLED = re.compile(r"\b(?:to_apply|calls)=%?([\w.\-]+)")


def dot_flops(hlo: str) -> float:
    """2 x (result elements) x (contracted elements) for every dot of a program without loops (the lowered,
    unpartitioned program: global FLOPs), read from its text alone: each computation's dots times the
    calls that reach it from the entry (JAX lowers jnp.matmul, einsum, ... as called computations)."""
    assert " while(" not in hlo, "dot_flops counts a straight-line program"
    shapes, dots, callees, entry, current = {}, {}, {}, None, None
    for line in hlo.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{") and not line.startswith("HloModule"):
            words = line.split()
            current = (words[1] if words[0] == "ENTRY" else words[0]).lstrip("%")
            entry = current if words[0] == "ENTRY" else entry
            continue
        defined = _DEFINED.match(line)
        if defined:
            shapes[(current, defined.group(1))] = [int(d) for d in defined.group(2).split(",") if d]
        dot = _DOT.search(line)
        if dot:
            result = math.prod(int(d) for d in dot.group(1).split(",") if d)
            lhs = shapes[(current, dot.group(2))]
            contracted = math.prod(lhs[int(i)] for i in dot.group(3).split(",") if i)
            dots[current] = dots.get(current, 0) + 2 * result * contracted
        for callee in _CALLED.findall(line):
            callees.setdefault(current, []).append(callee)

    def total(computation: str) -> float:
        return dots.get(computation, 0) + sum(total(c) for c in callees.get(computation, []))

    return float(total(entry))


def census(hlo: str) -> dict:
    """Collective instructions in the program's text, by kind (a -start counted once, a -done not), as
    tests/test_plan_differential.py's census reads them, without the trip counts."""
    kinds, current = {}, ""
    for line in hlo.splitlines():
        if line and not line[0].isspace():  # a computation's header
            current = line.removeprefix("ENTRY ").lstrip("%")
            continue
        m = re.search(r" (all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)(-start)?\(",
                      line.split("metadata=")[0])
        if m:  # XLA:TPU's reduce-scatter: an all-reduce and a slice in its `all-reduce-scatter` fusion
            kind = "reduce-scatter" if current.startswith("all-reduce-scatter") else m.group(1)
            kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def peak_rows(plan) -> dict:
    p = plan.peak
    rows = sum(b.bytes for b in p.buffers) + p.other_bytes + sum(n for n, _ in p.reserve)
    return {"rows_sum": rows, "reported": p.reported, "total": plan.total_bytes, "other": p.other_bytes,
            "other_share": round(p.other_bytes / max(1, p.reported), 3),
            "roles": [b.role for b in p.buffers], "names": [b.name for b in p.buffers],
            "ops": [b.op for b in p.buffers], "lines": [b.line for b in p.buffers]}


def memory(plan, compiled) -> dict:
    m = compiled.memory_analysis()
    own = plan.compiled.memory_analysis() if plan.compiled is not None else None
    return {"plan_compiled": [own.argument_size_in_bytes, own.output_size_in_bytes, own.temp_size_in_bytes,
                              own.alias_size_in_bytes] if own is not None else None,
            "plan": [plan.argument_bytes, plan.output_bytes, plan.temp_bytes, plan.alias_bytes],
            "hand": [m.argument_size_in_bytes, m.output_size_in_bytes, m.temp_size_in_bytes, m.alias_size_in_bytes]}


def text_lines(plan) -> dict:
    from jaxpar_magic.views import plan as plan_view

    text = plan_view.to_text(plan.state("plan"))
    return {"cut": text.count("…"), "widest": max(len(line) for line in text.splitlines()),
            "has_line_refs": bool(re.search(r"line \d+", text)), "text": text}


def model_ns(ip, c: dict, remat=False, unroll=False):
    run(ip, MODEL.format(**c, REMAT=remat, UNROLL=unroll))


def case_transformer(kind: str) -> dict:
    """fsdp / remat / fsdp_tp on a v5e 4x4, --donate params opt_state."""
    import jax

    ip = shell(16)
    tp, remat = kind == "fsdp_tp", kind == "remat"
    axes = ("data=4 model=4" if tp else "data=16")
    run(ip, f"%mesh {axes} --axis-types auto --no-show")
    model_ns(ip, SMALL, remat=remat)
    run(ip, f"params, opt_state, tokens = abstract(mesh, {tp})")
    plan, plan_s, captured = magic(ip, "--plan --mesh mesh --hardware tpu-v5e --topology 4x4 --donate params opt_state",
                                   "params, opt_state, loss = train_step(params, opt_state, tokens)")
    ns = ip.user_ns
    grid = tpu_mesh("4x4", (4, 4) if tp else (16,), ("data", "model") if tp else ("data",))
    args = moved(ns["abstract"](ns["mesh"], tp), grid)
    compiled, hand_s = hand(ns["train_step"], args, donate=(0, 1))
    out = {"case": kind, "plan_s": round(plan_s, 1), "hand_s": round(hand_s, 1), "memory": memory(plan, compiled),
           "flops_plan": plan.flops, "flops_hand_cost": compiled.cost_analysis().get("flops"),
           "flops_hand_count_per_device": hand_flops(SMALL, remat) / 16,
           "collectives": [(c.op, c.count, c.group_size, c.over_dcn, (c.origin or {}).get("what") if isinstance(c.origin, dict) else None)
                           for c in plan.collectives],
           "unknown_counts": sum(1 for c in plan.collectives if c.count is None),
           "census": census(compiled.as_text()), "census_plan": census(plan.compiled.as_text()),
           "peak": peak_rows(plan), "notes": plan.memory_notes(),
           "summary": plan.summary(), "vmem": plan.peak.elsewhere if plan.peak else None,
           "text": text_lines(plan)}
    out["flops_unrolled_dots"] = unrolled_dots(ip, remat, tp)
    return out


def unrolled_dots(ip, remat: bool, tp: bool) -> float:
    """FLOPs per device of the step's dots, counted exactly in the same model with its scan unrolled, as
    JAX lowers it (before XLA: no loops, not even XLA:TPU's windowed einsums, whose loops a compiled
    unrolled program still has and whose cost analysis then counts once)."""
    import jax

    model_ns(ip, SMALL, remat=remat, unroll=True)
    ns = ip.user_ns
    with jax.set_mesh(ns["mesh"]):
        lowered = jax.jit(ns["train_step"]).lower(*ns["abstract"](ns["mesh"], tp))
    return dot_flops(lowered.as_text(dialect="hlo")) / ns["mesh"].size


def case_fsdp_flops() -> dict:
    """Items 5 and 11 for the FSDP step alone: the plan's FLOPs against the unrolled program's exact dot
    count, and its rows at the peak."""
    ip = shell(16)
    run(ip, "%mesh data=16 --axis-types auto --no-show")
    model_ns(ip, SMALL)
    run(ip, "params, opt_state, tokens = abstract(mesh, False)")
    plan, plan_s, _ = magic(ip, "--plan --mesh mesh --hardware tpu-v5e --topology 4x4 --donate params opt_state",
                            "params, opt_state, loss = train_step(params, opt_state, tokens)")
    t = time.perf_counter()
    dots = unrolled_dots(ip, False, False)
    return {"case": "fsdp_flops", "plan_s": round(plan_s, 1), "flops_plan": plan.flops, "compiler": plan.compiler,
            "flops_unrolled_dots": dots, "dots_s": round(time.perf_counter() - t, 1),
            "flops_hand_count_per_device": hand_flops(SMALL, False) / 16, "peak": peak_rows(plan),
            "text": text_lines(plan)}


def case_mlp() -> dict:
    ip = shell(16)
    run(ip, "%mesh data=16 --axis-types auto --no-show")
    run(ip, MLP.format(W=4096, ROWS=4096))
    run(ip, "ws, x = mlp_abstract(mesh)")
    plan, plan_s, _ = magic(ip, "--plan --mesh mesh --hardware tpu-v5e --topology 4x4", "ws = mlp_step(ws, x)")
    ns = ip.user_ns
    compiled, hand_s = hand(ns["mlp_step"], moved(ns["mlp_abstract"](ns["mesh"]), tpu_mesh("4x4", (16,), ("data",))))
    run(ip, "ws, x = mlp_abstract(mesh)")  # --plan bound ws as planned: the same inputs again
    again, again_s, _ = magic(ip, "--plan --mesh mesh --hardware tpu-v5e --topology 4x4", "ws = mlp_step(ws, x)")
    run(ip, "ws, x = mlp_abstract(mesh)")
    donated, _, _ = magic(ip, "--plan --mesh mesh --hardware tpu-v5e --topology 4x4 --donate ws", "ws = mlp_step(ws, x)")
    compiled_d, _ = hand(ns["mlp_step"], moved(ns["mlp_abstract"](ns["mesh"]), tpu_mesh("4x4", (16,), ("data",))), donate=(0,))
    return {"case": "mlp", "plan_s": round(plan_s, 1), "reused": [again.reused, again.state("p")["compiled"], round(again_s, 2)], "hand_s": round(hand_s, 1), "memory": memory(plan, compiled),
            "memory_donated": memory(donated, compiled_d), "donated_notes": donated.memory_notes(),
            "peak": peak_rows(plan), "vmem": plan.peak.elsewhere, "notes": plan.memory_notes(),
            "xla_peak": plan.xla_peak_bytes, "census": census(compiled.as_text()),
            "census_plan": census(plan.compiled.as_text()),
            "collectives": [(c.op, c.count, c.group_size) for c in plan.collectives],
            "unknown_counts": sum(1 for c in plan.collectives if c.count is None), "text": text_lines(plan)}


def case_nofit() -> dict:
    ip = shell(16)
    run(ip, "%mesh data=16 --axis-types auto --no-show")
    run(ip, MLP.format(W=16384, ROWS=1048576))
    run(ip, "ws, x = mlp_abstract(mesh)")
    plan, plan_s, captured = magic(ip, "--plan --mesh mesh --hardware tpu-v5e --topology 4x4", "ws = mlp_step(ws, x)")
    from jaxpar_magic.views import plan as plan_view

    text = plan_view.to_text(plan.state("plan"))
    return {"case": "nofit", "plan_s": round(plan_s, 1), "refused": plan.refused, "summary": plan.summary(),
            "buffers": len(plan.peak.buffers) if plan.peak else 0,
            "lines": [b.line for b in plan.peak.buffers] if plan.peak else [],
            "timeline": len(plan.peak.timeline) if plan.peak else 0,
            "advice_memory": bool(re.search(r"remat|jax\.checkpoint", text)),
            "advice_offer": "Google Cloud offers" in text, "text": text}


def case_multislice() -> dict:
    ip = shell(32)
    run(ip, "%mesh data=32 --axis-types auto --no-show")
    run(ip, MLP.format(W=4096, ROWS=8192))
    run(ip, "ws, x = mlp_abstract(mesh)")
    plan, plan_s, _ = magic(ip, "--plan --mesh mesh --hardware tpu-v5e --topology 4x4", "ws = mlp_step(ws, x)")
    r = plan.roofline
    return {"case": "multislice", "plan_s": round(plan_s, 1),
            "collectives": [(c.op, c.count, c.group_size, c.over_dcn, c.bound) for c in plan.collectives],
            "dcn_s": r.dcn_s, "ici_s": r.ici_s, "bound": r.bound, "bound_text": r.bound_text,
            "census": census(plan.compiled.as_text()) if plan.compiled is not None else None,
            "megascale": len(re.findall(r"megascale", plan.compiled.as_text(), re.I)) if plan.compiled is not None else None}


def case_cpu() -> dict:
    """XLA:CPU: the bf16 transformer for an H100 (bf16 copies note), the ZeRO-3 scan's collectives
    against the program's census (item 1), --out @specs (item 12)."""
    ip = shell(8)
    run(ip, "%mesh data=8 --axis-types auto --no-show")
    c = dict(SMALL, L=8)
    model_ns(ip, c, remat=True)
    run(ip, "params, opt_state, tokens = abstract(mesh, False)")
    plan, plan_s, _ = magic(ip, "--plan --mesh mesh --hardware h100", "params, opt_state, loss = train_step(params, opt_state, tokens)")
    ns = ip.user_ns
    compiled, hand_s = hand(ns["train_step"], ns["abstract"](ns["mesh"], False))
    hlo = compiled.as_text()
    plan_kinds = {}  # by the program's own kind (XLA:CPU's all-reduce shown as the target's reduce-scatter)
    for col in plan.collectives:
        plan_kinds[col.sliced_from or col.op] = plan_kinds.get(col.sliced_from or col.op, 0) + 1
    trips = sorted({col.count for col in plan.collectives})
    # item 12: a P() scale stays P() with --out @specs
    ns["jaxpar_magic"] = __import__("jaxpar_magic")
    run(ip, """
        state = {"w": jaxpar_magic.plan((1024, 1024), "float32", mesh, (None, "data")),
                 "scale": jaxpar_magic.plan((1024,), "float32", mesh, ())}
        specs = {"w": P(None, "data"), "scale": P()}
    """)
    cell = 'state = {"w": state["w"] * 2, "scale": state["scale"] * state["w"].sum(0)}'
    free, _, _ = magic(ip, "--plan --mesh mesh", cell)
    free_spec = free.abstract["state"]["scale"].sharding.spec
    run(ip, """
        state = {"w": jaxpar_magic.plan((1024, 1024), "float32", mesh, (None, "data")),
                 "scale": jaxpar_magic.plan((1024,), "float32", mesh, ())}
    """)
    pinned, _, _ = magic(ip, "--plan --mesh mesh --out state=@specs", cell)
    model_ns(ip, c, remat=True, unroll=True)
    unrolled, _ = hand(ns["train_step"], ns["abstract"](ns["mesh"], False))
    return {"case": "cpu", "flops_unrolled_cost": unrolled.cost_analysis().get("flops"),
            "flops_hand_cost": compiled.cost_analysis().get("flops"), "plan_s": round(plan_s, 1), "hand_s": round(hand_s, 1), "memory": memory(plan, compiled),
            "upcast": [plan.peak.upcast_bytes, plan.peak.upcast_count, plan.total_bytes],
            "notes": plan.memory_notes(), "plan_kinds": plan_kinds,
            "collectives": [(col.op, col.shape, col.count, col.sliced_from, col.line) for col in plan.collectives],
            "census": census(hlo), "census_plan": census(plan.compiled.as_text()), "trips": trips,
            "flops_plan": plan.flops, "flops_hand_count_per_device": hand_flops(c, True) / 8,
            "peak": peak_rows(plan), "free_scale": str(free_spec), "pinned_scale": str(pinned.abstract["state"]["scale"].sharding.spec)}


CASES = {"fsdp": lambda: case_transformer("fsdp"), "remat": lambda: case_transformer("remat"),
         "fsdp_tp": lambda: case_transformer("fsdp_tp"), "mlp": case_mlp, "nofit": case_nofit,
         "multislice": case_multislice, "cpu": case_cpu, "fsdp_flops": case_fsdp_flops}


def child(name: str) -> None:
    out = CASES[name]()
    print("RESULT " + json.dumps(out, default=str))


def _gib(n) -> str:
    return f"{n / 2**30:.3f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def _same(a, b, tol=0.0) -> bool:
    return a is not None and b is not None and abs(a - b) <= tol * max(abs(b), 1)


def checks(r: dict) -> list[tuple[str, str, bool, str]]:
    """(item, case, holds, figures) for every figure the issue names."""
    rows = []
    add = lambda item, case, ok, text: rows.append((item, case, bool(ok), text))
    cpu, mlp, nofit, multi = r.get("cpu", {}), r.get("mlp", {}), r.get("nofit", {}), r.get("multislice", {})
    if "plan_kinds" in cpu:
        own = cpu.get("census_plan", cpu["census"])
        add("1 collectives once, per trip", "cpu zero-3", cpu["plan_kinds"] == own,
            f"plan {cpu['plan_kinds']} vs its program {own} (hand compile {cpu['census']}); calls per step {cpu['trips']}")
    for name in ("fsdp", "remat", "fsdp_tp", "mlp"):
        c = r.get(name, {})
        if "collectives" not in c:
            continue
        permutes = [x for x in c["collectives"] if x[0] == "collective-permute"]
        add("2 no loop of unknown length", name, c["unknown_counts"] == 0,
            f"{c['unknown_counts']} of {len(c['collectives'])} unknown; {len(permutes)} permutes")
        kinds = {x[0] for x in c["collectives"]}
        own = c.get("census_plan", c["census"])
        add("3 only kinds XLA:TPU made", name, kinds <= set(own),
            f"plan {sorted(kinds)} vs its program {own} (hand compile {c['census']})")
    if "dcn_s" in multi:
        dcn = [x for x in multi["collectives"] if x[3]]
        add("4 DCN stage listed and costed", "multislice 32", dcn and multi["dcn_s"] > 0 and multi["bound"] != "ici" or
            (dcn and multi["dcn_s"] > 0), f"{len(dcn)} DCN rows, dcn {multi['dcn_s'] * 1e3:.3g} ms, ici "
            f"{multi['ici_s'] * 1e3:.3g} ms, bound by {multi['bound_text']}; megascale in HLO {multi['megascale']}")
    for name in ("fsdp", "fsdp_flops", "remat", "fsdp_tp", "cpu"):
        c = r.get(name, {})
        if c.get("flops_plan") is None:
            continue
        ref, dots = c.get("flops_unrolled_cost"), c.get("flops_unrolled_dots")
        hand = hand_flops(dict(SMALL, L=8) if name == "cpu" else SMALL, name in ("remat", "cpu")) / (8 if name == "cpu" else 16)
        text = f"plan {c['flops_plan'] / 1e12:.4f} T, hand count {hand / 1e12:.4f} T"
        if dots is not None:  # XLA:TPU: the unrolled program's exact dots; the plan adds elementwise work and Adam
            text += f", unrolled program's dots {dots / 1e12:.4f} T (plan {c['flops_plan'] / dots - 1:+.2%})"
            ok = dots <= c["flops_plan"] <= 1.03 * dots
        elif ref is not None:  # XLA:CPU: the unrolled compile has no loops, so its cost analysis counts it whole
            text += f", unrolled compile {ref / 1e12:.4f} T, scan compile {c['flops_hand_cost'] / 1e12:.4f} T"
            ok = _same(c["flops_plan"], ref, 0.01)
        else:
            ok = _same(c["flops_plan"], hand, 0.03)
        add("5 FLOPs of every trip", name, ok, text)
    for name in ("fsdp", "remat", "fsdp_tp"):
        c = r.get(name, {})
        if "memory" in c:
            pl, hd = c["memory"]["plan"], c["memory"]["hand"]
            add("6 --donate planned as donate_argnums", name, pl[0] == hd[0] and pl[1] == hd[1] and pl[3] == hd[3]
                and abs(pl[2] - hd[2]) <= 0.0035 * hd[2],
                f"plan arg/out/temp/alias {c['memory']['plan']} vs hand {c['memory']['hand']}")
    if "memory_donated" in mlp:
        add("6 --donate planned as donate_argnums", "mlp", mlp["memory_donated"]["plan"] == mlp["memory_donated"]["hand"]
            and any("donated" in n for n in mlp["donated_notes"]),
            f"plan {mlp['memory_donated']['plan']} vs hand {mlp['memory_donated']['hand']}; note: {mlp['donated_notes'][:1]}")
    for name in ("fsdp", "mlp"):
        c = r.get(name, {})
        if "memory" in c:
            m = c["memory"]
            add("7 HBM temporaries = memory_analysis()", name, m["plan"][2] == m["plan_compiled"][2] and
                abs(m["plan"][2] - m["hand"][2]) <= 0.0035 * m["hand"][2],
                f"plan {m['plan'][2]} B, its program's memory_analysis() {m['plan_compiled'][2]} B, hand compile "
                f"{m['hand'][2]} B; other spaces {c['vmem']}")
    for name in ("fsdp", "remat", "fsdp_tp", "mlp", "cpu"):
        p = r.get(name, {}).get("peak")
        if p:
            add("8 rows add up to the peak", name, p["rows_sum"] == p["reported"] == p["total"],
                f"rows {_gib(p['rows_sum'])}, peak {_gib(p['reported'])}, plan total {_gib(p['total'])}")
    if "refused" in nofit:
        add("9 a step that does not fit gets a plan", "nofit", nofit["refused"] and "does not fit: needs" in nofit["summary"]
            and nofit["buffers"] and any(nofit["lines"]) and nofit["advice_memory"] and not nofit["advice_offer"],
            f"{nofit['summary']}; {nofit['buffers']} rows, lines {nofit['lines'][:4]}, timeline {nofit['timeline']} "
            f"points, remat advice {nofit['advice_memory']}, 'slice Google Cloud offers' {nofit['advice_offer']}")
    if "upcast" in cpu:
        up, count, total = cpu["upcast"]
        said = [n for n in cpu["notes"] if "f32" in n]
        add("10 XLA:CPU bf16 copies said", "cpu h100", up > 0 and said,
            f"{_gib(up)} in {count} copies of {_gib(total)}; note: {said[:1]}")
    for name in ("fsdp", "fsdp_flops", "fsdp_tp", "mlp", "cpu"):
        c = r.get(name, {})
        p = c.get("peak")
        if not p:
            continue
        gathered = [x for x in p["roles"] if x and x.startswith("all-gather of")]
        unnamed = [op for op, role, n in zip(p["ops"], p["roles"], p["names"]) if not role and not n]
        top = all(role or n for role, n in list(zip(p["roles"], p["names"]))[:3])
        add("11 largest 3 rows say what they are", name, top and p["other_share"] <= 0.10,
            f"rows with no role: {unnamed} (None: a group of arguments); 'all-gather of' rows {gathered[:2]}; "
            f"other {p['other_share']:.1%} of the peak")
        t = c.get("text")
        if t:  # the rows: from "What fills memory" to the FLOPs line
            rows_text = t["text"].split("What fills memory", 1)[-1].split("Per device: FLOPs")[0].splitlines()[1:]
            widest = max(len(line) for line in rows_text)
            add("11 80-column text wraps rows", name, widest <= 80 and not any("…" in x for x in rows_text),
                f"rows: widest line {widest}, none cut; elsewhere widest {t['widest']} (collectives, caveats)")
    if "pinned_scale" in cpu:
        add("12 --out @specs keeps P()", "cpu", cpu["pinned_scale"] in ("P()", "PartitionSpec()"),
            f"free {cpu['free_scale']}, pinned {cpu['pinned_scale']}")
    if "reused" in mlp:
        reused = mlp["reused"]
        add("12 a reused plan says so", "mlp", reused[0] and reused[1] == "reused", f"{reused}")
    return rows


def table(results: dict) -> str:
    lines = [f"{'item':<40} {'case':<14} {'':<13} figures"]
    for item, case, ok, text in checks(results):
        lines.append(f"{item:<40} {case:<14} {'holds' if ok else 'DOES NOT HOLD':<13} {text}")
    for name, r in results.items():
        if "error" in r:
            lines.append(f"{'(case failed)':<40} {name:<14} {'ERROR':<13} {r['error'][-400:]}")
        elif "plan_s" in r:
            lines.append(f"{'(compile time)':<40} {name:<14} {'':<13} plan {r['plan_s']} s, hand {r.get('hand_s')} s")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case")
    parser.add_argument("--only", nargs="*", default=[c for c in CASES if c != "fsdp_flops"])  # fsdp_flops: item 5 alone
    parser.add_argument("--json", help="write every case's figures here")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the --json file's other cases")
    parser.add_argument("--table", help="print the table of a --json file again")
    a = parser.parse_args()
    if a.case:
        return child(a.case)
    if a.table:
        with open(a.table) as f:
            return print(table(json.load(f)))
    env = dict(os.environ, ALLOW_MULTIPLE_LIBTPU_LOAD="1", TPU_SKIP_MDS_QUERY="1")
    def one(name):
        t = time.perf_counter()
        p = subprocess.run([sys.executable, __file__, "--case", name], capture_output=True, text=True, env=env, timeout=900)
        found = [line[7:] for line in p.stdout.splitlines() if line.startswith("RESULT ")]
        print(f"[{name}: {time.perf_counter() - t:.0f} s]", file=sys.stderr, flush=True)
        return name, json.loads(found[-1]) if found else {"error": (p.stderr or p.stdout)[-3000:]}

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(a.jobs) as pool:  # each case is its own Python; XLA:TPU compiles use one core each
        results = dict(pool.map(one, a.only))
    if a.json and a.keep and os.path.exists(a.json):  # --keep: the other cases' figures from an earlier run
        with open(a.json) as f:
            results = {**json.load(f), **results}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    print(table(results))


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    main()
