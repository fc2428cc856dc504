"""hardware.py: the built-in device profiles, custom profiles, and memory sizes, with every mistake."""
from __future__ import annotations

import json

import pytest

from jaxpar_magic.errors import UsageError
from jaxpar_magic.hardware import CUSTOM_EXAMPLE, PROFILES, Hardware, parse_hardware, parse_memory_size

REQUIRED = ("tpu-v4", "tpu-v5e", "tpu-v5p", "h100", "a100")
STATE_KEYS = {"name", "peak_flops", "hbm_bandwidth", "interconnect_bandwidth", "memory", "source"}


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
    assert 8 * 2**30 <= p.memory <= 256 * 2**30 and p.memory % 2**30 == 0
    assert len(p.source) > 20 and ("Google" in p.source or "NVIDIA" in p.source)


def test_profile_figures_follow_the_published_numbers():
    # The sheet figures restated in their published units, converted here independently.
    gbps = 1e9 / 8
    assert PROFILES["tpu-v5e"].peak_flops == 197e12 and PROFILES["tpu-v5e"].hbm_bandwidth == 819e9
    assert PROFILES["tpu-v5e"].interconnect_bandwidth == 1600 * gbps
    assert PROFILES["tpu-v5p"].interconnect_bandwidth == 4800 * gbps and PROFILES["tpu-v5p"].memory == 95 * 2**30
    assert PROFILES["tpu-v4"].peak_flops == 275e12 and PROFILES["tpu-v4"].memory == 32 * 2**30
    assert PROFILES["h100"].peak_flops == pytest.approx(1979e12 / 2, rel=1e-3)  # the sheet's figure is with sparsity
    assert PROFILES["h100"].interconnect_bandwidth == 900e9 / 2  # NVLink's 900 GB/s counts both directions
    assert PROFILES["a100"].peak_flops == 312e12 and PROFILES["a100"].hbm_bandwidth == 2039e9


def test_profile_state_is_the_view_schema_and_json():
    state = parse_hardware("tpu-v5e").state()
    assert set(state) == STATE_KEYS
    assert json.loads(json.dumps(state)) == state
    assert state["memory"] == 17179869184


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
