"""What each exercise cell is tried with after a chapter's full run, and whose check must then say
"not yet" (tests/notebooks.py runs them; tests/test_exercise_contract.py reads what the checks said).

Every exercise gets the generic probes: its cell emptied entirely (the `%%exercise` line too: no
request reaches the kernel, only the check runs again), emptied below the `%%exercise` line, emptied but
for its cell magic's line, the skeleton the notebook ships, and the solution followed by a line that
fails. `CHEATS` adds each exercise's known ways to get the value without doing what it asks (issue
25's list first), and wrong answers a student is likely to write.
"""
from __future__ import annotations

# (notebook, first answer name) -> [(label, the exercise cell's whole source)]
CHEATS: dict[tuple[str, str], list[tuple[str, str]]] = {
    ("pmap_chapter.ipynb", "ring_total"): [
        ("the psum's result copied", "%%exercise ring_total\n%%pmap -a batch\nring_total = total"),
        ("psum itself", "%%exercise ring_total\n%%pmap -a batch\nring_total = lax.psum(readings, 'batch')"),
        ("plain Python", "%%exercise ring_total\nring_total = jnp.full(8, 31.0)"),
        ("a dummy ppermute times 0 plus the total (issue 30)",
         "%%exercise ring_total\n%%pmap -a batch\nring_total = lax.ppermute(readings, 'batch', perm=ring) * 0 + 31.0"),
        ("a nested run_cell, then the total copied (issue 30)",
         "%%exercise ring_total\nget_ipython().run_cell(\"%%pmap -a batch --no-show\\n"
         "sent = lax.ppermute(readings, 'batch', perm=ring)\")\nring_total = total"),
        ("a ring of whole 8-vectors: the right collective, 8 times the bytes (issue 30)",
         "%%exercise ring_total\n%%pmap -a batch\npassing = jnp.stack([readings] * 8)\nring_total = readings\n"
         "for _ in range(n_dev - 1):\n    passing = lax.ppermute(passing, 'batch', perm=ring)\n"
         "    ring_total = ring_total + passing[0]"),
        ("one step too many", "%%exercise ring_total\n%%pmap -a batch\npassing = readings\nring_total = readings\n"
                              "for _ in range(n_dev):\n    passing = lax.ppermute(passing, 'batch', perm=ring)\n"
                              "    ring_total = ring_total + passing"),
    ],
    ("sharding_chapter.ipynb", "row_totals"): [
        ("placed by hand, plain Python", "%%exercise row_totals\n"
                                         "m = jax.device_put(m, jax.sharding.NamedSharding(grid, P(('data', 'model'))))\n"
                                         "row_totals = jnp.sum(m, axis=1)"),
        ("already placed, no --in", "%%exercise row_totals\n%%shard --mesh grid --report --no-show\n"
                                    "row_totals = jnp.sum(m, axis=1)"),
        ("columns split both ways", "%%exercise row_totals\n%%shard --mesh grid --in m=None,(data,model) --no-show\n"
                                    "row_totals = jnp.sum(m, axis=1)"),
        ("split both dimensions", "%%exercise row_totals\n%%shard --mesh grid --in m=data,model --no-show\n"
                                  "row_totals = jnp.sum(m, axis=1)"),
        ("the expected totals added to a zero sum (issue 30)",
         "%%exercise row_totals\n%%shard --mesh grid --in m=(data,model),None --report --no-show\n"
         "row_totals = jnp.sum(m, 1) * 0 + expected_row_totals"),
        ("rows over data only", "%%exercise row_totals\n%%shard --mesh grid --in m=data,None --no-show\n"
                                "row_totals = jnp.sum(m, axis=1)"),
    ],
    ("sharding_chapter.ipynb", "chosen_line"): [
        ("fits, but the batch's rows are cut: it moves 2 MiB",
         '%%exercise chosen_line\nchosen_line = "%%shard --plan --mesh loose --in xb=(data,model),None wb=None,(data,model)"'),
        ("moves nothing, but does not fit",
         '%%exercise chosen_line\nchosen_line = "%%shard --plan --mesh loose --in xb=data,None wb=None,model"'),
        ("a bigger device claimed on the line",
         '%%exercise chosen_line\n'
         'chosen_line = "%%shard --plan --mesh loose --device-memory 1GiB --in xb=data,None wb=None,model"'),
        ("the weight whole again, by the explorer",
         '%%exercise chosen_line\n_explorer.choose("wb", "None,None")\nchosen_line = _explorer.line()'),
        ("a line that runs the cell instead of planning it",
         '%%exercise chosen_line\nchosen_line = "%%shard --mesh loose --in xb=None,None wb=None,(data,model)"'),
        ("the layout's numbers, not its line", "%%exercise chosen_line\nchosen_line = 5 * 2**20"),
    ],
    ("shard_map_chapter.ipynb", "mv"): [
        ("plain Python", "%%exercise mv\nmv = m @ v"),
        ("every block whole", "%%exercise mv\n%%shard_map --mesh i=8 --in m=None,None v=None --no-show\nmv = m @ v"),
        ("gather m and v", "%%exercise mv\n%%shard_map --mesh i=8 --in m=None,i v=i --no-show\n"
                           "mv = lax.all_gather(m, 'i', axis=1, tiled=True, to='invarying') "
                           "@ lax.all_gather(v, 'i', tiled=True, to='invarying')"),
        ("one all-reduce of the 8 x 2 products: twice the bytes (issue 30)",
         "%%exercise mv\n%%shard_map --mesh i=8 --in m=None,i v=i --no-show\nmv = lax.psum(m * v, 'i').sum(1)"),
        ("a mean, not a sum", "%%exercise mv\n%%shard_map --mesh i=8 --in m=None,i v=i --no-show\n"
                              "mv = lax.pmean(m @ v, 'i')"),
    ],
    ("training_chapter.ipynb", "grad_w"): [
        ("plain Python", "%%exercise grad_w\ngrad_w = xs.T @ dy"),
        ("psum, then a slice", "%%exercise grad_w\n"
                               "%%shard_map --mesh flat --in xs=data dy=data --out grad_w=data --report --no-show\n"
                               "grad_w = lax.dynamic_slice_in_dim(lax.psum(xs.T @ dy, 'data'), "
                               "lax.axis_index('data') * 2, 2)"),
        ("untiled psum_scatter", "%%exercise grad_w\n"
                                 "%%shard_map --mesh flat --in xs=data dy=data --out grad_w=data --report --no-show\n"
                                 "grad_w = lax.psum_scatter(xs.T @ dy, 'data')"),
        ("a reduce-scatter of the gradient twice over: twice the bytes (issue 30)",
         "%%exercise grad_w\n%%shard_map --mesh flat --in xs=data dy=data --out grad_w=data --report --no-show\n"
         "g = xs.T @ dy\ngrad_w = lax.psum_scatter(jnp.concatenate([g, g], 1), 'data', tiled=True)[:, :4]"),
        ("the mean, scattered", "%%exercise grad_w\n"
                                "%%shard_map --mesh flat --in xs=data dy=data --out grad_w=data --report --no-show\n"
                                "grad_w = lax.psum_scatter(xs.T @ dy, 'data', tiled=True) / 8"),
    ],
    ("planning_chapter.ipynb", "state_bytes"): [
        ("the weights only", "%%exercise state_bytes\nstate_bytes = {'data parallel': 4 * 805_306_368, "
                             "'FSDP': 4 * 805_306_368 // 256, 'tensor parallel': 4 * 805_306_368 // 8}"),
        ("tensor parallel over all devices", "%%exercise state_bytes\nstate_bytes = {'data parallel': 12 * 805_306_368, "
                                             "'FSDP': 12 * 805_306_368 // 256, 'tensor parallel': 12 * 805_306_368 // 256}"),
    ],
    ("planning_chapter.ipynb", "w1_gather_s"): [
        ("one axis's bandwidth", "%%exercise w1_gather_s\nw1_gather_s = 8192 * 32768 * 4 / 9e10"),
        ("elements, not bytes", "%%exercise w1_gather_s\nw1_gather_s = 8192 * 32768 / (2 * 9e10)"),
    ],
    ("cluster_chapter.ipynb", "mean_all"): [
        ("the right number, typed in", "%%exercise mean_all\n%%cluster\nmean_all = 6.5"),
        ("6.5 placed on the mesh (issue 30)", "%%exercise mean_all\n%%cluster\n"
                                              "mean_all = jax.device_put(jnp.float32(6.5), NamedSharding(mesh_i, P()))"),
        ("each process's own mean, in jnp", "%%exercise mean_all\n%%cluster\nmean_all = jnp.mean(jnp.asarray(local))"),
        ("the sum, not the mean", "%%exercise mean_all\n%%cluster\nmean_all = jax.jit(jnp.sum)(x)"),
    ],
    ("ecosystem_chapter.ipynb", "param_bytes"): [
        ("biases cut too", "%%exercise param_bytes\nparam_bytes = {'hidden.kernel': 512, 'hidden.bias': 128, "
                           "'out.kernel': 128, 'out.bias': 2}"),
        ("cut over all 8 devices", "%%exercise param_bytes\nparam_bytes = {'hidden.kernel': 128, 'hidden.bias': 256, "
                                   "'out.kernel': 32, 'out.bias': 4}"),
    ],
    ("collectives_chapter.ipynb", "predicted_sent"): [
        ("the ring of all 8 devices", "%%exercise predicted_sent predicted_buffer\npredicted_sent = 7 * 64\n"
                                      "predicted_buffer = 8 * 64"),
        ("the result buffer as sent", "%%exercise predicted_sent predicted_buffer\npredicted_sent = 4 * 64\n"
                                      "predicted_buffer = 4 * 64"),
    ],
}

