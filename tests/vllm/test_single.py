"""One real vLLM server (a single-stage instance of the tiny model), shared by the tests of this module:
greedy tokens equal transformers', the engine protocol over it, its scraped metrics, ``coral profile``
measuring it, and its engine key: the server refuses every request without its instance's key
(completions, metrics, vLLM's own extra routes), the engine itself works with it, the gateway reaches it
with the key it derives, and no key is in the launch plan's repr, the command line or the server's log."""

from __future__ import annotations

import json
import time
from pathlib import Path

import aiohttp
import anyio
import pytest

from coral.catalog import load_catalog
from coral.cli import main
from coral.gateway import Gateway, serving
from coral.gateway.auth import Auth
from coral.messages.requests import WorkItem
from coral.perf import PerfModel, load_profiles
from coral.vllm import client
from coral.vllm.engine import VllmEngine
from coral.vllm.launch import API_KEY_ENV, engine_key
from tests.conftest import FIXTURES
from tests.gateway.test_proxy import fleet, inst
from tests.vllm.conftest import N_TOKENS, PROMPTS, reference_tokens

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.xdist_group("vllm")]


def _complete(engine: VllmEngine, prompt: list[int], n: int) -> list[int]:
    body = client.completion_body("tiny", prompt, n, stream=False)
    r = client.post_json(engine.endpoint, "/v1/completions", body, api_key=engine.api_key)
    return [int(t) for t in r["choices"][0]["token_ids"]]


def test_greedy_tokens_equal_transformers_generate(single: tuple[VllmEngine, float], tiny_model: Path) -> None:
    engine, _ = single
    got = [_complete(engine, p, N_TOKENS) for p in PROMPTS]
    assert got == reference_tokens(tiny_model, PROMPTS, N_TOKENS)
    assert len({tuple(g) for g in got}) == len(PROMPTS)  # the prompts lead to different continuations
    streamed = client.stream_completion(engine.endpoint, "tiny", PROMPTS[0], N_TOKENS, api_key=engine.api_key)
    assert list(streamed.token_ids) == got[0] and streamed.finish_reason == "length"


def test_the_engine_serves_work_items_and_reports_the_server_metrics(single: tuple[VllmEngine, float]) -> None:
    engine, t0 = single
    assert engine.api_key  # a keyed server: the engine's own requests and scrapes carry its key
    before = engine.server_metrics()
    now = time.monotonic() - t0
    items = [WorkItem(i, "tiny", now, now, 20 + 7 * i, 10 + i) for i in range(6)]
    later = WorkItem(99, "tiny", now, now + 1e6, 8, 4)  # not due yet: stays queued in the engine
    engine.submit([*items, later], now)
    outcomes = []
    while len(outcomes) < len(items):
        outcomes += engine.poll(time.monotonic() - t0)
        assert not engine.fault
        time.sleep(0.05)
    assert sorted(o.id for o in outcomes) == list(range(6))
    for o in outcomes:
        assert o.kind == "done" and now <= o.t_first <= o.t
    m = engine.metrics()
    assert m.in_flight == 1 and m.queued >= 1  # the one not due
    assert engine.drain(time.monotonic() - t0)[0].id == 99  # handed back, never sent
    assert engine.drained
    engine.scrape_now()
    after = engine.server_metrics()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert name in after
    sent = sum(i.out for i in items)
    assert after["vllm:generation_tokens_total"] - before.get("vllm:generation_tokens_total", 0.0) == sent
    assert after["vllm:prompt_tokens_total"] - before.get("vllm:prompt_tokens_total", 0.0) == sum(
        i.prompt for i in items
    )


