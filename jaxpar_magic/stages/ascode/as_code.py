"""`--as-code`: the plain JAX a `%%pmap`, `%%shard` or `%%shard_map` cell stands for.

`as_code(magic, options, source, namespace)` returns a self-contained snippet: imports, the mesh,
the `jax.jit` / `jax.shard_map` / `jax.device_put` calls with their specs, and the cell's own lines
as a function body. Executed in a namespace that holds only the names the cell reads, it binds the
names the magic binds, to the same values with the same shardings.

Nothing runs. The line and the cell go through the engines' own checks (so a mistake is the same
UsageError the magic gives), then the engine's own program is traced abstractly (`jax.eval_shape`:
no compile, no transfer) to learn what the cell gives back: which names are arrays computed on the
devices and which are plain Python values, their shapes, and the out specs `%%shard_map` proves.

The mesh is always rebuilt from its devices' ids and axis types, never read from the namespace:
the snippet stands alone, and `--mesh NAME` binds NAME to an equal mesh. The snippet's own names
(`mesh`, `per_device`, `run`, ...) are chosen so that none changes a name the cell uses, and none
overwrites a different value of yours (`mesh_2` when your `mesh` is another mesh).

This module is the entry: each engine's writer is its own module (stages/ascode/pmap.py, stages/ascode/shard.py,
stages/ascode/shard_map.py), over what they share (stages/ascode/common.py).
"""
from __future__ import annotations

from ...cell.programs import analyse_cached
from ...errors import UsageError
from .common import plain_jax_inputs
from .pmap import pmap_code
from .shard import shard_code
from .shard_map import shard_map_code


def as_code(magic: str, options, source: str, namespace: dict, *, axis_name: str | None = None) -> str:
    """The snippet for a `%%magic` cell with the parsed line `options` (jaxpar_magic.face.lines);
    `axis_name` is %%pmap's axis name with the configured default already applied. Long lines are
    broken where Python allows (views/textwidth.py), to fit the terminal or notebook text width."""
    from ...views.textwidth import fit_code

    if magic in ("pmap", "shard", "shard_map"):
        plain_jax_inputs(analyse_cached(source, f"{magic}-cell"), namespace, magic)
    if magic == "pmap":
        return fit_code(pmap_code(options, source, namespace, axis_name or options.axis_name or "i"))
    if magic == "shard":
        return fit_code(shard_code(options, source, namespace))
    if magic == "shard_map":
        return fit_code(shard_map_code(options, source, namespace))
    raise UsageError(f"--as-code: there is no %%{magic} magic; it works on %%pmap, %%shard and %%shard_map cells.")
