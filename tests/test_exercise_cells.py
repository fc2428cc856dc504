"""`%%exercise` and `attempt()`: an exercise cell's check reads only what the cell's latest run
produced, and what the program it ran really sends (issue 25, "Exercises that can't be fooled")."""
from __future__ import annotations

import pytest
from IPython.utils.capture import capture_output

from jaxpar_magic.face import checks, exercises


@pytest.fixture
def ex(jx):
    """The shell, with no exercise run yet and fresh hints."""
    exercises.forget_all()
    checks._failures.clear()
    jx.run_cell("from jaxpar_magic import attempt, check")
    yield jx
    exercises.forget_all()
    checks._failures.clear()


def run(shell, source: str) -> tuple[bool, str]:
    """Run a cell as a notebook would; (did it succeed, everything it printed)."""
    with capture_output() as shown:
        result = shell.run_cell(source)
    return result.success, shown.stdout + shown.stderr


def verdict(shell, source: str) -> str:
    ok, said = run(shell, source)
    assert ok, said
    lines = said.strip().splitlines()
    assert len(lines) == 1, said  # a check prints exactly one line
    return lines[0]


RING_CHECK = """
ring = attempt("ring_total")
check(ring["ring_total"], jnp.full(8, 31.0), method=[ring.sends_only("collective-permute")],
      hint=["pass on what you received", "seven steps", "open Solution"])
"""
RING = """%%exercise ring_total
%%pmap -a batch --no-show
passing = readings
ring_total = readings
for _ in range(7):
    passing = lax.ppermute(passing, 'batch', perm=[(i, (i + 1) % 8) for i in range(8)])
    ring_total = ring_total + passing
"""


def test_a_solved_exercise_is_right_and_records_the_program(ex):
    ex.run_cell("readings = jnp.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0])")
    ok, said = run(ex, RING)
    assert ok, said
    assert verdict(ex, RING_CHECK) == "✓ right"
    ring = exercises.attempt("ring_total")
    assert ring.magic == "pmap" and ring.collectives == ["collective-permute"] * 7
    assert all(c.op == "collective-permute" and c.pairs for c in ring.program)


def test_stale_answers_never_pass(ex):
    """After a right answer: an emptied cell, a failing cell, a cell without %%exercise that sets the
    answer, or an answer rebound elsewhere all say "not yet"."""
    ex.run_cell("readings = jnp.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0])")
    assert run(ex, RING)[0]
    assert verdict(ex, RING_CHECK) == "✓ right"

    ok, said = run(ex, "%%exercise ring_total\n")  # emptied: IPython refuses an empty cell magic...
    assert not ok and "the cell body is empty" in said
    assert "ring_total" not in ex.user_ns  # ...but the answers were forgotten before it could
    assert verdict(ex, RING_CHECK).startswith("✗ not yet: the exercise cell's last run did not set `ring_total`")

    assert run(ex, RING)[0] and verdict(ex, RING_CHECK) == "✓ right"
    ok, said = run(ex, RING.replace("ring_total + passing", "ring_total + undefined_name"))
    assert not ok and "undefined_name" in said
    assert ("✗ the exercise cell stopped at the error above, so its answer `ring_total` is forgotten until the cell "
            "runs to the end") in said.splitlines()
    assert "ring_total" not in ex.user_ns
    assert verdict(ex, RING_CHECK).startswith("✗ not yet: the exercise cell stopped with an error")

    assert run(ex, RING)[0] and verdict(ex, RING_CHECK) == "✓ right"
    # An edited copy without the %%exercise line fails: the check must not borrow the old answer.
    ok, _ = run(ex, RING.partition("\n")[2].replace("ring_total + passing", "ring_total + undefined_name"))
    assert not ok and "ring_total" in ex.user_ns  # the failed magic bound nothing: the old value is there
    assert verdict(ex, RING_CHECK).startswith("✗ not yet: `ring_total` was set again by a cell without `%%exercise`")

    assert run(ex, RING)[0]
    ex.run_cell("def sneaky():\n    globals()['ring_total'] = jnp.full(8, 31.0)\nsneaky()")  # no visible assignment
    assert verdict(ex, RING_CHECK).startswith("✗ not yet: `ring_total` changed after the exercise cell ran")


