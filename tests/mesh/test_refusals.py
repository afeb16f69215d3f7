"""Refused connections are shown and bounded: each names the peer (as far as libzmq tells) and a readable
reason; repeats from one peer are merged with a count, at most one report per period; the reports reach
the TUI's events, ``coral up``'s summary and its console."""

from __future__ import annotations

import io
from pathlib import Path

import anyio
import pytest
import zmq
from rich.console import Console

from actors.watch import RunState
from coral.cli.up_status import print_summary
from coral.kernel import AuthRefused, Broker, BusClient, BusError, Endpoints, Envelope, client_keys, server_keys
from coral.kernel.broker import UNNAMED_PEER, _Refusals, handshake_reason, peer_host
from coral.kernel.keys import ClientKeys, add_client, init_keys
from tui.model import State
from tui.reducer import apply

TCP = Endpoints("tcp://127.0.0.1:0", "tcp://127.0.0.1:0")


def test_repeats_of_one_peer_are_merged_and_rate_limited() -> None:
    r = _Refusals(period=10.0)
    first = r.add(0.0, "tcp://10.0.0.9", "NULL", "", "plaintext")
    assert first == AuthRefused("tcp://10.0.0.9", "NULL", "", "plaintext", 1, 0.0)
    assert [r.add(t, "tcp://10.0.0.9", "NULL", "", "plaintext") for t in (0.1, 0.2, 5.0)] == [None] * 3
    other = r.add(1.0, "tcp://10.0.0.7", "CURVE", "k", "unknown key")  # another peer: reported at once
    assert other is not None and other.count == 1
    assert r.due(9.9) == []
    (merged,) = r.due(10.0)
    assert (merged.address, merged.count, merged.first_s) == ("tcp://10.0.0.9", 3, 9.9)
    assert r.due(30.0) == []  # nothing new
    late = r.add(31.0, "tcp://10.0.0.9", "NULL", "", "plaintext")  # a period after the last report
    assert late is not None and late.count == 1
    # 11 a second for a minute: 1 at once, then one merged report per period
    r2 = _Refusals(period=10.0)
    reports = []
    for i in range(660):
        t = i / 11
        if (x := r2.add(t, "tcp://h", "NULL", "", "x")) is not None:
            reports.append(x)
        reports += r2.due(t)
    reports += r2.due(70.0)
    assert len(reports) <= 8 and sum(x.count for x in reports) == 660


def test_readable_reasons_and_peer_hosts() -> None:
    assert "not a CURVE client" in handshake_reason(int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH))
    assert "wrong server key" in handshake_reason(int(zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC))
    assert handshake_reason(0x11000099).startswith("security handshake failed: malformed")
    assert "code 0x7" in handshake_reason(7)
    assert peer_host("10.1.2.3") == "tcp://10.1.2.3"
    assert peer_host("10.1.2.3:5555") == "tcp://10.1.2.3"
    assert peer_host("[::1]:5555") == "tcp://[::1]"
    assert peer_host("") == peer_host("?") == UNNAMED_PEER and "no address" in UNNAMED_PEER


async def _intrude(ep: Endpoints, curve: ClientKeys | None) -> None:
    with pytest.raises(BusError, match="no Ready"):
        async with BusClient("intruder", ep, curve=curve, handshake_timeout=0.3):
            pass


async def test_a_retrying_client_is_reported_once_then_merged(tmp_path: Path) -> None:
    keys = init_keys(tmp_path / "keys")
    add_client(keys, "watch")
    pub, sec = zmq.curve_keypair()
    stranger = ClientKeys("stranger", server_keys(keys).public, pub, sec)
    async with Broker(TCP, curve=server_keys(keys), heartbeat_interval=0.2, peer_timeout=1.0) as broker:
        broker._refusals.period = 1.0
        ep = broker.endpoints
        async with BusClient("watch", ep, subscribe=["kernel.auth."], curve=client_keys(keys, "watch")) as watch:
            for _ in range(3):
                await _intrude(ep, stranger)
            seen: list[AuthRefused] = []
            with anyio.move_on_after(3.0):
                async for env in watch:
                    seen.append(env.msg)
                    if sum(r.count for r in seen) >= broker.refused:
                        break
    assert broker.refused >= 3
    assert all(r.address == "tcp://127.0.0.1" and r.key == pub.decode() for r in seen)
    assert "unknown or revoked" in seen[0].reason and seen[0].count == 1
    assert len(seen) == 2 and sum(r.count for r in seen) == broker.refused  # one at once, the rest merged

    st = RunState()
    tui = State()
    for r in seen:
        env = Envelope("publish", "kernel", "kernel.auth.refused", r)
        st.update(env)
        tui = apply(tui, env)
    assert st.refusals() == [
        {"address": "tcp://127.0.0.1", "mechanism": "CURVE", "key": pub.decode(), "reason": seen[-1].reason,
         "count": broker.refused}
    ]  # fmt: skip
    events = [e for e in tui.events if e.kind == "access"]
    assert len(events) == 2 and all(e.severity == "warn" and "tcp://127.0.0.1" in e.text for e in events)
    con = Console(file=io.StringIO(), width=300)
    summary = {"scenario": "s", "end_s": 1.0, "reason": "stopped", "wall_s": 1.0, "plans": 0, "spent_usd": 0.0,
               "journal": None, "refused_connections": st.refusals()}  # fmt: skip
    print_summary(summary, con)
    out = con.file.getvalue()  # type: ignore[attr-defined]
    assert f"refused {broker.refused} connection(s) from tcp://127.0.0.1: unknown or revoked client key" in out
