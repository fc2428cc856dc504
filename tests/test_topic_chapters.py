"""The memory and model-parallel chapters teach what their prose says: every figure the prose quotes
or relies on is checked on the executed notebook (run once per session by tests/notebooks.py, with
the exercises solved). Their exercises' contract is tests/test_exercise_contract.py's."""
from __future__ import annotations

import re

import pytest
from notebooks import EXAMPLES, executed

from jaxpar_magic.face.checks import said

MEMORY = EXAMPLES / "memory_chapter.ipynb"
MODEL_PARALLEL = EXAMPLES / "model_parallel_chapter.ipynb"


def code_cells(path):
    return [c for c in executed(path).cells if c.cell_type == "code"]


def cell_with(cells, text):
    found = [c for c in cells if text in c.source]
    assert found, f"no cell contains {text!r}"
    return found[0]


def plain(cell) -> str:
    return "\n".join(o["data"].get("text/plain", "") for o in cell.outputs if "data" in o)


def stdout(cell) -> str:
    return "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")


def lists_collective(text: str, op: str, shape: str, size: str) -> bool:
    """Whether a view's text lists the collective `op (reduction) · shape · result buffer size`."""
    pattern = rf"{re.escape(op)}( \(\w+\))? · {re.escape(shape)} · result buffer {re.escape(size)}\b"
    return re.search(pattern, text) is not None


def numbers(pattern: str, text: str) -> list[float]:
    return [float(v.replace(",", "")) for v in re.findall(pattern, text)]


