"""cell/specs.py: the small languages of the sharding magics' lines, read without executing anything.

`parse_mesh_shape` (`%mesh data=4 model=2`, `--mesh data=4,model=2`), `parse_spec` (one
PartitionSpec) and `parse_assignments` (`--in v1s=data w=P('data', None)`, as the list of words
IPython's argument splitter hands us). Pure Python: no JAX, no shell.
"""
from __future__ import annotations

import shlex

import pytest
from IPython.core.error import UsageError

from jaxpar_magic.cell.specs import MeshShape, parse_assignments, parse_mesh_shape, parse_spec


# --- mesh shapes -------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "text",
    ["data=4,model=2", "data=4 model=2", "data=4, model=2", " data=4 ,model=2 ", ["data=4", "model=2"],
     ["data=4,", "model=2"]],
)
def test_mesh_shape_reads_commas_spaces_and_word_lists_alike(text):
    shape = parse_mesh_shape(text)
    assert shape == MeshShape(("data", "model"), (4, 2))
    assert shape.size == 8
    assert str(shape) == "data=4,model=2"


def test_mesh_shape_keeps_axis_order_and_three_axes():
    shape = parse_mesh_shape("z=2,y=2,x=2")
    assert shape.names == ("z", "y", "x")
    assert shape.sizes == (2, 2, 2)
    assert shape.size == 8


def test_mesh_shape_of_an_abstract_pod_is_just_arithmetic():
    shape = parse_mesh_shape(["x=16", "y=16", "z=16"])
    assert shape.size == 4096


@pytest.mark.parametrize(
    "text",
    ["data4", "data=0", "data=-1", "data=x", "data=2.5", "4=data", "1data=4", "da-ta=4", "data=", "=4",
     "data=4,,model", "__import__('os').system('x')=2", "data=4 model"],
)
def test_malformed_mesh_shapes_are_usage_errors_with_an_example(text):
    with pytest.raises(UsageError) as err:
        parse_mesh_shape(text, "%mesh")
    message = str(err.value)
    assert "NAME=SIZE" in message and "%mesh" in message


def test_mesh_shape_names_the_option_it_was_given():
    with pytest.raises(UsageError, match=r"^--mesh: cannot read 'data4'"):
        parse_mesh_shape("data4", "--mesh")


@pytest.mark.parametrize("text", ["", "   ", [], [" ", ","]])
def test_an_empty_mesh_shape_asks_for_an_axis(text):
    with pytest.raises(UsageError, match="at least one AXIS=SIZE"):
        parse_mesh_shape(text, "--mesh")


def test_a_repeated_axis_name_is_refused():
    with pytest.raises(UsageError, match="axis 'data' appears twice"):
        parse_mesh_shape("data=2,data=4", "%mesh")


# --- one PartitionSpec -------------------------------------------------------------------------

@pytest.mark.parametrize(
    "text, expected",
    [
        ("data", ("data",)),
        ("data,None", ("data", None)),
        ("None,model", (None, "model")),
        ("(data,model),None", (("data", "model"), None)),
        ("(data, model), None", (("data", "model"), None)),
        ("(data,)", (("data",),)),
        ("P('data', None)", ("data", None)),
        ('P("data", "model")', ("data", "model")),
        ("P(data, model)", ("data", "model")),  # what IPython's splitter leaves of P('data', 'model')
        ("P(('data', 'model'), None)", (("data", "model"), None)),
        ("PartitionSpec('data')", ("data",)),
        ("P()", ()),
        ("", ()),
        ("None", (None,)),
        ("8", (8,)),
        ("None,8", (None, 8)),
    ],
)
def test_spec_syntax_variants(text, expected):
    assert parse_spec(text, "--in w") == expected


@pytest.mark.parametrize("text, entry", [("data,,", 2), (",data", 1), ("data,,model", 2), ("P('data',,)", 2),
                                         ("P('')", 1), ("''", 1), ("data, ,", 2)])
def test_an_empty_entry_is_refused_not_read_as_none(text, entry):
    """Issue 40: `data,,` was read as P('data', None) while `(data` was refused; Python refuses both."""
    with pytest.raises(UsageError, match=rf"^--in w: entry {entry} of .* is empty; write None for a dimension left whole"):
        parse_spec(text, "--in w")


