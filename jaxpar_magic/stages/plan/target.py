"""Which compiler makes a plan: XLA:TPU for compile-only devices of a TPU slice, or XLA:CPU.

With the optional `libtpu` package (`pip install "jaxpar_magic[tpu]"`), a plan for a TPU profile
with `--topology AxB[xC]` compiles for compile-only TPU devices of that slice, as MaxText's
`train_compile` does from a CPU host: `jax.experimental.topologies.get_topology_desc(platform="tpu",
topology_name="v5e:4x4")` gives the devices, the mesh is laid onto them as `jax.make_mesh` would
(several slices over DCN as `create_hybrid_device_mesh` does), and `jit(...).lower(...).compile()`
runs XLA:TPU itself. Nothing runs on, or needs, a TPU; `jax.devices()` stays what it was.

Where the mesh is of the accelerator chips this process has (a TPU host: `devices_of(mesh)` says
"tpu"), a plan without `--topology` is compiled by their own compiler for them (`on_attached`), and fits
against what they report (`memory_stats()['bytes_limit']`). Everything else (no libtpu, no `--topology`,
a GPU or custom profile, `--compiler cpu`) compiles with XLA:CPU for simulated devices, and the plan says
how to get the target's own compile.

Loading libtpu without a TPU makes it print start-up warnings on the process's stderr (in a
notebook, ipykernel forwards that into the cell); `native_stderr.heard` keeps them out, and hands on
anything else. libtpu also holds a lock file for the life of the process: a second process (a
parallel kernel, a cluster engine) may load it too only with ALLOW_MULTIPLE_LIBTPU_LOAD=1, which
compile-only devices need no more than that.
"""
from __future__ import annotations

import functools
import math
import os
import re
from dataclasses import dataclass

from ...errors import UsageError
from .hardware import Hardware
from .native_stderr import heard
from .topology import check_shape

INSTALL = 'pip install "jaxpar_magic[tpu]"'
CHIPS = {"tpu-v4": "v4", "tpu-v5e": "v5e", "tpu-v5p": "v5p", "tpu-v6e": "v6e"}  # libtpu's names (get_topology_desc)
COMPILERS = ("auto", "tpu", "cpu")
# What libtpu writes to stderr while it starts without a TPU (measured with libtpu 0.0.42).
_STARTUP_NOISE = re.compile(
    r"Failed to find host bounds|could not determine TPU|Logging before InitGoogle|common_lib\.cc|"
    r"Source Location Trace|libtpu_init_utils|TPU_WORKER_HOSTNAMES|TPU_ACCELERATOR_TYPE|^\s*$"
)


@dataclass(frozen=True)
class Target:
    """The compiler a plan is made by, the devices it compiles for, and what to say about it."""

    compiler: str  # "XLA:TPU" | "XLA:CPU"
    mesh: object  # the mesh to compile for: compile-only TPU devices, or the simulated CPU ones
    where: str  # "a v5e 4x4 slice", "8 simulated CPU devices"
    note: str | None = None  # XLA:CPU with a target profile: why it is not the target's compiler, and how to get it
    version: str | None = None  # libtpu's version
    attached: bool = False  # compiling for the accelerator chips this process has (a TPU host), not compile-only ones

    @property
    def is_tpu(self) -> bool:
        return self.compiler == "XLA:TPU"

    @property
    def is_cpu(self) -> bool:
        return self.compiler == "XLA:CPU"

    def describe(self) -> str:
        made = f"compiled by {self.compiler} for {self.where}"
        return made + (f" (libtpu {self.version})" if self.version else "")

    def state(self) -> dict:
        return {"name": self.compiler, "where": self.where, "text": self.describe(), "note": self.note}


def libtpu_version() -> str | None:
    """The installed libtpu's version, or None (read from the package metadata: nothing is loaded)."""
    from importlib import metadata

    try:
        return metadata.version("libtpu")
    except metadata.PackageNotFoundError:
        return None


def _cpu(mesh, note: str | None) -> Target:
    count = int(math.prod(_sizes(mesh).values()))
    return Target("XLA:CPU", mesh, f"{count} simulated CPU device{'s' if count != 1 else ''}", note)


@dataclass(frozen=True)
class Devices:
    """What the mesh's devices are: their platform ("cpu", "tpu", "gpu"), kind ("TPU v5 lite") and count."""

    platform: str
    kind: str
    count: int


