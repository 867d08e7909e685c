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
H200_IDS = {"h200-sxm-141gb", "h200-nvl-141gb"}
RTX_PRO_6000_IDS = {"rtx-pro-6000-blackwell-server", "rtx-pro-6000-blackwell-workstation"}
BLACKWELL_IDS = {"b200-sxm-180gb", "b300-sxm-288gb", "gb200-186gb", "gb300-288gb", "rtx-5090"} | RTX_PRO_6000_IDS
V100_IDS = {"v100-sxm2-16gb", "v100-sxm2-32gb", "v100-pcie-16gb", "v100-pcie-32gb"}

REQUIRED_IDS = A100_IDS | H100_IDS | H200_IDS | V100_IDS | BLACKWELL_IDS | {
    "h20-96gb",
    "a800-sxm4-80gb",
    "h800-sxm5-80gb",
    "l40s",
    "l40",
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
    "mi325x",
    "mi355x",
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
        ("NVIDIA H200 NVL", "h200-nvl-141gb"),
        ("NVIDIA H800", "h800-sxm5-80gb"),
        ("NVIDIA H20", "h20-96gb"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L40", "l40"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA B200", "b200-sxm-180gb"),
        ("NVIDIA B300 SXM6 AC", "b300-sxm-288gb"),
        ("NVIDIA GB200", "gb200-186gb"),
        ("NVIDIA GB300", "gb300-288gb"),
        ("NVIDIA GeForce RTX 5090", "rtx-5090"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000-blackwell-server"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "rtx-pro-6000-blackwell-workstation"),
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
        ("AMD Instinct MI325X", "mi325x"),
        ("AMD Instinct MI325X VF", "mi325x"),
        ("AMD Instinct MI355X", "mi355x"),
    ],
)
def test_driver_name_resolves_to_its_row(catalog: Catalog, driver_name: str, expected_id: str) -> None:
    entry = catalog.resolve_driver_name(driver_name)
    assert entry is not None, f"{driver_name!r} is not catalogued"
    assert entry.id == expected_id


@pytest.mark.parametrize("driver_name", [
    "NVIDIA A100", "NVIDIA H2", "NVIDIA A10G", "NVIDIA GeForce RTX 4080",
    # near misses of new rows: a prefix or an extension of a catalogued name is not that name
    "NVIDIA B20", "NVIDIA B200 NVL", "NVIDIA B300", "NVIDIA GB", "NVIDIA H200 NVL2", "NVIDIA RTX PRO 6000",
    "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "AMD Instinct MI35X",
])
def test_uncatalogued_driver_name_resolves_to_none(catalog: Catalog, driver_name: str) -> None:
    assert catalog.resolve_driver_name(driver_name) is None


def test_h20_token_names_only_the_h20_and_never_h100_or_h200(catalog: Catalog) -> None:
    ids = catalog.resolve_token("H20")
    assert ids == {"h20-96gb"}
    assert not ids & (H100_IDS | {"h200-sxm-141gb"})


def test_h200_token_names_both_h200_rows_and_never_the_h20(catalog: Catalog) -> None:
    assert catalog.resolve_token("H200") == H200_IDS
    assert catalog.resolve_token("H200-NVL") == {"h200-nvl-141gb"}
    assert catalog.resolve_token("H200-SXM") == {"h200-sxm-141gb"}
    assert "h20-96gb" not in catalog.resolve_token("H200") | catalog.resolve_token("H200-NVL")


@pytest.mark.parametrize("driver_name", ["NVIDIA H20", "NVIDIA H200", "NVIDIA H200 NVL"])
def test_h20_h200_and_h200_nvl_driver_names_resolve_to_three_different_rows(catalog: Catalog, driver_name: str) -> None:
    expected = {"NVIDIA H20": "h20-96gb", "NVIDIA H200": "h200-sxm-141gb", "NVIDIA H200 NVL": "h200-nvl-141gb"}
    assert catalog.resolve_driver_name(driver_name).id == expected[driver_name]


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("B200", {"b200-sxm-180gb"}),
        ("B300", {"b300-sxm-288gb"}),
        ("GB200", {"gb200-186gb"}),
        ("GB300", {"gb300-288gb"}),
    ],
)
def test_b200_b300_gb200_and_gb300_tokens_never_name_each_other(catalog: Catalog, token: str, expected: set[str]) -> None:
    assert catalog.resolve_token(token) == expected
    assert catalog.resolve_token(token.lower()) == expected


