"""Text fitted to a terminal's width (views/textwidth.py): views wrap at word boundaries with an
indent, and printed code breaks only where Python allows, so it still means the same."""

from __future__ import annotations

import ast

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from jaxpar_magic.views.textwidth import fit_code, fit_text, fitted_to, current_width

LONG = "  collective-permute · f32[] · result buffer 4 B · 8 pairs: 0→1, 1→2, 2→3, 3→4, 4→5, 5→6, 6→7, 7→0 — cyclic"


def test_a_long_line_wraps_at_words_indented_under_itself() -> None:
    lines = fit_text(LONG, 40).splitlines()
    assert all(len(line) <= 40 for line in lines) and len(lines) > 1
    assert lines[0].startswith("  collective-permute") and all(line.startswith("      ") for line in lines[1:])
    assert " ".join(line.strip() for line in lines).split() == LONG.split()  # no word lost or cut
    assert fit_text("short\n  also short", 40) == "short\n  also short"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="abcdefghij·→[]:=, ", min_size=1, max_size=30), min_size=1, max_size=12),
       st.integers(20, 100))
def test_every_line_fits_and_keeps_its_words(words: list[str], width: int) -> None:
    text = "  " + " ".join(words)
    out = fit_text(text, width)
    assert all(len(line) <= width for line in out.splitlines())
    assert "".join(out.split()) == "".join(text.split())


SNIPPET = """import jax
from jax.sharding import PartitionSpec as P
def per_device(a, b, c):
    return a * b + c  # one device's blocks: a long comment that explains a great deal about what happens here
out = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P('data'), P('data', None), P()), out_specs=P('data'), check_vma=False))(a, b, c)
"""


def test_code_breaks_only_where_python_allows() -> None:
    out = fit_code(SNIPPET, 80)
    assert all(len(line) <= 80 for line in out.splitlines()), out
    assert ast.dump(ast.parse(out)) == ast.dump(ast.parse(SNIPPET))  # the same program


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(["x", "P('data')", "None", "(a, b)", "f(y, z=2)", "'s, t'", "[1, 2, 3]", "k=v"]),
                min_size=1, max_size=20), st.integers(30, 90))
def test_any_call_keeps_its_meaning(args: list[str], width: int) -> None:
    line = f"    result = jax.jit(fn)({', '.join(args)})"
    source = "def g():\n" + line + "\n"
    try:
        ast.parse(source)
    except SyntaxError:
        assume(False)  # a keyword before a positional argument: not a program
    out = fit_code(source, width)
    assert ast.dump(ast.parse(out)) == ast.dump(ast.parse(source))


def test_the_width_being_rendered_can_be_set() -> None:
    with fitted_to(37):
        assert current_width() == 37


def test_the_terminals_width_is_read_again_once_it_may_have_changed(monkeypatch) -> None:
    """text_width keeps a terminal's width for TERMINAL_WIDTH_TTL_S (its read is a system call per
    shown cell), then reads it again: a resized terminal is seen."""
    from jaxpar_magic.views import textwidth

    monkeypatch.setattr(textwidth, "_terminal", [0.0, textwidth.DEFAULT_WIDTH])
    monkeypatch.setenv("COLUMNS", "123")
    assert textwidth.text_width() == 123
    monkeypatch.setenv("COLUMNS", "99")
    assert textwidth.text_width() == 123  # within the TTL: the width read last
    textwidth._terminal[0] -= textwidth.TERMINAL_WIDTH_TTL_S + 0.01
    assert textwidth.text_width() == 99
