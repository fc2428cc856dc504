"""What a cell *is*: its AST, the names it reads and writes, its final expression, its mode.

Shared by both engines (`%%pmap`, `%%shard`). Pure Python: no JAX, no IPython.
"""
from __future__ import annotations

import ast
import itertools
import linecache
from dataclasses import dataclass
from types import CodeType

from ..errors import UsageError

_counter = itertools.count(1)
CELL_FUNCTION = "__jaxpar_cell__"
_LOCALS = "__jaxpar_locals__"


@dataclass(frozen=True)
class Cell:
    source: str
    filename: str
    reads: tuple[str, ...]  # names read before the cell assigns them, in order of first use
    writes: tuple[str, ...]  # names assigned at the cell's top level, in order
    has_final_expression: bool
    functions: tuple[str, ...]  # function mode: the functions the cell defines
    tree: ast.Module

    @property
    def mode(self) -> str:
        return "function" if self.functions else "block"

    @property
    def final_is_output(self) -> bool:
        """The final expression only names a value the cell assigns (`y = f(x)` then `y`): views
        show it once, under its name."""
        last = self.tree.body[-1] if self.has_final_expression and self.tree.body else None
        return isinstance(last, ast.Expr) and isinstance(last.value, ast.Name) and last.value.id in self.writes

    @property
    def silenced(self) -> bool:
        """A trailing `;` silences the cell's value (IPython's rule): no Out, no "(result)" view."""
        return silenced(self.source)

    def line(self, lineno: int) -> str:
        return linecache.getline(self.filename, lineno).strip()

    def first_read(self, name: str) -> int:
        """The first line that reads `name` (where a message about that input should point)."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load):
                return node.lineno
        return 1

    def last_assigned(self, name: str) -> int:
        """The last line that binds `name` (where a message about that output should point)."""
        line = 1
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store):
                line = max(line, node.lineno)
        return line


def silenced(source: str) -> bool:
    """A trailing `;` silences a cell's value, as for any IPython cell."""
    return source.rstrip().endswith(";")


class StatementNames(ast.NodeVisitor):
    """Loads and stores of one statement, in the scope it runs in.

    Names bound inside a nested function, lambda or comprehension stay inside it; the names such a
    scope reads from outside count as reads of the statement.
    """

    def __init__(self):
        self.loads: list[str] = []
        self.stores: list[str] = []
        self.events: list[tuple[bool, str]] = []  # (is_store, name) in the order they run

    def _load(self, name: str) -> None:
        self.loads.append(name)
        self.events.append((False, name))

    def _store(self, name: str) -> None:
        self.stores.append(name)
        self.events.append((True, name))

    def visit_Name(self, node: ast.Name):
        (self._load if isinstance(node.ctx, ast.Load) else self._store)(node.id)

    def visit_AugAssign(self, node: ast.AugAssign):
        if isinstance(node.target, ast.Name):  # `x += 1` reads x first
            self._load(node.target.id)
        self.visit(node.value)
        self.visit(node.target)

    def visit_For(self, node: ast.For):  # the iterable runs first, then the target binds, then the body
        self.visit(node.iter)
        self.visit(node.target)
        for stmt in node.body + node.orelse:
            self.visit(stmt)

    visit_AsyncFor = visit_For

    def visit_Assign(self, node: ast.Assign):  # the value runs before the targets bind
        self.visit(node.value)
        for target in node.targets:
            self.visit(target)

    def _nested(self, bound: set[str], body_nodes: list[ast.AST]):
        inner = StatementNames()
        for child in body_nodes:
            inner.visit(child)
        bound = bound | set(inner.stores)
        for n in inner.loads:
            if n not in bound:
                self._load(n)

    def _function(self, node, is_def: bool):
        args = node.args
        for default in args.defaults + [d for d in args.kw_defaults if d is not None]:
            self.visit(default)
        for deco in getattr(node, "decorator_list", []):
            self.visit(deco)
        params = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
        params |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
        body = node.body if is_def else [node.body]
        self._nested(params, body)
        if is_def:
            self._store(node.name)

    def visit_FunctionDef(self, node):
        self._function(node, True)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        self._function(node, False)

    def visit_ClassDef(self, node):
        for base in node.bases + node.decorator_list:
            self.visit(base)
        self._nested(set(), node.body)
        self._store(node.name)

    def _comprehension(self, node, parts):
        first, *rest = node.generators
        self.visit(first.iter)  # the first iterable runs in the enclosing scope
        targets = StatementNames()
        for gen in node.generators:
            targets.visit(gen.target)
        body = [g.iter for g in rest] + [c for g in node.generators for c in g.ifs] + parts
        self._nested(set(targets.stores), body)

    def visit_ListComp(self, node):
        self._comprehension(node, [node.elt])

    visit_SetComp = visit_GeneratorExp = visit_ListComp

    def visit_DictComp(self, node):
        self._comprehension(node, [node.key, node.value])

    def visit_Import(self, node):
        for alias in node.names:
            self._store((alias.asname or alias.name).split(".")[0])

    visit_ImportFrom = visit_Import

    def visit_Global(self, node):
        raise UsageError(
            f"line {node.lineno} of the cell: `global` is not supported in a parallel cell; assign the "
            "name at the cell's top level instead, it is bound back to your namespace."
        )

    visit_Nonlocal = visit_Global


