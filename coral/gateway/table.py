"""The gateway's routing table: per deployment, its live entry instances with their weights.

Kept from the bus's ``fleet.update``: an instance is routable in a serving state (``ROUTABLE_STATES``)
and when it takes requests (aggregated or prefill; a decode instance only takes KV handoffs). A request
goes to one of them with probability proportional to its weight (its capacity in requests/s, as the plan
sized it), drawn by a hash of (seed, request id, attempt) as the router draws. Decode instances are kept
per (deployment, region): a request that a prefill instance took goes on to one of them whose KV link
holds behind that prefill instance's NIC (``decode_for``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from coral.messages.fleet import ROUTABLE_STATES, FleetUpdate, InstanceInfo
from coral.routing import kv_compatible, pick, uniform


class RouteTable:
    """Deployments the gateway serves and their routable instances."""

    def __init__(self, deployments: Iterable[str], *, seed: int = 0) -> None:
        self.known: set[str] = set(deployments)
        self.seed = seed
        self.routes: dict[str, list[InstanceInfo]] = {}
        self.decode: dict[tuple[str, str], list[InstanceInfo]] = {}
        self.seq = -1

    def update(self, msg: FleetUpdate) -> None:
        """Take a fleet update (an older one than the latest taken is ignored)."""
        if msg.seq < self.seq:
            return
        self.seq = msg.seq
        routes: dict[str, list[InstanceInfo]] = {}
        decode: dict[tuple[str, str], list[InstanceInfo]] = {}
        for i in msg.instances:
            self.known.add(i.deployment)
            if i.state in ROUTABLE_STATES and i.weight > 0:
                if i.mode == "decode":
                    decode.setdefault((i.deployment, i.region), []).append(i)
                else:
                    routes.setdefault(i.deployment, []).append(i)
        for v in [*routes.values(), *decode.values()]:
            v.sort(key=lambda i: (len(i.id), i.id))
        self.routes, self.decode = routes, decode

    def instances(self, deployment: str) -> Sequence[InstanceInfo]:
        return self.routes.get(deployment, ())

    def choose(self, deployment: str, rid: int, attempt: int = 0, avoid: str = "") -> InstanceInfo | None:
        """The instance for attempt ``attempt`` of request ``rid`` (not ``avoid``); None if there is none."""
        cands = [i for i in self.routes.get(deployment, ()) if i.id != avoid]
        if not cands:
            return None
        return pick(cands, uniform(self.seed, rid, attempt))

    def decode_for(self, prefill: InstanceInfo, rid: int, attempt: int = 0) -> InstanceInfo | None:
        """A serving decode instance of the prefill instance's deployment and region (the KV cache moves
        between them), drawn by weight among those whose template holds its TPOT behind the prefill
        instance's NIC (``coral.routing.kv_compatible``, as the router pairs them), or among all of them
        when none does (as the router and the simulator fall back); None if there is none."""
        cands = [i for i in self.decode.get((prefill.deployment, prefill.region), ()) if i.endpoint]
        cands = kv_compatible(cands, prefill.kv_nic, _need) or cands
        if not cands:
            return None
        return pick(cands, uniform(self.seed, -1 - rid, attempt))


def _need(i: InstanceInfo) -> float:
    return i.kv_min_nic
