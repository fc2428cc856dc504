"""Where a mesh's axes run on the hardware, and what a collective over them costs there.

`topology_for(hardware, mesh_sizes, text=None)` lays the mesh onto the profile's network the way
`jax.make_mesh` / `mesh_utils.create_device_mesh` would (the last, most network-hungry mesh axes
first, whole physical axes before split ones) and across slices (TPU pods over DCN) or nodes (GPUs
over the network) on the first, outermost mesh axes, as `create_hybrid_device_mesh` does. `--topology
4x8` names the ICI slice (TPU) or the NVLink domain (`--topology 8`, GPU) instead; devices beyond it
are further slices or nodes.

`collective_time(topology, op, axes, ...)` is the book's ring model (scaling book, sharding.md and
gpus.md): per mesh axis its links, their bandwidth, wraparound or not, hops and their latency, and
the slower network past a pod or node boundary. Plain Python: no JAX.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field, replace

from ...errors import UsageError
from .hardware import Hardware

DCN = -1  # the physical "axis" between slices (TPU pods over DCN) or between GPU nodes


@dataclass(frozen=True)
class Span:
    """One mesh axis's share of one physical axis: `extent` devices along ICI axis `dim` (or DCN)."""

    dim: int
    extent: int
    wraps: bool


@dataclass(frozen=True)
class Topology:
    hardware: Hardware
    slice_shape: tuple[int, ...]  # one ICI slice (TPU) or NVLink domain (GPU)
    wraps: tuple[bool, ...]  # per slice axis
    slices: int  # slices over DCN (TPU) or nodes over the network (GPU)
    axes: dict  # mesh axis name -> tuple[Span, ...]
    given: bool = False  # from --topology
    # device id -> (slice, coordinate along each slice axis): where each device of the planned mesh sits
    # (`placed`), so a collective is timed from the devices its groups span, whatever the axes are named
    places: dict = field(default_factory=dict, repr=False, compare=False)

    def describe(self) -> str:
        """`4x8 ICI slice, no wraparound; 2 slices over DCN; X: ICI axis 1 (8), Y: ICI axis 0 (4)`."""
        near, far = self.hardware.fabric
        shape = "x".join(map(str, self.slice_shape))
        if self.hardware.kind == "gpu":
            head = f"{shape} GPUs per NVLink domain"
        elif self.hardware.kind == "custom":
            head = "one flat network (custom profile)"
        else:
            wrapped = [str(i) for i, w in enumerate(self.wraps) if w]
            ring = ("wraparound on every axis" if len(wrapped) == len(self.wraps) else
                    "no wraparound" if not wrapped else f"wraparound on axis {', '.join(wrapped)} only")
            head = f"{shape} {near} slice, {ring}"
        if self.slices > 1:
            unit = "nodes" if self.hardware.kind == "gpu" else "slices"
            head += f"; {self.slices} {unit} over {far}"
        parts = []
        for name, spans in self.axes.items():
            where = " x ".join(f"{far} ({s.extent})" if s.dim == DCN else f"{near} axis {s.dim} ({s.extent}"
                               + (", wraps)" if s.wraps else ")") for s in spans)
            parts.append(f"{name}: {where or 'one device'}")
        return head + ("; " + ", ".join(parts) if parts else "")

    def state(self) -> dict:
        return {"slice": list(self.slice_shape), "wraps": list(self.wraps), "slices": self.slices,
                "given": self.given, "text": self.describe(),
                "axes": {n: [{"dim": s.dim, "extent": s.extent, "wraps": s.wraps} for s in spans]
                         for n, spans in self.axes.items()}}


# --- laying a mesh onto the hardware ----------------------------------------------------------------

@functools.lru_cache(maxsize=64)
def _balanced(n: int, limits: tuple[int, ...]) -> tuple[int, ...] | None:
    """The most even factorisation of n into len(limits) axes, each within its limit (ascending)."""
    best = None
    for dims in itertools.product(*(range(1, limit + 1) for limit in limits)):
        if math.prod(dims) != n or list(dims) != sorted(dims):
            continue
        score = (max(dims) / min(dims), dims[::-1])
        if best is None or score < best[0]:
            best = (score, dims)
    return best[1] if best else None


