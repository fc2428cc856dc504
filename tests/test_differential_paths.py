"""The differential sessions of tests/test_differential.py (its Session: one real shell, plain JAX as the
oracle), over the paths issue 40 fixed with example tests only:

- `--out` with inner functions: `%%shard` and `%%shard_map` cells that define a helper inside (a loss
  closing over the batch, differentiated; a lambda; a nested def) bind only their --out names, never
  the temporaries (`loss_fn`, `g`, the lambda), with plain JAX's values; a --plan of them binds the --out
  names' ShapeDtypeStructs only.
- Checks that re-run exercises with side effects: `%%exercise ans` cells that append to a list, move a
  counter, train a Flax NNX model with its optimizer (written back by %%shard), donate their weights
  (`--donate wd`), or run a process; then `check(..., method=[attempt('ans').follows(...)])`, with
  the check's other inputs fresh values or the student's own arrays. After any sequence of them the
  namespace is what plain execution of the student's cells alone gives (the check binds and changes
  nothing, deletes no array); a check's first verdict on a run is right, or says it refused to run the
  cell again (the process).
- Explorer submissions during compiles: `%%shard --plan --explore` on abstract inputs, then view changes
  (`submit`), some while the worker is held (`holding()`: the compile waits), some racing the worker's
  real compiles, some refused. Once it settles its layout is the last valid choice per leaf, its plan
  equals a hand compile of that layout (jax.jit with those NamedShardings: memory_analysis' bytes and
  the collective instructions of the compiled text), and `line()` pasted as a cell plans the same.
- Rebound meshes: `%mesh` or a plain assignment rebinds `mesh` to another shape. The explorer's line
  still plans the layout it showed (it names the mesh by its shape), and cells naming `mesh`, and
  re-runs of them, use the new one: values and result layouts of jax.jit on the mesh as now bound, a
  %%shard_map cell's blocks as that mesh cuts them.

Same budget variables as the base test (JPM_DIFFERENTIAL_EXAMPLES, _STEPS, _RANDOM); half its sequences.
With the sandbox's copies of a donating re-run's inputs taken out, `check(..., follows(wd=wd2))` deleting
the student's `wd2` is found at the CI budget (the fix: face/exercises/sandbox.py); with the --out filter
moved after refuse_hidden, `loss_fn` refused is. A longer run found a layout whose plan had an all-to-all
that jax.jit's compile of it seemed not to: the oracle's pattern missed XLA:CPU's all-to-all, whose result is a
tuple (`(f32[16,1,4], ...) all-to-all(`); the hand compile has it too (the test at the end).
"""
from __future__ import annotations

import collections
import re
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule
from IPython.utils.capture import capture_output
from jax.sharding import NamedSharding, PartitionSpec as P

import test_differential as base
from shell_helpers import snapshot

pytestmark = pytest.mark.slow

nnx = pytest.importorskip("flax.nnx")
pytest.importorskip("optax")

GONE = object()
FILLS = ["arange", "ones", "negative"]
ROWS = [16, 8]
SCALARS = [2.0, -0.0, 1, 0.5]
# The meshes `mesh` is rebound to: (sizes, axis names). Auto axes, as the base's.
MESHES = [((8,), ("data",)), ((4, 2), ("data", "model")), ((2, 4), ("data", "model"))]

# (a) --out with inner functions: (magic, --out, cell, the names --out binds, the temporaries).
OUT_CELLS = [
    ("shard", "loss", "def loss_fn(v):\n    return jnp.mean((xb @ v) ** 2) * sg\nloss, g = jax.value_and_grad(loss_fn)(w)",
     ("loss",), ("loss_fn", "g")),
    ("shard", "loss g", "def loss_fn(v):\n    return jnp.mean((xb @ v) ** 2) * sg\nloss, g = jax.value_and_grad(loss_fn)(w)",
     ("loss", "g"), ("loss_fn",)),
    ("shard", "total", "scale = lambda v: v * sg\nyb = scale(xb)\ntotal = jnp.sum(yb)", ("total",), ("scale", "yb")),
    ("shard", "yb", "def f(v):\n    def inner(u):\n        return u + sg\n    return inner(v) * 2\nyb = f(xb)", ("yb",),
     ("f",)),
    ("shard_map", "yb=data", "def centred(v):\n    return v - jnp.mean(v) + sg\nyb = centred(xb)\nm = jnp.mean(xb)",
     ("yb",), ("centred", "m")),
]
# (d) a cell naming `mesh`: its result's layout is the mesh's as bound now.
MESH_CELL = "yb = xb * 2 + sg\ns = jnp.sum(yb)"

