"""The differential sessions of tests/test_differential.py, with --donate where a donation can go
wrong (issue 33 items 1-3): aliases among the steps, interrupts among the steps, and a Flax NNX model.

- Aliases: `xg` (placed on the mesh or not) and `xg2` (the same object, or a copy), and `tg` holding
  both, then `%%shard --in ... --donate ...` cells. The oracle places the inputs as plain
  `jax.device_put` does and looks at their buffers: where a donated buffer is also another input's
  (or another leaf's of the same tree), plain jax.jit ends the process (XLA: "Attempt to donate the
  same buffer twice"), so the magic must refuse with a UsageError naming both paths and leave the
  namespace exactly as it was; otherwise it must give jax.jit(donate_argnums=...)'s values and delete
  what jax.jit deletes.
- Interrupts: a --donate xd cell interrupted while its program runs (a jax.debug.callback calling
  `_thread.interrupt_main()`, as tests/test_donation.py delivers it; the callback itself never fails,
  since a failed callback breaks JAX's effect tokens for the process) or while it compiles (the
  compile's progress raising KeyboardInterrupt), or at line N of those our code runs in the cell
  (sys.settrace; issue 40 item 10). Either the cell raised KeyboardInterrupt with `xd` alive and
  unchanged and nothing bound, or it bound jax.jit(donate_argnums=0)'s values, printed the note and
  then raised the KeyboardInterrupt; never a name bound to a deleted array, never an interrupt
  swallowed. A Python loop of --donate steps (%%shard and shard_cell) interrupted in step N stops
  there with N steps of jax.jit bound (issue 40 item 9). Later steps go on against plain JAX.
- A Flax NNX Linear donated by a cell that only reads it and by one that trains it (with an
  nnx.Optimizer), against nnx.jit(donate_argnums=...) on a copy of the model's state as it was
  before the cell; then the model is called in a plain cell, as nnx.jit leaves it usable.

Same budget variables as the base test (JPM_DIFFERENTIAL_EXAMPLES, _STEPS, _RANDOM).
"""
from __future__ import annotations

import _thread
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output
from jax.sharding import NamedSharding, PartitionSpec as P

import test_differential as base
from shell_helpers import package_lines, settle, snapshot

pytestmark = pytest.mark.slow

# `poke` interrupts the kernel once each time it is armed; the oracle's `poke` does nothing.
POKE = """
import _thread
_armed = []
def poke(v):
    if _armed:  # Kernel -> Interrupt, while the program runs and holds its donated inputs
        _armed.pop()
        _thread.interrupt_main()
"""
NOTE = "Interrupted after the program was given"

# (the --in / --donate part of the line, the cell, what it binds)
PAIR_CELLS = [
    ("--in xg=data xg2=data --donate xg", "yg = xg * 2 + xg2", ("yg",)),
    ("--in xg=data xg2=data --donate xg xg2", "yg = xg - xg2 * 3", ("yg",)),
    ("--in xg=data xg2=data --donate xg2", "yg = (xg + 1) * xg2", ("yg",)),
    ("--in tg=data --donate tg", "yg = tg['a'] + tg['b'] * 2", ("yg",)),
]

LINEAR = "from flax import nnx\nimport optax\n"
MODEL_CELLS = {  # the cell, what it binds, the same step for nnx.jit(donate_argnums=...)
    "reads": ("--donate model", "ym = model(xm) * 2.0", ("ym",)),
    "trains": ("--donate model opt --out loss",
               "loss, grads = nnx.value_and_grad(lambda m: jnp.mean(m(xm) ** 2))(model)\nopt.update(model, grads)",
               ("loss",)),
}


def _paths(name, value):
    """(label as the magic writes it, leaf) of each array leaf of input `name`."""
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
        out.append((name + jax.tree_util.keystr(path), leaf))
    return out


def _tally(kind: str) -> None:
    base.Found.kinds[kind] = base.Found.kinds.get(kind, 0) + 1


def _buffers(leaf) -> set:
    return {(s.device.id, s.data.unsafe_buffer_pointer()) for s in leaf.addressable_shards}