# The memory and model-parallel chapters: answers that get the number without the reasoning, and
# the likely wrong ones.
CHEATS.update({
    ("memory_chapter.ipynb", "dp_gradient"): [
        ("the one-device gradient, closed over", "%%exercise dp_gradient\ndef dp_gradient(params, x, y):\n"
                                                 "    return whole\n"),
        ("the closed-over answer plus 0 × a psum (issue 30)",
         "%%exercise dp_gradient\ndef dp_gradient(params, x, y):\n"
         "    return jax.tree.map(lambda w, g: w + 0 * g, whole, lax.psum(jax.grad(loss_fn)(params, x, y), 'data'))\n"),
        ("psum instead of pmean", "%%exercise dp_gradient\ndef dp_gradient(params, x, y):\n"
                                  "    return lax.psum(jax.grad(loss_fn)(params, x, y), 'data')\n"),
    ],
    ("memory_chapter.ipynb", "stash_slots"): [
        ("every microbatch, both schedules", "%%exercise stash_slots\ndef stash_slots(stages, micro, kind):\n"
                                            "    return micro\n"),
        ("the chapter's simulator called (issue 30)", "%%exercise stash_slots\ndef stash_slots(stages, micro, kind):\n"
                                                     "    return most_in_flight(schedule(stages, micro, kind))[0]\n"),
        ("1F1B without the few-microbatches case", "%%exercise stash_slots\ndef stash_slots(stages, micro, kind):\n"
                                                   "    return micro if kind == 'GPipe' else stages\n"),
    ],
    ("model_parallel_chapter.ipynb", "crossover_tokens"): [
        ("the book's number", "%%exercise crossover_tokens\ncrossover_tokens = 2550\n"),
        ("a wrapped axis", "%%exercise crossover_tokens\ncrossover_tokens = 7 / 8 * 4.59e14 / (2 * 9e10)\n"),
    ],
    ("model_parallel_chapter.ipynb", "kv_owner"): [
        ("the other direction", "%%exercise kv_owner\ndef kv_owner(me, t, n):\n    return (me + t) % n\n"),
        ("no wrap-around", "%%exercise kv_owner\ndef kv_owner(me, t, n):\n    return me - t\n"),
    ],
})


