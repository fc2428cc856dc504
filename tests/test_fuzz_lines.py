"""Every magic's line grammar, fuzzed: a line either parses or raises a UsageError — never another
exception, never Python code evaluated, never the namespace changed.

Lines come from the grammar (valid words, and words off by one: a zero, a negative, a unicode
digit, a missing `=`, an unknown axis) and from arbitrary text (quotes, unicode, `=`, commas,
parentheses, very long input). The parse step is fuzzed hard; whole cells through the shell less
(each valid one compiles). `-m slow` runs many more examples.
"""
from __future__ import annotations

import builtins
import shlex
import textwrap

import jax.numpy as jnp
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from jaxpar_magic.face import cluster_magic
from jaxpar_magic.face.magics import parse_line
from shell_helpers import N_DEVICES, snapshot

FAST, SLOW = 150, 3000
SHELL_FAST, SHELL_SLOW = 20, 300
CANARY = "jpm_canary"  # a builtin that records calls: any evaluation of the line would reach it


@pytest.fixture(autouse=True)
def canary(monkeypatch):
    calls = []
    monkeypatch.setattr(builtins, CANARY, lambda *a: calls.append(a) or 1, raising=False)
    yield calls
    assert calls == [], "a magic line was evaluated as Python"


def sized(examples: int):
    return settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))


# --- words -------------------------------------------------------------------------------------

names = st.sampled_from(["x", "y", "batch", "data", "model", "i", "_", "a1", "mesh", "outer", "inner"])
bad_names = st.sampled_from(["1x", "a-b", "a b", "x\n", "", "'x'", "P(", "é", "None", f"{CANARY}()"])
counts = st.sampled_from(["0", "1", "2", "4", "7", "8", "9", "16", "-1", "²", "٣", "1e3", "999999999999999999999"])
axis_sizes = st.builds(lambda n, c: f"{n}={c}", names, counts)
meshes = st.lists(axis_sizes, min_size=0, max_size=4).map(",".join) | st.sampled_from(
    ["data=4,model=2", "data=4, model=2", "outer=2 inner=4", "data=8", "data", "=8", "data==8", "data=4,data=2"])
spec_entries = st.sampled_from(["data", "model", "None", "(data,model)", "('data', 'model')", "8", "4", "", "()",
                                "'data'", "\"model\"", "nope", "(", ")", f"{CANARY}()", "P('data')"])
specs = st.lists(spec_entries, max_size=4).map(",".join).map(lambda s: s if s else "")
# `NAME=@SPECS`: a pytree of specs from the namespace (`xs` holds one in run_through_shell).
spec_trees = st.sampled_from(["@xs", "@", "@ xs", "@1x", "@x.y", "@@xs", "@None", "@mesh", "@nope", "@xs,data"])
spec_forms = specs | specs.map(lambda s: f"P({s})") | specs.map(lambda s: f"PartitionSpec({s})") | spec_trees
assignments = st.builds(lambda n, s: f"{n}={s}", names | bad_names, spec_forms)
# `--in "ps['b'][0]=data"`: one leaf (or subtree) of a pytree by its path, as jax.tree_util.keystr writes it
# (the shell may strip its quotes: `ps[b][0]`); `ps` is a pytree in run_through_shell.
leaf_paths = st.sampled_from(["['w']", "[w]", "['b']", "['b'][0]", "[b][1]", "[\"b\"][0]", ".w", "['a b']", "[0]",
                              "[", "['w'", "[]", "..x", "[-1]", "['w']['x']", "[ 'w' ]", "[w]=", f"[{CANARY}()]"])
leaf_assignments = st.builds(lambda n, p, s: f"{n}{p}={s}", st.sampled_from(["ps", "x", "nope"]), leaf_paths,
                             spec_forms)
in_assignments = assignments | leaf_assignments
literals = st.sampled_from(["0", "1", "None", "(0, None)", "(None, 0)", "[0, 1]", "(2,)", "()", "'a'", "1.5",
                            "(0, (1, None))", f"{CANARY}()", "__import__('os')", "lambda: 1", "(" * 200 + ")" * 200,
                            "-" * 5000 + "1", "{1: 2}", "True"])
text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=80)
special = st.text(alphabet="'\"=,() \\-_xP0123456789{}$é²\t\n", max_size=60)
# 2,000-6,000 characters, made by repeating a few drawn pieces: drawing each character took half of
# the slow run's time, and hypothesis seldom reached the minimum size that way.
long_text = st.builds(lambda pieces, length: ("".join(pieces) * length)[:length],
                      st.lists(st.text(alphabet="ab=,() '\"", min_size=1, max_size=40), min_size=1, max_size=8),
                      st.integers(2000, 6000))


def quoted(word: str):
    return st.sampled_from([word, shlex.quote(word), f'"{word}"', f"'{word}"])  # the last one: unbalanced


