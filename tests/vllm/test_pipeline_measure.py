"""The pure parts of the pipeline measurement: split checks, vLLM's Prometheus figures, model and file
matching, the workload and the stall arithmetic (no vLLM needed)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from coral.vllm import pipeline_measure as pm

METRICS = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",engine="0",num_gpu_blocks="4096",prefix_caching_hash_algo="sha256"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="tiny"} 3.0
vllm:iteration_tokens_total_sum{engine="0",model_name="tiny"} 420.0
vllm:iteration_tokens_total_count{engine="0",model_name="tiny"} 30.0
vllm:prompt_tokens_total{engine="0",model_name="tiny"} 300.0
"""


def test_valid_splits_pass_and_each_bad_split_is_named() -> None:
    assert pm.check_split((1, 3), 4, 2) == (1, 3)
    assert pm.check_split([4], 4, 2) == (4,)
    cases = {
        (): "needs at least one stage",
        (0, 4): "--splits 0,4: stage 0 holds 0 layers",
        (2, 3): "--splits 2,3: the stages hold 5 layers, the model has 4",
        (1, 1, 1, 1, 1): "PP=5 exceeds the model's 4 layers",
        (1, 1, 2): "--splits 1,1,2: PP=3 refused on this machine: cpu binding: 3 CPU workers need at least 3 cores",
    }
    for split, msg in cases.items():
        with pytest.raises(pm.PipelineMeasureError, match=msg.replace("(", r"\(")):
            pm.check_split(split, 4, 2)
    assert pm.check_split((1, 1, 2), 4, 3) == (1, 1, 2)
    with pytest.raises(pm.PipelineMeasureError, match="'1;3' is not a comma-separated list"):
        pm.parse_split("1;3")
    assert pm.parse_split("3,1") == (3, 1)


def test_prometheus_figures() -> None:
    assert pm.cache_config(METRICS) == (128, 4096)
    assert pm.gauge(METRICS, "vllm:kv_cache_usage_perc") == 0.25
    assert pm.histogram(METRICS, "vllm:iteration_tokens_total") == (420.0, 30.0)
    assert pm.gauge(METRICS, "vllm:absent") == 0.0
    with pytest.raises(pm.PipelineMeasureError, match="no vllm:cache_config_info"):
        pm.cache_config("vllm:kv_cache_usage_perc 0.1\n")


LOG = """\
(APIServer pid=7124) INFO 12-01 15:40:27 [loggers.py:210] Engine 000: Iteration(40): 1 context requests, 64 context \
tokens, 3 generation requests, 3 generation tokens, iteration elapsed time: 12.50 ms, CPU KV cache usage: 0.6%
(APIServer pid=7124) INFO 12-01 15:40:27 [loggers.py:210] Engine 000: Iteration(41): 0 context requests, 0 context \
tokens, 4 generation requests, 4 generation tokens, iteration elapsed time: 10.00 ms, CPU KV cache usage: 0.8%
(APIServer pid=7124) INFO 12-01 15:40:27 [loggers.py:335] Engine 000: Avg prompt throughput: 168.4 tokens/s, Avg \
generation throughput: 13.8 tokens/s, Running: 4 reqs, Waiting: 0 reqs, CPU KV cache usage: 0.8%, Prefix cache hit \
rate: 0.0%
(APIServer pid=7124) INFO 12-01 15:40:28 [loggers.py:335] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg \
generation throughput: 13.8 tokens/s, Running: 2 reqs, Waiting: 1 reqs, CPU KV cache usage: 0.4%
(APIServer pid=7124) INFO:     127.0.0.1:40000 - "GET /metrics HTTP/1.1" 200 OK
"""


def test_engine_log_lines() -> None:
    got = pm.engine_log_stats(LOG)
    assert got == {
        "log_steps": 2.0,
        "log_micro_batch": 3.5,
        "log_step_ms": 11.25,
        "log_ticks": 2.0,
        "log_peak_running": 4.0,
        "log_mean_running": 3.0,
        "log_peak_kv_frac": 0.008,
    }
    empty = pm.engine_log_stats("INFO: nothing of the engine\n")
    assert empty["log_steps"] == empty["log_ticks"] == empty["log_peak_running"] == 0.0
    assert np.isnan(empty["log_micro_batch"])


def _tpot_hist(counts: dict[str, float], total: float, n: float) -> str:
    name = "vllm:request_time_per_output_token_seconds"
    rows = [f'{name}_bucket{{engine="0",le="{le}",model_name="tiny"}} {c}' for le, c in counts.items()]
    return "\n".join([*rows, f'{name}_sum{{engine="0",model_name="tiny"}} {total}',
                      f'{name}_count{{engine="0",model_name="tiny"}} {n}']) + "\n"  # fmt: skip


