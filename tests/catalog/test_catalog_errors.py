"""Each kind of bad catalog input gets one CatalogError naming the file, entry, field and reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from coral.catalog import CatalogError, load_catalog

EAST_EXTEND = '[[region]]\nname = "aws-us-east-1"\nextend = true\n'

GPU = """
[[gpu]]
name = "x1-24g"
vendor = "acme"
tflops_bf16 = 100
memory_gb = 24
mem_bw_gbs = 500
"""

NODE = """
[[node]]
name = "acme.1x"
cloud = "aws"
gpu = "l4-24g"
gpu_count = 1
nic_gbps = 10
intra_link = "pcie"
intra_link_gbs = 32
disk_gbs = 1.0
"""

REGION = """
[[region]]
name = "aws-xx-test-1"
cloud = "aws"
location = "Testland"

[region.offers."g6.xlarge"]
price = 1.0
availability = 3
"""

MODEL = """
[[model]]
name = "tiny"
hf_id = "acme/tiny"
num_layers = 4
hidden = 256
intermediate = 1024
heads = 8
kv_heads = 2
head_dim = 32
vocab = 1000
params_official_b = 0.00432
"""


def error_of(tmp_path: Path, text: str, name: str = "user.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(CatalogError) as info:
        load_catalog([path])
    msg = str(info.value)
    assert str(path) in msg
    return msg


def test_valid_snippets_load(tmp_path: Path) -> None:
    path = tmp_path / "ok.toml"
    path.write_text(GPU + NODE + REGION + MODEL)
    cat = load_catalog([path])
    assert cat.gpus["x1-24g"].source == f"defined in {path}"
    assert cat.regions["aws-xx-test-1"].offers["g6.xlarge"].availability == 3
    assert cat.models["tiny"].total_params / 1e9 == pytest.approx(0.00432, rel=0.02)


# (id, text, substrings the message must hold)
CASES = [
    ("toml-syntax", '[[gpu]]\nname = "x"\nvendor = \n', ["TOML syntax error", "line 3"]),
    (
        "missing-field",
        GPU.replace("mem_bw_gbs = 500\n", ""),
        ["gpu 'x1-24g' (entry #1)", "missing required field 'mem_bw_gbs'"],
    ),
    ("missing-name", GPU.replace('name = "x1-24g"\n', ""), ["gpu entry #1", "missing required field 'name'"]),
    (
        "unknown-field",
        GPU.replace("memory_gb", "memroy_gb"),
        ["gpu 'x1-24g'", "unknown field 'memroy_gb'", "did you mean 'memory_gb'"],
    ),
    (
        "wrong-type",
        GPU.replace("tflops_bf16 = 100", 'tflops_bf16 = "fast"'),
        ["field 'tflops_bf16'", "expected a number", "'fast'"],
    ),
    (
        "bool-for-number",
        GPU.replace("tflops_bf16 = 100", "tflops_bf16 = true"),
        ["field 'tflops_bf16'", "boolean"],
    ),
    (
        "array-for-number",
        GPU.replace("tflops_bf16 = 100", "tflops_bf16 = [100]"),
        ["field 'tflops_bf16'", "an array"],
    ),
    (
        "number-for-string",
        GPU.replace('vendor = "acme"', "vendor = 3"),
        ["field 'vendor'", "expected a string"],
    ),
    ("empty-string", GPU.replace('vendor = "acme"', 'vendor = ""'), ["field 'vendor'", "must not be empty"]),
    (
        "unit-in-string",
        GPU.replace("memory_gb = 24", 'memory_gb = "80GB"'),
        ["field 'memory_gb'", "'80GB'", "without a unit"],
    ),
    (
        "quoted-number",
        GPU.replace("memory_gb = 24", 'memory_gb = "80"'),
        ["field 'memory_gb'", "remove the quotes"],
    ),
    (
        "bytes-not-gb",
        GPU.replace("memory_gb = 24", "memory_gb = 80e9"),
        ["field 'memory_gb'", "out of range", "<= 2000", "GB", "write 80"],
    ),
    ("infinite", GPU.replace("mem_bw_gbs = 500", "mem_bw_gbs = inf"), ["field 'mem_bw_gbs'", "finite"]),
    ("efficiency-range", GPU + "mem_efficiency = 1.5\n", ["field 'mem_efficiency'", "<= 1"]),
    (
        "bad-intra-link",
        NODE.replace('"pcie"', '"nvswitch"'),
        ["node 'acme.1x'", "field 'intra_link'", "'nvswitch'", "'nvlink'"],
    ),
    ("zero-gpus", NODE.replace("gpu_count = 1", "gpu_count = 0"), ["field 'gpu_count'", ">= 1"]),
    (
        "unknown-gpu",
        NODE.replace('gpu = "l4-24g"', 'gpu = "l4-24gb"'),
        ["node 'acme.1x'", "field 'gpu'", "unknown GPU type 'l4-24gb'", "did you mean 'l4-24g'"],
    ),
    (
        "zero-price",
        REGION.replace("price = 1.0", "price = 0.0"),
        ["region 'aws-xx-test-1'", "offer 'g6.xlarge'", "field 'price'", "> 0"],
    ),
    (
        "negative-price",
        REGION.replace("price = 1.0", "price = -2.5"),
        ["offer 'g6.xlarge'", "field 'price'", "-2.5"],
    ),
    (
        "huge-price",
        REGION.replace("price = 1.0", "price = 5500.0"),
        ["field 'price'", "<= 1000", "USD per node-hour"],
    ),
    ("negative-spot", REGION.replace("price = 1.0", "price = 1.0\nspot = -1"), ["field 'spot'", "> 0"]),
    (
        "negative-availability",
        REGION.replace("availability = 3", "availability = -1"),
        ["offer 'g6.xlarge'", "field 'availability'", ">= 0"],
    ),
    (
        "fractional-availability",
        REGION.replace("availability = 3", "availability = 2.5"),
        ["field 'availability'", "expected an integer"],
    ),
    (
        "missing-availability",
        REGION.replace("availability = 3\n", ""),
        ["offer 'g6.xlarge'", "missing required field 'availability'"],
    ),
    (
        "unknown-offer-field",
        REGION.replace("availability = 3", "availability = 3\nprcie = 2"),
        ["offer 'g6.xlarge'", "unknown field 'prcie'"],
    ),
    (
        "unknown-node",
        REGION.replace("g6.xlarge", "g6.xlrage"),
        [
            "region 'aws-xx-test-1'",
            "offer 'g6.xlrage'",
            "unknown node type 'g6.xlrage'",
            "did you mean 'g6.xlarge'",
        ],
    ),
    (
        "wrong-cloud-offer",
        REGION.replace("g6.xlarge", "g2-standard-4"),
        ["offer 'g2-standard-4'", "cloud 'gcp'", "cloud 'aws'"],
    ),
    (
        "offers-not-table",
        REGION.split("[region.offers")[0] + "offers = 3\n",
        ["field 'offers'", "expected a table"],
    ),
    (
        "offer-not-table",
        REGION.split("[region.offers")[0] + 'offers = { "g6.xlarge" = 3 }\n',
        ["offer 'g6.xlarge'", "expected a table"],
    ),
    ("duplicate-in-file", GPU + GPU, ["gpu 'x1-24g' (entry #2)", "duplicate name", "entry #1 of this file"]),
    (
        "duplicate-in-file-override",
        GPU.replace("[[gpu]]", '[[gpu]]\noverride = true\nname = "h100-80g"', 1).replace('name = "x1-24g"\n', "") * 2,
        ["gpu 'h100-80g' (entry #2)", "duplicate name"],
    ),
    (
        "duplicate-of-builtin",
        GPU.replace('"x1-24g"', '"h100-80g"'),
        ["gpu 'h100-80g' (entry #1)", "duplicate name", "gpus.toml", "override = true"],
    ),
    (
        "override-unknown",
        GPU.replace("[[gpu]]", "[[gpu]]\noverride = true"),
        ["gpu 'x1-24g'", "field 'override'", "no earlier gpu is named 'x1-24g'"],
    ),
    (
        "extend-unknown",
        '[[node]]\nname = "p5.48xlarg"\nextend = true\n',
        ["node 'p5.48xlarg'", "no earlier node", "did you mean 'p5.48xlarge'"],
    ),
    (
        "override-and-extend",
        '[[gpu]]\nname = "h100-80g"\noverride = true\nextend = true\n',
        ["gpu 'h100-80g'", "exclude each other"],
    ),
    (
        "flag-not-bool",
        '[[gpu]]\nname = "h100-80g"\noverride = "yes"\n',
        ["field 'override'", "expected true or false"],
    ),
    (
        "extend-new-offer-no-price",
        EAST_EXTEND + '[region.offers."g6e.2xlarge"]\navailability = 1\n',
        ["region 'aws-us-east-1'", "offer 'g6e.2xlarge'", "missing required field 'price'"],
    ),
    (
        "extend-bad-value",
        EAST_EXTEND + '[region.offers."p5.48xlarge"]\navailability = -3\n',
        ["offer 'p5.48xlarge'", "field 'availability'"],
    ),
    (
        "non-integer-layers",
        MODEL.replace("num_layers = 4", "num_layers = 4.5"),
        ["model 'tiny'", "field 'num_layers'", "expected an integer", "4.5"],
    ),
    (
        "float-integer-layers",
        MODEL.replace("num_layers = 4", "num_layers = 4.0"),
        ["field 'num_layers'", "without a decimal point"],
    ),
    ("zero-layers", MODEL.replace("num_layers = 4", "num_layers = 0"), ["field 'num_layers'", ">= 1"]),
    (
        "kv-heads-divide",
        MODEL.replace("kv_heads = 2", "kv_heads = 3"),
        ["model 'tiny'", "field 'kv_heads'", "kv_heads = 3 does not divide heads = 8"],
    ),
    (
        "experts-active-too-many",
        MODEL + "num_experts = 4\nexperts_active = 6\nmoe_intermediate = 512\n",
        ["field 'experts_active'", "experts_active = 6 exceeds num_experts = 4"],
    ),
    (
        "experts-active-zero",
        MODEL + "num_experts = 4\nmoe_intermediate = 512\n",
        ["field 'experts_active'", ">= 1"],
    ),
    ("moe-no-expert-width", MODEL + "num_experts = 4\nexperts_active = 2\n", ["field 'moe_intermediate'"]),
    (
        "dense-with-experts-active",
        MODEL + "experts_active = 2\n",
        ["field 'experts_active'", "num_experts is 0"],
    ),
    (
        "window-without-full-layers",
        MODEL + "sliding_window = 128\n",
        ["field 'kv_full_layers'", "required with sliding_window"],
    ),
    ("full-layers-without-window", MODEL + "kv_full_layers = 2\n", ["field 'sliding_window'"]),
    (
        "full-layers-too-many",
        MODEL + "sliding_window = 128\nkv_full_layers = 9\n",
        ["field 'kv_full_layers'", "exceeds num_layers = 4"],
    ),
    (
        "params-in-units",
        MODEL.replace("params_official_b = 0.00432", "params_official_b = 8.03e9"),
        ["field 'params_official_b'", "billions"],
    ),
    (
        "bool-field",
        MODEL + 'tied_embeddings = "yes"\n',
        ["field 'tied_embeddings'", "expected true or false"],
    ),
    ("unknown-table", GPU.replace("[[gpu]]", "[[gpus]]"), ["unknown table 'gpus'", "did you mean 'gpu'"]),
    ("single-table", GPU.replace("[[gpu]]", "[gpu]"), ["'gpu' must be an array of tables", "[[gpu]]"]),
    ("array-of-numbers", "gpu = [1, 2]\n", ["gpu entry #1", "expected a table"]),
    ("name-spaces", GPU.replace('"x1-24g"', '" x1-24g"'), ["field 'name'", "spaces"]),
]


@pytest.mark.parametrize(("text", "expected"), [(t, e) for _, t, e in CASES], ids=[c[0] for c in CASES])
def test_bad_input(tmp_path: Path, text: str, expected: list[str]) -> None:
    msg = error_of(tmp_path, text)
    for part in expected:
        assert part in msg, f"{part!r} not in {msg!r}"


def test_duplicate_across_user_files(tmp_path: Path) -> None:
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.write_text(GPU)
    b.write_text(GPU)
    with pytest.raises(CatalogError) as info:
        load_catalog([a, b])
    msg = str(info.value)
    assert msg.startswith(f"{b}: gpu 'x1-24g' (entry #1)") and str(a) in msg and "duplicate name" in msg


def test_reference_check_names_the_file_of_the_offer(tmp_path: Path) -> None:
    # An offer added to a bundled region by a user file is reported against the user file.
    text = EAST_EXTEND + '[region.offers."p9.huge"]\nprice = 1.0\navailability = 1\n'
    msg = error_of(tmp_path, text)
    assert "region 'aws-us-east-1'" in msg and "unknown node type 'p9.huge'" in msg


def test_gpu_reference_resolves_across_files(tmp_path: Path) -> None:
    # A node may use a GPU type defined in a later user file; references are checked after all files.
    nodes, gpus = tmp_path / "nodes.toml", tmp_path / "gpus.toml"
    nodes.write_text(NODE.replace('gpu = "l4-24g"', 'gpu = "x1-24g"'))
    gpus.write_text(GPU)
    assert load_catalog([nodes, gpus]).gpu_of("acme.1x").name == "x1-24g"


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(CatalogError, match="no such catalog file"):
        load_catalog([path])


def test_directory_and_bad_encoding(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="is a directory"):
        load_catalog([tmp_path])
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[[gpu]]\nname = "caf\xe9"\n')
    with pytest.raises(CatalogError, match="not UTF-8"):
        load_catalog([path])


def test_single_path_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="sequence of paths"):
        load_catalog(str(tmp_path / "a.toml"))


def test_catalog_error_is_a_value_error() -> None:
    assert issubclass(CatalogError, ValueError)