def devices_of(mesh) -> Devices:
    """The description of `mesh`'s devices (the first device's platform and kind; a mesh is of one kind);
    an AbstractMesh has none: "abstract"."""
    import jax

    if not isinstance(mesh, jax.sharding.Mesh):
        return Devices("abstract", "", int(math.prod(_sizes(mesh).values())))
    first = mesh.devices.flat[0]
    return Devices(str(getattr(first, "platform", "cpu")), str(getattr(first, "device_kind", "")),
                   int(mesh.devices.size))


def on_attached(devices: Devices, mesh, hardware: Hardware | None, compiler: str, version: str | None) -> Target | None:
    """The target where the mesh is of accelerator chips this process has (a TPU host): their own compiler,
    for them, unless --topology names another slice to compile for (None: decide as for simulated devices)."""
    if devices.platform not in ("tpu", "gpu") or getattr(hardware, "topology", None):
        return None
    name = f"XLA:{devices.platform.upper()}"
    if compiler == "cpu" or compiler == "tpu" and devices.platform != "tpu":
        raise UsageError(f"--compiler {compiler}: the mesh is of the attached {devices.kind or devices.platform} "
                         f"devices, which {name} compiles for. Drop --compiler, or plan over other devices (a "
                         f"TPU slice: `--hardware tpu-v5e --topology 4x4`).")
    chips = "chip" if devices.platform == "tpu" else "device"
    where = f"{devices.count} attached {devices.kind or devices.platform} {chips}{'s' if devices.count != 1 else ''}"
    return Target(name, mesh, where, None, version if devices.platform == "tpu" else None, attached=True)


def choose(mesh, hardware: Hardware | None, compiler: str = "auto", devices: Devices | None = None) -> Target:
    """The target for planning over `mesh` on `hardware` (its `topology` is --topology). `devices`: what the
    mesh's devices are (by default read from them: `devices_of`); on a TPU host, its chips and XLA:TPU."""
    if compiler not in COMPILERS:
        raise UsageError(f"--compiler {compiler}: choose one of {', '.join(COMPILERS)} (auto: XLA:TPU where libtpu "
                         f"and --topology allow it, else XLA:CPU).")
    kind = getattr(hardware, "kind", None)
    version = libtpu_version()
    attached = on_attached(devices or devices_of(mesh), mesh, hardware, compiler, version)
    if attached is not None:
        return attached
    if kind != "tpu":
        if compiler == "tpu":
            raise UsageError("--compiler tpu compiles for TPU devices: add a TPU profile and its slice, e.g. "
                             "`--hardware tpu-v5e --topology 4x4`.")
        note = None
        if kind == "gpu":
            note = (f"No GPU compiler runs here: these are XLA:CPU's figures for {hardware.name}. Where the CPU "
                    f"program sums a whole array that each device only slices, the plan shows the reduce-scatter "
                    f"XLA:GPU makes; temporaries and fusion still follow XLA:CPU.")
        return _cpu(mesh, note)
    slice_text = hardware.topology
    example = slice_text or _example_slice(hardware, mesh)
    if compiler == "cpu":
        return _cpu(mesh, "--compiler cpu: XLA:CPU's program, not XLA:TPU's (drop --compiler cpu to compile with "
                          "XLA:TPU).")
    if version is None:
        if compiler == "tpu":
            raise UsageError(f"--compiler tpu needs the optional libtpu package, which is not installed: "
                             f"`{INSTALL}` (it installs jax[tpu] at your JAX's version, about 480 MB), then restart "
                             f"the kernel.")
        return _cpu(mesh, f"Compiled by XLA:CPU, not XLA:TPU: for XLA:TPU's own program (its fusion, its "
                          f"collectives, TPU tile padding in memory), `{INSTALL}`, restart the kernel and plan with "
                          f"`--hardware {hardware.name} --topology {example}`.")
    if slice_text is None:
        if compiler == "tpu":
            raise UsageError(f"--compiler tpu: name the TPU slice to compile for with --topology, e.g. "
                             f"`--hardware {hardware.name} --topology {example}`.")
        return _cpu(mesh, f"Compiled by XLA:CPU, not XLA:TPU: libtpu is installed; name the slice "
                          f"(`--topology {example}`) to compile with XLA:TPU for it.")
    from .topology import topology_for

    topology_for(hardware, _sizes(mesh), slice_text)  # the mesh fits the slice(s), or the cost model's UsageError
    tpu = tpu_mesh(hardware, slice_text, mesh)
    where = f"a {CHIPS[hardware.name]} {slice_text} slice"
    slices = int(math.prod(tpu.devices.shape)) // math.prod(check_shape(hardware, slice_text))
    if slices > 1:
        where = f"{slices} {CHIPS[hardware.name]} {slice_text} slices over DCN"
    return Target("XLA:TPU", tpu, where, None, version)