@pytest.mark.parametrize(
    ("driver_name", "not_id"),
    [
        ("NVIDIA B200", "gb200-186gb"),
        ("NVIDIA GB200", "b200-sxm-180gb"),
        ("NVIDIA B300 SXM6 AC", "b200-sxm-180gb"),
        ("NVIDIA GB300", "gb200-186gb"),
    ],
)
def test_a_blackwell_driver_name_never_resolves_to_its_sibling(catalog: Catalog, driver_name: str, not_id: str) -> None:
    assert catalog.resolve_driver_name(driver_name).id != not_id


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
        ("L40", {"l40"}),
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
        ("MI325X", {"mi325x"}),
        ("MI355X", {"mi355x"}),
        ("H200-141GB", H200_IDS),
        ("RTX-5090", {"rtx-5090"}),
        ("5090", {"rtx-5090"}),
        ("RTX-PRO-6000", RTX_PRO_6000_IDS),
        ("RTX PRO 6000 Blackwell", RTX_PRO_6000_IDS),
        ("RTX-PRO-6000-Server", {"rtx-pro-6000-blackwell-server"}),
        ("RTX-PRO-6000-Workstation", {"rtx-pro-6000-blackwell-workstation"}),
    ],
)
def test_family_alias_names_exactly_its_rows(catalog: Catalog, token: str, expected: set[str]) -> None:
    assert catalog.resolve_token(token) == expected


@pytest.mark.parametrize("spelling", ["RTX 4090", "rtx-4090", "Rtx_4090", "  RTX   4090 ", "rtx 4090"])
def test_tokens_are_case_insensitive_and_spaces_equal_hyphens(catalog: Catalog, spelling: str) -> None:
    assert catalog.resolve_token(spelling) == catalog.resolve_token("RTX-4090") == {"rtx-4090"}


def test_lower_case_token_equals_upper_case_token(catalog: Catalog) -> None:
    assert catalog.resolve_token("a100-80gb") == catalog.resolve_token("A100-80GB")


@pytest.mark.parametrize("token", ["H2", "A1", "H2000", "RTX4090", "A100-80", "GTX-1080", "", "V100M", "B20", "GB", "B300X",
                                   "MI35X", "RTX-6000"])
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
            assert p.max_instances * slices <= 7, (entry.id, p.profile)
            if p.memory_mib is None:  # no published -lgip output: the row's sources must say so
                assert any("null" in source for source in entry.sources), (entry.id, p.profile)
                continue
            assert p.memory_mib <= entry.memory_mib, (entry.id, p.profile)
            # The name's size is loose (3g.40gb holds 39.25 GiB, 7g.141gb 139.75 GiB): between 85% and 110% of it.
            ratio = p.memory_mib * 2**20 / (gigabytes * 1000**3)
            assert 0.85 <= ratio <= 1.10, (entry.id, p.profile, ratio)


def test_mig_profiles_are_given_for_the_gpus_nvidias_mig_guide_lists(catalog: Catalog) -> None:
    with_mig = {e.id for e in catalog.entries.values() if e.mig_profiles}
    assert with_mig == A100_IDS | H100_IDS | H200_IDS | RTX_PRO_6000_IDS | {
        "a800-sxm4-80gb", "a30", "h800-sxm5-80gb", "h20-96gb", "b200-sxm-180gb", "gb200-186gb"}


def test_b200_mig_profiles_are_those_of_nvidias_mig_user_guide(catalog: Catalog) -> None:
    b200 = catalog.entries["b200-sxm-180gb"]
    assert [(p.profile, p.max_instances) for p in b200.mig_profiles] == [
        ("1g.23gb", 7), ("1g.45gb", 4), ("2g.45gb", 3), ("3g.90gb", 2), ("4g.90gb", 1), ("7g.180gb", 1)]


def test_rtx_pro_6000_blackwell_splits_into_at_most_four_mig_instances_of_four_slices(catalog: Catalog) -> None:
    for model_id in RTX_PRO_6000_IDS:
        profiles = catalog.entries[model_id].mig_profiles
        assert [(p.profile, p.compute_slices, p.max_instances) for p in profiles] == [
            ("1g.24gb", 1, 4), ("2g.48gb", 2, 2), ("4g.96gb", 4, 1)]


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
        ("h200-nvl-141gb", "9.0"),
        ("l40", "8.9"),
        ("b200-sxm-180gb", "10.0"),
        ("gb200-186gb", "10.0"),
        ("b300-sxm-288gb", "10.3"),
        ("gb300-288gb", "10.3"),
        ("rtx-5090", "12.0"),
        ("rtx-pro-6000-blackwell-server", "12.0"),
        ("rtx-pro-6000-blackwell-workstation", "12.0"),
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
        assert ("fp6" in entry.precisions) == ("fp4" in entry.precisions) == (cc >= (10, 0)), entry.id
        assert (entry.bf16_tflops_dense is not None) == ("bf16" in entry.precisions), entry.id


def test_among_amd_rows_only_the_cdna4_mi355x_has_fp4_and_fp6_and_it_has_no_tf32(catalog: Catalog) -> None:
    amd = {e.id: set(e.precisions) for e in catalog.entries.values() if e.vendor == "amd"}
    assert {model_id for model_id, p in amd.items() if {"fp4", "fp6"} <= p} == {"mi355x"}
    assert "tf32" not in amd["mi355x"]
    assert {"fp8", "tf32"} <= amd["mi325x"]


