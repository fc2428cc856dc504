"""Device profiles for the plan's cost model (`--hardware tpu-v5e`) and memory sizes (`--device-memory 16GiB`).

A profile is one chip (one GPU) and the network it sits in, with every figure's source in `sources`:
- `peak_flops`: dense bf16 FLOP/s (without 2:4 sparsity); `peaks` the matmul rate per dtype class
  and precision (`f32` at JAX's default precision, `f32-highest`, `int8`), see `peak_for`;
- `hbm_bandwidth`: bytes/s between the chip and its HBM; `memory`: the bytes of it XLA lets one program use
  (a TPU's HBM less what the runtime keeps: the chip's `memory_stats()['bytes_limit']`, the figure XLA's
  refusals call "available HBM"), which is what a plan fits against;
- `interconnect_bandwidth`: bytes/s of one mesh axis mapped onto one physical axis, both directions
  (TPU: an ICI link each way; GPU: NVLink egress per GPU). `link_bandwidth`: one link, one way;
- the topology (stages/plan/topology.py reads it): a TPU pod's torus (`pod`), which slices wrap around
  (`wrap`), chips per host and DCN bytes/s per host beyond the pod; a GPU's NVLink domain
  (`node`) and the network's bytes/s per node beyond it; the latency of one hop.

Plain Python: no JAX.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ...errors import UsageError

GiB = 2**30

# The documents every figure below comes from (each profile's `sources` names which one, per figure).
BOOK = "How to Scale Your Model (jax-ml.github.io/scaling-book; jax-ml/scaling-book)"
TPU_TABLE = f"{BOOK}, tpus.md, chip table (pod size, host size, HBM, HBM BW, bf16 and int8 FLOP/s)"
ICI_TABLE = f"{BOOK}, tpus.md, interconnect table (ICI BW per link, one-way)"
WRAP_RULE = (f"{BOOK}, tpus.md: wraparound only on full axes: size 16 on v5e/v6e, multiples of a full 4x4x4 "
             f"cube on v4/v5p ('a 2x2x4 won't have any wraparounds')")
DCN_RULE = f"{BOOK}, tpus.md: 'DCN bandwidth is typically around 2.5e10 bytes / second per host'"
HOP_LATENCY = f"{BOOK}, sharding.md, 'A note on ICI latency': each hop costs about 1 us"
GPU_TABLE = f"{BOOK}, gpus.md, 'Summary of GPU specs' (DRAM, DRAM BW, BF16 and FP8/INT8 TFLOP/s)"
NVLINK_TABLE = f"{BOOK}, gpus.md, NVLink table: GPU-to-GPU bandwidth in a node of 8, per direction"
NODE_EGRESS = f"{BOOK}, gpus.md, 'Beyond the node level': 400 GB/s egress per H100 node (8x400 Gbps NICs)"
PRECISION = ("jax.lax.Precision docstring: DEFAULT does float32 matmuls in bfloat16 on TPU and in TF32 on "
             "A100/H100; HIGH in 3 bfloat16 passes on TPU (TF32 on GPU); HIGHEST in 6 on TPU, float32 on GPU")
PREALLOCATE = ("JAX documentation, 'GPU memory allocation': JAX preallocates 75% of the GPU's memory "
               "(XLA_PYTHON_CLIENT_MEM_FRACTION, XLA_PYTHON_CLIENT_PREALLOCATE=false)")


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float  # dense bf16 FLOP/s
    hbm_bandwidth: float
    interconnect_bandwidth: float  # one mesh axis on one physical axis, both directions
    memory: int | None
    source: str  # one line naming the documents
    kind: str = "custom"  # "tpu" | "gpu" | "custom"
    peaks: dict = field(default_factory=dict)  # FLOP/s by class: "f32", "f32-high", "f32-highest", "int8"
    link_bandwidth: float | None = None  # one ICI link (TPU) or one GPU's NVLink egress, one way
    pod: tuple[int, ...] = ()  # TPU: the largest ICI torus; GPU: (GPUs per NVLink domain,)
    wrap: str = ""  # TPU: "full-axis" (v5e/v6e: an axis of the pod's size wraps) | "cube" (v4/v5p)
    host_chips: int | None = None  # TPU chips per host (its DCN share)
    dcn_bandwidth: float | None = None  # TPU: bytes/s per host beyond the slice; GPU: per node beyond it
    hop_latency: float | None = None  # seconds per hop
    preallocate: float | None = None  # GPU: the share of memory JAX takes by default
    sources: dict = field(default_factory=dict, repr=False)  # figure name -> where it comes from
    topology: str | None = None  # --topology: the physical slice the mesh is laid onto (stages/plan/topology.py)

    def peak_for(self, dtype_class: str) -> tuple[float, str]:
        """(FLOP/s, what that rate is) of a matmul class: "bf16", "f32" (JAX's default precision),
        "f32-high", "f32-highest", "int8". A class without a sourced rate is timed at the bf16 peak,
        and says so."""
        if dtype_class in self.peaks:
            return self.peaks[dtype_class], _RATE_NAMES.get(dtype_class, dtype_class)
        if self.kind == "tpu" and dtype_class in _TPU_PASSES:
            passes = _TPU_PASSES[dtype_class]
            if passes == 1:
                return self.peak_flops, "bf16 peak: JAX's default precision does f32 matmuls in one bf16 pass"
            return self.peak_flops / passes, f"bf16 peak / {passes}: f32 matmuls in {passes} bf16 passes"
        if dtype_class == "bf16" or self.kind == "custom":
            return self.peak_flops, "bf16 peak" if self.kind != "custom" else "peak"
        return self.peak_flops, f"bf16 peak (no sourced {dtype_class} rate for {self.name})"

    @property
    def fabric(self) -> tuple[str, str]:
        """What the near and the far network are called: ("ICI", "DCN") or ("NVLink", "network")."""
        return ("NVLink", "network") if self.kind == "gpu" else ("ICI", "DCN")

    def state(self) -> dict:
        """The plan view's `hardware` entry."""
        return {
            "name": self.name, "peak_flops": self.peak_flops, "hbm_bandwidth": self.hbm_bandwidth,
            "interconnect_bandwidth": self.interconnect_bandwidth, "memory": self.memory, "source": self.source,
            "kind": self.kind, "link_bandwidth": self.link_bandwidth, "dcn_bandwidth": self.dcn_bandwidth,
            "hop_latency": self.hop_latency, "fabric": list(self.fabric),
        }


# TPU float32 matmuls: bf16 passes at each precision (PRECISION).
_TPU_PASSES = {"f32": 1, "f32-high": 3, "f32-highest": 6}
_RATE_NAMES = {"int8": "int8 peak", "f32": "TF32 rate (JAX's default f32 precision)", "f32-high": "TF32 rate",
               "f32-highest": "FP32 rate"}


def _tpu(name, *, bf16, int8, hbm, memory, link, pod, wrap, host_chips, sources_memory):
    return Hardware(
        name, bf16, hbm, 2 * link, memory,
        f"{BOOK}: tpus.md (chip and interconnect tables), sharding.md (latency); memory: {sources_memory}",
        kind="tpu", peaks={"int8": int8}, link_bandwidth=link, pod=pod, wrap=wrap, host_chips=host_chips,
        dcn_bandwidth=2.5e10, hop_latency=1e-6,
        sources={"peak_flops": TPU_TABLE, "int8": TPU_TABLE, "f32": PRECISION, "hbm_bandwidth": TPU_TABLE,
                 "memory": sources_memory, "link_bandwidth": ICI_TABLE,
                 "interconnect_bandwidth": ICI_TABLE + " (bidirectional: 2 links of one axis)", "pod": TPU_TABLE,
                 "host_chips": TPU_TABLE, "wrap": WRAP_RULE, "dcn_bandwidth": DCN_RULE, "hop_latency": HOP_LATENCY},
    )


def _gpu(name, *, bf16, tf32, fp32, int8, hbm, memory, nvlink, network, sources):
    peaks = {k: v for k, v in (("f32", tf32), ("f32-high", tf32), ("f32-highest", fp32), ("int8", int8)) if v}
    return Hardware(
        name, bf16, hbm, nvlink, memory, f"{BOOK}: gpus.md; {sources['datasheet']}",
        kind="gpu", peaks=peaks, link_bandwidth=nvlink, pod=(8,), host_chips=8, dcn_bandwidth=network,
        hop_latency=None, preallocate=0.75,
        sources={"peak_flops": GPU_TABLE, "hbm_bandwidth": GPU_TABLE, "memory": sources["memory"],
                 "int8": GPU_TABLE, "f32": sources.get("tf32", ""), "f32-highest": sources.get("fp32", ""),
                 "interconnect_bandwidth": NVLINK_TABLE, "link_bandwidth": NVLINK_TABLE,
                 "pod": NVLINK_TABLE, "dcn_bandwidth": sources["network"], "preallocate": PREALLOCATE},
    )


H100_SHEET = "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM"
# NVIDIA's rates for the HGX B200 at 1,000 W (BF16 2,250 dense, as gpus.md), as tabulated in
# glennklockwood.com/garden/processors/B200 from NVIDIA's Blackwell documents.
B200_RATES = "NVIDIA HGX B200 (1,000 W) rates, via glennklockwood.com/garden/processors/B200"
A100_SHEET = "NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM"

# What XLA:TPU lets one program use. v5e: a TPU v5 lite chip's memory_stats()['bytes_limit'] (JAX 0.10.2, libtpu
# 0.0.42.1; its refusals say "available HBM (15.75G)"). The others: the largest program XLA:TPU (libtpu 0.0.42.1)
# compiles for a compile-only chip of that kind, found to 4 KiB by compiling (on v5e this finds 126 KiB less
# than bytes_limit: XLA's compile-time check keeps that much for itself).
V5E_LIMIT = ("a TPU v5 lite chip: memory_stats()['bytes_limit'] = 16,909,336,064 bytes, what XLA lets a program "
             "use (its refusals: 'available HBM (15.75G)'), of 16 GiB HBM (Google Cloud TPU documentation, 'TPU v5e')")


def _compiled_limit(chip: str, limit: int, said: str, hbm: str) -> str:
    return (f"XLA:TPU (libtpu 0.0.42.1) for a compile-only {chip} chip: the largest program it compiles, "
            f"{limit:,} bytes to 4 KiB ('available HBM ({said})'), of {hbm} (Google Cloud TPU documentation)")


PROFILES = {
    "tpu-v4": _tpu("tpu-v4", bf16=2.75e14, int8=2.75e14, hbm=1.2e12, memory=33_014_317_056, link=4.5e10,
                   pod=(16, 16, 16), wrap="cube", host_chips=4,
                   sources_memory=_compiled_limit("v4", 33_014_317_056, "30.75G", "32 GiB HBM per chip ('TPU v4')")),
    "tpu-v5p": _tpu("tpu-v5p", bf16=4.59e14, int8=9.18e14, hbm=2.8e12, memory=102_803_308_544, link=9e10,
                    pod=(16, 20, 28), wrap="cube", host_chips=4,
                    sources_memory=_compiled_limit("v5p", 102_803_308_544, "95.74G",
                                                   "95 GiB HBM per chip ('TPU v5p'; the book: 96GB)")),
    "tpu-v5e": _tpu("tpu-v5e", bf16=1.97e14, int8=3.94e14, hbm=8.1e11, memory=16_909_336_064, link=4.5e10,
                    pod=(16, 16), wrap="full-axis", host_chips=8, sources_memory=V5E_LIMIT),
    "tpu-v6e": _tpu("tpu-v6e", bf16=9.2e14, int8=1.84e15, hbm=1.6e12, memory=33_550_106_624, link=9e10,
                    pod=(16, 16), wrap="full-axis", host_chips=8,
                    sources_memory=_compiled_limit("v6e", 33_550_106_624, "31.25G",
                                                   "32 GiB HBM per chip ('TPU v6e', Trillium)")),
    "h100": _gpu("h100", bf16=989e12, tf32=989e12 / 2, fp32=67e12, int8=1979e12, hbm=3.35e12, memory=80 * GiB,
                 nvlink=450e9, network=400e9,
                 sources={"datasheet": H100_SHEET, "memory": f"{H100_SHEET}: 80 GB HBM3 (80 GiB on the device)",
                          "tf32": f"{H100_SHEET}: TF32 989 TFLOP/s with sparsity, 494.5 dense; {PRECISION}",
                          "fp32": f"{H100_SHEET}: FP32 67 TFLOP/s (gpus.md: 66 from the CUDA cores)",
                          "network": NODE_EGRESS}),
    "a100": _gpu("a100", bf16=312e12, tf32=156e12, fp32=19.5e12, int8=624e12, hbm=2.039e12, memory=80 * GiB,
                 nvlink=300e9, network=200e9,
                 sources={"datasheet": A100_SHEET, "memory": f"{A100_SHEET}: 80 GB HBM2e",
                          "tf32": f"{A100_SHEET}: TF32 312 TFLOP/s with sparsity, 156 dense; {PRECISION}",
                          "fp32": f"{A100_SHEET}: FP32 19.5 TFLOP/s",
                          "network": "NVIDIA DGX A100 datasheet: 8x 200 Gb/s HDR InfiniBand per node (200 GB/s)"}),
    "b200": _gpu("b200", bf16=2250e12, tf32=1100e12, fp32=80e12, int8=4500e12, hbm=8e12, memory=192 * 10**9,
                 nvlink=900e9, network=400e9,
                 sources={"datasheet": "NVIDIA DGX B200 datasheet (network)",
                          "memory": f"{GPU_TABLE}: 192 GB (10^9 bytes)",
                          "tf32": f"{B200_RATES}: TF32 1,100 TFLOP/s dense (2,200 with sparsity); {PRECISION}",
                          "fp32": f"{B200_RATES}: FP32 80 TFLOP/s",
                          "network": "NVIDIA DGX B200 datasheet: 8x 400 Gb/s ConnectX-7 per node (400 GB/s)"}),
}

_CUSTOM_KEYS = {
    "flops": "peak FLOP/s",
    "hbm": "HBM bandwidth in bytes/s",
    "bw": "interconnect bandwidth per device in bytes/s (one direction)",
    "memory": "memory per device (optional), e.g. 80GiB",
}
CUSTOM_EXAMPLE = "custom:flops=1e15,hbm=3.3e12,bw=4.5e11,memory=80GiB"

_UNITS = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
MAX_EXPONENT = 30  # 10**30 bytes is already a million times the largest memory there is
_UNIT_NAMES = "B, KB, MB, GB, TB (powers of 1000) and KiB, MiB, GiB, TiB (powers of 1024)"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:[eE]\+?(\d+))?\s*([a-zA-Z]*)\s*$")


