"""The capstone (examples/capstone.ipynb, issue 30 "A capstone"): a small transformer, 8 devices, a
memory limit per device and a limit on what the collectives carry. The student chooses a mesh and
a layout (`--plan`, `--compare`), runs the step with `%%shard`, and shows parity with one device.

Its rubric is in the notebook twice: a markdown table for the student, and the notebook's metadata
(`jaxpar_magic.rubric`) that `python -m jaxpar_magic.grade` reads. The tests: the two agree and
name the notebook's exercises; run top to bottom with the solutions, every auto-graded part is
right, and the solution's layout really fits and sends less than the limits, by the compiled
program; graded by the command, a solved copy gets every part right with its points and the
unsolved copy (the skeletons as shipped) gets every part "not yet" with 0 points, and the
teacher's part a row of its own.
"""
from __future__ import annotations

import csv
import os
import re
import subprocess
import sys

import nbformat
import pytest
from notebooks import EXAMPLES, ROOT, executed, exercises, with_solutions

from jaxpar_magic.face.checks import said

CAPSTONE = EXAMPLES / "capstone.ipynb"


def _rubric() -> list[dict]:
    return nbformat.read(CAPSTONE, as_version=4).metadata["jaxpar_magic"]["rubric"]


def test_the_rubric_table_and_the_metadata_agree_and_name_the_exercises():
    nb = nbformat.read(CAPSTONE, as_version=4)
    names = {" ".join(e.answers) for e in exercises(nb)}
    auto = {entry["exercise"] for entry in _rubric() if entry["graded"] == "auto"}
    assert auto == names, "every exercise is an auto-graded part of the rubric, and no other"
    text = "".join(c.source for c in nb.cells if c.cell_type == "markdown")
    table = dict(re.findall(r"^\| \*\*(\w+)\*\* \|.*\| (\d+) \|$", text, re.M))
    assert table == {entry["part"]: str(entry["points"]) for entry in _rubric()}
    for entry in _rubric():
        if entry["exercise"]:
            assert f"Exercise {entry['part']}" not in text and f"({entry['part']})" in text, entry  # its heading names it


@pytest.mark.slow
def test_solved_every_part_is_right_and_the_layout_fits_by_its_compiled_program():
    nb = executed(CAPSTONE)
    shipped = nbformat.read(CAPSTONE, as_version=4)
    for exercise in exercises(shipped):
        printed = "".join(said(o) for o in nb.cells[exercise.check_index].outputs).splitlines()
        assert printed == ["✓ right"], (exercise.answers, printed)
    # The --compare table: neither starting candidate fits 3 MiB (what the note under it says).
    compare = next(i for i, c in enumerate(nb.cells) if c.source.startswith("%%shard --plan --compare"))
    shown = "".join(o.get("data", {}).get("text/plain", "") for o in nb.cells[compare].outputs)
    rows = re.findall(r"^(dp|fsdp) .*(DOES NOT FIT)", shown, re.M)
    assert sorted(rows) == [("dp", "DOES NOT FIT"), ("fsdp", "DOES NOT FIT")], shown[:1500]


@pytest.mark.slow
def test_the_solution_fits_and_sends_less_than_the_limits_in_a_shell(jx):
    """The limits are not vacuous: the shipped layout (every parameter copied) is over the memory
    limit, the solution's under it, and the solution's step sends under the collective limit, by
    plan_cell and the compiled program (an oracle apart from the checks)."""
    import jax
    import numpy as np

    import jaxpar_magic

    nb = nbformat.read(CAPSTONE, as_version=4)
    setup = next(c.source for c in nb.cells if c.cell_type == "code" and "MEMORY_LIMIT =" in c.source)
    jx.run_cell(setup).raise_error()
    layout = exercises(nb)[0]
    jx.run_cell(layout.solution).raise_error()
    ns = jx.user_ns
    step = "new_params, loss = train_step(params, tokens)"

    def plan(specs):
        return jaxpar_magic.plan_cell(step, dict(ns), mesh=ns["auto_mesh"](ns["mesh_shape"]),
                                      in_specs={"params": specs, "tokens": jax.sharding.PartitionSpec("data")},
                                      bind=False)

    solved = plan(ns["param_specs"])
    copied = jaxpar_magic.plan_cell(step, dict(ns), mesh=ns["auto_mesh"]({"data": 8}),
                                    in_specs={"params": jax.tree.map(lambda w: jax.sharding.PartitionSpec(),
                                                                     ns["params"]),
                                              "tokens": jax.sharding.PartitionSpec("data")}, bind=False)
    assert solved.total_bytes <= ns["MEMORY_LIMIT"] < copied.total_bytes
    assert 0 < sum(c.bytes * (c.count or 1) for c in solved.collectives) <= ns["COLLECTIVE_LIMIT"]
    # And the sharded step's numbers are one device's (the parity the third part grades, by hand).
    mesh = ns["auto_mesh"](ns["mesh_shape"])
    placed = jax.tree.map(lambda w, s: jax.device_put(w, jax.sharding.NamedSharding(mesh, s)),
                          ns["params"], ns["param_specs"])
    tokens = jax.device_put(ns["tokens"], jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))
    _, sharded = jax.jit(ns["train_step"])(placed, tokens)
    _, one = jax.jit(ns["train_step"])(ns["params"], ns["tokens"])
    np.testing.assert_allclose(np.asarray(sharded), np.asarray(one), rtol=1e-5)


@pytest.mark.slow
@pytest.mark.chapter
def test_the_grading_command_grades_each_part_of_a_solved_and_an_unsolved_copy(tmp_path):
    shipped = nbformat.read(CAPSTONE, as_version=4)
    submissions = tmp_path / "submissions"
    submissions.mkdir()
    nbformat.write(with_solutions(shipped), submissions / "ada.ipynb")
    nbformat.write(shipped, submissions / "bob.ipynb")
    out = tmp_path / "grades.csv"
    done = subprocess.run([sys.executable, "-m", "jaxpar_magic.grade", str(submissions / "ada.ipynb"),
                           str(submissions / "bob.ipynb"), "--out", str(out), "--course", str(CAPSTONE),
                           "--cell-timeout", "300", "--jobs", "2"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=900,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(out.open(encoding="utf-8")))
    by = {(r["student"], r["part"]): r for r in rows}
    points = {entry["part"]: entry["points"] for entry in _rubric()}
    for entry in _rubric():
        if entry["graded"] != "auto":
            continue
        part = entry["part"]
        assert by["ada", part]["verdict"] == "right", by["ada", part]
        assert by["ada", part]["points"] == str(points[part])
        assert by["bob", part]["verdict"] == "not yet", by["bob", part]
        assert by["bob", part]["points"] == "0"
    for student in ("ada", "bob"):
        assert by[student, "justification"]["verdict"] == "for the teacher"
        assert (student, "") not in by and not [r for r in rows if r["exercise"] == "(notebook)"], rows
