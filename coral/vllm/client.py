"""Blocking HTTP helpers for a vLLM OpenAI server (standard library only): health, metrics, completions.

The engine runs these in worker threads; ``stream_completion`` reports the wall time of the first token
and of the end, so that the tick-driven engine can turn them into TTFT and finish times.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any

import attrs

from coral.errors import CoralError


class HttpError(CoralError):
    """A request to the server failed: ``status`` is the HTTP status, 0 when no answer came."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def _conn(base: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    u = urllib.parse.urlsplit(base)
    if u.scheme != "http" or not u.hostname:
        raise HttpError(f"endpoint: expected http://HOST:PORT, got {base!r}")
    return http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout), u.path.rstrip("/")


def _headers(api_key: str, json_body: bool = False) -> dict[str, str]:
    h = {"Content-Type": "application/json"} if json_body else {}
    if api_key:
        h["Authorization"] = "Bearer " + api_key
    return h


def get(base: str, path: str, *, timeout: float = 5.0, api_key: str = "") -> tuple[int, bytes]:
    """GET ``path`` (with the server's ``api_key``, if any); return (status, body). Raises HttpError when no
    answer comes."""
    conn, prefix = _conn(base, timeout)
    try:
        conn.request("GET", prefix + path, headers=_headers(api_key))
        r = conn.getresponse()
        return r.status, r.read()
    except (OSError, http.client.HTTPException) as e:
        raise HttpError(f"GET {base}{path}: {type(e).__name__}: {e}") from None
    finally:
        conn.close()


def healthy(base: str, *, timeout: float = 2.0, api_key: str = "") -> bool:
    """Whether ``/health`` answers 200."""
    try:
        return get(base, "/health", timeout=timeout, api_key=api_key)[0] == 200
    except HttpError:
        return False


def post_json(
    base: str, path: str, body: dict[str, Any], *, timeout: float = 600.0, api_key: str = ""
) -> dict[str, Any]:
    """POST a JSON body; return the JSON answer. Raises HttpError on a transport error or a non-2xx status."""
    conn, prefix = _conn(base, timeout)
    try:
        conn.request("POST", prefix + path, json.dumps(body), _headers(api_key, True))
        r = conn.getresponse()
        data = r.read()
    except (OSError, http.client.HTTPException) as e:
        raise HttpError(f"POST {base}{path}: {type(e).__name__}: {e}") from None
    finally:
        conn.close()
    if not 200 <= r.status < 300:
        raise HttpError(f"POST {base}{path}: HTTP {r.status}: {data[:300].decode(errors='replace')}", r.status)
    out: dict[str, Any] = json.loads(data)
    return out


@attrs.frozen
class StreamResult:
    """A streamed completion: the generated token ids and the wall times (``time.monotonic``) of its
    start, first token and end."""

    token_ids: tuple[int, ...]
    started: float
    first: float
    ended: float
    finish_reason: str


def completion_body(
    model: str, prompt: Sequence[int], max_tokens: int, *, stream: bool, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A greedy ``/v1/completions`` request over token ids that generates exactly ``max_tokens`` tokens."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": stream,
    }
    if extra:
        body.update(extra)
    return body


def stream_completion(
    base: str,
    model: str,
    prompt: Sequence[int],
    max_tokens: int,
    *,
    timeout: float = 600.0,
    extra: dict[str, Any] | None = None,
    api_key: str = "",
) -> StreamResult:
    """Run one streamed greedy completion; raises HttpError on a transport error or a non-2xx status."""
    conn, prefix = _conn(base, timeout)
    started = time.monotonic()
    first = -1.0
    ids: list[int] = []
    reason = ""
    try:
        body = completion_body(model, prompt, max_tokens, stream=True, extra=extra)
        conn.request("POST", prefix + "/v1/completions", json.dumps(body), _headers(api_key, True))
        r = conn.getresponse()
        if not 200 <= r.status < 300:
            data = r.read()
            raise HttpError(f"completion: HTTP {r.status}: {data[:300].decode(errors='replace')}", r.status)
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            chunk = json.loads(payload)
            if "error" in chunk:
                raise HttpError(f"completion: error in stream: {chunk['error']}", 500)
            for ch in chunk.get("choices", ()):
                got = ch.get("token_ids") or []
                if got and first < 0:
                    first = time.monotonic()
                ids.extend(int(t) for t in got)
                if ch.get("finish_reason"):
                    reason = str(ch["finish_reason"])
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise HttpError(f"completion: {type(e).__name__}: {e}") from None
    finally:
        conn.close()
    ended = time.monotonic()
    if not reason:
        raise HttpError(f"completion: the stream ended without a finish reason after {len(ids)} tokens")
    return StreamResult(tuple(ids), started, first if first >= 0 else ended, ended, reason)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {metric name: value summed over its label sets} (``_created`` series skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name_labels, _, rest = line.rpartition(" ")
        if not name_labels:
            continue
        name = name_labels.split("{", 1)[0]
        if name.endswith("_created"):
            continue
        try:
            v = float(rest)
        except ValueError:
            continue
        out[name] = out.get(name, 0.0) + v
    return out


__all__ = [
    "HttpError",
    "StreamResult",
    "completion_body",
    "get",
    "healthy",
    "parse_metrics",
    "post_json",
    "stream_completion",
]
