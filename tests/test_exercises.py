"""`jaxpar_magic.check`, the exercises' check cells: one line when right, one line with the hint
when wrong (no traceback), and a failed cell, so a notebook run with wrong solutions fails."""
from __future__ import annotations

import numpy as np
import pytest
from IPython.utils.capture import capture_output

import jaxpar_magic
from jaxpar_magic.face.exercises import NotYet, check


def test_right_answers_say_so(capsys):
    check(np.arange(4.0), np.arange(4.0) + 1e-9, hint="unused")
    check(3, 3, hint="unused", done="three it is")
    check(True, hint="unused")
    assert capsys.readouterr().out == "✓ right\n✓ three it is\n✓ right\n"


@pytest.mark.parametrize("got, want, says", [
    (np.zeros(3), np.zeros((3, 1)), "the shape is (3,), expected (3, 1)"),
    (np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.5, 3.5]), "the values differ in 2 of 3 places"),
    ("psum", "pmean", "got 'psum'"),
    (None, np.zeros(2), "the shape is (), expected (2,)"),
    (False, None, "the check is false"),
])
def test_wrong_answers_give_what_differs_and_the_hint(got, want, says):
    args = (got,) if want is None and got is False else (got, want)
    with pytest.raises(NotYet) as raised:
        check(*args, hint="think of the ring")
    assert str(raised.value) == f"not yet: {says}. Hint: think of the ring"


def test_in_a_notebook_cell_a_wrong_answer_is_one_line_and_fails_the_cell(ip):
    with capture_output() as shown:
        result = ip.run_cell("import numpy as np\nfrom jaxpar_magic import check\ncheck(np.ones(2), np.zeros(2), hint='multiply by zero')")
    assert isinstance(result.error_in_exec, NotYet)  # ipykernel replies 'error': nbclient stops there
    said = shown.stdout + shown.stderr
    assert said.strip() == "✗ not yet: the values differ in 2 of 2 places. Hint: multiply by zero"
    assert "Traceback" not in said


def test_is_a_twin_exported_from_the_package():
    assert jaxpar_magic.check is check


@pytest.mark.slow
def test_in_a_real_kernel_the_error_output_is_one_line(tmp_path):
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("from jaxpar_magic import check\ncheck(2 + 2, 5, hint='count again')"),
        nbformat.v4.new_code_cell("check(2 + 2, 4, hint='unused')"),
    ])
    km = KernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))
    NotebookClient(nb, km=km, timeout=60, allow_errors=True, resources={"metadata": {"path": str(tmp_path)}}).execute()
    (error,) = nb.cells[0].outputs
    assert error.output_type == "error" and error.ename == "NotYet"
    assert error.traceback == ["✗ not yet: got 4. Hint: count again"]
    assert [o.get("text") for o in nb.cells[1].outputs] == ["✓ right\n"]
