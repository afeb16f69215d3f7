"""Access control of the sockets that serve users: the gateway's API keys, the metrics guard, engine keys.

**The key file.** ``api-keys.json`` in the key directory (``coral keys``; mode 0600) lists every API key
by name: the SHA-256 of the key (never the key), the models it may use (all when absent), its rate limit
(requests per second; none when absent), when it was made, and whether it was revoked. A key is
``sk-coral-`` and 43 URL-safe characters (256 random bits), shown once by ``coral keys api add``. A fast
hash is enough for such a key: there is no dictionary to try against a 256-bit secret, and it keeps the
check per request to a few microseconds.

**The check** (``Auth``). A request to ``/v1/...`` must carry ``Authorization: Bearer KEY``:

- no key, a key that is not in the file, or a revoked key: 401 (``invalid_api_key``);
- a model outside the key's list: 403 (``model_not_allowed``);
- more than the key's rate: 429 (``rate_limit_exceeded``) with ``Retry-After`` (whole seconds until the
  key's bucket holds a request again). The rate is a token bucket of ``rate`` requests per second that holds
  at most ``max(1, rate)`` of them (a second's worth).

Each answer has an OpenAI-style error body. The file is read again when it changes (checked at most once a
second), so ``coral keys api revoke`` takes effect on a running gateway within a second.

**Refusals** are counted per key name and status (``Auth.refused``, exported by ``AuthCollector``) and
reported on the bus as ``ApiRefused`` events, merged per (key, status) as the kernel merges its drop
reports: the first refusal is reported at once, the others of the next second in one event. A key is never
logged, journaled or reported: only its name, ``(none)`` when the request had none, or ``(unknown)``.

**Engine keys** (``Auth.engine_key``, from ``coral.vllm.launch.engine_key``): each vLLM server that a stage
worker starts has its own key, an HMAC of its instance id under a secret that only the workers and the
gateway hold (``VllmBackend.engine_secret``); the gateway derives the key of each upstream from the instance
id, so no key crosses the bus.

**The metrics guard** (``Guarded``): any valid API key may read the metrics.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import math
import os
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from coral.errors import CoralError
from coral.messages.requests import ApiRefused

KEY_FILE = "api-keys.json"
KEY_PREFIX = "sk-coral-"
NO_KEY = "(none)"
UNKNOWN_KEY = "(unknown)"
REPORT_S = 1.0
"""Refusals of one key and status after the first are merged over this many seconds."""
RELOAD_S = 1.0
"""The key file is checked for changes at most this often."""
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_RATE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:/\s*(s|sec|second|m|min|minute|h|hour))?\s*$")
_PER = {None: 1.0, "s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0}
_PER.update({"h": 3600.0, "hour": 3600.0})
_JSON = (b"content-type", b"application/json")
log = logging.getLogger("coral.gateway")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class KeyFileError(CoralError):
    """An API key file, name or option that is malformed; the message names the file or the argument."""


@attrs.frozen
class ApiKey:
    """One API key as stored: its name, the SHA-256 of the key (hex), its models (None: all), its rate in
    requests per second (None: unlimited), when it was made (ISO 8601) and whether it is revoked."""

    name: str
    sha256: str
    models: tuple[str, ...] | None = None
    rate: float | None = None
    created: str = ""
    revoked: bool = False


def digest(key: str | bytes) -> str:
    """The stored form of a key: its SHA-256, hex."""
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).hexdigest()


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise KeyFileError(f"NAME: expected 1-64 letters, digits or _.- (not starting with . or -), got {name!r}")
    return name


def parse_rate(text: str) -> float:
    """Requests per second in ``10``, ``10/s``, ``600/min``, ``1000/h``."""
    m = _RATE.match(text)
    if m is None:
        raise KeyFileError(f"--rate: expected R/s, R/min or R/h (R a number), got {text!r}")
    v = float(m.group(1)) / _PER[m.group(2)]
    if not (v > 0 and math.isfinite(v)):
        raise KeyFileError(f"--rate: must be positive, got {text!r}")
    return v


def parse_models(text: str) -> tuple[str, ...]:
    """The models of ``--models m1,m2`` (sorted, without duplicates)."""
    names = [m.strip() for m in text.split(",")]
    if not text.strip() or any(not m for m in names):
        raise KeyFileError(f"--models: expected model names separated by commas, got {text!r}")
    return tuple(sorted(set(names)))


def key_file(directory: Path) -> Path:
    return directory / KEY_FILE


def load_keys(path: Path) -> list[ApiKey]:
    """The keys of ``path`` (none when it does not exist); a KeyFileError names the file and the field."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    except OSError as e:
        raise KeyFileError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise KeyFileError(f"{path}: not JSON ({e})") from None
    rows = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        raise KeyFileError(f"{path}: expected an object with a list 'keys'")
    out: list[ApiKey] = []
    seen: set[str] = set()
    for i, row in enumerate(rows):
        where = f"{path}: keys[{i}]"
        if not isinstance(row, dict):
            raise KeyFileError(f"{where}: expected an object")
        name, sha, models, rate = row.get("name"), row.get("sha256"), row.get("models"), row.get("rate")
        if not isinstance(name, str) or not _NAME.match(name):
            raise KeyFileError(f"{where}: field 'name' must be 1-64 letters, digits or _.-")
        if name in seen:
            raise KeyFileError(f"{where}: name {name!r} appears twice")
        seen.add(name)
        if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise KeyFileError(f"{where} ({name}): field 'sha256' must be 64 lower-case hex digits")
        if models is not None and (not isinstance(models, list) or not all(isinstance(m, str) and m for m in models)):
            raise KeyFileError(f"{where} ({name}): field 'models' must be a list of model names or null")
        if rate is not None and (
            isinstance(rate, bool) or not isinstance(rate, int | float) or not (rate > 0 and math.isfinite(rate))
        ):
            raise KeyFileError(f"{where} ({name}): field 'rate' must be a positive number or null")
        revoked = row.get("revoked", False)
        if not isinstance(revoked, bool):
            raise KeyFileError(f"{where} ({name}): field 'revoked' must be true or false")
        ms = tuple(models) if models is not None else None
        out.append(
            ApiKey(name, sha, ms, float(rate) if rate is not None else None, str(row.get("created", "")), revoked)
        )
    return out


