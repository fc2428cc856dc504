"""Section 15 of bench/run.py: what a cell costs over asynchronous `jax.jit` (issue 39).

A loop of cached cells against a loop of plain `jax.jit` calls that never wait, each loop timed from
its first call until its last result is ready (so the devices' work counts once, wherever it
overlaps Python): steps × rounds, rounds interleaved, medians per step. Two steps: a tiny one (Python
and dispatch dominate) and one of about 2 ms (device work dominates; tuned). Cases:

- `%%shard --no-show` on an input split over every device (x=data,None: no collectives, so no CPU
  guard), and with `--in x=P()` (replicated: the spelling that used to leave the short path);
- `%%shard` showing its sharding view, and `%%shard_map` showing its result view (its values filled
  in later by views/later.py), both with output captured, against the hand-written loop captured the
  same way: what a shown cell adds over `--no-show`.

It runs on whatever devices the backend has: 8 simulated CPU devices here, one TPU chip on a TPU VM
(`JAX_PLATFORMS=tpu python bench/run.py --only 15`). `--async-devices 1` puts the cells on one device:
on this CPU that leaves the other simulated devices' threads out, so what remains is mostly Python,
as on one chip.
"""
from __future__ import annotations

import statistics
import time

from benchkit import compile_events, detail, fmt_us, log, row, verdict

STEP_SRC = "x = jnp.tanh(x @ w)\n"
NO_SHOW_TARGET = 1.05  # issue 39: a --no-show cached re-run within 5% of asynchronous jax.jit
SHOWN_EXTRA_TARGET = 1e-3  # issue 39: a shown cell's cost above --no-show under 1 ms (outputs under 1 MB)
STEP_TARGET_S = 2e-3  # the larger step: about 2 ms of device work, as on the chip


def _loop(run, sync, steps: int) -> float:
    """Seconds per step of `steps` calls of `run`, until `sync()` (the last result) is ready."""
    start = time.perf_counter()
    for _ in range(steps):
        run()
    sync()
    return (time.perf_counter() - start) / steps


def _interleaved(cases: dict, steps: int, rounds: int, events: list) -> tuple[dict[str, list[float]], int]:
    """Per-step seconds of each case (run, sync), `rounds` times, the order flipped every round; and
    the XLA compiles (`events`: benchkit.compile_events) during the timed loops."""
    for run, sync in cases.values():  # warm: every case has compiled and been through its short path
        _loop(run, sync, 3)
    before = len(events)
    samples: dict[str, list[float]] = {k: [] for k in cases}
    order = list(cases)
    for r in range(rounds):
        for key in (order if r % 2 == 0 else order[::-1]):
            samples[key].append(_loop(*cases[key], steps))
    return samples, len(events) - before


def _median(values: list[float]) -> float:
    return statistics.median(values)


def bench_async(jax, sh, args) -> dict:
    import jax.numpy as jnp
    import numpy as np
    from IPython.utils.capture import capture_output
    from jax.sharding import NamedSharding, PartitionSpec as P

    from jaxpar_magic.views.later import wait_for_fills

    n = args.async_devices or jax.device_count()
    with capture_output():
        sh.run_line_magic("mesh", f"data={n} --devices {n} --name amesh --no-show")
    mesh = sh.user_ns["amesh"]
    platform = jax.devices()[0].platform
    hand = jax.jit(lambda x, w: jnp.tanh(x @ w))

    def placed(rows, width, spec):
        x = jax.device_put(jnp.ones((rows, width), jnp.float32) / width, NamedSharding(mesh, spec))
        w = jax.device_put(jnp.eye(width, dtype=jnp.float32), NamedSharding(mesh, P()))
        return x, w

    def async_step_s(width):
        x, w = placed(width, width, P("data", None))
        holder = [x]

        def run():
            holder[0] = hand(holder[0], w)
        return _median([_loop(run, lambda: jax.block_until_ready(holder[0]), 20) for _ in range(3)])

    width = None
    for candidate in (128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192):
        if candidate % n:
            continue
        seconds = async_step_s(candidate)
        log(f"15: tune the ~2 ms step: x[{candidate}, {candidate}] @ w -> {seconds * 1e6:.0f} µs/step")
        width = candidate
        if seconds >= STEP_TARGET_S:
            break
    steps, rounds = args.async_steps, args.async_rounds
    events = compile_events()
    results = {}
    for label, rows, size in (("tiny", 8 * n, 128), ("~2 ms", width, width)):
        results[label] = _one_step(jax, sh, hand, placed, label, rows, size, steps, rounds, events,
                                   capture_output, wait_for_fills, NamedSharding, P, np)
    detail(f"15. {platform}: a mesh of {n} device(s) ({jax.devices()[0].device_kind}); step `x = jnp.tanh(x @ w)`, w "
           f"[size, size] replicated, x split over the devices by rows (x=data,None) or replicated (x=P()); "
           f"{steps} steps a loop, {rounds} interleaved rounds, each loop timed until its last result is ready; "
           f"hand-written: `x = jax.jit(step)(x, w)` in a loop that never waits. Shown cells and their "
           f"hand-written twin run under IPython's capture_output (the views' outputs go nowhere). The result view "
           f"is filled by views/later.py's thread (JaxparMagics.view_values = 'later', as in JupyterLab).")
    ratios = {}
    for label, r in results.items():
        ratios[f"15 {label}"] = (r["no-show"], NO_SHOW_TARGET)
    return ratios


