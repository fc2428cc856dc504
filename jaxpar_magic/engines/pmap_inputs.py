"""What `%%pmap` asks of a block-mode cell's inputs: one slice per device on every mapped leaf.

pmap's rule, checked once per full run (never on a re-run, whose record already checked it): each
array leaf of a mapped input carries the mesh's device axes first; `--split` reshapes a batch of
`n*k` rows into `n` blocks of `k`. The messages name the leaf (`bad.w`), the shapes and the fix.
"""
from __future__ import annotations

from ..errors import UsageError


def _split_rows(label: str, shape: tuple, total: int, option: str) -> None:
    """--split of a leaf: its leading axis must divide evenly over the devices."""
    rows = shape[0] if shape else 0
    if shape and rows % total == 0:
        return
    have = f"{rows} rows" if shape else "no leading axis (a scalar)"
    nearest = total * max(1, rows // total)
    trimmed = total * (rows // total)
    raise UsageError(
        f"{option} {label}: `{label}` has {have}, which do{'es' if not shape else ''} not split over {total} devices. "
        f"Use a batch that is a multiple of {total} (e.g. {nearest}), or trim it (`{label}[:{trimmed}]`)."
    )


def mapped_arrays(tree, arrays: list, mesh, split: bool) -> list:
    """Check (and with --split, reshape) each leaf's leading axes against the mesh: pmap slices every
    array leaf of a mapped input along its leading axis."""
    import jax

    sizes = tuple(mesh.devices.shape)
    k, total = len(sizes), mesh.devices.size
    if split:
        reshaped = []
        for index, leaf in enumerate(arrays):
            shape = tuple(leaf.shape)
            _split_rows(tree.label(index), shape, total, "--split")
            target = sizes + (shape[0] // total,) + shape[1:]
            reshaped.append(jax.ShapeDtypeStruct(target, leaf.dtype) if isinstance(leaf, jax.ShapeDtypeStruct)
                            else leaf.reshape(target))  # --plan: only the shape changes
        return reshaped
    for index, leaf in enumerate(arrays):
        shape = tuple(leaf.shape)
        if shape[:k] != sizes:
            label = tree.label(index)
            have = "x".join(map(str, shape[:k])) or "no leading axis (a scalar)"
            want = "x".join(map(str, sizes))
            hint = f"pass `--split {tree.name}` to split its {shape[0]} rows into {total} blocks, " \
                if shape and shape[0] % total == 0 else ""
            axes = ", ".join(f"{n}={s}" for n, s in zip(mesh.axis_names, sizes))
            raise UsageError(
                f"input {label!r} has shape {shape}: its leading axis is {have} but the cell runs over {want} devices "
                f"({axes}), and a mapped input needs one slice per device. Give {label!r} a leading axis of {want}, "
                f"{hint}or pass `--broadcast {tree.name}` to give every device the whole "
                f"{'value' if tree.is_tree else 'array'}."
            )
    return arrays


def check_same_leading(mapped: list, devices: int) -> None:
    """Mapped inputs that disagree with each other, when none of them fits the devices: name both.

    (When one fits, the others get the sharper per-input message of `mapped_arrays`.)
    """
    seen = {}
    for tree, arrays in mapped:
        for index, leaf in enumerate(arrays):
            if getattr(leaf, "ndim", 0) >= 1:
                seen.setdefault(int(leaf.shape[0]), tree.label(index))
    if len(seen) > 1 and devices not in seen:
        (a, na), (b, nb) = list(seen.items())[:2]
        raise UsageError(
            f"mapped inputs disagree on their leading axis: {na!r} has {a} rows and {nb!r} has {b}, and the cell "
            f"runs over {devices} devices. Every mapped input needs one slice per device (a leading axis of "
            f"{devices}); reshape them, use `--split` on a batch of {devices}*k rows, or `--broadcast` an input "
            f"every device should see whole."
        )


def per_device_note(cell, namespace, mesh, broadcast) -> str:
    from ..cell.inputs import TreeInput

    k = len(mesh.axis_names)
    seen = []
    for name in cell.reads:
        tree = TreeInput.of(name, namespace[name]) if name in namespace else None
        if tree is None:
            continue
        for index, (shape, dtype) in enumerate(tree.signature[:8]):
            # str, not np.dtype(...).name: a PRNG key array's key<fry> is no NumPy dtype
            whole = f"{dtype}{list(shape)}"
            per = whole if name in broadcast else f"{dtype}{list(shape[k:])}"
            seen.append(f"{tree.label(index)}: {per}" + ("" if name in broadcast else f" (its slice of {whole})"))
        if len(tree.signature) > 8:
            seen.append(f"... and {len(tree.signature) - 8} more leaves of {name}")
    shapes = "; ".join(seen) or "no array inputs"
    return (f"jaxpar_magic: in a %%pmap cell the code runs once per device and each device sees its own "
            f"slice of every mapped input: {shapes}.")
