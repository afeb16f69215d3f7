"""The stage model: step-time shape, memory caps, end-to-end calibration error, and the profile override."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import numpy as np
import pytest

from coral.catalog import Catalog
from coral.cli import main
from coral.perf import PerfError, PerfModel, ProfileError, load_profiles
from coral.perf.calibration import evaluate
from coral.perf.ops import PURE_STREAM_OP, HostFloor
from coral.perf.params import load_params

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


def test_batch_one_decode_is_memory_bound(perf: PerfModel, catalog: Catalog) -> None:
    m, g = catalog.models["llama-3.1-8b"], catalog.gpus["h100-80g"]
    t = float(perf.decode_step_s("llama-3.1-8b", "p5.4xlarge", layers=32, batch=1, context=1024))
    assert t > m.weight_bytes / (g.mem_bw_gbs * 1e9)


def test_host_floor_overlaps_gpu_time(perf: PerfModel) -> None:
    """At batch 1 the host floor hides the GPU time, so a faster GPU does not help (max, not sum)."""
    host = perf.params.host
    floor = 32 * host.per_layer_s + host.per_iter_s + host.per_seq_s
    t = float(perf.decode_step_s("llama-3.1-8b", "p5.4xlarge", layers=32, batch=1, context=1024))
    assert t == pytest.approx(floor)
    slow = float(perf.decode_step_s("llama-3.1-8b", "g6e.xlarge", layers=32, batch=1, context=1024))
    assert slow > floor * 1.5  # GPU-bound on the slower GPU


def test_prefill_quadratic_attention_term(perf: PerfModel) -> None:
    short = float(perf.prefill_s("qwen3-32b", "p5.4xlarge", layers=64, batch=1, prompt=1024))
    long = float(perf.prefill_s("qwen3-32b", "p5.4xlarge", layers=64, batch=1, prompt=16384))
    assert long > 16 * short  # super-linear in prompt length


def test_decode_attention_streams_kv_at_the_streaming_bandwidth(perf: PerfModel, catalog: Catalog) -> None:
    """The decode step's growth with context is the batch's extra KV bytes over the residual add's bandwidth
    (no L2 gain), within the waves' and floors' share."""
    m, g = catalog.models["llama-3.1-8b"], perf.gpu_curve("h100-80g")
    c = np.array([4096.0, 32768.0])
    t = perf.decode_step_s("llama-3.1-8b", "p5.4xlarge", layers=32, batch=64, context=c)
    eff = g.stream[PURE_STREAM_OP][0]
    extra = 32 * 64 * (c[1] - c[0]) * m.kv_bytes_per_token_layer / (g.mem_bw * eff)
    assert t[1] - t[0] == pytest.approx(extra, rel=0.005)
    small = 1e6  # bytes within the L2: the streaming kernel gets its L2 gain, the KV read does not
    assert float(g.decode_attention_s(small, 0.0, 1, 1)) > float(g.stream_s(PURE_STREAM_OP, small, 1, 1))


def test_short_prefill_attention_waits_on_its_longest_block(perf: PerfModel) -> None:
    """Few blocks leave SMs idle: the kernel takes at least its longest block's time on one SM."""
    g = perf.gpu_curve("h100-80g")
    longest = 4.0 * 128 * 2048 * 128
    t = float(g.prefill_attention_s(10 * longest, longest, 0.0))
    assert t == pytest.approx(g.floor_s + longest * g.sm_count / (g.peak_flops * g.cmp_eff))
    many = float(g.prefill_attention_s(1000 * longest, longest, 0.0))
    assert many == pytest.approx(g.floor_s + 1000 * longest / (g.peak_flops * g.cmp_eff))


def test_moe_reads_fewer_bytes_than_dense_of_same_size(perf: PerfModel, catalog: Catalog) -> None:
    mix = catalog.models["mixtral-8x7b"]
    assert mix.active_params < 0.35 * mix.total_params
    assert mix.moe_experts_touched(1) == pytest.approx(2.0)
    assert mix.moe_experts_touched(256) == pytest.approx(8.0, rel=1e-3)
    dec = perf.decode_step_s("mixtral-8x7b", "g6e.xlarge", layers=1, batch=np.array([1.0, 64.0]), context=1024)
    assert dec[1] > dec[0]  # more experts touched at larger batch