def test_a_cell_emptied_entirely_never_leaves_a_right_behind(ex):
    """JupyterLab and nbclient send nothing for an empty cell, so the kernel sees only the check run
    again after a right answer: a run is graded once, and the second check says "not yet"."""
    ex.run_cell("readings = jnp.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0])")
    assert run(ex, RING)[0]
    assert verdict(ex, RING_CHECK) == "✓ right"
    # The whole cell emptied and run: no request reaches the kernel. Then the check:
    assert verdict(ex, RING_CHECK).startswith("✗ not yet: the check already graded the exercise cell's last run: "
                                              "run the exercise cell again, then this check")
    assert verdict(ex, RING_CHECK).startswith("✗ not yet: the check already graded")  # and stays so
    # A cell that reads the run twice is one grading; the next run of the exercise cell is graded afresh.
    assert run(ex, RING)[0]
    twice = RING_CHECK + 'assert attempt("ring_total")["ring_total"] is ring["ring_total"]\n'
    assert verdict(ex, twice) == "✓ right"


def test_a_plain_python_exercise_forgets_and_records(ex):
    check_cell = 'check(attempt("guess")["guess"], 448, hint=["count the rows"])'
    assert verdict(ex, check_cell).startswith("✗ not yet: run the exercise cell first (the cell that starts with "
                                              "`%%exercise guess`)")
    assert run(ex, "%%exercise guess\nguess = 7 * 64")[0]
    assert verdict(ex, check_cell) == "✓ right"
    ok, said = run(ex, "%%exercise guess\nguess = 7 * 64\n1 / 0")
    assert not ok and "ZeroDivisionError" in said and "guess" not in ex.user_ns
    assert verdict(ex, check_cell).startswith("✗ not yet: the exercise cell stopped with an error")
    ok, said = run(ex, "%%exercise guess\nguess = 8 * 64")
    assert ok and verdict(ex, check_cell) == "✗ not yet: got 512. Hint: count the rows."


def test_the_method_check_refuses_the_cheats(ex):
    ex.run_cell("readings = jnp.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0])\ntotal = jnp.full(8, 31.0)")
    cheats = {
        "%%exercise ring_total\n%%pmap -a batch --no-show\nring_total = total":  # the answer copied in
            "the cell's compiled program sends nothing between devices; it should send a collective-permute",
        "%%exercise ring_total\n%%pmap -a batch --no-show\nring_total = lax.psum(readings, 'batch')":
            "the cell's compiled program sends an all-reduce; this exercise allows only a collective-permute",
        "%%exercise ring_total\nring_total = jnp.full(8, 31.0)":  # plain Python, no program
            "write it as a magic cell (the exercise checks the program it compiles), using a collective-permute",
    }
    for cheat, why in cheats.items():
        assert run(ex, cheat)[0], cheat
        assert verdict(ex, RING_CHECK) == f"✗ not yet: {why}. Hint 1/3: pass on what you received.", cheat
        checks._failures.clear()


