"""Specs for pytree inputs: one spec for every array leaf, or a pytree of specs, one per leaf.

`--in params=data,None` applies one spec to each array leaf of `params`; `--in params=@specs` takes a
pytree of PartitionSpecs (or NamedShardings, as `nn.get_sharding` gives) from the namespace whose
structure matches `params` or is a prefix of it (one spec then covers a whole subtree), the way
`jax.tree.map` matches trees. The plain-Python twins take such a pytree directly.
"""
from __future__ import annotations

from ..errors import UsageError
from .fingerprints import Ref
from .specs import LeafSpecs, SpecTree, parse_spec, path_steps


class GivenSpecs:
    """A pytree of specs given directly (plain-Python twins): hashable by identity, for cache keys."""

    __slots__ = ("tree", "_ref")

    def __init__(self, tree):
        self.tree = tree
        self._ref = Ref(tree)

    def __eq__(self, other):
        return isinstance(other, GivenSpecs) and other._ref == self._ref

    def __hash__(self):
        return hash(self._ref)

    def __str__(self) -> str:
        return "a pytree of specs"


def is_spec_leaf(value) -> bool:
    from jax.sharding import NamedSharding, PartitionSpec

    return value is None or isinstance(value, (PartitionSpec, NamedSharding))


def normalize(spec):
    """A spec as the engines take it: our tuple form, a SpecTree (`@NAME`) or GivenSpecs."""
    from jax.sharding import PartitionSpec

    if isinstance(spec, (SpecTree, GivenSpecs, LeafSpecs)):
        return spec
    if isinstance(spec, PartitionSpec):
        return tuple(spec)
    if isinstance(spec, (tuple, list)) and all(_is_entry(e) for e in spec):
        return tuple(spec)
    if isinstance(spec, str):
        return (spec,)
    return GivenSpecs(spec)


def _is_entry(entry) -> bool:
    return entry is None or isinstance(entry, (str, int)) or (
        isinstance(entry, tuple) and all(isinstance(e, str) for e in entry))


def spec_tree_of(spec, namespace: dict, name: str, option: str):
    """The pytree of specs a SpecTree or GivenSpecs stands for (None for a single spec)."""
    if isinstance(spec, GivenSpecs):
        label = f"{option.strip('-')}_specs[{name!r}]"  # as the twins take it: shard_cell(out_specs={...})
        return checked_spec_tree(spec.tree, f"{option} {name}", label, f"`jax.tree.map(lambda leaf: P(), {name})`")
    if not isinstance(spec, SpecTree):
        return None
    example = f"`{spec.name} = jax.tree.map(lambda leaf: P(), {name})`"
    if spec.name not in namespace:
        raise UsageError(
            f"{option} {name}=@{spec.name}: {spec.name!r} is not defined. Bind a pytree of PartitionSpecs with the "
            f"structure of {name!r} first, e.g. {example}."
        )
    if namespace[spec.name] is None:  # JAX reads None as "no subtree", so it would match nothing
        raise UsageError(
            f"{option} {name}=@{spec.name}: {spec.name!r} is None, not a pytree of PartitionSpecs. Bind one with the "
            f"structure of {name!r} (or a prefix of it), e.g. {example}; or, to replicate every leaf of {name!r}, "
            f"write `{name}=None`."
        )
    return checked_spec_tree(namespace[spec.name], f"{option} {name}=@{spec.name}", spec.name, example)


def checked_spec_tree(specs, where: str, label: str, example: str):
    """`specs` itself when each of its leaves is a PartitionSpec, a NamedSharding or None; else a
    UsageError naming the first other leaf by its path (`label` is the tree's own name) and what to
    write there. Both --in and --out read a spec tree through here, before anything is traced."""
    import jax

    def one(value) -> bool:  # a spec, or a tuple written as one (`('data', None)`): named whole, not by entry
        return is_spec_leaf(value) or _written_as_spec(value)

    from . import nnx_graphs

    # (an NNX object in it is read as its state, as leaf_specs reads it)
    for path, leaf in jax.tree_util.tree_flatten_with_path(nnx_graphs.with_states(specs), is_leaf=one)[0]:
        if is_spec_leaf(leaf):
            continue
        at = f"`{label}{jax.tree_util.keystr(path)}`"
        what = f"{_shortened(leaf)} ({type(leaf).__name__})"
        if not path:
            raise UsageError(f"{where}: `{label}` is {what}, not a pytree of PartitionSpecs. Bind one first, e.g. "
                             f"{example}.")
        raise UsageError(f"{where}: {at} is {what}, not a spec; each leaf of a pytree of specs is a PartitionSpec "
                         f"(or a NamedSharding, or None for a leaf left whole): write {at} = {_instead(leaf)}.")
    return specs


def _written_as_spec(value) -> bool:
    return isinstance(value, tuple) and any(isinstance(e, str) for e in value) and all(_is_entry(e) for e in value)


