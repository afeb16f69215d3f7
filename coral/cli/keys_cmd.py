"""``coral keys``: the CurveZMQ key directory of a kernel and its clients (see ``coral.kernel.keys``).

``coral keys init [DIR]`` creates the directory and the kernel's key pair; ``add NAME`` creates and
allows a client key pair (print where its secret is, to copy to the client's machine with ``server.key``);
``revoke NAME`` refuses that key from the next connection on; ``list`` shows every client; ``api ...`` manages
the HTTP gateway's API keys (``coral.cli.apikeys_cmd``). DIR defaults to
``$CORAL_KEYS``, else ``coral-keys`` in the user data directory.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from coral.cli import apikeys_cmd
from coral.cli.common import print_json
from coral.errors import CoralError
from coral.kernel import ClientKeys, Endpoints, ServerKeys, client_keys, server_keys
from coral.kernel.keys import ENV_VAR, add_client, init_keys, keys_dir, list_clients, revoke_client


def default_keys_dir() -> Path:
    """``$CORAL_KEYS`` if set, else ``coral-keys`` next to the default template store."""
    d = keys_dir(None)
    if d is not None:
        return d
    from coral.store import default_store_path

    return default_store_path().parent / "coral-keys"


def add(sub: Any, parent: argparse.ArgumentParser) -> None:
    p = sub.add_parser("keys", help="manage the CurveZMQ keys of the kernel and its clients")
    p.add_argument(
        "--dir", type=Path, default=None, help=f"key directory (default: ${ENV_VAR}, else coral-keys in the data dir)"
    )
    # --dir also after the action (``coral keys init --dir DIR``); SUPPRESS keeps the group's value otherwise
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--dir", type=Path, default=argparse.SUPPRESS, help="key directory (as above)")
    where.add_argument("--json", action="store_true", help="print the outcome as JSON")
    ks = p.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    i = ks.add_parser("init", parents=[where], help="create the key directory and the kernel's key pair")
    i.add_argument("path", nargs="?", type=Path, default=None, metavar="DIR", help="key directory (same as --dir)")
    a = ks.add_parser("add", parents=[where], help="create and allow a client key pair")
    a.add_argument("name", help="the client's name (1-64 letters, digits or _.-)")
    r = ks.add_parser("revoke", parents=[where], help="stop allowing a client key")
    r.add_argument("name", help="the client's name")
    ks.add_parser("list", parents=[where], help="list the client keys")
    apikeys_cmd.add_parser(ks, where)
    p.set_defaults(func=run_keys)


def run_keys(args: argparse.Namespace) -> int:
    d = getattr(args, "path", None) or (args.dir if args.dir is not None else default_keys_dir())
    if args.keys_command == "api":
        return apikeys_cmd.run(args, d)
    out: Any
    if args.keys_command == "init":
        init_keys(d)
        out = {"dir": str(d), "server_key": str(d / "server.key")}
        text = [f"coral keys: created {d} (kernel key pair; add clients with `coral keys --dir {d} add NAME`)"]
    elif args.keys_command == "add":
        secret = add_client(d, args.name)
        out = {"name": args.name, "secret": str(secret), "server_key": str(d / "server.key")}
        text = [
            f"coral keys: allowed client {args.name!r}; its secret is {secret} (mode 0600)",
            f"  on the client's machine put {d / 'server.key'} and that file in the same layout",
        ]
    elif args.keys_command == "revoke":
        revoke_client(d, args.name)
        out = {"name": args.name, "revoked": True}
        text = [f"coral keys: revoked {args.name!r}; the kernel refuses its next connection"]
    else:
        clients = list_clients(d)
        out = [{"name": name, "status": status} for name, status in clients]
        text = [f"{name}\t{status}" for name, status in clients]
    if args.json:
        print_json(out)
    else:
        for line in text:
            print(line)
    return 0


def is_loopback(address: str) -> bool:
    """Whether a tcp:// address binds only the loopback interface."""
    return apikeys_cmd.is_loopback(address[len("tcp://") :].rsplit(":", 1)[0].strip("[]"))


def kernel_keys(endpoints: Endpoints | None, keys: Path | None, flag: str = "--bind") -> ServerKeys | None:
    """The kernel's CURVE keys for binding ``endpoints`` (``keys``, else ``$CORAL_KEYS``; None: none).

    Refuses a non-loopback tcp address without keys.
    """
    d = keys_dir(keys)
    tcp = endpoints is not None and endpoints.router.startswith("tcp://")
    if d is None:
        if tcp and endpoints is not None and not is_loopback(endpoints.router):
            raise CoralError(
                f"{flag}: {endpoints.router} is reachable from other machines, and the bus would be plaintext; "
                "create keys with `coral keys init` (then `coral keys add NAME` per client) and give "
                f"--keys DIR (or set {ENV_VAR}), or bind tcp://127.0.0.1:PORT"
            )
        return None
    return server_keys(d) if tcp else None


def client_keys_for(endpoints: Endpoints | None, keys: Path | None, name: str) -> ClientKeys | None:
    """A client's CURVE keys (``keys``, else ``$CORAL_KEYS``) for a tcp kernel; None for none."""
    d = keys_dir(keys)
    if d is None or endpoints is None or not endpoints.router.startswith("tcp://"):
        return None
    return client_keys(d, name)
