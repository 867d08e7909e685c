"""The shipped GPU catalog (scheduler_extender/data/catalog.yaml) and its token lookup."""

from __future__ import annotations

import re

import pytest

from scheduler_extender.core.catalog import (
    Catalog,
    CatalogEntry,
    UnknownModelError,
    default_catalog,
    load_catalog_yaml,
)

A100_IDS = {"a100-pcie-40gb", "a100-sxm4-40gb", "a100-pcie-80gb", "a100-sxm4-80gb"}
H100_IDS = {"h100-pcie-80gb", "h100-sxm5-80gb", "h100-nvl-94gb"}
V100_IDS = {"v100-sxm2-16gb", "v100-sxm2-32gb", "v100-pcie-16gb", "v100-pcie-32gb"}

REQUIRED_IDS = A100_IDS | H100_IDS | V100_IDS | {
    "h200-sxm-141gb",
    "h20-96gb",
    "a800-sxm4-80gb",
    "h800-sxm5-80gb",
    "l40s",
    "l4",
    "a10",
    "a30",
    "t4",
    "p100-pcie-16gb",
    "rtx-4090",
    "rtx-3090",
    "rtx-a6000",
    "quadro-rtx-8000",
    "radeon-vii",
    "mi250x",
    "mi300x",
}

COST_NOTE = (
    "costPerGpuHour: gpuplace indicative default, order of magnitude of 2025 on-demand "
    "cloud prices, not a quote; override in policy"
)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return default_catalog()


def test_default_catalog_loads_and_validates_every_row(catalog: Catalog) -> None:
    assert catalog.entries, "the shipped catalog is empty"
    for entry in catalog.entries.values():
        assert isinstance(entry, CatalogEntry)
        # Round trip through the schema by alias: nothing was accepted that the model would reject.
        CatalogEntry.model_validate(entry.model_dump(by_alias=True))


def test_catalog_has_a_row_for_every_required_model(catalog: Catalog) -> None:
    assert REQUIRED_IDS <= set(catalog.entries), sorted(REQUIRED_IDS - set(catalog.entries))


def test_catalog_rejects_a_driver_name_claimed_by_two_rows(catalog: Catalog) -> None:
    a100 = catalog.entries["a100-sxm4-80gb"]
    clash = a100.model_copy(update={"id": "a100-clone"})
    with pytest.raises(ValueError, match="maps to"):
        Catalog([a100, clash])


