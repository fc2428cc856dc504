"""Plans with JAX's persistent compilation cache on (`jax_compilation_cache_dir`, which JAX's docs
advise for large models and many researchers set in every session).

That cache keys a program without its dump options, so before cell/xla_dump.persistent_cache_off a
plan of a program already compiled (earlier in the session, or in an earlier session) was loaded
from it, XLA wrote no buffer assignment, and the plan failed with a raw DumpFormatError: the memory
chapter's remat cell and any re-plan in a new session. Each session here is a fresh process (the
cache is process-wide state), with the cache's thresholds at 0 so that small programs are cached as
a large model's would be.

The oracle is a hand compile of the same step (`jax.jit(step).lower(...).compile().memory_analysis()`);
and the user's cache must go on working for everything else, as they set it.
"""
from __future__ import annotations

import json
import textwrap

from shell_helpers import in_a_fresh_shell

# After shell_helpers.FRESH_SHELL (8 devices, the extension loaded, nothing compiled yet), with `cache`
# the folder of JAX's persistent cache.
SESSION = """
    import json, os
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    import jaxpar_magic
    from jaxpar_magic.stages.plan import compiled_plans

    ip.run_cell("import jax, jax.numpy as jnp\\n"
                "x = jnp.ones((64, 256))\\nw = jnp.ones((256, 256))\\n"
                "def step(x, w):\\n    return jnp.tanh(x @ w) @ w.T").raise_error()
    entries = lambda: sorted(os.listdir(cache))
    before = entries()
    ok = ip.run_cell("%%shard --plan --mesh data=8 --in x=data --no-show\\ny = step(x, w)")
    ns = ip.user_ns
    plans = []
    for _ in range(2):  # the same program twice, our own kept plans forgotten in between
        compiled_plans.forget()
        plan = jaxpar_magic.plan_cell("y = step(x, w)", ns, mesh=jax.make_mesh((8,), ("data",)),
                                      in_specs={"x": jax.P("data")}, bind=False)
        plans.append([plan.argument_bytes, plan.output_bytes, plan.temp_bytes, len(plan.peak.buffers)])
    after_plans = entries()
    mesh = jax.make_mesh((8,), ("data",))
    sharded = jax.device_put(ns["x"], jax.NamedSharding(mesh, jax.P("data")))
    memory = jax.jit(ns["step"]).lower(sharded, ns["w"]).compile().memory_analysis()
    jax.jit(lambda v: jnp.cos(v) * 3).lower(ns["w"]).compile()  # the user's own compile, after the plans
    print(json.dumps({"magic_ok": ok.success, "error": repr(ok.error_in_exec), "plans": plans,
                      "oracle": [memory.argument_size_in_bytes, memory.output_size_in_bytes, memory.temp_size_in_bytes],
                      "cache_on": jax.config.jax_enable_compilation_cache,
                      "plans_added": sorted(set(after_plans) - set(before)), "after": len(entries()),
                      "after_plans": len(after_plans)}))
"""


def _session(cache: str) -> dict:
    done = in_a_fresh_shell(f"cache = {cache!r}\n" + textwrap.dedent(SESSION))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_plans_compile_for_their_dump_with_the_persistent_cache_on_and_leave_it_on(tmp_path):
    cache = str(tmp_path / "jax-cache")
    for session in (_session(cache), _session(cache)):  # the second session finds every program cached
        assert session["magic_ok"], session["error"]
        first, second = session["plans"]
        assert first == second and first[:3] == session["oracle"], session
        assert first[3] > 0  # the peak's buffers, read from the buffer assignment
        assert session["cache_on"] is True  # as the user set it
        assert session["plans_added"] == [], "a plan's compile-only program went into the user's cache"
        assert session["after"] >= session["after_plans"]
    assert session["after"] == session["after_plans"]  # the second session: the user's compile came from the cache
