"""`python -m jaxpar_magic.grade` (issue 30, "Grades a teacher collects"; issue 41, "Grades a teacher
can sign"): a class of honest, half-done, crashing and cheating submissions, graded through the real
command against a course, row by row.

The course is one chapter made of the real chapters' cells for three exercises: the pmap ring
(`ring_total`), the column-parallel product (`mv`) and FSDP's gradient (`grad_w`), each with its
setup, its check and its solution, so that a kernel runs it in seconds. Each cheating student plays
one cheat per exercise (issue 41's, and new ones), so six kernels grade them all:

* ada: every exercise solved (`mv` written another way), a scratch cell between an exercise and its
  check, and the record her own session saved;
* bob: the ring solved, the rest as shipped;
* cy: the ring raises, `mv` writes a solved copy over bob's and fay's submissions and starts
  processes that leave the kernel's session (one with its environment cleared) to rewrite the
  grades later, and `grad_w` hangs;
* dan: a setup cell that rebinds `check` to print "✓ right", the ring's exercise line given an extra
  name (`ring_total x`) with its own "check", a hook that prints "✓ right" after every cell, and a
  decoy `%%shard_map` beside a NumPy `grad_w`;
* eli: cheats under the byte cap: `--broadcast readings` with a `0 *` dummy permute, `mv` from the
  whole `m` and `v` read out of the globals plus `0 *` a psum, `grad_w` sliced from a one-device
  gradient plus `0 *` a psum_scatter;
* fay: an exercise cell that rebinds the check's `total`, `mv` retyped in a cell without its tag,
  `grad_w` renamed `grad_w_v2` with a check that prints "✓ right";
* zed: not a notebook.
"""
from __future__ import annotations

import csv
import os
import subprocess
import sys

import nbformat
import pytest
from notebooks import EXAMPLES, ROOT, exercises

from jaxpar_magic.face.checks import RECORD_KEY, said

ANSWERS = ("ring_total", "mv", "grad_w")


def _course() -> tuple[nbformat.NotebookNode, dict]:
    """The three exercises' chapter: setup, each exercise's own cells, its exercise, check and solution;
    and each exercise (tests/notebooks.Exercise) by its answer, indexed in this chapter."""
    pmap = nbformat.read(EXAMPLES / "pmap_chapter.ipynb", as_version=4)
    shard_map = nbformat.read(EXAMPLES / "shard_map_chapter.ipynb", as_version=4)
    training = nbformat.read(EXAMPLES / "training_chapter.ipynb", as_version=4)
    ring, mv, grad_w = (next(e for e in exercises(nb) if e.answers == (answer,))
                        for nb, answer in ((pmap, "ring_total"), (shard_map, "mv"), (training, "grad_w")))

    def code(nb, upto, *words):
        return [c for c in nb.cells[:upto] if c.cell_type == "code" and any(w in c.source for w in words)]

    cells = (code(pmap, ring.index, "%load_ext", "import jax", "readings =", "total = lax.psum", "ring = [")
             + pmap.cells[ring.index:ring.check_index + 2]
             + code(shard_map, mv.index, "m = jnp.arange") + shard_map.cells[mv.index:mv.check_index + 2]
             + code(training, grad_w.index, "--name flat", "xs = jax.random")
             + training.cells[grad_w.index:grad_w.check_index + 2])
    nb = nbformat.v4.new_notebook(cells=[nbformat.from_dict(c) for c in cells], metadata=pmap.metadata)
    return nb, {e.answers[0]: e for e in exercises(nb)}


