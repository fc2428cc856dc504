"""Reading a magic's line: POSIX shell words, the magic's own argparse parser, then our small
grammars (mesh shapes, device selections, PartitionSpecs, literals) into one options record.

The parse step of parse -> plan -> run -> show. It evaluates nothing and touches no namespace, so
any line either gives an options record or raises a UsageError (tests/test_fuzz_lines.py).
"""
from __future__ import annotations

import functools
import re
import shlex
from dataclasses import dataclass

from ..cell.specs import InlineMesh, MeshShape, parse_assignments, parse_device_selection, parse_literal, parse_mesh_shape
from ..errors import UsageError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def shell_words(line: str, magic: str) -> list[str]:
    """The line split as a POSIX shell would: `-a 'batch'` gives `batch`, quotes removed."""
    try:
        return shlex.split(line)
    except ValueError as err:  # "No closing quotation", "No escaped character"
        raise UsageError(
            f"{magic}: cannot read the line `{line.strip()}` ({err}). It is read like a shell command line: close "
            f"the quote, or escape a lone quote with a backslash (`\\'`)."
        ) from None


@functools.lru_cache(maxsize=256)
def _parsed(parser, magic: str, line: str):
    words = shell_words(line, magic)
    try:
        return parser.parse_args(words)
    except UsageError as err:  # argparse's own words ("unrecognized arguments: --x"): say where, and the help
        raise UsageError(f"{magic} {line.strip()}: {err}. `{magic}?` lists the options.") from None


def parse_args(magic_function, magic: str, line: str):
    """argparse's namespace for `line`, through the parser `magic_arguments` built for the magic.

    Cached by the line's text: re-running a cell is the hot path (bench/).
    """
    return _parsed(magic_function.parser, magic, line)


def python_names(words, option: str) -> tuple[str, ...]:
    """Names given to an option (`--broadcast x y`): each must be a Python identifier."""
    names = tuple(words or ())
    for word in names:
        if not _NAME.fullmatch(word):
            raise UsageError(
                f"{option}: {word!r} is not a Python name; {option} takes names of variables, separated by spaces, "
                f"e.g. `{option} x y`."
            )
    return names


def _literal(text, option: str, default):
    value = parse_literal(text, option)
    return default if text is None else value


def mesh_argument(words, option: str = "--mesh", args=None) -> MeshShape | str | None:
    """`--mesh NAME` (a Mesh in the namespace) or `--mesh data=4,model=2` (built inline, with `%mesh`'s
    `--axis-types`, `--devices` and `--abstract` from `args` where the magic has them)."""
    given = {flag: value for flag, value in (("--axis-types", getattr(args, "axis_types", None)),
                                             ("--devices", getattr(args, "devices", None)),
                                             ("--abstract", getattr(args, "abstract", False) or None))
             if value is not None}
    text = " ".join(words or ())
    if given and "=" not in text:
        flag = next(iter(given))
        example = f"`{option} data=4,model=2 {flag}{'' if flag == '--abstract' else ' ...'}`"
        which = (f"`{option} {text}` names a mesh built already, with its own axis types and devices" if text else
                 f"this line has no {option}")
        raise UsageError(f"{flag}: it builds a mesh given inline, as %mesh does ({example}); {which}.")
    if not words:
        return None
    if "=" in text:
        shape = parse_mesh_shape(list(words), option)
        if not given:
            return shape
        return InlineMesh(shape.names, shape.sizes, axis_types=getattr(args, "axis_types", None),
                          devices=parse_device_selection(getattr(args, "devices", None)),
                          abstract=bool(getattr(args, "abstract", False)))
    if _NAME.fullmatch(text):
        return text
    raise UsageError(
        f"{option} {text}: give the name of a Mesh in your namespace (`{option} mesh`) or its axes inline "
        f"(`{option} data=4,model=2`)."
    )


# --- one record per magic ------------------------------------------------------------------------

