"""The Plan: what the compiler says one step of a program costs on each device (memory, FLOPs,
bytes, collectives, the roofline), as attributes to assert on, with its one-line summary and the
plan view's state. stages/plan/plan_program.py makes Plans; this module only says what one holds.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .costs import Roofline
from .hardware import Hardware
from .topology import Topology

MAX_COLLECTIVES = 64  # in the view's state; the Plan keeps them all
SUMMARY_AT = 24  # more collectives than this (a screenful) get a summary by op and axis

CAVEATS = (
    "Figures come from XLA's CPU compiler, compiling for simulated devices: nothing ran.",
    "XLA:TPU and XLA:GPU may fuse, schedule and combine collectives differently, so temporaries, "
    "FLOPs and the collectives themselves can differ on the target.",
    "The CPU backend's memory figures ignore accelerators' layout padding (e.g. TPU tiles of 8x128), "
    "so small or oddly shaped arrays can take more memory on the device.",
)
TPU_CAVEATS = (
    "Figures come from XLA:TPU itself (libtpu), compiling for compile-only devices of the slice: nothing ran, "
    "and no TPU was needed. Memory is HBM as XLA:TPU assigns it (memory_analysis()'s figures), tile padding and "
    "its fusion decisions included; what it keeps in on-chip VMEM is said apart.",
)


def attached_caveats(target) -> tuple[str, ...]:
    """What a plan compiled for the chips this process has (a TPU host, no --topology) must say."""
    tpu = (" Memory is HBM as XLA:TPU assigns it (memory_analysis()'s figures), tile padding and its fusion "
           "decisions included; what it keeps in on-chip VMEM is said apart.") if target.is_tpu else ""
    return (f"Figures come from {target.compiler} itself, compiling for {target.where} (the devices this process "
            f"has): nothing ran.{tpu}",)


SCATTER_CAVEAT = (
    "XLA:CPU sums some arrays on every device and then keeps each device's slice (an all-reduce and a "
    "dynamic-slice); XLA:TPU and XLA:GPU can make that one reduce-scatter (XLA's reduce-scatter creator pass), and "
    "the plan shows and costs those as reduce-scatters, each marked on its line. They do not always (XLA:TPU kept "
    "a float32 FSDP step's gradient sums as all-reduces, libtpu 0.0.42): plan with XLA:TPU to see its choice."
)
# jax.checkpoint / jax.remat in the lowered program (its op names: .../checkpoint/..., .../remat2; inside
# a loop's body the name stack starts again: "checkpoint/...", "remat2", "vmap()/remat2").
REMAT = re.compile(r'op_name="(?:[^"]*/)?(?:checkpoint|remat\d*)[/"]')
RESERVED_CPU = "free space in XLA's temporary arena (its packing leaves gaps)"
RESERVED_TPU = ("free space in XLA:TPU's temporary arena at this step (memory_analysis() counts the whole arena, which "
                "the runtime allocates for the program)")


def remat_caveat(hardware) -> str:
    """What a CPU plan of a cell using jax.checkpoint outside loops must say. Inside a loop's body XLA:CPU
    keeps the recomputation (the forward and backward loops are separate computations, so nothing merges
    them; measured: a scanned block's peak drops from 174 to 54 MiB with jax.checkpoint)."""
    profile = hardware.name if getattr(hardware, "kind", None) == "tpu" else "tpu-v5e"
    return ("This cell uses jax.checkpoint (rematerialisation), and XLA:CPU undoes it: it drops the barriers and "
            "merges the recomputation, so these memory figures are those without checkpointing (measured: the same "
            "peak with and without it). XLA:TPU keeps it: install libtpu (`pip install \"jaxpar_magic[tpu]\"`) and "
            f"plan with `--hardware {profile} --topology 4x4` (your slice) to see the memory it saves.")


ROOFLINE_CAVEAT = (
    "The step time is a model, not a measurement: peak FLOP/s for each matmul's dtype and precision, HBM "
    "bandwidth, and ring collectives on the mesh's topology (per-axis links, wraparound, ~1 µs hops, DCN or "
    "network past a pod or node), as in the scaling book. The estimate hides the collectives the compiled "
    "schedule overlaps behind compute and adds those it runs synchronously; the no-overlap figure adds them all "
    "(pessimistic). Real steps reach a fraction of peak: the book measures 680 µs for a gather it models at 560 µs."
)
CPU_SCHEDULE_CAVEAT = (
    "XLA:CPU's schedule is not the target's, so this plan counts every collective as overlapped with compute; "
    "plan for a TPU slice (`--topology`, with libtpu) to see which ones XLA:TPU runs synchronously."
)
UPCAST_CAVEAT = (
    "XLA:CPU computes bf16 in f32 around collectives; collectives and memory traffic are counted in the "
    "program's own dtypes (the CPU compiler's conversions are left out)."
)
GPU_CAVEAT = (
    "On GPUs no per-hop latency is modelled (the book gives none), and NVLink rarely exceeds ~370 of its "
    "450 GB/s (gpus.md): small collectives take longer than shown."
)
LOOP_CAVEAT = (
    "The program has loops (scan, fori_loop, while): XLA's cost analysis counts a loop body once, so the "
    "plan adds every other trip, counted from the program's own operations as XLA counts them (bytes "
    "accessed as each unfused operation's operands and result); collectives are counted on every trip."
)
UNKNOWN_LOOP_CAVEAT = (
    "A loop's length is not a constant XLA can read (a while_loop on a computed condition): its FLOPs and "
    "bytes are counted for one trip, and each collective in it says its calls per trip (and at most per step, "
    "where the loop's condition bounds it)."
)
EXPOSED_CAVEAT = (
    "Some collectives run synchronously in XLA:TPU's schedule (no -start/-done pair, no async collective "
    "fusion): the device waits for them, so the estimate adds their time to compute and memory instead of "
    "overlapping it (each row says whether it is overlapped)."
)


class PlanWarning(UserWarning):
    """Planning went ahead, but something about it deserves the user's attention."""


@dataclass(frozen=True)
class PlannedCollective:
    op: str  # as XLA names it: all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute
    shape: str  # its result on one device, e.g. "bf16[8192,4096]"
    bytes: int  # its result's size on one device
    traffic_bytes: float  # bytes one device sends per call with a ring algorithm
    count: int | None  # calls per run (inside loops); None: a loop of unknown length
    group_size: int
    groups: list[list[int]] = field(repr=False)  # device ids of each group (or connected sends of a permute)
    axes: tuple[str, ...] = ()  # mesh axes its groups vary along
    groups_text: str = ""
    line: int | None = None
    source: str | None = None
    seconds: float | None = None  # modelled time of all its calls (with hardware)
    bound: str | None = None  # what bounds it: "ici" | "dcn" | "latency"
    parts: dict | None = None  # its seconds by where they go: "ici", "dcn", "latency" (they add up to seconds)
    upcast_from: str | None = None  # the program's dtype, where XLA:CPU moves it as f32
    operand_bytes: int | None = None  # its operands on one device, in the program's dtypes
    # The line that needs it, inside a function the cell calls: {"function", "line", "source", "cell"}.
    origin: dict | None = None
    # "all-reduce": XLA:CPU's all-reduce + dynamic-slice, shown and costed as the target's reduce-scatter
    sliced_from: str | None = None
    reduction: str | None = None  # what an all-reduce or reduce-scatter combines with: "sum", "max", ...
    over_dcn: bool = False  # XLA:TPU's Megascale transfer: the cross-slice stage of a collective, over DCN
    operands: int = 1  # arrays its one instruction moves (a combined all-reduce of several gradients)
    whole_bytes: int = 0  # a sliced combined all-reduce's elements still summed whole (cell/scatter.py)
    per_trip: int | None = None  # count None: its calls per trip of the loop XLA cannot bound (as FLOPs count it)
    at_most: int | None = None  # ... and the most per step, where that loop's condition bounds it
    # Whether the compiled schedule overlaps it with compute: True for an asynchronous collective (-start/-done,
    # XLA:TPU's async collective fusions), False where the device waits for it; None where the compiler is not
    # the target's (XLA:CPU's schedule says nothing of a TPU's or GPU's)
    overlapped: bool | None = None
    why: dict | None = None  # why it is there, where the program says it (stages/plan/why.py)

    @property
    def calls(self) -> int:
        """Calls per step: `count`, or one trip's (`per_trip`) of a loop XLA cannot bound."""
        return self.count if self.count is not None else (self.per_trip or 1)

    def state(self) -> dict:
        return {
            "op": self.op, "shape": self.shape, "bytes": self.bytes, "axes": list(self.axes),
            "groups_text": self.groups_text, "group_size": self.group_size, "line": self.line,
            "source": self.source, "seconds": self.seconds, "bound": self.bound, "origin": self.origin,
            "sliced_from": self.sliced_from, "reduction": self.reduction, "count": self.count,
            "per_trip": self.per_trip, "at_most": self.at_most, "overlapped": self.overlapped, "why": self.why,
        }


@dataclass
class Plan:
    """What the compiler says one step costs on each device. All byte figures are per device."""

    mesh: object
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    flops: float | None
    bytes_accessed: float | None
    compile_ms: float
    collectives: list[PlannedCollective]
    outputs: object  # the program's outputs: a pytree of jax.ShapeDtypeStruct with shardings
    hardware: Hardware | None = None
    capacity: int | None = None  # the device's memory in bytes, when known
    capacity_source: str | None = None  # "--device-memory" | "<profile> profile" | "device"
    roofline: Roofline | None = None
    topology: Topology | None = None
    cpu_bytes_accessed: float | None = None  # cost_analysis' figure, XLA:CPU's f32 upcast included
    memory_note: str | None = None  # e.g. JAX's GPU preallocation
    caveats: tuple[str, ...] = CAVEATS
    compiled: object = field(default=None, repr=False)  # jax.stages.Compiled, for anything else
    # A planned cell (the engines' --plan stage): what it would bind, and which of those it computes.
    bindings: dict = field(default_factory=dict, repr=False)
    computed: tuple[str, ...] = ()
    target: object = None  # target.Target: the compiler that made it, and for which devices
    peak_bytes: int | None = None  # a peak to report instead of the parts' sum (none today: HBM's is the sum)
    xla_peak_bytes: int | None = None  # XLA:TPU's peak_memory_in_bytes: HBM and on-chip VMEM together
    reused: bool = False  # compiled before (the same program for the same devices): nothing compiled now
    peak: object = field(default=None, repr=False)  # peak.MemoryPeak: what fills memory at the peak, the timeline
    abstract: dict = field(default_factory=dict, repr=False)  # every name the cell assigns, as planned
    left_alone: tuple[str, ...] = ()  # names the plan did not bind: they hold concrete values
    refused: str | None = None  # XLA's words where it refused to compile for memory: the plan is of its buffers
    donated: tuple[str, ...] = ()  # --donate: inputs given to the program, compiled with their aliasing
    notes: list = field(default_factory=list)  # more sentences about the memory figures (memory_notes adds these)
    advice: list = field(default_factory=list)  # advice.Advice: what would make it fit, from the peak's buffers
    # (name, spec in, spec out): inputs the cell binds again in another layout (layout_changes.py)
    layout_changes: list = field(default_factory=list)
    partitioner: list = field(default_factory=list)  # XLA's partitioner warnings as rows (why.partitioner_rows)
    pipeline: dict | None = None  # a pipeline's bubble, where a loop's ticks outnumber its microbatches (pipeline.py)

    @property
    def total_bytes(self) -> int:
        """The peak per device in the device's main memory (HBM): arguments + outputs + temporaries - aliased,
        as memory_analysis() counts them (XLA:TPU's VMEM is apart: `notes`)."""
        if self.peak_bytes is not None:
            return self.peak_bytes
        return self.argument_bytes + self.output_bytes + self.temp_bytes - self.alias_bytes

    @property
    def compiler(self) -> str:
        return self.target.compiler if self.target is not None else "XLA:CPU"

    @property
    def fits(self) -> bool | None:
        return None if self.capacity is None else self.total_bytes <= self.capacity

    @property
    def overshoot(self) -> int:
        return 0 if self.capacity is None else max(0, self.total_bytes - self.capacity)

    @property
    def axes(self) -> dict[str, int]:
        return {str(n): int(s) for n, s in self.mesh.shape.items()}

    def memory_notes(self) -> list[str]:
        """Sentences the memory figures need beside them: what --donate gave the program, and `notes`."""
        said = []
        if self.donated:
            names = ", ".join(self.donated)
            if self.alias_bytes:
                said.append(f"donated: {names} (as jax.jit's donate_argnums): {format_bytes(self.alias_bytes)} of "
                            f"outputs are written into their buffers, counted once.")
            else:
                said.append(f"donated: {names} (as jax.jit's donate_argnums), but no output has the shape, dtype and "
                            f"layout of their buffers, so XLA reuses none of them.")
        return said + list(self.notes)

    def summary(self) -> str:
        """One line: `planned: 2.1 GiB per device (fits in 16.0 GiB) · 6 collectives · estimate 1.2 ms, bound by
        compute`."""
        fit = "" if self.capacity is None else (f" (fits in {format_bytes(self.capacity)})" if self.fits else
                                                f" (DOES NOT FIT in {format_bytes(self.capacity)})")
        if self.refused:
            return (f"{self.compiler} refused to compile it: does not fit: needs {self.total_bytes / 2**30:.2f} GiB "
                    f"of {self.capacity / 2**30:.2f} GiB per device" + (f" · largest buffer {format_bytes(self.peak.largest.bytes)}"
                    if self.peak is not None and self.peak.largest is not None else ""))
        moving = sum(1 for c in self.collectives if c.group_size > 1)
        r = self.roofline
        estimate = f" · estimate {r.estimate_s * 1e3:.3g} ms, bound by {r.bound_text}" if r is not None else ""
        largest = self.peak.largest if self.peak is not None else None
        big = f" · largest buffer {format_bytes(largest.bytes)}" if largest is not None else ""
        return (f"planned by {self.compiler}: {format_bytes(self.total_bytes)} per device{fit}{big} · {moving} "
                f"collective{'' if moving == 1 else 's'}{estimate}")

    def state(self, title: str, outputs: dict | None = None) -> dict:
        """The plan view's state. `outputs`: names -> ShapeDtypeStructs (pytrees allowed) to list;
        by default a planned cell's computed outputs, else the program's outputs."""
        if outputs is None and self.computed:
            outputs = {n: (self.abstract or self.bindings)[n] for n in self.computed}
        shown = outputs if outputs is not None else {"out": self.outputs}
        return {
            "title": title,
            "axes": [{"name": n, "size": s} for n, s in self.axes.items()],
            "total_devices": int(self.mesh.devices.size),
            "hardware": self.hardware.state() if self.hardware is not None else None,
            "memory": {
                "argument": self.argument_bytes, "output": self.output_bytes, "temp": self.temp_bytes,
                "alias": self.alias_bytes, "total": self.total_bytes, "capacity": self.capacity,
                "capacity_source": self.capacity_source, "fits": self.fits, "overshoot": self.overshoot,
                "note": self.memory_note, "reported_peak": self.peak_bytes is not None,
                "donated": list(self.donated), "notes": self.memory_notes(), "refused": self.refused,
                "advice": [a.state() for a in self.advice],
            },
            "layout_changes": [{"name": n, "before": str(a), "after": str(b)} for n, a, b in self.layout_changes],
            "partitioner": list(self.partitioner),
            "compiler": self.target.state() if self.target is not None else None,
            "peak": self.peak.state() if self.peak is not None else None,
            "left_alone": list(self.left_alone),
            "topology": self.topology.state() if self.topology is not None else None,
            "cost": {"flops": self.flops, "bytes_accessed": self.bytes_accessed},
            "collectives": [c.state() for c in self.collectives[:MAX_COLLECTIVES]],
            "collectives_omitted": max(0, len(self.collectives) - MAX_COLLECTIVES),
            "collective_summary": by_op_and_axis(self.collectives) if len(self.collectives) > SUMMARY_AT else [],
            "pipeline": self.pipeline,
            "roofline": self.roofline.state() if self.roofline is not None else None,
            "outputs": output_entries(shown),
            "compile_ms": round(self.compile_ms, 1),
            "compiled": "refused" if self.refused else "reused" if self.reused else "compiled",
            "caveats": list(self.caveats),
        }


def by_op_and_axis(collectives: list) -> list[dict]:
    """The collectives summed by op and mesh axes: instructions, calls and bytes per step, and their time
    (and the exposed part of it) where timed; most bytes first."""
    groups: dict[tuple, dict] = {}
    for c in collectives:
        if c.group_size <= 1:
            continue
        g = groups.setdefault((c.op, tuple(c.axes)), {"op": c.op, "axes": list(c.axes), "instructions": 0, "calls": 0,
                                                      "bytes": 0, "seconds": None, "exposed_s": 0.0})
        g["instructions"] += 1
        g["calls"] += c.calls
        g["bytes"] += c.bytes * c.calls
        if c.seconds is not None:
            g["seconds"] = (g["seconds"] or 0.0) + c.seconds
            g["exposed_s"] += c.seconds if c.overlapped is False else 0.0
    return sorted(groups.values(), key=lambda g: -g["bytes"])


def format_bytes(n: float) -> str:
    """`16.0 KiB`, `1.5 GiB`: bytes in the largest binary unit that keeps a number >= 1."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _spec_entries(sharding, ndim: int) -> list | None:
    """A NamedSharding's spec as JSON, one entry per dimension; None for other shardings."""
    spec = getattr(sharding, "spec", None)
    if spec is None:
        return None
    entries = [list(e) if isinstance(e, tuple) else e for e in spec]
    return entries + [None] * (ndim - len(entries))


def output_entries(named: dict) -> list[dict]:
    """The view's `outputs`: one entry per abstract array in `named` (name -> pytree)."""
    import jax

    from ...views.summaries import dtype_of

    entries = []
    for name, tree in named.items():
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
                continue  # a plain Python value the program returned
            entries.append({
                "name": name + jax.tree_util.keystr(path),
                "shape": [int(d) for d in leaf.shape],
                "dtype": dtype_of(leaf).name,  # key<fry> for a PRNG key array
                "spec": _spec_entries(getattr(leaf, "sharding", None), len(leaf.shape)),
            })
    return entries
