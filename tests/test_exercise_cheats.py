"""Issue 30's cheats and correct alternatives, each played against its exercise's real check cell.

The cheats got `✓ right` before: a dummy collective times 0 plus the known answer, the right
collective carrying more bytes than the exercise's method needs, an answer
closed over or copied from an earlier cell, the chapter's simulator called from a "formula", a
nested `run_cell`, an answer changed in place after its exercise cell ran. Each must now get
`✗ not yet`, and each correct way of writing the answer (the solution and a different one) `✓ right`.

A real InteractiveShell runs the chapter's own code cells up to the exercise (its checks and
markdown skipped), then each exercise cell and the notebook's check cell, as a student would.
The check reruns the exercise cell on other inputs (Attempt.follows), which is what catches the
copied answers.
"""
from __future__ import annotations

import nbformat
import pytest
from IPython.utils.capture import capture_output
from notebooks import EXAMPLES, exercises

from jaxpar_magic.face import checks
from jaxpar_magic.face import exercises as exercise_module

# (chapter, answer) -> (cheats, correct alternatives): each an exercise cell's source without its
# `%%exercise` line. A cheat may need a cell run before it (the copy it adds): "before\n---\ncell".
PLAYS = {
    ("pmap_chapter.ipynb", "ring_total"): (
        ["%%pmap -a batch --no-show\nring_total = lax.ppermute(readings, 'batch', perm=ring) * 0 + 31.0",
         "get_ipython().run_cell(\"%%pmap -a batch --no-show\\nsent = lax.ppermute(readings, 'batch', perm=ring)\")\n"
         "ring_total = total",
         "%%pmap -a batch --no-show\npassing = jnp.stack([readings] * 8)\nring_total = readings\n"  # 8 times the bytes
         "for _ in range(n_dev - 1):\n    passing = lax.ppermute(passing, 'batch', perm=ring)\n"
         "    ring_total = ring_total + passing[0]"],
        ["%%pmap -a batch --no-show\nring_total = sum(lax.ppermute(readings, 'batch', perm=[(i, (i + k) % n_dev) "
         "for i in range(n_dev)]) for k in range(1, n_dev)) + readings"],
    ),
    ("shard_map_chapter.ipynb", "mv"): (
        ["answer_copy = m @ v\n---\n%%shard_map --mesh i=8 --in m=None,i v=i --no-show\n"
         "mv = lax.psum(m @ v * 0, 'i') + answer_copy",
         "%%shard_map --mesh i=8 --in m=None,i v=i --no-show\nmv = lax.psum(m * v, 'i').sum(1)"],  # twice the bytes
        ["%%shard_map --mesh i=8 --in m=None,i v=i --no-show\nmv = lax.psum(jnp.einsum('ij,j->i', m, v), 'i')"],
    ),
    ("training_chapter.ipynb", "grad_w"): (
        ["rows = xs.T @ dy\n---\n%%shard_map --mesh flat --in xs=data dy=data --out grad_w=data --report --no-show\n"
         "grad_w = lax.psum_scatter(0 * (xs.T @ dy), 'data', tiled=True) + "
         "lax.dynamic_slice_in_dim(rows, lax.axis_index('data') * 2, 2)",
         "%%shard_map --mesh flat --in xs=data dy=data --out grad_w=data --report --no-show\n"  # twice the bytes
         "g = xs.T @ dy\ngrad_w = lax.psum_scatter(jnp.concatenate([g, g], 1), 'data', tiled=True)[:, :4]"],
        ["%%shard_map --mesh flat --in xs=data dy=data --out grad_w=data --report --no-show\n"
         "grad_w = lax.psum_scatter(jnp.einsum('bi,bj->ij', xs, dy), 'data', scatter_dimension=0, tiled=True)"],
    ),
    ("sharding_chapter.ipynb", "row_totals"): (
        ["%%shard --mesh grid --in m=(data,model),None --report --no-show\n"
         "row_totals = jnp.sum(m, 1) * 0 + expected_row_totals"],
        ["%%shard --mesh grid --in m=(data,model) --no-show\nrow_totals = m.sum(axis=-1)"],
    ),
    ("memory_chapter.ipynb", "dp_gradient"): (
        ["def dp_gradient(params, x, y):\n"
         "    return jax.tree.map(lambda w, g: w + 0 * g, whole, lax.psum(jax.grad(loss_fn)(params, x, y), 'data'))"],
        ["def dp_gradient(params, x, y):\n"
         "    return jax.tree.map(lambda g: g / lax.axis_size('data'), jax.grad(loss_fn)(params, x, y))"],
    ),
    ("memory_chapter.ipynb", "stash_slots"): (
        ["def stash_slots(stages, micro, kind):\n    return most_in_flight(schedule(stages, micro, kind))[0]"],
        ["def stash_slots(stages, micro, kind):\n    return micro if kind == 'GPipe' or micro < stages else stages"],
    ),
    ("cluster_chapter.ipynb", "mean_all"): (
        ["%%cluster\nmean_all = jax.device_put(jnp.float32(6.5), NamedSharding(mesh_i, P()))",
         "%%cluster\nmean_all = 6.5"],
        ["%%cluster\nfrom jax.experimental import multihost_utils\n"
         "mean_all = multihost_utils.process_allgather(local).mean()"],
    ),
}


def _chapter_cells(nb, upto: int) -> list[str]:
    """The chapter's code cells before cell `upto`, without checks and with exercises as shipped."""
    return [c.source for c in nb.cells[:upto]
            if c.cell_type == "code" and "check" not in c.metadata.get("tags", [])]


def _run(shell, source: str) -> str:
    with capture_output() as shown:
        shell.run_cell(source)
    return shown.stdout


def _verdict(shell, check_source: str) -> str:
    lines = [line for line in _run(shell, check_source).splitlines() if line.startswith(("✓", "✗"))]
    assert len(lines) == 1, lines
    return lines[0]


CHAPTERS = [pytest.param(chapter, marks=[pytest.mark.cluster] if chapter == "cluster_chapter.ipynb" else [])
            for chapter in sorted({chapter for chapter, _ in PLAYS})]


@pytest.mark.slow
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_cheat_is_not_yet_and_every_right_answer_right(jx, chapter):
    exercise_module.forget_all()
    checks._failures.clear()
    nb = nbformat.read(EXAMPLES / chapter, as_version=4)
    try:
        _play(jx, nb, chapter)
    finally:
        if chapter == "cluster_chapter.ipynb":  # its engines are processes of their own
            _run(jx, "%cluster stop")


def _play(jx, nb, chapter) -> None:
    found = {e.answers[0]: e for e in exercises(nb)}
    done = 0
    for (name, answer), (cheats, right) in PLAYS.items():
        if name != chapter:
            continue
        exercise = found[answer]
        for source in _chapter_cells(nb, exercise.index)[done:]:
            _run(jx, source)
        done = len(_chapter_cells(nb, exercise.index))
        first = exercise.solution.partition("\n")[0]
        check_source = nb.cells[exercise.check_index].source
        for play in [exercise.solution.partition("\n")[2], *right]:
            _run(jx, f"{first}\n{play}")
            assert _verdict(jx, check_source) == "✓ right", (chapter, play)
        for cheat in cheats:
            before, _, cell = cheat.rpartition("\n---\n")
            if before:
                _run(jx, before)
            _run(jx, f"{first}\n{cell}")
            said = _verdict(jx, check_source)
            assert said.startswith("✗ not yet: "), (chapter, cheat, said)
        _run(jx, exercise.solution)  # later exercises of the chapter start from a solved one