def option(flag: str, values):
    return values.flatmap(lambda v: quoted(v).map(lambda q: f"{flag} {q}"))


def line_of(*parts):
    return st.lists(st.one_of(*parts), max_size=6).map(" ".join)


def flag(name: str):
    return st.just(name)


hardware = st.sampled_from(["tpu-v4", "tpu-v5e", "tpu-v5p", "h100", "a100", "H100", "tpu-v9", "", "custom:",
                            "custom:flops=1e15,hbm=3.3e12,bw=4.5e11,memory=80GiB", "custom:flops=x", "custom:flops=1e15",
                            f"custom:flops={CANARY}()"])
memory_sizes = st.sampled_from(["16GiB", "16 GiB", "16GB", "1.5TiB", "17179869184", "0", "-1GiB", "16G", "lots",
                                "1e400GiB", "nanGiB", f"{CANARY}()"])
planning = st.one_of(flag("--plan"), option("--hardware", hardware), option("--device-memory", memory_sizes),
                     flag("--explore"))
# --profile runs the program again under the profiler: a profile of one step keeps a fuzzed cell quick.
profiling = st.one_of(flag("--profile --profile-steps 1"),
                      option("--profile-steps", st.sampled_from(["1", "0", "-2", "x", "101", "2.5", f"{CANARY}()"])))
pmap_lines = line_of(
    option("-a", names | bad_names), option("--axis-name", names | bad_names),
    option("--devices", counts | st.sampled_from(["0 2 4 6", "0,1", "0 0", "x"])),
    option("--mesh", meshes), option("--broadcast", names | bad_names), option("--split", names | bad_names),
    option("--merge", names | bad_names), option("--in-axes", literals), option("--out-axes", literals),
    option("--static-broadcasted-argnums", literals), option("--donate-argnums", literals),
    flag("--show"), flag("--no-show"), flag("--report"), flag("--nope"), flag("-"), flag("--"),
    flag("--collectives"), flag("--as-code"), planning, profiling,
)
# --out lists what a cell returns: NAME=SPEC or a bare NAME, mixed (`--out loss grads=data`).
outputs = st.lists(assignments | names | bad_names, min_size=1, max_size=3).map(" ".join)
# %mesh's options for an inline --mesh (`--mesh data=4,model=2 --axis-types auto --devices 4 --abstract`)
inline_mesh = st.one_of(option("--axis-types", st.sampled_from(["auto", "explicit", "manual", "Auto", "x"])),
                        option("--devices", counts | st.sampled_from(["0 2 4 6", "6 4 2 0", "0,1", "0 0", "x"])),
                        flag("--abstract"))
shard_lines = line_of(
    option("--mesh", meshes | names | bad_names), option("--in", in_assignments), option("--out", outputs),
    st.lists(in_assignments, min_size=2, max_size=3).map(lambda a: "--in " + " ".join(a)),
    option("--donate", names | bad_names), inline_mesh,
    flag("--show"), flag("--no-show"), flag("--report"), flag("--bogus"), flag("--as-code"), planning, profiling,
)
shard_map_lines = line_of(
    option("--mesh", meshes | names | bad_names), option("--in", in_assignments), option("--out", outputs),
    inline_mesh,
    flag("--no-check-vma"), flag("--show"), flag("--no-show"), flag("--report"), flag("--check-vma"),
    flag("--collectives"), flag("--as-code"), planning, profiling,
)
mesh_lines = line_of(
    meshes, axis_sizes, names, option("--name", names | bad_names), option("--axis-types", st.sampled_from(
        ["auto", "explicit", "manual", "Auto", "x"])), option("--devices", counts), flag("--abstract"),
    flag("--no-show"),
)
sharding_lines = line_of(names, bad_names)
devices_lines = line_of(option("--simulate", counts), flag("--other"))

cluster_lines = st.one_of(
    st.tuples(st.sampled_from(["start", "connect", "status", "stop", "restart", "push", "scatter", "gather",
                               "bogus", "", "START"]),
              line_of(option("-n", counts), option("--processes", counts), option("--simulate", counts),
                      option("--timeout", st.sampled_from(["10", "0", "-1", "nan", "inf", "1e400", "x", "2.5"])),
                      option("--profile", names | bad_names), option("--cluster-id", names | bad_names),
                      option("--coordinator", st.sampled_from(["127.0.0.1:1234", "host", "::", "a:b:c"])),
                      names, bad_names, flag("--help"))).map(" ".join),
)
cluster_cell_lines = line_of(option("--timeout", st.sampled_from(["10", "0", "-5", "nan", "inf", "x"])),
                             option("--targets", st.sampled_from(["0", "0,1", "1-3", "3-1", "a", "-1", "0 1"])),
                             flag("--bogus"))

GRAMMARS = {"pmap": pmap_lines, "shard": shard_lines, "mesh": mesh_lines, "sharding": sharding_lines,
            "devices": devices_lines, "shard_map": shard_map_lines}