def _class(folder, course, found) -> None:
    """Each student's submission, in a folder of their own (`zed` sends something else)."""
    body = {answer: e.solution.partition("\n")[2] for answer, e in found.items()}
    grad_w_line = body["grad_w"].partition("\n")[0]
    pid_files = folder / "pids"

    def source(answer, text, first=None):
        return f"{first or '%%exercise ' + answer}\n{text}"

    def save(student, change):
        copy = nbformat.from_dict(course)
        change(copy)
        (folder / student).mkdir()
        nbformat.write(copy, folder / student / "three_exercises.ipynb")

    def put(copy, answer, text, first=None):
        copy.cells[found[answer].index].source = source(answer, text, first)

    def ada(copy):
        put(copy, "ring_total", body["ring_total"])
        put(copy, "mv", "%%shard_map --mesh i=8 --in m=None,i v=i --no-show\nmv = lax.psum(jnp.einsum('ij,j->i', m, v), 'i')")
        put(copy, "grad_w", body["grad_w"])
        copy.cells[found["ring_total"].check_index].outputs = [nbformat.v4.new_output(  # her own session's record
            "display_data", data={"text/plain": "✓ right"}, metadata={RECORD_KEY: {
                "answers": ["ring_total"], "verdict": "right", "attempts": 3, "hints_used": 2}})]
        copy.cells.insert(found["grad_w"].index + 1, nbformat.v4.new_code_cell("print(grad_w.shape)  # scratch"))

    def bob(copy):
        put(copy, "ring_total", body["ring_total"])

    solved = nbformat.from_dict(course)
    for answer in ANSWERS:
        solved.cells[found[answer].index].source = found[answer].solution
    paths = [str(folder / other / "three_exercises.ipynb") for other in ("bob", "fay")]  # fay's is graded after
    escape = (f"import pathlib\nfor path in {paths!r}:\n    pathlib.Path(path).write_text({nbformat.writes(solved)!r})\n"
              "import subprocess, sys, time\n"
              "WRITE = 'import os, pathlib, sys, time; pathlib.Path(sys.argv[1]).write_text(str(os.getpid())); "
              "time.sleep(60); pathlib.Path(sys.argv[2]).write_text(\"pwned\")'\n"
              f"for name, env in (('marked', None), ('unmarked', {{'PATH': '/usr/bin:/bin'}})):\n"
              f"    subprocess.Popen([sys.executable, '-c', WRITE, {str(pid_files)!r} + '-' + name, "
              f"{str(folder / 'grades.csv')!r}], start_new_session=True, env=env)\n"
              f"deadline = time.monotonic() + 60\n"
              f"import pathlib\n"
              f"while not all(pathlib.Path({str(pid_files)!r} + '-' + n).exists() for n in ('marked', 'unmarked')) "
              f"and time.monotonic() < deadline:\n    time.sleep(0.05)\n"
              "mv = m @ v")

    def cy(copy):
        put(copy, "ring_total", body["ring_total"] + "\nraise RuntimeError('cy: stop')")
        put(copy, "mv", escape)
        put(copy, "grad_w", "import threading\nthreading.Event().wait()")

    def dan(copy):
        setup = next(i for i, c in enumerate(copy.cells) if "from jaxpar_magic import attempt, check" in c.source)
        copy.cells[setup].source += "\ncheck = lambda *a, **k: print('✓ right')"
        put(copy, "ring_total", "ring_total = total", first="%%exercise ring_total x")
        copy.cells[found["ring_total"].check_index].source = "print('✓ right')"
        put(copy, "mv", "get_ipython().events.register('post_run_cell', lambda result: print('✓ right'))\n"
                        "mv = m @ v")
        put(copy, "grad_w", f"get_ipython().run_cell_magic('shard_map', {grad_w_line[len('%%shard_map '):]!r}, "
                            "\"grad_w = lax.psum_scatter(xs.T @ dy, 'data', tiled=True)\")\n"
                            "import numpy as np\ngrad_w = np.asarray(xs).T @ np.asarray(dy)")

    def eli(copy):
        put(copy, "ring_total", "%%pmap -a batch --broadcast readings\n"
                                "ring_total = readings.sum() + 0 * lax.ppermute(readings.sum(), 'batch', perm=ring)")
        put(copy, "mv", "%%shard_map --mesh i=8 --in m=None,i v=i --no-show\n"
                        "def whole():\n    return globals()['m'] @ globals()['v']\n"
                        "mv = whole() + 0 * lax.psum(m @ v, 'i')")
        put(copy, "grad_w", f"{grad_w_line}\nfull = globals()['xs'].T @ globals()['dy']\n"
                            "grad_w = lax.psum_scatter(0 * (xs.T @ dy), 'data', tiled=True) + "
                            "lax.dynamic_slice_in_dim(full, lax.axis_index('data') * 2, 2)")

    def fay(copy):
        put(copy, "ring_total", body["ring_total"].replace("ring_total = readings ", "total = ring_total = readings "))
        exercise = copy.cells[found["mv"].index]
        exercise.metadata["tags"] = []  # retyped in a new cell without its tag
        put(copy, "mv", body["mv"])
        put(copy, "grad_w", body["grad_w"], first="%%exercise grad_w_v2")
        copy.cells[found["grad_w"].check_index].source = "print('✓ right')"

    for student, change in (("ada", ada), ("bob", bob), ("cy", cy), ("dan", dan), ("eli", eli), ("fay", fay)):
        save(student, change)
    (folder / "zed").mkdir()
    (folder / "zed" / "three_exercises.ipynb").write_text("{not json", encoding="utf-8")


