"""The roofline perf model: formulas, memory caps, calibration error, and the profile-table override."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from coral.catalog import Catalog
from coral.cli import main
from coral.perf import PerfError, PerfModel, ProfileError, load_profiles
from coral.perf import roofline as rl
from coral.perf.calibration import evaluate

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "profiles"


def test_calibration_error_within_targets(catalog: Catalog) -> None:
    rows = [r for r in evaluate(catalog) if not r.point.held_out]
    errs = np.abs([r.error for r in rows])
    assert len(rows) >= 12
    assert np.median(errs) <= 0.15, [(r.point.node, r.point.batch, round(r.error, 3)) for r in rows]
    assert errs.max() <= 0.35


def test_decode_time_grows_with_batch_context_and_layers(perf: PerfModel) -> None:
    t = perf.decode_step_s("llama-3.1-8b", "g6e.xlarge", layers=32, batch=np.array([1, 8, 64, 256]), context=1024)
    assert np.all(np.diff(t) > 0)
    c = perf.decode_step_s("llama-3.1-8b", "g6e.xlarge", layers=32, batch=32, context=np.array([256, 4096]))
    assert c[1] > c[0]
    k = perf.decode_step_s("llama-3.1-8b", "g6e.xlarge", layers=np.array([8, 16, 32]), batch=8, context=1024)
    assert np.all(np.diff(k) > 0)


def test_batch_one_decode_is_memory_bound(catalog: Catalog) -> None:
    m, n = catalog.models["llama-3.1-8b"], catalog.nodes["p5.4xlarge"]
    g = catalog.gpus[n.gpu]
    t = float(rl.decode_step_s(m, n, g, 1, 32, 1, 1024))
    floor = m.weight_bytes / (g.mem_bw_gbs * 1e9)
    assert t > floor


def test_prefill_quadratic_attention_term(catalog: Catalog) -> None:
    m, n = catalog.models["qwen3-32b"], catalog.nodes["p5.4xlarge"]
    g = catalog.gpus[n.gpu]
    short = float(rl.prefill_s(m, n, g, 1, 64, 1, 1024))
    long = float(rl.prefill_s(m, n, g, 1, 64, 1, 16384))
    assert long > 16 * short  # super-linear in prompt length


def test_moe_reads_fewer_bytes_than_dense_of_same_size(catalog: Catalog) -> None:
    mix = catalog.models["mixtral-8x7b"]
    assert mix.active_params < 0.35 * mix.total_params
    assert mix.moe_experts_touched(1) == pytest.approx(2.0)
    assert mix.moe_experts_touched(256) == pytest.approx(8.0, rel=1e-3)
    n = catalog.nodes["p5.48xlarge"]
    g = catalog.gpus[n.gpu]
    b1 = float(rl.decode_step_s(mix, n, g, 8, mix.num_layers, 1, 1024))
    b64 = float(rl.decode_step_s(mix, n, g, 8, mix.num_layers, 64, 1024))
    assert b64 > b1  # more experts touched at larger batch


def test_tensor_parallel_speeds_up_and_pays_allreduce(perf: PerfModel) -> None:
    t1 = perf.decode_step_s("qwen3-32b", "p5.48xlarge", layers=64, batch=8, context=1024, tp=1)
    t8 = perf.decode_step_s("qwen3-32b", "p5.48xlarge", layers=64, batch=8, context=1024, tp=8)
    assert t8 < t1
    assert t8 > t1 / 8  # all-reduce and overhead do not shrink


def test_memory_caps_and_kv_capacity(perf: PerfModel, catalog: Catalog) -> None:
    m = catalog.models["llama-3.3-70b"]
    k = perf.max_layers("llama-3.3-70b", "g6e.xlarge", batch=1, context=1024)
    usable = perf.usable_bytes("g6e.xlarge")
    per_layer = m.layer_weight_bytes + 1024 * m.kv_bytes_per_token_layer
    assert k == int(usable // per_layer)
    assert 0 < k < m.num_layers
    assert perf.max_layers("llama-3.3-70b", "p5.48xlarge", batch=1, context=1024) == m.num_layers
    cap = perf.kv_capacity_tokens("llama-3.1-8b", "g6e.xlarge", layers=32)
    m8 = catalog.models["llama-3.1-8b"]
    expected = (perf.usable_bytes("g6e.xlarge") - m8.weight_bytes) / m8.kv_bytes_per_token
    assert cap == int(expected)
    assert perf.kv_capacity_tokens("llama-3.3-70b", "g6e.xlarge", layers=80) == 0


def test_sliding_window_shrinks_kv(catalog: Catalog) -> None:
    g = catalog.models["gemma-3-27b"]
    assert g.kv_layer_tokens(32768) < 0.25 * 32768
    assert g.kv_layer_tokens(512) == pytest.approx(512)


def test_profile_override(catalog: Catalog) -> None:
    tables = load_profiles(FIX / "example-llama-3.1-8b-l40s.csv")
    perf = PerfModel(catalog, tables)
    plain = PerfModel(catalog)
    assert perf.version != plain.version
    got = perf.decode_step_s("llama-3.1-8b", "g6e.xlarge", layers=16, batch=8, context=1024)
    assert float(got) == pytest.approx(16 * 0.00074)
    mid = perf.decode_step_s("llama-3.1-8b", "g6e.xlarge", layers=1, batch=20, context=1024)
    assert float(mid) == pytest.approx(0.00074 + (0.00087 - 0.00074) * 12 / 24)
    pre = perf.prefill_s("llama-3.1-8b", "g6e.xlarge", layers=32, batch=1, prompt=2048)
    assert float(pre) == pytest.approx(32 * 0.00255)
    # other GPUs and models keep the roofline
    other = perf.decode_step_s("llama-3.1-8b", "p5.4xlarge", layers=32, batch=8, context=1024)
    assert float(other) == float(plain.decode_step_s("llama-3.1-8b", "p5.4xlarge", layers=32, batch=8, context=1024))
    assert perf.predict("llama-3.1-8b", "g6e.xlarge", batch=1, prompt=128, context=1024).source.startswith("profile")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("a,b\n1,2\n", "header"),
        ("model,gpu,tp,phase,x,layer_s,context\nm,g,1,prefill,abc,0.1,1\nm,g,1,decode,1,0.1,1\n", "field 'x'"),
        ("model,gpu,tp,phase,x,layer_s,context\nm,g,1,prefill,1,-0.1,1\nm,g,1,decode,1,0.1,1\n", "field 'layer_s'"),
        ("model,gpu,tp,phase,x,layer_s,context\nm,g,1,warmup,1,0.1,1\n", "field 'phase'"),
        ("model,gpu,tp,phase,x,layer_s,context\nm,g,1,prefill,4,0.1,1\nm,g,1,prefill,2,0.2,1\n", "does not increase"),
        ("model,gpu,tp,phase,x,layer_s,context\nm,g,1,prefill,4,0.1,1\n", "no decode rows"),
    ],
)
def test_profile_bad_input(tmp_path: Path, text: str, needle: str) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(ProfileError, match=needle) as e:
        load_profiles(p)
    assert str(p) in str(e.value)


def test_perf_bad_queries(perf: PerfModel) -> None:
    with pytest.raises(PerfError, match="unknown model"):
        perf.predict("nope", "g6e.xlarge", batch=1, prompt=1, context=1)
    with pytest.raises(PerfError, match="unknown node type"):
        perf.predict("llama-3.1-8b", "nope", batch=1, prompt=1, context=1)
    with pytest.raises(PerfError, match="tp must be"):
        perf.predict("llama-3.1-8b", "g6e.xlarge", batch=1, prompt=1, context=1, tp=4)
    with pytest.raises(PerfError, match="layers must be"):
        perf.predict("llama-3.1-8b", "g6e.xlarge", batch=1, prompt=1, context=1, layers=33)
    with pytest.raises(PerfError, match="batch must be"):
        perf.predict("llama-3.1-8b", "g6e.xlarge", batch=0, prompt=1, context=1)


def test_cli_perf_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["perf", "--model", "llama-3.1-8b", "--node", "g6e.xlarge", "--batch", "8", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("prefill_s", "decode_step_s", "max_layers", "kv_capacity_tokens"):
        assert key in out
    assert out["tp"] == 1 and out["layers"] == 32


def test_cli_perf_unknown_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["perf", "--model", "gpt-9", "--node", "g6e.xlarge"]) == 2
    assert "unknown model 'gpt-9'" in capsys.readouterr().err
