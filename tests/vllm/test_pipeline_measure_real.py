"""The pipeline measurement on a real PP=2 vLLM server (uneven split 1,3, chunked prefill): its figures are
sane, and the KV blocks vLLM reports cover the sequences that ran."""

from __future__ import annotations

import math
import time
from pathlib import Path

import attrs
import pytest

from coral.vllm import pipeline_measure as pm
from tests.vllm.conftest import cpu_backend, start

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SCHED = ("--enable-chunked-prefill", "--max-num-batched-tokens", "128", "--max-num-seqs", "64")


def test_pp2_measurement_is_sane_and_kv_blocks_cover_the_sequences(tiny_model: Path, vllm_dir: Path) -> None:
    # a PP=2 start took 8-10 min on this 2-core machine under a load of 30-40: more than conftest's 400 s
    backend = attrs.evolve(cpu_backend(tiny_model, vllm_dir), extra_args=SCHED, startup_timeout_s=900.0)
    engines, t0 = start(backend, [1, 3], "ppm")
    head = engines[0]
    try:
        tg = pm.Target(head.endpoint, "tiny", head.api_key, 1024, 1024)
        text = pm.Scraper(tg.endpoint, tg.api_key).text()
        block, blocks = pm.cache_config(text)
        row = pm.run_closed(tg, 4, 2, 64, 16, seed=5)
        assert row["requests"] == 8
        assert row["tpot_p50"] > 0 and row["ttft_p50"] > 0 and row["tok_s"] > 0
        assert row["steps"] > 0 and 0 < row["micro_batch"] <= 4
        need = max(p + o for p, o in pm.workload(5, 8, 64, 16, 1024))
        assert blocks * block >= 4 * need  # the pool holds the 4 concurrent sequences
        assert row["peak_kv_frac"] * blocks > 0 and row["peak_kv_frac"] <= 1
        ttft = pm.run_ttft(tg, [16, 256], 1, seed=1)
        assert all(math.isfinite(r["ttft_p50"]) and r["ttft_p50"] > 0 for r in ttft)
    finally:
        for e in engines:
            e.stop(time.monotonic() - t0)
