"""The gateway pairs a prefill instance only with decode instances whose KV link holds behind its NIC
(``coral.routing.kv_compatible``, as the router and the allocation pair them), over real HTTP too."""

from __future__ import annotations

import json

import aiohttp
import attrs

from coral.gateway import Gateway, serving
from coral.gateway.table import RouteTable
from coral.gateway.upstream import PlaceholderServer
from coral.messages import FleetUpdate, InstanceInfo
from tests.gateway.test_proxy import LOCAL, post

GBPS = 1e9 / 8


def inst(iid: str, mode: str, *, nic: float, need: float = 0.0, weight: float = 1.0, url: str = "x") -> InstanceInfo:
    return InstanceInfo(
        iid, "pd", "t-" + iid, "r1", mode, "serving", ("a",), ("n" + iid,), "w", weight, nic, 0.0, url, need
    )


def drawn(table: RouteTable, prefill: InstanceInfo, n: int = 400) -> dict[str, int]:
    out: dict[str, int] = {}
    for rid in range(n):
        d = table.decode_for(prefill, rid)
        assert d is not None
        out[d.id] = out.get(d.id, 0) + 1
    return out


def test_decode_for_skips_decode_instances_whose_kv_link_needs_a_faster_sender() -> None:
    """A 10 Gbps prefill instance never hands its KV cache to a decode instance that needs 40 Gbps, though
    that one has 9 of the 10 weight; a 100 Gbps one draws both by weight; with only incompatible decode
    instances left, the handoff falls back to them (as the router and the simulator do)."""
    slow, fast = inst("p-slow", "prefill", nic=10 * GBPS), inst("p-fast", "prefill", nic=100 * GBPS)
    big = inst("d-big", "decode", nic=100 * GBPS, need=40 * GBPS, weight=9.0)
    small = inst("d-small", "decode", nic=25 * GBPS, need=5 * GBPS, weight=1.0)
    table = RouteTable(["pd"], seed=1)
    table.update(FleetUpdate(1, 1.0, (slow, fast, big, small)))
    assert drawn(table, slow) == {"d-small": 400}
    got = drawn(table, fast)
    assert set(got) == {"d-big", "d-small"} and got["d-big"] > 300
    table.update(FleetUpdate(2, 2.0, (slow, big)))
    assert drawn(table, slow) == {"d-big": 400}
    edge = attrs.evolve(small, kv_min_nic=10 * GBPS)  # exactly the sender's NIC: compatible
    table.update(FleetUpdate(3, 3.0, (slow, big, edge)))
    assert drawn(table, slow) == {"d-small": 400}


async def test_the_two_step_protocol_sends_the_request_to_a_compatible_decode_instance() -> None:
    pre, d_big, d_small = (PlaceholderServer(n) for n in ("pre", "d-big", "d-small"))
    gw = Gateway({"pd": 16}, seed=5)
    async with (
        serving(pre, LOCAL) as up,
        serving(d_big, LOCAL) as ub,
        serving(d_small, LOCAL) as us,
        serving(gw, LOCAL) as url,
    ):
        gw.on_fleet(
            FleetUpdate(
                1,
                1.0,
                (
                    inst("p1", "prefill", nic=10 * GBPS, url=up),
                    inst("d-big", "decode", nic=100 * GBPS, need=40 * GBPS, weight=9.0, url=ub),
                    inst("d-small", "decode", nic=25 * GBPS, need=5 * GBPS, url=us),
                ),
            )
        )
        async with aiohttp.ClientSession() as s:
            for _ in range(10):
                st, _, body = await post(s, url + "/v1/completions", {"model": "pd", "prompt": "hi", "max_tokens": 3})
                assert st == 200 and json.loads(body)["served_by"] == "d-small", body
        assert d_big.served == 0 and d_small.served == 10 and pre.served == 10
    await gw.aclose()
