"""The gateway's API keys over real HTTP (uvicorn): 401/401/401/403/429 with OpenAI error bodies, the key
file (hash only, reloaded on change), refusal counts and their merged reports, the engine key sent
upstream, the metrics guard, and no key in the logs."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from coral.gateway import Gateway, serving
from coral.gateway.app import Receive, Scope, Send
from coral.gateway.auth import (
    NO_KEY,
    UNKNOWN_KEY,
    Auth,
    AuthCollector,
    Guarded,
    KeyFileError,
    add_key,
    key_file,
    load_keys,
    parse_models,
    parse_rate,
    revoke_key,
)
from coral.gateway.upstream import PlaceholderServer
from coral.messages import ApiRefused
from coral.vllm.launch import engine_key
from tests.gateway.test_proxy import fleet, inst

LOCAL = ("127.0.0.1", 0)
SECRET = b"s" * 32


class KeyedUpstream:
    """An upstream that wants its engine key (as vLLM with ``--api-key`` does) and records what it got."""

    def __init__(self, key: str) -> None:
        self.inner = PlaceholderServer("engine")
        self.want = f"Bearer {key}".encode()
        self.got: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        auth = dict(scope["headers"]).get(b"authorization", b"")
        self.got.append(auth)
        if auth != self.want:
            body = b'{"error":"Unauthorized"}'
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-length", b"24")]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.inner(scope, receive, send)


async def call(
    s: aiohttp.ClientSession, url: str, body: Any, key: str | None = None, path: str = "/v1/completions"
) -> tuple[int, dict[str, str], dict[str, Any]]:
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    async with s.post(url + path, data=json.dumps(body).encode(), headers=headers) as r:
        return r.status, dict(r.headers), json.loads(await r.read())


def test_key_file_keeps_only_hashes_and_names_bad_fields(tmp_path: Path) -> None:
    path = key_file(tmp_path / "keys")
    key = add_key(path, "alice", ("chat",), 2.0)
    assert key.startswith("sk-coral-") and len(key) > 40
    text = path.read_text()
    assert key not in text and hashlib.sha256(key.encode()).hexdigest() in text
    assert os.stat(path).st_mode & 0o777 == 0o600 and os.stat(path.parent).st_mode & 0o777 == 0o700
    (k,) = load_keys(path)
    assert (k.name, k.models, k.rate, k.revoked) == ("alice", ("chat",), 2.0, False)
    with pytest.raises(KeyFileError, match="key 'alice' exists"):
        add_key(path, "alice")
    with pytest.raises(KeyFileError, match="NAME: expected"):
        add_key(path, "no spaces")
    with pytest.raises(KeyFileError, match="no key 'bob'"):
        revoke_key(path, "bob")
    assert path.read_text() == text  # a refused change changes nothing
    revoke_key(path, "alice")
    assert load_keys(path)[0].revoked
    for bad, needle in [
        ("[]", "expected an object with a list 'keys'"),
        ("{", "not JSON"),
        ('{"keys": [{"name": "a", "sha256": "xyz"}]}', r"keys\[0\] \(a\): field 'sha256'"),
        ('{"keys": [{"name": "a", "sha256": "' + "0" * 64 + '", "rate": -1}]}', "field 'rate'"),
        ('{"keys": [{"name": "a", "sha256": "' + "0" * 64 + '", "models": "x"}]}', "field 'models'"),
    ]:
        path.write_text(bad)
        with pytest.raises(KeyFileError, match=needle):
            load_keys(path)
    assert (
        parse_rate("10/s") == 10 and parse_rate("120/min") == 2 and parse_rate("3600/h") == 1 and parse_rate("5") == 5
    )
    for bad in ("0", "-1/s", "x", "10/day"):
        with pytest.raises(KeyFileError, match="--rate"):
            parse_rate(bad)
    assert parse_models("b, a,b") == ("a", "b")
    with pytest.raises(KeyFileError, match="--models"):
        parse_models("a,,b")


def test_refusals_are_merged_per_key_and_status() -> None:
    now = [0.0]
    auth = Auth(Path("/nonexistent/api-keys.json"), clock=lambda: now[0])
    auth.by_hash = {"0" * 64: load_keys_row("ann")}
    for _ in range(5):
        with pytest.raises(Exception, match="no API key"):
            auth.check([])
    assert auth.reports() == [ApiRefused(NO_KEY, 401, 1, 0.0)]  # the first at once
    assert auth.reports() == []
    now[0] = 0.5
    with pytest.raises(Exception, match="incorrect"):
        auth.check([(b"authorization", b"Bearer nope")])
    assert auth.reports() == [ApiRefused(UNKNOWN_KEY, 401, 1, 0.0)]
    now[0] = 1.2
    assert auth.reports() == [ApiRefused(NO_KEY, 401, 4, 1.2)]  # the rest of the window in one event
    now[0] = 3.0
    assert auth.reports() == []  # (unknown) had no more
    with pytest.raises(Exception, match="no API key"):
        auth.check([])
    assert auth.reports() == [ApiRefused(NO_KEY, 401, 1, 0.0)]
    assert auth.refused == {(NO_KEY, 401): 6, (UNKNOWN_KEY, 401): 1}


def load_keys_row(name: str) -> Any:
    from coral.gateway.auth import ApiKey

    return ApiKey(name, "0" * 64)


async def test_keys_on_the_real_gateway(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    path = key_file(tmp_path)
    alice = add_key(path, "alice", ("chat",), 0.5)
    bob = add_key(path, "bob")
    carol = add_key(path, "carol")
    ekey = engine_key(SECRET, "i1")
    up, up2 = KeyedUpstream(ekey), KeyedUpstream(engine_key(SECRET, "i2"))
    auth = Auth(path, engine_key=lambda iid: engine_key(SECRET, iid))
    gw = Gateway({"chat": 16, "other": 16}, seed=1, auth=auth)
    req = {"model": "chat", "prompt": "hi", "max_tokens": 2}
    async with serving(up, LOCAL) as uu, serving(up2, LOCAL) as uu2, serving(gw, LOCAL) as url:
        gw.on_fleet(fleet(1, inst("i1", "chat", uu), inst("i2", "other", uu2)))
        async with aiohttp.ClientSession() as s:
            st, _, doc = await call(s, url, req)
            assert st == 401 and doc["error"]["code"] == "invalid_api_key"
            assert doc["error"]["type"] == "invalid_request_error" and "coral keys api add" in doc["error"]["message"]
            st, _, doc = await call(s, url, req, "sk-coral-not-a-key")
            assert st == 401 and doc["error"]["code"] == "invalid_api_key"
            async with s.get(url + "/v1/models") as r:
                assert r.status == 401
            async with s.get(url + "/health") as r:
                assert r.status == 200  # the liveness probe needs no key

            st, _, doc = await call(s, url, {**req, "model": "other"}, alice)
            assert st == 403 and doc["error"]["code"] == "model_not_allowed" and "chat" in doc["error"]["message"]
            st, _, doc = await call(s, url, req, alice)
            assert st == 200 and doc["served_by"] == "engine", doc
            assert up.got == [f"Bearer {ekey}".encode()]  # the engine got its key, not the client's
            st, hd, doc = await call(s, url, req, alice)  # 0.5 req/s: the bucket is empty for 2 s
            assert (
                st == 429
                and doc["error"]["code"] == "rate_limit_exceeded"
                and doc["error"]["type"] == "rate_limit_error"
            )
            assert hd["Retry-After"] == "2"
            async with s.get(url + "/v1/models", headers={"authorization": f"Bearer {alice}"}) as r:
                assert [m["id"] for m in (await r.json())["data"]] == ["chat"]  # only its models

            st, _, doc = await call(s, url, {**req, "model": "other"}, bob)
            assert st == 200 and up2.got == [f"Bearer {engine_key(SECRET, 'i2')}".encode()]  # each its own key
            revoke_key(path, "bob")
            await anyio.sleep(1.1)  # the gateway reads the file again within a second
            st, _, doc = await call(s, url, req, bob)
            assert st == 401 and doc["error"]["code"] == "invalid_api_key"
            st, _, _ = await call(s, url, req, carol)
            assert st == 200
    assert auth.refused == {
        (NO_KEY, 401): 2,
        (UNKNOWN_KEY, 401): 1,
        ("alice", 403): 1,
        ("alice", 429): 1,
        ("bob", 401): 1,
    }
    assert gw.responses[("/v1/completions", 401)] == 3 and gw.responses[("/v1/completions", 429)] == 1
    reports = auth.reports()
    assert {(r.key, r.status) for r in reports} == set(auth.refused)
    registry = CollectorRegistry()
    registry.register(AuthCollector(auth))
    text = generate_latest(registry).decode()
    assert 'coral_gateway_refused_total{code="429",key="alice"} 1.0' in text
    for key in (alice, bob, carol, ekey):
        assert key not in caplog.text and all(key not in repr(r) for r in reports)


async def test_metrics_guard(tmp_path: Path) -> None:
    path = key_file(tmp_path)
    key = add_key(path, "prom")

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"coral_x 1\n"})

    async with serving(Guarded(app, Auth(path)), LOCAL) as url, aiohttp.ClientSession() as s:
        async with s.get(url + "/metrics") as r:
            assert r.status == 401 and (await r.json())["error"]["code"] == "invalid_api_key"
        async with s.get(url + "/metrics", headers={"authorization": f"Bearer {key}"}) as r:
            assert r.status == 200 and await r.read() == b"coral_x 1\n"


def test_the_tui_shows_refusals_as_access_events() -> None:
    from coral.kernel import AuthRefused, Envelope
    from tui.model import State
    from tui.reducer import apply, wanted

    st = State()
    for msg, tag in [
        (ApiRefused("alice", 429, 1, 0.0), "gw.refused"),
        (ApiRefused(NO_KEY, 401, 7, 1.0), "gw.refused"),
        (AuthRefused("tcp://10.0.0.9", "CURVE", "Zz", "unknown or revoked client key"), "kernel.auth.refused"),
    ]:
        assert wanted(tag)
        st = apply(st, Envelope("publish", "gateway", tag, msg))
    texts = [(e.kind, e.severity, e.text) for e in st.events]
    assert texts == [
        ("access", "warn", "refused a request of API key alice: 429 (over its rate)"),
        ("access", "warn", "refused 7 more requests of API key (none) in 1.0s: 401 (no valid key)"),
        ("access", "warn", "refused 1 bus connection(s) from tcp://10.0.0.9 (CURVE): unknown or revoked client key"),
    ]


def test_a_broken_key_file_keeps_the_keys_in_force(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    path = key_file(tmp_path)
    key = add_key(path, "ann")
    auth = Auth(path, clock=lambda: now[0])
    path.write_text('{"keys": [{"name": "ann"}]}')
    now[0] = 2.0
    k = auth.check([(b"authorization", f"Bearer {key}".encode())])
    assert k is not None and k.name == "ann"
    assert "API keys not reloaded" in caplog.text and "field 'sha256'" in caplog.text and key not in caplog.text
    with pytest.raises(KeyFileError, match="field 'sha256'"):
        Auth(path)  # at start a broken file is an error


async def test_tls_with_uvicorns_certificate_options(tmp_path: Path) -> None:
    import shutil
    import ssl
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a test certificate")
    cert, pkey = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-keyout", str(pkey), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    path = key_file(tmp_path / "keys")
    key = add_key(path, "tls")
    gw = Gateway({"chat": 4}, auth=Auth(path))
    ctx = ssl.create_default_context(cafile=str(cert))
    ctx.check_hostname = False
    async with serving(gw, LOCAL, tls=(str(cert), str(pkey))) as url, aiohttp.ClientSession() as s:
        assert url.startswith("https://")
        async with s.get(url + "/v1/models", ssl=ctx, headers={"authorization": f"Bearer {key}"}) as r:
            assert r.status == 200 and [m["id"] for m in (await r.json())["data"]] == ["chat"]
        async with s.get(url + "/v1/models", ssl=ctx) as r:
            assert r.status == 401
