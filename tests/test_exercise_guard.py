"""Checks the kernel cannot talk into "right" (issue 41), in a real shell:

* an exercise cell sets its answers and names of its own; one that rebinds a name defined before it
  (a constant the check compares against, `check` itself), replaces a function of the package or of
  JAX, swaps a function's code, registers a hook or an input transformer, or leaves a thread running
  is put back and refused in one line, and the check says "not yet" with that line;
* the answers are the program's: a decoy magic cell beside a plain-Python or NumPy answer, or a magic
  run from other code, is "not computed by the `%%shard_map` cell"; `--broadcast readings` with a
  dummy permute is refused by the layout the exercise gives; answers read from the globals whole, or
  a one-device gradient sliced, fail when the check runs the cell's program on other inputs;
* an answer the check calls (a function) may not change what the check reads, and an answer of a
  class the notebook defined (whose `==` always says yes) is never compared by its own `==`;
* each check() call leaves one verdict in the checks' ledger, the grader's channel.

Honest answers stay right: a name bound again to the same value, names the exercise's own earlier
run made, the solution written differently.
"""
from __future__ import annotations

import json

import pytest
from IPython.utils.capture import capture_output

from jaxpar_magic.face import checks, exercises


@pytest.fixture
def ex(jx):
    exercises.forget_all()
    checks._failures.clear()
    jx.run_cell("from jaxpar_magic import attempt, check\nfrom jax.sharding import PartitionSpec as P\n"
                "readings = jnp.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0])\n"
                "ring = [(i, (i + 1) % 8) for i in range(8)]\ntotal = jnp.full(8, readings.sum())\n"
                "m = jnp.arange(128.0).reshape(8, 16) / 10\nv = jnp.linspace(-1.0, 1.0, 16)\n"
                "xs = jnp.sin(jnp.arange(512.0)).reshape(32, 16)\ndy = jnp.cos(jnp.arange(128.0)).reshape(32, 4)\n"
                "MEMORY_LIMIT = 3 * 2**20")
    yield jx
    exercises.forget_all()
    checks._failures.clear()


def run(shell, source: str) -> tuple[bool, list[str]]:
    with capture_output() as shown:
        result = shell.run_cell(source)
    return result.success, (shown.stdout + shown.stderr).strip().splitlines()


def verdict(shell, source: str) -> str:
    ok, lines = run(shell, source)
    assert ok, lines
    said = [line for line in lines if line.startswith(("✓", "✗"))]
    assert len(said) == 1, lines
    return said[0]


ANSWER_CHECK = 'check(attempt("answer")["answer"], 1, hint="h")'
RING_CHECK = """ring_run = attempt("ring_total")
check(ring_run["ring_total"], total, method=[ring_run.split_into("readings", 8),
      ring_run.sends_only("collective-permute", most_bytes=readings.nbytes),
      ring_run.follows(jnp.full(8, (readings ** 2).sum()), readings=readings ** 2)], hint="h")"""
MV_CHECK = """product = attempt("mv")
check(product["mv"], m @ v, method=[product.ran("shard_map", m=P(None, "i"), v=P("i")),
      product.sends_only("all-reduce", count=1, most_bytes=(m @ v).nbytes),
      product.follows(jnp.cos(m) @ v[::-1], m=jnp.cos(m), v=v[::-1])], hint="h")"""
GRAD_CHECK = """fsdp = attempt("grad_w")
check(fsdp["grad_w"], xs.T @ dy, atol=1e-4, method=[fsdp.ran("shard_map", xs=P("data"), dy=P("data")),
      fsdp.sends_only("reduce-scatter", count=1, most_bytes=(xs.T @ dy).nbytes),
      fsdp.follows(jnp.cos(xs).T @ dy[::-1], atol=1e-4, xs=jnp.cos(xs), dy=dy[::-1])], hint="h")"""
GRAD_LINE = "%%shard_map --mesh data=8 --in xs=data dy=data --out grad_w=data --no-show"
RING = ("%%exercise ring_total\n%%pmap -a batch --no-show\npassing = readings\nring_total = readings\n"
        "for _ in range(7):\n    passing = lax.ppermute(passing, 'batch', perm=ring)\n    ring_total = ring_total + passing")


