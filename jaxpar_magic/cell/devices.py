"""Device facts and simulated devices.

Importing this module does not start the JAX backend: only the functions that need devices do.
"""
from __future__ import annotations

import glob
import os
import sys
from dataclasses import asdict, dataclass

from ..errors import UsageError

PLATFORMS = ("cpu", "gpu", "tpu")
GOOGLE_PCI_VENDOR = "0x1ae0"  # a TPU chip on the PCI bus (what JAX's own TPU detection reads)
MAX_LISTED = 64  # rows a device view lists; the rest are counted, never shipped


@dataclass(frozen=True)
class DeviceFacts:
    id: int
    platform: str
    kind: str
    process: int
    coords: list[int] | None
    core: int | None
    mem_used: int | None
    mem_limit: int | None


def _memory(device) -> tuple[int | None, int | None]:
    try:
        stats = device.memory_stats()
    except Exception:  # some PJRT plugins raise instead of returning None
        return None, None
    if not stats:
        return None, None
    return stats.get("bytes_in_use"), stats.get("bytes_limit")


def facts(device) -> DeviceFacts:
    coords = getattr(device, "coords", None)
    used, limit = _memory(device)
    return DeviceFacts(
        id=int(device.id),
        platform=device.platform,
        kind=str(device.device_kind),
        process=int(device.process_index),
        coords=list(coords) if coords is not None else None,
        core=getattr(device, "core_on_chip", None),
        mem_used=used,
        mem_limit=limit,
    )


def simulate(count: int) -> None:
    """Ask for `count` simulated CPU devices; must run before the JAX backend starts.

    JAX refuses `jax_num_cpu_devices` once its backend is up (a public, documented behaviour we
    rely on instead of a private "is the backend started?" flag). The `XLA_FLAGS` route would
    silently do nothing then, so we never use it.
    """
    import jax

    if count < 1:
        raise UsageError(f"--simulate needs a positive device count, got {count}.")
    try:
        jax.config.update("jax_num_cpu_devices", count)
        # On a GPU/TPU host, JAX would still pick the accelerator as the default backend; the user
        # asked for a CPU simulation, so the CPU devices are the ones every cell should see.
        jax.config.update("jax_platforms", "cpu")
    except RuntimeError:
        have = jax.device_count("cpu") if jax.default_backend() == "cpu" else None
        if have == count:
            return  # already running with what was asked: nothing to do
        raise UsageError(
            f"%devices --simulate {count}: the JAX backend has already started with "
            f"{jax.device_count()} {jax.default_backend()} device(s), and the device count cannot change "
            f"in a running process. Restart the kernel and run `%devices --simulate {count}` (right after "
            "`%load_ext jaxpar_magic`) before any other JAX code."
        ) from None


def accelerator_attached() -> bool:
    """A TPU chip on the PCI bus, or a GPU driver's device nodes: read from /sys and /dev, nothing loaded."""
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(vendor) as f:
                if f.read().strip() == GOOGLE_PCI_VENDOR:
                    return True
        except OSError:
            continue
    return bool(glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/kfd") or glob.glob("/dev/accel*"))


def cpu_when_nothing_attached() -> bool:
    """Make JAX start on the CPU, as it would end up anyway, when libtpu is installed but no accelerator
    is attached and the user chose no platform; True when it did.

    With the optional libtpu installed (for plans compiled by XLA:TPU, stages/plan/target.py), JAX's
    default backend search tries the TPU first: it loads the 480 MB library, prints its start-up
    warnings on stderr (which ipykernel shows in the notebook), takes about 2 s, and then falls back to
    the CPU. Asking for the CPU up front skips that and changes nothing else: the same devices, the
    same default backend. A platform the user chose (JAX_PLATFORMS, jax_platforms) is left alone.
    """
    import importlib.util

    if os.environ.get("JAX_PLATFORMS") or importlib.util.find_spec("libtpu") is None or accelerator_attached():
        return False
    if "jax" not in sys.modules:
        os.environ["JAX_PLATFORMS"] = "cpu"  # read when JAX is imported: nothing of JAX loaded now
        return True
    import jax

    if jax.config.jax_platforms:
        return False
    jax.config.update("jax_platforms", "cpu")  # a backend already started keeps what it has
    return True


def device_count(platform: str) -> int:
    """jax.device_count for one platform, 0 where the platform is absent (JAX raises there)."""
    import jax

    try:
        return len(jax.devices(platform))
    except RuntimeError:
        return 0


def devices_state() -> dict:
    """The state of the device view: facts of every device, counts, processes (light at any scale)."""
    import jax

    devices = jax.devices()
    listed = [asdict(facts(d)) for d in devices[:MAX_LISTED]]
    per_process: dict[int, int] = {}
    for d in devices:
        per_process[d.process_index] = per_process.get(d.process_index, 0) + 1
    counts = {p: device_count(p) for p in PLATFORMS}
    backend = jax.default_backend()
    counts.setdefault(backend, len(devices))
    return {
        "devices": listed,
        "total": len(devices),
        "omitted": len(devices) - len(listed),
        "counts": counts,
        "processes": [{"process": p, "count": c} for p, c in sorted(per_process.items())],
        "simulated": backend == "cpu" and len(jax.devices("cpu")) > 1,
        "backend": backend,
    }


def select_devices(selection, axis_total: int | None = None) -> list:
    """The devices a cell runs on: all of them, the first N, or the listed ids.

    All of `jax.devices()`: in a cluster that is every process's devices, so that collectives span
    every process (in one process it is the local devices)."""
    import jax

    local = jax.devices()
    if selection is None:
        chosen = local if axis_total is None else local[:axis_total]
        if axis_total is not None and axis_total > len(local):
            raise UsageError(
                f"the mesh needs {axis_total} devices but JAX has {len(local)} "
                f"({local[0].platform}). Use a smaller mesh, or restart the kernel and ask for more "
                f"simulated devices with `%devices --simulate {axis_total}`."
            )
        return chosen
    if isinstance(selection, int):
        if selection < 1 or selection > len(local):
            raise UsageError(
                f"--devices {selection}: JAX has {len(local)} device(s). Ask for at most "
                f"{len(local)}, or restart the kernel and run `%devices --simulate {selection}` first."
            )
        return local[:selection]
    by_id = {d.id: d for d in local}
    missing = [i for i in selection if i not in by_id]
    if missing:
        raise UsageError(
            f"--devices: no device with id {missing[0]}; the device ids are "
            f"{sorted(by_id)[:16]}{' …' if len(by_id) > 16 else ''}."
        )
    if len(set(selection)) != len(selection):
        raise UsageError("--devices: a device id is listed twice; list each device once.")
    return [by_id[i] for i in selection]