@pytest.mark.slow
def test_memory_chapter_shows_what_it_says():
    cells = code_cells(MEMORY)
    assert cells[0].source.splitlines()[:2] == ["%load_ext jaxpar_magic", "%devices --simulate 8"]

    # Activations: about 50 MiB without remat, 12x the 4 MiB of parameters; 2 MiB with block remat.
    assert "1,048,576 parameters, 4.00 MiB" in stdout(cell_with(cells, "n_params = sum("))
    kept = dict(zip(["no remat", "matmuls", "inputs"],
                    numbers(r"activations kept: ([\d.]+) MiB", stdout(cell_with(cells, "layers = {")))))
    assert 45 < kept["no remat"] < 55 and kept["inputs"] < 3 and kept["inputs"] < kept["matmuls"] < kept["no remat"]
    plans = stdout(cell_with(cells, "remat_plans = {}"))
    temps = numbers(r"temporaries\s+([\d.]+) MiB", plans)
    flops = numbers(r"FLOPs per step (\d+) M", plans)
    assert temps[2] < temps[0] / 5, plans  # "cuts the temporaries about ninefold"
    assert 1.1 < flops[2] / flops[0] < 1.25 and abs(flops[1] / flops[0] - 1) < 0.03, plans  # "about 17% more"

    # Gradient accumulation: the same gradient, temporaries falling with k.
    difference = numbers(r"gradient: ([\d.e-]+)", stdout(cell_with(cells, "in_four = accumulated_grads")))[0]
    assert difference < 1e-6
    by_k = numbers(r"temporaries\s+([\d.]+) MiB", stdout(cell_with(cells, "for k in (1, 4, 16)")))
    assert by_k == sorted(by_k, reverse=True) and by_k[-1] < by_k[0] / 3, by_k

    # The colleague's DP gradient is 8x; the report shows the all-reduce jax.grad inserted.
    assert "8.000" in stdout(cell_with(cells, "def colleagues_dp_gradient"))
    colleague = plain(cell_with(cells, "%%shard_map --mesh mesh --in params=P() x=data y=data"))
    assert len(re.findall(r"all-reduce \(sum\) ·", colleague)) == 2 and "f32[128,512], f32[512,128]" in colleague

    # What each ZeRO stage sends.
    def sent(text):
        return sorted(set(re.findall(r"^\s+(all-reduce|all-gather|reduce-scatter|collective-permute)(?: \(\w+\))? ·",
                                     plain(cell_with(cells, text)), re.M)))

    assert sent("dp_params, dp_velocity = update") == ["all-reduce"]
    assert sent("z1_params = jax.tree.map(gather_blocks") == ["all-gather", "all-reduce"]
    assert sent("z2_params = jax.tree.map(gather_blocks") == ["all-gather", "reduce-scatter"]
    assert sent("mean_over_devices(jax.grad(") == ["all-gather", "reduce-scatter"]
    # ZeRO-3 "gathers again in the backward pass": 4 gathers and 2 reduce-scatters, every one 8 times a step.
    zero3 = " ".join(plain(cell_with(cells, "mean_over_devices(jax.grad(")).split())
    listed = re.findall(r"(all-gather|reduce-scatter \(sum\)) · f32\[[\d,]+\] · result buffer [\d.]+ KiB · 1 group of 8"
                        r"(, in the backward pass)?, 8 times \(in a loop\)", zero3)
    assert sorted(listed) == [("all-gather", "")] * 2 + [("all-gather", ", in the backward pass")] * 2 + [
        ("reduce-scatter (sum)", ", in the backward pass")] * 2, zero3
    table = stdout(cell_with(cells, 'steps = {"DP"'))
    assert all(gap < 1e-6 for gap in numbers(r"from DP ([\d.e+-]+)", table)), table
    assert re.search(r"ZeRO-1\s+parameters\s+4.00 MiB\s+velocity\s+0.50 MiB", table)
    assert re.search(r"ZeRO-3\s+parameters\s+0.50 MiB\s+velocity\s+0.50 MiB", table)

    # At scale: the state shrinks stage by stage; ZeRO-2's temporaries are below ZeRO-1's.
    scale = stdout(cell_with(cells, "BIG_L, BIG_D, BIG_F"))
    arguments = dict(re.findall(r"^(\S+)\s+arguments\s+([\d.]+) GiB", scale, re.M))
    temporaries = dict(re.findall(r"^(\S+)\s+.*temporaries\s+([\d.]+) GiB", scale, re.M))
    assert [float(arguments[s]) for s in ("DP", "ZeRO-1", "ZeRO-2", "ZeRO-3")] == [32.0, 18.0, 18.0, 4.0], scale
    assert float(temporaries["ZeRO-2"]) < float(temporaries["ZeRO-1"]) and scale.count("fits: True") == 4
    assert "16.0 GiB/device" in plain(cell_with(cells, "%%shard_map --plan --mesh mesh --hardware tpu-v5p"))

    # Pipelines: the same bubble, (p-1)/(m+p-1) = 3/11; the pipeline's gradient is jax.grad's.
    schedules = stdout(cell_with(cells, "def schedule("))
    assert schedules.count("22 ticks, bubble 0.273") == 2
    run = stdout(cell_with(cells, "want_loss, want_grads = jax.value_and_grad"))
    assert float(numbers(r"difference ([\d.e+-]+)", run)[0]) < 1e-6
    loss, one_device = (float(v) for v in re.search(r"loss ([\d.]+) \(one device: ([\d.]+)\)", run).groups())
    assert abs(loss - one_device) < 1e-5
    assert "1F1B: most microbatches held at once, stage by stage: [4, 3, 2, 1]" in stdout(
        cell_with(cells, "most_in_flight(schedule(STAGES, MICRO, kind))}"))
    gpipe, one_f_one_b = numbers(r"temporaries\s+([\d.]+) MiB", stdout(cell_with(cells, "pipe_weights = ")))
    assert one_f_one_b < gpipe / 2
    # ... and the plan reads the same bubble off the compiled loop: 38 ticks, 6 idle, 3/19 (issue 42)
    assert stdout(cell_with(cells, "pipe_weights = ")).count("bubble 6 of 38 ticks (0.158)") == 2
    # The data-parallel all-reduce says why it is there (issue 42).
    planned = " ".join(plain(cell_with(cells, "%%shard --plan --mesh mesh --in params=P()")).split())
    assert re.search(r"why: the backward pass's dot_general at line \d+ of In\[\d+\], in block\(\) contracts or "
                     r"reduces a dimension split over 'data'", planned), planned

    # The solved exercises pass.
    checked = [c for c in cells if "check" in c.metadata.get("tags", [])]
    assert ["".join(said(o) for o in c.outputs) for c in checked] == ["✓ right\n", "✓ right\n"]