def test_histogram_quantile_of_the_observations_a_run_added() -> None:
    name = "vllm:request_time_per_output_token_seconds"
    first = _tpot_hist({"0.01": 2, "0.02": 2, "0.04": 2, "+Inf": 2}, 0.02, 2)
    # the run added 10 observations: 4 in (0.01, 0.02], 6 in (0.02, 0.04], summing to 0.3 s
    last = _tpot_hist({"0.01": 2, "0.02": 6, "0.04": 12, "+Inf": 12}, 0.32, 12)
    p50, mean, n = pm.histogram_quantile(first, last, name, 0.5)
    assert n == 10 and mean == pytest.approx(0.03)
    assert p50 == pytest.approx(0.02 + 0.02 * (1 / 6))  # the 5th of 10: the first of the bucket's 6
    assert pm.histogram_quantile(first, last, name, 0.9)[0] == pytest.approx(0.02 + 0.02 * (5 / 6))
    assert pm.histogram_quantile(first, last, name, 0.3)[0] == pytest.approx(0.01 + 0.01 * (3 / 4))
    beyond = _tpot_hist({"0.01": 2, "0.02": 2, "0.04": 2, "+Inf": 5}, 9.0, 5)
    assert np.isnan(pm.histogram_quantile(first, beyond, name, 0.9)[0])  # past the last finite bound
    assert np.isnan(pm.histogram_quantile(first, first, name, 0.5)[0])  # nothing added
    assert pm.TPOT_BUCKETS[0] == 1e-3 and 4.0 < pm.TPOT_BUCKETS[-1] < 4.5


def _config(tmp_path: Path, **over: object) -> Path:
    cfg = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}
    cfg.update(over)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_model_info_and_kv_bytes(tmp_path: Path) -> None:
    info = pm.model_info(_config(tmp_path))
    assert (info.layers, info.kv_heads, info.head_dim, info.dtype_bytes) == (4, 2, 32, 4)
    assert pm.kv_bytes_per_block(info, 16, 3) == 2 * 16 * 2 * 32 * 4 * 3
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(pm.PipelineMeasureError, match=r"config\.json: not JSON"):
        pm.model_info(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(pm.PipelineMeasureError, match="lacks the layer, head or size fields"):
        pm.model_info(tmp_path)
    with pytest.raises(pm.PipelineMeasureError, match="cannot read"):
        pm.model_info(tmp_path / "missing")


def test_a_measurement_or_profile_of_another_model_is_refused(tmp_path: Path) -> None:
    info = pm.model_info(_config(tmp_path))
    doc = {"model": {"digest": info.digest, "layers": 4}}
    assert pm.check_results(doc, "r.json", info) is doc
    with pytest.raises(pm.PipelineMeasureError, match=r"--results r.json: measured on model x \(4 layers\)"):
        pm.check_results({"model": {"digest": "x", "layers": 4}}, "r.json", info)
    with pytest.raises(pm.PipelineMeasureError, match="no 'model' record"):
        pm.check_results({"runs": []}, "r.json", info)
    from coral.perf.profile import ProfileTable

    z = np.array([1.0])
    table = ProfileTable("other", "cpu-avx512", 1, 64, z, z, z, z, "p.csv")
    with pytest.raises(pm.PipelineMeasureError, match=r"--profile p\.csv: its table is of model 'other'"):
        pm.check_profile(table, "p.csv", "tiny-llama", "cpu-avx512")
    table = ProfileTable("tiny-llama", "h100", 1, 64, z, z, z, z, "p.csv")
    with pytest.raises(pm.PipelineMeasureError, match="GPU type 'h100'"):
        pm.check_profile(table, "p.csv", "tiny-llama", "cpu-avx512")


def test_workload_is_seeded_and_bounded() -> None:
    a = pm.workload(7, 500, 64, 16, 1024)
    assert a == pm.workload(7, 500, 64, 16, 1024)
    ins = [p for p, _ in a]
    outs = [o for _, o in a]
    assert min(ins) >= 4 and max(ins) <= 512 and min(outs) >= 2 and max(outs) <= 256
    assert 50 < np.mean(ins) < 78 and 13 < np.mean(outs) < 19


def test_stall_counts_the_time_lost_in_the_prompt_window() -> None:
    # tokens every 10 ms; a prompt from 0.105 to 0.205 holds one gap of 60 ms instead of 10
    t = [0.01 * i for i in range(11)] + [0.16 + 0.01 * i for i in range(10)]
    r = pm.Timed(16, len(t), -0.01, tuple(t))
    assert r.ttft == pytest.approx(0.01) and r.tpot == pytest.approx((t[-1] - t[0]) / (len(t) - 1))
    s = pm.stall([r, r], 0.105, 0.205)
    assert s["base_gap_s"] == pytest.approx(0.01)
    assert s["stall_s"] == pytest.approx(0.05)
    assert s["longest_gap_s"] == pytest.approx(0.06)
    with pytest.raises(pm.PipelineMeasureError, match="needs longer streams"):
        pm.stall([pm.Timed(16, 3, 0.0, (0.1, 0.2, 0.3))], 0.15, 0.25)
