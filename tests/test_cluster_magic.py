"""`%cluster` / `%%cluster` without a running cluster: parsing, help, and every UsageError that needs
no processes. Fast: nothing here starts an engine (the slow, real ones are in test_cluster*.py)."""
from __future__ import annotations

import re

import pytest

from jaxpar_magic.cluster import lifecycle as cluster_module
from jaxpar_magic.face import cluster_magic
from jaxpar_magic.cluster.status import ClusterCellError, ClusterStatus, ProcessInfo, explain_missing_name
from jaxpar_magic.errors import UsageError

TIMEOUT = 120.0


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch):
    """As in a fresh kernel: no cluster, running or stopped."""
    assert cluster_module.current() is None, "a test left a cluster running"
    monkeypatch.setattr(cluster_module, "_last", None)


def test_no_subcommand_lists_the_subcommands(ip):
    with pytest.raises(UsageError, match="start, connect, status, stop, restart, push, scatter, gather"):
        cluster_magic.line(ip, "", TIMEOUT)


def test_unknown_subcommand_lists_the_subcommands(ip):
    with pytest.raises(UsageError) as caught:
        cluster_magic.line(ip, "launch -n 2", TIMEOUT)
    message = str(caught.value)
    assert "launch" in message and "unknown subcommand" in message
    for name in ("start", "connect", "status", "stop", "restart", "push", "scatter", "gather"):
        assert name in message


@pytest.mark.parametrize("line, expected", [
    ("start -n 0", "-n 0"),
    ("start -n -3", "-n -3"),
    ("start -n 2 --simulate 0", "--simulate 0"),
    ("start -n two", "invalid int value: 'two'"),
    ("start", "-n"),
    ("start -n", "expected one argument"),
    ("start -n 2 --frobnicate", "unrecognized arguments: --frobnicate"),
])
def test_bad_start_lines(ip, line, expected):
    with pytest.raises(UsageError, match=re.escape(expected)):
        cluster_magic.line(ip, line, TIMEOUT)
    assert cluster_module.current() is None  # nothing was started


def test_an_unbalanced_quote_shows_the_line(ip):
    with pytest.raises(UsageError) as caught:
        cluster_magic.line(ip, "push 'weights", TIMEOUT)
    assert "push 'weights" in str(caught.value)
    assert "quot" in str(caught.value)
    with pytest.raises(UsageError, match="--targets '0"):
        cluster_magic.cell(ip, "--targets '0", "x = 1", TIMEOUT)


def test_names_must_be_python_names(ip):
    ip.user_ns["x"] = 1
    with pytest.raises(UsageError, match="'x-1' is not a Python name"):
        cluster_magic.line(ip, "push x-1", TIMEOUT)


@pytest.mark.parametrize("line", ["stop", "push x", "scatter x", "gather total", "restart", "push x --timeout 5"])
def test_commands_that_need_a_cluster(ip, line):
    ip.user_ns["x"] = 1
    with pytest.raises(UsageError, match="no cluster"):
        cluster_magic.line(ip, line, TIMEOUT)


def test_cluster_cell_needs_a_cluster(ip):
    with pytest.raises(UsageError, match="%%cluster: no cluster is running"):
        cluster_magic.cell(ip, "", "print(1)", TIMEOUT)


@pytest.mark.parametrize("value", ["0", "-3", "nan", "inf"])
def test_cell_timeout_must_be_positive_and_finite(ip, value):
    with pytest.raises(UsageError, match=f"--timeout {value}: a timeout is a positive, finite number"):
        cluster_magic.cell(ip, f"--timeout {value}", "print(1)", TIMEOUT)


def test_status_without_a_cluster_says_how_to_start_one(ip):
    status = cluster_magic.line(ip, "status", TIMEOUT)
    assert status.state == "none"
    assert "%cluster start -n 2" in status.text()
    assert "%cluster start -n 2" in status._repr_html_()


def test_status_html_is_escaped():
    process = ProcessInfo(rank=0, engine_id=0, host="<b>evil</b>", pid=7, platform="cpu",
                          local_devices=("TFRT_CPU_0",), local_device_ids=(0,))
    status = ClusterStatus("broken", "process 1 <died>", "127.0.0.1:1", (process,), True)
    html = status._repr_html_()
    assert "<b>evil</b>" not in html and "&lt;b&gt;evil&lt;/b&gt;" in html
    assert "&lt;died&gt;" in html
    assert "broken (process 1 <died>)" in status.text()
    assert "1 cpu (ids 0-0)" in status.text()


def test_help_names_every_subcommand_and_option():
    for word in ("%cluster start", "%cluster connect", "%cluster status", "%cluster stop", "%cluster restart",
                 "%cluster push", "%cluster scatter", "%cluster gather", "%%cluster", "--simulate", "--coordinator",
                 "--profile", "--cluster-id", "--targets", "--timeout"):
        assert word in cluster_magic.HELP


