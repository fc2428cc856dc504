"""Device profiles for the plan's roofline (`--hardware tpu-v5e`) and memory sizes (`--device-memory 16GiB`).

Each built-in profile is one chip (one GPU) as its vendor publishes it:
- `peak_flops`: dense bf16 FLOP/s (without 2:4 sparsity);
- `hbm_bandwidth`: bytes/s between the chip and its HBM;
- `interconnect_bandwidth`: bytes/s the chip can send to its peers, all links together, one direction
  (TPU: the "interchip interconnect" figure; GPU: half of NVLink's bidirectional total);
- `memory`: HBM bytes per chip.

Plain Python: no JAX.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from .errors import UsageError

GiB = 2**30


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float
    hbm_bandwidth: float
    interconnect_bandwidth: float
    memory: int | None
    source: str

    def state(self) -> dict:
        """The plan view's `hardware` entry."""
        return asdict(self)


PROFILES = {
    # Google Cloud TPU documentation, "TPU v4" (system architecture: 275 TFLOPs bf16 per chip,
    # 32 GiB HBM2 at 1,200 GBps) and the v4 column of the Cloud TPU v5p announcement's table
    # ("Interchip Interconnect BW 2,400 Gbps" = 300 GB/s).
    "tpu-v4": Hardware(
        "tpu-v4", 275e12, 1200e9, 2400e9 / 8, 32 * GiB,
        "Google Cloud TPU documentation, 'TPU v4': 275 TFLOP/s bf16, 32 GiB HBM2 at 1,200 GB/s; "
        "ICI 2,400 Gbps per chip",
    ),
    # Google Cloud TPU documentation, "TPU v5e", system architecture: 197 TFLOPs bf16 per chip,
    # 16 GB HBM2 at 819 GBps, interchip interconnect 1,600 Gbps (= 200 GB/s).
    "tpu-v5e": Hardware(
        "tpu-v5e", 197e12, 819e9, 1600e9 / 8, 16 * GiB,
        "Google Cloud TPU documentation, 'TPU v5e' system architecture: 197 TFLOP/s bf16, 16 GB HBM2 "
        "at 819 GB/s, ICI 1,600 Gbps per chip",
    ),
    # Google Cloud TPU documentation, "TPU v5p", system architecture: 459 TFLOPs bf16 per chip,
    # 95 GB HBM2e at 2,765 GBps, interchip interconnect 4,800 Gbps (= 600 GB/s).
    "tpu-v5p": Hardware(
        "tpu-v5p", 459e12, 2765e9, 4800e9 / 8, 95 * GiB,
        "Google Cloud TPU documentation, 'TPU v5p' system architecture: 459 TFLOP/s bf16, 95 GB HBM2e "
        "at 2,765 GB/s, ICI 4,800 Gbps per chip",
    ),
    # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column: BF16 Tensor Core 1,979 TFLOPS *with
    # sparsity* (989 dense), 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s (both directions; 450 each way).
    "h100": Hardware(
        "h100", 989e12, 3.35e12, 900e9 / 2, 80 * GiB,
        "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): 989 TFLOP/s dense bf16, 80 GB HBM3 at "
        "3.35 TB/s, NVLink 900 GB/s bidirectional",
    ),
    # NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM column: BF16 Tensor Core 312 TFLOPS
    # (624 with sparsity), 80 GB HBM2e at 2,039 GB/s, NVLink 600 GB/s (both directions; 300 each way).
    "a100": Hardware(
        "a100", 312e12, 2039e9, 600e9 / 2, 80 * GiB,
        "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM): 312 TFLOP/s dense bf16, 80 GB HBM2e at "
        "2,039 GB/s, NVLink 600 GB/s bidirectional",
    ),
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
