"""``coral keys api``: the gateway's API keys (``coral.gateway.auth``), in the key directory's ``api-keys.json``.

``add NAME [--models m1,m2] [--rate R/s]`` makes a key and prints it once (only its hash is kept);
``list`` shows each key's name, status, models and rate; ``revoke NAME`` refuses it from the next request
on (a running gateway reads the file again within a second).

``coral up``'s side (``add_up_options``, ``up_access``): the safe-by-default checks of ``--gateway`` and
``--metrics``, the metrics guard, and TLS (uvicorn's certificate and key files).
"""

from __future__ import annotations

import argparse
import functools
import ipaddress
from pathlib import Path
from typing import Any

import attrs
from prometheus_client import CollectorRegistry

from coral.errors import CoralError
from coral.gateway.auth import (
    Auth,
    AuthCollector,
    Guarded,
    add_key,
    key_file,
    load_keys,
    parse_models,
    parse_rate,
    revoke_key,
)
from coral.vllm.launch import engine_key


def add_parser(actions: Any, where: argparse.ArgumentParser) -> None:
    """The ``api`` action of ``coral keys`` (``where`` carries ``--dir``)."""
    p = actions.add_parser("api", parents=[where], help="manage the API keys of the HTTP gateway")
    verbs = p.add_subparsers(dest="api_command", metavar="VERB", required=True)
    a = verbs.add_parser("add", parents=[where], help="make an API key (printed once)")
    a.add_argument("name", metavar="NAME", help="the key's name (only this is ever logged or journaled)")
    a.add_argument("--models", default=None, metavar="M1,M2", help="the models it may use (default: all)")
    a.add_argument("--rate", default=None, metavar="R/s", help="requests per second (R/s, R/min, R/h; default: none)")
    r = verbs.add_parser("revoke", parents=[where], help="stop accepting an API key")
    r.add_argument("name", metavar="NAME", help="the name of the key to revoke")
    verbs.add_parser("list", parents=[where], help="list the API keys (names, never the keys)")


def run(args: argparse.Namespace, directory: Path) -> int:
    path = key_file(directory)
    if args.api_command == "add":
        models = parse_models(args.models) if args.models is not None else None
        rate = parse_rate(args.rate) if args.rate is not None else None
        key = add_key(path, args.name, models, rate)
        print(f"coral keys api: made {args.name!r} in {path}; the key (shown only now, keep it secret):")
        print(key)
    elif args.api_command == "revoke":
        revoke_key(path, args.name)
        print(f"coral keys api: revoked {args.name!r}; the gateway refuses it within a second")
    else:
        for k in load_keys(path):
            status = "revoked" if k.revoked else "active"
            allowed = ",".join(k.models) if k.models is not None else "*"
            per_s = f"{k.rate:g}/s" if k.rate is not None else "-"
            print(f"{k.name}\t{status}\t{allowed}\t{per_s}\t{k.created}")
    return 0


def add_up_options(p: argparse.ArgumentParser) -> None:
    """``coral up``'s access options (the key directory is its ``--keys``)."""
    p.add_argument(
        "--metrics-public",
        action="store_true",
        help="serve --metrics without an API key, on any address (default: a key is needed once keys exist, "
        "and a non-loopback --metrics needs keys)",
    )
    p.add_argument(
        "--tls-cert", type=Path, default=None, metavar="FILE", help="serve HTTPS with this certificate (PEM)"
    )
    p.add_argument("--tls-key", type=Path, default=None, metavar="FILE", help="the certificate's private key (PEM)")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is only reachable from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name or * may resolve to (or mean) a public interface


@attrs.define
class Access:
    """What ``coral up`` serves its HTTP sockets with: the gateway's key check, the metrics guard, TLS."""

    auth: Auth
    metrics_public: bool = False
    tls: tuple[str, str] | None = None

    def use_engines(self, secret: bytes) -> None:
        """The gateway sends each engine its key (``coral.vllm.launch.engine_key`` under ``secret``)."""
        self.auth.engine_key = functools.partial(engine_key, secret)

    def metrics_app(self, registry: CollectorRegistry, app: Any) -> Any:
        """The metrics application: behind the key check unless public or no key exists; ``registry`` gets
        the refusal counts."""
        registry.register(AuthCollector(self.auth))
        return app if self.metrics_public or not self.auth.enforced else Guarded(app, self.auth)


def up_access(
    args: argparse.Namespace, gateway: tuple[str, int] | None, metrics: tuple[str, int] | None, d: Path
) -> Access:
    """Check ``coral up``'s HTTP sockets before anything starts: a non-loopback ``--gateway`` needs an API key
    in key directory ``d``, and so does a non-loopback ``--metrics`` unless ``--metrics-public``; TLS needs
    both files."""
    auth = Auth(key_file(d))
    how = f"create one with `coral keys --dir {d} api add NAME`"
    for flag, addr in (("--gateway", gateway), ("--metrics", metrics)):
        if addr is None or is_loopback(addr[0]) or auth.active > 0:
            continue
        if flag == "--metrics" and args.metrics_public:
            continue
        alt = "bind 127.0.0.1:PORT" + (", or give --metrics-public" if flag == "--metrics" else "")
        raise CoralError(
            f"{flag}: {addr[0]}:{addr[1]} is reachable from other machines and no API key exists; {how}, or {alt}"
        )
    tls = None
    if (args.tls_cert is None) != (args.tls_key is None):
        raise CoralError("--tls-cert and --tls-key: give both (the certificate and its private key) or neither")
    if args.tls_cert is not None:
        for flag, f in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)):
            if not f.is_file():
                raise CoralError(f"{flag}: {f}: no such file")
        tls = (str(args.tls_cert), str(args.tls_key))
    return Access(auth, args.metrics_public, tls)
