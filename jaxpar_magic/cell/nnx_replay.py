"""A re-run of a cell on the same Flax NNX objects, at no more than `nnx.jit`'s own cost per call.

A re-run must see every change to the objects a cell reads (a new attribute, `model.eval()`, a
Variable replaced or shared), as `nnx.jit(f)(model, optimizer)` does by walking their graph on every
call (`nnx.flatten`). The full check (cell/inputs.py:matching_group) does that walk and more: the
joint `nnx.State`, the slotted trees and their flattening; and after the run, a new `nnx.State`
rebuilt from the program's leaves and the second walk `nnx.update` makes to write it. A record made
here skips all of that:

- The check. The graph `nnx.flatten` returns is a function of the objects' pytree structure (each
  object's type, attribute names and static attributes, each Variable's metadata: what JAX's own
  flattening of NNX objects keeps in its treedef) and of which of them are shared. So where no
  object or Variable appears twice, a JAX flatten with the very treedef the record saw (about a
  fifth of `nnx.flatten`'s time) stands for a graph equal to the record's. Anything else (a changed
  treedef, an object met twice) takes `nnx.flatten` and compares graphs, as nnx.jit would.
- The write. The new arrays go straight into the Variables this call's check found, as
  `nnx.update` puts them there (the graph is unchanged: only values are new).

A record is made only where it gives exactly what the full check gives: from a full check that
succeeded, and only when its arrays are that check's very arrays, in the same order. Anything it
does not cover (an input that is a pytree around NNX objects, two names for one object, a leaf that
is not a Variable holding an array, two Variables holding one array) keeps the full check. Like
nnx_graphs.py, it never imports Flax: a cell that reads NNX objects has imported it.
"""
from __future__ import annotations

import sys
import weakref

from .fingerprints import fingerprint
from .inputs import is_array
from .nnx_graphs import is_graph_node

ATTEMPTS = 3  # full checks that may try to make a record for one Rerun; then it stops paying for it

_OTHER, _OBJECT, _VARIABLE, _UNSUPPORTED = range(4)
_kinds: "weakref.WeakKeyDictionary[type, int]" = weakref.WeakKeyDictionary()  # what each type is to the graph


def _nnx():
    return sys.modules["flax.nnx"]


def _kind(value) -> int:
    """A graph's object (Module, Optimizer, List...), a plain Variable, a graph node we do not
    handle (a hijax Variable, a mutable array reference), or anything else. Decided once per type:
    outside a trace, Flax decides each of these by type."""
    kind = _kinds.get(type(value))
    if kind is None:
        nnx = _nnx()
        if issubclass(type(value), nnx.Variable):
            kind = _VARIABLE
        elif nnx.graph.is_node_module(value):
            kind = _OBJECT
        elif nnx.graph.is_graph_node(value):
            kind = _UNSUPPORTED
        else:
            kind = _OTHER
        _kinds[type(value)] = kind
    return kind


def _tree(values) -> tuple[list, list, object, bool]:
    """JAX's flatten of `values`, Variables included (their type and metadata are in its treedef):
    (the Variables met, in order; the leaves; the treedef; whether every object and Variable in it
    was met once, each is one we handle, and each Variable gave one leaf)."""
    import jax

    met, variables, handled = [], [], [True]

    def note(node):
        kind = _kind(node)
        if kind != _OTHER:
            met.append(node)
            if kind == _VARIABLE:
                variables.append(node)
            elif kind == _UNSUPPORTED:
                handled[0] = False
        return False

    leaves, treedef = jax.tree.flatten(tuple(values), is_leaf=note)
    once = handled[0] and len(leaves) == len(variables) and len({id(node) for node in met}) == len(met)
    return variables, leaves, treedef, once