@pytest.mark.slow
def test_a_class_is_graded_row_by_row_and_no_cheat_is_right(tmp_path):
    import psutil

    course, found = _course()
    (tmp_path / "course").mkdir()
    nbformat.write(course, tmp_path / "course" / "three_exercises.ipynb")
    submissions = tmp_path / "submissions"
    submissions.mkdir()
    _class(submissions, course, found)
    out = submissions / "grades.csv"
    done = subprocess.run([sys.executable, "-m", "jaxpar_magic.grade", str(submissions), "--out", str(out),
                           "--course", str(tmp_path / "course"), "--cell-timeout", "25", "--jobs", "2"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=900,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(out.open(encoding="utf-8")))
    by = {(r["student"], r["exercise"]): r for r in rows}

    def verdicts(student):
        return tuple(by[student, answer]["verdict"] for answer in ANSWERS)

    def note(student, answer):
        return by[student, answer]["note"]

    assert verdicts("ada") == ("right", "right", "right") and ("ada", "(notebook)") not in by
    assert (by["ada", "ring_total"]["attempts"], by["ada", "ring_total"]["hints_used"],
            by["ada", "ring_total"]["saved_checks"]) == ("3", "2", "1")
    assert by["ada", "ring_total"]["notebook"] == "ada/three_exercises.ipynb"
    assert verdicts("bob") == ("right", "not yet", "not yet") and ("bob", "(notebook)") not in by
    assert by["bob", "mv"]["attempts"] == "" and by["bob", "mv"]["saved_checks"] == "0"

    assert verdicts("cy") == ("not yet", "not yet", "not graded")
    assert note("cy", "ring_total").startswith("✗ not yet: the exercise cell stopped with an error")
    assert "ran past" in by["cy", "(notebook)"]["note"]
    pids = [int((submissions / f"pids-{name}").read_text()) for name in ("marked", "unmarked")]
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert out.read_text(encoding="utf-8").startswith("student,")  # and nothing is left to write to it

    assert verdicts("dan") == ("missing", "not yet", "not yet")
    assert "`%%exercise ring_total x` instead" in note("dan", "ring_total")
    assert "changes IPython's event callbacks" in note("dan", "mv")
    assert note("dan", "grad_w").startswith("✗ not yet: `grad_w` was not computed by the `%%shard_map` cell")

    assert verdicts("eli") == ("not yet", "not yet", "not yet")
    assert "given whole to every device (`--broadcast readings`)" in note("eli", "ring_total")
    assert "run again with other values in `m`, `v`, the cell's `mv` is wrong" in note("eli", "mv")
    assert "run again with other values in `xs`, `dy`, the cell's `grad_w` is wrong" in note("eli", "grad_w")

    assert verdicts("fay") == ("not yet", "missing", "missing")  # as she sent it, though cy rewrote her file
    assert nbformat.read(submissions / "fay" / "three_exercises.ipynb", as_version=4).cells[
        found["grad_w"].index].source == found["grad_w"].solution
    assert "rebinds `total`, defined before it, to another value" in note("fay", "ring_total")
    assert "starts with `%%exercise mv` but is not tagged `exercise`" in note("fay", "mv")
    assert "found `%%exercise grad_w_v2` instead" in note("fay", "grad_w")

    assert by["zed", "(notebook)"]["verdict"] == "unreadable"

    cheats = [r for r in rows if r["student"] in ("cy", "dan", "eli", "fay")]
    assert not [r for r in cheats if r["verdict"] == "right"], cheats
    assert [r["student"] for r in rows] == sorted(r["student"] for r in rows)  # in order, each student's together
    assert {r["student"] for r in rows} == {"ada", "bob", "cy", "dan", "eli", "fay", "zed"}


def test_students_are_who_the_files_say(tmp_path):
    from jaxpar_magic.grade import students, submissions

    for path in ("alice/training_chapter.ipynb", "bob/training_chapter.ipynb", "bob/pmap_chapter.ipynb",
                 "alice/.ipynb_checkpoints/training_chapter-checkpoint.ipynb"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("{}")
    found = submissions([tmp_path])
    assert [p.relative_to(tmp_path).as_posix() for p in found] == [
        "alice/training_chapter.ipynb", "bob/pmap_chapter.ipynb", "bob/training_chapter.ipynb"]
    assert {name for name, _ in students(found).values()} == {"alice", "bob"}
    assert students(found)[found[0]] == ("alice", "alice/training_chapter.ipynb")
    assert {name for name, _ in students(found, "file").values()} == {"training_chapter", "pmap_chapter"}
    flat = [tmp_path / "alice" / "training_chapter.ipynb", tmp_path / "alice" / "x.ipynb"]
    assert [name for name, _ in students(flat).values()] == ["training_chapter", "x"]  # one folder: the files
    assert [name for name, _ in students(flat, "folder").values()] == ["training_chapter", "x"]


def test_the_frame_is_the_course_with_the_students_exercise_cells():
    """Every cell but the exercises' is the course's; a lost tag, a changed name and an extra name are
    "missing", each naming what was found instead; a scratch cell between an exercise and its check
    is dropped with the rest of the student's own cells."""
    from jaxpar_magic.grade.course import exercises_of, framed

    course, found = _course()
    submitted = nbformat.from_dict(course)
    submitted.cells[0].source += "\ncheck = print"
    submitted.cells[found["ring_total"].index].source = found["ring_total"].solution
    submitted.cells[found["grad_w"].index].source = "%%exercise grad_w x\n" + found["grad_w"].solution.partition("\n")[2]
    submitted.cells.insert(found["mv"].index + 1, nbformat.v4.new_code_cell("scratch = 1"))
    frame, frame_exercises, missing = framed(course, submitted)
    assert [c.source for i, c in enumerate(frame.cells) if i != found["ring_total"].index] == [
        c.source for i, c in enumerate(course.cells) if i != found["ring_total"].index]
    assert frame.cells[found["ring_total"].index].source == found["ring_total"].solution
    assert set(missing) == {("grad_w",)} and "found `%%exercise grad_w x` instead" in missing["grad_w",]
    assert [e.check for e in exercises_of(submitted)][1] == found["mv"].check_index + 1  # past the scratch cell


def test_the_release_has_no_solutions_and_no_outputs(tmp_path):
    """The students' copy of the course (nbgrader's release step): no collapsed solution, no output, no
    line of any solution that the exercise cell does not ship, and the index's and the model-parallel
    chapter's printed answers gone at the source."""
    out = tmp_path / "release"
    done = subprocess.run([sys.executable, "-m", "jaxpar_magic.grade", "--release", str(EXAMPLES), str(out)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert done.returncode == 0, done.stderr
    for chapter in sorted(EXAMPLES.glob("*.ipynb")):
        shipped = nbformat.read(chapter, as_version=4)
        released = nbformat.read(out / chapter.name, as_version=4)
        text = "\n".join(c.source for c in released.cells)
        assert "<summary>Solution" not in text, chapter.name
        assert not [c for c in released.cells if c.cell_type == "code" and (c.outputs or c.execution_count)]
        outside = "\n".join(c.source for c in shipped.cells if "<summary>Solution" not in c.source)
        for exercise in exercises(shipped):  # a solution's lines the chapter says nowhere else
            own = [line for line in exercise.solution.splitlines()[1:] if len(line.strip()) > 12 and line not in outside]
            assert own and not [line for line in own if line in text], (chapter.name, exercise.answers)
        assert len([c for c in released.cells if "exercise" in c.metadata.get("tags", [])]) == len(exercises(shipped))
    index = (out / "index.ipynb").read_text(encoding="utf-8")
    assert "1,490" not in index and "32 B result buffer" not in index
    model_parallel = nbformat.read(out / "model_parallel_chapter.ipynb", as_version=4)
    assert not [c for c in model_parallel.cells if "three times the 2x2x2" in c.source]


@pytest.mark.slow
def test_a_check_in_a_kernel_saves_the_sessions_record(tmp_path):
    """What the grades' attempts and hints come from: each check run in a kernel saves a record with
    the notebook (in the metadata of the check's line), counting the exercise's runs and the hints
    shown; and the grader's own channel, the checks' ledger, gives each check cell's one verdict. The
    line shows as printed text, and nbconvert exports it without a warning (a record of a MIME type of
    its own made nbconvert warn that it "is not able to be represented")."""
    import warnings

    from nbconvert import HTMLExporter

    from jaxpar_magic.grade.kernel import execute

    nb, found = _course()
    ring = found["ring_total"]
    nb.cells = nb.cells[:ring.check_index + 1]
    wrong, check = nb.cells[ring.index], nb.cells[ring.check_index]
    solved = nbformat.from_dict(wrong)
    solved.source = ring.solution
    nb.cells += [solved, nbformat.from_dict(check)]  # unsolved, checked; solved, checked
    checks = {ring.check_index, ring.check_index + 2}
    problems, verdicts = execute(nb, None, cell_timeout=120, timeout=600, checks=checks)
    assert problems == []
    assert [[v["verdict"] for v in verdicts[i]] for i in sorted(checks)] == [["not yet"], ["right"]]
    records = [[o.metadata[RECORD_KEY] for o in nb.cells[i].outputs if o.output_type == "display_data"
                and RECORD_KEY in o.metadata] for i in sorted(checks)]
    lines = ["".join(said(o) for o in nb.cells[i].outputs) for i in sorted(checks)]
    assert lines[0].startswith("✗ not yet: ") and lines[1] == "✓ right\n", lines
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        page, _ = HTMLExporter().from_notebook_node(nb)
    unrepresented = [str(w.message) for w in caught if "not able to be represented" in str(w.message)]
    # (the views' widget outputs warn too here: this run saved no widget state; test_export exports them)
    assert not [m for m in unrepresented if "widget-view" not in m], unrepresented
    assert "✓ right" in page
    assert records == [[{"answers": ["ring_total"], "verdict": "not yet", "attempts": 1, "hints_used": 1}],
                       [{"answers": ["ring_total"], "verdict": "right", "attempts": 2, "hints_used": 1}]]


@pytest.mark.parametrize("jobs", ["0", "-1", "two", "1.5"])
def test_jobs_must_be_a_whole_number_of_at_least_one(jobs, tmp_path, capsys):
    from jaxpar_magic.grade import main

    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path / "ada.ipynb"), "--out", str(tmp_path / "grades.csv"), "--jobs", jobs])
    assert stopped.value.code == 2
    assert f"--jobs wants a whole number of at least 1, not {jobs!r}" in capsys.readouterr().err
    assert not (tmp_path / "grades.csv").exists()
