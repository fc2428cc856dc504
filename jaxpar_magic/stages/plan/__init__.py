"""The plan stage (`--plan`, `--compare`): `plan_cell.py` asks an engine to prepare a cell over
abstract inputs, `target.py` chooses the compiler (XLA:TPU for compile-only devices of a slice when
libtpu is installed, else XLA:CPU), `plan_program.py` compiles it without running
(`compiled_plans.py` keeps what was compiled), `mesh_collectives.py` maps its collectives to mesh
axes, `peak.py` says what fills memory at the peak and draws the memory timeline from XLA's buffer
dump (cell/xla_dump.py), `costs.py` prices the step on a `hardware.py` profile laid onto a
`topology.py` (each device where it sits), `plan.py` is the resulting `Plan`, `compare.py` ranks several
layouts. What the plan adds to the compiled program's figures: `why.py` (why each collective is there,
and XLA's partitioner warnings as rows; `native_stderr.py` keeps what XLA logs while compiling),
`advice.py` (what would make a step that does not fit fit), `layout_changes.py` (inputs bound again in
another layout), `pipeline.py` (a pipeline's bubble). A new hardware profile goes in `hardware.py`,
with the source of its figures."""