def test_a_shard_cell_exercise_reads_its_spec_placement_and_program(ex):
    ex.run_cell("%mesh data=4 model=2 --name grid --no-show\nm = jnp.arange(128.0).reshape(16, 8)")
    check_cell = """
run = attempt("row_totals")
check(run["row_totals"], jnp.sum(jnp.arange(128.0).reshape(16, 8), axis=1),
      method=[(run.magic == "shard" and run.spec("m") is not None, "lay m out with --in m=SPEC"),
              (len({str(s.index) for s in run.bound.get("m", m).addressable_shards}) == 8, "use all 8 devices"),
              run.sends_nothing()],
      hint="split the dimension you keep")
"""
    assert run(ex, "%%exercise row_totals\n%%shard --mesh grid --in m=(data,model),None --no-show\n"
                   "row_totals = jnp.sum(m, axis=1)")[0]
    assert verdict(ex, check_cell) == "✓ right"
    assert exercises.attempt("row_totals").spec("m") == __import__("jax").sharding.PartitionSpec(("data", "model"), None)
    assert run(ex, "%%exercise row_totals\n%%shard --mesh grid --in m=None,(data,model) --no-show\n"
                   "row_totals = jnp.sum(m, axis=1)")[0]
    assert verdict(ex, check_cell) == ("✗ not yet: the cell's compiled program sends an all-reduce. Hint: split the "
                                       "dimension you keep.")
    # Placing m by hand and leaving --in out: the line no longer lays it out.
    ex.run_cell("from jax.sharding import NamedSharding, PartitionSpec as P\n"
                "m = jax.device_put(m, NamedSharding(grid, P(('data', 'model'))))")
    assert run(ex, "%%exercise row_totals\n%%shard --mesh grid --no-show\nrow_totals = jnp.sum(m, axis=1)")[0]
    assert verdict(ex, check_cell) == ("✗ not yet: lay m out with --in m=SPEC. Hint: split the dimension you "
                                       "keep.")


def test_a_replayed_cell_still_reports_its_program(ex):
    """An identical --no-show re-run takes the magics' replay path; inside an exercise it must not,
    or the check would read no program."""
    ex.run_cell("readings = jnp.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0])")
    body = RING.partition("\n")[2]
    for _ in range(2):
        assert run(ex, body)[0]  # the second run is a replay
    assert run(ex, RING)[0]
    assert exercises.attempt("ring_total").collectives == ["collective-permute"] * 7


def test_the_line_is_read_like_every_magic_line(ex):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="not a Python name"):
        ex.run_cell_magic("exercise", "ring-total", "x = 1")
    with capture_output() as shown:
        ex.run_cell("%%exercise?")
    assert "names the exercise's check reads" in shown.stdout.replace("\n", " ")


def test_ran_names_the_magic_and_the_layout_it_needs(ex):
    from jax.sharding import PartitionSpec as P

    ex.run_cell("m = jnp.arange(128.0).reshape(8, 16) / 10\nv = jnp.linspace(-1.0, 1.0, 16)")
    check_cell = """
run = attempt("mv")
check(run["mv"], m @ v, method=[run.ran("shard_map", m=P(None, "i"), v=P("i")), run.sends_only("all-reduce")],
      hint="add the partial products")
"""
    ex.run_cell("from jax.sharding import PartitionSpec as P")
    assert run(ex, "%%exercise mv\n%%shard_map --mesh i=8 --in m=None,i v=i --no-show\nmv = lax.psum(m @ v, 'i')")[0]
    assert verdict(ex, check_cell) == "✓ right"
    assert run(ex, "%%exercise mv\nmv = m @ v")[0]  # plain Python
    assert verdict(ex, check_cell) == ("✗ not yet: run it as the `%%shard_map` cell it was, with `--in m=None,i "
                                       "v=i`. Hint: add the partial products.")
    assert run(ex, "%%exercise mv\n%%shard_map --mesh i=8 --in m=None,None v=None --no-show\nmv = m @ v")[0]
    assert verdict(ex, check_cell) == ("✗ not yet: keep `--in m=None,i` on the `%%shard_map` line: the exercise is "
                                       "about that layout. Hint: add the partial products.")
    assert exercises.attempt("mv").spec("m") == P(None, None)


