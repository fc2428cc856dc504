"""The plan stage (`--plan`, `--compare`): `plan_cell.py` asks an engine to prepare a cell over
abstract inputs, `plan_program.py` compiles it without running, `mesh_collectives.py` maps its
collectives to mesh axes, `costs.py` prices them on a `hardware.py` profile laid onto a
`topology.py`, `plan.py` is the resulting `Plan`, `compare.py` ranks several layouts. A new hardware
profile goes in `hardware.py`, with the source of its figures."""