def _parse_shape(text: str, hardware: Hardware) -> tuple[int, ...]:
    example = "8" if hardware.kind == "gpu" else "x".join(["4"] * max(1, len(hardware.pod)))
    parts = str(text).lower().replace("×", "x").split("x")
    if not all(p.strip().isascii() and p.strip().isdigit() and int(p) > 0 for p in parts):  # "²" is a digit too
        raise UsageError(f"--topology {text}: write the slice's physical shape as sizes joined by x, e.g. "
                         f"`--topology {example}`.")
    return tuple(int(p) for p in parts)


def check_shape(hardware: Hardware, text: str) -> tuple[int, ...]:
    """`--topology` read and checked against the profile alone (the mesh is checked when planning)."""
    kind = hardware.kind
    if kind == "custom":
        raise UsageError(f"--topology {text}: a custom profile is one flat network without a topology; "
                         f"use a built-in profile (tpu-v5e, h100, ...) to lay the mesh onto one.")
    shape = _parse_shape(text, hardware)
    expected = ("GPUs per NVLink domain, e.g. `--topology 8`" if kind == "gpu" else
                f"a {len(hardware.pod)}-axis ICI slice within the {'x'.join(map(str, hardware.pod))} pod of "
                f"{hardware.name}, e.g. `--topology {'x'.join(['4'] * len(hardware.pod))}`")
    if kind == "gpu" and len(shape) != 1 or kind == "tpu" and (
            len(shape) != len(hardware.pod) or any(a > b for a, b in zip(sorted(shape), sorted(hardware.pod)))):
        raise UsageError(f"--topology {text}: expected {expected}.")
    return shape


def with_topology(hardware: Hardware | None, topology: str) -> Hardware:
    """The profile with `--topology` attached (the engines pass the profile through to the plan)."""
    from dataclasses import replace

    if hardware is None:
        raise UsageError(f"--topology {topology}: a topology belongs to a device profile; add --hardware "
                         f"(e.g. `--hardware tpu-v5e --topology {topology}`).")
    check_shape(hardware, str(topology).strip())
    return replace(hardware, topology=str(topology).strip())


def slice_shape_for(hardware: Hardware, total: int, text: str | None = None) -> tuple[tuple[int, ...], int]:
    """(one slice's physical shape, number of slices) for `total` devices."""
    kind = hardware.kind
    if kind == "custom" and text is None:
        return (total,), 1
    if text is not None:
        shape = check_shape(hardware, text)
        per_slice = math.prod(shape)
        if total % per_slice:
            unit = "nodes" if kind == "gpu" else "slices"
            raise UsageError(
                f"--topology {text}: a slice of {per_slice} devices does not divide the mesh's {total}; expected a "
                f"slice whose size divides {total} (the rest are further {unit}), e.g. `--topology "
                f"{'x'.join(map(str, slice_shape_for(hardware, total)[0]))}`.")
        return shape, total // per_slice
    domain = math.prod(hardware.pod)
    if total <= domain:
        shape = (total,) if kind == "gpu" else _balanced(total, tuple(sorted(hardware.pod)))
        if shape is None:
            raise UsageError(
                f"{total} devices do not form a slice of {hardware.name} (its pod is {'x'.join(map(str, hardware.pod))}); "
                f"give the slice's shape with --topology, e.g. `--topology {'x'.join(['2'] * len(hardware.pod))}`.")
        return shape, 1
    if total % domain:
        unit = "NVLink domain" if kind == "gpu" else "pod"
        raise UsageError(
            f"{total} devices are not a whole number of {hardware.name} {unit}s of {domain}; give the slice shape "
            f"with --topology (e.g. `--topology {'x'.join(map(str, hardware.pod))}`) so the rest are further slices.")
    return tuple(sorted(hardware.pod)) if kind == "tpu" else hardware.pod, total // domain


def _wraps(hardware: Hardware, shape: tuple[int, ...]) -> tuple[bool, ...]:
    if hardware.kind == "custom":
        return (True,) * len(shape)
    if hardware.kind == "gpu":
        return (False,) * len(shape)  # NVSwitch: every GPU one hop from every other
    if hardware.wrap == "cube":  # optical wraparound only on multiples of a full 4x4x4 cube
        return (all(d % 4 == 0 for d in shape),) * len(shape)
    full = max(hardware.pod)
    return tuple(d == full for d in shape)


