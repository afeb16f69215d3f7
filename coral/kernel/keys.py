"""CurveZMQ keys of a kernel and its clients: the key directory, and what a broker or a client loads.

A key directory (``coral keys init DIR``; mode 0700) holds, in pyzmq's certificate format (``zmq.auth``)::

    server.key              the kernel's public key (give it to every client)
    server.key_secret       the kernel's key pair (mode 0600; only the kernel reads it)
    clients/NAME.key        an allowed client's public key (``coral keys add NAME``)
    clients/NAME.key_secret that client's key pair (mode 0600; copy it to the client's machine)
    revoked/NAME.key        a revoked client's public key (``coral keys revoke NAME``), kept for the record
    engine.secret           the secret that vLLM servers' API keys derive from (mode 0600; the kernel and
                            every ``coral worker`` host hold it, ``coral.vllm.launch.engine_key``)

A kernel with keys allows exactly the public keys in ``clients/`` (read again at every connection, so a
revocation refuses the client's next connection without a restart; an already established connection
stays until it reconnects). A client needs ``server.key`` and its own ``clients/NAME.key_secret`` in the
same layout. Where the directory is: ``--keys DIR``, else the ``CORAL_KEYS`` environment variable.
"""

from __future__ import annotations

import datetime
import os
import re
import secrets
from pathlib import Path
from typing import Any

import attrs
import zmq
import zmq.auth

from coral.errors import CoralError

ENV_VAR = "CORAL_KEYS"
SERVER = "server"
ENGINE_SECRET = "engine.secret"
CLIENTS = "clients"
REVOKED = "revoked"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


class KeysError(CoralError):
    """A key directory or key file that is missing, malformed or unsafe; the message names the path."""


@attrs.frozen
class ClientKeys:
    """What a client needs for CURVE: the kernel's public key and its own key pair (z85 bytes)."""

    name: str
    server_public: bytes
    public: bytes
    secret: bytes = attrs.field(repr=False)

    def apply(self, sock: zmq.Socket[Any]) -> None:
        """Make ``sock`` a CURVE client of the kernel (before it connects)."""
        sock.curve_serverkey = self.server_public
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret


@attrs.frozen
class ServerKeys:
    """What a kernel needs for CURVE: its key pair and who is allowed.

    ``key_dir`` (if any) is read at every connection for the allowed clients (``clients/*.key``);
    ``extra`` are public keys allowed besides (the kernel's own in-process actors).
    """

    public: bytes
    secret: bytes = attrs.field(repr=False)
    key_dir: Path | None = None
    extra: tuple[tuple[bytes, str], ...] = ()

    def allowed(self) -> dict[bytes, str]:
        """Public key (z85) -> client name, of every client allowed now."""
        out = dict(self.extra)
        if self.key_dir is not None:
            d = self.key_dir / CLIENTS
            for p in sorted(d.glob("*.key")) if d.is_dir() else ():
                try:
                    public, _ = zmq.auth.load_certificate(p)
                except (OSError, ValueError):
                    continue  # an unreadable key file allows nobody
                if public:
                    out[public] = p.stem
        return out

    def with_local_client(self, name: str = "local") -> tuple[ServerKeys, ClientKeys]:
        """These keys plus an in-memory client key pair for the kernel's own actors (allowed too)."""
        public, secret = zmq.curve_keypair()
        server = attrs.evolve(self, extra=(*self.extra, (public, name)))
        return server, ClientKeys(name, self.public, public, secret)

    def apply(self, sock: zmq.Socket[Any]) -> None:
        """Make ``sock`` a CURVE server (before it binds)."""
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_server = True


def keys_dir(arg: str | os.PathLike[str] | None) -> Path | None:
    """The key directory: ``arg`` if given, else ``$CORAL_KEYS`` if set, else None."""
    if arg is not None:
        return Path(arg)
    env = os.environ.get(ENV_VAR, "").strip()
    return Path(env) if env else None


def check_name(name: str) -> str:
    """A client key name: 1-64 letters, digits, ``_.-`` (not starting with punctuation)."""
    if not isinstance(name, str) or not _NAME.match(name) or name == SERVER:
        raise KeysError(f"key name {name!r}: expected 1-64 letters, digits or _.- (and not {SERVER!r})")
    return name


def _write_cert(path: Path, public: bytes, secret: bytes | None) -> None:
    """Write a certificate atomically (temp file, fsync, rename); secret ones are 0600 from creation."""
    mode = 0o600 if secret is not None else 0o644
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    text = (
        f"#   ****  Generated on {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M:%S} UTC by coral keys  ****\n"
        "#   CurveZMQ certificate (pyzmq zmq.auth format)\n"
        "metadata\ncurve\n"
        f'    public-key = "{public.decode()}"\n' + (f'    secret-key = "{secret.decode()}"\n' if secret else "")
    )
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # the umask may have narrowed it; never widened
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _require_dir(d: Path) -> Path:
    if not d.is_dir():
        raise KeysError(f"{d}: no key directory here (create one with `coral keys init {d}`)")
    return d