def _one_step(jax, sh, hand, placed, label, rows, size, steps, rounds, events, capture_output, wait_for_fills,
              NamedSharding, P, np) -> dict:
    """The rows of one step size; returns the ratios it measured."""
    ns = sh.user_ns
    line = "--mesh amesh --in x=data,None"
    x0, w = placed(rows, size, P("data", None))
    xr, _ = placed(rows, size, P())
    hand_x = {"split": x0, "replicated": xr}

    def cell(magic, line_, source=STEP_SRC, quiet=False):
        if quiet:
            def run():
                with capture_output():
                    sh.run_cell_magic(magic, line_, source)
        else:
            def run():
                sh.run_cell_magic(magic, line_, source)
        return run

    def hand_case(which, quiet=False):
        def run():
            if quiet:
                with capture_output():
                    hand_x[which] = hand(hand_x[which], w)
            else:
                hand_x[which] = hand(hand_x[which], w)
        return run, lambda: jax.block_until_ready(hand_x[which])

    def ours_sync():
        jax.block_until_ready(ns["x"])

    def ours_shown_sync():
        wait_for_fills(600)
        jax.block_until_ready(ns["x"])

    sh.user_ns.update(x=x0, w=w, jnp=jax.numpy)
    sh.run_line_magic("config", "JaxparMagics.view_values = 'later'")
    replicated_line = "--mesh amesh --in xp=P() --no-show"  # its own input: x stays split for the others
    cases = {
        "hand": hand_case("split"),
        "ours --no-show": (cell("shard", line + " --no-show"), ours_sync),
        "hand (x replicated)": hand_case("replicated"),
        "ours --no-show x=P()": (cell("shard", replicated_line, STEP_SRC.replace("x", "xp")),
                                 lambda: jax.block_until_ready(ns["xp"])),
        "hand (captured)": hand_case("split", quiet=True),
        "ours shown %%shard": (cell("shard", line, quiet=True), ours_sync),
        "ours shown %%shard_map": (cell("shard_map", "--mesh amesh --in x=data,None --out x=data,None", quiet=True),
                                   ours_shown_sync),
    }
    ns["xp"] = xr
    samples, compiled = _interleaved(cases, steps, rounds, events)
    sh.run_line_magic("config", "JaxparMagics.view_values = 'auto'")
    med = {k: _median(v) for k, v in samples.items()}

    def paired(ours: str, hand: str) -> float:
        """The median of the rounds' own ratios (each round ran both loops back to back)."""
        return _median([a / b for a, b in zip(samples[ours], samples[hand])])

    no_show = paired("ours --no-show", "hand")
    row(15, f"{label} step: cached `%%shard {line} --no-show` re-run vs asynchronous `jax.jit` (per step, until "
            f"the last result is ready)", fmt_us(med["ours --no-show"]), fmt_us(med["hand"]),
        f"{no_show:.3f} (paired; medians {med['ours --no-show'] / med['hand']:.3f})",
        f"{(med['ours --no-show'] - med['hand']) * 1e6:+.0f} µs", verdict(no_show, NO_SHOW_TARGET))
    replicated = paired("ours --no-show x=P()", "hand (x replicated)")
    row("15b", f"{label} step: the same with `--in x=P()` (replicated; the spelling P() vs the program's "
               f"P(None, None))", fmt_us(med["ours --no-show x=P()"]), fmt_us(med["hand (x replicated)"]),
        f"{replicated:.3f} (paired)", f"{(med['ours --no-show x=P()'] - med['hand (x replicated)']) * 1e6:+.0f} µs",
        verdict(replicated, NO_SHOW_TARGET))
    for key, what in (("ours shown %%shard", "`%%shard` showing its sharding view"),
                      ("ours shown %%shard_map", "`%%shard_map` showing its result view (values filled later) "
                                                 "and its sharding view")):
        # What showing adds over --no-show, per round: (shown - hand captured) - (no-show - hand).
        extra = _median([(a - b) - (c - d) for a, b, c, d in zip(samples[key], samples["hand (captured)"],
                                                                 samples["ours --no-show"], samples["hand"])])
        row("15c", f"{label} step: {what}, captured, vs asynchronous `jax.jit` captured; extra = what showing "
                   f"adds over `--no-show` (median of the rounds')", fmt_us(med[key]), fmt_us(med["hand (captured)"]),
            f"{paired(key, 'hand (captured)'):.2f} (paired)", f"{extra * 1e6:+.0f} µs",
            f"≤ {SHOWN_EXTRA_TARGET * 1e6:.0f} µs extra: {'meets' if extra <= SHOWN_EXTRA_TARGET else 'MISSES'}")
    if label == "tiny":
        _dispatch_floor(sh, med["hand"])
    _check_values(jax, sh, hand, placed, rows, size, np, P)
    detail(f"15. {label} step (x [{rows}, {size}] f32, {rows * size * 4 / 1e6:.2f} MB): medians per step "
           + ", ".join(f"{k} {fmt_us(v)}" for k, v in med.items())
           + f"; XLA compiles during the timed loops: {compiled}; per-round samples (µs): "
           + "; ".join(f"{k}: {', '.join(f'{s * 1e6:.0f}' for s in v)}" for k, v in samples.items()))
    return {"no-show": no_show}


