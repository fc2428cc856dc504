"""The per-device values a result view shows: `%%pmap`'s value on each device, `%%shard_map`'s block on
each device. A few numbers per device, computed by small programs on the devices and read when ready.

A shown cell does not wait for them (issue 39): `result_parts` dispatches the small programs and hands
back the view's state with every output marked pending (its name, shape and dtype are known at once),
and a PendingValues that reads the values. The magic layer shows the view at once and has it filled
when the values are there (views/later.py); where a front end cannot be updated later, it waits
(`result_state`). Nothing here ships array data: at most VALUES_PER_TILE values for MAX_TILES devices
per output, whatever the array's size.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import threading

from ..cell.bounded_cache import BoundedCache
from .summaries import MAX_TILES, VALUES_PER_TILE, format_values, mesh_coords, numbers_of, program_state, to_host

#: What an output whose values have not arrived says, in the widget (js/results.js), HTML and text.
PENDING_TEXT = "values: waiting for the devices…"
#: On XLA:CPU, how many summary programs may be in flight: each has collectives (it gathers a few
#: values from every device), and 50-70 such programs queued back to back deadlock a 2-core machine
#: (README "Many small collective programs"). Past this the shown cell waits for the oldest.
CPU_IN_FLIGHT = 8
_in_flight: collections.deque = collections.deque()
_in_flight_lock = threading.Lock()


class PendingValues:
    """A result view's values on their way from the devices: for each output, what its item says
    before they arrive (`placeholders`), the small device arrays holding them, and how the item is
    made from them once on the host."""

    def __init__(self, parts: list):
        self.parts = parts  # [(placeholder item, device arrays, finish(*host arrays) -> item)]

    def placeholders(self) -> list[dict]:
        return [dict(placeholder, pending=True) for placeholder, _, _ in self.parts]

    def start_transfers(self) -> None:
        """Start copying the values to the host (`jax.Array.copy_to_host_async`), not waiting: a later
        `outputs` finds them there. An error of the cell's program is for `outputs` to raise."""
        for _, arrays, _ in self.parts:
            for array in arrays:
                with contextlib.suppress(Exception):
                    array.copy_to_host_async()

    def outputs(self) -> list[dict]:
        """Every output's item with its values: waits for them. An error the cell's program raised on
        the devices is raised here, as reading any of its results would."""
        return [finish(*(to_host(a) for a in arrays)) for _, arrays, finish in self.parts]

    def failed(self, error: BaseException) -> list[dict]:
        """The items when the values could not be read: each says why, and shows no value."""
        first = (str(error).strip().splitlines() or [""])[0]
        reason = f"{type(error).__name__}: {first}"[:200]
        return [dict(placeholder, error=reason) for placeholder, _, _ in self.parts]


def _dispatched(arrays: tuple, on_cpu: bool) -> tuple:
    """`arrays` (a summary program's results, just dispatched), counted against CPU_IN_FLIGHT."""
    if on_cpu:
        with _in_flight_lock:
            _in_flight.append(arrays)
            oldest = _in_flight.popleft() if len(_in_flight) > CPU_IN_FLIGHT else None
        if oldest is not None:
            _wait_quietly(oldest)
    return arrays


def _wait_quietly(arrays: tuple) -> None:
    """Wait for an older view's summaries to finish. Their failure (the cell's program raised on the
    devices) is that view's to say, and its fill says it; here only their place in flight matters."""
    import jax

    for array in arrays:
        if not array.is_deleted():
            with contextlib.suppress(jax.errors.JaxRuntimeError):
                array.block_until_ready()


