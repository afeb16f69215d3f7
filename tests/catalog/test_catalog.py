"""The bundled catalog's contents, the derived model figures, and user files that extend or override it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coral.catalog import (
    BUILTIN_FILES,
    Catalog,
    CatalogError,
    GpuType,
    ModelArch,
    NodeType,
    Offer,
    Region,
    catalog_to_dict,
    load_catalog,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "catalog"
KiB = 1024
MiB = 1024 * KiB

MODELS = [
    "llama-3.1-8b",
    "qwen3-14b",
    "phi-4",
    "deepseek-r1-distill-qwen-14b",
    "gemma-3-27b",
    "qwen3-32b",
    "llama-3.3-70b",
    "mixtral-8x7b",
    "gpt-oss-120b",
    "qwen3-235b-a22b",
]


def test_counts(catalog: Catalog) -> None:
    assert len(catalog.gpus) >= 12
    assert len(catalog.nodes) >= 20
    assert len(catalog.regions) >= 8
    assert len({r.cloud for r in catalog.regions.values()}) >= 2
    assert sorted(catalog.models) == sorted(MODELS)


def test_required_shapes_present(catalog: Catalog) -> None:
    for gpu in [
        "h100-80g",
        "h100-pcie-80g",
        "h200-141g",
        "a100-80g",
        "a100-40g",
        "l40s-48g",
        "l4-24g",
        "a10g-24g",
        "a10-24g",
        "t4-16g",
        "v100-16g",
        "mi300x-192g",
    ]:
        assert gpu in catalog.gpus
    for node in [
        "p5.48xlarge",
        "p5.4xlarge",
        "p4d.24xlarge",
        "p4de.24xlarge",
        "g6e.xlarge",
        "g6e.12xlarge",
        "g6e.48xlarge",
        "g6.xlarge",
        "g6.12xlarge",
        "g6.48xlarge",
        "g5.xlarge",
        "g5.12xlarge",
        "g5.48xlarge",
        "g4dn.xlarge",
        "a2-highgpu-1g",
        "a2-highgpu-4g",
        "a2-ultragpu-1g",
        "a3-highgpu-8g",
        "g2-standard-4",
        "g2-standard-48",
        "Standard_ND96isr_H100_v5",
        "Standard_NC24ads_A100_v4",
    ]:
        assert node in catalog.nodes
    for region in [
        "aws-us-east-1",
        "aws-us-west-2",
        "aws-eu-central-1",
        "aws-eu-north-1",
        "aws-ap-northeast-1",
        "aws-eu-west-1",
        "gcp-us-central1",
        "gcp-europe-west4",
        "gcp-asia-northeast1",
        "azure-eastus",
    ]:
        assert region in catalog.regions


def test_every_entry_has_a_source(catalog: Catalog) -> None:
    entries: list[GpuType | NodeType | Region | ModelArch] = [
        *catalog.gpus.values(),
        *catalog.nodes.values(),
        *catalog.regions.values(),
        *catalog.models.values(),
    ]
    for e in entries:
        assert len(e.source) > 10 and not e.source.startswith("defined in"), e
    for r in catalog.regions.values():
        assert r.offers, f"region {r.name} offers nothing"
        for o in r.offers.values():
            assert o.source, (r.name, o.node)


def test_node_shapes_are_consistent(catalog: Catalog) -> None:
    for n in catalog.nodes.values():
        assert n.gpu in catalog.gpus
        if n.intra_link == "nvlink":
            assert n.gpu_count > 1 and n.intra_link_gbs >= 150, n.name
    assert catalog.gpu_of("g6e.12xlarge").name == "l40s-48g"
    assert catalog.nodes["p5.48xlarge"].nic_bytes_per_s == pytest.approx(400e9)


def test_gpu_figures_are_dense(catalog: Catalog) -> None:
    # The 2:4-sparse H100 figure (1979) is a known trap in public tables.
    assert catalog.gpus["h100-80g"].tflops_bf16 == pytest.approx(989.4)
    assert catalog.gpus["a100-80g"].tflops_bf16 == pytest.approx(312)
    assert catalog.gpus["h200-141g"].memory_bytes == pytest.approx(141e9)
    for g in catalog.gpus.values():
        assert 0 < g.mem_efficiency <= 1 and 0 < g.compute_efficiency <= 1 and g.iter_overhead_s >= 0


@pytest.mark.parametrize("name", MODELS)
def test_derived_params_match_official(catalog: Catalog, name: str) -> None:
    m = catalog.models[name]
    assert m.total_params / 1e9 == pytest.approx(m.params_official_b, rel=0.02)


@pytest.mark.parametrize(
    ("name", "active_b"), [("mixtral-8x7b", 12.9), ("gpt-oss-120b", 5.1), ("qwen3-235b-a22b", 22.0)]
)
def test_moe_active_params(catalog: Catalog, name: str, active_b: float) -> None:
    assert catalog.models[name].active_params / 1e9 == pytest.approx(active_b, rel=0.03)


def test_weight_bytes(catalog: Catalog) -> None:
    assert catalog.models["llama-3.1-8b"].weight_bytes == pytest.approx(16.06e9, rel=0.01)
    assert catalog.models["qwen3-235b-a22b"].weight_bytes == pytest.approx(470e9, rel=0.01)
    # MXFP4 experts: the gpt-oss-120b checkpoint is about 61-65 GB.
    assert 60e9 < catalog.models["gpt-oss-120b"].weight_bytes < 66e9


@pytest.mark.parametrize(
    ("name", "kib"),
    [
        ("llama-3.3-70b", 320),
        ("qwen3-32b", 256),
        ("llama-3.1-8b", 128),
        ("qwen3-235b-a22b", 188),
        ("phi-4", 200),
    ],
)
def test_kv_bytes_per_token(catalog: Catalog, name: str, kib: int) -> None:
    assert catalog.models[name].kv_bytes_per_token == kib * KiB


def test_llama_31_70b_kv_from_user_file() -> None:
    cat = load_catalog([FIXTURES / "user-example.toml"])
    assert cat.models["llama-3.1-70b"].kv_bytes_per_token == 320 * KiB


def test_gemma_sliding_window_kv(catalog: Catalog) -> None:
    g = catalog.models["gemma-3-27b"]
    assert (g.sliding_window, g.kv_full_layers, g.num_layers) == (1024, 10, 62)
    assert g.kv_layer_tokens(512) == 512
    assert g.kv_layer_tokens(8192) == pytest.approx((10 * 8192 + 52 * 1024) / 62)
    # 10 global layers hold 80 KiB per token; the 52 local layers are capped at 1024 tokens (416 MiB).
    per_seq = g.num_layers * g.kv_layer_tokens(32768) * g.kv_bytes_per_token_layer
    assert per_seq == 80 * KiB * 32768 + 416 * MiB
    oss = catalog.models["gpt-oss-120b"]
    assert oss.kv_layer_tokens(4096) == pytest.approx((18 * 4096 + 18 * 128) / 36)
    assert catalog.models["qwen3-32b"].kv_layer_tokens(4096) == 4096


def test_regional_price_ordering(catalog: Catalog) -> None:
    r = catalog.regions
    base = r["aws-us-east-1"].offers
    for region in ["aws-eu-central-1", "aws-ap-northeast-1", "aws-eu-north-1", "aws-eu-west-1"]:
        shared = set(base) & set(r[region].offers)
        assert len(shared) >= 10, region
        for node in shared:
            assert r[region].offers[node].price > base[node].price, (region, node)
    for node, offer in r["aws-us-west-2"].offers.items():
        assert offer.price == base[node].price
    # Frankfurt about +25%, Tokyo +25% (p5) to +45% (g family).
    assert r["aws-eu-central-1"].offers["g6e.xlarge"].price / base["g6e.xlarge"].price == pytest.approx(1.25, abs=0.02)
    assert r["aws-ap-northeast-1"].offers["p5.48xlarge"].price / base["p5.48xlarge"].price == pytest.approx(1.25)
    gcp = r["gcp-us-central1"].offers
    for region in ["gcp-europe-west4", "gcp-asia-northeast1"]:
        for node in gcp:
            assert r[region].offers[node].price > gcp[node].price, (region, node)


def test_offers_are_sane(catalog: Catalog) -> None:
    for r in catalog.regions.values():
        for node, o in r.offers.items():
            assert o.node == node
            assert catalog.nodes[node].cloud == r.cloud
            assert o.availability >= 0 and 0 < o.price <= 1000
            if o.spot is not None:
                assert o.spot < o.price, (r.name, node)
    east = catalog.regions["aws-us-east-1"].offers
    assert east["p5.48xlarge"].availability < east["g6.xlarge"].availability
    assert "derived" in catalog.regions["aws-eu-north-1"].offers["g6.xlarge"].source
    assert "derived" not in catalog.regions["aws-eu-central-1"].offers["g6.xlarge"].source


def test_catalog_to_dict_is_json(catalog: Catalog) -> None:
    d = json.loads(json.dumps(catalog_to_dict(catalog)))
    assert set(d) == {"gpus", "nodes", "regions", "models"}
    assert d["gpus"]["h100-80g"]["memory_gb"] == 80
    assert d["nodes"]["g6e.12xlarge"]["gpu_count"] == 4
    assert d["regions"]["aws-us-east-1"]["offers"]["p5.48xlarge"]["price"] == 55.04
    assert d["models"]["qwen3-32b"]["derived"]["kv_bytes_per_token"] == 256 * KiB
    assert d["models"]["gpt-oss-120b"]["sliding_window"] == 128


def test_user_example_extends(catalog: Catalog) -> None:
    cat = load_catalog([FIXTURES / "user-example.toml"])
    h100, base = cat.gpus["h100-80g"], catalog.gpus["h100-80g"]
    assert (h100.mem_efficiency, h100.iter_overhead_s) == (0.62, 0.006)
    assert (h100.tflops_bf16, h100.memory_gb, h100.source) == (base.tflops_bf16, base.memory_gb, base.source)
    east = cat.regions["aws-us-east-1"]
    assert east.offers["p5.48xlarge"] == Offer(
        "p5.48xlarge",
        55.04,
        0,
        catalog.regions["aws-us-east-1"].offers["p5.48xlarge"].spot,
        catalog.regions["aws-us-east-1"].offers["p5.48xlarge"].source,
    )
    assert set(east.offers) == set(catalog.regions["aws-us-east-1"].offers)
    assert east.offers["g6.xlarge"] == catalog.regions["aws-us-east-1"].offers["g6.xlarge"]
    mi = cat.regions["azure-eastus"].offers["Standard_ND96isr_MI300X_v5"]
    assert (mi.price, mi.availability, mi.source) == (48.0, 1, "negotiated quote")
    lab = cat.regions["onprem-lab"]
    assert lab.cloud == "onprem" and lab.offers["lab-8x-a100-80g"].source == "amortised hardware + power cost"
    assert cat.gpu_of("lab-8x-a100-80g").name == "a100-80g"
    assert len(cat.models) == len(catalog.models) + 1
    # Loading a user file leaves the bundled catalog as it was.
    assert load_catalog() == catalog


def test_user_override_replaces_entirely(catalog: Catalog) -> None:
    cat = load_catalog([str(FIXTURES / "user-override.toml")])
    l4 = cat.gpus["l4-24g"]
    assert (l4.tflops_bf16, l4.source) == (125.0, "L4 datasheet, 125 TF variant")
    r = cat.regions["gcp-us-central1"]
    assert list(r.offers) == ["g2-standard-4"]
    assert r.offers["g2-standard-4"] == Offer("g2-standard-4", 0.45, 200, None, "our committed-use contract")
    assert list(cat.regions) == list(catalog.regions)  # an override keeps the entry's place


def test_later_user_files_win(tmp_path: Path) -> None:
    first = tmp_path / "a.toml"
    second = tmp_path / "b.toml"
    first.write_text('[[gpu]]\nname = "h100-80g"\nextend = true\nmem_efficiency = 0.7\n')
    second.write_text('[[gpu]]\nname = "h100-80g"\nextend = true\nmem_efficiency = 0.6\ncompute_efficiency = 0.4\n')
    g = load_catalog([first, second]).gpus["h100-80g"]
    assert (g.mem_efficiency, g.compute_efficiency) == (0.6, 0.4)


def test_a_bad_file_after_a_good_one_returns_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[gpu]]\nname = "h100-80g"\nextend = true\nmem_efficiency = 7\n')
    with pytest.raises(CatalogError, match="mem_efficiency"):
        load_catalog([FIXTURES / "user-example.toml", bad])


def test_builtin_files_exist() -> None:
    assert [p.name for p in BUILTIN_FILES] == ["gpus.toml", "nodes.toml", "regions.toml", "models.toml"]
    assert all(p.is_file() for p in BUILTIN_FILES)


def test_extend_adds_an_offer(catalog: Catalog, tmp_path: Path) -> None:
    path = tmp_path / "stockholm.toml"
    path.write_text(
        '[[region]]\nname = "aws-eu-north-1"\nextend = true\n'
        '[region.offers."p3.2xlarge"]\nprice = 3.3\navailability = 2\n'
    )
    region = load_catalog([path]).regions["aws-eu-north-1"]
    assert region.offers["p3.2xlarge"] == Offer("p3.2xlarge", 3.3, 2, None, f"defined in {path}")
    assert len(region.offers) == len(catalog.regions["aws-eu-north-1"].offers) + 1
    assert region.source == catalog.regions["aws-eu-north-1"].source
