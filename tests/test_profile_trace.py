"""stages/profile/xplane.py, the one reader of the profiler's trace (a debug format, not an API), and
what summary.py makes of what it reads.

If a JAX or XLA upgrade changes the trace, the first tests here fail and say what no longer reads as
expected, before a profile silently shows empty lanes: they check, on a real XLA:CPU trace, every
name and stat the reader depends on. A TPU trace cannot be made here; the TPU tests build one in
XSpace's own text format with the structure the chip recorded (TPU.md: a TPU v5e, JAX 0.10.2,
libtpu 0.0.42: planes `/device:TPU:N`, lines "XLA Modules", "XLA Ops", "Async XLA Ops", ops named by
their HLO text), and the device tier (tests/device/test_device_profile.py) reads the chip's own.
"""
from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from sample_states import PROFILE_HLO, TPU_HLO

from jaxpar_magic.stages.profile import xplane
from jaxpar_magic.stages.profile.intervals import clip, measure, subtract, union
from jaxpar_magic.stages.profile.ops import ProgramOps
from jaxpar_magic.stages.profile.summary import summarise
from jaxpar_magic.stages.profile.trace import traced_steps
from jaxpar_magic.stages.profile.xplane import Trace, TracedLane, TracedOp, TraceFormatError, read_trace


@pytest.fixture(scope="module")
def cpu_program():
    """A jitted step over the 8 simulated devices: a matmul, then a sum over the devices (an all-reduce)."""
    mesh = jax.make_mesh((8,), ("i",))
    x = jax.device_put(jnp.ones((8 * 32, 128)), NamedSharding(mesh, P("i")))
    w = jnp.ones((128, 128))

    @jax.jit
    def step(x, w):
        return jax.lax.with_sharding_constraint(jnp.tanh(x @ w).sum(0), NamedSharding(mesh, P()))

    jax.block_until_ready(step(x, w))
    text = step.lower(x, w).compile().as_text()
    return step, (x, w), text


@pytest.fixture(scope="module")
def raw_cpu_trace(cpu_program, tmp_path_factory):
    """The profiler's own output for 2 runs, read with ProfileData (what xplane.py reads)."""
    step, args, _ = cpu_program
    directory = str(tmp_path_factory.mktemp("trace"))
    with jax.profiler.trace(directory):
        for _ in range(2):
            jax.block_until_ready(step(*args))
    return xplane.trace_file(directory)


def test_the_xla_cpu_trace_still_has_what_the_reader_reads(raw_cpu_trace, cpu_program):
    data = jax.profiler.ProfileData.from_file(raw_cpu_trace)
    planes = {p.name: p for p in data.planes}
    assert xplane.HOST_PLANE in planes, f"no {xplane.HOST_PLANE!r} plane: {sorted(planes)}"
    threads = list(planes[xplane.HOST_PLANE].lines)
    module = ProgramOps(cpu_program[2]).module
    ops = [(e, dict(e.stats)) for line in threads for e in line.events if "hlo_op" in dict(e.stats)]
    mine = [(e, s) for e, s in ops if s.get("hlo_module") == module]
    assert mine, f"no event carries hlo_module={module!r}: {sorted({s.get('hlo_module') for _, s in ops})}"
    for event, stats in mine:
        assert {"run_id", "device_ordinal"} <= set(stats), sorted(stats)
        assert stats["hlo_op"] == event.name and event.duration_ns >= 0
    assert {int(s["device_ordinal"]) for _, s in mine} == set(range(8))
    assert len({s["run_id"] for _, s in mine}) == 2  # one run id per execution of the program
    names = {e.name for line in threads for e in line.events}
    assert any(n.startswith(xplane.WAIT_PREFIX) for n in names), "no rendezvous wait event (Wait...) any more"