@pytest.mark.parametrize("cell, says", [
    ("MEMORY_LIMIT = 64 * 2**20", "rebinds `MEMORY_LIMIT`, defined before it, to another value"),
    ("globals()['check'] = lambda *a, **k: print('✓ right')", "rebinds `check`, defined before it"),
    ("del total", "deletes `total`, defined before it"),
    ("import jaxpar_magic.face.checks as c\nc.differs = lambda *a, **k: None", "replaces `jaxpar_magic.face.checks.differs`"),
    ("jnp.allclose = lambda *a, **k: True", "replaces `jax.numpy.allclose`"),
    ("check.__code__ = (lambda *a, **k: print('✓ right')).__code__", "changes the code or defaults of `check`"),
    ("get_ipython().events.register('post_run_cell', lambda result: print('✓ right'))",
     "changes IPython's event callbacks"),
    ("def hook(info):\n    globals()['total'] = 0\nhook.__module__ = 'IPython'\n"
     "get_ipython().events.register('pre_run_cell', hook)", "changes IPython's event callbacks"),
    ("get_ipython().input_transformers_post.append(lambda lines: ['print(\"✓ right\")\\n'])",
     "changes IPython's input transformers"),
    ("import threading\nthreading.Thread(target=threading.Event().wait, args=(5,), daemon=True).start()",
     "leaves a thread running"),
])
def test_an_exercise_cell_that_changes_what_was_there_is_refused_and_put_back(ex, cell, says):
    before = {name: ex.user_ns[name] for name in ("MEMORY_LIMIT", "check", "total", "jnp")}
    ok, lines = run(ex, f"%%exercise answer\n{cell}\nanswer = 1")
    refused = [line for line in lines if line.startswith("✗")]  # (a hook it registered fired once, printing)
    assert not ok and refused == lines[-1:] and lines[-1].startswith(f"✗ the exercise cell {says}"), lines
    assert "this run does not count" in lines[-1]
    assert all(ex.user_ns[name] is value for name, value in before.items())
    import jax.numpy as jnp

    from jaxpar_magic.face import checks as module
    assert jnp.allclose.__module__.startswith("jax") and module.differs.__name__ == "differs"
    assert ex.events.callbacks["post_run_cell"] == [] and ex.input_transformers_post == []
    assert verdict(ex, ANSWER_CHECK).startswith(f"✗ not yet: the exercise cell {says}")
    assert run(ex, "%%exercise answer\nanswer = 1")[0]
    assert verdict(ex, ANSWER_CHECK) == "✓ right"


def test_the_same_value_bound_again_and_the_exercises_own_names_are_allowed(ex):
    """An honest cell may recompute a temporary that a scratch cell made (the same values), bind a
    constant to the value it had, and on a second run rebind the helpers its first run made."""
    body = RING.partition("\n")[2]
    assert run(ex, body)[0]  # tried as a plain cell first: `passing` exists
    assert run(ex, RING)[0] and verdict(ex, RING_CHECK) == "✓ right"
    assert run(ex, "%%exercise answer\nMEMORY_LIMIT = 3 * 2**20\nhelper = [1]\nanswer = 1")[0]
    assert run(ex, "%%exercise answer\nhelper = [2]\nanswer = helper[0] - 1")[0]
    assert verdict(ex, ANSWER_CHECK) == "✓ right"


def test_a_front_ends_own_callback_may_be_added(ex):
    """matplotlib's inline backend registers a callback when a cell makes the kernel's first figure:
    its code lies in the library, not in a cell, so the exercise run counts."""
    pytest.importorskip("matplotlib_inline")
    assert run(ex, "%%exercise answer\nfrom matplotlib_inline.backend_inline import flush_figures\n"
                   "get_ipython().events.register('post_execute', flush_figures)\nanswer = 1")[0]
    ex.events.unregister("post_execute", ex.user_ns["flush_figures"])
    assert verdict(ex, ANSWER_CHECK) == "✓ right"


@pytest.mark.parametrize("cell, says", [
    (f"get_ipython().run_cell_magic('shard_map', {GRAD_LINE[12:]!r}, "
     "\"grad_w = lax.psum_scatter(xs.T @ dy, 'data', tiled=True)\")\nimport numpy as np\n"
     "grad_w = np.asarray(xs).T @ np.asarray(dy)", "`grad_w` was not computed by the `%%shard_map` cell"),
    (f"get_ipython().run_cell_magic('shard_map', {GRAD_LINE[12:]!r}, "
     "\"grad_w = lax.psum_scatter(xs.T @ dy, 'data', tiled=True)\")",
     "the exercise cell runs `%%shard_map` from other code"),
    (f"{GRAD_LINE}\nfull = globals()['xs'].T @ globals()['dy']\ngrad_w = lax.psum_scatter(0 * (xs.T @ dy), 'data', "
     "tiled=True) + lax.dynamic_slice_in_dim(full, lax.axis_index('data') * 2, 2)",
     "run again with other values in `xs`, `dy`, the cell's `grad_w` is wrong"),
])
def test_an_answer_is_the_programs_own(ex, cell, says):
    assert run(ex, f"%%exercise grad_w\n{GRAD_LINE}\ngrad_w = lax.psum_scatter(xs.T @ dy, 'data', tiled=True)")[0]
    assert verdict(ex, GRAD_CHECK) == "✓ right"
    assert run(ex, f"%%exercise grad_w\n{cell}")[0]
    assert verdict(ex, GRAD_CHECK).startswith(f"✗ not yet: {says}")