def test_tensor_parallel_speeds_up_and_pays_allreduce(perf: PerfModel) -> None:
    p1 = perf.prefill_s("qwen3-32b", "p5.48xlarge", layers=64, batch=1, prompt=4096, tp=1)
    p8 = perf.prefill_s("qwen3-32b", "p5.48xlarge", layers=64, batch=1, prompt=4096, tp=8)
    assert p1 / 8 < p8 < p1  # GPU-bound: faster, but all-reduces and floors do not shrink
    # decode at small batch: TP shrinks the GPU time under the host floor, which TP does not shrink
    host = perf.params.host
    d8 = perf.decode_step_s("qwen3-32b", "p5.48xlarge", layers=64, batch=8, context=1024, tp=8)
    assert float(d8) >= 64 * (host.per_layer_s + 2 * host.per_allreduce_s)


def test_memory_caps_and_kv_capacity(perf: PerfModel, catalog: Catalog) -> None:
    m = catalog.models["llama-3.3-70b"]
    k = perf.max_layers("llama-3.3-70b", "g6e.xlarge", batch=1, context=1024)
    usable = perf.usable_bytes("g6e.xlarge")
    assert 0 < k < m.num_layers
    assert float(perf.stage_bytes("llama-3.3-70b", layers=k, batch=1, context=1024, node="g6e.xlarge")) <= usable
    assert float(perf.stage_bytes("llama-3.3-70b", layers=k + 1, batch=1, context=1024, node="g6e.xlarge")) > usable
    assert perf.max_layers("llama-3.3-70b", "p5.48xlarge", batch=1, context=1024) == m.num_layers
    cap = perf.kv_capacity_tokens("llama-3.1-8b", "g6e.xlarge", layers=32)
    m8 = catalog.models["llama-3.1-8b"]
    fixed = float(perf.stage_bytes("llama-3.1-8b", layers=32, batch=1, context=0, node="g6e.xlarge"))
    assert fixed > m8.weight_bytes  # weights, both ends once, and the activation workspace
    assert cap == int((usable - fixed) // m8.kv_bytes_per_token)
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


def test_moe_experts_run_as_one_grouped_gemm(perf: PerfModel) -> None:
    """The touched experts share one kernel's waves and floor: 128 tiny expert GEMMs cost far less than 128
    separate kernels, and a batch of 64 stays within a small multiple of batch 1 (host floor aside)."""
    g = perf.gpu_curve("h100-80g")
    one = float(g.gemm_s(4, 4096, 384))
    grouped = float(g.gemm_s(4, 4096, 384, groups=128))
    assert grouped < 0.25 * 128 * one
    assert grouped > one
    d = perf.decode_step_s("qwen3-235b-a22b", "p5.48xlarge", layers=94, batch=[1.0, 64.0], context=1024)
    assert d[0] < d[1] < 2 * d[0]


def test_ends_time_on_the_stages_that_hold_them(catalog: Catalog) -> None:
    """The LM head's time is on the stage with the last layer, the embedding's on the one with layer 0; a
    pipeline's stages add up to the spread charge, and a stage of every layer is charged both either way."""
    params = load_params()
    gpu_only = PerfModel(catalog, params=attrs.evolve(params, host=HostFloor(0.0, 0.0, 0.0, 0.0, "")))
    model, node, L = "llama-3.1-8b", "p5.4xlarge", 32
    m, g = catalog.models[model], gpu_only.gpu_curve("h100-80g")
    for b in (1, 64):
        dec = {e: float(gpu_only.decode_step_s(model, node, layers=8, batch=b, context=1024, ends=e)) for e in
               ((False, False), (True, False), (False, True))}  # fmt: skip
        head = float(g.gemm_s(b, m.hidden, m.vocab))
        assert dec[(False, True)] - dec[(False, False)] == pytest.approx(head, rel=1e-9)
        assert 0 < dec[(True, False)] - dec[(False, False)] < head
        parts = [(True, False), (False, False), (False, False), (False, True)]
        exact = sum(float(gpu_only.decode_step_s(model, node, layers=8, batch=b, context=1024, ends=e)) for e in parts)
        spread = 4 * float(gpu_only.decode_step_s(model, node, layers=8, batch=b, context=1024))
        assert exact == pytest.approx(spread, rel=1e-9)
        whole = gpu_only.decode_step_s(model, node, layers=L, batch=b, context=1024, ends=(True, True))
        assert float(whole) == pytest.approx(
            float(gpu_only.decode_step_s(model, node, layers=L, batch=b, context=1024))
        )
    pre = gpu_only.prefill_s(model, node, layers=8, batch=2, prompt=512, ends=(np.array([0, 1]), np.array([0, 1])))
    mid = gpu_only.prefill_s(model, node, layers=8, batch=2, prompt=512, ends=(False, False))
    assert pre[0] == pytest.approx(float(mid)) and pre[1] > float(mid)
