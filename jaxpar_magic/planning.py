"""Plan a program without running it: compile it for a mesh over abstract inputs and read what the
compiler says it costs, per device.

`compile_plan(fn, args, mesh)` lowers and compiles `fn` over `jax.ShapeDtypeStruct`s (concrete
arrays stand in by their shapes and shardings), never runs it and allocates neither inputs nor
outputs. The `Plan` it returns carries the figures as attributes: memory (`compiled.memory_analysis()`),
FLOPs and bytes accessed (`cost_analysis()`), every collective with its mesh axes and source line,
the roofline of a hardware profile, and the outputs as ShapeDtypeStructs with their shardings, so the
next plan can take them as inputs. `Plan.state(title)` is the plan view's state.

Plain Python over JAX; no IPython.
"""
from __future__ import annotations

import inspect
import linecache
import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import UsageError, explain_trace_error, user_line
from .hardware import Hardware, parse_hardware, parse_memory_size
from .costs import Roofline, estimate
from .hlo import Collective, collectives, program_facts, upcasts
from .topology import Topology, topology_for

CPU_DEVICE_CEILING = 2048  # XLA's CPU backend: 4,096 devices fail with "Multiprocess computations aren't implemented"
MAX_COLLECTIVES = 64  # in the view's state; the Plan keeps them all

CAVEATS = (
    "Figures come from XLA's CPU compiler, compiling for simulated devices: nothing ran.",
    "XLA:TPU and XLA:GPU may fuse, schedule and combine collectives differently, so temporaries, "
    "FLOPs and the collectives themselves can differ on the target.",
    "The CPU backend's memory figures ignore accelerators' layout padding (e.g. TPU tiles of 8x128), "
    "so small or oddly shaped arrays can take more memory on the device.",
)
ROOFLINE_CAVEAT = (
    "The step time is a model, not a measurement: peak FLOP/s for each matmul's dtype and precision, HBM "
    "bandwidth, and ring collectives on the mesh's topology (per-axis links, wraparound, ~1 µs hops, DCN or "
    "network past a pod or node), as in the scaling book. The estimate assumes communication fully "
    "overlaps compute (optimistic); the no-overlap figure adds it (pessimistic). Real steps reach a "
    "fraction of peak: the book measures 680 µs for a gather it models at 560 µs."
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
    "The program has loops (scan, fori_loop, while): XLA's cost analysis counts a loop body once, so "
    "FLOPs and bytes accessed cover one iteration of each loop; collectives are counted per iteration."
)