def _shortened(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "…"


def _instead(leaf) -> str:
    """What to write in place of a spec tree's leaf that is no spec: the PartitionSpec a string reads
    as on a magic's line (`'data,None'` -> P('data', None)), else an example."""
    entries = leaf if _written_as_spec(leaf) else None
    if isinstance(leaf, str):
        try:
            entries = parse_spec(leaf, "")
        except UsageError:
            pass
    if isinstance(entries, tuple):
        return "P(" + ", ".join(repr(e) for e in entries) + ")"
    return "P('data') (split its first dimension over the mesh axis `data`), or P() to replicate it"


def over_spec_tree(each, specs, target):
    """`each(path, entries, subtree)` for each leaf of the spec tree `specs` (entries: our tuple form)
    and the subtree of `target` it covers (`specs` has `target`'s structure, or a prefix of it), as
    jax.tree.map matches trees; returns the tree of what `each` returned. A ValueError or TypeError
    says where the structures do not match (spec_tree_mismatch phrases it)."""
    import jax

    return jax.tree_util.tree_map_with_path(lambda path, entry, sub: each(path, as_spec_tuple(entry), sub),
                                            specs, target, is_leaf=is_spec_leaf)


def spec_tree_mismatch(option: str, name: str, source: str, err: Exception) -> UsageError:
    """The structures of a spec tree (`source`: `@specs`, or "the specs") and of `name` do not match."""
    detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return UsageError(
        f"{option} {name}={source}: the specs' structure does not match {name!r} ({detail}). Give a pytree with "
        f"{name!r}'s structure (or a prefix of it) whose leaves are PartitionSpecs, e.g. "
        f"`jax.tree.map(lambda leaf: P(), {name})`, or one spec for every leaf (`{name}=data,None`)."
    )


def leaf_specs(tree, value, spec, namespace: dict, option: str = "--in", *, arrays=None) -> list:
    """One spec (our tuple form) per traced leaf of `value` (whose input model is `tree`; `arrays`:
    its traced leaves, which for an input holding NNX objects come from the cell's joint split). With
    leaf paths (LeafSpecs), a leaf that neither they nor a spec for the whole input cover is None: as
    it is laid out, as an input --in does not name."""
    import jax

    if isinstance(spec, LeafSpecs):
        return _by_path(tree, value, spec, namespace, option, arrays)
    specs = spec_tree_of(spec, namespace, tree.name, option)
    if specs is None:
        return [tuple(spec)] * len(tree.positions)
    from . import nnx_graphs

    target = value
    if tree.graphdef is not None:  # the NNX objects' state, as nnx.state(...) gives it, where they sit
        slotted = tree.tree_of(arrays) if arrays is not None else nnx_graphs.split_values([value])[1][0]
        target = nnx_graphs.unslotted(slotted)
    specs = nnx_graphs.with_states(specs)
    per_leaf: list = []

    def cover(path, entries, subtree):
        per_leaf.extend([entries] * len(jax.tree.leaves(subtree)))

    try:
        over_spec_tree(cover, specs, target)
    except (ValueError, TypeError) as err:
        raise spec_tree_mismatch(option, tree.name, str(spec) if isinstance(spec, SpecTree) else "the specs",
                                 err) from None
    return [per_leaf[i] for i in tree.positions]


def _by_path(tree, value, spec: LeafSpecs, namespace: dict, option: str, arrays) -> list:
    """LeafSpecs per traced leaf: the longest of its paths that leads to the leaf, else the base."""
    per_leaf = (leaf_specs(tree, value, spec.base, namespace, option, arrays=arrays) if spec.base is not None
                else [None] * len(tree.positions))
    leaves = [path_steps(p) or () for p in tree.paths()] if tree.is_tree else [()] * len(tree.positions)
    for text, steps, given in sorted(spec.paths, key=lambda entry: len(entry[1])):  # longer paths win
        covered = [i for i, leaf in enumerate(leaves) if leaf[:len(steps)] == steps]
        if not covered:
            known = ", ".join(tree.name + p for p in (tree.paths() if tree.is_tree else [])[:6])
            what = (f"its leaves: {known}{', …' if len(tree.positions) > 6 else ''}" if known else
                    f"{tree.name!r} is one array, not a pytree; give `{tree.name}=SPEC`")
            raise UsageError(f"{option} {tree.name}{text}: {tree.name!r} has no array leaf at {text} ({what}).")
        for index in covered:
            per_leaf[index] = tuple(given)
    return per_leaf


def as_spec_tuple(entry) -> tuple:
    from jax.sharding import NamedSharding, PartitionSpec

    if entry is None:
        return ()
    if isinstance(entry, NamedSharding):
        return tuple(entry.spec)
    if isinstance(entry, PartitionSpec):
        return tuple(entry)
    if not isinstance(entry, tuple):
        raise UsageError(f"a spec tree's leaf is a {type(entry).__name__}; use PartitionSpecs (or NamedShardings).")
    return tuple(entry)


def spec_names(specs: dict) -> tuple[str, ...]:
    """The namespace names that `@NAME` specs read (their values are part of a re-run's check)."""
    bases = [s.base if isinstance(s, LeafSpecs) else s for s in specs.values()]
    return tuple(s.name for s in bases if isinstance(s, SpecTree))