@pytest.mark.parametrize(
    ("driver_name", "expected_id"),
    [
        ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"),
        ("A100-SXM4-40GB", "a100-sxm4-40gb"),
        ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
        ("A100-PCIE-40GB", "a100-pcie-40gb"),
        ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
        ("NVIDIA A800-SXM4-80GB", "a800-sxm4-80gb"),
        ("NVIDIA A30", "a30"),
        ("NVIDIA A10", "a10"),
        ("NVIDIA RTX A6000", "rtx-a6000"),
        ("NVIDIA GeForce RTX 3090", "rtx-3090"),
        ("GeForce RTX 3090", "rtx-3090"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm5-80gb"),
        ("NVIDIA H100 PCIe", "h100-pcie-80gb"),
        ("NVIDIA H100 NVL", "h100-nvl-94gb"),
        ("NVIDIA H200", "h200-sxm-141gb"),
        ("NVIDIA H800", "h800-sxm5-80gb"),
        ("NVIDIA H20", "h20-96gb"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("Tesla T4", "t4"),
        ("Quadro RTX 8000", "quadro-rtx-8000"),
        ("Tesla V100-SXM2-16GB", "v100-sxm2-16gb"),
        ("Tesla V100-SXM2-32GB", "v100-sxm2-32gb"),
        ("Tesla V100-PCIE-16GB", "v100-pcie-16gb"),
        ("Tesla V100-PCIE-32GB", "v100-pcie-32gb"),
        ("Tesla P100-PCIE-16GB", "p100-pcie-16gb"),
        ("AMD Radeon VII", "radeon-vii"),
        ("AMD Instinct MI250X", "mi250x"),
        ("AMD Instinct MI300X", "mi300x"),
    ],
)
def test_driver_name_resolves_to_its_row(catalog: Catalog, driver_name: str, expected_id: str) -> None:
    entry = catalog.resolve_driver_name(driver_name)
    assert entry is not None, f"{driver_name!r} is not catalogued"
    assert entry.id == expected_id


@pytest.mark.parametrize("driver_name", ["NVIDIA A100", "NVIDIA H2", "NVIDIA A10G", "NVIDIA GeForce RTX 4080"])
def test_uncatalogued_driver_name_resolves_to_none(catalog: Catalog, driver_name: str) -> None:
    assert catalog.resolve_driver_name(driver_name) is None


def test_h20_token_names_only_the_h20_and_never_h100_or_h200(catalog: Catalog) -> None:
    ids = catalog.resolve_token("H20")
    assert ids == {"h20-96gb"}
    assert not ids & (H100_IDS | {"h200-sxm-141gb"})


def test_h200_token_does_not_include_the_h20(catalog: Catalog) -> None:
    assert catalog.resolve_token("H200") == {"h200-sxm-141gb"}


def test_a10_token_names_the_a10_and_no_a100(catalog: Catalog) -> None:
    ids = catalog.resolve_token("A10")
    assert ids == {"a10"}
    assert not ids & A100_IDS


def test_a100_token_names_all_four_a100_rows(catalog: Catalog) -> None:
    assert catalog.resolve_token("A100") == A100_IDS


def test_a100_80gb_token_names_exactly_the_two_80gb_a100_rows(catalog: Catalog) -> None:
    assert catalog.resolve_token("A100-80GB") == {"a100-pcie-80gb", "a100-sxm4-80gb"}


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("A100-40GB", {"a100-pcie-40gb", "a100-sxm4-40gb"}),
        ("A100-SXM4-80GB", {"a100-sxm4-80gb"}),
        ("H100", H100_IDS),
        ("H100-SXM", {"h100-sxm5-80gb"}),
        ("H100-PCIe", {"h100-pcie-80gb"}),
        ("A800", {"a800-sxm4-80gb"}),
        ("A800-SXM4-80GB", {"a800-sxm4-80gb"}),
        ("H800", {"h800-sxm5-80gb"}),
        ("L40S", {"l40s"}),
        ("L4", {"l4"}),
        ("A30", {"a30"}),
        ("T4", {"t4"}),
        ("V100", V100_IDS),
        ("V100-16GB", {"v100-sxm2-16gb", "v100-pcie-16gb"}),
        ("V100-32GB", {"v100-sxm2-32gb", "v100-pcie-32gb"}),
        ("V100M16", {"v100-sxm2-16gb", "v100-pcie-16gb"}),
        ("V100M32", {"v100-sxm2-32gb", "v100-pcie-32gb"}),
        ("P100", {"p100-pcie-16gb"}),
        ("RTX-4090", {"rtx-4090"}),
        ("4090", {"rtx-4090"}),
        ("RTX-3090", {"rtx-3090"}),
        ("3090", {"rtx-3090"}),
        ("RTX-A6000", {"rtx-a6000"}),
        ("A6000", {"rtx-a6000"}),
        ("RTX-8000", {"quadro-rtx-8000"}),
        ("Quadro-RTX-8000", {"quadro-rtx-8000"}),
        ("Radeon-VII", {"radeon-vii"}),
        ("MI250X", {"mi250x"}),
        ("MI300X", {"mi300x"}),
    ],
)
def test_family_alias_names_exactly_its_rows(catalog: Catalog, token: str, expected: set[str]) -> None:
    assert catalog.resolve_token(token) == expected


@pytest.mark.parametrize("spelling", ["RTX 4090", "rtx-4090", "Rtx_4090", "  RTX   4090 ", "rtx 4090"])
def test_tokens_are_case_insensitive_and_spaces_equal_hyphens(catalog: Catalog, spelling: str) -> None:
    assert catalog.resolve_token(spelling) == catalog.resolve_token("RTX-4090") == {"rtx-4090"}


def test_lower_case_token_equals_upper_case_token(catalog: Catalog) -> None:
    assert catalog.resolve_token("a100-80gb") == catalog.resolve_token("A100-80GB")


@pytest.mark.parametrize("token", ["H2", "A1", "H2000", "RTX4090", "A100-80", "GTX-1080", "", "V100M"])
def test_unknown_token_raises_unknown_model_error(catalog: Catalog, token: str) -> None:
    with pytest.raises(UnknownModelError):
        catalog.resolve_token(token)


def test_a100_80gb_mig_3g40gb_slice_has_more_than_39_gib(catalog: Catalog) -> None:
    for model_id in ("a100-sxm4-80gb", "a100-pcie-80gb"):
        profile = catalog.entries[model_id].mig_profile("3g.40gb")
        assert profile is not None, model_id
        assert profile.memory_mib > 39 * 1024
        assert profile.compute_slices == 3
        assert profile.max_instances == 2


def test_mig_profiles_are_consistent_with_their_names_and_the_gpu(catalog: Catalog) -> None:
    for entry in catalog.entries.values():
        for p in entry.mig_profiles:
            slices, gigabytes = (int(x) for x in re.fullmatch(r"(\d+)g\.(\d+)gb", p.profile).groups())
            assert p.compute_slices == slices, (entry.id, p.profile)
            assert p.memory_mib <= entry.memory_mib, (entry.id, p.profile)
            # The name's size is loose (3g.40gb holds 39.25 GiB, 7g.141gb 140 GiB): between 85% and 110% of it.
            ratio = p.memory_mib * 2**20 / (gigabytes * 1000**3)
            assert 0.85 <= ratio <= 1.10, (entry.id, p.profile, ratio)
            assert p.max_instances * slices <= 7, (entry.id, p.profile)