def _check_private(path: Path) -> None:
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise KeysError(f"{path}: secret key file is accessible to others (mode {mode:04o}); chmod 600 it")


def init_keys(d: str | os.PathLike[str]) -> Path:
    """Create a key directory with a fresh kernel key pair; refuses an existing one (returns its path)."""
    p = Path(d)
    if (p / f"{SERVER}.key_secret").exists():
        raise KeysError(f"{p}: already holds a kernel key pair; remove the directory to start over")
    if p.exists() and not p.is_dir():
        raise KeysError(f"{p}: exists and is not a directory")
    p.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(p, 0o700)
    for sub in (CLIENTS, REVOKED):
        (p / sub).mkdir(mode=0o700, exist_ok=True)
        os.chmod(p / sub, 0o700)
    engine_secret(p, create=True)
    public, secret = zmq.curve_keypair()
    _write_cert(p / f"{SERVER}.key", public, None)
    _write_cert(p / f"{SERVER}.key_secret", public, secret)
    return p


def add_client(d: str | os.PathLike[str], name: str) -> Path:
    """Create and allow a client key pair ``NAME``; return the path of its secret file."""
    p = _require_dir(Path(d))
    check_name(name)
    pub_path = p / CLIENTS / f"{name}.key"
    if pub_path.exists():
        raise KeysError(f"{pub_path}: client {name!r} already exists (revoke it first to replace it)")
    (p / CLIENTS).mkdir(mode=0o700, exist_ok=True)
    public, secret = zmq.curve_keypair()
    secret_path = p / CLIENTS / f"{name}.key_secret"
    _write_cert(secret_path, public, secret)
    _write_cert(pub_path, public, None)
    return secret_path


def revoke_client(d: str | os.PathLike[str], name: str) -> Path:
    """Stop allowing client ``NAME``: move its public key to ``revoked/`` and delete its secret."""
    p = _require_dir(Path(d))
    check_name(name)
    pub_path = p / CLIENTS / f"{name}.key"
    if not pub_path.exists():
        raise KeysError(f"{pub_path}: no allowed client {name!r} (see `coral keys list`)")
    (p / REVOKED).mkdir(mode=0o700, exist_ok=True)
    dest = p / REVOKED / f"{name}.key"
    os.replace(pub_path, dest)
    (p / CLIENTS / f"{name}.key_secret").unlink(missing_ok=True)
    return dest


def list_clients(d: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """(name, ``allowed`` or ``revoked``) of every client key, by name."""
    p = _require_dir(Path(d))
    out = [(f.stem, "allowed") for f in (p / CLIENTS).glob("*.key")]
    out += [(f.stem, "revoked") for f in (p / REVOKED).glob("*.key")]
    return sorted(out)


def _load(path: Path, *, secret: bool) -> tuple[bytes, bytes | None]:
    if not path.is_file():
        raise KeysError(f"{path}: no such key file")
    if secret:
        _check_private(path)
    try:
        public, sec = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise KeysError(f"{path}: not a CurveZMQ certificate: {exc}") from None
    if not public or len(public) != 40 or (secret and (sec is None or len(sec) != 40)):
        raise KeysError(f"{path}: not a CurveZMQ certificate (missing or malformed key)")
    return public, sec


def server_keys(d: str | os.PathLike[str]) -> ServerKeys:
    """The kernel's keys from a key directory (allowing the clients in ``clients/``)."""
    p = _require_dir(Path(d))
    public, secret = _load(p / f"{SERVER}.key_secret", secret=True)
    assert secret is not None
    return ServerKeys(public, secret, p)


def client_keys(d: str | os.PathLike[str], name: str) -> ClientKeys:
    """Client ``NAME``'s keys from a key directory (``server.key`` and ``clients/NAME.key_secret``)."""
    p = _require_dir(Path(d))
    check_name(name)
    server_public, _ = _load(p / f"{SERVER}.key", secret=False)
    public, secret = _load(p / CLIENTS / f"{name}.key_secret", secret=True)
    assert secret is not None
    return ClientKeys(name, server_public, public, secret)


def engine_secret(d: str | os.PathLike[str], *, create: bool = False) -> bytes:
    """The engine secret of a key directory (``engine.secret``, 32 random bytes in hex, mode 0600);
    ``create``: make it when it is missing (a directory made before it existed)."""
    p = _require_dir(Path(d)) / ENGINE_SECRET
    if not p.exists():
        if not create:
            raise KeysError(f"{p}: no engine secret (the kernel's host creates it: copy it from there)")
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
    _check_private(p)
    try:
        return bytes.fromhex(p.read_text().strip())
    except ValueError:
        raise KeysError(f"{p}: not an engine secret (expected hex digits)") from None