def test_every_new_generation_row_is_tiered_and_premium_ones_cost_more_than_an_h100_pcie(catalog: Catalog) -> None:
    premium = {"b200-sxm-180gb", "b300-sxm-288gb", "gb200-186gb", "gb300-288gb", "h200-nvl-141gb", "mi325x", "mi355x"}
    for model_id in premium:
        entry = catalog.entries[model_id]
        assert entry.tier == "premium", model_id
        assert entry.cost_per_gpu_hour > catalog.entries["h100-pcie-80gb"].cost_per_gpu_hour, model_id
    assert catalog.entries["rtx-5090"].tier == "consumer"
    assert catalog.entries["rtx-pro-6000-blackwell-server"].tier == "datacenter"
    assert catalog.entries["rtx-pro-6000-blackwell-workstation"].tier == "workstation"
    assert catalog.entries["l40"].tier == "datacenter"


def test_geforce_cards_have_no_ecc_and_the_rtx_4090_no_nvlink(catalog: Catalog) -> None:
    assert catalog.entries["rtx-4090"].nvlink_links == 0
    assert not catalog.entries["rtx-4090"].ecc
    assert not catalog.entries["rtx-3090"].ecc
    assert not catalog.entries["rtx-5090"].ecc and catalog.entries["rtx-5090"].nvlink_links == 0


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
    assert cost["gb300-288gb"] > cost["b300-sxm-288gb"] > cost["gb200-186gb"] > cost["b200-sxm-180gb"]
    assert cost["b200-sxm-180gb"] > cost["h200-sxm-141gb"] > cost["h200-nvl-141gb"]
    assert cost["mi355x"] > cost["mi325x"] > cost["mi300x"]
    assert cost["h200-sxm-141gb"] > cost["h100-sxm5-80gb"] > cost["h100-pcie-80gb"]
    assert cost["h100-pcie-80gb"] > cost["a100-sxm4-80gb"] > cost["a100-pcie-80gb"] > cost["a100-sxm4-40gb"]
    assert cost["a100-sxm4-40gb"] > cost["l40s"] > cost["l40"] > cost["rtx-a6000"] > cost["rtx-4090"] > cost["rtx-3090"]
    assert cost["rtx-pro-6000-blackwell-server"] > cost["rtx-pro-6000-blackwell-workstation"] > cost["rtx-5090"] > cost["rtx-4090"]


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


# ---- gpuplace catalog (command line) ----------------------------------------------------------

NEW_GENERATION_IDS = BLACKWELL_IDS | {"h200-nvl-141gb", "l40", "mi325x", "mi355x"}


def _gpuplace_catalog(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from scheduler_extender.gpuplace_cli import main

    rc = main(["catalog", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def _listed_ids(out: str) -> list[str]:
    return [line.split()[0] for line in out.splitlines()[1:] if line and not line.startswith(" ")]


def test_gpuplace_catalog_lists_every_row_the_new_generations_included(catalog: Catalog, capsys) -> None:
    rc, out, _ = _gpuplace_catalog(capsys)
    assert rc == 0 and out.startswith("id ")
    assert _listed_ids(out) == list(catalog.entries)
    assert NEW_GENERATION_IDS <= set(_listed_ids(out))
    assert re.search(r"^rtx-pro-6000-blackwell-workstation\s+nvidia\s+12\.0\s", out, re.M), out


def test_gpuplace_catalog_sources_prints_each_rows_sources_under_it(catalog: Catalog, capsys) -> None:
    rc, out, _ = _gpuplace_catalog(capsys, "--sources")
    assert rc == 0
    blocks = re.split(r"^(?=\S)", out, flags=re.M)[2:]  # header first, then one block per row
    by_id = {block.split()[0]: block for block in blocks}
    for model_id in NEW_GENERATION_IDS:
        entry = catalog.entries[model_id]
        for source in entry.sources:
            assert f"    source: {source}\n" in by_id[model_id], (model_id, source)
        assert f"driver names: {', '.join(entry.driver_names)}" in by_id[model_id]
        assert f"precisions: {', '.join(entry.precisions)}" in by_id[model_id]
    assert "MIG: 1g.23gb x7, 1g.45gb x4, 2g.45gb x3, 3g.90gb x2, 4g.90gb x1, 7g.180gb x1" in by_id["b200-sxm-180gb"]
    assert "MIG: none catalogued" in by_id["b300-sxm-288gb"]


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        (["B200"], ["b200-sxm-180gb"]),
        (["gb200", "GB300"], ["gb200-186gb", "gb300-288gb"]),
        (["H20"], ["h20-96gb"]),
        (["H200"], ["h200-sxm-141gb", "h200-nvl-141gb"]),
        (["RTX PRO 6000"], ["rtx-pro-6000-blackwell-server", "rtx-pro-6000-blackwell-workstation"]),
    ],
)
def test_gpuplace_catalog_models_are_exact_tokens(capsys, tokens: list[str], expected: list[str]) -> None:
    rc, out, _ = _gpuplace_catalog(capsys, *tokens)
    assert rc == 0 and _listed_ids(out) == expected


def test_gpuplace_catalog_refuses_an_unknown_model_and_names_the_nearest(capsys) -> None:
    rc, out, err = _gpuplace_catalog(capsys, "B20")
    assert rc == 2 and out == ""
    assert "unknown GPU model 'B20'" in err and "b200" in err
