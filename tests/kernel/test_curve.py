"""CurveZMQ on the bus: allowed, unknown, revoked and plaintext clients; key files; private ipc folders."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import anyio
import pytest
import zmq
import zmq.utils.z85
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from coral.kernel import (
    AuthRefused,
    Broker,
    BusClient,
    BusError,
    Endpoints,
    KeysError,
    Mesh,
    client_keys,
    server_keys,
)
from coral.kernel.broker import UNNAMED_PEER
from coral.kernel.keys import ClientKeys, add_client, init_keys, keys_dir, list_clients, revoke_client

from .msgs import Ping, next_match, next_of

TCP = Endpoints("tcp://127.0.0.1:0", "tcp://127.0.0.1:0")


@pytest.fixture
def keydir(tmp_path: Path) -> Path:
    d = init_keys(tmp_path / "keys")
    add_client(d, "watch")
    add_client(d, "alice")
    return d


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_key_directory_layout_and_permissions(tmp_path: Path) -> None:
    d = init_keys(tmp_path / "k")
    secret = add_client(d, "worker-1")
    assert _mode(d) == 0o700 and _mode(d / "clients") == 0o700
    assert _mode(d / "server.key_secret") == 0o600
    assert _mode(secret) == 0o600 and secret == d / "clients" / "worker-1.key_secret"
    assert _mode(d / "server.key") == 0o644
    assert list_clients(d) == [("worker-1", "allowed")]
    keys = client_keys(d, "worker-1")
    assert keys.public in server_keys(d).allowed()
    revoke_client(d, "worker-1")
    assert not secret.exists() and (d / "revoked" / "worker-1.key").exists()
    assert list_clients(d) == [("worker-1", "revoked")]
    assert keys.public not in server_keys(d).allowed()


def test_key_errors_name_the_path(tmp_path: Path) -> None:
    d = init_keys(tmp_path / "k")
    with pytest.raises(KeysError, match="already holds a kernel key pair"):
        init_keys(d)
    with pytest.raises(KeysError, match="no key directory"):
        add_client(tmp_path / "nowhere", "a")
    with pytest.raises(KeysError, match="key name"):
        add_client(d, "../evil")
    with pytest.raises(KeysError, match="key name"):
        add_client(d, "server")
    add_client(d, "a")
    with pytest.raises(KeysError, match="already exists"):
        add_client(d, "a")
    with pytest.raises(KeysError, match="no allowed client 'b'"):
        revoke_client(d, "b")
    with pytest.raises(KeysError, match=r"clients/b.key_secret: no such key file"):
        client_keys(d, "b")
    os.chmod(d / "clients" / "a.key_secret", 0o644)
    with pytest.raises(KeysError, match="accessible to others"):
        client_keys(d, "a")
    (d / "server.key_secret").write_text("garbage")
    os.chmod(d / "server.key_secret", 0o600)
    with pytest.raises(KeysError, match=r"server\.key_secret: not a CurveZMQ certificate"):
        server_keys(d)


def test_keys_dir_from_argument_or_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CORAL_KEYS", raising=False)
    assert keys_dir(None) is None
    monkeypatch.setenv("CORAL_KEYS", str(tmp_path / "env"))
    assert keys_dir(None) == tmp_path / "env"
    assert keys_dir(tmp_path / "arg") == tmp_path / "arg"


async def test_allowed_client_works_over_tcp_with_curve(keydir: Path) -> None:
    async with Broker(TCP, curve=server_keys(keydir)) as broker:
        ep = broker.endpoints
        async with (
            BusClient("watch", ep, curve=client_keys(keydir, "watch")) as watch,
            BusClient("alice", ep, curve=client_keys(keydir, "alice")) as alice,
        ):
            await alice.send("watch", Ping(7))
            assert (await next_of(watch, Ping)).msg == Ping(7)
        assert broker.refused == 0


async def _refused(keydir: Path, curve: ClientKeys | None, *, revoke: str | None = None) -> AuthRefused:
    async with Broker(TCP, curve=server_keys(keydir)) as broker:
        ep = broker.endpoints
        async with BusClient("watch", ep, subscribe=["kernel.auth."], curve=client_keys(keydir, "watch")) as watch:
            if revoke is not None:
                revoke_client(keydir, revoke)
            with pytest.raises(BusError, match="no Ready from the kernel"):
                async with BusClient("intruder", ep, curve=curve, handshake_timeout=0.5):
                    pass
            ev = await next_of(watch, AuthRefused)
            assert "intruder" not in broker.peers
            return ev.msg  # type: ignore[no-any-return]


async def test_unknown_key_is_refused_and_reported(keydir: Path) -> None:
    pub, sec = zmq.curve_keypair()
    stranger = ClientKeys("stranger", server_keys(keydir).public, pub, sec)
    ev = await _refused(keydir, stranger)
    assert ev.mechanism == "CURVE" and ev.key == pub.decode() and "unknown or revoked" in ev.reason


async def test_revoked_key_is_refused_and_reported(keydir: Path) -> None:
    kept = client_keys(keydir, "alice")  # the client kept its secret; the kernel revoked it
    ev = await _refused(keydir, kept, revoke="alice")
    assert ev.key == kept.public.decode() and "unknown or revoked" in ev.reason


async def test_plaintext_client_is_refused_and_reported(keydir: Path) -> None:
    ev = await _refused(keydir, None)
    assert "not a CURVE client" in ev.reason
    assert ev.address == UNNAMED_PEER  # libzmq names no peer for a failed handshake: the address says so


async def test_client_with_the_wrong_server_key_is_refused(keydir: Path) -> None:
    good = client_keys(keydir, "alice")
    other_server, _ = zmq.curve_keypair()
    async with Broker(TCP, curve=server_keys(keydir)) as broker:
        with pytest.raises(BusError, match="no Ready"):
            async with BusClient(
                "alice",
                broker.endpoints,
                curve=ClientKeys("alice", other_server, good.public, good.secret),
                handshake_timeout=0.5,
            ):
                pass
        assert "alice" not in broker.peers


async def test_mesh_with_keys_runs_its_own_actors_and_refuses_strangers(keydir: Path) -> None:
    async with Mesh(endpoints=TCP, curve=server_keys(keydir)) as mesh:
        watch = await mesh.client("watch-local", subscribe=["kernel.auth."])
        async with BusClient("alice", mesh.endpoints, curve=client_keys(keydir, "alice")) as alice:
            await alice.send("watch-local", Ping(1))
            assert (await next_of(watch, Ping)).msg == Ping(1)
        with pytest.raises(BusError):
            async with BusClient("plain", mesh.endpoints, handshake_timeout=0.5):
                pass
        await next_match(watch, AuthRefused)


async def test_curve_is_not_used_on_ipc(keydir: Path, tmp_path: Path) -> None:
    ep = Endpoints(f"ipc://{tmp_path}/bus/router", f"ipc://{tmp_path}/bus/pub")
    async with Broker(ep, curve=server_keys(keydir)) as broker:
        assert broker.curve is None
        async with BusClient("plain", broker.endpoints):
            pass
    assert _mode(tmp_path / "bus") == 0o700


async def test_ipc_socket_in_a_shared_folder_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o755)
    with pytest.raises(BusError, match="open to other users"):
        async with Broker(Endpoints(f"ipc://{shared}/router", f"ipc://{shared}/pub")):
            pass
    await anyio.lowlevel.checkpoint()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frames=st.lists(st.binary(max_size=48), max_size=9))
@example(frames=[b"1.0", b"", b"", b"", b"", b""])
def test_zap_handler_answers_any_request_and_never_raises(keydir: Path, frames: list[bytes]) -> None:
    broker = Broker(TCP, curve=server_keys(keydir))
    broker.publish = lambda msg, source="kernel": None  # type: ignore[method-assign]

    async def answer() -> list[bytes]:  # the handler runs in the broker's event loop (a refusal reads its clock)
        return broker._zap_answer(frames)

    reply = anyio.run(answer)
    assert len(reply) == 6 and reply[0] == b"1.0" and reply[2] in (b"200", b"400", b"500")
    if reply[2] == b"200":  # only an allowed CURVE key gets in
        assert frames[5] == b"CURVE" and zmq.utils.z85.encode(frames[6]) in server_keys(keydir).allowed()