# Ring algorithms: the share of an array each device sends, for a group of n devices (the
# collective's `traffic_bytes`; its time comes from costs.py, on the mesh's topology).
RING_FACTORS = {
    "all-reduce": lambda n: 2 * (n - 1) / n,
    "all-gather": lambda n: (n - 1) / n,
    "reduce-scatter": lambda n: (n - 1) / n,
    "all-to-all": lambda n: (n - 1) / n,
    "collective-permute": lambda n: 1.0,
}
_NO_VALUES = (
    "ConcretizationTypeError", "TracerBoolConversionError", "TracerIntegerConversionError",
    "TracerArrayConversionError",
)
_DATA_AXIS_NAMES = ("data", "batch", "dp", "replica", "replicas", "fsdp", "devices")


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

    def state(self) -> dict:
        return {
            "op": self.op, "shape": self.shape, "bytes": self.bytes, "axes": list(self.axes),
            "groups_text": self.groups_text, "group_size": self.group_size, "line": self.line,
            "source": self.source, "seconds": self.seconds, "bound": self.bound, "origin": self.origin,
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

    @property
    def total_bytes(self) -> int:
        return self.argument_bytes + self.output_bytes + self.temp_bytes - self.alias_bytes

    @property
    def fits(self) -> bool | None:
        return None if self.capacity is None else self.total_bytes <= self.capacity

    @property
    def overshoot(self) -> int:
        return 0 if self.capacity is None else max(0, self.total_bytes - self.capacity)

    @property
    def axes(self) -> dict[str, int]:
        return {str(n): int(s) for n, s in self.mesh.shape.items()}

    def summary(self) -> str:
        """One line: `planned: 2.1 GiB per device (fits in 16.0 GiB) · 6 collectives · estimate 1.2 ms, bound by
        compute`."""
        fit = "" if self.capacity is None else (f" (fits in {format_bytes(self.capacity)})" if self.fits else
                                                f" (DOES NOT FIT in {format_bytes(self.capacity)})")
        moving = sum(1 for c in self.collectives if c.group_size > 1)
        r = self.roofline
        estimate = f" · estimate {r.estimate_s * 1e3:.3g} ms, bound by {r.bound_text}" if r is not None else ""
        return f"planned: {format_bytes(self.total_bytes)} per device{fit} · {moving} collectives{estimate}"

    def state(self, title: str, outputs: dict | None = None) -> dict:
        """The plan view's state. `outputs`: names -> ShapeDtypeStructs (pytrees allowed) to list;
        by default a planned cell's computed outputs, else the program's outputs."""
        if outputs is None and self.computed:
            outputs = {n: self.bindings[n] for n in self.computed}
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
                "note": self.memory_note,
            },
            "topology": self.topology.state() if self.topology is not None else None,
            "cost": {"flops": self.flops, "bytes_accessed": self.bytes_accessed},
            "collectives": [c.state() for c in self.collectives[:MAX_COLLECTIVES]],
            "collectives_omitted": max(0, len(self.collectives) - MAX_COLLECTIVES),
            "roofline": self.roofline.state() if self.roofline is not None else None,
            "outputs": output_entries(shown),
            "compile_ms": round(self.compile_ms, 1),
            "caveats": list(self.caveats),
        }


# --- inputs ------------------------------------------------------------------------------------