def test_only_ampere_and_hopper_data_center_gpus_offer_mig(catalog: Catalog) -> None:
    with_mig = {e.id for e in catalog.entries.values() if e.mig_profiles}
    assert with_mig == A100_IDS | H100_IDS | {"a800-sxm4-80gb", "a30", "h200-sxm-141gb", "h800-sxm5-80gb", "h20-96gb"}


def test_every_nvidia_row_has_a_compute_capability_and_amd_rows_none(catalog: Catalog) -> None:
    for entry in catalog.entries.values():
        if entry.vendor == "nvidia":
            assert entry.compute_capability_tuple is not None, entry.id
        else:
            assert entry.compute_capability is None, entry.id


@pytest.mark.parametrize(
    ("model_id", "capability"),
    [
        ("a100-sxm4-80gb", "8.0"),
        ("a800-sxm4-80gb", "8.0"),
        ("a30", "8.0"),
        ("a10", "8.6"),
        ("rtx-3090", "8.6"),
        ("rtx-a6000", "8.6"),
        ("l4", "8.9"),
        ("l40s", "8.9"),
        ("rtx-4090", "8.9"),
        ("h100-sxm5-80gb", "9.0"),
        ("h200-sxm-141gb", "9.0"),
        ("h20-96gb", "9.0"),
        ("h800-sxm5-80gb", "9.0"),
        ("t4", "7.5"),
        ("quadro-rtx-8000", "7.5"),
        ("v100-sxm2-16gb", "7.0"),
        ("p100-pcie-16gb", "6.0"),
    ],
)
def test_compute_capability_matches_nvidia_cuda_gpus_table(catalog: Catalog, model_id: str, capability: str) -> None:
    assert catalog.entries[model_id].compute_capability == capability


@pytest.mark.parametrize("model_id", ["t4", "quadro-rtx-8000"])
def test_turing_rows_lack_bf16(catalog: Catalog, model_id: str) -> None:
    entry = catalog.entries[model_id]
    assert "bf16" not in entry.precisions
    assert entry.bf16_tflops_dense is None
    assert {"fp16", "int8", "int4"} <= set(entry.precisions)


def test_nvidia_precisions_follow_compute_capability(catalog: Catalog) -> None:
    for entry in catalog.entries.values():
        cc = entry.compute_capability_tuple
        if cc is None:
            continue
        assert ("bf16" in entry.precisions) == (cc >= (8, 0)), entry.id
        assert ("tf32" in entry.precisions) == (cc >= (8, 0)), entry.id
        assert ("fp8" in entry.precisions) == (cc >= (8, 9)), entry.id
        assert (entry.bf16_tflops_dense is not None) == ("bf16" in entry.precisions), entry.id


def test_geforce_cards_have_no_ecc_and_the_rtx_4090_no_nvlink(catalog: Catalog) -> None:
    assert catalog.entries["rtx-4090"].nvlink_links == 0
    assert not catalog.entries["rtx-4090"].ecc
    assert not catalog.entries["rtx-3090"].ecc


def test_nvlink_bandwidth_is_given_exactly_when_there_are_links(catalog: Catalog) -> None:
    for entry in catalog.entries.values():
        assert (entry.nvlink_bandwidth_gbps is not None) == (entry.nvlink_links > 0), entry.id


def test_every_row_has_a_source_and_the_cost_disclaimer(catalog: Catalog) -> None:
    for entry in catalog.entries.values():
        assert entry.sources, entry.id
        assert COST_NOTE in entry.sources, entry.id


def test_premium_tier_costs_more_than_any_consumer_card(catalog: Catalog) -> None:
    rows = catalog.entries.values()
    cheapest_premium = min(e.cost_per_gpu_hour for e in rows if e.tier == "premium")
    dearest_consumer = max(e.cost_per_gpu_hour for e in rows if e.tier == "consumer")
    assert cheapest_premium > dearest_consumer


def test_cost_ordering_matches_the_market(catalog: Catalog) -> None:
    cost = {model_id: e.cost_per_gpu_hour for model_id, e in catalog.entries.items()}
    assert cost["h200-sxm-141gb"] > cost["h100-sxm5-80gb"] > cost["h100-pcie-80gb"]
    assert cost["h100-pcie-80gb"] > cost["a100-sxm4-80gb"] > cost["a100-pcie-80gb"] > cost["a100-sxm4-40gb"]
    assert cost["a100-sxm4-40gb"] > cost["l40s"] > cost["rtx-a6000"] > cost["rtx-4090"] > cost["rtx-3090"]


def test_loader_accepts_a_bare_list_and_rejects_unknown_keys() -> None:
    row = """
- id: test-gpu
  vendor: nvidia
  displayName: Test GPU
  driverNames: ["NVIDIA Test GPU"]
  architecture: ampere
  computeCapability: "8.0"
  memoryMiB: 1024
  memoryBandwidthGBps: 100
  precisions: [fp32]
  ecc: false
  tdpW: 10
  tier: consumer
  costPerGpuHour: 0.1
  sources: [a test]
"""
    assert [e.id for e in load_catalog_yaml(row)] == ["test-gpu"]
    with pytest.raises(ValueError):
        load_catalog_yaml(row + "  color: green\n")
