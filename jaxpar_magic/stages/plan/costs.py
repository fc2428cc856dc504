"""The plan's step-time model: compute at the peak for each matmul's dtype and precision, HBM
traffic in the program's dtypes, and every collective timed on the mesh's topology (stages/plan/topology.py).

The estimate takes the largest of compute, memory and the communication the compiled schedule can
overlap (its asynchronous collectives, and every collective where the compiler is not the target's),
plus the collectives it does not overlap (`exposed_s`: synchronous ones, which the device waits for).
`serial_s` adds all the communication to the larger of compute and memory instead: no overlap, the
pessimistic bound. A real step lies between them.

Plain Python: no JAX.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from .hardware import Hardware
from .topology import Topology, collective_time, dcn_stage_time

TERMS = ("compute", "memory", "ici", "dcn", "latency")


@dataclass(frozen=True)
class Roofline:
    compute_s: float
    memory_s: float
    collective_s: float
    estimate_s: float  # the largest of compute, memory and overlapped collectives, plus the exposed ones
    bound: str  # the dominant term: "compute" | "memory" | "ici" | "dcn" | "latency"
    ici_s: float = 0.0  # collectives bound by near-network bandwidth (ICI, NVLink)
    dcn_s: float = 0.0  # ... by the far network (DCN, the GPU network)
    latency_s: float = 0.0  # ... by per-hop latency
    serial_s: float = 0.0  # no overlap: max(compute, memory) + collectives (pessimistic)
    rates: tuple = ()  # ({"class", "share", "flops_per_s", "rate"}, ...): the peak each matmul class runs at
    labels: dict = field(default_factory=dict)  # term -> its name on this hardware ("ICI collectives", ...)
    exposed_s: float = 0.0  # collectives the compiled schedule runs synchronously: added to the estimate

    @property
    def bound_text(self) -> str:
        return self.labels.get(self.bound, self.bound)

    def state(self) -> dict:
        out = asdict(self)
        out["rates"] = [dict(r) for r in self.rates]
        out["bound_text"] = self.bound_text
        return out


def labels_for(hardware: Hardware) -> dict:
    near, far = hardware.fabric
    return {"compute": "compute", "memory": "memory", "ici": f"{near} collectives", "dcn": f"{far} collectives",
            "latency": "collective latency"}


def compute_time(flops: float | None, matmuls: dict, hardware: Hardware) -> tuple[float, tuple]:
    """FLOPs at the peak of the dtype and precision each matmul runs at, shared out by the program's
    own matmul FLOPs (`hlo_dtypes.matmul_flops`); a program without matmuls runs at the bf16 peak."""
    flops = flops or 0.0
    total = sum(matmuls.values())
    shares = {cls: v / total for cls, v in matmuls.items()} if total else {"bf16": 1.0}
    seconds, rates = 0.0, []
    for cls, share in sorted(shares.items(), key=lambda kv: -kv[1]):
        peak, what = hardware.peak_for(cls)
        seconds += flops * share / peak
        rates.append({"class": cls, "share": share, "flops_per_s": peak, "rate": what})
    return seconds, tuple(rates)


def ring_array_bytes(c) -> float:
    """The array a ring passes round: a reduce-scatter's input (its operand), else the result."""
    if c.op != "reduce-scatter":
        return c.bytes
    return c.operand_bytes if c.operand_bytes is not None else c.bytes * c.group_size


def time_collectives(planned: list, topology: Topology) -> list:
    """Each planned collective with its time on `topology` (all its calls) and what bounds it."""
    timed = []
    for c in planned:
        if c.group_size <= 1:
            timed.append(replace(c, seconds=0.0, bound=None))
            continue
        if c.over_dcn:
            t = dcn_stage_time(topology, c.op, c.bytes, c.group_size)
        else:
            t = collective_time(topology, c.op, c.axes, c.bytes, ring_array_bytes(c), c.group_size, _largest(c.groups))
        calls = c.calls  # in a loop XLA cannot bound: one trip's, as its FLOPs are counted
        split = dict(t.split)
        if c.whole_bytes:  # one combined instruction: its unsliced elements are gathered back after the scatter
            back = collective_time(topology, "all-gather", c.axes, c.whole_bytes, c.whole_bytes, c.group_size,
                                   _largest(c.groups))
            for kind, s in back.split.items():
                split[kind] = split.get(kind, 0.0) + s
        seconds = sum(split.values())
        bound = max(split, key=split.get) if c.whole_bytes else t.bound
        timed.append(replace(c, seconds=seconds * calls, bound=bound,
                             parts={kind: s * calls for kind, s in split.items()}))
    return timed


def _largest(groups) -> list | None:
    """The largest of a collective's groups (its time is that group's), or None."""
    return max(groups, key=len) if groups else None


def estimate(flops: float | None, bytes_accessed: float | None, planned: list, hardware: Hardware,
             topology: Topology, matmuls: dict) -> tuple[Roofline, list]:
    """The roofline of one step, and the collectives with their times filled in."""
    compute_s, rates = compute_time(flops, matmuls, hardware)
    memory_s = (bytes_accessed or 0.0) / hardware.hbm_bandwidth
    timed = time_collectives(planned, topology)
    split = {"ici": 0.0, "dcn": 0.0, "latency": 0.0}
    for c in timed:
        for kind, seconds in (c.parts or {}).items():  # ICI stage, DCN stage, or latency
            split[kind] += seconds
    collective_s = sum(split.values())
    exposed_s = sum(c.seconds or 0.0 for c in timed if c.overlapped is False)
    overlapped = max(compute_s, memory_s, collective_s - exposed_s) + exposed_s
    parts = {"compute": compute_s, "memory": memory_s, "collectives": collective_s}
    bound = max(parts, key=parts.get)
    if bound == "collectives":
        bound = max(split, key=split.get)
    return Roofline(
        compute_s, memory_s, collective_s, overlapped, bound, split["ici"], split["dcn"], split["latency"],
        max(compute_s, memory_s) + collective_s, rates, labels_for(hardware), exposed_s,
    ), timed