def _dispatch_floor(sh, hand_step_s: float, calls: int = 20_000) -> None:
    """Row 15d: what IPython itself costs to run a cell magic that does nothing (`run_cell_magic`: the
    builtin trap, the magic's look-up), against the budget 1.05x leaves over the hand-written tiny step:
    no cell magic's re-run can cost less than this floor."""
    sh.register_magic_function(lambda line, cell: None, "cell", "jpm_bench_noop")

    def noop_cells() -> float:
        start = time.perf_counter()
        for _ in range(calls):
            sh.run_cell_magic("jpm_bench_noop", "--x", STEP_SRC)
        return (time.perf_counter() - start) / calls

    noop_cells()
    floor = _median([noop_cells() for _ in range(3)])
    budget = (NO_SHOW_TARGET - 1) * hand_step_s
    row("15d", "the floor: IPython's `run_cell_magic` of a cell magic that does nothing, vs what ≤ 1.05x leaves a "
               "cell over the hand-written tiny step", fmt_us(floor), f"{budget * 1e6:.1f} µs (5% of {fmt_us(hand_step_s)})",
        f"{floor / budget:.2f} of the budget", "", "no target: for the record")


def _check_values(jax, sh, hand, placed, rows, size, np, P) -> None:
    """Three cell steps equal three hand-written steps (the timed loops ran different step counts)."""
    x, w = placed(rows, size, P("data", None))
    sh.user_ns.update(x=x, w=w)
    ours = x
    for _ in range(3):
        sh.run_cell_magic("shard", "--mesh amesh --in x=data,None --no-show", STEP_SRC)
        ours = hand(ours, w)
    np.testing.assert_allclose(np.asarray(sh.user_ns["x"]), np.asarray(ours), rtol=1e-6)