def test_kept_runs_do_not_keep_the_answers_alive(ex):
    """Issue 33 item 15: each run is remembered (up to 64) for grading, but its answers and what its
    magic bound are not: `del` frees them, as after any other cell."""
    import gc
    import weakref

    import jax.numpy as jnp

    ex.push({"big": jnp.arange(64.0)})
    made = []
    for _ in range(3):
        assert run(ex, "%%exercise bigans\n%%shard --mesh data=8 --in big=data --no-show\nbigans = big * 2")[0]
        made.append(weakref.ref(ex.user_ns["bigans"]))
    ok, said = run(ex, "%%exercise pair\npair = {'a': big + 1, 'b': 3}")  # a dict: no weak reference to it
    made.append(weakref.ref(ex.user_ns["pair"]["a"]))
    assert verdict(ex, "check(attempt('bigans')['bigans'], jnp.arange(64.0) * 2, hint='h')") == "✓ right"
    assert verdict(ex, "check(attempt('pair')['pair'], {'a': jnp.arange(64.0) + 1, 'b': 3}, hint='h')") == "✓ right"
    ex.run_cell("del bigans, pair, big")
    gc.collect()
    assert [ref() is None for ref in made] == [True] * 4


def test_ran_reads_a_spec_tree_from_the_line(ex):
    """`--in m=@specs` (issue 33 item 11): the check compares the specs the run read, a right answer
    is right, and a tree that lays a leaf out otherwise is named."""
    from jax.sharding import PartitionSpec as P

    ex.run_cell("from jax.sharding import PartitionSpec as P\nm = {'a': jnp.arange(128.0).reshape(8, 16) / 10, "
                "'b': jnp.ones((8, 16))}\nv = jnp.linspace(-1.0, 1.0, 16)")
    check_cell = """
run = attempt("mv")
check(run["mv"], m['a'] @ v + m['b'] @ v, method=[run.ran("shard_map", m=P(None, "i"), v=P("i"))],
      hint="add the partial products")
"""
    ex.run_cell("specs = {'a': P(None, 'i'), 'b': P(None, 'i')}")
    cell = "%%exercise mv\n%%shard_map --mesh i=8 --in m=@specs v=i --no-show\nmv = lax.psum(m['a'] @ v + m['b'] @ v, 'i')"
    assert run(ex, cell)[0]
    assert verdict(ex, check_cell) == "✓ right"
    assert exercises.attempt("mv").spec("m") == {"a": P(None, "i"), "b": P(None, "i")}
    ex.run_cell("specs = P(None, 'i')")  # one spec for every leaf, through @
    assert run(ex, cell)[0]
    assert verdict(ex, check_cell) == "✓ right"
    ex.run_cell("specs = {'a': P(None, 'i'), 'b': P()}")
    ok, said = run(ex, cell.replace("m['b'] @ v, 'i')", "0, 'i') + lax.pmean(m['b'] @ lax.all_gather(v, 'i', tiled=True), 'i')"))
    assert ok, said
    assert verdict(ex, check_cell) == ("✗ not yet: keep `--in m=None,i` on the `%%shard_map` line: the exercise is "
                                       "about that layout. Hint: add the partial products.")


def test_a_pmap_function_answer_is_checked_by_the_program_its_call_ran(ex):
    """An answer that is a %%pmap function (issue 33 item 17): the check calls it, and sends_only
    reads that call's program (it said "write it as a magic cell", for a magic cell)."""
    ex.run_cell("readings = jnp.arange(8.0)")
    check_cell = """
run = attempt("total")
check(run["total"](readings), jnp.full(8, 28.0), method=[run.sends_only("all-reduce")], hint="sum over i")
"""
    assert run(ex, "%%exercise total\n%%pmap --no-show\ndef total(v):\n    return lax.psum(v, 'i')")[0]
    assert verdict(ex, check_cell) == "✓ right"
    assert exercises.attempt("total").collectives == ["all-reduce"]
    assert run(ex, "%%exercise total\n%%pmap --no-show\ndef total(v):\n    return v * 0 + 28.0")[0]
    assert verdict(ex, check_cell) == ("✗ not yet: the cell's compiled program sends nothing between devices; it "
                                       "should send an all-reduce. Hint: sum over i.")
    assert run(ex, "%%exercise total\n%%pmap --no-show\ndef total(v):\n    return lax.psum(v, 'i')")[0]
    ok, said = run(ex, "run = attempt('total')\nprint(run.sends_only('all-reduce'))")
    assert ok and "call `total` before the check reads its program" in said and "magic cell" not in said


