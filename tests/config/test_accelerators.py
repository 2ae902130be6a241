"""Tests for infra.accelerators: naming arithmetic, hosts, documented values, errors."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest

from infra.accelerators import (
    GENERATIONS,
    MAX_SLICES,
    SOFTWARE_CHECKED,
    AcceleratorType,
    Generation,
    UnknownAcceleratorType,
    accelerator_types,
    parse_accelerator_type,
)

ALL = accelerator_types()


# --- examples from the Cloud TPU Multislice overview (accelerators.MULTISLICE_OVERVIEW) -------


@pytest.mark.parametrize(
    ("name", "chips", "tensorcores", "hosts", "chips_per_host"),
    [
        ("v4-8", 4, 8, 1, 4),  # Multislice overview: v4-8 = 4 chips = one VM
        ("v4-16", 8, 16, 2, 4),  # Multislice overview: v4-16 = 8 chips
        ("v4-128", 64, 128, 16, 4),  # types-topologies: v4-128 = 128 TensorCores
        ("v5p-8", 4, 8, 1, 4),  # v5p table: 2x2x1 | 8 cores | 4 chips | 1 host
        ("v5p-16", 8, 16, 2, 4),  # v5p table: 2x2x2 | 16 | 8 | 2
        ("v5p-32", 16, 32, 4, 4),  # v5p: "v5p-32 ... 32 TensorCores (16 chips)"
        ("v5p-12288", 6144, 12288, 1536, 4),  # v5p table: 16x16x24 | 12288 | 6144 | 1536
        ("v5litepod-1", 1, 1, 1, 1),  # v5e serving: v5litepod-1 -> ct5lp-hightpu-1t
        ("v5litepod-8", 8, 8, 1, 8),  # v5e serving: v5litepod-8 -> ct5lp-hightpu-8t (one VM)
        ("v5litepod-16", 16, 16, 4, 4),  # xpk: v5litepod-16 on 4 ct5lp-hightpu-4t VMs
        ("v5litepod-256", 256, 256, 64, 4),
        ("v6e-1", 1, 1, 1, 1),  # v6e table: 1x1 | 1 chip | 1 VM
        ("v6e-4", 4, 4, 1, 4),  # v6e table: 2x2 | 4 chips | 1 VM
        ("v6e-8", 8, 8, 1, 8),  # v6e table: 2x4 | 8 chips | 1 VM | ct6e-standard-8t
        ("v6e-16", 16, 16, 4, 4),  # v6e table: 4x4 | 16 chips | 4 VMs
        ("v6e-256", 256, 256, 64, 4),  # v6e table: 16x16 | 256 chips | 64 VMs
    ],
)
def test_examples(name, chips, tensorcores, hosts, chips_per_host):
    acc = parse_accelerator_type(name)
    assert (acc.name, acc.chips, acc.tensorcores, acc.hosts, acc.chips_per_host) == (
        name,
        chips,
        tensorcores,
        hosts,
        chips_per_host,
    )


def test_v4_16_is_multi_host_and_v4_8_is_not():
    assert not parse_accelerator_type("v4-8").is_multi_host
    assert parse_accelerator_type("v4-16").is_multi_host


def test_multislice_overview_device_count_four_v4_16_slices():
    # Multislice overview: len(jax.devices()) must equal total chips, e.g. 4 x v4-16 -> 32.
    assert 4 * parse_accelerator_type("v4-16").chips == 32


# --- arithmetic for every listed type ----------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_arithmetic_consistent_for_every_type(name):
    acc = parse_accelerator_type(name)
    gen = acc.generation
    prefix, suffix = name.rsplit("-", 1)
    assert prefix == gen.type_prefix
    n = int(suffix)
    assert n in gen.sizes
    if gen.suffix_counts == "tensorcores":
        assert acc.tensorcores == n
    else:
        assert acc.chips == n
    assert acc.chips * gen.tensorcores_per_chip == acc.tensorcores
    assert acc.hosts * acc.chips_per_host == acc.chips
    assert acc.chips_per_host == gen.chips_per_host(acc.chips)
    assert acc.hosts >= 1 and acc.chips_per_host >= 1
    assert acc.peak_bf16_flops_per_slice == acc.chips * gen.peak_bf16_flops_per_chip
    assert acc.hbm_bytes_per_slice == acc.chips * gen.hbm_bytes_per_chip


@pytest.mark.parametrize("gen", list(GENERATIONS.values()), ids=list(GENERATIONS))
def test_generation_invariants(gen: Generation):
    assert list(gen.sizes) == sorted(set(gen.sizes))
    assert gen.suffix_counts in ("tensorcores", "chips")
    assert gen.supports_multislice
    # Every multi-host VM holds 4 chips; single-VM slices hold all their chips.
    for chips in gen.chip_counts:
        per_host = gen.chips_per_host(chips)
        assert chips % per_host == 0
        assert per_host == (chips if chips <= gen.max_single_vm_chips else 4)
    # Every numeric field has a source string.
    for f in dataclasses.fields(Generation):
        if f.name in (
            "name",
            "type_prefix",
            "sources",
            "max_single_vm_chips",
            "multi_host_chips_per_vm",
        ):
            continue
        assert gen.sources.get(f.name), f"{gen.name}: no source for {f.name}"
    assert gen.sources.get("chips_per_host")


def test_catalog_order_and_keys():
    assert list(GENERATIONS) == ["v4", "v5e", "v5p", "v6e", "tpu7x"]
    assert {g.type_prefix for g in GENERATIONS.values()} == {"v4", "v5litepod", "v5p", "v6e", "tpu7x"}
    assert ALL[0] == "v4-8"
    assert len(ALL) == len(set(ALL)) == sum(len(g.sizes) for g in GENERATIONS.values())
    assert accelerator_types() is not accelerator_types()  # callers may mutate their copy


def test_max_slices():
    assert MAX_SLICES == 256  # Multislice overview: up to 256 slices per queued resource


def test_dataclasses_are_frozen_and_hashable():
    acc = parse_accelerator_type("v4-8")
    with pytest.raises(dataclasses.FrozenInstanceError):
        acc.chips = 5  # type: ignore[misc]
    assert acc == parse_accelerator_type("v4-8")
    assert len({acc, parse_accelerator_type("v4-8")}) == 1


def test_inconsistent_accelerator_type_is_rejected():
    gen = GENERATIONS["v4"]
    with pytest.raises(ValueError):
        AcceleratorType("v4-8", gen, chips=4, tensorcores=4, hosts=1, chips_per_host=4)
    with pytest.raises(ValueError):
        AcceleratorType("v4-8", gen, chips=4, tensorcores=8, hosts=2, chips_per_host=4)


def test_chips_per_host_rejects_bad_chip_counts():
    with pytest.raises(ValueError):
        GENERATIONS["v4"].chips_per_host(0)
    with pytest.raises(ValueError):
        GENERATIONS["v6e"].chips_per_host(18)  # not a whole number of 4-chip VMs


# --- documented values (sources in comments) ---------------------------------------------


def test_documented_values():
    v4, v5e, v5p, v6e = (GENERATIONS[k] for k in ("v4", "v5e", "v5p", "v6e"))
    # https://cloud.google.com/tpu/docs/v4: "Peak compute per chip | 275 teraflops (bf16 or
    # int8)"; "HBM2 capacity and bandwidth | 32 GiB, 1200 GBps"; two TensorCores per chip.
    assert v4.peak_bf16_flops_per_chip == 275e12
    assert v4.hbm_bytes_per_chip == 32 * 2**30
    assert v4.tensorcores_per_chip == 2
    # https://cloud.google.com/tpu/docs/v5e: "Peak compute per chip (bf16) | 197 TFLOPs";
    # "HBM capacity per chip | 16 GB"; "Per-host NIC configuration | 2 x 100 Gbps NIC".
    assert v5e.peak_bf16_flops_per_chip == 197e12
    assert v5e.hbm_bytes_per_chip == 16 * 10**9
    assert v5e.dcn_bits_per_second_per_host == 200e9
    # https://cloud.google.com/tpu/docs/v5p: "Peak compute per chip (BF16) (TFLOPs) | 459";
    # "HBM capacity per chip (GiB) | 95"; "DCN bandwidth per chip (Gbps) | 50".
    assert v5p.peak_bf16_flops_per_chip == 459e12
    assert v5p.hbm_bytes_per_chip == 95 * 2**30
    assert v5p.dcn_bits_per_second_per_chip == 50e9
    # https://cloud.google.com/tpu/docs/v6e: "Peak compute per chip (bf16) | 918 TFLOPs";
    # "HBM capacity per chip | 32 GB"; "Per-host NIC configuration | 4 x 200 Gbps NIC".
    assert v6e.peak_bf16_flops_per_chip == 918e12
    assert v6e.hbm_bytes_per_chip == 32 * 10**9
    assert v6e.dcn_bits_per_second_per_host == 800e9
    # https://cloud.google.com/tpu/docs/runtimes, "PyTorch and JAX" table.
    assert {g.name: g.default_runtime_version for g in (v4, v5e, v5p, v6e)} == {
        "v4": "tpu-ubuntu2204-base",
        "v5e": "v2-alpha-tpuv5-lite",
        "v5p": "v2-alpha-tpuv5",
        "v6e": "v2-alpha-tpuv6e",
    }


def test_pod_level_docs_agree_with_per_host_dcn():
    # v5e/v6e pages: "Data center network bandwidth per Pod | 6.4 Tbps / 25.6 Tbps" for a
    # 256-chip Pod of 8-chip hosts: the per-host NIC figures must multiply up to those.
    assert GENERATIONS["v5e"].dcn_bits_per_second_per_host * 256 / 8 == pytest.approx(6.4e12)
    assert GENERATIONS["v6e"].dcn_bits_per_second_per_host * 256 / 8 == pytest.approx(25.6e12)


def test_multislice_overview_v4_dcn_arithmetic_intensity():
    # Multislice overview: 4 x 275e12 / 50e9 = 22,000 FLOP per bit for v4.
    v4 = GENERATIONS["v4"]
    acc = parse_accelerator_type("v4-16")
    assert v4.dcn_bits_per_second_per_host == 50e9
    per_host_flops = acc.chips_per_host * v4.peak_bf16_flops_per_chip
    assert per_host_flops / v4.dcn_bits_per_second_per_host == 22_000
    assert v4.flops_per_dcn_bit == 22_000
    assert acc.dcn_bits_per_second_per_host == 50e9


def test_peak_flops_per_slice():
    assert parse_accelerator_type("v4-16").peak_bf16_flops_per_slice == 8 * 275e12
    assert parse_accelerator_type("v6e-256").peak_bf16_flops_per_slice == 256 * 918e12


def test_sources_cite_public_documents():
    # Every source is a public address (`multislice plan --json` prints them), not internal notes.
    for gen in GENERATIONS.values():
        for key, src in gen.sources.items():
            assert "https://" in src, (gen.name, key)
            assert "seed" not in src.lower(), (gen.name, key)  # tests/test_readme.py sweeps the rest


ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")


def test_zones_and_runtime_versions_per_generation():
    # https://cloud.google.com/tpu/docs/regions-zones, North America tables (and v6e's Europe row).
    assert {g.name: g.zones for g in GENERATIONS.values()} == {
        "v4": ("us-central2-b",),
        "v5e": ("us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a"),
        "v5p": ("us-central1-a", "us-east5-a"),
        "v6e": ("us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b", "europe-west4-a"),
        "tpu7x": (),  # "The Cloud TPU API is not supported on TPU7x and later TPU versions"
    }
    for gen in GENERATIONS.values():
        if gen.default_runtime_version is None:  # not on the Cloud TPU API: neither zones nor versions
            assert gen.zones == gen.runtime_versions == () and "queued-resource" not in gen.backends
            assert gen.sources["zones"].startswith("none: the Cloud TPU API does not offer")
            continue
        assert all(ZONE.match(z) for z in gen.zones) and len(set(gen.zones)) == len(gen.zones)
        assert gen.runtime_versions == (gen.default_runtime_version,)
        assert gen.sources["zones"].startswith("https://cloud.google.com/tpu/docs/regions-zones")
        assert gen.sources["runtime_versions"].startswith("https://cloud.google.com/tpu/docs/runtimes")
    # A replaced default is still a known version.
    changed = dataclasses.replace(GENERATIONS["v4"], default_runtime_version="tpu-x")
    assert changed.runtime_versions == ("tpu-x", "tpu-ubuntu2204-base")


# --- errors ----------------------------------------------------------------------------


def test_bad_size_lists_that_generations_sizes():
    with pytest.raises(UnknownAcceleratorType) as exc:
        parse_accelerator_type("v4-7")
    msg = str(exc.value)
    assert "'v4-7'" in msg
    assert "v4-{8,16,32,64,128,256,512,1024,1536,2048,4096}" in msg
    assert "TensorCores" in msg
    assert "v5litepod" not in msg  # only the generation that was meant
    assert exc.value.name == "v4-7"
    assert isinstance(exc.value, ValueError)


@pytest.mark.parametrize("name", ["v9-8", "tpu", "", "v4", "v4-", "-8", "v4-08", "v4-8 ", 8, None])
def test_unknown_lists_every_generation(name):
    with pytest.raises(UnknownAcceleratorType) as exc:
        parse_accelerator_type(name)  # type: ignore[arg-type]
    msg = str(exc.value)
    assert repr(name) in msg
    for gen in GENERATIONS.values():
        assert gen.allowed_compact() in msg
    assert re.search(r"allowed: v4-\{8,16,", msg)


def test_hints_for_near_misses():
    with pytest.raises(UnknownAcceleratorType, match="v5litepod-8"):
        parse_accelerator_type("v5e-8")
    with pytest.raises(UnknownAcceleratorType, match="did you mean 'v4-8'"):
        parse_accelerator_type("V4-8")


def test_v5e_suffix_counts_chips_not_tensorcores():
    with pytest.raises(UnknownAcceleratorType, match=r"counts chips.*v5litepod-\{1,4,8,"):
        parse_accelerator_type("v5litepod-2")


def test_the_jax_and_libtpu_pins_are_the_ones_checked_for_every_generation():
    """docs/cloud-tpu.md records that jax 0.10.2 and the libtpu of its tpu extra support every
    generation of the catalog; a pin bump in uv.lock must redo that check (and update the
    record) rather than inherit it."""
    root = Path(__file__).resolve().parents[2]
    lock = tomllib.loads((root / "uv.lock").read_text())
    pinned = {p["name"]: p["version"] for p in lock["package"] if p["name"] in SOFTWARE_CHECKED}
    assert pinned == SOFTWARE_CHECKED, (
        f"uv.lock pins {pinned}, the catalog was checked against {SOFTWARE_CHECKED}: check the new "
        "pins against docs/cloud-tpu.md 'JAX and libtpu on each generation', then update both"
    )
    doc = (root / "docs" / "cloud-tpu.md").read_text()
    section = doc.split("## JAX and libtpu on each generation", 1)[1].split("\n## ", 1)[0]
    for version in SOFTWARE_CHECKED.values():
        assert version in section
    for generation in GENERATIONS.values():
        assert f"`{generation.type_prefix}`" in section
        assert generation.default_runtime_version is None or generation.default_runtime_version in section