def hot_functions(jax, sh, calls: int = 500, top: int = 25) -> str:
    """Where a tiny `--no-show` re-run's time goes, function by function (cProfile's own time per cell,
    µs; cProfile inflates every call, so read the ranking and the shares, not the sums), beside the
    hand-written loop's: what our cell does that `x = jax.jit(step)(x, w)` does not. For a shown
    `%%shard_map` also the values thread (views/later.py: its own time per view, and its wall time per
    view unprofiled) and the cell's inclusive times, where the shown cell's extra time goes."""
    import cProfile
    import pstats

    import jax.numpy as jnp
    from IPython.utils.capture import capture_output
    from jax.sharding import NamedSharding, PartitionSpec as P

    from jaxpar_magic.views import later
    from jaxpar_magic.views.later import wait_for_fills

    ns = sh.user_ns
    mesh = ns["amesh"]
    n = mesh.devices.size
    ns["x"] = jax.device_put(jnp.ones((8 * n, 128), jnp.float32) / 128, NamedSharding(mesh, P("data", None)))
    ns["w"] = jax.device_put(jnp.eye(128, dtype=jnp.float32), NamedSharding(mesh, P()))
    hand = jax.jit(lambda x, w: jnp.tanh(x @ w))
    held = [ns["x"], ns["w"]]

    def ours():
        sh.run_cell_magic("shard", "--mesh amesh --in x=data,None --no-show", STEP_SRC)

    def theirs():
        held[0] = hand(held[0], held[1])

    def shown_shard_map():
        with capture_output():
            sh.run_cell_magic("shard_map", "--mesh amesh --in x=data,None --out x=data,None", STEP_SRC)

    def where(path: str) -> str:
        return path.split("site-packages/")[-1].split("jaxpar_magic/", 1)[-1] if path != "~" else "builtin"

    OWN, INCLUSIVE = 2, 3  # columns of pstats' (calls, primitive calls, own time, inclusive time, callers)

    def ranked(profiler, heading: str, column: int, most: int) -> list[str]:
        """`heading`, then the `most` functions with the most time in `column`, per cell."""
        rows = sorted(pstats.Stats(profiler).stats.items(), key=lambda item: -item[1][column])
        return [heading] + [f"  {stat[column] / calls * 1e6:8.2f} µs  {stat[1] / calls:5.1f}x  {name}  "
                            f"({where(path)}:{lineno})" for (path, lineno, name), stat in rows[:most]]

    def own_rows(profiler, label: str) -> list[str]:
        total = sum(stat[OWN] for stat in pstats.Stats(profiler).stats.values())
        return ranked(profiler, f"\n15. {label}: {total / calls * 1e6:.1f} µs per cell under cProfile; own time per "
                                f"cell:", OWN, top)

    # The values thread's fills, timed (and, while `profiled`, profiled) in that thread.
    fill_profiler, fills, profiled = cProfile.Profile(), [0.0, 0], [False]
    plain_fill = later.fill

    def timed_fill(*fill_args):
        began = time.perf_counter()
        if profiled[0]:
            fill_profiler.enable()
        try:
            return plain_fill(*fill_args)
        finally:
            if profiled[0]:
                fill_profiler.disable()
            fills[0] += time.perf_counter() - began
            fills[1] += 1

    lines = []
    sh.run_line_magic("config", "JaxparMagics.view_values = 'later'")
    later.fill = timed_fill
    try:
        for label, run, sync in (("ours (%%shard --no-show, cached re-run)", ours, lambda: ns["x"]),
                                 ("hand-written (x = jax.jit(step)(x, w))", theirs, lambda: held[0]),
                                 ("ours shown %%shard_map (values later; this thread)", shown_shard_map,
                                  lambda: (wait_for_fills(600), ns["x"])[1])):
            for _ in range(20):
                run()
            jax.block_until_ready(sync())
            fills[:] = [0.0, 0]
            began = time.perf_counter()
            for _ in range(calls):
                run()
            jax.block_until_ready(sync())
            unprofiled = (time.perf_counter() - began) / calls
            filled = fills[:]
            profiler = cProfile.Profile()
            profiled[0] = True
            profiler.enable()
            for _ in range(calls):
                run()
            profiler.disable()
            jax.block_until_ready(sync())
            profiled[0] = False
            lines.append(f"\n15. {label}: {unprofiled * 1e6:.1f} µs per cell unprofiled (until the last result"
                         + (f" and view's values; the values thread's fills {filled[0] / filled[1] * 1e6:.1f} µs "
                            f"each, wall)" if filled[1] else ")"))
            lines += own_rows(profiler, label)
            if filled[1]:
                lines += own_rows(fill_profiler, "the values thread, per view")
                lines += ranked(profiler, f"\n15. {label}: inclusive time per cell under cProfile:", INCLUSIVE, 2 * top)
    finally:
        later.fill = plain_fill
        sh.run_line_magic("config", "JaxparMagics.view_values = 'auto'")
    return "\n".join(lines)