# (b) exercise cells: (the cell below `%%exercise ans`, the same as plain Python for the oracle, the check's
# follows(...) for each way of giving its other inputs). `DELETED` in the plain form: jax.jit's donation. No
# check reads a donated array itself: JAX 0.10 ends the process on one (`x - 1` after jax.jit donated x, once
# that subtraction ran on live arrays of the same layout: its fast path executes the deleted buffer).
STUDENT = ("log = []\nclass Stats:\n    pass\nstats = Stats()\nstats.runs = 0\ncounts = {{'runs': 0}}\n"
           "xx = jnp.arange(32.0).reshape(8, 4)\nwd = jnp.ones((8, 4))\n"
           "model = nnx.Linear(4, 2, rngs=nnx.Rngs({seed}))\nopt = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)\n")
TRAIN = "ans, grads = nnx.value_and_grad(lambda m: jnp.mean((m(xb) - sg) ** 2))(model)\nopt.update(model, grads)"
EXERCISES = {
    "log": ("log.append(float(xb[1, 0]))\nstats.runs += 1\ncounts['runs'] += 1\nans = xb * 2",
            "log.append(float(xb[1, 0]))\nstats.runs += 1\ncounts['runs'] += 1\nans = xb * 2",
            {"fresh": "follows(xb * 0 + 10, xb=xb * 0 + 5)", "student's": "follows(xx[:, :1] * 2, xb=xx[:, :1])",
             "none": "follows(xb * 2)"}),
    "nnx": (f"%%shard --mesh mesh --in xb=data --out ans --no-show\n{TRAIN}", f"{TRAIN}\ndel grads",
            {"fresh": "follows(jnp.mean((model(xb * 2) - sg) ** 2), xb=xb * 2)",
             "student's": "follows(jnp.mean((model(xx) - sg) ** 2), xb=xx)",
             "none": "follows(jnp.mean((model(xb) - sg) ** 2))"}),
    "donate": ("%%shard --mesh mesh --in wd=data xx=data --donate wd --out ans --no-show\nans = wd - 0.1 * xx",
               "ans = wd - 0.1 * xx\nwd = DELETED",
               {"fresh": "follows(wd2 - 0.2 * xx, wd=wd2 * 1, xx=xx * 2)",
                "student's": "follows(wd2 - 0.2 * xx, wd=wd2, xx=xx * 2)", "none": "follows(wd2 - 0.2 * xx, xx=xx * 2)"}),
    "donate a dict": ("%%shard --mesh mesh --in pd=data xx=data --donate pd --out ans --no-show\nans = pd['w'] - 0.1 * xx",
                      "ans = pd['w'] - 0.1 * xx\npd = {'w': DELETED}",
                      {"fresh": "follows(wd2 - 0.2 * xx, pd={'w': wd2 * 1}, xx=xx * 2)",
                       "student's": "follows(wd2 - 0.2 * xx, pd={'w': wd2}, xx=xx * 2)",
                       "none": "follows(wd2 - 0.2 * xx, xx=xx * 2)"}),
    "process": ("os.system('true')\nans = xb * 2", "ans = xb * 2", {"fresh": "follows(xb * 4, xb=xb * 2)",
                                                                     "student's": "follows(xx * 2, xb=xx)",
                                                                     "none": "follows(xb * 2)"}),
}
RIGHT = "✓ right"
REFUSED = "✗ not yet: this check runs the exercise cell again, and the cell runs `os.system`, which a re-run could not undo"

# (c) the explorer's cell, on abstract inputs of distinct shapes (each leaf its own control).
EXPLORED = "h = jnp.tanh(xs @ params['w1'])\ny = h @ params['w2']"
ABSTRACT = ("xs = jax.ShapeDtypeStruct((64, 128), jnp.float32)\n"
            "params = {'w1': jax.ShapeDtypeStruct((128, 32), jnp.float32), 'w2': jax.ShapeDtypeStruct((32, 16), jnp.float32)}")