def parse_memory_size(text, option: str = "--device-memory") -> int:
    """Bytes in `16GiB`, `16 GB`, `1.5TiB`, `512MiB` or `17179869184` (GB = 10**9, GiB = 2**30)."""
    if isinstance(text, int) and not isinstance(text, bool) and text > 0:
        return text
    m = _SIZE.match(str(text))
    unit = m.group(3).lower() if m else ""
    if m is None or unit not in _UNITS and unit != "":
        raise UsageError(
            f"{option} {text}: not a memory size. Write a number of bytes with a unit, e.g. `16GiB` "
            f"(2**30 bytes each), `16GB` (10**9), `512MiB`, `1.5TiB`, or plain bytes (`17179869184`); "
            f"units: {_UNIT_NAMES}."
        )
    exponent = int(m.group(2) or 0)
    value = float(m.group(1)) * 10 ** min(exponent, MAX_EXPONENT + 1) * _UNITS.get(unit, 1)
    if not value <= 10**MAX_EXPONENT:  # 1e400GiB, 400 nines: past any memory, and past what a float holds
        raise UsageError(f"{option} {text}: far larger than any device's memory; write e.g. `16GiB` or `80GB`.")
    if value < 1:
        raise UsageError(f"{option} {text}: a device's memory must be at least one byte; e.g. `16GiB`.")
    return int(value)


