"""%devices and cell/devices.py: the facts shown, counts per platform, device selection, simulation.

The process runs on 8 simulated CPU devices (conftest); a backend that starts fresh is tested in
test_extension.py.
"""
from __future__ import annotations

import jax
import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from shell_helpers import N_DEVICES, shown_widgets
from jaxpar_magic.cell import devices as dev


def check_state(state: dict) -> None:
    assert state["total"] == N_DEVICES
    assert state["omitted"] == 0
    assert [d["id"] for d in state["devices"]] == [d.id for d in jax.devices()]
    for d in state["devices"]:
        assert d["platform"] == "cpu"
        assert isinstance(d["kind"], str) and d["kind"]
        assert d["process"] == 0
    assert state["counts"] == {"cpu": N_DEVICES, "gpu": 0, "tpu": 0}
    assert state["processes"] == [{"process": 0, "count": N_DEVICES}]
    assert state["backend"] == "cpu"
    assert state["simulated"] is True


def test_devices_state_lists_every_device_with_counts_and_processes():
    check_state(dev.devices_state())


def test_counting_an_absent_platform_gives_zero_not_an_exception():
    assert dev.device_count("gpu") == 0
    assert dev.device_count("tpu") == 0
    assert dev.device_count("cpu") == N_DEVICES


def test_devices_magic_displays_a_view_of_that_state(ip):
    with capture_output() as captured:
        ip.run_line_magic("devices", "")
    (view,) = shown_widgets(captured)
    assert type(view).__name__ == "DevicesView"
    check_state(view.state)
    assert "text/html" in captured.outputs[0].data  # a static form for exported notebooks


def test_plain_python_twin_returns_the_same_view():
    import jaxpar_magic

    view = jaxpar_magic.show_devices()
    check_state(view.state)


def test_devices_state_is_bounded_to_max_listed_rows(monkeypatch):
    monkeypatch.setattr(dev, "MAX_LISTED", 3)
    state = dev.devices_state()
    assert len(state["devices"]) == 3
    assert state["omitted"] == N_DEVICES - 3
    assert state["total"] == N_DEVICES


# --- simulation after the backend started ----------------------------------------------------------

def test_simulating_the_count_already_running_is_harmless(ip):
    with capture_output():
        ip.run_line_magic("devices", f"--simulate {N_DEVICES}")
    assert jax.device_count() == N_DEVICES


def test_simulating_another_count_after_start_says_restart_the_kernel(ip):
    before = dict(ip.user_ns)
    with pytest.raises(UsageError, match=r"(?i)restart the kernel") as info:
        ip.run_line_magic("devices", "--simulate 4")
    message = str(info.value)
    assert "--simulate 4" in message
    assert str(N_DEVICES) in message  # says how many devices it already has
    assert jax.device_count() == N_DEVICES
    assert ip.user_ns == before


def test_simulate_rejects_a_non_positive_count(ip):
    with pytest.raises(UsageError, match="positive"):
        ip.run_line_magic("devices", "--simulate 0")


# --- which devices a cell runs on ------------------------------------------------------------------

def test_select_all_first_n_and_ids():
    assert [d.id for d in dev.select_devices(None)] == [d.id for d in jax.local_devices()]
    assert [d.id for d in dev.select_devices(4)] == [d.id for d in jax.local_devices()[:4]]
    assert [d.id for d in dev.select_devices((6, 0, 2))] == [6, 0, 2]


@pytest.mark.parametrize(
    "selection, pattern",
    [(16, r"16.*JAX has 8 device"), (0, r"JAX has 8 device"), ((0, 99), r"no device with id 99"),
     ((1, 1), r"listed twice")],
)
def test_select_devices_errors(selection, pattern):
    with pytest.raises(UsageError, match=pattern):
        dev.select_devices(selection)
