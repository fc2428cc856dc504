"""The layout explorer (`%%shard --plan --explore`, `explore_cell`): `explorer.py` is the Explorer,
which plans a %%shard cell under each layout you try (every layout one `plan/plan_cell`) and keeps
them by layout; `controls.py` reads what can be changed (the cell's array leaves, the mesh's shapes)
and spells a layout as the `%%shard --plan` line that reproduces it; `worker.py` plans the view's
changes off the kernel's main thread, coalescing those made during a compile; `state.py` is the
small dict the view (views/explorer.py, js/explorer.js) draws."""