def parse_hardware(text: str) -> Hardware:
    """A built-in profile by name (`tpu-v5e`), or `custom:flops=...,hbm=...,bw=...[,memory=...]`."""
    spec = str(text).strip()
    if spec.lower().startswith("custom:"):
        return _parse_custom(spec)
    profile = PROFILES.get(spec.lower())
    if profile is None:
        names = ", ".join(PROFILES)
        raise UsageError(
            f"--hardware {text}: no such profile. The built-in profiles are {names}; describe any other "
            f"device with `--hardware {CUSTOM_EXAMPLE}` (peak FLOP/s, HBM bytes/s, interconnect bytes/s "
            f"per device, memory per device)."
        )
    return profile


def _parse_custom(spec: str) -> Hardware:
    body = spec.split(":", 1)[1]
    keys = "; ".join(f"{k}: {what}" for k, what in _CUSTOM_KEYS.items())

    def bad(problem: str) -> UsageError:
        return UsageError(f"--hardware {spec}: {problem}. Write `--hardware {CUSTOM_EXAMPLE}` ({keys}).")

    values: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in body.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or not value.strip():
            raise bad(f"`{item}` is not key=value")
        if key not in _CUSTOM_KEYS:
            raise bad(f"unknown key {key!r}")
        if key in values:
            raise bad(f"{key!r} is given twice")
        values[key] = value.strip()
    missing = [k for k in ("flops", "hbm", "bw") if k not in values]
    if missing:
        raise bad(f"{' and '.join(repr(k) for k in missing)} {'is' if len(missing) == 1 else 'are'} missing")
    rates = {}
    for key in ("flops", "hbm", "bw"):
        try:
            rates[key] = float(values[key])
        except ValueError:
            raise bad(f"{key}={values[key]} is not a number (write e.g. 1e15)") from None
        if not rates[key] > 0 or rates[key] == float("inf"):
            raise bad(f"{key}={values[key]} must be a positive number")
    memory = None
    if "memory" in values:
        try:
            memory = parse_memory_size(values["memory"])
        except UsageError:
            raise bad(f"memory={values['memory']} is not a memory size (units: {_UNIT_NAMES})") from None
    return Hardware("custom", rates["flops"], rates["hbm"], rates["bw"], memory, f"--hardware {spec}")
