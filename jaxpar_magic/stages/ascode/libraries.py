"""What `--as-code` writes for inputs that plain `jax.jit` cannot take: a Flax NNX object, or a
pytree with leaves that are not arrays (an Equinox module's activation function). The snippet does
what the library itself would write:

- `%%shard`: `nnx.jit` (it updates the objects the cell changes in place, as %%shard writes them
  back), or `eqx.filter_jit` (array leaves traced, the others static); `--in` places an NNX object's
  state with `nnx.update` and an Equinox module with `eqx.filter_shard`.
- `%%shard_map` and `%%pmap`: `nnx.split` (or `eqx.partition`) before `jax.jit(jax.shard_map(...))`,
  and `nnx.merge` (or `eqx.combine`) inside, so only arrays cross into the program.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import UsageError
from .common import INDENT, SnippetNames


def input_kinds(cell, namespace: dict, magic: str) -> dict[str, str]:
    """Per input the snippet passes the library's way: "nnx" (a Flax NNX object) or "eqx" (a pytree
    with leaves jit cannot take); inputs of plain arrays are not listed."""
    from ...cell.inputs import TreeInput

    kinds = {}
    for name in cell.reads:
        tree = TreeInput.of(name, namespace[name], abstract=True) if name in namespace else None
        if tree is None:
            continue
        if tree.graphdef is not None:
            kinds[name] = "nnx"
        elif tree.statics:
            kinds[name] = "eqx"
    if "eqx" in kinds.values():
        try:
            import equinox  # noqa: F401  (the snippet imports it)
        except ImportError:
            name = next(n for n, k in kinds.items() if k == "eqx")
            raise UsageError(
                f"--as-code: {name!r} has leaves that are not arrays, which plain `jax.jit` cannot take; the snippet "
                f"would use Equinox's `eqx.filter_jit`, and Equinox is not installed (`pip install equinox`). "
                f"%%{magic} itself treats those leaves as static."
            ) from None
    if "nnx" in kinds.values() and "eqx" in kinds.values():
        nnx_name = next(n for n, k in kinds.items() if k == "nnx")
        eqx_name = next(n for n, k in kinds.items() if k == "eqx")
        raise UsageError(
            f"--as-code: the cell reads a Flax NNX object ({nnx_name!r}) and a pytree with leaves that are not arrays "
            f"({eqx_name!r}); no one library call takes both (nnx.jit passes plain pytrees on to jax.jit). Keep the "
            f"non-array leaves out of {eqx_name!r}, or run the cell without --as-code."
        )
    return kinds


def library(kinds: dict) -> str | None:
    """"nnx", "eqx", or None: whose jit the %%shard snippet uses."""
    found = set(kinds.values())
    return found.pop() if found else None


def jit_decorator(names: SnippetNames, kinds: dict, inputs: list[str], donate) -> str:
    """`@jax.jit`, `@nnx.jit` or `@eqx.filter_jit`, with --donate's arguments."""
    which = library(kinds)
    donated = tuple(i for i, name in enumerate(inputs) if name in donate)
    if which == "eqx":
        eqx = names.lib("eqx")
        if not donated:
            return f"@{eqx}.filter_jit"
        if len(donated) != len(inputs):
            raise UsageError(
                "--as-code --donate: eqx.filter_jit donates every argument or none (donate='all'), and --donate names "
                f"{len(donated)} of the cell's {len(inputs)} inputs. Donate all of them to see the snippet, or run "
                "the cell without --as-code."
            )
        return f'@{eqx}.filter_jit(donate="all")'
    jit = f"{names.lib('nnx')}.jit" if which == "nnx" else f"{names.lib('jax')}.jit"
    if not donated:
        return f"@{jit}"
    argnums = "(" + ", ".join(map(str, donated)) + ("," if len(donated) == 1 else "") + ")"
    return f"@{names.lib('functools')}.partial({jit}, donate_argnums={argnums})"


def place_line(names: SnippetNames, kind: str | None, name: str, sharding: str) -> str:
    """--in's placement of one input on the mesh, the library's way."""
    jax_ = names.lib("jax")
    if kind == "nnx":
        nnx = names.lib("nnx")
        return f"{nnx}.update({name}, {jax_}.device_put({nnx}.state({name}), {sharding}))"
    if kind == "eqx":
        return f"{name} = {names.lib('eqx')}.filter_shard({name}, {sharding})"
    return f"{name} = {jax_}.device_put({name}, {sharding})"


@dataclass
class ArraysOnly:
    """The inputs of a jit(shard_map) snippet, each as the arrays that cross into the program."""

    arguments: list[str]  # per input, the name the program takes (`model_state` for an NNX `model`)
    before: list[str] = field(default_factory=list)  # lines before the program: nnx.split / eqx.partition
    inside: list[str] = field(default_factory=list)  # first lines of the body: nnx.merge / eqx.combine


def arrays_only(names: SnippetNames, kinds: dict, inputs: list[str]) -> ArraysOnly:
    """Split each NNX object (nnx.split) or Equinox-like pytree (eqx.partition) into what the program
    takes and what stays static, and rebuild it inside."""
    out = ArraysOnly(list(inputs))
    for index, name in enumerate(inputs):
        kind = kinds.get(name)
        if kind == "nnx":
            nnx = names.lib("nnx")
            graphdef, state = names.value(f"{name}_graphdef"), names.value(f"{name}_state")
            out.before.append(f"{graphdef}, {state} = {nnx}.split({name})  # the program takes the state's arrays")
            out.inside.append(f"{INDENT}{name} = {nnx}.merge({graphdef}, {state})")
            out.arguments[index] = state
        elif kind == "eqx":
            eqx = names.lib("eqx")
            params, static = names.value(f"{name}_params"), names.value(f"{name}_static")
            out.before.append(f"{params}, {static} = {eqx}.partition({name}, {eqx}.is_array)  # arrays in, the rest "
                              f"static")
            out.inside.append(f"{INDENT}{name} = {eqx}.combine({params}, {static})")
            out.arguments[index] = params
    return out


def check_plain_outputs(returns, magic: str) -> None:
    """A jit(shard_map) snippet returns arrays: an output that is an NNX object or holds other leaves
    (a module) is said before the snippet would fail (`returns`: common.TracedReturns)."""
    import jax

    from ...cell import nnx_graphs

    for name in returns.device:
        value = returns.shapes[name]
        graph = nnx_graphs.holds_graph_nodes(value)
        if graph or not all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(value)):
            what = "a Flax NNX object" if graph else "a pytree with leaves that are not arrays"
            raise UsageError(
                f"--as-code: the cell returns {name!r}, {what}, which jax.shard_map cannot return. Return its arrays "
                f"(`nnx.state(...)`, or `eqx.filter(..., eqx.is_array)`) to see the snippet; %%{magic} itself "
                f"returns it as it is."
            )