def save_keys(path: Path, keys: Sequence[ApiKey]) -> None:
    """Write the key file (mode 0600, replaced in one step; the directory is made with mode 0700)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    doc = {"version": 1, "keys": [attrs.asdict(k) for k in keys]}
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def add_key(path: Path, name: str, models: tuple[str, ...] | None = None, rate: float | None = None) -> str:
    """Make key ``name`` in ``path``; return the key itself (the file keeps only its hash)."""
    check_name(name)
    keys = load_keys(path)
    if any(k.name == name for k in keys):
        raise KeyFileError(f"NAME: key {name!r} exists in {path} (revoke it, or choose another name)")
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    created = datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()
    save_keys(path, [*keys, ApiKey(name, digest(secret), models, rate, created)])
    return secret


def revoke_key(path: Path, name: str) -> None:
    """Mark key ``name`` of ``path`` revoked (kept for the record)."""
    keys = load_keys(path)
    if not any(k.name == name for k in keys):
        raise KeyFileError(f"NAME: no key {name!r} in {path}")
    save_keys(path, [attrs.evolve(k, revoked=True) if k.name == name else k for k in keys])


class Refused(Exception):
    """A refused request: its status, OpenAI error type and code, message and extra headers."""

    def __init__(self, status: int, kind: str, code: str, message: str, headers: Sequence[tuple[bytes, bytes]] = ()):
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.code = code
        self.headers = list(headers)

    def body(self) -> bytes:
        err = {"message": str(self), "type": self.kind, "param": None, "code": self.code}
        return json.dumps({"error": err}, separators=(",", ":")).encode()

    async def send(self, send: Send) -> None:
        data = self.body()
        hs = [_JSON, (b"content-length", str(len(data)).encode()), *self.headers]
        await send({"type": "http.response.start", "status": self.status, "headers": hs})
        await send({"type": "http.response.body", "body": data, "more_body": False})


_MISSING = "no API key: send the header 'Authorization: Bearer KEY' (create one with `coral keys api add NAME`)"
_WRONG = "incorrect or revoked API key"


class _Bucket:
    __slots__ = ("at", "level")

    def __init__(self, level: float, at: float) -> None:
        self.level = level
        self.at = at


class Auth:
    """The API-key check of one gateway over the key file ``path`` (see the module docstring).

    ``engine_key`` maps an instance id to its engine's key (None: the engines take no key)."""

    def __init__(
        self,
        path: Path,
        *,
        engine_key: Callable[[str], str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.engine_key = engine_key
        self.clock = clock
        self.by_hash: dict[str, ApiKey] = {}
        self.buckets: dict[str, _Bucket] = {}
        self.refused: dict[tuple[str, int], int] = {}
        self._pending: dict[tuple[str, int], list[Any]] = {}
        self._reports: list[ApiRefused] = []
        self._engine_headers: dict[str, bytes] = {}
        self._stamp: tuple[int, int] | None = None
        self._checked = -math.inf
        self.reload()

    @property
    def active(self) -> int:
        """How many keys are valid now."""
        return sum(1 for k in self.by_hash.values() if not k.revoked)

    def reload(self) -> None:
        """Read the key file again (a KeyFileError when it is malformed; the keys in force stay then)."""
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = (0, 0)
        self._checked = self.clock()
        if stamp == self._stamp:
            return
        keys = load_keys(self.path)
        self.by_hash = {k.sha256: k for k in keys}
        self._stamp = stamp

    def _maybe_reload(self, now: float) -> None:
        if now - self._checked >= RELOAD_S:
            try:
                self.reload()
            except KeyFileError as e:  # a file being edited by hand: keep the keys in force, try again later
                self._checked = now
                log.warning("API keys not reloaded, the keys in force stay: %s", e)

    @property
    def enforced(self) -> bool:
        """Whether requests need a key: the key file lists at least one (a revoked one counts)."""
        return bool(self.by_hash)

    def check(self, headers: Sequence[tuple[bytes, bytes]]) -> ApiKey | None:
        """The key of a request's ``Authorization`` header; raises Refused (401) when there is none valid.
        None when no key is needed (``enforced`` is false)."""
        now = self.clock()
        self._maybe_reload(now)
        if not self.by_hash:
            return None
        token = b""
        for k, v in headers:
            if k == b"authorization":
                token = v
                break
        if not token:
            self._refuse(NO_KEY, 401, now)
            raise Refused(401, "invalid_request_error", "invalid_api_key", _MISSING)
        scheme, _, value = token.strip().partition(b" ")
        key = self.by_hash.get(hashlib.sha256(value.strip()).hexdigest()) if scheme.lower() == b"bearer" else None
        if key is None or key.revoked:
            self._refuse(UNKNOWN_KEY if key is None else key.name, 401, now)
            raise Refused(401, "invalid_request_error", "invalid_api_key", _WRONG)
        return key

    def admit(self, key: ApiKey, model: str) -> None:
        """Whether ``key`` may send a request for ``model`` now; raises Refused (403, 429) if not."""
        now = self.clock()
        if key.models is not None and model not in key.models:
            self._refuse(key.name, 403, now)
            raise Refused(
                403,
                "permission_error",
                "model_not_allowed",
                f"model {model!r}: this API key ({key.name}) may use only {', '.join(key.models)}",
            )
        if key.rate is None:
            return
        cap = max(1.0, key.rate)
        b = self.buckets.get(key.name)
        if b is None:
            b = self.buckets[key.name] = _Bucket(cap, now)
        b.level = min(cap, b.level + (now - b.at) * key.rate)
        b.at = now
        if b.level >= 1.0:
            b.level -= 1.0
            return
        self._refuse(key.name, 429, now)
        wait = max(1, math.ceil((1.0 - b.level) / key.rate))
        raise Refused(
            429,
            "rate_limit_error",
            "rate_limit_exceeded",
            f"rate limit of API key {key.name} reached ({key.rate:g} requests/s); retry after {wait} s",
            [(b"retry-after", str(wait).encode())],
        )

    def allows(self, key: ApiKey, model: str) -> bool:
        """Whether ``key`` may use ``model`` (for ``/v1/models``)."""
        return key.models is None or model in key.models

    def engine_header(self, instance: str) -> bytes:
        """The ``Authorization`` header line (with CRLF) for instance ``instance``'s engine; empty for none."""
        if self.engine_key is None:
            return b""
        h = self._engine_headers.get(instance)
        if h is None:
            if len(self._engine_headers) > 4096:
                self._engine_headers.clear()
            h = self._engine_headers[instance] = (
                b"authorization: Bearer " + self.engine_key(instance).encode() + b"\r\n"
            )
        return h

    # -- refusals -----------------------------------------------------------------------------------

    def _refuse(self, name: str, status: int, now: float) -> None:
        k = (name, status)
        self.refused[k] = self.refused.get(k, 0) + 1
        pending = self._pending.get(k)
        if pending is None:  # the first since the last report: say so now, count the rest
            self._pending[k] = [0, now]
            self._reports.append(ApiRefused(name, status, 1, 0.0))
        else:
            pending[0] += 1

    def reports(self) -> list[ApiRefused]:
        """The refusal events to publish now (see the module docstring)."""
        now = self.clock()
        for k, (count, since) in list(self._pending.items()):
            if now - since < REPORT_S:
                continue
            del self._pending[k]
            if count:
                self._reports.append(ApiRefused(k[0], k[1], count, round(now - since, 3)))
        out, self._reports = self._reports, []
        return out


class Guarded:
    """An ASGI application behind ``auth``: every HTTP request needs a valid API key (any model)."""

    def __init__(self, app: Any, auth: Auth) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                if self.auth.check(scope["headers"]) is None:
                    raise Refused(401, "invalid_request_error", "invalid_api_key", "no API key is valid here")
            except Refused as r:
                await r.send(send)
                return
        await self.app(scope, receive, send)


class AuthCollector(Collector):
    """``coral_gateway_refused_total`` (labels ``key``: the key's name, and ``code``), read at each scrape."""

    def __init__(self, auth: Auth) -> None:
        self.auth = auth

    def collect(self) -> Iterator[Metric]:
        m = CounterMetricFamily(
            "coral_gateway_refused",
            "Requests refused by the API-key check, by key name and status",
            labels=("key", "code"),
        )
        for (name, code), n in sorted(self.auth.refused.items()):
            m.add_metric((name, str(code)), n)
        yield m
