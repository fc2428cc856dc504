"""What a check may require of how an exercise's answer was made: ``check(..., method=[...])``.

Each requirement is a method of the run (`Attempt`, face/exercises/attempt.py) returning a
``(condition, why)`` pair: ``why`` names what is wrong when the condition is false. They all read
the program that computed the answers (`Attempt.magic` is None when the answers are not that
program's own outputs, and every requirement then says so).
"""
from __future__ import annotations

from ...cell.interrupts import addressable_shards
from ..checks import NotRun


class Method:
    """The requirements, mixed into `Attempt` (which provides magic, spec, bound, program, ...)."""

    def ran(self, magic: str, **specs) -> tuple[bool, str]:
        """The cell ran as `%%magic`, laying out each named input as given (``m=P(None, "i")``)."""
        wanted = " ".join(f"{name}={_spec_text(spec)}" for name, spec in specs.items())
        why = f"run it as the `%%{magic}` cell it was" + (f", with `--in {wanted}`" if wanted else "")
        if self.magic != magic:
            return False, self.provenance or why
        for name, spec in specs.items():
            if _normal(self.spec(name)) != _normal(spec):
                layout = f"--in {name}={_spec_text(spec)}"
                return False, f"keep `{layout}` on the `%%{magic}` line: the exercise is about that layout"
        return True, why

    def sends_only(self, *ops: str, count: int | None = None, most_bytes: int | None = None) -> tuple[bool, str]:
        """The compiled program sends something, and only these collectives (``count`` of them, whose
        buffers on one device add up to at most ``most_bytes``: `carried`)."""
        sent = self.collectives
        allowed = " or ".join(_plural([op]) for op in ops)
        if self.provenance is not None:
            return False, self.provenance
        if sent is None:
            return False, f"{self._no_program()}, using {allowed}"
        if not sent:
            return False, f"the cell's compiled program sends nothing between devices; it should send {allowed}"
        other = sorted(set(sent) - set(ops))
        if other:
            return False, f"the cell's compiled program sends {_plural(other)}; this exercise allows only {allowed}"
        if count is not None and len(sent) != count:
            return False, f"the cell's compiled program sends {len(sent)} collectives, not {count}"
        if most_bytes is not None and carried(self.program) > most_bytes:
            return False, (f"the cell's {_plural(sorted(set(sent)))} carry {carried(self.program):,} bytes per device, "
                           "more than the exercise's method needs: send the smallest array that does the job")
        return True, ""

    def split_into(self, name: str, blocks: int) -> tuple[bool, str]:
        """The input `name`, as the magic line placed it this run, is cut into `blocks` distinct blocks
        (for %%pmap: mapped over the devices, not given whole to each with ``--broadcast``)."""
        if self.magic is None:
            return False, self._no_program()
        if self.magic == "pmap":
            if name in (getattr(self.observed.options, "broadcast", None) or ()):
                return False, (f"`{name}` is given whole to every device (`--broadcast {name}`): in this exercise "
                               f"each device holds only its own part of `{name}`; drop --broadcast {name}")
            return True, ""
        if self.spec(name) is None:
            return False, f"give {name} its layout on the magic's line: --in {name}=SPEC"
        placed = self.bound.get(name)
        array = hasattr(type(placed), "addressable_shards")  # (asked of the type: the property builds the list)
        shards = addressable_shards(placed) if array else ()
        count = len({str(shard.index) for shard in shards})
        noun = "block" if count == 1 else "blocks"
        why = f"{name} is cut into {count} distinct {noun}, not {blocks}: the other devices hold copies"
        return count == blocks, why

    def follows(self, want, /, *, rtol: float = 1e-5, atol: float | None = None, setup: str | None = None,
                inputs_named: str = "", **inputs) -> tuple[bool, str]:
        """Run the exercise cell again with other values for its inputs (``readings=other``): its
        answers must then equal `want` (the reference's answers on those inputs; a dict by answer
        name, or the value when the exercise has one answer). An answer that does not depend on
        its inputs, or that adds a value worked out before, fails. The namespace is left as it was.
        On a cluster the inputs live in the processes: `setup` is code each process runs first to
        rebind them (`inputs_named` names them for the message), and every namespace is put back."""
        from ..checks import differs
        from .rerun import RUNNING, NotRunAgain, run_again, run_again_on_cluster

        names = inputs_named or ", ".join(f"`{name}`" for name in inputs)
        want = want if len(self.answers) > 1 else {self.answers[0]: want}
        if self._problem() is not None or self.body is None:
            return False, (self._problem() or NotRun("the exercise cell has not finished a run")).reason
        if setup is not None and self.on_cluster is None:
            return False, "run the exercise cell in the cluster's processes (`%%cluster` below `%%exercise`)"
        if setup is None and self.on_cluster is not None:  # its inputs live in the processes
            return False, "this check cannot run a cluster cell again without `setup=` code for its inputs"
        try:
            if self.on_cluster is not None:
                got, error = run_again_on_cluster(self, setup, RUNNING, self.on_cluster)
            else:
                got, error = run_again(self, inputs, RUNNING)
        except NotRunAgain as reason:
            return False, str(reason)
        if error is not None:
            return False, f"run again with other values in {names}, the exercise cell failed ({error})"
        for name, expected in want.items():
            value = got.get(name, NotRun(f"the cell did not set `{name}`"))
            why = value.reason if isinstance(value, NotRun) else differs(value, expected, rtol=rtol, atol=atol)
            if why is not None:
                return False, (f"run again with other values in {names}, the cell's `{name}` is wrong ({why}): "
                               f"compute it from {names}, not from a value worked out before")
        return True, ""

    def sends_nothing(self) -> tuple[bool, str]:
        """The compiled program sends nothing between devices."""
        sent = self.collectives
        if sent is None:
            return False, self._no_program()
        return not sent, f"the cell's compiled program sends {_plural(sorted(set(sent)))}" if sent else ""