def _example_slice(hardware: Hardware, mesh) -> str:
    """The slice the mesh would be laid onto (topology.slice_shape_for), as --topology text."""
    from .topology import slice_shape_for

    try:
        shape, _ = slice_shape_for(hardware, int(math.prod(_sizes(mesh).values())))
    except UsageError:
        return "x".join(["4"] * len(hardware.pod))
    return "x".join(map(str, shape))


def _sizes(mesh) -> dict[str, int]:
    return {str(n): int(s) for n, s in mesh.shape.items()}


def tpu_mesh(hardware: Hardware, slice_text: str, mesh):
    """`mesh`'s axes (names, sizes, axis types) over compile-only devices of `slice_text` slices."""
    sizes = _sizes(mesh)
    axis_types = tuple(getattr(mesh, "axis_types", ()) or ())
    return _tpu_mesh(hardware.name, slice_text, tuple(sizes.items()), axis_types)


@functools.lru_cache(maxsize=16)
def _tpu_mesh(profile: str, slice_text: str, axes: tuple, axis_types: tuple):
    import jax
    import numpy as np
    from jax.experimental import mesh_utils

    from .hardware import PROFILES

    shape = check_shape(PROFILES[profile], slice_text)
    chips = math.prod(shape)
    sizes = dict(axes)
    total = math.prod(sizes.values())
    layout = ", ".join(f"{n}={s}" for n, s in sizes.items())
    if total % chips:
        raise UsageError(
            f"--topology {slice_text}: the mesh ({layout}) has {total} devices, which is not a whole number of "
            f"{CHIPS[profile]} {slice_text} slices of {chips} chips. Plan a mesh of {chips} devices (or a multiple "
            f"of it: the rest are further slices over DCN), or name a slice of {total} chips.")
    slices = total // chips
    devices = _devices(CHIPS[profile], slice_text, shape, slices)
    mesh_shape = tuple(sizes.values())
    try:
        if slices == 1:
            grid = mesh_utils.create_device_mesh(mesh_shape, devices, allow_split_physical_axes=True)
        else:
            dcn, left = [], slices
            for size in mesh_shape:  # slices take the outermost mesh axes, as topology.topology_for lays them
                share = math.gcd(left, size)
                dcn.append(share)
                left //= share
            ici = tuple(s // d for s, d in zip(mesh_shape, dcn))
            grid = mesh_utils.create_hybrid_device_mesh(ici, tuple(dcn), devices, allow_split_physical_axes=True)
    except Exception:  # a mesh shape mesh_utils cannot lay onto the torus: the devices in libtpu's order
        grid = np.array(devices, dtype=object).reshape(mesh_shape)
    kwargs = {"axis_types": axis_types} if axis_types else {}
    return jax.sharding.Mesh(grid, tuple(sizes), **kwargs)


def _host_bounds(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """Chips per host that divide the slice (libtpu's default 2x2x1 does not divide 1x4 or 3x3)."""
    return tuple(math.gcd(d, 2) for d in shape[:2]) + (1,)


@functools.lru_cache(maxsize=16)
def _devices(chip: str, slice_text: str, shape: tuple[int, ...], slices: int) -> list:
    from jax.experimental import topologies

    name = f"{chip}:{'x'.join(map(str, shape))}"
    options = {}
    if chip == "v4":
        options["chip_config_name"] = "megacore"  # one JAX device per v4 chip, as on a real v4
    if _host_bounds(shape) != (2, 2, 1):
        options["chips_per_host_bounds"] = _host_bounds(shape)
    if slices > 1:
        options["num_slices"] = slices
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # compile-only: never the one process owning a TPU
    with heard(_STARTUP_NOISE) as said:
        try:
            return list(topologies.get_topology_desc(platform="tpu", topology_name=name, **options).devices)
        except Exception as exc:
            error = exc
    detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    heard_text = " ".join(line.strip() for line in said() if line.strip())[:300]
    raise UsageError(
        f"--topology {slice_text}: libtpu does not compile for a {chip} {slice_text} slice ({detail})"
        + (f"; it said: {heard_text}" if heard_text else "")
        + f". Name a slice libtpu knows, with every side even, e.g. `--topology {'x'.join(['2'] * len(shape))}` "
          f"or `--topology {'x'.join(['4'] * len(shape))}`."
    ) from None
