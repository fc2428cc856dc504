"""stages/plan/hardware.py: the built-in device profiles, custom profiles, and memory sizes, with every mistake."""
from __future__ import annotations

import json

import pytest

from jaxpar_magic.errors import UsageError
from jaxpar_magic.stages.plan.hardware import CUSTOM_EXAMPLE, PROFILES, Hardware, parse_hardware, parse_memory_size

REQUIRED = ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "h100", "a100", "b200")
STATE_KEYS = {"name", "peak_flops", "hbm_bandwidth", "interconnect_bandwidth", "memory", "source", "kind",
              "link_bandwidth", "dcn_bandwidth", "hop_latency", "fabric"}

# The scaling book's tables, restated (jax-ml/scaling-book): tpus.md's chip and interconnect tables,
# gpus.md's spec and NVLink tables. (bf16 FLOP/s, int8 FLOP/s, HBM B/s, ICI per link one way, pod, host chips)
BOOK_TPUS = {
    "tpu-v4": (2.75e14, 2.75e14, 1.2e12, 4.5e10, (16, 16, 16), 4),
    "tpu-v5p": (4.59e14, 9.18e14, 2.8e12, 9e10, (16, 20, 28), 4),
    "tpu-v5e": (1.97e14, 3.94e14, 8.1e11, 4.5e10, (16, 16), 8),
    "tpu-v6e": (9.2e14, 1.84e15, 1.6e12, 9e10, (16, 16), 8),
}
# (bf16 TFLOP/s, DRAM TB/s, NVLink GB/s per GPU one way); H100's 989 is NVIDIA's dense figure (the book rounds to 990)
BOOK_GPUS = {"h100": (989, 3.35, 450), "a100": (312, 2.0, 300), "b200": (2250, 8, 900)}


# --- built-in profiles -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", REQUIRED)
def test_every_required_profile_parses_by_name(name):
    profile = parse_hardware(name)
    assert isinstance(profile, Hardware)
    assert profile.name == name
    assert profile is PROFILES[name]
    assert parse_hardware(name.upper()) is profile  # `--hardware TPU-v5e` means the same
    assert parse_hardware(f"  {name} ") is profile


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_profiles_are_plausible_chips_and_name_their_source(name):
    p = PROFILES[name]
    # Bounds that any 2020s accelerator meets and a unit slip (GB/s read as B/s, TFLOP/s as FLOP/s,
    # Gbps as GB/s by 8x) breaks.
    assert 1e14 <= p.peak_flops <= 5e15
    assert 3e11 <= p.hbm_bandwidth <= 1e13
    assert 1e10 <= p.interconnect_bandwidth <= 2e12
    assert p.interconnect_bandwidth < p.hbm_bandwidth
    if p.kind == "tpu":  # what XLA lets a program use: the chip's HBM less what the runtime keeps
        nominal = {"tpu-v4": 32, "tpu-v5e": 16, "tpu-v5p": 96, "tpu-v6e": 32}[name] * 2**30
        assert 0.95 * nominal <= p.memory < nominal and "available HBM" in p.sources["memory"]
    else:
        assert 8 * 2**30 <= p.memory <= 256 * 2**30 and (p.memory % 2**30 == 0 or p.memory % 10**9 == 0)
    assert "scaling-book" in p.source
    # every figure names its own source
    figures = ["peak_flops", "hbm_bandwidth", "memory", "interconnect_bandwidth", "link_bandwidth", "pod",
               "dcn_bandwidth", "int8"] + (["hop_latency", "wrap", "host_chips", "f32"] if p.kind == "tpu" else
                                           ["preallocate"])
    for figure in figures:
        assert len(p.sources.get(figure, "")) > 20, (name, figure)


@pytest.mark.parametrize("name", sorted(BOOK_TPUS))
def test_tpu_profiles_are_the_books_tables(name):
    bf16, int8, hbm, link, pod, host = BOOK_TPUS[name]
    p = PROFILES[name]
    assert (p.peak_flops, p.peaks["int8"], p.hbm_bandwidth, p.link_bandwidth) == (bf16, int8, hbm, link)
    assert p.interconnect_bandwidth == 2 * link  # bidirectional, one axis
    assert (p.pod, p.host_chips, p.dcn_bandwidth, p.hop_latency) == (pod, host, 2.5e10, 1e-6)
    assert p.peak_for("f32")[0] == bf16 and "one bf16 pass" in p.peak_for("f32")[1]  # DEFAULT precision
    assert p.peak_for("f32-highest")[0] == bf16 / 6 and p.peak_for("f32-high")[0] == bf16 / 3


@pytest.mark.parametrize("name", sorted(BOOK_GPUS))
def test_gpu_profiles_are_the_books_tables(name):
    tflops, tbs, nvlink = BOOK_GPUS[name]
    p = PROFILES[name]
    assert p.peak_flops == tflops * 1e12 and p.link_bandwidth == nvlink * 1e9
    assert p.hbm_bandwidth == pytest.approx(tbs * 1e12, rel=0.02)  # A100: the datasheet's 2,039 GB/s, the book's 2.0
    assert p.pod == (8,) and p.preallocate == 0.75 and p.hop_latency is None