def topology_for(hardware: Hardware, sizes: dict, text: str | None = None) -> Topology:
    """Lay mesh axes `sizes` (name -> size, in mesh order) onto `hardware`'s network."""
    total = math.prod(sizes.values()) if sizes else 1
    shape, slices = slice_shape_for(hardware, total, text)
    wraps = _wraps(hardware, shape)
    left = dict(sizes)
    spans: dict[str, list[Span]] = {name: [] for name in sizes}
    outer = slices
    for name in sizes:  # slices (DCN) take the outermost mesh axes, as create_hybrid_device_mesh does
        share = math.gcd(outer, left[name])
        if share > 1:
            spans[name].append(Span(DCN, share, False))
            left[name] //= share
            outer //= share
    if outer > 1:
        raise UsageError(_mismatch(sizes, shape, slices, hardware, text))
    capacity = list(shape)
    for name in reversed(list(sizes)):  # the innermost mesh axes are the most network-hungry
        need = left[name]
        if need == 1:
            continue
        whole = [i for i, c in enumerate(capacity) if c == shape[i] and c > 1]
        chosen = next((combo for k in range(len(whole), 0, -1) for combo in itertools.combinations(whole, k)
                       if math.prod(shape[i] for i in combo) == need), None)
        if chosen is not None:
            for i in chosen:
                spans[name].append(Span(i, shape[i], wraps[i]))
                capacity[i] = 1
            continue
        for i in sorted(range(len(shape)), key=lambda i: -capacity[i]):  # split physical axes
            share = math.gcd(need, capacity[i])
            if share > 1:
                spans[name].append(Span(i, share, wraps[i] and share == shape[i]))
                capacity[i] //= share
                need //= share
        if need != 1:
            raise UsageError(_mismatch(sizes, shape, slices, hardware, text))
    return Topology(hardware, tuple(shape), wraps, slices, {n: tuple(s) for n, s in spans.items()}, text is not None)


def _mismatch(sizes, shape, slices, hardware, text) -> str:
    layout = ", ".join(f"{n}={s}" for n, s in sizes.items())
    physical = "x".join(map(str, shape)) + (f" times {slices} slices" if slices > 1 else "")
    given = f"--topology {text}: " if text else ""
    return (f"{given}the mesh ({layout}) cannot be laid onto {hardware.name}'s {physical}: each mesh axis must be "
            f"a product of parts of the physical axes, and the slices must divide the outermost mesh axes. Expected "
            f"a slice shape whose axes the mesh's sizes divide, e.g. `--topology {'x'.join(map(str, shape))}` with a "
            f"mesh of matching sizes.")


# --- what a collective costs -------------------------------------------------------------------------

@dataclass(frozen=True)
class CollectiveTime:
    seconds: float
    ici_s: float  # bandwidth time on the near network (ICI, NVLink)
    dcn_s: float  # bandwidth time on the far network (DCN, the GPU network)
    latency_s: float  # hops x per-hop latency on the near network
    bound: str  # "ici" | "dcn" | "latency": what bounds this collective
    how: str  # the formula, in words
    split: dict  # its seconds by what they are spent on (they add up to `seconds`)