def abstract_inputs(args, mesh, names=None, leaf_labels=None) -> tuple[list, list[tuple[str, int]]]:
    """Each argument as ShapeDtypeStructs laid out on `mesh`, and the concrete arrays among them
    as (name, bytes). Arrays keep their sharding when it lives on the mesh's devices; anything
    without one is replicated, as running the program would place it."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    replicated = NamedSharding(mesh, P())
    mesh_devices = set(mesh.devices.flat)
    concrete: list[tuple[str, int]] = []
    abstract = []
    for index, arg in enumerate(args):
        name = names[index] if names is not None else f"argument {index}"

        def convert(path, leaf, name=name, index=index):
            if leaf_labels is not None:  # an engine's argument: a flat list of one input's leaves
                label = leaf_labels[index][path[0].idx]
            else:
                label = name + jax.tree_util.keystr(path)
            if isinstance(leaf, jax.ShapeDtypeStruct):
                if leaf.sharding is None:
                    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=replicated, weak_type=leaf.weak_type)
                return leaf
            if isinstance(leaf, jax.Array):
                concrete.append((label, int(leaf.nbytes)))
                on_mesh = set(leaf.sharding.device_set) == mesh_devices
                return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding if on_mesh else replicated)
            if isinstance(leaf, (np.ndarray, np.generic)):
                concrete.append((label, int(leaf.nbytes)))
                return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=replicated)
            if isinstance(leaf, (bool, int, float, complex)):
                return leaf  # a Python number traces as a scalar and holds no memory
            raise UsageError(
                f"{label} is a {type(leaf).__name__}, neither an array nor a jax.ShapeDtypeStruct. A plan "
                f"takes arrays, or abstract arrays that hold no memory: `jaxpar_magic.plan(shape, dtype, mesh, "
                f"spec)` or `jax.ShapeDtypeStruct(shape, dtype, sharding=...)`. Use other values as constants "
                f"the function closes over, not as inputs."
            )

        abstract.append(jax.tree_util.tree_map_with_path(convert, arg))
    return abstract, concrete


# --- scale -------------------------------------------------------------------------------------

def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def smaller_slice(sizes: dict[str, int], ceiling: int = CPU_DEVICE_CEILING) -> tuple[str, int, int] | None:
    """(axis, its size, a smaller size) that brings the mesh to at most `ceiling` devices by
    shrinking one axis, preferring a data-parallel one; None when no single axis can."""
    total = math.prod(sizes.values())
    needed = math.ceil(total / ceiling)

    def preference(name: str) -> tuple:
        return (name.lower() not in _DATA_AXIS_NAMES, -sizes[name])

    for name in sorted(sizes, key=preference):
        factor = next((d for d in _divisors(sizes[name]) if d >= needed), None)
        if factor is not None:
            return name, sizes[name], sizes[name] // factor
    return None


def check_scale(mesh) -> None:
    """A mesh the CPU backend can compile for, or a UsageError that says what to plan instead.

    Runs before anything is traced, so a too-large (even abstract) mesh costs nothing."""
    import jax

    sizes = {str(n): int(s) for n, s in mesh.shape.items()}
    total = math.prod(sizes.values())
    platform = mesh.devices.flat[0].platform if isinstance(mesh, jax.sharding.Mesh) else jax.default_backend()
    if platform != "cpu" or total <= CPU_DEVICE_CEILING:
        return
    layout = ", ".join(f"{n}={s}" for n, s in sizes.items())
    smaller = smaller_slice(sizes)
    if smaller is None:
        advice = (f"Plan a slice of at most {CPU_DEVICE_CEILING:,} devices whose per-device shapes are the "
                  f"same: shrink the axes that only replicate the weights, and the global batch with them.")
    else:
        axis, size, small = smaller
        factor = size // small
        which = "" if axis.lower() in _DATA_AXIS_NAMES else f" (if {axis!r} is that axis)"
        advice = (
            f"Plan a slice with the same per-device shapes instead: shrink the data-parallel axis, the one "
            f"that only splits the batch, e.g. to `{axis}={small}` (from {size}){which}, and divide the global "
            f"batch by {factor} with it. Every device then holds the same shards, so per-device memory and "
            f"FLOPs stay the same; arrays sharded over {axis!r} (FSDP weights) must shrink by {factor} too, "
            f"and collectives over {axis!r} run in groups {factor}x smaller."
        )
    raise UsageError(
        f"This mesh has {total:,} devices ({layout}), but XLA's CPU backend compiles for at most "
        f"{CPU_DEVICE_CEILING:,}: with 4,096 it fails with \"Multiprocess computations aren't implemented\". "
        f"{advice}"
    )


# --- device memory -----------------------------------------------------------------------------

def device_capacity(mesh, hardware: Hardware | None, device_memory=None) -> tuple[int | None, str | None]:
    """The device's memory and where that figure comes from: --device-memory, the hardware
    profile, or the device itself (its memory_stats' bytes_limit; simulated CPUs report none)."""
    if device_memory is not None:
        return parse_memory_size(device_memory), "--device-memory"
    if hardware is not None and hardware.memory:
        return hardware.memory, f"{hardware.name} profile"
    try:
        stats = mesh.devices.flat[0].memory_stats()
    except Exception:  # backends without memory statistics raise rather than return None
        stats = None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), "device"
    return None, None