PARSED_ONLY = {"cluster": cluster_lines, "cluster_cell": cluster_cell_lines}  # running them starts processes


def any_line(magic: str):
    grammar = GRAMMARS[magic] if magic in GRAMMARS else PARSED_ONLY[magic]  # strategies have no truth value
    return st.one_of(grammar, text, special, long_text, st.tuples(grammar, special).map(" ".join))


def parses_or_usage_error(magic: str, line: str):
    parse_line.cache_clear()  # each example parses for real
    try:
        if magic == "cluster":
            return cluster_magic.parse(line)
        if magic == "cluster_cell":
            return cluster_magic.parse_cell(line)
        return parse_line(magic, line)
    except UsageError as err:
        message = str(err)
        assert message.strip(), "an empty UsageError"
        assert "Traceback" not in message
        return None


# --- the parse step, hard ------------------------------------------------------------------------

@pytest.mark.parametrize("magic", sorted(GRAMMARS) + sorted(PARSED_ONLY))
@sized(FAST)
@given(data=st.data())
def test_every_line_parses_or_is_a_usage_error(magic, data):
    parses_or_usage_error(magic, data.draw(any_line(magic)))


@pytest.mark.slow
@pytest.mark.parametrize("magic", sorted(GRAMMARS) + sorted(PARSED_ONLY))
@sized(SLOW)
@given(data=st.data())
def test_every_line_parses_or_is_a_usage_error_many(magic, data):
    parses_or_usage_error(magic, data.draw(any_line(magic)))


@pytest.mark.parametrize("magic", sorted(GRAMMARS))
def test_grammar_lines_do_parse_sometimes(magic):
    """The grammar strategies are not all noise: a known-good line of each magic parses."""
    good = {"pmap": "-a 'batch' --mesh 'outer=2, inner=4' --broadcast w --in-axes '(0, None)'",
            "shard": "--mesh data=4,model=2 --axis-types auto --in \"w=P('data', None)\" x=data \"ps['b'][0]=data\" "
                     "--out y=None --report",
            "mesh": "'data=4, model=2' --name m --axis-types explicit --devices 8",
            "sharding": "x 'y'", "devices": "--simulate '8'",
            "shard_map": "--mesh 'x=4, y=2' --in \"a=P('x', 'y')\" b=y,None --out c=x,None --no-check-vma"}[magic]
    assert parses_or_usage_error(magic, good) is not None


# --- whole cells through the shell -----------------------------------------------------------

CELL = "y = x + ps['w'] + ps['b'][1]"


def run_through_shell(ip, magic: str, line: str):
    """Run the magic in the shell; on a UsageError the namespace is exactly as it was."""
    from jax.sharding import PartitionSpec

    ip.push({"x": jnp.arange(float(N_DEVICES)), "xs": PartitionSpec("data"),
             "ps": {"w": jnp.ones(N_DEVICES), "b": [jnp.zeros(N_DEVICES), jnp.arange(float(N_DEVICES))]}})
    before = snapshot(ip.user_ns)
    try:
        with capture_output():
            if magic in ("pmap", "shard", "shard_map"):
                ip.run_cell_magic(magic, line, textwrap.dedent(CELL))
            else:
                ip.run_line_magic(magic, line)
    except UsageError:
        assert snapshot(ip.user_ns) == before
        return False
    changed = {n for n in set(before) | set(ip.user_ns) if before.get(n) != id(ip.user_ns.get(n, before))}
    if magic == "mesh":
        allowed = {parse_line("mesh", line).name}  # %mesh binds the name it is given
    else:
        allowed = {"pmap": {"y"}, "shard": {"y", "x", "ps"}, "shard_map": {"y"}, "sharding": set(),
                   "devices": set()}[magic]
    if "--plan" in line.split():
        allowed = allowed | {"_plan"}  # a plan binds itself as `_plan` (README, "--plan")
    if "--profile" in line.split():
        allowed = allowed | {"_profile"}  # a profile binds itself as `_profile` (README, "--profile")
    if "--explore" in line.split():
        allowed = allowed | {"_explorer"}  # the layout explorer binds itself as `_explorer`
    assert changed <= allowed | {"_", "__", "___"}, changed
    return True


@pytest.mark.parametrize("magic", sorted(GRAMMARS))
@sized(SHELL_FAST)
@given(data=st.data())
def test_whole_magics_either_run_or_leave_the_namespace_alone(jx, magic, data):
    run_through_shell(jx, magic, data.draw(GRAMMARS[magic] | special))


@pytest.mark.slow
@pytest.mark.parametrize("magic", sorted(GRAMMARS))
@sized(SHELL_SLOW)
@given(data=st.data())
def test_whole_magics_either_run_or_leave_the_namespace_alone_many(jx, magic, data):
    run_through_shell(jx, magic, data.draw(GRAMMARS[magic] | special))
