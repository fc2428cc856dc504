"""`jaxpar_magic.check`, the line every check cell prints: `✓ right`, or `✗ not yet: ... Hint: ...`
(never a traceback, never the expected value), comparing any pytree leaf by leaf (issue 22 item 7)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import jaxpar_magic
from jaxpar_magic.face.checks import NotRun, check


@pytest.fixture(autouse=True)
def fresh_hints():
    from jaxpar_magic.face import checks

    checks._failures.clear()
    yield
    checks._failures.clear()


def said(capsys) -> list[str]:
    return capsys.readouterr().out.splitlines()


def test_right_answers_say_so(capsys):
    check(np.arange(4.0), np.arange(4.0) + 1e-9, hint="unused")
    check(3, 3, hint="unused", done="three it is")
    check(True, hint="unused")
    assert said(capsys) == ["✓ right", "✓ three it is", "✓ right"]


@pytest.mark.parametrize("got, want, says", [
    (np.zeros(3), np.zeros((3, 1)), "the shape is (3,), expected (3, 1)"),
    (np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.5, 3.5]), "the values differ in 2 of 3 places"),
    ("psum", "pmean", "got 'psum'"),
    (None, np.zeros(2), "got None, expected an array of shape (2,) and dtype float64"),
    (np.arange(3), np.arange(3.0), "the dtype is int64, expected a floating-point dtype"),
    (4, 5, "got 4"),
])
def test_wrong_answers_give_what_differs_and_the_hint(capsys, got, want, says):
    check(got, want, hint="think of the ring")
    assert said(capsys) == [f"✗ not yet: {says}. Hint: think of the ring."]


def test_a_wrong_answer_never_shows_the_expected_value(capsys):
    check(448, 512, hint="count the rows")
    check({"sent": 448}, {"sent": 512}, hint="count the rows again")
    check(np.float32(1.5), np.float32(2.75), hint="h")
    out = capsys.readouterr().out
    assert "512" not in out and "2.75" not in out, out


def test_equal_pytrees_are_right(capsys):
    import jax.numpy as jnp

    tree = {"w": jnp.ones((2, 3)), "layers": (jnp.zeros(2), [np.arange(3.0), 7]), "name": "mlp"}
    same = {"w": np.ones((2, 3)), "layers": (np.zeros(2), [jnp.arange(3.0), 7]), "name": "mlp"}
    check(tree, same, hint="unused")
    check((1.0, 2), (1.0, 2), hint="unused")
    assert said(capsys) == ["✓ right", "✓ right"]


def test_a_pytree_names_the_leaf_that_differs(capsys):
    got = {"w": np.ones(3), "b": (np.zeros(2), np.ones(2))}
    want = {"w": np.ones(3), "b": (np.zeros(2), np.zeros(2))}
    check(got, want, hint="look at b")
    check({"w": np.ones(3)}, {"w": np.ones(3), "b": np.zeros(2)}, hint="add b")
    check((1, 2), (1, 2, 3), hint="three")
    assert said(capsys) == [
        "✗ not yet: at ['b'][1]: the values differ in 2 of 2 places. Hint: look at b.",
        "✗ not yet: the dict has no key 'b'. Hint: add b.",
        "✗ not yet: got 2 values in a tuple, expected 3. Hint: three.",
    ]


def test_nan_equals_nan(capsys):
    check(float("nan"), float("nan"), hint="unused")
    check(np.array([1.0, np.nan]), np.array([1.0, np.nan]), hint="unused")
    check({"loss": float("nan")}, {"loss": float("nan")}, hint="unused")
    check(np.array([1.0, np.nan]), np.array([1.0, 2.0]), hint="no nan")
    assert said(capsys) == ["✓ right"] * 3 + ["✗ not yet: the values differ in 1 of 2 places. Hint: no nan."]


def test_an_array_condition_is_right_when_all_of_it_is_true(capsys):
    import jax.numpy as jnp

    a = jnp.arange(4.0)
    check(a == a, hint="unused")
    check(a == jnp.array([0.0, 1.0, 2.0, 4.0]), hint="the last one")
    check(np.array([], dtype=bool), hint="unused")  # all() of nothing is true
    assert said(capsys) == ["✓ right", "✗ not yet: the check is false. Hint: the last one.", "✓ right"]


def test_python_numbers_are_weakly_typed_like_in_jax(capsys):
    import jax.numpy as jnp

    check(448, jnp.int32(448), hint="unused")
    check(448.0, 448, hint="unused")
    check(jnp.float32(0.5), 0.5, hint="unused")
    check(True, 1, hint="a bool is not a count")
    assert said(capsys) == ["✓ right"] * 3 + ["✗ not yet: the dtype is bool, expected an integer dtype. Hint: a bool is not a count."]


def test_numbers_past_int32_compare(capsys):
    """A byte count of 9 GiB is a Python int that int32 cannot hold (the planning chapter's exercise)."""
    import jax.numpy as jnp

    check({"dp": 9 * 2**30, "fsdp": 36 * 2**20}, {"dp": 9663676416, "fsdp": 37748736}, hint="unused")
    check(9 * 2**30, 9 * 2**30 + 1, hint="one byte")
    check(2**40, jnp.float32(2.0**40), hint="unused")
    assert said(capsys) == ["✓ right", "✗ not yet: got 9663676416. Hint: one byte.", "✓ right"]


def test_bfloat16_compares_with_its_own_tolerance(capsys):
    import jax.numpy as jnp

    check(jnp.ones(3, jnp.bfloat16), np.ones(3, np.float32), hint="unused")
    check(jnp.ones(3, jnp.bfloat16) * 2, np.ones(3), hint="double")
    assert said(capsys) == ["✓ right", "✗ not yet: the values differ in 3 of 3 places. Hint: double."]


def test_what_it_cannot_compare_is_one_line_with_the_reason(capsys):
    class Stubborn:
        def __eq__(self, other):
            raise RuntimeError("no comparing me")

        def __bool__(self):
            raise RuntimeError("no truth either")

    check(Stubborn(), Stubborn(), hint="h")
    check(Stubborn(), hint="h2")
    lines = said(capsys)
    assert lines == [
        "✗ not yet: could not compare the answer (RuntimeError: no comparing me). Hint: h.",
        "✗ not yet: the check's condition is a Stubborn, not True or False (write a comparison, or all(...) "
        "around a generator). Hint: h2.",
    ]


def test_hints_come_one_at_a_time(capsys):
    hints = ["a nudge", "more", "the most"]
    for _ in range(4):
        check(1, 2, hint=hints)
    check(2, 2, hint=hints)
    assert said(capsys) == [
        "✗ not yet: got 1. Hint 1/3: a nudge.",
        "✗ not yet: got 1. Hint 2/3: more.",
        "✗ not yet: got 1. Hint 3/3: the most.",
        "✗ not yet: got 1. Hint 3/3: the most.",
        "✓ right",
    ]


def test_the_method_is_checked_before_the_value(capsys):
    check(31.0, 31.0, method=[(True, "fine"), (False, "use only lax.ppermute")], hint="h")
    check(30.0, 31.0, method=[(True, "fine")], hint="h")
    check(31.0, 31.0, method=[(np.array([True, True]), "all true")], hint="h")
    assert said(capsys) == ["✗ not yet: use only lax.ppermute. Hint: h.", "✗ not yet: got 30.0. Hint: h.", "✓ right"]


def test_an_answer_that_was_never_made_says_why(capsys):
    missing = NotRun("the exercise cell stopped with an error")
    check(missing, 3, hint="h")
    check({"a": 1, "b": missing}, {"a": 1, "b": 2}, hint="h")
    check(3, 3, method=[(missing, "never reached")], hint="h")
    assert said(capsys) == ["✗ not yet: the exercise cell stopped with an error. Hint: h."] * 3


# --- the libraries researchers use ------------------------------------------------------------------

def test_flax_nnx_modules_compare_by_their_state(capsys):
    from flax import nnx

    a, b = nnx.Linear(2, 3, rngs=nnx.Rngs(0)), nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    check(a, b, hint="unused")
    c = nnx.Linear(2, 3, rngs=nnx.Rngs(1))
    check(a, c, hint="same seed")
    check(nnx.state(a), nnx.state(b), hint="unused")
    lines = said(capsys)
    assert lines[0] == "✓ right" and lines[2] == "✓ right", lines
    assert lines[1].startswith("✗ not yet: at .kernel") and "places" in lines[1], lines


def test_equinox_modules_compare_arrays_and_their_static_leaves(capsys):
    import equinox as eqx
    import jax

    a = eqx.nn.MLP(2, 2, 4, 1, key=jax.random.key(0))
    b = eqx.nn.MLP(2, 2, 4, 1, key=jax.random.key(0))
    check(a, b, hint="unused")
    check(a, eqx.nn.MLP(2, 2, 4, 1, key=jax.random.key(1)), hint="seed")
    check(a, eqx.nn.MLP(2, 2, 4, 1, activation=jax.nn.tanh, key=jax.random.key(0)), hint="activation")
    lines = said(capsys)
    assert lines[0] == "✓ right", lines
    assert lines[1].startswith("✗ not yet: at .layers[0].weight: the values differ"), lines
    assert lines[2].startswith("✗ not yet: ") and lines[2].endswith("Hint: activation."), lines


def test_optax_states_and_dataclasses(capsys):
    import jax
    import jax.numpy as jnp
    import optax

    params = {"w": jnp.ones(3)}
    tx = optax.adam(0.1)
    state = tx.init(params)
    updates, stepped = tx.update(params, state, params)
    check(state, tx.init(params), hint="unused")
    check(stepped, state, hint="one step")

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Linear:
        w: jax.Array
        b: jax.Array

    check(Linear(jnp.ones(2), jnp.zeros(1)), Linear(jnp.ones(2), jnp.zeros(1)), hint="unused")
    check(Linear(jnp.ones(2), jnp.zeros(1)), {"w": jnp.ones(2), "b": jnp.zeros(1)}, hint="a Linear")
    lines = said(capsys)
    assert lines[0] == "✓ right" and lines[2] == "✓ right", lines
    assert lines[1] == "✗ not yet: at [0].count: got 1 (int32). Hint: one step.", lines
    assert lines[3] == "✗ not yet: got a Linear, expected a dict with keys ['w', 'b']. Hint: a Linear.", lines


def test_in_a_notebook_cell_a_wrong_answer_is_one_line(ip):
    from IPython.utils.capture import capture_output

    with capture_output() as shown:
        result = ip.run_cell("import numpy as np\nfrom jaxpar_magic import check\n"
                             "check(np.ones(2), np.zeros(2), hint='multiply by zero')")
    assert result.success
    assert shown.stdout == "✗ not yet: the values differ in 2 of 2 places. Hint: multiply by zero.\n"
    assert "Traceback" not in shown.stdout + shown.stderr


def test_is_a_twin_exported_from_the_package():
    assert jaxpar_magic.check is check


# --- issue 30: what check() itself let through ----------------------------------------------------

def test_tolerances_are_relative_so_tiny_wrong_answers_are_wrong(capsys):
    """An absolute atol=1e-6 passed 2e-6 against 3e-6; a relative tolerance does not, and still
    forgives float noise around a large value and the zeros of an array."""
    check(2e-6, 3e-6, hint="h")
    check(3e-6 * (1 + 1e-7), 3e-6, hint="h")
    check(np.array([0.0, 1e-9, 5.0]), np.array([0.0, 0.0, 5.0]), hint="h")
    assert said(capsys) == ["✗ not yet: got 2e-06. Hint: h.", "✓ right", "✓ right"]


def test_a_condition_must_be_a_boolean(capsys):
    check((x for x in [False]), hint="h")
    check([False], hint="h2")
    check(np.array([True, True]), hint="h3")
    check(True, method=[((c for c in []), "the program sends an all-reduce")], hint="h4")
    check(1490.3, method=[(True, "a number of tokens")], hint="h5")  # an answer judged by its method alone
    lines = said(capsys)
    assert lines[4] == "✓ right"
    assert lines[0].startswith("✗ not yet: the check's condition is a generator, not True or False")
    assert lines[1].startswith("✗ not yet: the check's condition is a list, not True or False")
    assert lines[2] == "✓ right"
    assert lines[3].startswith("✗ not yet: the check's requirement “the program sends an all-reduce” is a generator")


def test_python_ints_of_any_size_compare(capsys):
    check(2**70, float(2**70), hint="h")
    check(2**70, 2**70, hint="h")
    check(2**70 + 1, 2**70, hint="h")
    assert said(capsys) == ["✓ right", "✓ right", f"✗ not yet: got {2**70 + 1}. Hint: h."]


def test_structure_messages_say_where_and_what(capsys):
    check([1.0] * 9 + [None], [1.0] * 10, hint="h")
    check([6.5, 6.5], 6.5, hint="h")
    check([1, 2, [3]], [1, 2, 3], hint="h")
    assert said(capsys) == [
        "✗ not yet: at [9]: got None, expected a number (float). Hint: h.",
        "✗ not yet: got a list of 2 ([6.5, 6.5]), expected one value, not a list. Hint: h.",
        "✗ not yet: at [2]: got a list of 1 ([3]), expected one value, not a list. Hint: h.",
    ]


def test_reading_the_same_graded_run_again_keeps_the_hint(capsys):
    hints = ["first", "second", "third"]
    check(1, 2, hint=hints)
    again = NotRun("the check already graded the exercise cell's last run", again=True)
    check(again, 2, hint=hints)
    check(again, 2, hint=hints)
    check(3, 2, hint=hints)
    assert [line.split(" Hint ")[1][:3] for line in said(capsys)] == ["1/3", "1/3", "1/3", "2/3"]
