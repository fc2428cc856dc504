"""The plan beside the measurement: the plan stage's step estimate and each collective it lists,
next to what the profile measured of the same program ("estimate 64.2 ms, measured 82.9 ms; the
all-reduce at line 4: 2.8 ms estimated, 3.1 ms measured, not overlapped").

Where the devices that ran the cell are the ones planned for (a TPU host planning its own chips),
the two are figures of one machine. On simulated CPU devices a plan's time needs a hardware profile
(`--hardware`), and its estimate is for that hardware while the measurement is of the CPU: the
comparison says so, and what it is good for (which collectives ran, their share), not a ratio.

Plain Python; no JAX.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# What a device reports as its kind (`device.device_kind`) -> the plan's profile of that hardware.
DEVICE_KINDS = (("TPU v4", "tpu-v4"), ("TPU v5 lite", "tpu-v5e"), ("TPU v5e", "tpu-v5e"), ("TPU v5p", "tpu-v5p"),
                ("TPU v5", "tpu-v5p"), ("TPU v6 lite", "tpu-v6e"), ("TPU v6e", "tpu-v6e"), ("H100", "h100"),
                ("A100", "a100"), ("B200", "b200"))
NOT_OVERLAPPED, OVERLAPPED = 0.05, 0.95


def device_profile(devices) -> str | None:
    """The hardware profile of the devices that ran a cell, when they are real ones the plan knows."""
    kinds = {str(getattr(d, "device_kind", "")) for d in devices}
    platforms = {getattr(d, "platform", "") for d in devices}
    if len(kinds) != 1 or platforms & {"cpu"}:
        return None
    kind = kinds.pop()
    return next((name for known, name in DEVICE_KINDS if kind.startswith(known) or known in kind), None)


@dataclass(frozen=True)
class CollectiveBeside:
    op: str
    line: int | None
    estimated_s: float | None
    measured_s: float | None  # None: the plan lists it, the trace has no run of it
    wait_s: float = 0.0
    overlapped: float | None = None  # the share of its measured time the device also computed

    def state(self) -> dict:
        return {"op": self.op, "line": self.line, "estimated_s": self.estimated_s, "measured_s": self.measured_s,
                "wait_s": self.wait_s, "overlapped": self.overlapped}


@dataclass
class Beside:
    hardware: str  # the profile the plan priced the step on
    same_machine: bool  # the devices that ran the cell are that hardware
    estimate_s: float | None  # the plan's estimate: communication fully overlapped (optimistic)
    serial_s: float | None  # no overlap (pessimistic)
    measured_s: float
    collectives: list = field(default_factory=list)  # CollectiveBeside, in program order
    label: str = ""  # what the comparison means

    def sentence(self) -> str:
        """"estimate 64.2 ms, measured 82.9 ms; the all-reduce at line 4: 2.8 ms estimated, 3.1 ms
        measured, not overlapped"."""
        head = f"estimate {ms(self.estimate_s)}, measured {ms(self.measured_s)}"
        if self.same_machine and self.estimate_s:
            head += f" ({self.measured_s / self.estimate_s:.2f}x)"
        parts = [head]
        for c in self.collectives:
            where = f" at line {c.line}" if c.line is not None else ""
            measured = "not in the trace" if c.measured_s is None else f"{ms(c.measured_s)} measured"
            parts.append(f"the {c.op}{where}: {ms(c.estimated_s)} estimated, {measured}{overlap_words(c.overlapped)}")
        return "; ".join(parts)

    def state(self) -> dict:
        return {"hardware": self.hardware, "same_machine": self.same_machine, "estimate_s": self.estimate_s,
                "serial_s": self.serial_s, "measured_s": self.measured_s, "label": self.label,
                "sentence": self.sentence(), "collectives": [c.state() for c in self.collectives[:32]]}


def ms(seconds: float | None) -> str:
    """`82.9 ms`, `850 µs` (the views' own formatter, 3 significant digits); "—" for none."""
    from ...views.base import format_seconds

    return "—" if seconds is None else format_seconds(seconds)


def overlap_words(share: float | None) -> str:
    if share is None:
        return ""
    if share < NOT_OVERLAPPED:
        return ", not overlapped"
    if share > OVERLAPPED:
        return ", overlapped"
    return f", {share:.0%} overlapped"


def beside(profile, plan, same_machine: bool, devices_text: str) -> Beside | None:
    """The plan's estimate beside `profile`, or None when the plan has no time (no hardware profile)."""
    roofline = getattr(plan, "roofline", None)
    if roofline is None or plan.hardware is None:
        return None
    rows = _matched(plan.collectives, profile.collectives)
    name = plan.hardware.name
    if same_machine:
        label = (f"The plan priced the step on the {name} profile, the devices that ran it; the measurement is of "
                 f"the same program on them.")
    else:
        label = (f"The estimate is for {name}; the measurement is of {devices_text}: two different machines, so the "
                 f"times do not compare. What does: which collectives ran, how often, and their share of the step.")
    return Beside(name, same_machine, roofline.estimate_s, roofline.serial_s, profile.step_s, rows, label)


def _matched(planned: list, measured: list) -> list:
    """Each collective the plan lists with its measurement: the same collective at the same line, in
    program order (XLA:CPU's all-reduce that the plan shows as the target's reduce-scatter counts as it)."""
    waiting: dict = {}
    for m in measured:
        waiting.setdefault((m.op, m.line), []).append(m)
    rows = []
    for p in planned:
        if getattr(p, "over_dcn", False):
            continue
        op = p.sliced_from or p.op
        queue = waiting.get((op, p.line)) or []
        m = queue.pop(0) if queue else None
        overlapped = (m.overlapped_s / m.time_s) if m is not None and m.time_s > 0 else None
        rows.append(CollectiveBeside(p.op, p.line, p.seconds, m.time_s if m is not None else None,
                                     m.wait_s if m is not None else 0.0, overlapped))
    return rows
