"""The run stage: `program.py` calls a compiled cell (compiling it once, with a status line) and reads
its facts; `pmap.py`, `shard.py`, `shard_map.py` run each engine's prepared cell and build the result
to bind; `pmap_function.py` is `%%pmap` function mode, our `jax.pmap`."""