def test_subcommand_help_flag_prints_its_options(ip, capsys):
    assert cluster_magic.line(ip, "start --help", TIMEOUT) is None
    assert "--simulate" in capsys.readouterr().out


@pytest.mark.parametrize("words, expected", [
    (["0"], [0]), (["0,2"], [0, 2]), (["1-3"], [1, 2, 3]), (["3", "0"], [0, 3]), (["0-1,3"], [0, 1, 3]), (None, None),
])
def test_parse_targets(words, expected):
    assert cluster_magic.parse_targets(words, 4) == expected


@pytest.mark.parametrize("words", [["4"], ["one"], ["2-1"], ["0-9"], ["-1"],
                                   ["²"], ["0-²"], ["١"],  # digits str.isdigit() takes and int() may not
                                   ["0-99999999999"], ["99999999999-99999999999"]])  # refused before building a range
def test_bad_targets(words):
    with pytest.raises(UsageError, match="--targets"):
        cluster_magic.parse_targets(words, 4)


def test_explain_missing_name():
    kernel = {"weights": 1}
    hint = explain_missing_name("name 'weights' is not defined", kernel)
    assert isinstance(hint, UsageError)
    assert "%cluster push weights" in str(hint) and "%cluster scatter weights" in str(hint)
    assert explain_missing_name("weights", kernel) is not None
    assert explain_missing_name("name 'other' is not defined", kernel) is None  # the user's own NameError
    error = ClusterCellError([0, 1], "NameError", "name 'weights' is not defined", "Traceback ...")
    assert str(explain_missing_name(error, kernel)).startswith("in processes 0, 1: 'weights' is defined in the kernel")
    assert explain_missing_name(ClusterCellError([0], "KeyError", "'weights'", ""), kernel) is None


def test_cluster_cell_error_renders_the_first_traceback():
    error = ClusterCellError([1, 3], "ValueError", "boom", "Traceback (most recent call last):\nValueError: boom")
    assert str(error) == "in processes 1, 3: ValueError: boom"
    lines = error._render_traceback_()
    assert lines[0] == "Error in processes 1, 3 of the cluster; the traceback of process 1:"
    assert lines[1:] == ["Traceback (most recent call last):", "ValueError: boom"]


def test_connect_to_a_missing_profile_says_how_to_start_one(ip):
    with pytest.raises(UsageError, match="no running ipyparallel cluster found for profile 'jaxpar-test-absent'"):
        cluster_magic.line(ip, "connect --profile jaxpar-test-absent --timeout 5", TIMEOUT)


def test_connect_checks_the_coordinator_address(ip):
    with pytest.raises(UsageError, match="--coordinator node0:http: give HOST:PORT"):
        cluster_magic.line(ip, "connect --coordinator node0:http", TIMEOUT)


@pytest.mark.parametrize("own, said", [
    (["127.0.1.1", "10.231.0.2"], "resolves to 127.0.1.1 first, a loopback address"),
    (["Name or service not known"], "does not resolve there (Name or service not known)"),
])
def test_a_host_whose_own_name_resolves_badly_is_named_with_the_fix(own, said):
    place = {"host": "hostb", "pid": 1, "own_addresses": own, "interfaces": ["10.231.0.2"]}
    problem = cluster_module.own_name_problem(place)
    assert problem.startswith(f"%cluster connect: on hostb, the host's own name `hostb` {said}.")
    assert "Map `hostb` to 10.231.0.2 in /etc/hosts on hostb" in problem
    assert cluster_module.own_name_problem({**place, "own_addresses": ["10.231.0.2", "127.0.1.1"]}) is None


def test_a_cluster_error_renders_as_one_paragraph():
    # IPython skips the traceback only for an exact UsageError; a ClusterError says it itself.
    error = cluster_module.ClusterError("the cluster is broken: process 1 died. Run `%cluster restart`.")
    assert error._render_traceback_() == ["ClusterError: the cluster is broken: process 1 died. Run `%cluster restart`."]


def test_recovery_depends_on_who_started_the_engines():
    connected = cluster_module.Cluster(owned=False, options={"profile": "pod", "cluster_id": None, "n": 2,
                                                            "coordinator": "hosta:12355", "timeout": None})
    said = connected._recovery()
    assert "`%cluster restart` cannot help" in said and "`ipcluster stop`, then `ipcluster start`" in said
    assert "`%cluster connect --profile pod -n 2 --coordinator hosta:12355` again in this kernel" in said
    started = cluster_module.Cluster(owned=True, options={"n": 2, "simulate": 4, "timeout": None})
    assert started._recovery().startswith("Run `%cluster restart`")
