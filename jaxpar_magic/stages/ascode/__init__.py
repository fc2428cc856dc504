"""The as-code stage (`--as-code`): `as_code.py` dispatches to one module per engine (`pmap.py`,
`shard.py`, `shard_map.py`) over what they share (`common.py`): the plain JAX a cell stands for,
written from the engine's prepared cell."""