LEAVES = ["xs", "params['w1']", "params['w2']"]
CHOICES = ["xs", "params['w1']", "params['w2']", "params"]  # "params": every leaf of it
# A change: (which of CHOICES, which spec of _specs_over(mesh axes), or 7: one axis twice, refused).
CHANGE = st.tuples(st.integers(0, len(CHOICES) - 1), st.integers(0, 7))
# An instruction's result type is one word, or a tuple with spaces (XLA:CPU's all-to-all returns one per peer).
COLLECTIVE = re.compile(r"= (?:\([^)]*\)|\S+) (all-reduce|all-gather|reduce-scatter|collective-permute|all-to-all)"
                        r"(?:-start)?\(")


class Deleted:
    """The oracle's stand-in for an array jax.jit's donation deleted."""

    def __repr__(self) -> str:
        return "<deleted by the donation>"


def _tally(kind: str) -> None:
    base.Found.kinds[kind] = base.Found.kinds.get(kind, 0) + 1


def _mesh_source(sizes, names) -> str:
    return (f"mesh = jax.make_mesh({sizes!r}, {names!r}, "
            f"axis_types=(jax.sharding.AxisType.Auto,) * {len(names)})")


def _spec(entries) -> P:
    """[[axes], ...] (the view's form) as a PartitionSpec."""
    return P(*[None if not axes else axes[0] if len(axes) == 1 else tuple(axes) for axes in entries])


def _specs_over(axes) -> list:
    """The specs a view offers for a 2-d leaf over mesh axes `axes`: each dimension whole or over one axis."""
    found = [[[], []]]
    for a in axes:
        found += [[[a], []], [[], [a]]]
    for a in axes:
        found += [[[a], [b]] for b in axes if b != a]
    return found