def test_a_trailing_comma_inside_P_adds_no_dimension():
    # In Python P('data',) == P('data'): one entry. Reading it as ('data', None) would make a
    # 1-D array's spec "too long" and the user would get an error for valid Python syntax.
    assert parse_spec("P('data',)", "--in v") == ("data",)


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('x')",
        "os.system('x')",
        "data-model",
        "data.model",
        "(data,8)",
        "(data,None)",
        "((data,model))",
        "P('data', None",
        "P(P('data'))",
        "lambda: 0",
        "data model",
        "1.5",
        "[data]",
        # nested 500 deep: a UsageError, not a RecursionError
        pytest.param("(" * 500 + "data" + ")" * 500, id="parentheses-500-deep"),
        pytest.param("P(" + "(" * 500 + "data" + ")" * 500 + ")", id="P-of-parentheses-500-deep"),
        pytest.param("data," + "(" * 500 + "model" + ")" * 500, id="second-entry-500-deep"),
    ],
)
def test_malformed_specs_are_usage_errors_and_nothing_runs(text, monkeypatch):
    import builtins

    def forbidden(*args, **kwargs):  # parse_spec must read, never execute
        raise AssertionError("the spec parser executed code")

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    monkeypatch.setattr(builtins, "__import__", forbidden)
    with pytest.raises(UsageError) as err:
        parse_spec(text, "--in w")
    assert str(err.value).startswith("--in w")


# --- --in / --out assignments ------------------------------------------------------------------

def words(line: str) -> list[str]:
    """The words argparse receives: IPython's `arg_split` is shlex in POSIX mode (quotes removed)."""
    from IPython.utils._process_common import arg_split

    return arg_split(line, posix=True)


def test_our_words_helper_matches_shlex_on_these_lines():
    line = "v1s=data w=P('data', None)"
    assert words(line) == shlex.split(line) == ["v1s=data", "w=P(data,", "None)"]


@pytest.mark.parametrize(
    "line, expected",
    [
        ("v1s=data v2s=data", {"v1s": ("data",), "v2s": ("data",)}),
        ("w=data,None", {"w": ("data", None)}),
        ("w=(data,model),None", {"w": (("data", "model"), None)}),
        ("w=P('data', 'model')", {"w": ("data", "model")}),
        ("w=P('data', None) b=model", {"w": ("data", None), "b": ("model",)}),
        ("x=data,None w=None,model", {"x": ("data", None), "w": (None, "model")}),
        ('w=P("data",   None)', {"w": ("data", None)}),
        ("w=(data, model),None", {"w": (("data", "model"), None)}),
        ("v1s=8 v2s=8", {"v1s": (8,), "v2s": (8,)}),
        ("s=P()", {"s": ()}),
    ],
)
def test_assignments_survive_ipythons_word_splitting(line, expected):
    assert parse_assignments(words(line), "--in") == expected


def test_a_name_given_twice_is_refused():
    # Keeping only the last spec would silently drop what the user wrote first.
    with pytest.raises(UsageError, match="'v'.*twice"):
        parse_assignments(words("v=data v=None"), "--in")


def test_no_assignments_is_an_empty_dict():
    assert parse_assignments(None, "--in") == {}
    assert parse_assignments([], "--out") == {}


@pytest.mark.parametrize(
    "line",
    ["data", "=data", "1x=data", "x.y=data", "v=data extra", "v=__import__('os').system('x')",
     "__import__('os').system('x')"],
)
def test_malformed_assignments_are_usage_errors_naming_the_option(line):
    with pytest.raises(UsageError) as err:
        parse_assignments(words(line), "--out")
    assert str(err.value).startswith("--out")


def test_a_pytree_of_specs_is_named_with_an_at_sign():
    from jaxpar_magic.cell.specs import SpecTree

    assert parse_assignments(["params=@param_specs", "x=data"], "--in") == {
        "params": SpecTree("param_specs"), "x": ("data",)}
    assert str(SpecTree("s")) == "@s"
    for bad in ("params=@", "params=@1x", "params=@a.b"):
        with pytest.raises(UsageError, match="should name a pytree of PartitionSpecs"):
            parse_assignments([bad], "--in")