@pytest.mark.slow
def test_model_parallel_chapter_shows_what_it_says():
    cells = code_cells(MODEL_PARALLEL)
    assert cells[0].source.splitlines()[:2] == ["%load_ext jaxpar_magic", "%devices --simulate 8"]

    # Tensor parallelism: an all-reduce, or an all-gather and a reduce-scatter; the same values.
    all_reduce = plain(cell_with(cells, "y_all_reduce = x + lax.psum("))
    assert lists_collective(all_reduce, "all-reduce", "f32[64,32]", "8.0 KiB") and "all-gather" not in all_reduce
    sequence = plain(cell_with(cells, "y_sequence = x + lax.psum_scatter("))
    assert lists_collective(sequence, "all-gather", "f32[64,32]", "8.0 KiB")
    assert lists_collective(sequence, "reduce-scatter", "f32[8,32]", "1.0 KiB")
    assert "all-reduce" not in sequence
    assert stdout(cell_with(cells, 'print("all-reduce form:"')).strip() == (
        "all-reduce form: True | all-gather / reduce-scatter form: True")

    # The collective matmul: a permute that wraps around the ring, no all-gather, the same values.
    overlapped = plain(cell_with(cells, "gathered_matmul(layer_norm(x), w_in)"))
    assert "collective-permute · f32[8,32]" in overlapped and "0→7" in overlapped and "all-gather" not in overlapped
    assert "True" in stdout(cell_with(cells, 'print("same as the gathered form:"'))
    assert "if none of it does" in plain(cell_with(cells, "%%shard_map --plan --hardware tpu-v5p"))

    # The crossover: ICI-bound at 1,000 tokens on the 2x2x2 slice; the three networks as the prose says.
    slice_plan = plain(cell_with(cells, "%%shard --plan --mesh dp --hardware tpu-v5p"))
    assert "2x2x2 ICI slice, no wraparound" in slice_plan and "bound by ICI collectives" in slice_plan
    crossovers = numbers(r"crossover\s+([\d,]+) tokens", stdout(cell_with(cells, "networks = {")))
    assert len(crossovers) == 4
    assert abs(crossovers[0] - 7 / 8 * 4.59e14 / (3 * 9e10)) < 10  # the 2x2x2 slice: three axes, one way
    assert abs(crossovers[1] - 7 / 8 * 4.59e14 / 9e10) < 10  # a line without wraparound
    assert abs(crossovers[2] - 7 / 8 * 4.59e14 / 1.8e11) < 10  # a wrapped ring: 7/8 of the book's
    assert crossovers[3] == 2550  # the book's C / W

    # Ring attention: exact, one permute of stacked keys and values, run 8 times.
    ring = plain(cell_with(cells, "attended = ring_attention(q, k, v)"))
    assert "ppermute  f32[2,4,8] → f32[2,4,8]" in ring and "ran 8×" in ring
    assert stdout(cell_with(cells, 'print("ring attention equals plain attention:"')).strip().endswith("True")

    # Expert parallelism: two all_to_all cards; the same layer as on one device; some tokens dropped.
    moe = plain(cell_with(cells, "moe_out = moe_layer("))
    assert moe.count("all_to_all  f32[8,2,8] → f32[8,2,8]") == 2
    result = stdout(cell_with(cells, "expected, choice, slot = one_device_moe("))
    assert "equals the one-device layer: True" in result
    dropped = int(re.search(r"dropped: (\d+) of 64", result).group(1))
    most = int(re.search(r"sent one expert: (\d+)", result).group(1))
    assert dropped > 0 and most > 2  # the prose: the tokens over capacity were dropped

    checked = [c for c in cells if "check" in c.metadata.get("tags", [])]
    assert ["".join(said(o) for o in c.outputs) for c in checked] == ["✓ right\n", "✓ right\n"]
