"""The layout explorer (`%%shard --plan --explore`, `explore_cell(...)`): one %%shard cell planned
under the layouts you try, each exactly as `%%shard --plan` with its line would plan it (every
layout is one `plan_cell`), kept by layout so a layout tried before comes back at once.

The synchronous API (choose, reshape, retarget) plans on the caller's thread and raises a
UsageError for a wrong choice; `submit` (what the view sends) plans on a worker thread
(stages/explore/worker.py), coalescing changes made while a compile runs. Either way a refused
layout leaves the current plan as it was and says why in `message`. The explorer reads a snapshot of
the namespace taken when it was made and never writes to it.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, replace

from ...errors import UsageError
from . import controls
from .controls import Layout, format_spec


@dataclass
class Row:
    """One tried layout and its plan."""

    layout: Layout
    line: str
    plan: object  # plan.Plan

    @property
    def peak_bytes(self) -> int:
        return int(self.plan.total_bytes)

    @property
    def fits(self) -> bool | None:
        return self.plan.fits

    @property
    def collective_bytes(self) -> int:
        return sum(c.bytes * c.calls for c in self.plan.collectives if c.group_size > 1)

    @property
    def estimate_s(self) -> float | None:
        r = self.plan.roofline
        return r.estimate_s if r is not None else None

    def rank_key(self) -> tuple:
        """As --compare ranks: layouts that fit first, then by estimate where there is one, else by peak."""
        estimate = self.estimate_s
        return (0 if self.fits is not False else 1, estimate if estimate is not None else float(self.peak_bytes))


class Hold:
    """`Explorer.holding()`: the worker's plans wait until `release()` (or the end of a `with` block)."""

    def __init__(self, worker):
        self._worker, self._held = worker, True
        worker.hold()

    def release(self) -> None:
        if self._held:
            self._held = False
            self._worker.release()

    def __enter__(self) -> "Hold":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class Explorer:
    """Plans of one %%shard cell under the layouts you try. See the module docstring and README."""

    def __init__(self, source: str, namespace: dict, *, mesh=None, in_specs=None, out_specs=None, hardware=None,
                 topology: str | None = None, device_memory=None, donate=(), compiler: str = "auto", outputs=None):
        import jax

        from ...engines.shard import is_mesh, resolve_mesh
        from ..plan.hardware import Hardware, parse_hardware, parse_memory_size
        from ..plan.plan_cell import engine_spec

        self.source = source
        self._namespace = dict(namespace)  # a snapshot: later cells do not move the explorer, nor it them
        in_specs = {n: engine_spec(s) for n, s in (in_specs or {}).items()}
        self._out_specs = {n: engine_spec(s) for n, s in (out_specs or {}).items()}
        self.mesh = mesh if is_mesh(mesh) else resolve_mesh(mesh, namespace, [in_specs, self._out_specs])
        self.abstract = isinstance(self.mesh, jax.sharding.AbstractMesh)  # planned for a --topology by XLA:TPU
        self.leaves, specs = controls.cell_leaves(source, self._namespace, in_specs, self.mesh)
        if isinstance(hardware, str):
            hardware = parse_hardware(hardware)
        elif hardware is not None and not isinstance(hardware, Hardware):
            raise UsageError(f"explore_cell(hardware={hardware!r}): give a profile name such as \"tpu-v5e\".")
        topology = topology or (hardware.topology if hardware is not None else None)
        self._profiles = {hardware.name: replace(hardware, topology=None)} if hardware is not None else {}
        self.device_memory = parse_memory_size(device_memory) if isinstance(device_memory, str) else device_memory
        self.donate, self.compiler = tuple(donate), compiler
        self.outputs = tuple(outputs) if outputs is not None else None  # --out's names: what the cell returns
        shape = controls.MeshShape(tuple(str(n) for n in self.mesh.axis_names),
                                   tuple(int(self.mesh.shape[n]) for n in self.mesh.axis_names))
        self.devices = shape.size  # every layout's mesh has these devices (or, abstract, this many)
        self._first = Layout(shape, controls.axis_type_names(self.mesh), tuple(specs),
                             hardware.name if hardware is not None else None, topology)
        self._cache: dict[Layout, Row] = {}
        self._refused: dict[Layout, str] = {}
        self._order: list[Layout] = []  # tried layouts, in the order they were first planned
        self._lock = threading.RLock()  # the explorer's fields
        self._planning = threading.Lock()  # one plan at a time (the kept compiles are not shared across threads)
        self._listeners: list = []
        self._notifying = threading.Lock()
        self.compiles = 0
        self.generation = 0
        self.message: str | None = None
        self.previous: Row | None = None
        self.current: Row | None = None
        self.intended = self._first  # the layout the last change asked for (the worker plans towards it)
        from .worker import Worker

        self._worker = Worker(self)
        self._make_current(self._plan(self._first))

    # --- the synchronous API --------------------------------------------------------------------
    @property
    def plan(self):
        """The current Plan."""
        return self.current.plan

    @property
    def layout(self) -> Layout:
        return self.current.layout

    def choose(self, name: str, spec):
        """Cut input `name` (every leaf) or one leaf (`"params['w1']"`) by `spec`; the new Plan."""
        return self._go(lambda: self.choosing(self.layout, name, spec))

    def reshape(self, shape, axis_types: str | None = None):
        """The mesh as `shape` (`"data=16,model=4"`, --mesh syntax) over the same devices; the new Plan."""
        return self._go(lambda: self.reshaping(self.layout, shape, axis_types))

    def retarget(self, hardware: str | None = None, topology: str | None = None):
        """Another profile (`"tpu-v5p"`) or slice (`"4x8"`), where the cell gave a target; the new Plan."""
        return self._go(lambda: self.retargeting(self.layout, hardware, topology))

    def restore(self, line: str):
        """Go back to a tried layout by its line (a tried row's `.line`); its Plan, from the cache."""
        return self._go(lambda: self.restoring(line))

    @property
    def tried(self) -> list[Row]:
        """Every layout tried, best first (as --compare ranks)."""
        with self._lock:
            rows = [self._cache[layout] for layout in self._order]
        return sorted(rows, key=Row.rank_key)

    def best(self) -> Row:
        return self.tried[0]

    def line(self, layout: Layout | None = None) -> str:
        """The `%%shard --plan ...` line that plans the current layout (or `layout`) as a cell."""
        return self._line(layout or self.layout)[0]

    def line_names(self, layout: Layout | None = None) -> dict:
        """What the line names that a line cannot spell (a pytree's per-leaf specs `@params_specs`, a mesh
        with other axis types): bind these in the namespace before running the line."""
        return self._line(layout or self.layout)[1]

    def observe(self, callback) -> None:
        """Call `callback(self.state())` after every change (a new plan, a message, the status line)."""
        with self._lock:
            self._listeners.append(callback)

    def submit(self, change: dict) -> None:
        """Apply a change from the view ({"kind": "choose" | "reshape" | "retarget" | "restore", ...}) on
        a worker thread; returns at once (see explore_worker.py)."""
        self._worker.submit(change)

    def wait(self, timeout: float | None = None) -> bool:
        """Until no submitted change is pending or planning (True), or `timeout` seconds (False)."""
        return self._worker.idle.wait(timeout)

    def holding(self) -> "Hold":
        """Hold the view's changes before they are planned, until let go (`with _explorer.holding(): ...`, or
        `held = _explorer.holding()` ... `held.release()`): the view says "planning ..." and the changes
        made meanwhile coalesce as during a long compile. For demonstrations and tests; the synchronous
        API (choose, reshape, ...) is not held."""
        return Hold(self._worker)

    def state(self) -> dict:
        from .state import explorer_state

        with self._lock:
            return explorer_state(self)

    def __repr__(self) -> str:
        tried = len(self._order)
        return (f"<Explorer: {tried} layout{'s' if tried != 1 else ''} tried; current: {self.current.line if self.current else '-'}"
                f"{'; refused: ' + self.message if self.message else ''}>")

    # --- changes as layouts ------------------------------------------------------------------------
    def choosing(self, layout: Layout, name: str, spec, group: bool = False) -> Layout:
        indices = self._indices(name, group, layout)
        for index in indices:
            leaf = self.leaves[index]
            layout = layout.with_spec(index, controls.canonical(spec, len(leaf.shape), f"choose({name!r})"))
        return layout

    def reshaping(self, layout: Layout, shape, axis_types=None) -> Layout:
        shape = controls.read_shape(shape, self.devices)
        if isinstance(axis_types, (list, tuple)):
            types = tuple(str(t).lower() for t in axis_types)
        elif axis_types is not None:
            types = (str(axis_types).lower(),) * len(shape.names)
        elif shape.names == layout.shape.names:
            types = layout.types
        else:
            types = (layout.types[0],) * len(shape.names) if len(set(layout.types)) == 1 else None
            if types is None:
                raise UsageError(f"reshape({str(shape)!r}): the mesh's axes have different types {layout.types}; "
                                 f"say which the new axes get: reshape(..., axis_types=\"auto\").")
        if len(types) != len(shape.names) or not set(types) <= {"auto", "explicit", "manual"}:
            raise UsageError(f"reshape({str(shape)!r}, axis_types={axis_types!r}): give one of auto, explicit, manual "
                             f"(for every axis), or one per axis.")
        return replace(layout, shape=shape, types=types)

    def retargeting(self, layout: Layout, hardware=None, topology=None) -> Layout:
        if layout.hardware is None:
            raise UsageError("retarget: this explorer's cell gave no target; start it with --hardware (and --topology) "
                             "on the line, e.g. `%%shard --plan --explore --hardware tpu-v5e`.")
        if hardware is not None:
            from ..plan.hardware import parse_hardware

            self._profiles.setdefault(hardware, replace(parse_hardware(hardware), topology=None))
        return replace(layout, hardware=hardware or layout.hardware,
                       topology=topology if topology is not None else layout.topology)

    def restoring(self, line: str) -> Layout:
        with self._lock:
            for layout in self._order:
                if self._line(layout)[0] == line:
                    return layout
        raise UsageError(f"restore: no tried layout has the line {line!r}; `_explorer.tried` lists them.")

    def _indices(self, name: str, group: bool, layout: Layout) -> list[int]:
        found = [i for i, leaf in enumerate(self.leaves) if leaf.label == name]
        if found and group:  # the view's control: every leaf of that one's group (as %sharding groups them)
            found = next(g for g in controls.groups(self.leaves, list(layout.specs)) if found[0] in g)
        if not found:
            found = [i for i, leaf in enumerate(self.leaves) if leaf.input == name]
        if not found:
            known = ", ".join(dict.fromkeys([leaf.input for leaf in self.leaves] + [leaf.label for leaf in self.leaves]))
            raise UsageError(f"choose({name!r}): the cell reads no array called that; choose one of {known}.")
        return found

    # --- planning ---------------------------------------------------------------------------------
    def _go(self, make):
        """Plan the layout `make()` gives here and make it current (a UsageError leaves everything as it was,
        but the message)."""
        with self._planning:
            try:
                row = self._plan(make())
            except UsageError as err:
                self._say(str(err))
                raise
            self._make_current(row)
        return row.plan

    def _plan(self, layout: Layout) -> Row:
        """The row of `layout`: kept, or planned now (the caller holds `_planning`, or is the constructor)."""
        with self._lock:
            if layout in self._cache:
                return self._cache[layout]
            if layout in self._refused:
                raise UsageError(self._refused[layout])
        self.check(layout)
        mesh = self._mesh_of(layout)
        try:
            plan = self._plan_cell(layout, mesh)
        except UsageError as err:
            raise self._refuse(layout, f"{self.describe(layout)}: {controls.refusal_words(err)}") from None
        except Exception as exc:  # a layout XLA refuses is the explorer's message, never a traceback
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            raise self._refuse(layout, f"{self.describe(layout)}: the compiler refused this layout ({type(exc).__name__}: "
                                 f"{reason}). The plan shown is the previous layout's; try another layout.") from None
        row = Row(layout, self._line(layout)[0], plan)
        with self._lock:
            self.compiles += 1
            self._cache[layout] = row
            self._order.append(layout)
        return row

    def check(self, layout: Layout) -> None:
        """Every leaf's spec fits the layout's mesh (axes known, used once, sizes that divide), or a UsageError."""
        sizes = dict(zip(layout.shape.names, layout.shape.sizes))
        for leaf, spec in zip(self.leaves, layout.specs):
            controls.check(leaf, spec, sizes)

    def _refuse(self, layout: Layout, message: str) -> UsageError:
        with self._lock:
            self.compiles += 1
            self._refused[layout] = message
        return UsageError(message)

    def _plan_cell(self, layout: Layout, mesh):
        from ..plan.plan_cell import plan_cell

        hardware = self._profiles[layout.hardware] if layout.hardware is not None else None
        return plan_cell(self.source, self._namespace, magic="shard", mesh=mesh, in_specs=self._in_specs(layout),
                         out_specs=self._out_specs, hardware=hardware, topology=layout.topology,
                         device_memory=self.device_memory, bind=False, status=False, compiler=self.compiler,
                         donate=self.donate, outputs=self.outputs)

    def _make_current(self, row: Row, aim: bool = True) -> None:
        """`row` is the current layout; `aim`: and the one the next change starts from (the synchronous
        API; the worker keeps `intended`, the latest change asked for, which may be newer than `row`)."""
        with self._lock:
            if row is self.current:
                self.message = None
            else:
                self.previous, self.current = self.current, row
                self.generation += 1
                self.message = None
            if aim:
                self.intended = row.layout
        self._notify()

    def _say(self, message: str, back: bool = False) -> None:
        """A refusal, in one line; `back`: the layout asked for is the current one again."""
        with self._lock:
            self.message = " ".join(message.split())
            if back and self.current is not None:
                self.intended = self.current.layout
        self._notify()

    def _notify(self) -> None:
        """Each listener gets the state; one at a time, so the last state delivered is the last made (the
        status ticker and the worker both notify). A listener that raises is said in `message` (the
        view shows it) and the others are told again; nothing here raises, so the worker goes on."""
        if not self._listeners:
            return
        with self._notifying:
            failed = self._deliver(self.state())
            if failed:
                with self._lock:
                    self.message = failed
                self._deliver(self.state())  # once: a listener that fails again is not reported twice

    def _deliver(self, state: dict) -> str | None:
        said = None
        for callback in list(self._listeners):
            try:
                callback(state)
            except Exception as exc:  # a user's observe(callback): reported, never the worker's end
                reason = (str(exc).strip().splitlines() or [""])[0][:200]
                name = getattr(callback, "__qualname__", type(callback).__name__)
                said = said or (f"observe: the callback {name} raised {type(exc).__name__}"
                                f"{': ' + reason if reason else ''}; the explorer goes on (fix or replace that callback).")
        return said

    # --- layouts as meshes, specs and lines -------------------------------------------------------
    def _mesh_of(self, layout: Layout):
        from ...engines.shard import make_mesh

        if layout.shape == self._first.shape and layout.types == self._first.types:
            return self.mesh
        types = ",".join(layout.types)  # one per axis, as `--axis-types explicit,auto` spells them
        if self.abstract:
            return make_mesh(layout.shape, axis_types=types, abstract=True)
        ids = tuple(d.id for d in self.mesh.devices.flat)
        return make_mesh(layout.shape, None if sorted(ids) == controls.all_device_ids() else tuple(sorted(ids)), types)

    def _per_input(self, layout: Layout) -> dict:
        found: dict = {}
        for leaf, spec in zip(self.leaves, layout.specs):
            found.setdefault(leaf.input, []).append(spec)
        return found

    def _in_specs(self, layout: Layout) -> dict:
        specs = {}
        for name, per_leaf in self._per_input(layout).items():
            if len(set(per_leaf)) == 1:
                specs[name] = controls.engine_form(per_leaf[0])
            else:
                specs[name] = controls.spec_tree(self.leaves, list(layout.specs), name, self._namespace[name])
        return specs

    def _line(self, layout: Layout) -> tuple[str, dict]:
        """The line, self-contained: the mesh by its shape, axis types and devices (never a variable, which
        `%mesh` may rebind), a leaf by its path; and what it names that no line can spell (a mesh over
        devices in an order --devices cannot give, a leaf no path spells), to bind by hand."""
        mesh_words, names = controls.mesh_words(layout, self._mesh_of(layout))
        words = ["%%shard", "--plan", "--mesh", *mesh_words]
        if layout.hardware is not None:
            words += ["--hardware", layout.hardware] + (["--topology", layout.topology] if layout.topology else [])
        if self.device_memory is not None:
            words += ["--device-memory", controls.memory_words(self.device_memory)]
        ins = []
        for name, per_leaf in self._per_input(layout).items():
            spelled = controls.input_words(name, [leaf for leaf in self.leaves if leaf.input == name], per_leaf)
            if spelled is None:  # a leaf no path spells: a tree of specs, one per tried layout, bound by hand
                with self._lock:
                    number = self._order.index(layout) + 1 if layout in self._order else len(self._order) + 1
                names[f"{name}_specs_{number}"] = controls.spec_tree(self.leaves, list(layout.specs), name,
                                                                     self._namespace[name])
                spelled = [f"{name}=@{name}_specs_{number}"]
            ins += spelled
        words += ["--in"] + ins
        outs = [f"{n}={format_spec(controls.canonical(s, len(s), '--out'))}" if isinstance(s, tuple) else f"{n}={s}"
                for n, s in self._out_specs.items()]
        outs += [n for n in self.outputs or () if n not in self._out_specs]  # bare --out names: only these return
        if outs:
            words += ["--out"] + outs
        if self.donate:
            words += ["--donate", *self.donate]
        return " ".join(words), names

    def describe(self, layout: Layout) -> str:
        """`data=8,model=8 w1=P(None,'model')`: the layout's mesh and what differs from the first layout."""
        changed = [f"{leaf.label}={format_spec(spec)}" for leaf, spec, first in
                   zip(self.leaves, layout.specs, self._first.specs) if spec != first]
        target = ([layout.hardware] if layout.hardware != self._first.hardware else []) + \
            ([layout.topology] if layout.topology != self._first.topology and layout.topology else [])
        types = [f"({controls.types_text(layout.types)})"] if layout.types != self._first.types else []
        return " ".join([str(layout.shape)] + types + changed + target)


def explore_cell(source: str, namespace: dict, *, mesh=None, in_specs=None, out_specs=None, hardware=None,
                 topology: str | None = None, device_memory=None, donate=(), compiler: str = "auto", outputs=None):
    """Plain-Python twin of `%%shard --plan --explore` (marimo, scripts): `(explorer, view)`, the Explorer
    over `source` read against `namespace` (never written) and its live ExplorerView. `in_specs` as
    plan_cell's (input name -> PartitionSpec, or a pytree of them)."""
    from ...views.explorer import ExplorerView

    explorer = Explorer(source, namespace, mesh=mesh, in_specs=in_specs, out_specs=out_specs, hardware=hardware,
                        topology=topology, device_memory=device_memory, donate=donate, compiler=compiler,
                        outputs=outputs)
    return explorer, ExplorerView(explorer=explorer)