def format_bytes(n: float) -> str:
    """`16.0 KiB`, `1.5 GiB`: bytes in the largest binary unit that keeps a number >= 1."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _warn_concrete(concrete: list[tuple[str, int]], capacity: int | None) -> None:
    if capacity is None:
        return
    for label, nbytes in concrete:
        if nbytes > capacity:
            warnings.warn(
                f"{label} is a concrete array of {format_bytes(nbytes)}, more than one device's "
                f"{format_bytes(capacity)}. A plan needs only its shape and sharding: make it with "
                f"`jaxpar_magic.plan(shape, dtype, mesh, spec)` (or a jax.ShapeDtypeStruct) and free this "
                f"array (`del`) to plan without holding it in memory.",
                PlanWarning,
                stacklevel=3,
            )


# --- collectives over the mesh -----------------------------------------------------------------

def _quoted(axes) -> str:
    return " x ".join(repr(a) for a in axes)


def _varying_axes(positions, shape, names) -> tuple[list[str], int]:
    """Mesh axes the devices at `positions` differ along, and how many devices those axes span."""
    import numpy as np

    coords = np.array(np.unravel_index(np.asarray(positions), shape)).reshape(len(shape), -1)
    varying = [i for i in range(len(shape)) if coords[i].min() != coords[i].max()]
    return [names[i] for i in varying], int(np.prod([shape[i] for i in varying]))


def _describe_groups(groups, shape, names) -> tuple[tuple[str, ...], int, str]:
    """(axes, group size, text) for replica groups given as mesh positions."""
    sizes = sorted({len(g) for g in groups})
    axes: list[str] = []
    partial = False
    for group in groups:
        varying, span = _varying_axes(group, shape, names)
        axes.extend(a for a in varying if a not in axes)
        partial = partial or span != len(group)
    axes = [n for n in names if n in axes]  # mesh order
    size = sizes[-1]
    count = f"{len(groups)} group{'s' if len(groups) != 1 else ''}"
    of = f"of {size}" if len(sizes) == 1 else f"of {sizes[0]} to {size}"
    if size == 1:
        return (), 1, f"{count} of 1 (no data moves)"
    over = f"over part of {_quoted(axes)}" if partial else f"over {_quoted(axes)}"
    return tuple(axes), size, f"{count} {of} {over}"


def _describe_pairs(pairs, shape, names) -> tuple[tuple[str, ...], int, list[list[int]], str]:
    """(axes, group size, groups, text) for a collective-permute's (source, target) positions."""
    sends = [(a, b) for a, b in pairs if a != b]
    if not sends:
        return (), 1, [], "no device sends (every device keeps its block)"
    parent: dict[int, int] = {}

    def root(x: int) -> int:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    axes: list[str] = []
    for a, b in sends:
        parent[root(a)] = root(b)
        varying, _ = _varying_axes([a, b], shape, names)
        axes.extend(v for v in varying if v not in axes)
    components: dict[int, list[int]] = {}
    for x in list(parent):
        components.setdefault(root(x), []).append(x)
    groups = sorted(sorted(c) for c in components.values())
    axes = [n for n in names if n in axes]
    size = max(len(g) for g in groups)
    text = f"{len(sends)} send{'s' if len(sends) != 1 else ''} between pairs of devices along {_quoted(axes)}"
    return tuple(axes), size, groups, text


def _ring_array_bytes(c: Collective, size: int) -> int:
    """The array a ring algorithm passes around: a reduce-scatter's input (`size` blocks), else the result."""
    if c.op != "reduce-scatter":
        return c.bytes
    return c.operand_bytes if c.operand_bytes is not None else c.bytes * size