def _per_device(name: str, stacked, k: int, device_ids: list[int], coords: list[tuple], on_cpu: bool):
    """One `%%pmap` output (per-device values stacked on k leading mesh axes): its placeholder, the
    dispatched head and same-on-all flag, and the finish that makes its tiles: each device's value,
    or one line when every device holds the same."""
    total = len(device_ids)
    numbers = numbers_of(stacked)  # a key array's words (one dimension more): what its tiles show
    placeholder = {"name": name, "shape": list(stacked.shape[k:]), "dtype": str(stacked.dtype)}
    arrays = _dispatched(_summariser()(numbers, total), on_cpu)
    shape, dtype = tuple(numbers.shape[k:]), numbers.dtype  # finish keeps no reference to the output

    def finish(head, same) -> dict:
        same = bool(same)
        shown = 1 if same else min(total, MAX_TILES)
        tiles = []
        for row in range(shown):
            ids = device_ids if same else [device_ids[row]]
            tiles.append({
                "devices": ids[:MAX_TILES],
                "coords": list(coords[row]),
                "text": format_values(head[row], shape, dtype),
            })
        return {**placeholder, "same_on_all": same, "tiles": tiles, "omitted": 0 if same else total - shown,
                "same_text": f"same on all {total} devices" if same else None}

    return placeholder, arrays, finish


def per_device_summary(name: str, stacked, k: int, device_ids: list[int], coords: list[tuple]) -> dict:
    """One `%%pmap` output's item, its values read now."""
    return PendingValues([_per_device(name, stacked, k, device_ids, coords, False)]).outputs()[0]


@functools.lru_cache(maxsize=1)
def _summariser():
    import jax
    import jax.numpy as jnp

    # One compiled program per output shape, instead of a handful of eager ops (each its own
    # compile on first use, and a dispatch every re-run).
    @functools.partial(jax.jit, static_argnums=1)
    def head_and_same(stacked, total):
        flat = jnp.reshape(stacked, (total, -1))
        return flat[:MAX_TILES, :VALUES_PER_TILE], jnp.all(flat == flat[:1])

    return head_and_same


def _blocks(name: str, value, mesh, on_cpu: bool):
    """One `%%shard_map` output: each device's block of a global array (its first values) and the
    slice of the global array that block is. One compiled program per (mesh, spec) gathers the few
    values shown; nothing else leaves the devices. What the output's layout alone decides is read
    once per layout (_block_layout): a re-run of the cell only dispatches its program."""
    numbers = numbers_of(value)  # a key array's words: its own blocks, one dimension more
    layout = _block_layout(name, mesh, value.sharding, value.shape, value.dtype, numbers)
    heads = layout.heads(numbers)
    arrays = _dispatched((heads if heads.is_fully_addressable else heads.addressable_data(0),), on_cpu)
    return layout.placeholder, arrays, layout.finish


class _BlockLayout:
    """What a `%%shard_map` output's item takes from its layout alone (name, mesh, sharding, shape,
    dtype): its placeholder, the program that gathers its blocks' first values, and each tile's
    devices, coordinates and slice; `finish` adds the values (it keeps no reference to an output)."""

    def __init__(self, name: str, mesh, sharding, shape: tuple, dtype, numbers):
        import numpy as np

        ids, coords = mesh_coords(mesh)
        self.total = len(ids)
        self.numbers_block = tuple(numbers.sharding.shard_shape(numbers.shape))
        self.size = int(np.prod(self.numbers_block, dtype=np.int64))
        self.dtype = numbers.dtype
        self.same = bool(sharding.is_fully_replicated)
        self.placeholder = {"name": name, "shape": list(sharding.shard_shape(shape)), "dtype": str(dtype),
                            "global_shape": list(shape)}
        self.heads = _block_heads(mesh, sharding.spec, not numbers.is_fully_addressable)
        where = sharding.devices_indices_map(tuple(shape))
        by_id = {d.id: d for d in mesh.devices.flat}
        self.rows = []
        for row in range(1 if self.same else min(self.total, MAX_TILES)):
            index = where[by_id[ids[row]]]
            self.rows.append((ids[:MAX_TILES] if self.same else [ids[row]], list(coords[row]),
                              "[" + ", ".join(f"{s.start or 0}:{n if s.stop is None else s.stop}"
                                              for s, n in zip(index, shape)) + "]"))

    def finish(self, heads) -> dict:
        import numpy as np

        heads = np.asarray(heads).reshape(self.total, -1)
        count = min(self.size, VALUES_PER_TILE)
        tiles = [{"devices": list(devices), "coords": list(coords),
                  "text": format_values(heads[row][:count], self.numbers_block, self.dtype), "slice": where}
                 for row, (devices, coords, where) in enumerate(self.rows)]
        same, total = self.same, self.total
        return {**self.placeholder, "same_on_all": same, "tiles": tiles, "omitted": 0 if same else total - len(tiles),
                "same_text": f"same on all {total} devices" if same else None}