@dataclass(frozen=True)
class PlanOptions:
    """--plan [--hardware NAME] [--device-memory SIZE] [--topology AxB] [--compare NAME | --search BATCH...]:
    compile for the mesh, run nothing."""

    hardware: object  # hardware.Hardware or None (with its --topology attached)
    device_memory: int | None
    compare: str | None = None  # the name of a dict of layouts
    search: tuple[str, ...] = ()  # batch inputs, for the proposed layouts
    explore: bool = False  # --explore: the layout explorer (%%shard only)


def plan_options(args, magic: str) -> PlanOptions | None:
    """The --plan record of a line, or None; planning options without --plan are a mistake."""
    from ..stages.plan.hardware import parse_hardware, parse_memory_size

    compare, search, topology = (getattr(args, k, None) for k in ("compare", "search", "topology"))
    explore = bool(getattr(args, "explore", False))
    extras = [f for f, v in (("--hardware", args.hardware), ("--device-memory", args.device_memory),
                             ("--topology", topology), ("--compare", compare), ("--search", search)) if v is not None]
    if not args.plan:
        if getattr(args, "profile", False):  # --profile --hardware: the plan beside the measurement
            extras = [f for f in extras if f != "--hardware"]
        if explore:
            raise UsageError(f"{magic} --explore: the explorer re-plans the cell under the layouts you choose; add "
                             f"--plan (`%%shard --plan --explore ...`).")
        if extras:
            raise UsageError(f"{magic} {extras[0]}: only a planned cell has a device to fit; add --plan to the line.")
        return None
    for flag, clash in (("--as-code", args.as_code), ("--collectives", getattr(args, "collectives", False))):
        if clash:
            raise UsageError(
                f"{magic} --plan {flag}: --plan compiles the cell without running it, "
                + ("and --as-code prints its code instead; use one of them." if flag == "--as-code" else
                   "so no collective runs to be watched; plan first, then run with --collectives.")
            )
    from ..stages.plan.topology import with_topology

    if (compare is not None or search is not None) and magic == "%%pmap":
        flag = "--compare" if compare is not None else "--search"
        raise UsageError(f"%%pmap --plan {flag}: layouts are PartitionSpecs per input, which %%pmap does not take; "
                         f"compare layouts with `%%shard --plan {flag} ...` (or %%shard_map).")
    if explore and magic != "%%shard":
        raise UsageError(f"{magic} --plan --explore: the explorer chooses PartitionSpecs per input of a %%shard cell; "
                         f"explore this computation as `%%shard --plan --explore ...`.")
    if explore and (compare is not None or search is not None):
        flag = "--compare" if compare is not None else "--search"
        raise UsageError(f"{magic} --plan --explore {flag}: the explorer ranks the layouts you try itself; use "
                         f"--explore or {flag}.")
    if compare is not None and search is not None:
        raise UsageError(f"{magic} --plan --compare --search: compare your own layouts or let --search propose "
                         f"them; use one of them.")
    hardware = parse_hardware(args.hardware) if args.hardware is not None else None
    if topology is not None:
        hardware = with_topology(hardware, topology)
    memory = parse_memory_size(args.device_memory) if args.device_memory is not None else None
    return PlanOptions(hardware, memory, python_names([compare], "--compare")[0] if compare is not None else None,
                       python_names(search, "--search") if search is not None else (), explore)


@dataclass(frozen=True)
class ProfileOptions:
    """--profile [--profile-steps N] [--hardware NAME]: run the cell, then its program N more times under
    the profiler (stages/profile/)."""

    steps: int
    hardware: object = None  # hardware.Hardware or None: the profile the plan beside the measurement prices