def _is_definition(stmt: ast.stmt) -> bool:
    return isinstance(stmt, (ast.FunctionDef, ast.Import, ast.ImportFrom)) or (
        isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)
    )


def parse(source: str, label: str = "cell") -> ast.Module:
    filename = f"<{label}-{next(_counter)}>"
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as err:
        line = (err.text or "").strip()
        raise UsageError(
            f"syntax error on line {err.lineno} of the cell: {err.msg} (`{line}`). Fix that line and run the cell again."
        ) from None
    return tree, filename


def _compiles_as_a_cell(tree: ast.Module, filename: str) -> None:
    """Raise the SyntaxError a plain cell raises for what parses but does not compile at a cell's
    top level: `return` or `yield` outside a function (our cell function would accept them),
    `break` outside a loop. Python's own error, with the cell's line."""
    try:
        compile(tree, filename, "exec", dont_inherit=True)
    except SyntaxError as err:
        if err.text is None and err.lineno:
            err.text = linecache.getline(filename, err.lineno)
        raise err.with_traceback(None) from None


def analyse(source: str, label: str = "cell") -> Cell:
    """Parse a cell: names read and written, final expression, and the mode it runs in."""
    tree, filename = parse(source, label)
    # The named filename makes tracebacks and our messages quote the user's own lines.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    _compiles_as_a_cell(tree, filename)
    body = tree.body
    if body and all(_is_definition(s) for s in body) and any(isinstance(s, ast.FunctionDef) for s in body):
        names = tuple(s.name for s in body if isinstance(s, ast.FunctionDef))
        return Cell(source, filename, (), names, False, names, tree)

    reads: list[str] = []
    writes: list[str] = []
    for stmt in body:
        names = StatementNames()
        names.visit(stmt)
        # In the order they run: a loop's target is bound before its body reads it.
        for is_store, n in names.events:
            if is_store:
                if n not in writes:
                    writes.append(n)
            elif n not in writes and n not in reads:
                reads.append(n)
    final = isinstance(body[-1], ast.Expr) if body else False
    return Cell(source, filename, tuple(reads), tuple(writes), final, (), tree)


def unbound_output(cell: Cell, name: str, option: str = "--out") -> UsageError:
    """The UsageError for an output the line lists that is not bound when the cell ends: the cell
    deletes it (`del NAME`, named with its line), or assigns it on a branch that did not run."""
    deleted = [node.lineno for node in ast.walk(cell.tree) if isinstance(node, ast.Delete)
               and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)]
    why = (f"line {deleted[-1]} of the cell, `{cell.line(deleted[-1])}`, deletes it" if deleted
           else "the cell assigns it on a path this run did not take")
    return UsageError(
        f"{option} {name}: {name!r} is not bound when the cell ends ({why}), so there is nothing to return under "
        f"that name. Keep it bound to the end (leave out the `del`), or drop {name} from {option}."
    )


