"""The prepared cell: what an engine's *prepare* step hands to every stage.

Each engine (`%%pmap`, `%%shard`, `%%shard_map`) exposes `prepare(cell, namespace, mesh, ...)`: it
checks the line against the cell and the mesh and turns the namespace's values into the program's
arguments, once, in one place. The stages (run, plan, record collectives, --as-code, the views)
take the PreparedCell and never reach into the engine: like `jax.stages` (Traced -> Lowered ->
Compiled), each step is a public object to inspect and hand on.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .fingerprints import fingerprint


@dataclass(eq=False)
class PreparedCell:
    magic: str  # "pmap", "shard" or "shard_map"
    cell: object  # cell.Cell: the analysis of its source
    mesh: object
    inputs: tuple  # inputs.TreeInput per input, in argument order
    constants: tuple[str, ...]  # names read as constants (compiled in, keyed by fingerprint)
    arguments: list  # per input, its traced leaves as the program takes them (placed, reshaped or abstract)
    leaf_specs: tuple  # per input, per leaf: the spec tuple it is laid out by (None: as the leaf is)
    out_specs: dict = field(default_factory=dict)  # name -> spec tuple from --out
    options: dict = field(default_factory=dict)  # the engine's own options (broadcast, split, merge, check_vma)
    moved: list = field(default_factory=list)  # inputs laid out again from another mesh: (name, its mesh, spec)
    compile: Callable = field(default=None, repr=False)  # (record=None) -> programs.CellProgram

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(tree.name for tree in self.inputs)

    def program(self, record=None):
        """The engine's traced program for this cell (jit-wrapped; nothing compiled until called).
        `record` (the record stage's `cell_recording.recording`) makes it also record what each
        collective did; the engine never imports a stage, it is handed one."""
        return self.compile(record)

    def fingerprints(self, namespace: dict) -> tuple:
        """(name, fingerprint) of each constant: the part of the compile key the inputs don't give."""
        return tuple((name, fingerprint(namespace[name])) for name in self.constants)

    def labels(self) -> list[list[str]]:
        """Per input, per leaf: its label in messages and views (`params['w1']`, or the bare name)."""
        return [[tree.label(i) for i in range(len(tree.positions))] for tree in self.inputs]

    def values(self, arguments=None) -> dict:
        """Each input rebuilt as the user's own type around `arguments` (default: the prepared ones)."""
        arguments = self.arguments if arguments is None else arguments
        return {tree.name: tree.rebuild(leaves) for tree, leaves in zip(self.inputs, arguments)}
