"""What would make a step that does not fit fit, computed from the buffers live at its peak.

Each piece of advice is given only where it can help, with the bytes it would save at the peak:
- donation, where nothing is donated and outputs live at the peak have an argument of the same dtype and
  shape per device (an updated parameter and its old value): donated, the output is written into the
  argument's buffer (jax.jit's donate_argnums, `--donate`), so one of the two is held;
- recomputation, where activations saved for the backward pass are live at the peak: jax.checkpoint
  around each layer keeps each layer's input instead (up to their bytes);
- sharding, where arguments live at the peak are copied on several devices (the compiled program's
  parameter says `sharding={replicated}`, or `last_tile_dim_replicate`): split over the axes that copy
  them, each device holds 1/k of them.
Largest saving first; each says whether alone it would make the step fit. Where none applies, the plan
says so and names the largest buffer instead of listing remedies that cannot help.

Plain Python over the peak's rows (stages/plan/peak.py) and the program's entry parameters.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_SHARDING = re.compile(r"\bsharding=(\{[^{}]*\})")
_TILES = re.compile(r"devices=\[([\d,]+)\]")


@dataclass(frozen=True)
class Advice:
    kind: str  # "donate" | "recompute" | "shard" | "none"
    bytes: int  # what it would save at the peak, per device (0: none applies)
    text: str

    def state(self) -> dict:
        return {"kind": self.kind, "bytes": self.bytes, "text": self.text}


def copies(sharding: str | None, devices: int) -> int:
    """How many devices hold each part of an argument, from its HLO sharding (1 where unknown)."""
    if not sharding:
        return 1
    if "replicated" in sharding and "devices=" not in sharding:
        return devices
    tiles = _TILES.search(sharding)
    if tiles and "last_tile_dim_replicate" in sharding:
        return int(tiles.group(1).split(",")[-1])
    return 1


def parameter_shardings(instructions: list, entry: str | None, labels: dict) -> dict[str, str]:
    """Argument label -> the HLO sharding its entry parameter carries."""
    found = {}
    for ins in instructions:
        if ins.op == "parameter" and ins.computation == entry and ins.name in labels:
            m = _SHARDING.search(ins.line)
            if m:
                found[labels[ins.name]] = m.group(1)
    return found


def _bytes(n: int) -> str:
    from .plan import format_bytes

    return format_bytes(n)


def advise(plan, shardings: dict[str, str], magic: str | None = None) -> list[Advice]:
    """The advice for `plan` (a Plan that does not fit, with its peak)."""
    peak = plan.peak
    if peak is None:
        return []
    rows = peak.live_rows
    total, capacity = plan.total_bytes, plan.capacity or 0
    devices = int(plan.mesh.devices.size)
    found = []
    arguments = [r for r in rows if r.kind == "argument"]
    outputs = [r for r in rows if r.kind == "output"]
    if not plan.donated:
        free = {}
        for a in arguments:
            free.setdefault((a.dtype, a.shape), []).append(a)
        matched, names = 0, []
        for o in sorted(outputs, key=lambda r: -r.bytes):
            same = free.get((o.dtype, o.shape))
            if same:
                a = same.pop()
                matched += min(a.bytes, o.bytes)
                names.append(a.name)
        if matched:
            inputs = sorted({str(n).split("[")[0].split(".")[0] for n in names if n})
            how = (f"`--donate {' '.join(inputs)}`" if magic == "shard" else "jax.jit's donate_argnums (`--donate` "
                   "in %%shard)")
            found.append(Advice("donate", matched, (
                f"donate {', '.join(inputs) or 'the arguments'} ({how}): outputs of the same shape and dtype are "
                f"written into their buffers, saving up to {_bytes(matched)} at the peak" + _alone(total, matched, capacity))))
    saved = [r for r in rows if r.kind == "temporary" and (r.role or "").startswith("activation saved")]
    if saved:
        held = sum(r.bytes for r in saved)
        cpu = (" (XLA:CPU undoes jax.checkpoint: plan with XLA:TPU to see its effect)"
               if plan.compiler == "XLA:CPU" else "")
        found.append(Advice("recompute", held, (
            f"recompute activations in the backward pass (jax.checkpoint around each layer, or a remat policy): "
            f"{_bytes(held)} of activations saved for the backward pass are live at the peak" + cpu
            + _alone(total, held, capacity))))
    copied = [(r, copies(shardings.get(r.name), devices)) for r in arguments]
    copied = [(r, k) for r, k in copied if k > 1]
    if copied:
        spare = int(sum(r.bytes * (1 - 1 / k) for r, k in copied))
        names = ", ".join(r.name for r, _ in sorted(copied, key=lambda rk: -rk[0].bytes)[:4])
        more = f" and {len(copied) - 4} more" if len(copied) > 4 else ""
        found.append(Advice("shard", spare, (
            f"shard the arguments every device holds a whole copy of ({names}{more}) over the mesh axes that copy "
            f"them (FSDP for weights and optimizer state): saves up to {_bytes(spare)}" + _alone(total, spare, capacity))))
    found.sort(key=lambda a: -a.bytes)
    if not found:
        largest = peak.largest
        what = f" The largest is {_bytes(largest.bytes)}: {largest.kind} {largest.name or largest.op or ''}".rstrip() + "." \
            if largest is not None else ""
        found.append(Advice("none", 0, (
            "Donating, recomputing or sharding the arguments would not help: the peak is temporaries the program "
            f"computes; use a smaller batch (or accumulate gradients over micro-batches) or more devices.{what}")))
    return found


def _alone(total: int, saved: int, capacity: int) -> str:
    if not capacity or saved <= 0:
        return ""
    after = total - saved
    return (f"; alone, it would fit ({_bytes(after)} of {_bytes(capacity)})" if after <= capacity
            else f"; alone, not enough ({_bytes(after)} of {_bytes(capacity)})")


def advice_note(advice: list[Advice]) -> str:
    """The plan's note: `To make it fit: donate ...; recompute ...`."""
    if len(advice) == 1 and advice[0].kind == "none":
        return advice[0].text
    return "To make it fit: " + "; ".join(a.text for a in advice) + "."
