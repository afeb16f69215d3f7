"""A fuzz of the ``Authorization`` header and the JSON body against the real gateway (uvicorn, with keys):
no request gets a 5xx, and every refusal by the key check is a 401/403/429 with an OpenAI error body."""

from __future__ import annotations

import http.client
import json
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coral.gateway import Gateway, serving
from coral.gateway.auth import Auth, add_key, key_file, revoke_key
from coral.gateway.upstream import PlaceholderServer
from tests.gateway.test_proxy import fleet, inst

pytestmark = pytest.mark.slow

KEYS: dict[str, str] = {}
SEEN: Counter[int] = Counter()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A gateway with keys and a placeholder upstream, served from a thread of its own for the module."""
    path = key_file(tmp_path_factory.mktemp("keys"))
    KEYS["all"] = add_key(path, "all")
    KEYS["chat"] = add_key(path, "chat-only", ("chat",))
    KEYS["slow"] = add_key(path, "slow", None, 0.01)
    KEYS["gone"] = add_key(path, "gone")
    revoke_key(path, "gone")
    started = threading.Event()
    stop = threading.Event()
    where: list[tuple[str, int]] = []

    async def main() -> None:
        gw = Gateway({"chat": 4, "other": 4}, seed=5, auth=Auth(path))
        async with serving(PlaceholderServer("u"), ("127.0.0.1", 0)) as up, serving(gw, ("127.0.0.1", 0)) as url:
            gw.on_fleet(fleet(1, inst("i1", "chat", up), inst("i2", "other", up)))
            host, port = url.removeprefix("http://").rsplit(":", 1)
            where.append((host, int(port)))
            started.set()
            while not stop.is_set():
                await anyio.sleep(0.05)

    t = threading.Thread(target=anyio.run, args=(main,), daemon=True)
    t.start()
    assert started.wait(60)
    yield where[0]
    stop.set()
    t.join(30)


def _header_value() -> st.SearchStrategy[bytes | None]:
    keys = st.sampled_from(["all", "chat", "slow", "gone"]).map(lambda k: KEYS[k].encode())
    scheme = st.sampled_from([b"Bearer ", b"bearer ", b"BEARER  ", b"Basic ", b"", b"Bearer"])
    exact = st.sampled_from(["all", "chat", "slow", "gone"]).map(lambda k: b"Bearer " + KEYS[k].encode())
    return st.one_of(
        exact,
        exact,
        exact,
        exact,
        st.none(),
        st.binary(max_size=200),
        st.tuples(scheme, keys).map(b"".join),
        st.tuples(scheme, keys, st.binary(max_size=8)).map(b"".join),
        st.tuples(scheme, st.text(max_size=80).map(str.encode)).map(b"".join),
    ).map(lambda v: v if v is None else v.replace(b"\r", b"").replace(b"\n", b""))


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
_request = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.sampled_from(["chat", "other", "nope", ""]), _json),
        "prompt": st.one_of(st.text(max_size=30), _json),
        "messages": st.one_of(st.just([{"role": "user", "content": "hi"}]), _json),
        "max_tokens": st.one_of(st.integers(-5, 40), _json),
        "stream": st.one_of(st.booleans(), _json),
    },
)
_valid = st.fixed_dictionaries(
    {"model": st.sampled_from(["chat", "other", "nope"]), "prompt": st.text(max_size=20)},
    optional={"max_tokens": st.integers(1, 8), "stream": st.booleans()},
)
_body = st.one_of(
    _valid.map(lambda d: json.dumps(d).encode()),
    _valid.map(lambda d: json.dumps(d).encode()),
    _valid.map(lambda d: json.dumps(d).encode()),
    _request.map(lambda d: json.dumps(d).encode()),
    _json.map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=100),
)


@settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    auth=_header_value(),
    body=_body,
    path=st.sampled_from(["/v1/completions", "/v1/completions", "/v1/chat/completions", "/v1/models"]),
)
def test_fuzzed_header_and_body_never_get_a_5xx(
    gateway: tuple[str, int], auth: bytes | None, body: bytes, path: str
) -> None:
    conn = http.client.HTTPConnection(*gateway, timeout=30)
    try:
        conn.putrequest("POST" if path != "/v1/models" else "GET", path, skip_accept_encoding=True)
        conn.putheader("content-type", "application/json")
        conn.putheader("content-length", str(len(body)))
        if auth is not None:
            conn.putheader(b"authorization", auth)
        conn.endheaders(body)
        r = conn.getresponse()
        data = r.read()
    finally:
        conn.close()
    SEEN[r.status] += 1
    assert r.status < 500, (r.status, data[:300])
    if r.status in (401, 403, 429):
        err: dict[str, Any] = json.loads(data)["error"]
        assert err["code"] in ("invalid_api_key", "model_not_allowed", "rate_limit_exceeded") and err["message"]
        assert r.status != 429 or int(r.getheader("retry-after") or 0) >= 1
    for k in KEYS.values():
        assert k.encode() not in data


def test_the_fuzz_reached_every_answer() -> None:
    """The fuzz reached a success, a bad request and a key refusal. Which rarer answers (403, 404, 429) a
    derandomized run reaches depends on hypothesis's version (a run here reached 403 but neither 404 nor
    429); 403 and 429 are checked exactly in ``test_auth.py``, 404 in ``test_proxy.py``."""
    if not SEEN:
        pytest.skip("runs after the fuzz (in file order)")
    assert set(SEEN) >= {200, 400, 401}, SEEN