def test_reading_a_real_trace_gives_each_device_its_runs(raw_cpu_trace, cpu_program):
    _, _, text = cpu_program
    program = ProgramOps(text)
    trace = read_trace(raw_cpu_trace, program.module)
    assert trace.platform == "cpu" and trace.by_device
    assert [lane.device for lane in trace.lanes] == list(range(8))
    assert len(trace.runs) == 2
    for lane in trace.lanes:
        assert {op.run for op in lane.ops} == set(trace.runs)
        assert all(op.name in program for op in lane.ops)  # every name is an instruction of the program
        reduce = [op for op in lane.ops if program.facts(op.name).kind == "collective"]
        assert len(reduce) == 2  # the all-reduce, once a run
        for op in reduce:  # waits lie inside the collective's own run
            assert all(op.start_ns <= s and s + d <= op.start_ns + op.duration_ns + 1 for s, d in op.waits)
    for begin, end in trace.runs.values():
        assert all(begin <= op.start_ns and op.start_ns + op.duration_ns <= end for lane in trace.lanes
                   for op in lane.ops if trace.runs.get(op.run) == (begin, end))


def test_an_unknown_module_or_a_changed_layout_fails_loudly(raw_cpu_trace, tmp_path):
    with pytest.raises(TraceFormatError, match="hlo_module='jit_nothing'"):
        read_trace(raw_cpu_trace, "jit_nothing")
    with pytest.raises(TraceFormatError, match="xplane.pb"):
        xplane.trace_file(str(tmp_path))
    empty = tmp_path / "empty.xplane.pb"
    empty.write_bytes(jax.profiler.ProfileData.text_proto_to_serialized_xspace('planes { id: 1 name: "/host:other" }'))
    with pytest.raises(TraceFormatError, match="neither a TPU plane"):
        read_trace(str(empty), "jit_step")


# --- a TPU trace, as the chip recorded it ----------------------------------------------------------


# (line, name as the chip names it: the instruction's HLO text, offset ps, duration ps)
_OPS = [("XLA Ops", "%copy-start.8 = (f32[1024]{0}, f32[1024]{0}, u32[]) copy-start(f32[1024]{0} %w.1)", 0, 10_000),
        ("XLA Ops", "%fusion.101 = f32[1024]{0} fusion(f32[1024]{0} %x.1, f32[1024]{0} %x.1), kind=kOutput", 10_000, 4_000_000),
        ("XLA Ops", "%all-reduce-start = f32[1024]{0} all-reduce-start(f32[1024]{0} %fusion.101)", 4_010_000, 10_000),
        ("XLA Ops", "%copy-done.8 = f32[1024]{0} copy-done((f32[1024]{0}) %copy-start.8)", 4_020_000, 5_000),
        ("XLA Ops", "%fusion.28 = f32[1024]{0} fusion(f32[1024]{0} %copy-done.8, f32[1024]{0} %x.1), kind=kOutput", 4_025_000, 3_000_000),
        ("XLA Ops", "%all-reduce-done = f32[1024]{0} all-reduce-done(f32[1024]{0} %all-reduce-start)", 7_025_000, 1_000_000),
        ("XLA Ops", "%out = f32[1024]{0} add(f32[1024]{0} %all-reduce-done, f32[1024]{0} %fusion.28)", 8_025_000, 975_000),
        ("Async XLA Ops", "%all-reduce-start = f32[1024]{0} all-reduce-start(f32[1024]{0} %fusion.101)", 4_010_000, 4_015_000),
        ("Async XLA Ops", "%copy-start.8 = (f32[1024]{0}, f32[1024]{0}, u32[]) copy-start(f32[1024]{0} %w.1)", 0, 4_025_000)]
STEP_PS = 9_000_000