def _library_dirs() -> tuple[str, ...]:
    """Directories whose frames are not the user's: JAX, jaxlib, this package, Python's own."""
    import sysconfig

    import jax
    import jaxlib

    dirs = {os.path.dirname(jax.__file__), os.path.dirname(jaxlib.__file__), os.path.dirname(__file__)}
    dirs.update(p for p in (sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")) if p)
    return tuple(os.path.join(d, "") for d in dirs)


def is_user_file(file: str) -> bool:
    """A frame in the user's code: a notebook cell (registered in linecache) or a file outside the
    libraries (`_library_dirs`)."""
    if file.startswith("<"):
        return file in linecache.cache
    return not file.startswith(_LIBRARIES or _libraries())


_LIBRARIES: tuple[str, ...] = ()


def _libraries() -> tuple[str, ...]:
    global _LIBRARIES
    _LIBRARIES = _library_dirs()
    return _LIBRARIES


def cell_label(file: str) -> str:
    """`In[3]` for a notebook cell (IPython's own name for it), the file's name otherwise."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        named = shell.compile.format_code_name(file) if shell is not None else None
    except Exception:  # no IPython, or one without format_code_name
        named = None
    if named:
        return named[1]
    return file if file.startswith("<") else os.path.basename(file)


def _origin(frame: tuple | None) -> dict | None:
    if frame is None:
        return None
    file, line, function = frame
    return {"function": function or None, "line": line, "source": linecache.getline(file, line).strip() or None,
            "cell": cell_label(file)}


def plan_collectives(found: list[Collective], mesh, line_text: Callable[[int], str] | None = None,
                     filename: str | None = None) -> list[PlannedCollective]:
    """The compiled program's collectives with their groups mapped to mesh axes and device ids.
    `found` holds replica-group positions in mesh order (hlo.collectives without device ids)."""
    shape = tuple(mesh.devices.shape)
    names = [str(n) for n in mesh.axis_names]
    ids = [d.id for d in mesh.devices.flat]
    total = len(ids)
    planned = []
    for c in found:
        if c.op == "collective-permute":
            axes, size, groups, text = _describe_pairs(c.pairs, shape, names)
        else:
            groups = c.groups or [list(range(total))]
            axes, size, text = _describe_groups(groups, shape, names)
        traffic = RING_FACTORS[c.op](size) * _ring_array_bytes(c, size) if size > 1 else 0.0
        if c.count is None:
            text += ", in a loop of unknown length (counted once)"
        elif c.count > 1:
            text += f", {c.count:,} times (in a loop)"
        source = None
        if c.line is not None:
            source = line_text(c.line) if line_text is not None else linecache.getline(filename or "", c.line).strip()
        planned.append(PlannedCollective(
            op=c.op, shape=c.shape, bytes=c.bytes, traffic_bytes=traffic, count=c.count, group_size=size,
            groups=[[ids[p] for p in g] for g in groups], axes=axes, groups_text=text, line=c.line,
            source=source or None, upcast_from=c.upcast_from, operand_bytes=c.operand_bytes,
            origin=_origin(c.origin),
        ))
    return planned


# --- compiling ---------------------------------------------------------------------------------

def _source_file(fn) -> str | None:
    code = getattr(inspect.unwrap(fn), "__code__", None)
    return code.co_filename if code is not None else None


def _where(exc: BaseException, filename: str | None) -> str:
    """`line 3 of the cell (...)` for a cell's named filename, `line 12 of train.py (...)` for a file."""
    hit = user_line(exc, filename) if filename else None
    if hit is None:
        return "the planned function"
    is_cell = filename.startswith("<") and filename in linecache.cache  # cells register their source there
    place = "the cell" if is_cell else os.path.basename(filename)
    quoted = f" (`{hit[1]}`)" if hit[1] else ""
    return f"line {hit[0]} of {place}{quoted}"


def _no_values_error(exc: BaseException, filename: str | None) -> UsageError:
    at = _where(exc, filename)
    return UsageError(
        f"{at}: this needs a concrete value ({type(exc).__name__}), but a plan has no values: its inputs "
        f"are shapes and shardings only, and nothing runs. Compute it from shapes (`x.shape[0]`), write "
        f"Python `if x > 0` as `jnp.where(x > 0, a, b)` or `jax.lax.cond`, and `float(x)` as a jnp "
        f"expression; or run the cell without --plan on real arrays."
    )


def _cost(compiled) -> dict:
    try:
        cost = compiled.cost_analysis() or {}
    except Exception:  # not every backend implements cost analysis
        return {}
    return cost[0] if isinstance(cost, (list, tuple)) and cost else cost if isinstance(cost, dict) else {}


def _figure(cost: dict, key: str) -> float | None:
    value = cost.get(key)
    return float(value) if value is not None and value >= 0 else None


def output_structs(compiled):
    """The compiled program's outputs as plain ShapeDtypeStructs with their shardings."""
    import jax

    def plain(info):
        return jax.ShapeDtypeStruct(info.shape, info.dtype, sharding=info.sharding,
                                    weak_type=getattr(info, "weak_type", False))

    return jax.tree.map(plain, compiled.out_info)


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
    import numpy as np

    entries = []
    for name, tree in named.items():
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
                continue  # a plain Python value the program returned
            entries.append({
                "name": name + jax.tree_util.keystr(path),
                "shape": [int(d) for d in leaf.shape],
                "dtype": np.dtype(leaf.dtype).name,
                "spec": _spec_entries(getattr(leaf, "sharding", None), len(leaf.shape)),
            })
    return entries


def compile_plan(fn, abstract_args, mesh, *, names=None, filename: str | None = None,
                 line_text: Callable[[int], str] | None = None, hardware: Hardware | str | None = None,
                 device_memory=None, set_mesh: bool = True, topology: str | None = None, leaf_labels=None) -> Plan:
    """Compile `fn(*abstract_args)` for `mesh` without running it, and say what it costs per device.

    `fn`: a `jax.jit`-ed function (anything with `.lower`), or a function to jit. `abstract_args`:
    pytrees of ShapeDtypeStructs or arrays (which stand in by shape and sharding; unsharded ones are
    replicated). `names`: one label per argument, for messages. `filename`: the file (or cell
    filename) whose lines name the collectives, by default `fn`'s own; `line_text(n)` gives line n's
    text (default: linecache). `hardware`: a profile or its name, for the step time and the memory;
    `device_memory` (bytes or "16GiB") overrides the memory; `topology` ("4x8") the physical slice the
    mesh is laid onto (default: as jax.make_mesh would lay it). With `set_mesh`, traces under
    `jax.set_mesh(mesh)`, as the %%shard engine runs.
    """
    import jax

    check_scale(mesh)
    if not isinstance(mesh, jax.sharding.Mesh):
        raise UsageError(
            "A plan compiles for devices, so it needs a Mesh of devices, not an AbstractMesh: simulate them "
            "first (`%devices --simulate 512`, or jax.config.update('jax_num_cpu_devices', 512) before JAX "
            "starts) and build the mesh over them (`%mesh data=64 model=8`, or jaxpar_magic.make_mesh)."
        )
    if isinstance(hardware, str):
        hardware = parse_hardware(hardware)
    if topology is not None and hardware is None:
        raise UsageError(f"--topology {topology}: a topology belongs to a device profile; add --hardware "
                         f"(e.g. `--hardware tpu-v5e --topology {topology}`).")
    sizes = {str(n): int(s) for n, s in mesh.shape.items()}
    topology = topology if topology is not None else getattr(hardware, "topology", None)
    laid_out = topology_for(hardware, sizes, topology) if hardware is not None else None  # before compiling
    capacity, capacity_source = device_capacity(mesh, hardware, device_memory)
    memory_note = None
    if hardware is not None and hardware.preallocate and device_memory is None and capacity:
        usable = int(capacity * hardware.preallocate)
        memory_note = (f"JAX preallocates {hardware.preallocate:.0%} of a GPU's memory by default: "
                       f"{format_bytes(usable)} of the {format_bytes(capacity)}. To use more, set "
                       f"XLA_PYTHON_CLIENT_MEM_FRACTION=.95 (or XLA_PYTHON_CLIENT_PREALLOCATE=false) before JAX "
                       f"starts, and plan with --device-memory {format_bytes(capacity).replace(' ', '')}.")
        capacity, capacity_source = usable, f"{hardware.name} profile, {hardware.preallocate:.0%} JAX preallocates"
    args, concrete = abstract_inputs(abstract_args, mesh, names, leaf_labels)
    _warn_concrete(concrete, capacity)
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    if filename is None:
        filename = _source_file(fn)
    start = time.perf_counter()
    try:
        if set_mesh:
            with jax.set_mesh(mesh):
                lowered = jitted.lower(*args)
                compiled = lowered.compile()
        else:
            lowered = jitted.lower(*args)
            compiled = lowered.compile()
    except UsageError:
        raise
    except Exception as exc:
        if isinstance(exc, tuple(getattr(jax.errors, name) for name in _NO_VALUES)):
            raise _no_values_error(exc, filename) from None
        explained = explain_trace_error(exc, filename or "", tuple(str(n) for n in mesh.axis_names))
        if explained is not None:
            raise explained from None
        raise
    compile_ms = (time.perf_counter() - start) * 1e3

    memory = compiled.memory_analysis()
    cost = _cost(compiled)
    text = compiled.as_text()
    program = lowered.as_text(dialect="hlo", debug_info=True)  # the program's own dtypes, before XLA:CPU's passes
    types, matmuls = program_facts(program)
    upcast = upcasts(text, types)
    planned = plan_collectives(collectives(text, None, filename, upcast.shadows, is_user_file), mesh, line_text,
                               filename)
    flops, cpu_bytes = _figure(cost, "flops"), _figure(cost, "bytes accessed")
    bytes_accessed = max(0.0, cpu_bytes - upcast.traffic_bytes) if cpu_bytes is not None else None
    caveats = list(CAVEATS)
    if upcast.shadows:
        caveats.append(UPCAST_CAVEAT)
    if " while(" in text:
        caveats.append(LOOP_CAVEAT)
    times = None
    if hardware is not None:
        times, planned = estimate(flops, bytes_accessed, planned, hardware, laid_out, matmuls)
        caveats.append(ROOFLINE_CAVEAT)
        if hardware.kind == "gpu":
            caveats.append(GPU_CAVEAT)
    return Plan(
        mesh=mesh,
        argument_bytes=int(memory.argument_size_in_bytes),
        output_bytes=int(memory.output_size_in_bytes),
        temp_bytes=int(memory.temp_size_in_bytes),
        alias_bytes=int(memory.alias_size_in_bytes),
        flops=flops,
        bytes_accessed=bytes_accessed,
        compile_ms=compile_ms,
        collectives=planned,
        outputs=output_structs(compiled),
        hardware=hardware,
        capacity=capacity,
        capacity_source=capacity_source,
        roofline=times,
        topology=laid_out,
        cpu_bytes_accessed=cpu_bytes,
        memory_note=memory_note,
        caveats=tuple(caveats),
        compiled=compiled,
    )


# --- a planned cell (the engines' --plan stage) ------------------------------------------------

def plan_program(prepared, *, hardware=None, device_memory=None, set_mesh=True, reshape=None) -> Plan:
    """The --plan stage: compile a prepared cell's program (prepared.PreparedCell) over its abstract
    arguments, never run.

    `reshape` an optional map applied to each device output leaf's ShapeDtypeStruct (--merge). The
    plan carries what the cell would bind: computed outputs as ShapeDtypeStructs with their
    shardings, rebuilt as the user's types (the next planned cell can take them), plain Python
    values as they are.
    """
    from .progress import Progress

    program, cell = prepared.program(), prepared.cell
    with Progress("planning"):
        plan = compile_plan(program.jitted, prepared.arguments, prepared.mesh, names=list(prepared.names),
                            filename=cell.filename, line_text=cell.line, hardware=hardware,
                            device_memory=device_memory, set_mesh=set_mesh, leaf_labels=prepared.labels())
    plan.bindings = dict(program.static_outputs)
    plan.bindings.update(program.outputs_of(plan.outputs[0], reshape))
    plan.computed = tuple(program.device_outputs)
    return plan