def test_gpu_float32_rates_follow_the_datasheets():
    h100, a100 = PROFILES["h100"], PROFILES["a100"]
    assert h100.peak_for("f32")[0] == pytest.approx(989e12 / 2)  # TF32: 989 with sparsity, 494.5 dense
    assert h100.peak_for("f32-highest")[0] == 67e12  # FP32, about 1/15 of bf16 (gpus.md)
    assert a100.peak_for("f32")[0] == 156e12 and a100.peak_for("f32-highest")[0] == 19.5e12
    b200 = PROFILES["b200"]
    assert b200.peak_for("f32")[0] == 1100e12 and b200.peak_for("f32-highest")[0] == 80e12  # HGX B200, dense
    assert "glennklockwood.com" in b200.sources["f32"] and "TF32" in b200.sources["f32"]
    rate, what = PROFILES["tpu-v5e"].peak_for("fp4")  # a class no profile has a sourced rate for
    assert rate == PROFILES["tpu-v5e"].peak_flops and "no sourced" in what  # said, not invented
    assert PROFILES["h100"].dcn_bandwidth == 400e9  # gpus.md: 400 GB/s per node beyond it


def test_profile_state_is_the_view_schema_and_json():
    state = parse_hardware("tpu-v5e").state()
    assert set(state) == STATE_KEYS
    assert json.loads(json.dumps(state)) == state
    assert state["memory"] == 16_909_336_064  # a v5e chip's memory_stats()['bytes_limit'] (issue 39)
    assert state["fabric"] == ["ICI", "DCN"] and parse_hardware("h100").state()["fabric"] == ["NVLink", "network"]


def test_unknown_profile_lists_every_profile_and_the_custom_form():
    with pytest.raises(UsageError) as err:
        parse_hardware("tpu-v9")
    message = str(err.value)
    assert "tpu-v9" in message
    for name in PROFILES:
        assert name in message
    assert CUSTOM_EXAMPLE in message


# --- custom profiles ---------------------------------------------------------------------------------

def test_custom_profile_with_every_key():
    p = parse_hardware("custom:flops=1e15,hbm=3.3e12,bw=4.5e11,memory=80GiB")
    assert (p.name, p.peak_flops, p.hbm_bandwidth, p.interconnect_bandwidth, p.memory) == (
        "custom", 1e15, 3.3e12, 4.5e11, 80 * 2**30)
    assert "custom:flops=1e15" in p.source


def test_custom_profile_memory_is_optional_and_spacing_and_case_are_free():
    p = parse_hardware("Custom: bw=2e11 , FLOPS=5e14, hbm=1e12")
    assert (p.peak_flops, p.hbm_bandwidth, p.interconnect_bandwidth, p.memory) == (5e14, 1e12, 2e11, None)


def test_custom_profile_memory_in_plain_bytes():
    assert parse_hardware("custom:flops=1,hbm=1,bw=1,memory=1024").memory == 1024


@pytest.mark.parametrize(
    "spec, says",
    [
        ("custom:flops=1e15", "'hbm' and 'bw' are missing"),
        ("custom:", "are missing"),
        ("custom:flops=1e15,hbm=1e12", "'bw' is missing"),
        ("custom:flops=fast,hbm=1e12,bw=1e11", "flops=fast is not a number"),
        ("custom:flops=-1,hbm=1e12,bw=1e11", "must be a positive number"),
        ("custom:flops=0,hbm=1e12,bw=1e11", "must be a positive number"),
        ("custom:flops=inf,hbm=1e12,bw=1e11", "must be a positive number"),
        ("custom:flops=1e15,hbm=1e12,bw=1e11,cores=8", "unknown key 'cores'"),
        ("custom:flops=1e15,flops=2e15,hbm=1e12,bw=1e11", "given twice"),
        ("custom:flops,hbm=1e12,bw=1e11", "`flops` is not key=value"),
        ("custom:flops=1e15,hbm=,bw=1e11", "`hbm=` is not key=value"),
        ("custom:flops=1e15,hbm=1e12,bw=1e11,memory=lots", "memory=lots is not a memory size"),
    ],
)
def test_malformed_custom_profile_says_what_to_write(spec, says):
    with pytest.raises(UsageError) as err:
        parse_hardware(spec)
    message = str(err.value)
    assert says in message
    assert CUSTOM_EXAMPLE in message  # shows what to write
    assert "\n" not in message


# --- memory sizes ------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "text, expected",
    [
        ("16GiB", 16 * 2**30),
        ("16 GiB", 16 * 2**30),
        ("16gib", 16 * 2**30),
        ("16 GB", 16 * 10**9),
        ("16GB", 16 * 10**9),
        ("1.5TiB", 3 * 2**39),
        ("512MiB", 512 * 2**20),
        ("64KiB", 64 * 1024),
        ("2TB", 2 * 10**12),
        ("100B", 100),
        ("17179869184", 17179869184),
        ("1e3MB", 10**9),
        (17179869184, 17179869184),
    ],
)
def test_memory_sizes(text, expected):
    assert parse_memory_size(text) == expected


@pytest.mark.parametrize("text", ["16G", "sixteen GiB", "", "GiB", "-1GiB", "16 GiBs", "1.2.3GB", True])
def test_memory_size_mistakes_show_what_to_write(text):
    with pytest.raises(UsageError) as err:
        parse_memory_size(text)
    message = str(err.value)
    assert message.startswith(f"--device-memory {text}")
    assert "16GiB" in message


@pytest.mark.parametrize("text", ["0", "0GiB", "0.1B", 0])
def test_memory_size_must_be_at_least_a_byte(text):
    with pytest.raises(UsageError, match="at least one byte"):
        parse_memory_size(text)


def test_memory_size_names_the_option_it_came_from():
    with pytest.raises(UsageError, match=r"^plan\(device_memory=\) 12 parsecs"):
        parse_memory_size("12 parsecs", "plan(device_memory=)")


@pytest.mark.parametrize("text", ["1e400GiB", "1e31", "9" * 400])
def test_absurd_memory_sizes_are_usage_errors(text):
    """Found by tests/test_fuzz_lines.py: 1e400GiB raised OverflowError."""
    with pytest.raises(UsageError):
        parse_memory_size(text)