def tpu_xspace(steps: int = 2, chips: int = 2, other_module: bool = True) -> str:
    """An XSpace in text format with the chip's structure: per chip, "XLA Modules" (one event per run,
    named `jit_step(<fingerprint>)`), "XLA Ops" and "Async XLA Ops"; another program's run between ours."""
    names = ["jit_step(1646912)", "jit_other(99)"] + sorted({name for _, name, _, _ in _OPS})
    ids = {name: k + 1 for k, name in enumerate(names)}
    meta = "".join(f' event_metadata {{ key: {i} value {{ id: {i} name: "{n}" }} }}' for n, i in ids.items())
    planes = []
    for chip in range(chips):
        lines = {"XLA Modules": [], "XLA Ops": [], "Async XLA Ops": []}
        for step in range(steps):
            origin = step * 2 * STEP_PS + chip * 50_000  # the chips start a little apart
            lines["XLA Modules"].append(f'events {{ metadata_id: 1 offset_ps: {origin} duration_ps: {STEP_PS} '
                                        f'stats {{ metadata_id: 1 int64_value: {40 + step} }} }}')
            if other_module:
                lines["XLA Modules"].append(f"events {{ metadata_id: 2 offset_ps: {origin + STEP_PS + 100_000} "
                                            f"duration_ps: 500000 }}")
                lines["XLA Ops"].append(f'events {{ metadata_id: {ids[_OPS[6][1]]} offset_ps: {origin + STEP_PS + 200_000} '
                                        f'duration_ps: 100000 }}')  # an op of the other program: left out
            for line, name, offset, duration in _OPS:
                lines[line].append(f"events {{ metadata_id: {ids[name]} offset_ps: {origin + offset} "
                                   f"duration_ps: {duration} }}")
        body = "".join(f' lines {{ id: {k + 1} name: "{n}" timestamp_ns: 1000 {" ".join(evs)} }}'
                       for k, (n, evs) in enumerate(lines.items()))
        planes.append(f'planes {{ id: {chip + 1} name: "/device:TPU:{chip}"{body}{meta} '
                      f'stat_metadata {{ key: 1 value {{ id: 1 name: "run_id" }} }} }}')
    host = 'planes { id: 99 name: "/host:CPU" lines { id: 1 name: "python3" } }'
    return "\n".join(planes + [host])


def write_xspace(tmp_path, text: str) -> str:
    path = tmp_path / "tpu.xplane.pb"
    path.write_bytes(jax.profiler.ProfileData.text_proto_to_serialized_xspace(text))
    return str(path)


def test_a_tpu_trace_gives_one_lane_per_chip_with_its_async_spans(tmp_path):
    trace = read_trace(write_xspace(tmp_path, tpu_xspace()), "jit_step")
    assert trace.platform == "tpu" and trace.by_device and [lane.device for lane in trace.lanes] == [0, 1]
    assert list(trace.runs) == [40, 41]  # the modules' run ids, in order; the other program is not ours
    lane = trace.lanes[0]
    assert len(lane.ops) == 2 * len(_OPS)
    assert {op.name for op in lane.ops} == {"copy-start.8", "fusion.101", "all-reduce-start", "copy-done.8",
                                            "fusion.28", "all-reduce-done", "out"}
    flights = [op for op in lane.ops if op.in_flight]
    assert sorted((op.name, op.duration_ns) for op in flights if op.run == 40) == [
        ("all-reduce-start", 4015.0), ("copy-start.8", 4025.0)]
    begin, end = trace.runs[40]
    assert begin == 1000.0 and end == 1000.0 + 50.0 + 9000.0  # both chips' runs of step 0