class NotebookDonating(base.Notebook):
    """The base sessions, plus aliased and interrupted donations and a donated NNX model."""

    def __init__(self):
        super().__init__()
        self.play(POKE)
        self.pair = None  # None: no xg/xg2/tg; "fresh"; "donated" (a cell gave one of them away)
        self.model = None  # None, or "ready"

    @initialize(shape=st.sampled_from(base.SHAPES), dtype=st.sampled_from(base.DTYPES),
                fill=st.sampled_from(base.FILLS), sg=st.sampled_from(base.GLOBALS),
                helper=st.sampled_from(list(base.HELPERS)), op=st.sampled_from(base.OPERATORS),
                placed=st.booleans(), copy=st.booleans(), seed=st.sampled_from([0, 1]))
    def start(self, shape, dtype, fill, sg, helper, op, placed, copy, seed):
        """The base session's start, and a pair and a model from the start (the base rules are many)."""
        super().start(shape, dtype, fill, sg, helper, op)
        self.make_pair(placed, copy)
        self.make_model(seed)

    def fresh_namespace(self) -> dict:
        ns = super().fresh_namespace()
        ns["poke"] = lambda v: None
        return ns

    # --- aliases --------------------------------------------------------------------------------

    @rule(placed=st.booleans(), copy=st.booleans())
    def make_pair(self, placed, copy):
        """xg, xg2 (the same object, or a copy) and tg = {'a': xg, 'b': xg2}."""
        first = "jax.device_put(x * 1, jax.NamedSharding(mesh, jax.P('data')))" if placed else "x * 1"
        second = "jnp.copy(xg)" if copy else "xg"
        self.pair = "fresh"
        self.plain_step(f"xg = {first}\nxg2 = {second}\ntg = {{'a': xg, 'b': xg2}}")

    @precondition(lambda self: self.pair == "fresh")
    @rule(pick=st.integers(0, len(PAIR_CELLS) - 1), show=st.booleans())
    def donate_pair(self, pick, show):
        given, source, names = PAIR_CELLS[pick]
        line = f"--mesh mesh {given}" + ("" if show else " --no-show")
        ins = [part.split("=")[0] for part in given.split("--donate")[0].split()[1:]]
        donated = given.split("--donate")[1].split()
        base.Found.steps += 1
        base.Found.checks += 1
        base.Found.kinds["shard --donate aliases"] = base.Found.kinds.get("shard --donate aliases", 0) + 1
        expected, alias = self.oracle_pair(source, names, ins, donated)
        self.session.append(f"%%shard {line}\n{source}")
        before = snapshot(self.ns)
        try:
            with capture_output():
                final = self.shell.run_cell_magic("shard", line, self.tag + source)
        except Exception as exc:  # noqa: BLE001
            if alias is None:
                raise AssertionError(f"%%shard {line} raised {exc!r} where plain jax.jit gives a result"
                                     f"{self.context()}") from exc
            assert isinstance(exc, UsageError), f"raised {exc!r}, not a UsageError{self.context()}"
            named = [f"`{label}`" for label in alias]
            assert all(n in str(exc) for n in named), f"the UsageError does not name {named}: {exc}{self.context()}"
            assert snapshot(self.ns) == before, f"a refused cell changed the namespace{self.context()}"
            assert not any(leaf.is_deleted() for n in ins for leaf in jax.tree.leaves(self.ns[n])), \
                f"a refused donation deleted an input{self.context()}"
            base.Found.raised += 1
            _tally("aliases: refused, as plain jax.jit cannot run them")
            return
        _tally("aliases: ran, as plain jax.jit does")
        assert alias is None, (f"plain jax.jit would be given {alias[0]} and {alias[1]}, one buffer, donated "
                               f"(XLA ends the process); %%shard {line} ran{self.context()}")
        for name in names:
            self.compare(self.ns[name], expected[name], f"{name} bound by the last cell")
        self.compare(final, expected["(final)"], "the last cell's final value")
        for name in ins:
            gone = [leaf.is_deleted() for leaf in jax.tree.leaves(self.ns[name])]
            assert gone == expected["(deleted)"][name], \
                f"{name}'s leaves deleted: {gone}, after jax.jit {expected['(deleted)'][name]}{self.context()}"
        self.pair = "donated"  # whatever was deleted, later pair cells start from a new pair

    def oracle_pair(self, source, names, ins, donated):
        """(expected, None) from jax.jit(donate_argnums=...) on the inputs placed as device_put places
        them, or (None, (donated label, other label)) where a donated buffer is also another input's."""
        ns = self.fresh_namespace()
        sharding = NamedSharding(ns["mesh"], P("data"))
        placed = {n: jax.device_put(ns[n], sharding) for n in ins}
        # Which buffers are shared is the notebook's own state: an earlier `--in x=data` left `x` placed,
        # so `xg = x * 1` made then is placed too, where the replayed plain steps make it on one device.
        # Placing the notebook's arrays (nothing is donated here) tells what jax.jit would be given.
        here = NamedSharding(self.ns["mesh"], P("data"))
        owners = {}
        for n in ins:
            for label, leaf in _paths(n, jax.device_put(self.ns[n], here)):
                for buffer in _buffers(leaf):
                    owners.setdefault(buffer, []).append((label, n in donated))
        for users in owners.values():
            given = [label for label, gives in users if gives]
            if given and len(users) > 1:
                other = next(label for label, _ in users if label != given[0])
                return None, (given[0], other)
        body, final = base._split_final(source)

        def cell(*values):
            local = dict(ns, **dict(zip(ins, values)))
            exec(body, local)
            return {n: local[n] for n in names}, (eval(final, local) if final is not None else None)

        argnums = tuple(i for i, n in enumerate(ins) if n in donated)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Some donated buffers were not usable"
            out, last = jax.jit(cell, donate_argnums=argnums)(*(placed[n] for n in ins))
        deleted = {n: [leaf.is_deleted() for leaf in jax.tree.leaves(placed[n])] for n in ins}
        return {**out, "(final)": last, "(deleted)": deleted}, None

    # --- interrupts -------------------------------------------------------------------------------

    @precondition(lambda self: self.donor == "fresh")
    @rule(pick=st.integers(0, len(base.DONATE_CELLS) - 1), when=st.sampled_from(["run", "compile"]))
    def donate_interrupted(self, pick, when):
        """An interrupt during a --donate xd cell's run or compile."""
        source, names = base.DONATE_CELLS[pick]
        source = "jax.debug.callback(poke, xd)\n" + source  # poke does nothing unless armed
        line = "--mesh mesh --in xd=data --donate xd --no-show"
        base.Found.steps += 1
        base.Found.checks += 1
        kind = f"shard --donate interrupted ({when})"
        base.Found.kinds[kind] = base.Found.kinds.get(kind, 0) + 1
        expected, error = self.oracle_donated(source, names)
        assert error is None, f"plain JAX raised {error!r}{self.context()}"
        self.last = ("shard", line, (source, names), self.oracle_donated)  # rerun_last: run it again, unarmed
        self.session.append(f"%%shard {line}\n{source}\n(interrupted while it {'runs' if when == 'run' else 'compiles'})")
        before = snapshot(self.ns)
        values = np.asarray(self.ns["xd"])
        from jaxpar_magic.stages.run import program

        fired = []

        def interrupting():
            fired.append(1)
            raise KeyboardInterrupt

        saved = program.compile_progress
        if when == "run":
            self.ns["_armed"].append(1)
        else:
            program.compile_progress = interrupting
        raised = final = None
        try:
            with capture_output() as shown:
                final = self.shell.run_cell_magic("shard", line, self.tag + source)
        except KeyboardInterrupt as exc:
            raised = exc
        finally:
            program.compile_progress = saved
            if when == "run":
                fired = [] if self.ns["_armed"] else [1]
                self.ns["_armed"].clear()
        if raised is not None and snapshot(self.ns) == before:
            assert not self.ns["xd"].is_deleted(), f"an interrupted cell left xd deleted{self.context()}"
            np.testing.assert_array_equal(np.asarray(self.ns["xd"]), values, err_msg="xd after the interrupt")
            base.Found.raised += 1
            _tally("interrupt: KeyboardInterrupt, nothing bound")
            return
        _tally("interrupt: bound, then KeyboardInterrupt" if raised is not None else "interrupt: not reached (a replay)")
        if fired:  # the interrupt came once the program had xd: it stops the cell once the results are bound
            assert raised is not None, f"interrupted during the run, the cell raised nothing (swallowed){self.context()}"
            assert NOTE in shown.stdout, (f"interrupted during the run, the cell bound its results without the note; "
                                          f"it printed {shown.stdout!r}{self.context()}")
        else:
            assert raised is None, f"raised {raised!r} with no interrupt{self.context()}"
        self._check_bound(names, expected, "the interrupted cell")
        if raised is None:
            self.compare(final, expected["(final)"], "the interrupted cell's final value")

    def _check_bound(self, names, expected, what: str) -> None:
        """A donating xd cell's results bound as jax.jit(donate_argnums=0) gives them, none deleted, and xd
        deleted where jax.jit deletes it."""
        for name in names:
            self.compare(self.ns[name], expected[name], f"{name} bound by {what}")
            assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(self.ns[name])), \
                f"{name} is bound to a deleted array{self.context()}"
        gone = self.ns["xd"].is_deleted()
        assert gone == expected["(deleted)"], \
            f"xd.is_deleted() is {gone} after --donate, {expected['(deleted)']} after jax.jit{self.context()}"
        if gone:
            self.donor = "donated"

    @precondition(lambda self: self.donor == "fresh")
    @rule(pick=st.integers(0, len(base.DONATE_CELLS) - 1), percent=st.integers(1, 100), show=st.booleans())
    def donate_interrupted_at_a_line(self, pick, percent, show):
        """Kernel -> Interrupt (`_thread.interrupt_main()`) at a line of those our code runs in a
        --donate xd cell (`percent` of the way through them, counted on two runs of the cell on copies
        of xd laid out as xd is, so that the interrupted run takes the counted path: issue 40 item 10):
        either nothing bound and xd whole, or jax.jit's results bound and then the KeyboardInterrupt;
        never a name on a deleted array, never an interrupt swallowed."""
        source, names = base.DONATE_CELLS[pick]
        line = "--mesh mesh --in xd=data --donate xd" + ("" if show else " --no-show")
        base.Found.steps += 1
        base.Found.checks += 1
        expected, error = self.oracle_donated(source, names)
        assert error is None, f"plain JAX raised {error!r}{self.context()}"
        self.last = ("shard", line, (source, names), self.oracle_donated)
        state = dict(self.ns)
        counted = []
        for tracer in (None, package_lines(lambda: counted.append(1))):  # the second run, as the third takes it
            self.ns["xd"] = jnp.copy(state["xd"])
            sys.settrace(tracer)
            try:
                with capture_output():
                    self.shell.run_cell_magic("shard", line, self.tag + source)
            finally:
                sys.settrace(None)
            self.ns.clear()
            self.ns.update(state)
        at = max(1, len(counted) * percent // 100)
        self.session.append(f"%%shard {line}\n{source}\n(interrupted at line {at} of {len(counted)} of ours)")
        before = snapshot(self.ns)
        values = np.asarray(self.ns["xd"])
        lines, raised = [], None

        def at_line():
            lines.append(1)
            if len(lines) == at:
                _thread.interrupt_main()

        try:
            try:
                sys.settrace(package_lines(at_line))
                with capture_output():
                    self.shell.run_cell_magic("shard", line, self.tag + source)
            finally:
                sys.settrace(None)
            settle()
        except KeyboardInterrupt as exc:
            raised = exc
        deleted = [n for n, v in self.ns.items() if isinstance(v, jax.Array) and v.is_deleted() and n != "xd"
                   and before.get(n) != id(v)]  # xd: deleted as jax.jit deletes it (_check_bound)
        assert not deleted, f"{deleted} bound to deleted arrays after an interrupt at line {at}{self.context()}"
        if raised is not None and snapshot(self.ns) == before:
            assert not self.ns["xd"].is_deleted(), f"an interrupted cell left xd deleted{self.context()}"
            np.testing.assert_array_equal(np.asarray(self.ns["xd"]), values, err_msg="xd after the interrupt")
            base.Found.raised += 1
            _tally("interrupt at a line: KeyboardInterrupt, nothing bound")
            return
        if len(lines) >= at:
            assert raised is not None, f"interrupted at line {at}, the cell raised nothing (swallowed){self.context()}"
        _tally("interrupt at a line: bound, then KeyboardInterrupt" if raised is not None
               else "interrupt at a line: the cell ended first (a path shorter than counted)")
        self._check_bound(names, expected, "the interrupted cell")

    @precondition(lambda self: self.donor == "fresh")
    @rule(stop=st.integers(1, 6), twin=st.booleans())
    def donate_loop_interrupted(self, stop, twin):
        """A Python loop of `xd = xd * 2 + 1` --donate cells, interrupted while the program of step
        `stop` runs (issue 40 item 9): it stops there, with that step's result bound, as `stop` calls
        of jax.jit(donate_argnums=0) give it; it ran on through every interrupt."""
        step = ("jaxpar_magic.shard_cell(_loop_cell, globals(), mesh=mesh, in_specs={'xd': ('data',)}, donate=['xd'])"
                if twin else "get_ipython().run_cell_magic('shard', '--mesh mesh --in xd=data --donate xd --no-show', "
                "_loop_cell)")
        base.Found.steps += 1
        base.Found.checks += 1
        _tally(f"loop interrupted ({'shard_cell' if twin else '%%shard'})")
        self.session.append(f"for i in range(20):\n    {step}  # xd = xd * 2 + 1, interrupted in step {stop}")
        ns = self.fresh_namespace()
        placed = jax.device_put(ns["xd"], NamedSharding(ns["mesh"], P("data")))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Some donated buffers were not usable": as the magic's run
            for _ in range(stop):
                placed = jax.jit(lambda v: v * 2 + 1, donate_argnums=0)(placed)
        import jaxpar_magic

        # The step's program calls _counting, which arms `poke` (Kernel -> Interrupt) in step `stop`.
        self.ns.update(jaxpar_magic=jaxpar_magic, _stop=stop, _calls=[],
                       _loop_cell=self.tag + "jax.debug.callback(_counting, xd)\nxd = xd * 2 + 1")
        self.play("def _counting(v):\n    _calls.append(1)\n    if len(_calls) == _stop:\n        _armed.append(1)\n"
                  "        poke(v)\n")
        try:
            with capture_output():
                result = self.shell.run_cell(f"_done = 0\nfor i in range(20):\n    {step}\n    _done += 1",
                                             store_history=False, silent=True)
        finally:
            self.ns["_armed"].clear()
        assert isinstance(result.error_in_exec, KeyboardInterrupt), \
            f"the loop ended with {result.error_in_exec!r}, not stopped by the interrupt{self.context()}"
        assert (self.ns["_done"], len(self.ns["_calls"])) == (stop - 1, stop), \
            f"{self.ns['_done']} steps done, {len(self.ns['_calls'])} run, interrupted in step {stop}{self.context()}"
        assert not self.ns["xd"].is_deleted(), f"the interrupted loop left xd deleted{self.context()}"
        self.compare(self.ns["xd"], placed, f"xd after {stop} steps")
        self.history.append(f"xd = jnp.asarray(np.asarray({np.asarray(placed).tolist()!r}, dtype={str(placed.dtype)!r}))")

    # --- a donated Flax NNX model -----------------------------------------------------------------

    @rule(seed=st.sampled_from([0, 1]))
    def make_model(self, seed):
        """A Linear(4, 4), an SGD optimizer over it, and xm (8, 4) from x. Made in the notebook only:
        the oracle copies the model's state as it is before each model cell."""
        self.model = "ready"
        self.session.append(f"model = nnx.Linear(4, 4, rngs=nnx.Rngs({seed})) ...")
        self.play(LINEAR + f"model = nnx.Linear(4, 4, rngs=nnx.Rngs({seed}))\n"
                  "opt = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)\n"
                  "xm = jnp.tile(jnp.reshape(x, (8, -1)) * 1.0, (1, 4))[:, :4] / 16")

    @precondition(lambda self: self.model == "ready")
    @rule(what=st.sampled_from(list(MODEL_CELLS)), show=st.booleans())
    def donate_model(self, what, show):
        from flax import nnx

        given, source, names = MODEL_CELLS[what]
        line = f"--mesh mesh --in xm=data {given}" + ("" if show else " --no-show")
        base.Found.steps += 1
        base.Found.checks += 1
        kind = f"shard --donate nnx ({what})"
        base.Found.kinds[kind] = base.Found.kinds.get(kind, 0) + 1
        model, opt = self.ns["model"], self.ns["opt"]
        graph, state = nnx.split((model, opt))  # together: the optimizer's state stays the model's
        twin, twin_opt = nnx.merge(graph, jax.tree.map(jnp.copy, state))
        xm = jax.device_put(self.ns["xm"], NamedSharding(self.ns["mesh"], P("data")))

        if what == "reads":
            expected = {"ym": nnx.jit(lambda m, v: m(v) * 2.0, donate_argnums=0)(twin, xm)}
        else:
            @nnx.jit(donate_argnums=(0, 1))
            def train(m, o, v):
                loss, grads = nnx.value_and_grad(lambda mm: jnp.mean(mm(v) ** 2))(m)
                o.update(m, grads)
                return loss

            expected = {"loss": train(twin, twin_opt, xm)}
        self.session.append(f"%%shard {line}\n{source}")
        with capture_output():
            self.shell.run_cell_magic("shard", line, self.tag + source)
        for name in names:
            self.compare(self.ns[name], expected[name], f"{name} bound by the model cell")
        assert self.ns["model"] is model, f"the cell rebound model{self.context()}"
        mine, theirs = jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(twin))
        assert not any(leaf.is_deleted() for leaf in mine), f"the model holds deleted arrays{self.context()}"
        for a, b in zip(mine, theirs):  # bit for bit nnx.jit's state
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), f"model state differs from nnx.jit's{self.context()}"
        self.session.append("ym2 = model(xm)")
        result = self.shell.run_cell("ym2 = model(xm)", store_history=False, silent=True)
        assert result.error_in_exec is None, f"model(xm) raised {result.error_in_exec!r}{self.context()}"
        self.compare(self.ns["ym2"], twin(xm), "model(xm) after the cell")


def test_donations_with_aliases_interrupts_and_models_give_what_jax_jit_gives(jx, capsys):
    base.play_sessions(NotebookDonating, jx, capsys, "differential (donation)", max(4, base.EXAMPLES // 2))