def compile_block(cell: Cell, inputs: tuple[str, ...], rebound: tuple[str, ...] = ()) -> CodeType:
    """`def __jaxpar_cell__(<inputs>): <body>; return {written locals}, <final expression>`.

    Built as an AST (never by joining strings) so line numbers stay the user's own. Inputs are
    parameters; every other name the cell reads resolves in the user's namespace at trace time,
    except the `rebound` ones: constants the cell reads and then assigns (`opt_state` of an optax
    optimizer without arrays) are local to the function, so they come in as keyword defaults.
    """
    import copy

    tree, filename, writes, final = copy.deepcopy(cell.tree), cell.filename, cell.writes, cell.has_final_expression
    body = list(tree.body)
    final_expr = body.pop().value if final else ast.Constant(None)
    last_line = tree.body[-1].end_lineno if tree.body else 1
    snapshot = ast.parse(
        f"{_LOCALS} = locals()\n"
        f"__jaxpar_out__ = {{k: {_LOCALS}[k] for k in {tuple(writes)!r} if k in {_LOCALS}}}"
    ).body
    ret = ast.Return(ast.Tuple([ast.Name("__jaxpar_out__", ast.Load()), final_expr], ast.Load()))
    # The snapshot runs before the final expression, which may not assign anything.
    func = ast.FunctionDef(
        name=CELL_FUNCTION,
        args=ast.arguments(
            posonlyargs=[], args=[ast.arg(n) for n in inputs], kwonlyargs=[ast.arg(n) for n in rebound],
            kw_defaults=[ast.Name(n, ast.Load()) for n in rebound], defaults=[]
        ),
        body=body + snapshot + [ret] if body or final else snapshot + [ret],
        decorator_list=[],
        returns=None,
    )
    module = ast.Module([func], type_ignores=[])
    for node in ast.walk(module):  # our scaffolding sits on the cell's last line
        if not hasattr(node, "lineno") or node.lineno is None:
            node.lineno = node.end_lineno = last_line
            node.col_offset = node.end_col_offset = 0
    ast.fix_missing_locations(module)
    return compile(module, filename, "exec")


def build_function(cell: Cell, inputs: tuple[str, ...], namespace: dict):
    """The cell as a Python function whose globals are the user's namespace (read, never written)."""
    scope: dict = {}
    rebound = tuple(n for n in cell.reads if n in cell.writes and n not in inputs and n in namespace)
    exec(compile_block(cell, inputs, rebound), namespace, scope)  # defines the function only; runs no user code
    return scope[CELL_FUNCTION]


def collective_axis_literals(source: str) -> list[tuple[int, str, str]]:
    """(line, call text, axis name) for collectives called with a literal axis name.

    Lets us say "unknown axis name 'j' on line 3" before JAX says "call psum under shard_map".
    """
    collectives = {"psum", "pmean", "pmax", "pmin", "ppermute", "all_gather", "axis_index", "psum_scatter",
                   "all_to_all", "pshuffle", "pswapaxes", "axis_size"}
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else None
        if name not in collectives:
            continue
        axis = None
        for kw in node.keywords:
            if kw.arg == "axis_name":
                axis = kw.value
        if axis is None:
            position = 0 if name in ("axis_index", "axis_size") else 1
            if len(node.args) > position:
                axis = node.args[position]
        literals = []
        if isinstance(axis, ast.Constant) and isinstance(axis.value, str):
            literals = [axis.value]
        elif isinstance(axis, (ast.Tuple, ast.List)):
            literals = [e.value for e in axis.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        for lit in literals:
            found.append((node.lineno, ast.get_source_segment(source, node) or name, lit))
    return found


def check_axis_names(source: str, axis_names: tuple[str, ...]) -> None:
    """A collective called with a literal axis name the cell does not run over: say so before JAX does."""
    for lineno, text, axis in collective_axis_literals(source):
        if axis not in axis_names:
            raise UsageError(
                f"line {lineno} of the cell (`{text}`): unknown axis name {axis!r}. This cell runs over "
                f"the axis {'names' if len(axis_names) > 1 else 'name'} {', '.join(map(repr, axis_names))}; "
                f"use {'one of them' if len(axis_names) > 1 else 'it'}, or run the cell with "
                f"`--axis-name {axis}` (or `--mesh {axis}=N,...`)."
            )