def profile_options(args, magic: str) -> ProfileOptions | None:
    """The --profile record of a line, or None; --profile-steps without --profile is a mistake."""
    steps = getattr(args, "profile_steps", None)
    if not getattr(args, "profile", False):
        if steps is not None:
            raise UsageError(f"{magic} --profile-steps {steps}: the steps are those of a profile; add --profile "
                             f"(`{magic} --profile --profile-steps {steps} ...`).")
        return None
    for flag, clash in (("--plan", args.plan), ("--as-code", args.as_code)):
        if clash:
            raise UsageError(f"{magic} --profile {flag}: --profile measures the cell's run, and {flag} runs nothing; "
                             f"use one of them (with --profile, --hardware puts the plan beside the measurement).")
    from ..stages.plan.hardware import parse_hardware
    from ..stages.profile.profile_cell import DEFAULT_STEPS, check_profile

    steps = check_profile(DEFAULT_STEPS if steps is None else steps, magic, donate=tuple(getattr(args, "donate", ())),
                          collectives=bool(getattr(args, "collectives", False)))
    return ProfileOptions(steps, parse_hardware(args.hardware) if args.hardware is not None else None)


@dataclass(frozen=True)
class DevicesLine:
    simulate: int | None


@dataclass(frozen=True)
class MeshLine:
    shape: MeshShape | None  # None: show the mesh called `show_name`
    show_name: str | None
    name: str
    axis_types: str | None  # None: what jax.make_mesh gives
    devices: int | tuple[int, ...] | None
    abstract: bool
    show: bool


@dataclass(frozen=True)
class ShardingLine:
    names: tuple[str, ...]


@dataclass(frozen=True)
class PmapLine:
    axis_name: str | None
    devices: int | tuple[int, ...] | None
    mesh: MeshShape | None
    broadcast: tuple[str, ...]
    split: tuple[str, ...]
    merge: tuple[str, ...]
    in_axes: object
    out_axes: object
    static_broadcasted_argnums: object
    donate_argnums: object
    show: bool | None
    report: bool
    as_code: bool = False
    collectives: bool = False
    plan: PlanOptions | None = None
    profile: ProfileOptions | None = None  # --profile: the measured run (stages/profile/)


@dataclass(frozen=True)
class ShardLine:
    mesh: MeshShape | str | None
    in_specs: dict
    out_specs: dict
    show: bool | None
    report: bool
    as_code: bool = False
    plan: PlanOptions | None = None
    outputs: tuple[str, ...] | None = None  # with --out: the only names the cell returns (None: all it assigns)
    donate: tuple[str, ...] = ()  # inputs whose buffers the program may reuse (jax.jit's donate_argnums)
    profile: ProfileOptions | None = None  # --profile: the measured run (stages/profile/)


@dataclass(frozen=True)
class ShardMapLine:
    mesh: MeshShape | str | None
    in_specs: dict
    out_specs: dict
    check_vma: bool
    show: bool | None
    report: bool
    as_code: bool = False
    collectives: bool = False
    plan: PlanOptions | None = None
    outputs: tuple[str, ...] | None = None  # with --out: the only names the cell returns (None: all it assigns)
    profile: ProfileOptions | None = None  # --profile: the measured run (stages/profile/)


def devices_line(args) -> DevicesLine:
    if args.simulate is not None and args.simulate < 1:
        raise UsageError(f"%devices --simulate {args.simulate}: the device count must be positive, e.g. `--simulate 8`.")
    return DevicesLine(args.simulate)


def mesh_line(args) -> MeshLine:
    axes = list(args.axes or ())
    name = python_names([args.name], "--name")[0]
    devices = parse_device_selection(args.devices)
    if not axes or (len(axes) == 1 and "=" not in axes[0]):
        shown = python_names(axes, "%mesh")[0] if axes else name
        return MeshLine(None, shown, name, args.axis_types, devices, args.abstract, args.show)
    return MeshLine(parse_mesh_shape(axes, "%mesh"), None, name, args.axis_types, devices, args.abstract, args.show)


def sharding_line(args) -> ShardingLine:
    return ShardingLine(python_names(args.names, "%sharding"))