def _ring(spans: list[Span], hardware: Hardware) -> tuple[float, int]:
    """(bandwidth of the ICI rings over `spans`, hops across them): bidirectional on a wrapped axis,
    one way on an axis without wraparound (sharding.md); k axes add their bandwidth."""
    link = hardware.link_bandwidth or 0.0
    bandwidth = sum(2 * link if s.wraps else link for s in spans if s.extent > 1)
    hops = sum(s.extent // 2 if s.wraps else s.extent - 1 for s in spans)
    return bandwidth, hops


# --- where each device sits ---------------------------------------------------------------------------

def placed(topology: Topology, mesh) -> Topology:
    """`topology` with each device of `mesh` at its place. TPU devices (compile-only ones too) say where
    they are (`slice_index`, `coords`); simulated devices sit where `topology_for` laid their mesh axes:
    an axis's position read in mixed radix over its spans (the outermost, DCN, most significant), and
    the mesh axes sharing one physical axis side by side, the first laid (the innermost) fastest."""
    import numpy as np

    devices = list(mesh.devices.flat)
    dims = len(topology.slice_shape)
    if all(getattr(d, "coords", None) is not None for d in devices):
        places = {int(d.id): (int(getattr(d, "slice_index", 0) or 0), *(int(c) for c in list(d.coords)[:dims]))
                  for d in devices}
        return replace(topology, places=places)
    names = [str(n) for n in mesh.axis_names]
    if set(names) != set(topology.axes) or not dims:
        return topology
    stride = {}  # (axis name, span index) -> (dim, stride along it)
    filled = [1] * dims
    for name in reversed(names):  # topology_for lays the innermost axes first
        for k, span in enumerate(topology.axes[name]):
            if span.dim != DCN:
                stride[name, k] = (span.dim, filled[span.dim])
                filled[span.dim] *= span.extent
    shape = mesh.devices.shape
    grid = np.indices(shape).reshape(len(shape), -1)  # each device's position along each mesh axis
    slice_ = np.zeros(grid.shape[1], dtype=np.int64)
    where = np.zeros((dims, grid.shape[1]), dtype=np.int64)
    for axis, name in enumerate(names):
        index = grid[axis].copy()
        spans = topology.axes[name]
        digits = [None] * len(spans)
        for k in reversed(range(len(spans))):  # the last span is the least significant digit
            digits[k] = index % spans[k].extent
            index //= spans[k].extent
        for k, span in enumerate(spans):
            if span.dim == DCN:  # slices numbered over the DCN spans, outermost first
                slice_ = slice_ * span.extent + digits[k]
            else:
                dim, step = stride[name, k]
                where[dim] += digits[k] * step
    ids = [int(d.id) for d in mesh.devices.flat]
    places = {i: (int(slice_[n]), *(int(c) for c in where[:, n])) for n, i in enumerate(ids)}
    return replace(topology, places=places)


def group_spans(topology: Topology, group) -> list[Span] | None:
    """The physical axes one group of devices spans (DCN: the slices it touches), from where they sit;
    None where the topology has no places for them."""
    at = [topology.places.get(int(d)) for d in group]
    if not at or None in at:
        return None
    spans = []
    slices = len({p[0] for p in at})
    if slices > 1:
        spans.append(Span(DCN, slices, False))
    for dim, side in enumerate(topology.slice_shape):
        extent = len({p[1 + dim] for p in at})
        if extent > 1:
            spans.append(Span(dim, extent, topology.wraps[dim] and extent == side))
    return spans


def collective_time(topology: Topology, op: str, axes, result_bytes: float, array_bytes: float,
                    group_size: int, group=None) -> CollectiveTime:
    """One call of collective `op` over mesh `axes` (groups of `group_size`), on one device.

    `array_bytes`: the array a ring passes round, in the program's dtypes (an all-gather's result,
    a reduce-scatter's or all-reduce's operand); `result_bytes` its result on one device. `group`: the
    device ids of one of its groups; where the topology knows their places (`placed`), the physical
    axes they span decide, not the mesh axes' names (one program timed alike under any mesh)."""
    hardware = topology.hardware
    spans = group_spans(topology, group) if group else None
    if spans is None:
        spans = [s for a in axes for s in topology.axes.get(a, ())]
    far = math.prod(s.extent for s in spans if s.dim == DCN)
    near_spans = [s for s in spans if s.dim != DCN]
    near = math.prod(s.extent for s in near_spans)
    if near * far != group_size:  # part of an axis (uneven groups): a line of that many devices
        far, near_spans, near = 1, [Span(0, group_size, False)], group_size
    if hardware.kind == "custom":
        return _flat(op, hardware, result_bytes, array_bytes, group_size)
    if hardware.kind == "gpu":
        return _switched(op, hardware, result_bytes, array_bytes, near, far)
    return _torus(op, hardware, result_bytes, array_bytes, near_spans, near, far)


def dcn_stage_time(topology: Topology, op: str, chunk_bytes: float, slices: int) -> CollectiveTime:
    """XLA:TPU's cross-slice stage, as its program holds it (Megascale sends and receives): each device
    sends its `chunk_bytes` (what the ICI stage left it) over DCN to its peers in the other `slices`,
    a ring over the slices at the device's share of its host's DCN bandwidth (as the DCN term of
    `collective_time`)."""
    rate = _far_per_device(topology.hardware)
    times = 2 if op == "all-reduce" else 1  # reduce-scatter + all-gather over the slices
    dcn = times * (slices - 1) / slices * chunk_bytes / rate if slices > 1 and rate else 0.0
    return _done(0.0, dcn, 0.0, f"{op} over {slices} slices, over DCN")


def _far_per_device(hardware: Hardware) -> float:
    """One device's share of its host's DCN (TPU) or its node's network (GPU) bandwidth."""
    return (hardware.dcn_bandwidth or 0.0) / (hardware.host_chips or 1)


def _torus(op, hardware, result_bytes, array_bytes, spans, near, far) -> CollectiveTime:
    bandwidth, hops = _ring(spans, hardware)
    latency = (hardware.hop_latency or 0.0)
    dcn_rate = _far_per_device(hardware)
    n = near * far
    if op == "collective-permute":
        ici = result_bytes / (hardware.link_bandwidth or 1) if far == 1 else 0.0
        dcn = result_bytes / dcn_rate if far > 1 else 0.0
        return _done(ici, dcn, latency if far == 1 else 0.0, "one send to a neighbour")
    if op == "all-to-all":  # sharding.md: a quarter of an all-gather of the whole array
        ici = (near - 1) / near * result_bytes * near / 4 / bandwidth if near > 1 else 0.0
        dcn = (far - 1) / far * result_bytes / dcn_rate if far > 1 else 0.0
        return _done(ici, dcn, hops * latency, "all-to-all: 1/4 of an all-gather of the group's array")
    # all-gather / reduce-scatter: (n-1)/n x V over the rings; the DCN stage moves V / near per device
    ici = (near - 1) / near * array_bytes / bandwidth if near > 1 else 0.0
    dcn = (far - 1) / far * array_bytes / near / dcn_rate if far > 1 else 0.0
    times = 2 if op == "all-reduce" else 1  # reduce-scatter + all-gather
    how = ("all-reduce = reduce-scatter + all-gather" if times == 2 else f"{op}") + f" over {n}"
    return _done(times * ici, times * dcn, times * hops * latency, how)


def _switched(op, hardware, result_bytes, array_bytes, near, far) -> CollectiveTime:
    """gpus.md: rings inside a node at NVLink speed; past it, each GPU's share of the node's network
    egress; the slower level bounds the collective (the two overlap)."""
    nvlink = hardware.link_bandwidth or 1.0
    net = _far_per_device(hardware)
    if op == "collective-permute":
        return _done(result_bytes / nvlink if far == 1 else 0.0, result_bytes / net if far > 1 else 0.0, 0.0,
                     "one send")
    if op == "all-to-all":
        ici = (near - 1) / near * result_bytes / nvlink if near > 1 else 0.0
        dcn = result_bytes * near * far * (far - 1) / far**2 / (net * 8) if far > 1 else 0.0
        return _done(ici, dcn, 0.0, "all-to-all: direct sends", overlap=True)
    ici = (near - 1) / near * array_bytes / nvlink if near > 1 else 0.0
    dcn = (far - 1) / far * array_bytes / near / net if far > 1 else 0.0
    times = 2 if op == "all-reduce" else 1
    return _done(times * ici, times * dcn, 0.0, op, overlap=True)


def _flat(op, hardware, result_bytes, array_bytes, n) -> CollectiveTime:
    """A custom profile: one ring of n devices at the given bandwidth, no latency, no DCN."""
    bw = hardware.interconnect_bandwidth
    if n <= 1:
        return _done(0.0, 0.0, 0.0, op)
    if op == "collective-permute":
        return _done(result_bytes / bw, 0.0, 0.0, "one send")
    if op == "all-to-all":
        return _done((n - 1) / n * result_bytes * n / 4 / bw, 0.0, 0.0, "all-to-all")
    times = 2 if op == "all-reduce" else 1
    return _done(times * (n - 1) / n * array_bytes / bw, 0.0, 0.0, op)


def _done(ici: float, dcn: float, latency: float, how: str, overlap: bool = False) -> CollectiveTime:
    """Near-network time is at least the hops' latency (sharding.md). On a torus the DCN stage
    follows the ICI stage; on GPUs the levels of the tree overlap and the slower one counts (gpus.md)."""
    near = max(ici, latency)
    near_kind = "latency" if latency > ici else "ici"
    parts = {"ici": ici, "dcn": dcn, "latency": latency}
    bound = max(parts, key=parts.get)
    if overlap:
        seconds = max(near, dcn)
        split = {bound if bound != "latency" else near_kind: seconds}
    else:
        seconds = near + dcn
        split = {near_kind: near, "dcn": dcn}
    return CollectiveTime(seconds, ici, dcn, latency, bound, how, split)