def test_the_tpu_profile_counts_overlap_and_waits_from_the_async_spans(tmp_path):
    program = ProgramOps(TPU_HLO, "<cell-1>")
    trace = read_trace(write_xspace(tmp_path, tpu_xspace()), program.module)
    profile = summarise(trace, [10e-6, 10e-6], program)
    assert profile.source == "TPU device trace, 2 steps"
    assert [lane.label for lane in profile.lanes] == ["TPU 0", "TPU 1"]
    assert profile.step_s == pytest.approx(9.05e-6)
    # per chip and step (9 µs): compute = fusion.101 (4 µs) + fusion.28 (3 µs) + out (0.975 µs); the
    # all-reduce in flight 4.01-8.025 µs, of which 4.025-7.025 under fusion.28; its done (1 µs) is a wait.
    share = profile.shares
    span = 9.0  # µs, each chip's own step (the run's span adds the 0.05 µs the chips start apart)
    total = 9.05
    assert share["compute"] == pytest.approx((4.0 + 3.0 + 0.975) / total, rel=1e-6)
    assert share["wait"] == pytest.approx(1.0 / total, rel=1e-6)
    # the in-flight all-reduce outside compute and its wait: 4.01-4.025 (+ the start's own 10 ns inside it)
    assert share["collective"] == pytest.approx(0.015 / total, rel=1e-3)
    assert share["overlapped"] == pytest.approx(3.0 / total, rel=1e-6)
    assert sum(share[k] for k in ("compute", "wait", "collective", "copy", "idle")) == pytest.approx(1.0)
    assert span < total
    (reduce,) = profile.collectives
    assert (reduce.name, reduce.op, reduce.line) == ("all-reduce-start", "all-reduce", 4)
    assert reduce.wait_s == pytest.approx(1e-6) and reduce.overlapped_s == pytest.approx(3e-6)
    ranked = {op.name: op for op in profile.ops}
    assert ranked["fusion.101"].line == 3 and ranked["fusion.101"].what == "dot_general"
    assert ranked["all-reduce-done"].kind == "wait" and ranked["copy-done.8"].kind == "copy"
    assert list(ranked)[0] == "fusion.101" and ranked["fusion.101"].count == 1


DATA = Path(__file__).resolve().parent / "data"


def test_the_trace_a_tpu_v5e_recorded_reads_as_the_chip_ran_it():
    """tests/data/tpu_v5e_mlp.*: a 2-layer MLP training step (width 256, 512 rows, f32) traced twice
    on a TPU v5e (JAX 0.10.2, libtpu 0.0.42; `python_tracer_level=0, host_tracer_level=0`), with the
    text of the program it ran (`compiled.as_text()`), as recorded there for this test."""
    program = ProgramOps((DATA / "tpu_v5e_mlp.hlo.txt").read_text())
    assert program.module == "jit_st"
    trace = read_trace(str(DATA / "tpu_v5e_mlp.xplane.pb"), program.module)
    assert trace.platform == "tpu" and [lane.device for lane in trace.lanes] == [0]
    assert len(trace.runs) == 2
    ops = trace.lanes[0].ops
    assert len(ops) == 26 and all(op.name in program for op in ops)  # every name is an instruction
    profile = summarise(trace, [1e-3, 1e-3], program)
    assert profile.source == "TPU device trace, 2 steps" and profile.lanes[0].label == "TPU 0"
    # the step is the XLA Modules event's span on the chip: 4.50 µs for this small program
    assert profile.step_s == pytest.approx(4.5e-6, rel=0.01)
    assert profile.ops[0].what == "dot_general" and profile.ops[0].kind == "compute"
    assert profile.shares["compute"] > 0.8 and sum(profile.shares[k] for k in
                                                   ("compute", "wait", "collective", "copy", "idle")) == pytest.approx(1)


def test_a_tpu_plane_without_its_ops_line_fails_loudly(tmp_path):
    text = tpu_xspace().replace('name: "XLA Ops"', 'name: "XLA Operations"')
    with pytest.raises(TraceFormatError, match="has no line 'XLA Ops'"):
        read_trace(write_xspace(tmp_path, text), "jit_step")
    text = tpu_xspace().replace('name: "%fusion.101 =', 'name: "fusion.101 is')
    with pytest.raises(TraceFormatError, match="not named by its HLO text"):
        read_trace(write_xspace(tmp_path, text), "jit_step")