def test_the_product_read_whole_from_the_globals_fails_on_other_inputs(ex):
    """`whole()` reads the global m and v, which the program captures as they are: run on other
    inputs, the cell's program still gives the old product. A correct product written otherwise is right."""
    assert run(ex, "%%exercise mv\n%%shard_map --mesh i=8 --in m=None,i v=i --no-show\n"
                   "mv = lax.psum(jnp.einsum('ij,j->i', m, v), 'i')")[0]
    assert verdict(ex, MV_CHECK) == "✓ right"
    assert run(ex, "%%exercise mv\n%%shard_map --mesh i=8 --in m=None,i v=i --no-show\n"
                   "def whole():\n    return globals()['m'] @ globals()['v']\nmv = whole() + 0 * lax.psum(m @ v, 'i')")[0]
    assert verdict(ex, MV_CHECK).startswith("✗ not yet: run again with other values in `m`, `v`, the cell's `mv` is wrong")


def test_the_ring_needs_its_inputs_as_the_exercise_gives_them(ex):
    assert run(ex, RING)[0] and verdict(ex, RING_CHECK) == "✓ right"
    assert run(ex, "%%exercise ring_total\n%%pmap -a batch --broadcast readings --no-show\n"
                   "ring_total = readings.sum() + 0 * lax.ppermute(readings.sum(), 'batch', perm=ring)")[0]
    assert verdict(ex, RING_CHECK).startswith(
        "✗ not yet: `readings` is given whole to every device (`--broadcast readings`)")
    assert run(ex, "%%exercise ring_total\ns = float(np.sum(np.asarray(readings)))\n"
                   "get_ipython().run_cell_magic('pmap', '-a batch --no-show', "
                   "\"ring_total = s + 0 * lax.ppermute(readings, 'batch', perm=ring)\")")[0]
    assert verdict(ex, RING_CHECK).startswith("✗ not yet: the exercise cell runs `%%pmap` from other code")


def test_a_function_answer_may_not_change_what_the_check_reads(ex):
    """The check calls a function answer (the memory chapter's `stash_slots`): a call that rebinds the
    check's expected value is put back and raises, so the check sees the error, not the forgery."""
    check_cell = ("formula = attempt('answer')['answer']\nwant = [3, 4]\n"
                  "try:\n    got = [formula(k) for k in (1, 2)]\nexcept Exception as error:\n"
                  "    got = type(error).__name__\ncheck(got, want, hint='h')")
    assert run(ex, "%%exercise answer\ndef answer(k):\n    globals()['want'] = 'anything'\n    return 'anything'")[0]
    assert verdict(ex, check_cell).startswith("✗ not yet: got 'AnswerRefused'")
    assert run(ex, "%%exercise answer\ndef answer(k):\n    return k + 2")[0]
    assert verdict(ex, check_cell) == "✓ right"


def test_an_answer_of_the_notebooks_own_class_is_not_compared_by_its_own_eq(ex):
    assert run(ex, "%%exercise answer\nclass Yes(int):\n    def __eq__(self, other):\n        return True\n"
                   "    __hash__ = int.__hash__\nanswer = {'a': Yes(5)}")[0]
    said = verdict(ex, 'check(attempt("answer")["answer"], {"a": 1}, hint="h")')
    assert said.startswith("✗ not yet: at ['a']: got a Yes, a class of the notebook's"), said


def test_each_check_leaves_one_verdict_in_the_ledger(ex):
    start = json.loads(checks.ledger())["count"]
    assert run(ex, "%%exercise answer\nanswer = 2")[0]
    verdict(ex, ANSWER_CHECK)
    assert run(ex, "%%exercise answer\nanswer = 1")[0]
    verdict(ex, ANSWER_CHECK)
    given = json.loads(checks.ledger(start))
    assert given["count"] == start + 2
    assert [(v["answers"], v["verdict"]) for v in given["verdicts"]] == [(["answer"], "not yet"), (["answer"], "right")]
    assert given["verdicts"][1]["line"] == "✓ right"
