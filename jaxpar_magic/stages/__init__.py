"""The stages that consume a prepared cell, like `jax.stages` after `trace`: `run/` runs it (and holds
the plain-Python twins `pmap_cell`, `shard_cell`, `shard_map_cell`), `plan/` compiles it without
running and prices it on a hardware profile (`--plan`, `--compare`), `explore/` plans it under the
layouts you try (`--explore`), `record/` records what each collective did (`--collectives`),
`ascode/` writes it out as plain JAX (`--as-code`). A stage never imports the face."""
