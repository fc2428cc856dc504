"""The engines, one per cell magic: `pmap.py` (`%%pmap`), `shard.py` (`%%shard`, with the `%mesh` and
`%sharding` twins), `shard_map.py` (`%%shard_map`). Each checks a line against its cell and mesh and
*prepares* the cell (`prepare(...)` -> `cell.prepared.PreparedCell`); the stages consume it. An
engine never imports a stage."""