# --- issue 30: cheats the contract itself must catch ---------------------------------------------

FOLLOWS_CHECK = """
ring = attempt("ring_total")
others = jnp.arange(8.0) ** 2 - 5
check(ring["ring_total"], jnp.full(8, 31.0),
      method=[ring.sends_only("collective-permute"), ring.follows(jnp.full(8, others.sum()), readings=others)],
      hint=["pass on what you received", "seven steps", "open Solution"])
"""


def test_an_answer_that_ignores_its_input_fails_when_the_cell_runs_again(ex):
    """A dummy collective times 0 plus the known answer sends the right collective and has the right
    value; run again on other readings it does not follow them. The rerun leaves no trace."""
    ex.run_cell("readings = jnp.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0])")
    assert run(ex, RING)[0]
    before = dict(ex.user_ns)
    assert verdict(ex, FOLLOWS_CHECK) == "✓ right"
    assert all(ex.user_ns[name] is value for name, value in before.items() if name not in ("ring", "others", "_"))
    assert ex.user_ns["readings"] is before["readings"] and ex.user_ns["ring_total"] is before["ring_total"]

    cheat = ("%%exercise ring_total\n%%pmap -a batch --no-show\n"
             "ring_total = lax.ppermute(readings, 'batch', perm=[(i, (i + 1) % 8) for i in range(8)]) * 0 + 31.0")
    assert run(ex, cheat)[0]
    said = verdict(ex, FOLLOWS_CHECK)
    assert said.startswith("✗ not yet: run again with other values in `readings`, the cell's `ring_total` is wrong"), said
    assert "31" not in said.split("Hint")[0].replace("31.0)", "")  # nothing of the expected value


def test_a_nested_run_cell_is_refused(ex):
    ex.run_cell("readings = jnp.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0])")
    nested = ("%%exercise ring_total\n"
              "get_ipython().run_cell(\"%%pmap -a batch --no-show\\n"
              "sent = lax.ppermute(readings, 'batch', perm=[(i, (i + 1) % 8) for i in range(8)])\")\n"
              "ring_total = jnp.full(8, 31.0)")
    assert run(ex, nested)[0]
    assert verdict(ex, RING_CHECK).startswith("✗ not yet: the exercise cell ran another cell (get_ipython().run_cell)")


def test_an_answer_changed_in_place_later_is_not_graded(ex):
    """Issue 30: only what the exercise cell made counts. A dict or NumPy answer changed in place in
    a later cell is refused (the run keeps a digest of it, not a copy: issue 33 item 15)."""
    check_dict = ('check(attempt("sizes")["sizes"], {"a": 1, "b": np.arange(3)}, hint="h")')
    changed = "✗ not yet: `sizes` was changed in place after the exercise cell ran"
    assert run(ex, "%%exercise sizes\nsizes = {'a': 2, 'b': np.arange(3)}")[0]
    ex.run_cell("sizes['a'] = 1")  # no assignment to the name: only the dict changed
    assert verdict(ex, check_dict).startswith(changed)
    assert run(ex, "%%exercise sizes\nsizes = {'a': 1, 'b': np.zeros(3, dtype=int)}")[0]
    ex.run_cell("sizes['b'][:] = np.arange(3)")  # a NumPy answer changed in place
    assert verdict(ex, check_dict).startswith(changed)
    assert run(ex, "%%exercise sizes\nsizes = {'a': 1, 'b': np.arange(3)}")[0]  # made by the cell: right
    assert verdict(ex, check_dict) == "✓ right"
