"""Sections 9 and 10 of bench/run.py, in the benchmark's own process (8 simulated devices).

9. a cached `%%shard_map` re-run (the block matmul of JAX's shard_map tutorial on a 4x2 mesh,
   --no-show) vs the hand-written `jax.jit(jax.shard_map(...))`; 9b: control, the cell's cached
   program called directly; 9c: both as whole `run_cell` cells; 9d: control, a cell magic that only
   makes the hand-written call (what IPython's `run_cell_magic` costs any magic).
10. what `--collectives` costs: a cell's first run with it vs its first run without it (a fresh
   cell text each time, so both compile), and a cached re-run without the flag of a cell that
   once ran with it vs a cached re-run of a cell that never did.
"""
from __future__ import annotations

import statistics
import time

from benchkit import (
    DEVICES, Timing, compare_row, compile_events, detail, fmt_us, interleaved, ipython_steps, log, paired_ratio,
    profile_steps, replay_steps, row, tune, under_action, verdict,
)

SHARD_MAP_SRC = "out = lax.psum(jnp.dot(lhs, rhs), 'y')\n"
SHARD_MAP_LINE = "--mesh mesh42 --in lhs=x,y rhs=y,None --out out=x,None --no-show"
COLLECTIVES_TARGET = 2.0  # issue 9: --collectives at most 2x the first run without it
RERUN_TARGET = 1.05  # "a re-run without it is unchanged": equal within noise
# The cell; `{k}` makes every text new, so every first run compiles.
COLLECTIVES_CELL = """\
y = x * {k}
total = lax.psum(y, 'i')
everyone = lax.all_gather(x, 'i')
mine = lax.psum_scatter(table, 'i')
"""


# --- 9: %%shard_map ----------------------------------------------------------------------------------

ABOVE_NOOP_TARGET = 1.03  # issue 23: our cost above a no-op cell magic (9d) within 3% of the workload


def above_a_noop_magic(t: dict) -> float:
    """Row 9*: 9's target read against 9d (issue 23). A bare call cannot include what IPython's
    `run_cell_magic` costs any magic, so the measure is ours minus the no-op magic, over the
    workload (the hand-written call): 1 + (ours - 9d) / hand."""
    ours, noop, hand = t["ours"], t["hand (a no-op magic)"], t["hand"]
    ratio = 1 + (ours.median - noop.median) / hand.median
    row("9*", "row 9 read against 9d: 1 + (ours - the no-op magic) / the workload", fmt_us(ours.median - noop.median),
        fmt_us(hand.median), f"{ratio:.3f}", f"{(ours.median - noop.median) * 1e6:+.0f} µs",
        verdict(ratio, ABOVE_NOOP_TARGET))
    return ratio