LAYOUTS = 256  # outputs' layouts kept (each a few lists of at most MAX_TILES rows)
_layouts = BoundedCache(LAYOUTS)  # read and written by the showing cell only


def _block_layout(name: str, mesh, sharding, shape, dtype, numbers) -> _BlockLayout:
    key = (name, mesh, sharding, shape, dtype, numbers.sharding, numbers.shape, numbers.dtype)
    return _layouts.lookup(key, lambda: _BlockLayout(name, mesh, sharding, tuple(shape), dtype, numbers))


def block_summary(name: str, value, mesh) -> dict:
    """One `%%shard_map` output's item, its values read now."""
    return PendingValues([_blocks(name, value, mesh, False)]).outputs()[0]


@functools.lru_cache(maxsize=64)
def _block_heads(mesh, spec, gathered: bool):
    """jit(shard_map): every device's first values, as one (devices in mesh order, VALUES_PER_TILE)
    array. In one process each device keeps its own row (no collective: the host reads each);
    `gathered` (a cluster) gathers them onto every device, so each process reads them from its own."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    axes = tuple(mesh.axis_names)

    def head(block):
        flat = block.reshape(-1)[:VALUES_PER_TILE]
        flat = jnp.pad(flat, (0, VALUES_PER_TILE - flat.shape[0]))
        return lax.all_gather(flat, axes) if gathered else flat[None]

    return jax.jit(jax.shard_map(head, mesh=mesh, in_specs=spec, out_specs=P() if gathered else P(axes),
                                 check_vma=False))


def result_parts(title: str, mesh, outputs: dict, facts=None, line_text=lambda n: None,
                 report: dict | None = None, blocks: bool = False) -> tuple[dict, PendingValues]:
    """The per-device result view's state for named outputs (pytrees are flattened), every output
    pending, and the PendingValues that fills them: per-device values stacked on leading mesh axes
    (`%%pmap`), or with `blocks` the blocks of global arrays (`%%shard_map`). The small programs that
    gather the values are dispatched here; nothing waits for them."""
    import jax

    from ..cell.meshes import on_cell_mesh

    ids, coords = mesh_coords(mesh)
    k = len(mesh.axis_names)
    on_cpu = mesh.devices.flat[0].platform == "cpu"
    parts = []
    with on_cell_mesh(mesh):  # the summaries' small programs run on the cell's mesh, whatever mesh is set
        for name, value in outputs.items():
            for path, leaf in jax.tree_util.tree_leaves_with_path(value):
                if not isinstance(leaf, jax.Array):  # an output's static leaves (a module's activation, a string)
                    continue
                label = name + jax.tree_util.keystr(path)
                parts.append(_blocks(label, leaf, mesh, on_cpu) if blocks else
                             _per_device(label, leaf, k, ids, coords, on_cpu))
    pending = PendingValues(parts)
    state = {
        "title": title,
        "axes": [{"name": n, "size": int(s)} for n, s in zip(mesh.axis_names, mesh.devices.shape)],
        "device_ids": list(ids),
        "outputs": pending.placeholders(),
        "collectives": program_state(facts, len(ids), line_text),
        "report": report,
    }
    return state, pending


def result_state(title: str, mesh, outputs: dict, facts=None, line_text=lambda n: None,
                 report: dict | None = None, blocks: bool = False) -> dict:
    """result_parts' state with its values: waits for them."""
    state, pending = result_parts(title, mesh, outputs, facts, line_text, report, blocks)
    return {**state, "outputs": pending.outputs()}
