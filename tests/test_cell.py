"""cell/analysis.py: what a cell reads, writes and returns, its mode, and the code built from it.

Pure Python: nothing here touches JAX or IPython's shell.
"""
from __future__ import annotations

import linecache
import traceback

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError

from jaxpar_magic.cell import analysis as cells


def analyse(source: str) -> cells.Cell:
    return cells.analyse(source, "test")


# --- reads and writes --------------------------------------------------------------------------

def test_reads_are_names_used_before_the_cell_assigns_them():
    c = analyse("y = x * 2\nz = y + w\n")
    assert c.reads == ("x", "w")
    assert c.writes == ("y", "z")
    assert c.mode == "block"


def test_a_name_assigned_first_is_not_an_input():
    c = analyse("a = 1\nb = a + c\n")
    assert c.reads == ("c",)
    assert c.writes == ("a", "b")


def test_value_is_read_before_its_own_target_is_bound():
    assert analyse("x = x + 1\n").reads == ("x",)


def test_augmented_assignment_reads_then_writes():
    c = analyse("x += 1\n")
    assert c.reads == ("x",)
    assert c.writes == ("x",)


def test_a_loop_target_is_bound_before_its_body_reads_it():
    c = analyse("acc = 0\nfor t in range(n):\n    if t >= 1:\n        acc = acc + t * step\n")
    assert c.reads == ("range", "n", "step")  # not `t`: the loop binds it before the body runs
    assert c.writes == ("acc", "t")
    # The iterable runs before the target binds: `for x in x` reads the outer x.
    assert analyse("for x in x:\n    y = x\n").reads == ("x",)


def test_tuple_unpacking_writes_every_target():
    c = analyse("a, (b, c) = x, (1, 2)\n")
    assert c.writes == ("a", "b", "c")
    assert c.reads == ("x",)


def test_comprehension_variables_stay_inside_it():
    c = analyse("ys = [v * k for v in xs if v > lo]\n")
    assert c.reads[0] == "xs"  # the first iterable runs in the cell's own scope, first
    assert set(c.reads) == {"xs", "k", "lo"}
    assert c.writes == ("ys",)


def test_lambda_parameters_are_not_reads():
    c = analyse("f = lambda t, u=d: t + s + u\n")
    assert set(c.reads) == {"d", "s"}
    assert c.writes == ("f",)


def test_nested_def_in_a_block_reads_its_free_names():
    c = analyse("def g(t):\n    q = t * s\n    return q\ny = g(x)\n")
    assert c.mode == "block"  # a def beside other statements is block mode
    assert c.reads == ("s", "x")
    assert c.writes == ("g", "y")


def test_imports_bind_their_top_level_name():
    c = analyse("import numpy as np2\nimport os.path\nfrom math import pi\ny = np2.ones(3) * pi\n")
    assert c.writes == ("np2", "os", "pi", "y")
    assert c.reads == ()


def test_final_expression_is_detected():
    assert analyse("y = x\ny.sum()\n").has_final_expression
    assert not analyse("y = x\n").has_final_expression
    assert not analyse("").has_final_expression


def test_global_statement_is_a_usage_error_with_its_line():
    with pytest.raises(UsageError, match=r"line 2 of the cell: `global`"):
        analyse("a = 1\nglobal q\nq = 2\n")


def test_syntax_error_names_the_line():
    with pytest.raises(UsageError, match=r"syntax error on line 2 .*`z = y\[`"):
        analyse("y = x * 2\nz = y[\n")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.sampled_from("abcdef"), st.sampled_from("abcdef")),
                min_size=1, max_size=8))
def test_reads_and_writes_match_a_straight_line_simulation(statements):
    source = "".join(f"{t} = {a} + {b}\n" for t, a, b in statements)
    reads, writes = [], []
    for target, a, b in statements:
        for name in (a, b):
            if name not in writes and name not in reads:
                reads.append(name)
        if target not in writes:
            writes.append(target)
    c = analyse(source)
    assert c.reads == tuple(reads)
    assert c.writes == tuple(writes)


# --- mode ----------------------------------------------------------------------------------------

def test_only_defs_and_imports_is_function_mode():
    c = analyse('"""helpers"""\nimport jax\nfrom jax import lax\n\ndef f(x):\n    """doc"""\n    return x\n\n'
                "def g(x):\n    return f(x)\n")
    assert c.mode == "function"
    assert c.functions == ("f", "g")


def test_a_def_with_an_assignment_is_block_mode():
    assert analyse("def f(x):\n    return x\ny = 1\n").mode == "block"


def test_imports_alone_are_block_mode():
    assert analyse("import jax\n").mode == "block"


# --- named filename and the code built from a cell -----------------------------------------------

def test_each_cell_gets_its_own_filename_and_its_lines_are_readable():
    a, b = analyse("y = x\nz = y + 1\n"), analyse("y = x\nz = y + 1\n")
    assert a.filename != b.filename
    assert a.filename.startswith("<test-") and a.filename.endswith(">")
    assert a.line(2) == "z = y + 1"
    assert linecache.getline(a.filename, 1).strip() == "y = x"


def test_built_function_returns_written_names_and_final_value_without_writing_the_namespace():
    c = analyse("y = x * k\nz = y + 1\nz * 2\n")
    ns = {"k": 3}
    fn = cells.build_function(c, ("x",), ns)
    outs, final = fn(2)
    assert outs == {"y": 6, "z": 7}
    assert final == 14
    assert set(ns) - {"__builtins__"} == {"k"}  # exec may add __builtins__; nothing of the cell's


def test_built_function_leaves_out_names_a_branch_did_not_assign():
    c = analyse("if flag:\n    y = x\nz = 1\n")
    outs, final = cells.build_function(c, ("x",), {"flag": False})(5)
    assert outs == {"z": 1}
    assert final is None


def test_traceback_of_the_built_function_points_at_the_users_line():
    c = analyse("a = x + 1\nb = 1 / x\n")
    fn = cells.build_function(c, ("x",), {})
    with pytest.raises(ZeroDivisionError) as info:
        fn(0)
    frames = [(f.filename, f.lineno) for f in traceback.extract_tb(info.value.__traceback__)]
    assert frames[-1] == (c.filename, 2)
    assert traceback.extract_tb(info.value.__traceback__)[-1].line == "b = 1 / x"


# --- collectives called with literal axis names --------------------------------------------------

def test_collective_axis_literals_find_positional_keyword_and_tuple_axes():
    source = (
        "a = lax.psum(x, 'i')\n"
        "b = lax.ppermute(x, axis_name='j', perm=p)\n"
        "c = lax.axis_index('k')\n"
        "d = lax.pmean(x, ('i', 'm'))\n"
        "e = lax.psum(x, ax)\n"
        "f = jnp.sum(x, 'nope')\n"
    )
    found = cells.collective_axis_literals(source)
    assert [(line, axis) for line, _, axis in found] == [(1, "i"), (2, "j"), (3, "k"), (4, "i"), (4, "m")]
    assert found[0][1] == "lax.psum(x, 'i')"