def bench_shard_map(jax, sh, args) -> dict:
    import jax.numpy as jnp
    import numpy as np
    from IPython.core.magic import no_var_expand
    from IPython.utils.capture import capture_output
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxpar_magic.stages.run.shard_map as shard_map_engine

    with capture_output():
        sh.run_line_magic("mesh", "x=4 y=2 --name mesh42 --no-show")
    mesh = sh.user_ns["mesh42"]
    lhs_spec, rhs_spec, out_spec = P("x", "y"), P("y", None), P("x", None)
    hand = jax.jit(jax.shard_map(lambda a, b: lax.psum(jnp.dot(a, b), "y"), mesh=mesh,
                                 in_specs=(lhs_spec, rhs_spec), out_specs=out_spec))

    def inputs(k):
        rng = np.random.default_rng(0)
        lhs = jax.device_put(rng.standard_normal((k, k), np.float32), NamedSharding(mesh, lhs_spec))
        rhs = jax.device_put(rng.standard_normal((k, k), np.float32), NamedSharding(mesh, rhs_spec))
        return lhs, rhs

    def build(k):
        lhs, rhs = inputs(k)
        return lambda: jax.block_until_ready(hand(lhs, rhs))

    # Steps fine enough that the workload lands near 1 ms: from 256 (~0.43 ms) to 384 (~1 ms) alone, a
    # noisy tuning run sometimes chose 256, and the same fixed overhead then read as twice the ratio.
    k, tuned_us = tune(build, [256, 320, 352, 384, 448, 512, 640, 768, 1024], "shard_map workload k")
    lhs, rhs = inputs(k)
    detail(f"9. workload: the block matmul of JAX's shard_map tutorial, `out = lax.psum(jnp.dot(lhs, rhs), 'y')` "
           f"with lhs, rhs [{k}, {k}] float32 on the 4x2 mesh (x=4, y=2): lhs split P('x', 'y'), rhs P('y', None), "
           f"out assembled P('x', None); inputs already placed with those specs. Line: `%%shard_map {SHARD_MAP_LINE}`. "
           f"Hand-written `jax.jit(jax.shard_map(...))` blocking each call: {tuned_us:.0f} µs when tuned.")
    sh.user_ns.update(lhs=lhs, rhs=rhs, lax=lax, jnp=jnp)
    sh.run_cell_magic("shard_map", SHARD_MAP_LINE, SHARD_MAP_SRC)  # compiles once; every later run is cached
    ns = {}

    def hand_call():
        ns["out"] = hand(lhs, rhs)
        jax.block_until_ready(ns["out"])

    program = shard_map_engine._cache[next(key for key in shard_map_engine._cache if key[0] == SHARD_MAP_SRC)]

    def program_call():  # the engine enters the mesh inside its traced function, so a plain call
        jax.block_until_ready(program.jitted([lhs], [rhs]))  # one flat list of leaves per input

    def hand_magic(line, cell):  # a cell magic that only runs the hand-written call: IPython's own cost
        hand_call()

    hand_magic.__name__ = "jpm_bench_hand"
    sh.register_magic_function(no_var_expand(hand_magic), "cell", "jpm_bench_hand")  # ours are no_var_expand too
    sh.user_ns.update(shard_map_hand=hand, jax=jax)
    events = compile_events()
    compiled_before = len(events)
    t = interleaved({"ours": lambda: sh.run_cell_magic("shard_map", SHARD_MAP_LINE, SHARD_MAP_SRC), "hand": hand_call,
                     "ours' program": program_call,
                     "hand (a no-op magic)": lambda: sh.run_cell_magic("jpm_bench_hand", SHARD_MAP_LINE, SHARD_MAP_SRC),
                     "ours (run_cell)": lambda: sh.run_cell(f"%%shard_map {SHARD_MAP_LINE}\n{SHARD_MAP_SRC}"),
                     "hand (run_cell)": lambda: sh.run_cell(
                         "out = shard_map_hand(lhs, rhs)\n_ = jax.block_until_ready(out)")},
                    reps=args.reps, batch=20)
    recompiles = len(events) - compiled_before
    compare_row(9, "cached `%%shard_map` cell re-run (block matmul on a 4x2 mesh, --no-show) vs hand-written "
                   "`jax.jit(jax.shard_map(...))` + block (read against 9d: row 9*)", t, "ours", "hand", target=None)
    compare_row("9b", "control: the cell's cached compiled program called directly + block vs "
                      "the hand-written `jax.jit(jax.shard_map(...))` + block", t, "ours' program", "hand", target=None)
    compare_row("9c", "same as 9, both through `shell.run_cell` (a whole notebook cell each side)", t,
                "ours (run_cell)", "hand (run_cell)", target=None)
    compare_row("9d", "control: a cell magic that only makes the hand-written call, through "
                      "`shell.run_cell_magic` like 9's, vs the direct call: what any cell magic costs", t,
                "hand (a no-op magic)", "hand", target=None)
    ratio = above_a_noop_magic(t)
    ours_out, hand_out = sh.user_ns["out"], ns["out"]
    assert np.allclose(np.asarray(ours_out), np.asarray(hand_out), rtol=1e-5, atol=1e-3)
    assert ours_out.sharding.is_equivalent_to(hand_out.sharding, ours_out.ndim)
    detail(f"9. XLA compiles during the timed re-runs (both sides): {recompiles}; the cell's output equals the "
           f"hand-written one, with an equivalent sharding ({ours_out.sharding.spec}).")
    return {"9": (ratio, ABOVE_NOOP_TARGET)}


def profile_shard_map_rerun(jax, sh, calls: int = 2000):
    import jaxpar_magic.cell.programs as programs
    import jaxpar_magic.stages.run.program as runner
    import jaxpar_magic.stages.run.shard_map as engine

    program = engine._cache[next(key for key in engine._cache if key[0] == SHARD_MAP_SRC)]
    owners = ipython_steps(sh, "shard_map") + replay_steps(engine, runner, program, jax) + under_action([
        (engine, "shard_map_cell", "    jaxpar_magic/stages/run/shard_map.py:shard_map_cell"),
        (engine, "resolve_mesh", "      jaxpar_magic/engines/shard.py:resolve_mesh"),
        (engine, "run_shard_map", "      jaxpar_magic/stages/run/shard_map.py:run_shard_map"),
        (engine, "_full_path", "        jaxpar_magic/stages/run/shard_map.py:_full_path (prepare and compile: only when the short path declines)"),
        (engine, "run_program", "        jaxpar_magic/stages/run/program.py:run_program"),
        (programs.Rerun, "remember", "        jaxpar_magic/cell/programs.py:Rerun.remember"),
    ])
    return profile_steps(owners, lambda: sh.run_cell_magic("shard_map", SHARD_MAP_LINE, SHARD_MAP_SRC), calls)


# --- 10: --collectives -------------------------------------------------------------------------------

