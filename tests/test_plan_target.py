"""Plans know the machine they run on (issue 39): on a TPU host a plan without --hardware is XLA:TPU's for
the attached chips and says so; a named TPU's profile fits against what XLA lets a program use.

The choice of compiler is a function of what the mesh's devices are (`target.Devices`), so these tests
hand it a TPU host's description; the device tier (tests marked `device`) plans on the chip itself."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxpar_magic
from jaxpar_magic.engines.shard import make_mesh
from jaxpar_magic.errors import UsageError
from jaxpar_magic.stages.plan.hardware import PROFILES
from jaxpar_magic.stages.plan.plan import attached_caveats
from jaxpar_magic.stages.plan.target import Devices, choose, devices_of, libtpu_version

TPU_HOST = Devices("tpu", "TPU v5 lite", 1)


def test_the_devices_of_a_simulated_mesh_are_cpus():
    mesh = make_mesh("data=8")
    assert devices_of(mesh) == Devices("cpu", mesh.devices.flat[0].device_kind, 8)
    assert choose(mesh, None).compiler == "XLA:CPU"


def test_on_a_tpu_host_a_plan_is_xla_tpus_for_the_attached_chips():
    mesh = make_mesh("data=8")  # stands for the host's mesh: the decision reads only the description
    for hardware in (None, PROFILES["tpu-v5e"]):
        target = choose(mesh, hardware, devices=TPU_HOST)
        assert (target.compiler, target.attached, target.mesh) == ("XLA:TPU", True, mesh)
        assert target.describe() == "compiled by XLA:TPU for 1 attached TPU v5 lite chip" + (
            f" (libtpu {libtpu_version()})" if libtpu_version() else "")
        assert target.note is None  # none of XLA:CPU's "compiled by XLA:CPU, not XLA:TPU"
    (caveat,) = attached_caveats(target)
    assert "XLA:TPU itself, compiling for 1 attached TPU v5 lite chip" in caveat and "CPU" not in caveat


def test_on_a_tpu_host_a_named_slice_is_still_compiled_compile_only():
    from jaxpar_magic.stages.plan.topology import with_topology

    sliced = with_topology(PROFILES["tpu-v5e"], "2x4")
    target = choose(make_mesh("data=8"), sliced, devices=TPU_HOST) if libtpu_version() else None
    if target is not None:
        assert target.compiler == "XLA:TPU" and not target.attached and target.where == "a v5e 2x4 slice"


def test_on_a_tpu_host_compiler_cpu_is_refused_in_one_paragraph():
    with pytest.raises(UsageError, match=r"the mesh is of the attached TPU v5 lite devices, which XLA:TPU compiles"):
        choose(make_mesh("data=8"), None, "cpu", devices=TPU_HOST)


def test_a_v5e_plan_fits_against_what_xla_lets_a_program_use():
    # A step at 15.9 GiB a device "fit" a v5e's 16 GiB; the chip gives a program 16,909,336,064 bytes
    # ("available HBM (15.75G)") and refuses it.
    mesh = make_mesh("data=8", axis_types="auto")
    rows = int(15.9 * 2**30 / 2 / 4 / 1024)  # x and y: 15.9 GiB together on each device
    x = jax.ShapeDtypeStruct((8 * rows, 1024), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    planned = jaxpar_magic.plan_cell("y = x * 2\n", {"x": x}, mesh=mesh, hardware="tpu-v5e", compiler="cpu",
                                     bind=False)
    assert 15.8 * 2**30 < planned.total_bytes < 16 * 2**30
    assert planned.capacity == 16_909_336_064 and planned.fits is False
    assert "available HBM (15.75G)" in planned.hardware.sources["memory"]