def test_without_device_ordinals_the_lanes_are_xla_cpus_threads_and_say_so(tmp_path):
    """An XLA:CPU trace whose ops do not name their device (an older or newer JAX): one lane per thread."""
    events, meta = [], {"fusion.3": 1, "psum.7": 2}
    stats = {"hlo_op": 1, "hlo_module": 2, "run_id": 3}
    ids = "".join(f' stat_metadata {{ key: {i} value {{ id: {i} name: "{n}" }} }}' for n, i in stats.items())
    names = "".join(f' event_metadata {{ key: {i} value {{ id: {i} name: "{n}" }} }}' for n, i in meta.items())
    for thread in range(2):
        line = []
        for run in range(2):
            for k, op in enumerate(("fusion.3", "psum.7")):
                line.append(f"events {{ metadata_id: {meta[op]} offset_ps: {(run * 10 + k * 4 + thread) * 1_000_000} "
                            f"duration_ps: 3000000 stats {{ metadata_id: 1 str_value: \"{op}\" }} "
                            f"stats {{ metadata_id: 2 str_value: \"jit_step\" }} stats {{ metadata_id: 3 int64_value: {run} }} }}")
        events.append(f'lines {{ id: {thread + 1} name: "tf_XLAEigen/{thread}" timestamp_ns: 0 {" ".join(line)} }}')
    text = f'planes {{ id: 1 name: "/host:CPU" {" ".join(events)}{names}{ids} }}'
    program = ProgramOps(PROFILE_HLO)
    trace = read_trace(write_xspace(tmp_path, text), program.module)
    assert not trace.by_device and [lane.thread for lane in trace.lanes] == ["tf_XLAEigen/0", "tf_XLAEigen/1"]
    profile = summarise(trace, [1e-3, 1e-3], program, cores=2)
    assert [lane.label for lane in profile.lanes] == ["thread tf_XLAEigen/0", "thread tf_XLAEigen/1"]
    assert profile.source == "XLA:CPU thread trace, 2 steps: CPU threads are not devices (one lane per thread)"
    assert profile.step_s == pytest.approx(8e-6) and {op.name for op in profile.ops} == {"fusion.3", "psum.7"}


# --- the arithmetic, and a large trace ------------------------------------------------------------

def test_intervals():
    a = union([(5, 7), (0, 2), (1, 3), (9, 9)])
    assert a == [(0, 3), (5, 7)] and measure(a) == 5
    assert subtract(a, [(1, 6)]) == [(0, 1), (6, 7)]
    assert subtract(a, []) == a and subtract([], a) == []
    assert clip(a, 2, 6) == [(2, 3), (5, 6)]


def test_a_trace_of_100k_events_makes_a_light_view():
    """10^5 op runs over 8 lanes and 5 steps: the Profile keeps them all, the view's state stays small."""
    import json

    program = ProgramOps(TPU_HLO, "<cell-1>")
    lanes, per_lane = [], 100_000 // 8
    for device in range(8):
        ops = [TracedOp("fusion.101" if k % 2 else "fusion.28", float(k * 10), 8.0, k * 5 // per_lane)
               for k in range(per_lane)]
        lanes.append(TracedLane(device, None, ops))
    runs = {step: (step * per_lane * 2.0, (step + 1) * per_lane * 2.0) for step in range(5)}
    profile = summarise(Trace("tpu", lanes, runs, True), [1e-3] * 5, program)
    assert sum(len(lane.events) for lane in profile.lanes) == 8 * per_lane
    state = profile.state("t")
    assert sum(len(lane["events"]) for lane in state["lanes"]) <= 2000
    assert len(json.dumps(state)) < 120_000
    dropped = sum(d[1] for lane in state["lanes"] for d in lane["dropped"])
    assert dropped + sum(len(lane["events"]) for lane in state["lanes"]) == 8 * per_lane


def test_traced_steps_compiles_nothing_and_times_each_call(cpu_program, compiles):
    step, args, text = cpu_program
    trace, walls = traced_steps(lambda: step(*args), 3, ProgramOps(text).module)
    assert compiles.count == 0
    assert len(walls) == 3 and len(trace.runs) == 3