def bench_collectives(jax, sh, args) -> dict:
    import jax.numpy as jnp
    from IPython.utils.capture import capture_output
    from jax import lax

    per_device = 64
    sh.user_ns.update(x=jnp.arange(DEVICES * per_device, dtype=jnp.float32).reshape(DEVICES, per_device),
                      table=jnp.ones((DEVICES, DEVICES, per_device), jnp.float32), lax=lax)
    events = compile_events()
    counter = iter(range(1, 1_000_000))

    def fresh_cell() -> str:
        return COLLECTIVES_CELL.format(k=f"{next(counter)}.0")  # a new text: compiles

    def first_run(line: str) -> tuple[float, int, float]:
        """Seconds, XLA compiles and their seconds of one cell's first run, views built and displayed
        (output captured: it would go to the terminal)."""
        cell = fresh_cell()
        before = len(events)
        start = time.perf_counter()
        with capture_output():
            sh.run_cell_magic("pmap", line, cell)
        elapsed = time.perf_counter() - start
        return elapsed, len(events) - before, sum(events[before:])

    runs = max(3, min(args.reps, args.first_runs))
    samples = {"with": [], "without": [], "with --no-show": [], "without --no-show": []}
    compiles = {k: [] for k in samples}
    first_run("")  # warm up the view classes and the recorder's imports, as a session would have
    first_run("--collectives")
    lines = {"with": "--collectives", "without": "", "with --no-show": "--collectives --no-show",
             "without --no-show": "--no-show"}
    for rep in range(runs):
        order = list(lines) if rep % 2 == 0 else list(lines)[::-1]
        for key in order:
            seconds, count, compile_s = first_run(lines[key])
            samples[key].append(seconds)
            compiles[key].append((count, compile_s))
    timing = {k: Timing(statistics.median(v), min(v), v) for k, v in samples.items()}
    r10 = _first_run_row("10", "first run of a fresh `%%pmap --collectives` cell (the issue's cell: psum, all_gather, "
                               "psum_scatter; result view and collective cards shown, output captured) vs its first run "
                               "without the flag (result view shown)", timing, "with", "without")
    _first_run_row("10", "same, both `--no-show` (the cards are still shown: `--collectives` asks for them)",
                   timing, "with --no-show", "without --no-show", target=None)
    for key in samples:
        detail(f"10. first runs `%%pmap {lines[key]}` ({runs}): " + ", ".join(f"{s * 1e3:.0f} ms" for s in samples[key])
               + "; XLA compiles (count, s) per run: " + ", ".join(f"{c} ({s:.2f} s)" for c, s in compiles[key]))

    # 10b. a cached re-run without the flag: of a cell that once ran with --collectives, and of one that never did.
    once_with, never_with = COLLECTIVES_CELL.format(k="3.0"), COLLECTIVES_CELL.format(k="5.0")
    with capture_output():
        sh.run_cell_magic("pmap", "--no-show", once_with)
        sh.run_cell_magic("pmap", "--collectives --no-show", once_with)
        before = len(events)
        sh.run_cell_magic("pmap", "--no-show", once_with)
        after_flag = len(events) - before
        sh.run_cell_magic("pmap", "--no-show", never_with)
    before = len(events)
    t = interleaved({"after": lambda: sh.run_cell_magic("pmap", "--no-show", once_with),
                     "plain": lambda: sh.run_cell_magic("pmap", "--no-show", never_with)}, reps=args.reps, batch=20)
    recompiles = len(events) - before
    r10b = compare_row("10b", "cached re-run WITHOUT the flag (--no-show) of a cell that ran once with `--collectives` "
                              "vs a cached re-run of the same cell text that never did (different constant)",
                       t, "after", "plain", target=RERUN_TARGET)
    detail(f"10b. XLA compiles: the plain re-run right after the `--collectives` run: {after_flag}; during the timed "
           f"re-runs (both sides): {recompiles}. Inputs: x [{DEVICES}, {per_device}] f32, table [{DEVICES}, {DEVICES}, "
           f"{per_device}] f32.")
    return {"10": (r10, COLLECTIVES_TARGET), "10b": (r10b, RERUN_TARGET)}


def _first_run_row(section, what, timing, ours, reference, target=COLLECTIVES_TARGET):
    o, h = timing[ours], timing[reference]
    ratio = o.median / h.median
    row(section, what, f"{fmt_us(o.median)} (min {fmt_us(o.min)})", f"{fmt_us(h.median)} (min {fmt_us(h.min)})",
        f"{ratio:.2f} (paired {paired_ratio(o, h):.2f})", f"{(o.median - h.median) * 1e3:+.0f} ms",
        verdict(ratio, target) if target else "")
    log(f"10: {ours} {o.median * 1e3:.0f} ms vs {reference} {h.median * 1e3:.0f} ms")
    return ratio