# Issue 41's cheats: what a student's kernel did to make the check see "right". Each exercise cell
# below is refused (it changes what was there before it), or its answer is not the program's own,
# or the program it ran reads its inputs otherwise than the exercise gives them.
CHEATS[("pmap_chapter.ipynb", "ring_total")] += [
    ("--broadcast readings and a 0 × dummy permute: every device sums all readings (issue 41)",
     "%%exercise ring_total\n%%pmap -a batch --broadcast readings\n"
     "ring_total = readings.sum() + 0 * lax.ppermute(readings.sum(), 'batch', perm=ring)"),
    ("the check's total rebound (issue 41)", "%%exercise ring_total\ntotal = ring_total = jnp.zeros(8)"),
]
CHEATS[("shard_map_chapter.ipynb", "mv")] += [
    ("the product read whole from the globals, plus 0 × a psum (issue 41)",
     "%%exercise mv\n%%shard_map --mesh i=8 --in m=None,i v=i --no-show\n"
     "def whole():\n    return globals()['m'] @ globals()['v']\nmv = whole() + 0 * lax.psum(m @ v, 'i')"),
    ("a decoy %%shard_map beside a NumPy answer (issue 41)",
     "%%exercise mv\nget_ipython().run_cell_magic('shard_map', '--mesh i=8 --in m=None,i v=i --no-show', "
     "\"mv = lax.psum(m @ v, 'i')\")\nimport numpy as np\nmv = np.asarray(m) @ np.asarray(v)"),
    ("a hook that prints ✓ right (issue 41)",
     "%%exercise mv\nget_ipython().events.register('post_run_cell', lambda result: print('✓ right'))\nmv = m @ v"),
]
CHEATS[("training_chapter.ipynb", "grad_w")] += [
    ("sliced from a one-device gradient, plus 0 × a psum_scatter (issue 41)",
     "%%exercise grad_w\n%%shard_map --mesh flat --in xs=data dy=data --out grad_w=data --report --no-show\n"
     "full = globals()['xs'].T @ globals()['dy']\n"
     "grad_w = lax.psum_scatter(0 * (xs.T @ dy), 'data', tiled=True) + "
     "lax.dynamic_slice_in_dim(full, lax.axis_index('data') * 2, 2)"),
]
CHEATS[("memory_chapter.ipynb", "stash_slots")] += [
    ("the simulator through default arguments (issue 41)",
     "%%exercise stash_slots\ndef stash_slots(stages, micro, kind, table=most_in_flight, plan=schedule):\n"
     "    return table(plan(stages, micro, kind))[0]\n"),
]
CHEATS[("model_parallel_chapter.ipynb", "kv_owner")] += [
    ("the check's attention rebound (issue 41)",
     "%%exercise kv_owner\ndef kv_owner(me, t, n):\n    return me\nattention = lambda *args, **kwargs: 0\n"),
]
CHEATS[("sharding_chapter.ipynb", "chosen_line")] += [
    ("a fake plan left in _plan, and a line that plans nothing (issue 41)",
     "%%exercise chosen_line\nclass Fake:\n    total_bytes, collectives = 0, []\n_plan = Fake()\n"
     "chosen_line = '%%shard --plan --as-code --mesh loose --in xb=None,None wb=None,None'"),
]
CHEATS.setdefault(("capstone.ipynb", "mesh_shape"), []).extend([
    ("the memory limit raised in the exercise cell (issue 41)",
     "%%exercise mesh_shape param_specs\nMEMORY_LIMIT = 64 * 2**20\nmesh_shape = {'data': 8}\n"
     "param_specs = jax.tree.map(lambda w: P(), params)"),
])
CHEATS.setdefault(("capstone.ipynb", "new_params"), []).extend([
    ("train_step redefined to train nothing (issue 41)",
     "%%exercise new_params step_loss\ndef train_step(params, tokens):\n    return params, jnp.float32(0)\n"
     "new_params, step_loss = train_step(params, tokens)"),
])


def probes_for(notebook: str, exercise) -> list[tuple[str, str]]:
    first, _, body = exercise.solution.partition("\n")
    # First, right after the full run's check graded the solution: the whole cell emptied. nbclient,
    # like JupyterLab, sends no request for an empty cell, so only the check runs again.
    probes = [("emptied entirely", ""), ("emptied", first + "\n")]
    magic_line = body.splitlines()[0] if body else ""
    if magic_line.startswith("%%"):
        probes.append(("emptied below its magic line", f"{first}\n{magic_line}\n"))
    probes.append(("the shipped skeleton", exercise.skeleton))
    probes.append(("the solution, then an error", exercise.solution.rstrip() + "\nraise RuntimeError('probe: stop')"))
    probes += CHEATS.get((notebook, exercise.answers[0]), [])
    return probes