class NotebookPaths(base.Session):
    """A session of the four paths: see the module docstring."""

    def __init__(self):
        super().__init__()
        from jaxpar_magic.face import checks, exercises

        exercises.forget_all()
        checks._failures.clear()
        self.play("import os\nimport optax\nfrom flax import nnx\nfrom jaxpar_magic import attempt, check")
        self.history.append("import os\nimport optax\nfrom flax import nnx")
        self.mesh = ((8,), ("data",))  # as `mesh` is bound now
        self.exercise = None  # (kind, graded?) of the last exercise cell run
        self.explorer = None  # {"mesh": (sizes, names), "out": bool, "model": {leaf: spec}}
        self.holds: list = []
        self.stale: set = set()  # the donating exercises whose weights are deleted
        self.arming = threading.Lock()
        self.armed: list = []  # stop_after_a_plan's [generation, event] while armed

    def fresh_namespace(self) -> dict:
        ns: dict = {"DELETED": self.deleted}  # the donating exercises' plain form names it
        for source in self.history:
            exec(source, ns)
        return ns

    deleted = Deleted()

    @initialize(rows=st.sampled_from(ROWS), fill=st.sampled_from(FILLS), k=st.sampled_from([1, 2]),
                sg=st.sampled_from(SCALARS), seed=st.sampled_from([0, 1]), out=st.booleans())
    def start(self, rows, fill, k, sg, seed, out):
        """The inputs, the student's objects, and an explorer from the start (the rules are many)."""
        self.change_input("batch", rows, fill, k, sg)
        self.change_input("w", rows, fill, k, sg)
        self.change_input("sg", rows, fill, k, sg)
        self.plain_step(STUDENT.format(seed=seed) + "wd2 = jax.device_put(jnp.ones((8, 4)) * 3, "
                        "jax.NamedSharding(mesh, jax.P('data')))\npd = {'w': jnp.ones((8, 4))}")
        self.explore(out)

    # --- plain steps ------------------------------------------------------------------------------

    @rule(what=st.sampled_from(["batch", "w", "sg", "weights"]), rows=st.sampled_from(ROWS), fill=st.sampled_from(FILLS),
          k=st.sampled_from([1, 2]), sg=st.sampled_from(SCALARS))
    def change_input(self, what, rows, fill, k, sg):
        """The batch `xb`, the weights `w`, the global `sg`, or the student's next weights `wd`, `pd` (a
        --donate exercise deleted the last ones)."""
        if what == "batch":
            values = base._values((rows, 4), "float32", fill).tolist()
            self.plain_step(f"xb = jnp.asarray(np.array({values!r}, dtype='float32'))")
        elif what == "w":
            self.plain_step(f"w = jnp.arange(8.0).reshape(4, 2) / {k}")
        elif what == "sg":
            self.plain_step(f"sg = {sg!r}")
        else:
            self.stale = set()
            self.plain_step(f"wd = jnp.ones((8, 4)) * {k}\npd = {{'w': jnp.ones((8, 4)) * {k}}}")

    @rule(pick=st.integers(0, len(MESHES) - 1), magic=st.booleans(), again=st.sampled_from([None, False, True]))
    def rebind_mesh(self, pick, magic, again):
        """(d) `%mesh data=4 model=2 --axis-types auto` or the plain assignment: `mesh` is another mesh; the
        student's `wd2` laid out on it, and maybe a new explorer over it (`again`: its --out y or not)."""
        self.bind_mesh(pick, magic)
        self.plain_step("wd2 = jax.device_put(wd2, jax.NamedSharding(mesh, jax.P('data')))")
        if again is not None:
            self.explore(again)

    def bind_mesh(self, pick, magic):
        sizes, names = MESHES[pick]
        source = _mesh_source(sizes, names)
        base.Found.steps += 1
        self.history.append(source)
        self.mesh = (sizes, names)
        if magic:
            line = " ".join(f"{n}={s}" for n, s in zip(names, sizes)) + " --axis-types auto --no-show"
            self.session.append(f"%mesh {line}")
            with capture_output():
                self.shell.run_line_magic("mesh", line)
        else:
            self.session.append(source)
            self.play(source)

    # --- (a) --out with inner functions, (d) cells naming the mesh --------------------------------

    @rule(pick=st.integers(0, len(OUT_CELLS)), plan=st.booleans(), show=st.booleans())
    def out_cell(self, pick, plan, show):
        """(a) a --out cell of OUT_CELLS, or (d) past their end, the cell naming `mesh`."""
        if pick == len(OUT_CELLS):
            return self.mesh_cell(show)
        magic, out, source, names, temporaries = OUT_CELLS[pick]
        line = f"--mesh mesh --in xb=data --out {out}" + (" --plan" if plan else "") + ("" if show else " --no-show")
        oracle = self.oracle_blocks if magic == "shard_map" else self.oracle_whole
        _tally(f"(a) {magic} --out{' --plan' if plan else ''}")
        before = dict(self.ns)
        if plan:
            self.check_plan(magic, line, (source, names), oracle)
        else:
            self.check(magic, line, (source, names), oracle)
        self.assert_left_alone(before, temporaries, f"%%{magic} {line}")

    def mesh_cell(self, show):
        """(d) A cell naming `mesh`: jax.jit's values and result layout on the mesh as bound now."""
        line = "--mesh mesh --in xb=data" + ("" if show else " --no-show")
        _tally("(d) %%shard --mesh mesh")
        self.check("shard", line, (MESH_CELL, ("yb", "s")), self.oracle_whole)
        self.assert_laid_out_on_mesh("yb")

    @precondition(lambda self: self.last is not None)
    @rule()
    def rerun_last(self):
        """The same cell again, after whatever changed (the mesh rebound, the batch, sg)."""
        magic, line, cell = self.last[:3]
        _tally("(d) re-run")
        self.check(*self.last)
        if cell[0] == MESH_CELL:
            self.assert_laid_out_on_mesh("yb")

    def assert_left_alone(self, before: dict, temporaries, where: str) -> None:
        """--out binds its names only: each temporary holds what it held before the cell (or nothing)."""
        for name in temporaries:
            if self.ns.get(name, GONE) is not before.get(name, GONE):
                raise AssertionError(f"{where} bound the temporary `{name}`, which --out leaves out{self.context()}")

    def assert_laid_out_on_mesh(self, name: str) -> None:
        ns = self.fresh_namespace()
        mesh = ns["mesh"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = jax.jit(lambda v: v * 2 + ns["sg"], in_shardings=NamedSharding(mesh, P("data")))(ns["xb"])
        got = self.ns[name].sharding
        assert dict(got.mesh.shape) == dict(mesh.shape), \
            f"{name} is laid out on a mesh of {dict(got.mesh.shape)}, `mesh` is now {dict(mesh.shape)}{self.context()}"
        assert got.is_equivalent_to(expected.sharding, expected.ndim), \
            f"{name}'s layout {got}, jax.jit's on the mesh as bound now {expected.sharding}{self.context()}"

    def oracle_blocks(self, source: str, names, mapped: str = "xb"):
        """%%shard_map --in xb=data --out yb=data: the cell once per block of rows, as the mesh bound now
        cuts them (its 'data' axis), the blocks' results concatenated."""
        ns = self.fresh_namespace()
        x, blocks = ns[mapped], ns["mesh"].shape["data"]
        if x.shape[0] % blocks:
            return None, ValueError("rows that the data axis does not divide")
        rows = x.shape[0] // blocks
        runs = []
        try:
            for i in range(blocks):
                mine = dict(ns, **{mapped: x[i * rows:(i + 1) * rows]})
                final = base._run_plain(source, mine)
                runs.append({**{n: mine[n] for n in names}, "(final)": final})
        except Exception as exc:  # noqa: BLE001
            return None, exc
        return {key: base._stacked([run[key] for run in runs], np.concatenate) for key in runs[0]}, None

    # --- (b) checks that re-run exercises with side effects ---------------------------------------

    @rule(kind=st.sampled_from(list(EXERCISES)))
    def exercise_cell(self, kind):
        cell, plain, _ = EXERCISES[kind]
        if kind in self.stale:  # its weights were donated: a run would read a deleted array (the base test's path)
            self.change_input("weights", 8, "ones", 2, 1)
        if kind.startswith("donate"):
            self.stale.add(kind)
        base.Found.steps += 1
        _tally(f"(b) exercise {kind}")
        self.history.append(plain)
        self.session.append(f"%%exercise ans\n{cell}")
        first, _, rest = cell.partition("\n")  # the session's tag below a magic's line, as the cell's first line
        tagged = f"{first}\n{self.tag}{rest}" if first.startswith("%%") else self.tag + cell
        with capture_output() as shown:
            result = self.shell.run_cell(f"%%exercise ans\n{tagged}", store_history=False)
        assert result.success, f"the exercise cell failed: {result.error_in_exec!r} {shown.stdout}{self.context()}"
        self.exercise = (kind, False)
        self.assert_as_plain("after the exercise cell")

    @rule(kind=st.sampled_from(list(EXERCISES)), inputs=st.sampled_from(["fresh", "student's", "none"]))
    def exercise_then_check(self, kind, inputs):
        """The two cells in a row (the rules also come apart, with other cells between)."""
        self.exercise_cell(kind)
        self.check_exercise(inputs)

    @precondition(lambda self: self.exercise is not None)
    @rule(inputs=st.sampled_from(["fresh", "student's", "none"]))
    def check_exercise(self, inputs):
        """The check re-runs the cell on other inputs; the namespace is as plain execution of the student's
        cells leaves it, and the check binds nothing."""
        kind, graded = self.exercise
        self.exercise = (kind, True)
        base.Found.steps += 1
        base.Found.checks += 1
        follows = EXERCISES[kind][2][inputs]
        expected = self.fresh_namespace()["ans"]
        source = f"check(attempt('ans')['ans'], _want, method=[attempt('ans').{follows}], hint='h')"
        self.session.append(f"{source}  # _want: plain JAX's ans")
        self.ns["_want"] = expected
        before = snapshot(self.ns)
        with capture_output() as shown:
            result = self.shell.run_cell(source, store_history=False)
        del self.ns["_want"]
        assert result.success, f"the check raised {result.error_in_exec!r}{self.context()}"
        after = snapshot(self.ns)
        changed = sorted(n for n in set(before) | set(after) if not n.startswith("_") and before.get(n) != after.get(n))
        assert not changed, f"the check bound or rebound {changed}{self.context()}"
        self.assert_as_plain("after the check")
        said = [line for line in shown.stdout.splitlines() if line.startswith(("✓", "✗"))]
        assert len(said) == 1, f"the check said {shown.stdout!r}{self.context()}"
        verdict = "refused" if said[0].startswith(REFUSED) else "right" if said[0] == RIGHT else "not right"
        _tally(f"(b) check {kind}, inputs {inputs}: {verdict}")
        if kind == "process":
            assert verdict == "refused" or graded, f"the check re-ran a cell that runs a process: {said[0]!r}{self.context()}"
        elif not graded and not (kind.startswith("donate") and inputs == "none"):
            assert verdict == "right", f"the first check of a right answer said {said[0]!r}{self.context()}"

    def assert_as_plain(self, when: str) -> None:
        """Every name the student's cells bind, as their plain execution leaves it."""
        plain = self.fresh_namespace()
        for name, value in plain.items():
            if name.startswith("_") or name in ("DELETED", "mesh") or callable(value) and not _is_nnx(value) \
                    or type(value).__name__ == "module":
                continue
            if name not in self.ns:
                raise AssertionError(f"{when}: `{name}` is gone, plain execution binds it{self.context()}")
            try:
                _assert_like(self.ns[name], value, name)
            except AssertionError as exc:
                raise AssertionError(f"{when}: {exc}{self.context()}") from None

    # --- (c) explorer submissions during compiles, (d) its line after a rebound mesh ---------------

    def explore(self, out):
        self.release_all()
        base.Found.steps += 1
        self.plain_step(ABSTRACT)
        line = "--plan --explore --mesh mesh --in xs=data,None" + (" --out y" if out else "")
        self.session.append(f"%%shard {line}\n{EXPLORED}")
        with capture_output():
            self.shell.run_cell_magic("shard", line, self.tag + EXPLORED)
        ex = self.ns["_explorer"]
        labels = [leaf.label for leaf in ex.leaves]
        assert labels == LEAVES, labels
        model = dict(zip(labels, ex.layout.specs))
        assert model == {"xs": (("data",), ()), "params['w1']": ((), ()), "params['w2']": ((), ())}, model
        self.explorer = {"mesh": self.mesh, "out": out, "model": model, "ex": ex}
        ex.observe(self.stop_after_a_plan)
        _tally("(c) explore")

    def stop_after_a_plan(self, state) -> None:
        """Armed (`self.armed`: the generation then, and an event), the worker stops as the next plan ends,
        before it plans the layout waiting (a hold taken on its own thread, let go when the explorer settles)."""
        with self.arming:
            if self.armed and (state["generation"] > self.armed[0] or not state["status"]["busy"]):
                self.holds.append(self.explorer["ex"].holding())
                self.armed.pop().set()
                self.armed.clear()

    def explorer_hold(self):
        self.holds.append(self.explorer["ex"].holding())
        self.session.append(f"_held{len(self.holds)} = _explorer.holding()")

    def explorer_release(self):
        self.session.append(f"_held{len(self.holds)}.release()")
        self.holds.pop().release()

    @precondition(lambda self: self.explorer is not None)
    @rule(change=CHANGE, hold=st.sampled_from(["before", "after", "release after", None]))
    def explorer_change(self, change, hold):
        """A view change, maybe with a hold taken before it or after it (held across later steps: the
        changes made meanwhile wait, as during a long compile), or the last hold let go after it."""
        if hold == "before" and len(self.holds) < 2:
            self.explorer_hold()
        self.explorer_submit(*change)
        if hold == "after" and len(self.holds) < 2:
            self.explorer_hold()
        if hold == "release after" and self.holds:
            self.explorer_release()

    def explorer_submit(self, pick, layout):
        """A view change: leaf (or input) CHOICES[pick] laid out by one of the mesh's specs (`layout` 7: one
        axis on both dimensions, refused at once, nothing queued)."""
        ex, explorer = self.explorer["ex"], self.explorer
        specs = _specs_over(explorer["mesh"][1])
        spec = specs[layout % len(specs)] if layout < 7 else [[explorer["mesh"][1][0]]] * 2
        name = CHOICES[pick]
        base.Found.steps += 1
        self.session.append(f"_explorer.submit({{'kind': 'choose', 'name': {name!r}, 'spec': {spec!r}}})")
        ex.submit({"kind": "choose", "name": name, "spec": spec})
        if layout == 7:
            _tally("(c) submit refused")
            return
        _tally("(c) submit" + (" while held" if self.holds else ""))
        for label in LEAVES:
            if label == name or label.startswith(name + "["):
                explorer["model"][label] = tuple(tuple(axes) for axes in spec)

    @precondition(lambda self: self.explorer is not None)
    @rule(held=st.lists(CHANGE,
                        min_size=1, max_size=3),
          racing=st.lists(CHANGE,
                          max_size=3), stop=st.booleans())
    def explorer_burst(self, held, racing, stop):
        """Changes while a compile waits; the compile let go; then (`stop`) the worker stopped as that plan
        ends, before the next layout's; changes then, or racing the compiles; then settled."""
        ex = self.explorer["ex"]
        self.explorer_hold()
        for change in held:
            self.explorer_submit(*change)
        ended = threading.Event()
        with self.arming:
            self.armed[:] = [ex.generation, ended] if stop else []
        in_flight = not ex.wait(0)
        self.release_all()  # this hold and any a change took before
        if stop and in_flight:
            assert ended.wait(120), f"no plan ended{self.context()}"
            self.session.append("(the worker stopped as that plan ended)")
            _tally("(c) burst: changes while the next plan waits")
        with self.arming:
            self.armed.clear()
        for change in racing:
            self.explorer_submit(*change)
        self.explorer_settles()

    @precondition(lambda self: self.explorer is not None)
    @rule()
    def explorer_settles(self):
        """Let go, wait: the last choice per leaf, the plan of a hand compile, the line planning the same."""
        self.release_all()
        ex, explorer = self.explorer["ex"], self.explorer
        base.Found.steps += 1
        base.Found.checks += 1
        self.session.append("_explorer.wait(); _explorer.layout, _explorer.plan, _explorer.line()")
        assert ex.wait(120), f"the explorer never settled{self.context()}"
        got = dict(zip(LEAVES, ex.layout.specs))
        assert got == explorer["model"], f"the explorer's layout {got}, the last choices {explorer['model']}{self.context()}"
        mine = _figures(ex.plan)
        hand = _hand_compile(explorer, self.fresh_namespace())
        assert mine == hand, f"the explorer's plan {mine}, jax.jit's compile of its layout {hand}{self.context()}"
        rebound = self.mesh != explorer["mesh"]
        _tally("(c) settled" + (", `mesh` rebound since" if rebound else ""))
        pasted = self.planned_as_cell(ex.line())
        assert pasted == _figures(ex.plan), (f"`{ex.line()}` pasted plans {pasted}, the explorer showed {mine}"
                                f"{' (`mesh` rebound since)' if rebound else ''}{self.context()}")

    def release_all(self) -> None:
        while self.holds:
            self.holds.pop().release()

    def planned_as_cell(self, line: str) -> dict:
        from jaxpar_magic.stages.plan import compiled_plans

        assert line.startswith("%%shard ") and "--mesh mesh" not in line, line
        compiled_plans.forget()  # the pasted line compiles its own
        self.session.append(f"{line}\n{EXPLORED}")
        with capture_output():
            self.shell.run_cell_magic("shard", line[len("%%shard "):] + " --no-show", self.tag + EXPLORED)
        return _figures(self.ns["_plan"])

    def teardown(self):
        self.release_all()


def _hand_compile(explorer, ns: dict) -> dict:
    """jax.jit of the explored cell with the layout's NamedShardings, compiled for a mesh of its shape (the
    inputs' ShapeDtypeStructs from `ns`)."""
    sizes, names = explorer["mesh"]
    mesh = jax.make_mesh(sizes, names, axis_types=(jax.sharding.AxisType.Auto,) * len(names))
    spec = {label: NamedSharding(mesh, _spec(entries)) for label, entries in explorer["model"].items()}

    def step(xs, params):
        h = jnp.tanh(xs @ params["w1"])
        y = h @ params["w2"]
        return y if explorer["out"] else (h, y)

    compiled = jax.jit(step, in_shardings=(spec["xs"], {"w1": spec["params['w1']"], "w2": spec["params['w2']"]})) \
        .lower(ns["xs"], ns["params"]).compile()
    memory = compiled.memory_analysis()
    return {"bytes": (memory.argument_size_in_bytes, memory.output_size_in_bytes, memory.temp_size_in_bytes,
                      memory.alias_size_in_bytes),
            "collectives": dict(collections.Counter(COLLECTIVE.findall(compiled.as_text())))}


def _figures(plan) -> dict:
    """What a plan says of memory and collectives, as jax.jit's compile says it (an all-reduce that XLA:CPU
    slices is counted as the all-reduce its text holds)."""
    found = collections.Counter()
    for c in plan.collectives:
        found[c.sliced_from or c.op] += c.count or 0
    return {"bytes": (plan.argument_bytes, plan.output_bytes, plan.temp_bytes, plan.alias_bytes),
            "collectives": dict(found)}


def _is_nnx(value) -> bool:
    return isinstance(value, (nnx.Module, nnx.Optimizer))


def _assert_like(actual, expected, where: str) -> None:
    """The notebook's value against plain execution's: arrays to float32's rounding (a compiled, sharded step
    sums in another order), containers item by item, NNX objects by their state, notebook objects by attributes."""
    if isinstance(expected, Deleted):
        assert isinstance(actual, jax.Array) and actual.is_deleted(), \
            f"{where}: {actual!r}, where jax.jit's donation deleted it"
    elif isinstance(expected, (jax.Array, np.ndarray)):
        assert isinstance(actual, type(expected)) or isinstance(actual, jax.Array), f"{where}: {type(actual).__name__}"
        assert not (isinstance(actual, jax.Array) and actual.is_deleted()), f"{where} was deleted"
        assert (actual.shape, actual.dtype) == (expected.shape, expected.dtype), \
            f"{where}: {actual.dtype}{actual.shape}, plain {expected.dtype}{expected.shape}"
        np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=1e-5, atol=1e-6, err_msg=where)
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), f"{where}: {actual!r}, plain {expected!r}"
        for key in expected:
            _assert_like(actual[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected), f"{where}: {actual!r}, plain {expected!r}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            _assert_like(a, e, f"{where}[{i}]")
    elif _is_nnx(expected):
        mine, plain = jax.tree.leaves(nnx.state(actual)), jax.tree.leaves(nnx.state(expected))
        assert len(mine) == len(plain), f"{where}: {len(mine)} state leaves, plain {len(plain)}"
        for i, (a, e) in enumerate(zip(mine, plain)):
            _assert_like(a, e, f"{where}'s state leaf {i}")
    elif isinstance(expected, (int, float, str, type(None), jax.ShapeDtypeStruct)):
        assert actual == expected and type(actual) is type(expected), f"{where}: {actual!r}, plain {expected!r}"
    else:  # an object of a class the notebook defined (a counter)
        assert type(actual).__name__ == type(expected).__name__, f"{where}: {type(actual).__name__}"
        assert vars(actual).keys() == vars(expected).keys(), f"{where}: {vars(actual)}, plain {vars(expected)}"
        for key, value in vars(expected).items():
            _assert_like(vars(actual)[key], value, f"{where}.{key}")


def test_out_cells_exercise_checks_explorers_and_rebound_meshes_give_what_plain_jax_gives(jx, capsys, tmp_path,
                                                                                          monkeypatch):
    from jaxpar_magic.face import checks, exercises

    monkeypatch.chdir(tmp_path)  # the notebook's folder: a check keeps the files under it
    try:
        base.play_sessions(NotebookPaths, jx, capsys, "differential (paths)", max(4, base.EXAMPLES // 2))
    finally:
        exercises.forget_all()
        checks._failures.clear()


def test_the_explorers_plan_of_rows_cut_weights_has_jax_jits_collectives(jx):
    """The shrunk case of a long run: xs whole, both weights' rows over data=8. The plan says an all-to-all and an
    all-reduce, and so does jax.jit's compile with the same in_shardings: the oracle's pattern had missed the
    all-to-all, whose result is a tuple. Kept: the one layout where the two patterns differ."""
    jx.run_cell(_mesh_source((8,), ("data",)) + "\n" + ABSTRACT)
    with capture_output():
        jx.run_cell_magic("shard", "--plan --explore --mesh mesh --in xs=data,None", EXPLORED)
    ex = jx.user_ns["_explorer"]
    ex.choose("xs", P(None, None))
    ex.choose("params", P("data", None))
    layout = {"xs": ((), ()), "params['w1']": (("data",), ()), "params['w2']": (("data",), ())}
    assert _figures(ex.plan) == _hand_compile({"mesh": ((8,), ("data",)), "out": False, "model": layout}, jx.user_ns)