def carried(program: list) -> int:
    """Bytes the collectives carry on one device: each one's larger buffer (a reduce-scatter's input,
    an all-gather's result), times the times it runs (a loop of unknown length counts once)."""
    return sum(max(c.bytes, c.operand_bytes or 0) * (c.count or 1) for c in program)


def _plural(ops: list[str]) -> str:
    return " and ".join(f"an {op}" if op[0] in "aeiou" else f"a {op}" for op in ops)


def _normal(spec):
    """A spec as a tuple without trailing Nones (P('x') and P('x', None) are one layout); a pytree of
    specs (`--in m=@specs`) as the list of its leaves' (with their structure), or the one spec
    all its leaves share, so `m=P("i")` and `@specs` that give every leaf P("i") are one layout."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    if spec is None:
        return None
    if isinstance(spec, NamedSharding):
        spec = spec.spec
    if isinstance(spec, PartitionSpec) or (isinstance(spec, tuple) and all(map(_is_entry, spec))):
        entries = list(spec)
        while entries and entries[-1] is None:
            entries.pop()
        return tuple(entries)
    leaves, structure = jax.tree.flatten(spec, is_leaf=lambda leaf: isinstance(leaf, (PartitionSpec, NamedSharding)))
    normal = [_normal(leaf) for leaf in leaves]
    if normal and all(n == normal[0] for n in normal):
        return normal[0]
    return str(structure), normal  # a PyTreeDef does not compare with a spec


def _is_entry(entry) -> bool:
    """One entry of a spec in our tuple form: None, an axis name, or a tuple of axis names."""
    return entry is None or isinstance(entry, str) or (isinstance(entry, tuple) and all(isinstance(e, str) for e in entry))


def _spec_text(spec) -> str:
    from jax.sharding import PartitionSpec

    if not isinstance(spec, (PartitionSpec, tuple)):  # a pytree of specs: the line would say @NAME
        return f"@<{type(spec).__name__} of specs>"
    return ",".join("None" if e is None else (f"({','.join(e)})" if isinstance(e, tuple) else str(e)) for e in spec)