def test_profile_writes_a_table_the_perf_model_loads(
    single: tuple[VllmEngine, float], tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "tiny.csv"
    monkeypatch.setenv("VLLM_API_KEY", single[0].api_key)  # the server's key (it refuses requests without)
    rc = main(
        [
            "profile", "--model", str(tiny_model), "--out", str(out), "--name", "tiny-llama",
            "--endpoint", single[0].endpoint, "--served-name", "tiny",
            "--prompt-tokens", "16,128", "--batches", "1,4", "--context", "64", "--steps", "8", "--repeat", "2",
        ]
    )  # fmt: skip
    assert rc == 0
    (table,) = load_profiles(out)
    assert (table.model, table.gpu, table.tp, table.context) == ("tiny-llama", "cpu-avx512", 1, 64)
    assert list(table.prefill_x) == [16, 128] and list(table.decode_x) == [1, 4]
    assert (table.prefill_s > 0).all() and (table.decode_s > 0).all()
    cat = load_catalog([FIXTURES / "catalog" / "tiny-cpu.toml"])
    perf = PerfModel(cat, [table])
    step = float(perf.decode_step_s("tiny-llama", "cpu-local", layers=4, batch=1, context=64))
    assert step == pytest.approx(4 * table.decode_s[0])  # the measured table, not the roofline
    pre = float(perf.prefill_s("tiny-llama", "cpu-local", layers=4, batch=1, prompt=128))
    assert pre == pytest.approx(4 * table.prefill_s[1])


def test_a_keyed_engine_refuses_requests_without_its_key(single: tuple[VllmEngine, float], tmp_path: Path) -> None:
    engine, _ = single
    backend = engine.backend
    key = engine.api_key
    assert key == engine_key(backend.engine_secret, "single") and key.startswith("coral-engine-")
    assert engine.plan is not None and engine.server is not None
    launch = engine.plan.head
    assert launch.environment()[API_KEY_ENV] == key
    assert key not in repr(engine.plan) and key not in " ".join(launch.argv) and key not in repr(backend)
    url = engine.endpoint
    body = client.completion_body("tiny", PROMPTS[0], 4, stream=False)

    # without the key (or with another instance's key): refused, on every path
    for k in ("", "wrong", engine_key(backend.engine_secret, "other")):
        with pytest.raises(client.HttpError) as e:
            client.post_json(url, "/v1/completions", body, api_key=k)
        assert e.value.status == 401
        for path in ("/metrics", "/health", "/v1/models", "/version", "/is_paused"):
            assert client.get(url, path, api_key=k)[0] == 401, path
        with pytest.raises(client.HttpError) as e:
            client.post_json(url, "/pause", {}, api_key=k)
        assert e.value.status == 401

    # with it: the engine's own traffic (health, metrics) and a direct request work; the engine's requests
    # with it are test_the_engine_serves_work_items' (same server; this engine is drained once that has run)
    assert client.healthy(url, api_key=key)
    engine.scrape_now()
    scraped = engine.server_metrics()
    assert "vllm:num_requests_running" in scraped  # the scrape with the key read the server's metrics
    before = scraped.get("vllm:request_success_total", 0.0)
    r = client.post_json(url, "/v1/completions", body, api_key=key)
    assert len(r["choices"][0]["token_ids"]) == 4
    engine.scrape_now()
    assert engine.server_metrics().get("vllm:request_success_total", 0) - before >= 1
    assert not engine.fault

    # the gateway derives the key from the instance id and reaches the engine with it
    async def through_gateway() -> dict[str, object]:
        keys = Auth(tmp_path / "none.json", engine_key=lambda i: engine_key(backend.engine_secret, i))
        gw = Gateway({"tiny": 4}, auth=keys)
        gw.on_fleet(fleet(1, inst("single", "tiny", url)))
        async with serving(gw, ("127.0.0.1", 0)) as gurl, aiohttp.ClientSession() as s:
            req = {"model": "tiny", "prompt": PROMPTS[1], "max_tokens": N_TOKENS, "temperature": 0.0}
            async with s.post(gurl + "/v1/completions", json=req) as resp:
                assert resp.status == 200, await resp.text()
                doc: dict[str, object] = json.loads(await resp.read())
                return doc

    doc = anyio.run(through_gateway)
    assert doc["usage"]["completion_tokens"] == N_TOKENS  # type: ignore[index]
    # the server's log so far (its start, its requests, the refusals): the module's fixture stops it later
    log = engine.server.log_path.read_text(errors="replace")
    assert key not in log and "127.0.0.1" in log
