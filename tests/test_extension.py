"""Loading the extension: cheap, idempotent, reversible, configurable, and never starting JAX."""
from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from shell_helpers import pmap, run_python


def test_loading_twice_is_harmless(ip):
    with capture_output():
        ip.run_line_magic("load_ext", "jaxpar_magic")
    ip.extension_manager.reload_extension("jaxpar_magic")  # registering again replaces the magics
    assert ip.find_cell_magic("pmap") is not None
    assert ip.find_line_magic("devices") is not None
    ip.push({"x": __import__("numpy").arange(8.0)})
    pmap(ip, "--no-show", "y = x + 1")
    assert ip.user_ns["y"].shape == (8,)


def test_unload_removes_the_magics(ip):
    ip.run_line_magic("unload_ext", "jaxpar_magic")
    try:
        assert ip.find_cell_magic("pmap") is None
        assert ip.find_line_magic("devices") is None
        assert "JaxparMagics" not in ip.magics_manager.registry
        with pytest.raises(UsageError, match="pmap"):
            ip.run_cell_magic("pmap", "", "y = 1")
    finally:
        ip.run_line_magic("load_ext", "jaxpar_magic")
    assert ip.find_cell_magic("pmap") is not None


def test_pmap_help_is_the_argument_parser():
    from jaxpar_magic.face.magics import JaxparMagics

    doc = JaxparMagics.pmap.__doc__
    for option in ("--axis-name", "--broadcast", "--split", "--merge", "--mesh", "--devices", "--in-axes",
                   "--out-axes", "--static-broadcasted-argnums", "--donate-argnums", "--show", "--no-show",
                   "--report"):
        assert option in doc, option
    assert "ONE device" in doc  # the magic's own description comes first


def test_pmap_help_reaches_the_user_through_the_inspector(ip):
    info = ip.object_inspect("%%pmap")
    assert info["found"]
    assert "--axis-name" in info["docstring"]
    assert "--broadcast" in info["docstring"]


def test_devices_help_names_simulate():
    from jaxpar_magic.face.magics import JaxparMagics

    assert "--simulate" in JaxparMagics.devices.__doc__


def test_unknown_option_is_a_usage_error(jx):
    with pytest.raises(UsageError, match="--bogus"):
        pmap(jx, "--bogus", "y = 1")


# --- %config ---------------------------------------------------------------------------------------

def test_config_changes_the_default_axis_name(jx):
    jx.push({"x": __import__("numpy").arange(8.0)})
    jx.run_line_magic("config", "JaxparMagics.axis_name = 'batch'")
    pmap(jx, "--no-show", "s = lax.psum(x, 'batch')")
    assert jx.user_ns["s"].tolist() == [28.0] * 8
    with pytest.raises(UsageError, match="'i'"):
        pmap(jx, "--no-show", "t = lax.psum(x, 'i')")


def test_axis_name_flag_overrides_the_configured_default(jx):
    jx.push({"x": __import__("numpy").arange(8.0)})
    jx.run_line_magic("config", "JaxparMagics.axis_name = 'batch'")
    pmap(jx, "--no-show --axis-name devs", "s = lax.psum(x, 'devs')")
    assert jx.user_ns["s"].tolist() == [28.0] * 8
    pmap(jx, "--no-show -a j", "t = lax.pmax(x, 'j')")
    assert jx.user_ns["t"].tolist() == [7.0] * 8


def test_config_show_false_is_overridden_by_show_flag(jx):
    jx.push({"x": __import__("numpy").arange(8.0)})
    jx.run_line_magic("config", "JaxparMagics.show = False")
    with capture_output() as quiet:
        pmap(jx, "", "y = x * 2")
    assert quiet.outputs == []
    with capture_output() as shown:
        pmap(jx, "--show", "y = x * 2")
    assert len(shown.outputs) == 1


# --- a fresh process: the backend is not started by import or load ---------------------------------

def test_import_and_load_ext_leave_the_backend_unstarted():
    result = run_python(
        """
        import sys
        import jaxpar_magic
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.utils.capture import capture_output
        from traitlets.config import Config
        from IPython.core.error import UsageError

        config = Config()
        config.HistoryManager.enabled = False
        ip = InteractiveShell.instance(config=config)
        ip.run_line_magic("load_ext", "jaxpar_magic")
        print("jax imported by load:", "jax" in sys.modules)
        with capture_output() as shown:
            ip.run_line_magic("devices", "--simulate 4")
        import jax
        print("device_count:", jax.device_count())
        print("shown:", len(shown.outputs))
        with capture_output():
            ip.run_line_magic("devices", "--simulate 4")  # the same count again is fine
        try:
            ip.run_line_magic("devices", "--simulate 2")
        except UsageError as err:
            print("error:", err)
        """
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "jax imported by load: False" in out
    assert "device_count: 4" in out
    assert "shown: 1" in out
    assert "error:" in out
    error = out.split("error:", 1)[1]
    assert "Restart the kernel" in error or "restart the kernel" in error
    assert "4" in error and "--simulate 2" in error


def test_a_platform_the_user_chose_is_left_alone(monkeypatch):
    """With libtpu installed and no TPU, %load_ext starts JAX on the CPU without probing for a TPU
    (tests/test_tpu_plans.py runs a kernel that way); a platform the user chose is theirs."""
    from jaxpar_magic.cell import devices

    monkeypatch.setenv("JAX_PLATFORMS", "cpu,tpu")
    assert devices.cpu_when_nothing_attached() is False
    assert __import__("os").environ["JAX_PLATFORMS"] == "cpu,tpu"
    monkeypatch.delenv("JAX_PLATFORMS")
    monkeypatch.setattr(devices, "accelerator_attached", lambda: True)
    assert devices.cpu_when_nothing_attached() is False  # a TPU or GPU host: JAX picks as it always does
