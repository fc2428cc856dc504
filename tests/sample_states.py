"""Sample view states computed independently of the package (an oracle for the views' tests)."""
from __future__ import annotations

from typing import Any


def sharding_state(
    shape: list[int],
    mesh: list[tuple[str, int]],
    spec: list[Any],
    *,
    dtype: str = "float32",
    name: str = "x",
) -> dict[str, Any]:
    """A sharding state computed the way jax does for evenly divisible shapes."""
    import itertools

    sizes = dict(mesh)
    names = [a for a, _ in mesh]
    entries = [[] if e is None else ([e] if isinstance(e, str) else list(e)) for e in spec]
    entries += [[]] * (len(shape) - len(entries))
    grid = [1] * len(shape)
    for k, e in enumerate(entries):
        for a in e:
            grid[k] *= sizes[a]
    used = {a for e in entries for a in e}
    holders: dict[tuple[int, ...], list[int]] = {}
    total = 1
    for _, s in mesh:
        total *= s
    for dev, coords in enumerate(itertools.product(*[range(s) for _, s in mesh])):
        at = dict(zip(names, coords))
        block = []
        for e in entries:
            b = 0
            for a in e:
                b = b * sizes[a] + at[a]
            block.append(b)
        holders.setdefault(tuple(block), []).append(dev)
    # The compact form summaries.sharding_state sends: cut points per dimension, then who holds
    # each block in row-major order (an id, or a list when several devices hold it).
    bounds = [[b * (d // g) for b in range(g + 1)] for d, g in zip(shape, grid)]
    blocks = [
        devs[0] if len(devs) == 1 else devs
        for devs in (holders[key] for key in itertools.product(*[range(g) for g in grid]))
    ]
    nbytes = 4
    for d in shape:
        nbytes *= d
    return {
        "name": name,
        "shape": shape,
        "dtype": dtype,
        "spec": spec,
        "mesh_axes": [{"name": a, "size": s} for a, s in mesh],
        "grid": grid,
        "bounds": bounds,
        "blocks": blocks,
        "replicated_over": [a for a in names if a not in used],
        "total_devices": total,
        "abstract": False,
        "process_count": 1,
        "nbytes": nbytes,
    }


# ---------------------------------------------------------------------------------------------
# Collective cards (views/collectives.py, js/collectives.js): computed here with numpy from the
# collectives' definitions, independently of the package's recorder.

_SHORT_DTYPE = {"float32": "f32", "int32": "s32", "float16": "f16", "bfloat16": "bf16"}


def _short_shape(arr: Any) -> str:
    return f"{_SHORT_DTYPE.get(str(arr.dtype), str(arr.dtype))}[{','.join(str(s) for s in arr.shape)}]"


def collective_tile(device: int, value: Any) -> dict[str, Any]:
    """A tile as the schema has it: compact text, the first 64 values, a heat map for 2-D+."""
    import numpy as np

    arr = np.asarray(value)
    flat = arr.reshape(-1)
    if arr.ndim == 0:
        text = f"{flat[0]:g}"
    else:
        text = "[" + " ".join(f"{v:g}" for v in flat[:6]) + (" …]" if flat.size > 6 else "]")
    heat = None
    if arr.ndim >= 2 and arr.size:
        grid = arr.reshape(-1, arr.shape[-1]).astype(float)
        rows, cols = min(16, grid.shape[0]), min(16, grid.shape[1])
        means = [
            [float(grid[r * grid.shape[0] // rows : (r + 1) * grid.shape[0] // rows,
                        c * grid.shape[1] // cols : (c + 1) * grid.shape[1] // cols].mean()) for c in range(cols)]
            for r in range(rows)
        ]
        values = [v for row in means for v in row]
        heat = {"rows": rows, "cols": cols, "values": values, "min": min(values), "max": max(values)}
    return {"device": device, "shape": list(arr.shape), "dtype": str(arr.dtype), "text": text,
            "values": [float(v) for v in flat[:64]], "heat": heat}


def _ring(group: list[int], offset, reduce: bool, steps: int, label: str) -> list[dict[str, Any]]:
    """Ring steps: at step s the device at position p sends block offset(p, s) to position p+1."""
    n = len(group)
    return [
        {"label": f"{label} step {s + 1} of {steps}",
         "transfers": [{"src": group[p], "src_block": offset(p, s) % n, "dst": group[(p + 1) % n],
                        "dst_block": offset(p, s) % n, "reduce": reduce} for p in range(n)]}
        for s in range(steps)
    ]


def collective_card(
    op: str,
    n: int = 8,
    *,
    groups: list[list[int]] | None = None,
    shape: tuple[int, ...] = (4,),
    tiled: bool = False,
    perm: list[list[int]] | None = None,
    index: int = 0,
    line: int | None = 3,
    source: str | None = None,
    count: int = 1,
    axis: str = "i",
) -> dict[str, Any]:
    """One card for `op` over `n` devices: values by numpy, movement and bytes by definition."""
    import numpy as np

    groups = groups or [list(range(n))]
    base = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    xs = {d: base + 10 * d for d in range(n)}
    group_of = {d: g for g in groups for d in g}
    after: dict[int, Any] = {}
    transfers: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    blocks = 1
    kind = {"psum": "all-reduce", "pmean": "all-reduce", "pmax": "all-reduce", "pmin": "all-reduce",
            "all_gather": "all-gather", "psum_scatter": "reduce-scatter", "all_to_all": "all-to-all",
            "ppermute": "permute", "axis_index": "none"}[op]
    itemsize = 4
    size = int(np.prod(shape)) * itemsize
    sent = {d: 0 for d in range(n)}
    received = {d: 0 for d in range(n)}
    params: dict[str, Any] = {}
    drawn = list(range(n))[:16]
    for d in range(n):
        g = group_of[d]
        k = len(g)
        pos = g.index(d)
        if d not in drawn and kind != "permute":  # bytes only (values and transfers are drawn for the first 16)
            share = {"all-reduce": 2 * (k - 1) * size // k, "all-gather": (k - 1) * size}.get(kind, (k - 1) * size // k)
            sent[d] = received[d] = 0 if kind == "none" else share
            continue
        if kind == "all-reduce":
            fn = {"psum": np.sum, "pmean": np.mean, "pmax": np.max, "pmin": np.min}[op]
            after[d] = fn(np.stack([xs[e] for e in g]), axis=0)
            transfers += [{"src": e, "src_block": 0, "dst": d, "dst_block": 0, "reduce": True} for e in g]
            sent[d] = received[d] = 2 * (k - 1) * size // k
        elif kind == "all-gather":
            params = {"tiled": tiled, "axis": 0}
            parts = [xs[e] for e in g]
            after[d] = np.concatenate(parts) if tiled else np.stack(parts)
            transfers += [{"src": e, "src_block": 0, "dst": d, "dst_block": g.index(e), "reduce": False} for e in g]
            blocks = k
            sent[d] = received[d] = (k - 1) * size
        elif kind == "reduce-scatter":
            params = {"tiled": tiled, "scatter_dimension": 0}
            total = np.sum(np.stack([xs[e] for e in g]), axis=0)
            piece = np.split(total, k)[pos]
            after[d] = piece if tiled else piece.reshape(piece.shape[1:])
            transfers += [{"src": e, "src_block": pos, "dst": d, "dst_block": 0, "reduce": True} for e in g]
            blocks = k
            sent[d] = received[d] = (k - 1) * size // k
        elif kind == "all-to-all":
            params = {"split_axis": 0, "concat_axis": 0}
            after[d] = np.concatenate([np.split(xs[e], k)[pos] for e in g])
            transfers += [{"src": e, "src_block": pos, "dst": d, "dst_block": g.index(e), "reduce": False} for e in g]
            blocks = k
            sent[d] = received[d] = (k - 1) * size // k
        elif kind == "permute":
            pairs = perm if perm is not None else [[p, (p + 1) % k] for p in range(k)]
            params = {"perm": pairs}
            srcs = [g[s] for s, t in pairs if g[t] == d]
            after[d] = xs[srcs[0]] if srcs else np.zeros_like(xs[d])
            transfers += [{"src": s, "src_block": 0, "dst": d, "dst_block": 0, "reduce": False} for s in srcs]
            received[d] = size * len(srcs)
            sent[d] = size * sum(1 for s, t in pairs if g[s] == d)
        else:
            after[d] = np.int32(pos)
    for g in groups:
        k = len(g)
        if k < 2 or k > 16:
            continue
        if kind == "all-reduce":
            steps += _ring(g, lambda p, s: p - s, True, k - 1, "reduce-scatter")
            steps += _ring(g, lambda p, s: p + 1 - s, False, k - 1, "all-gather")
        elif kind == "all-gather":
            steps += _ring(g, lambda p, s: p - s, False, k - 1, "all-gather")
        elif kind == "all-to-all":
            # Pairwise exchange: p sends its block q to q, into q's block p (XOR partners for a
            # power of two, else (s - p) mod k).
            rows = ([[p ^ s for p in range(k)] for s in range(1, k)] if k & (k - 1) == 0
                    else [[(s - p) % k for p in range(k)] for s in range(k)])
            rounds = [[{"src": g[p], "src_block": q, "dst": g[q], "dst_block": p, "reduce": False}
                       for p, q in enumerate(row) if q != p] for row in rows]
            rounds = [r for r in rounds if r]
            steps += [{"label": f"all-to-all step {i + 1} of {len(rounds)}", "transfers": r} for i, r in enumerate(rounds)]
        elif kind == "permute":
            moves = [t for t in transfers if t["dst"] in g]
            steps += [{"label": "permute step 1 of 1", "transfers": moves}] if moves else []
        elif kind == "reduce-scatter":
            # After step s, position p+1 holds block p-s-1 summed over s+2 devices; the last step
            # leaves block q complete on position q.
            steps += _ring(g, lambda p, s: p - s - 1, True, k - 1, "reduce-scatter")
    if len(groups) > 1 and steps:
        # Groups run their rings at the same time: merge step s of every group.
        per = len(steps) // len(groups)
        steps = [{"label": steps[s]["label"], "transfers": [t for j in range(len(groups)) for t in steps[j * per + s]["transfers"]]}
                 for s in range(per)]
    # Bounded like the engines' states: transfers among drawn devices only; ring steps only for
    # groups drawn whole.
    transfers = [t for t in transfers if t["src"] in drawn and t["dst"] in drawn]
    if any(len(g) > len(drawn) for g in groups):
        steps = []
    before_tiles = [] if kind == "none" else [collective_tile(d, xs[d]) for d in drawn]
    after_tiles = [collective_tile(d, after[d]) for d in drawn]
    iterations = [{"label": "only", "before": before_tiles, "after": after_tiles}]
    if count > 1:
        later = [dict(t, text=t["text"] + " (last)") for t in after_tiles]
        iterations = [{"label": "first", "before": before_tiles, "after": after_tiles},
                      {"label": "last", "before": after_tiles, "after": later}]
    primitive = {"psum": "psum", "pmean": "psum", "pmax": "pmax", "pmin": "pmin", "all_gather": "all_gather",
                 "psum_scatter": "reduce_scatter", "all_to_all": "all_to_all", "ppermute": "ppermute",
                 "axis_index": "axis_index"}[op]
    return {
        "index": index,
        "op": op,
        "primitive": primitive,
        "line": line,
        "source": source if source is not None else f"y = lax.{op}(x, '{axis}')",
        "axes": [axis],
        "groups": groups,
        "params": params,
        "in_shape": "" if kind == "none" else _short_shape(xs[0]),
        "out_shape": _short_shape(np.asarray(after[0])),
        "count": count,
        "recorded": True,
        "why_not": None,
        "iterations": iterations,
        "devices_omitted": max(0, n - len(drawn)),
        "movement": {"kind": kind, "blocks": blocks, "transfers": transfers, "steps": steps},
        "bytes": {"sent": [sent[d] for d in range(n)], "received": [received[d] for d in range(n)],
                  "estimate": True, "compiled": None if kind == "none" else size},
    }


def unrecorded_card(index: int = 0, op: str = "psum2", why: str = "the recorder does not know psum2") -> dict[str, Any]:
    return {"index": index, "op": op, "primitive": op, "line": 5, "source": f"z = {op}(x)", "axes": ["i"],
            "groups": [list(range(8))], "params": {}, "in_shape": "f32[4]", "out_shape": "f32[4]", "count": 1,
            "recorded": False, "why_not": why, "iterations": [], "devices_omitted": 0,
            "movement": {"kind": "none", "blocks": 1, "transfers": [], "steps": []},
            "bytes": {"sent": [], "received": [], "estimate": True, "compiled": None}}


def collectives_state(cards: list[dict[str, Any]], n: int = 8, *, axis: str = "i",
                      device_process: list[int] | None = None) -> dict[str, Any]:
    for k, c in enumerate(cards):
        c["index"] = k
    return {"title": f"collectives of %%pmap -a {axis}", "axes": [{"name": axis, "size": n}],
            "device_ids": list(range(n)), "device_process": device_process, "cards": cards[:64],
            "omitted_cards": max(0, len(cards) - 64)}


def plan_state(*, fits: bool = True, hardware: bool = True, collectives: int = 2) -> dict[str, Any]:
    """A plan of a two-matmul step over (data=64, model=8), numbers by hand arithmetic."""
    gib = 2**30
    argument, output, temp = 128 * 2**20, 128 * 2**20, 512 * 2**20
    total = argument + output + temp
    capacity = 16 * gib if fits else 512 * 2**20
    hw = {"name": "tpu-v5e", "peak_flops": 1.97e14, "hbm_bandwidth": 8.19e11, "interconnect_bandwidth": 1.0e11,
          "memory": capacity, "source": "cloud.google.com/tpu/docs/v5e"} if hardware else None
    flops, accessed = 1.2e12, 3.4e9
    colls = [
        {"op": "all-reduce", "shape": "bf16[8192,4096]", "bytes": 67108864, "axes": ["data"],
         "groups_text": "8 groups of 64 over 'data'", "group_size": 64, "line": 3,
         "source": "loss, grads = jax.value_and_grad(loss_fn)(params, batch)",
         "seconds": (2 * 63 / 64 * 67108864 / 1.0e11) if hardware else None},
        {"op": "all-gather", "shape": "bf16[4096,8192]", "bytes": 8388608, "axes": ["model"],
         "groups_text": "64 groups of 8 over 'model'", "group_size": 8, "line": None, "source": None,
         "seconds": (7 * 8388608 / 1.0e11) if hardware else None},
    ][:collectives]
    roofline = None
    if hardware:
        compute_s, memory_s = flops / 1.97e14, accessed / 8.19e11
        collective_s = sum(c["seconds"] for c in colls)
        estimate = max(compute_s, memory_s, collective_s)
        bound = {compute_s: "compute", memory_s: "memory", collective_s: "collectives"}[estimate]
        roofline = {"compute_s": compute_s, "memory_s": memory_s, "collective_s": collective_s,
                    "estimate_s": estimate, "bound": bound}
    return {
        "title": "%%shard --plan over 512 devices (data=64, model=8)",
        "axes": [{"name": "data", "size": 64}, {"name": "model", "size": 8}],
        "total_devices": 512,
        "hardware": hw,
        "memory": {"argument": argument, "output": output, "temp": temp, "alias": 0, "total": total,
                   "capacity": capacity, "capacity_source": "tpu-v5e profile" if hardware else "--device-memory",
                   "fits": total <= capacity, "overshoot": max(0, total - capacity)},
        "cost": {"flops": flops, "bytes_accessed": accessed},
        "collectives": colls,
        "collectives_omitted": 0,
        "roofline": roofline,
        "outputs": [{"name": "loss", "shape": [], "dtype": "float32", "spec": []},
                    {"name": "grads", "shape": [8192, 32768], "dtype": "bfloat16", "spec": [None, "model"]}],
        "compile_ms": 312.0,
        "caveats": ["Figures come from XLA's CPU compiler: XLA:TPU and XLA:GPU may fuse or schedule differently.",
                    "The CPU backend's memory figures ignore the accelerators' layout padding."],
    }


# A compiled program's text as XLA prints it: the frame tables (lines 1 and 2 of the cell "<cell-1>"),
# a reduction, then an entry computation (profile_sample's program, and TPU_HLO's with async ops).
_HLO_HEAD = """HloModule jit_step, is_scheduled=true

FileNames
1 "<cell-1>"

FunctionNames
1 "<module>"

FileLocations
1 {file_name_id=1 function_name_id=1 line=LINE1 end_line=LINE1 column=0 end_column=0}
2 {file_name_id=1 function_name_id=1 line=LINE2 end_line=LINE2 column=0 end_column=0}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=1}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}
"""

PROFILE_HLO = _HLO_HEAD.replace("LINE1", "1").replace("LINE2", "2") + """
ENTRY %main (x: f32[64]) -> f32[64] {
  %x = f32[64]{0} parameter(0), metadata={op_name="x"}
  %copy.1 = f32[64]{0} copy(%x)
  %fusion.3 = f32[64]{0} fusion(%copy.1), kind=kLoop, calls=%add, metadata={op_name="jit(step)/dot_general" stack_frame_id=1}
  %psum.7 = f32[64]{0} all-reduce(%fusion.3), replica_groups={{0,1,2,3}}, to_apply=%add, metadata={op_name="jit(step)/psum" stack_frame_id=2}
  %all-gather.2 = f32[256]{0} all-gather(%psum.7), replica_groups={{0,1,2,3}}, dimensions={0}, metadata={op_name="jit(step)/all_gather" stack_frame_id=2}
  ROOT %out = f32[64]{0} slice(%all-gather.2), slice={[0:64]}
}
"""
# XLA:TPU's kind of program: an async copy and an async all-reduce that a fusion overlaps (lines 3 and 4).
TPU_HLO = _HLO_HEAD.replace("LINE1", "3").replace("LINE2", "4") + """
ENTRY %main.2 (x.1: f32[1024], w.1: f32[1024]) -> f32[1024] {
  %x.1 = f32[1024]{0} parameter(0), metadata={op_name="x"}
  %w.1 = f32[1024]{0} parameter(1), metadata={op_name="w"}
  %copy-start.8 = (f32[1024]{0}, f32[1024]{0}, u32[]) copy-start(%w.1)
  %fusion.101 = f32[1024]{0} fusion(%x.1, %x.1), kind=kOutput, calls=%add, metadata={op_name="jit(step)/dot_general" stack_frame_id=1}
  %all-reduce-start = f32[1024]{0} all-reduce-start(%fusion.101), replica_groups={{0,1}}, to_apply=%add, metadata={op_name="jit(step)/psum" stack_frame_id=2}
  %copy-done.8 = f32[1024]{0} copy-done(%copy-start.8)
  %fusion.28 = f32[1024]{0} fusion(%copy-done.8, %x.1), kind=kOutput, calls=%add, metadata={op_name="jit(step)/mul" stack_frame_id=1}
  %all-reduce-done = f32[1024]{0} all-reduce-done(%all-reduce-start), metadata={op_name="jit(step)/psum" stack_frame_id=2}
  ROOT %out = f32[1024]{0} add(%all-reduce-done, %fusion.28)
}
"""


def profile_sample(lanes: int = 4, steps: int = 3, title: str = "%%pmap --profile over 4 devices: 3 profiled runs"):
    """A measured profile of PROFILE_HLO's program, made by the profile stage itself from a trace built
    here (times in ns): per device and step a copy, a matmul fusion, an all-reduce whose rendezvous
    waits for the later devices, an all-gather; each device starts 40 µs after the one before."""
    from jaxpar_magic.stages.profile.ops import ProgramOps
    from jaxpar_magic.stages.profile.summary import summarise
    from jaxpar_magic.stages.profile.xplane import Trace, TracedLane, TracedOp

    traced, runs = [], {}
    for device in range(lanes):
        ops = []
        for step in range(steps):
            t = step * 1_000_000 + device * 40_000
            ops += [TracedOp("copy.1", t, 5_000, step), TracedOp("fusion.3", t + 5_000, 300_000, step)]
            reduce = TracedOp("psum.7", t + 305_000, 200_000 + (lanes - device) * 40_000, step)
            reduce.waits = [(t + 310_000, 150_000 + (lanes - device) * 40_000)]
            ops += [reduce, TracedOp("all-gather.2", t + 505_000 + (lanes - device) * 40_000, 60_000, step)]
        traced.append(TracedLane(device, None, ops))
    for step in range(steps):
        runs[step] = (step * 1_000_000, step * 1_000_000 + 605_000 + lanes * 40_000 + step * 10_000)
    profile = summarise(Trace("cpu", traced, runs, True), [1e-3 + 1e-4 * s for s in range(steps)],
                        ProgramOps(PROFILE_HLO, "<cell-1>"), cores=2)
    return profile, profile.state(title)