class GraphReplay:
    """The NNX inputs of one cached program (each a bare NNX object, all distinct), as a full check
    last matched them: their graph (and, without shared objects, JAX's treedef of them), the shape
    and dtype of each Variable's array, the user's classes and functions the graph holds and its
    static dict, list and set configs (fingerprinted again on every call: a global one of them reads
    may change, a list may grow in place, which == on graphs and treedefs holding that very list
    cannot see), and where each leaf
    of the program's write-back output goes among the Variables.

    `arrays` checks a new call's objects and keeps the Variables it found for `write`, which puts
    that same call's results into them. The kernel runs one cell at a time, and no user code runs
    between the two."""

    __slots__ = ("graphdef", "counts", "signature", "held", "treedef", "tree_order", "state_treedef", "state_order",
                 "variables", "accepted")

    def __init__(self, graphdef, counts, signature, held, tree, state):
        self.graphdef = graphdef
        self.counts = counts  # per input: how many of the joint leaves are its arguments
        self.signature = signature  # ((shape, dtype), ...) of every Variable's array, in graph order
        self.held = held  # ((object, fingerprint), ...) as TreeInput.held
        self.treedef, self.tree_order = tree  # JAX's treedef (None: shared objects), and each Variable's leaf
        self.state_treedef, self.state_order = state  # `nnx.state(objects)`'s structure; each leaf's Variable
        self.variables = None  # the Variables the last `arrays` call found, in graph order
        self.accepted: dict = {}  # OutputTree (by identity) -> whether `writes` accepts it

    @classmethod
    def of(cls, members, values, arrays) -> "GraphReplay | None":
        """The record of a full check that matched `values` (the inputs `members`, split together)
        to the leaves `arrays` (one list per input); None where it would not give the same."""
        import jax

        nnx = _nnx()
        if not _bare_and_distinct(values) or any(tree.statics for tree in members):
            return None
        graphdef, flat = nnx.flatten(tuple(values))
        variables = flat.leaves
        if graphdef != members[0].graphdef or not all(_plain_variable(v) for v in variables):
            return None
        raw = [variable.get_raw_value() for variable in variables]
        joined = [leaf for found in arrays for leaf in found]
        if len(raw) != len(joined) or any(mine is not theirs or not is_array(mine) for mine, theirs in zip(raw, joined)):
            return None
        state_order = _order(jax.tree.leaves(nnx.state(tuple(values))), raw)
        if state_order is None:  # two Variables hold one array: which leaf is whose is unclear
            return None
        met, _, treedef, once = _tree(values)
        tree_order = _order(variables, met) if once else None
        tree = (treedef, tree_order) if tree_order is not None else (None, None)
        state = (jax.tree.structure(nnx.state(tuple(values))), state_order)
        signature = tuple((tuple(leaf.shape), leaf.dtype) for leaf in raw)
        held = tuple(pair for tree in members for pair in tree.held)
        return cls(graphdef, tuple(len(found) for found in arrays), signature, held, tree, state)

    def arrays(self, values) -> list[list] | None:
        """Each input's arguments if `values` are objects of the very graph (and leaf shapes) the
        record was made for, else None (the caller takes the full check)."""
        self.variables = None
        if not _bare_and_distinct(values):
            return None
        for held, fp in self.held:
            if fingerprint(held) != fp:
                return None
        variables = self._same_tree(values)
        if variables is None:
            graphdef, flat = _nnx().flatten(tuple(values))
            if graphdef != self.graphdef:
                return None
            variables = flat.leaves
        raw = [variable.get_raw_value() for variable in variables]
        for leaf, (shape, dtype) in zip(raw, self.signature):
            if not is_array(leaf) or leaf.shape != shape or leaf.dtype != dtype:
                return None
        self.variables = variables
        found, start = [], 0
        for count in self.counts:
            found.append(raw[start:start + count])
            start += count
        return found

    def _same_tree(self, values) -> list | None:
        """The Variables in graph order, when JAX's flatten of `values` has the record's treedef and
        meets every object once; else None."""
        if self.treedef is None:
            return None
        met, _, treedef, once = _tree(values)
        if not once or treedef != self.treedef:
            return None
        return [met[i] for i in self.tree_order]

    def writes(self, tree) -> bool:
        """Whether a write-back output of this structure (an OutputTree) is the new state of the
        same graph, which `write` can put into the Variables directly. Asked once per OutputTree
        (one per compiled variant): comparing treedefs compares every Variable's metadata."""
        if self.variables is None:
            return False
        accepted = self.accepted.get(tree)
        if accepted is None:
            accepted = tree.graphdef is None and not tree.statics and tree.treedef == self.state_treedef
            if len(self.accepted) >= 8:  # variants of one cell are few; never let the record grow
                self.accepted.clear()
            self.accepted[tree] = accepted
        return accepted

    def write(self, leaves) -> None:
        """Put the program's new state (the leaves of a write-back output `writes` accepted) into
        the Variables the same call's `arrays` found."""
        variables, self.variables = self.variables, None
        for index, leaf in zip(self.state_order, leaves):
            variables[index].set_raw_value(leaf)


class DirectWrite:
    """A write-back that `GraphReplay.write` carries out (apply_write_backs calls `apply`)."""

    __slots__ = ("replay", "leaves")

    def __init__(self, replay: GraphReplay, leaves):
        self.replay, self.leaves = replay, leaves

    def apply(self) -> None:
        self.replay.write(self.leaves)


def _bare_and_distinct(values) -> bool:
    return all(is_graph_node(value) for value in values) and len({id(value) for value in values}) == len(values)


def _plain_variable(value) -> bool:
    """A Variable whose array `nnx.update` would set as it is (no hijax state, no mutable array reference)."""
    return _kind(value) == _VARIABLE and not getattr(value, "hijax", False) and not getattr(value, "ref", False)


def _order(items, among) -> tuple | None:
    """For each of `items`, the index of the very same object in `among` (both lists hold each
    object once); None when they are not the same objects."""
    place = {id(item): i for i, item in enumerate(among)}
    order = tuple(place.get(id(item), -1) for item in items)
    return order if len(place) == len(among) and sorted(order) == list(range(len(among))) else None