def pmap_line(args) -> PmapLine:
    axis_name = args.axis_name
    if axis_name is not None and not _NAME.fullmatch(axis_name):
        raise UsageError(
            f"--axis-name {axis_name!r}: an axis name is a Python identifier (letters, digits, _), e.g. `-a batch`; "
            "collectives then use it as `lax.psum(x, 'batch')`."
        )
    return PmapLine(
        axis_name=axis_name,
        devices=parse_device_selection(args.devices),
        mesh=parse_mesh_shape(list(args.mesh), "--mesh") if args.mesh else None,
        broadcast=python_names(args.broadcast, "--broadcast"),
        split=python_names(args.split, "--split"),
        merge=python_names(args.merge, "--merge"),
        in_axes=_literal(args.in_axes, "--in-axes", 0),
        out_axes=_literal(args.out_axes, "--out-axes", 0),
        static_broadcasted_argnums=_literal(args.static_broadcasted_argnums, "--static-broadcasted-argnums", ()),
        donate_argnums=_literal(args.donate_argnums, "--donate-argnums", ()),
        show=args.show,
        report=args.report,
        as_code=args.as_code,
        collectives=args.collectives,
        plan=plan_options(args, "%%pmap"),
        profile=profile_options(args, "%%pmap"),
    )


def output_names(words) -> tuple[dict, tuple[str, ...] | None]:
    """`--out c=x total`: (the specs given, every name listed, in order), like a `return c, total`;
    (empty, None) without --out. A bare name is returned as the cell computes it; a word that carries
    on a spec split by a space (`w=data, None`, `w=P('data', None)`) stays with its spec."""
    if not words:
        return {}, None
    spec_words, listed = [], []
    for word in words:
        continues = bool(spec_words) and spec_words[-1].rstrip().endswith((",", "("))
        if "=" not in word and not continues and _NAME.fullmatch(word) and word != "None":
            listed.append(word)  # a bare name
            continue
        spec_words.append(word)
        if "=" in word:
            listed.append(word.partition("=")[0].strip())
    specs = parse_assignments(spec_words, "--out")
    for name in listed:
        if listed.count(name) > 1:
            raise UsageError(f"--out: {name!r} appears twice; list each output once.")
    return specs, tuple(listed)


def _cell_mesh(args, magic: str):
    """--mesh of a %%shard or %%shard_map line; an abstract one only with --plan (it has no devices to run on)."""
    mesh = mesh_argument(args.mesh, args=args)
    if getattr(mesh, "abstract", False) and not args.plan:
        raise UsageError(f"{magic} --abstract: an AbstractMesh has no devices to run the cell on; add --plan to plan it "
                         f"(with --hardware and --topology, XLA:TPU compiles for the slice), or drop --abstract.")
    return mesh


def shard_line(args) -> ShardLine:
    out_specs, outputs = output_names(list(args.outs or ()))
    return ShardLine(
        mesh=_cell_mesh(args, "%%shard"),
        in_specs=parse_assignments(list(args.ins or ()), "--in"),
        out_specs=out_specs,
        outputs=outputs,
        donate=python_names(args.donate, "--donate"),
        show=args.show,
        report=args.report,
        as_code=args.as_code,
        plan=plan_options(args, "%%shard"),
        profile=profile_options(args, "%%shard"),
    )


def shard_map_line(args) -> ShardMapLine:
    out_specs, outputs = output_names(list(args.outs or ()))
    return ShardMapLine(
        mesh=_cell_mesh(args, "%%shard_map"),
        in_specs=parse_assignments(list(args.ins or ()), "--in"),
        out_specs=out_specs,
        outputs=outputs,
        check_vma=args.check_vma,
        show=args.show,
        report=args.report,
        as_code=args.as_code,
        collectives=args.collectives,
        plan=plan_options(args, "%%shard_map"),
        profile=profile_options(args, "%%shard_map"),
    )


@dataclass(frozen=True)
class ExerciseLine:
    answers: tuple[str, ...]


def exercise_line(args) -> ExerciseLine:
    return ExerciseLine(answers=python_names(args.answers, "%%exercise"))
