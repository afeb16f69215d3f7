"""Cloud providers behind the instance supervisor: the simulated cloud and a list of static hosts.

``SimCloud``: a node of (region, node type) can be provisioned while fewer than the market's availability
of that type are held there (the rest is a stockout: refused); it is ready ``provision_s`` later (at once
when ``warm``). Faults (``inject``) kill ``count`` running nodes of a (region, node type), drawn with a
seeded generator: a ``node_loss`` is silent (the supervisor notices missing heartbeats), a
``preemption`` comes with a notice. A node that dies while still provisioning is reported as failed.

``StaticHosts``: the user's machines; a node is a free host of the asked type, ready at once; availability
is the hosts themselves (the market's availability is ignored). Faults kill hosts likewise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import attrs
import numpy as np

from coral.errors import CoralError
from coral.messages.fleet import FAULT_KINDS, FaultInjected
from coral.messages.market import MarketUpdate
from coral.messages.mesh import Host

Key = tuple[str, str]


class CloudError(CoralError):
    """A cloud asked for something impossible (an unknown node id, a bad fault kind)."""


@attrs.frozen
class CloudEvent:
    """``ready`` (provisioned), ``preempted`` (killed with a notice) or ``failed`` (died while provisioning)."""

    kind: str
    node_id: str


@attrs.define
class CloudNode:
    id: str
    region: str
    node: str
    ready_at: float
    state: str = "provisioning"  # provisioning | running | dead | released


class CloudProvider(Protocol):
    """What the supervisor needs from a cloud."""

    def set_market(self, update: MarketUpdate) -> None: ...

    def provision(self, region: str, node: str, now: float, *, warm: bool = False) -> str | None: ...

    def release(self, node_id: str, now: float) -> None: ...

    def poll(self, now: float) -> list[CloudEvent]: ...

    def inject(self, fault: FaultInjected, now: float) -> list[str]: ...

    def price(self, node_id: str) -> float: ...


class _Base:
    def __init__(self, seed: int) -> None:
        self.nodes: dict[str, CloudNode] = {}
        self.prices: dict[Key, float] = {}
        self.rng = np.random.default_rng(seed)
        self._events: list[CloudEvent] = []

    def set_market(self, update: MarketUpdate) -> None:
        self.prices = update.prices()

    def node(self, node_id: str) -> CloudNode:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise CloudError(f"unknown node {node_id!r}") from None

    def price(self, node_id: str) -> float:
        n = self.node(node_id)
        return self.prices.get((n.region, n.node), 0.0)

    def release(self, node_id: str, now: float) -> None:
        n = self.node(node_id)
        if n.state != "dead":
            n.state = "released"

    def held(self, region: str, node: str) -> int:
        return sum(
            1
            for n in self.nodes.values()
            if (n.region, n.node) == (region, node) and n.state in ("provisioning", "running")
        )

    def poll(self, now: float) -> list[CloudEvent]:
        out, self._events = self._events, []
        for n in sorted(self.nodes.values(), key=lambda n: _order(n.id)):
            if n.state == "provisioning" and n.ready_at <= now:
                n.state = "running"
                out.append(CloudEvent("ready", n.id))
        return out

    def inject(self, fault: FaultInjected, now: float) -> list[str]:
        """Kill nodes per the fault; return the killed nodes that were running (their processes die)."""
        if fault.kind not in FAULT_KINDS:
            raise CloudError(f"fault kind: must be one of {', '.join(FAULT_KINDS)}, got {fault.kind!r}")
        cands = sorted(
            (
                n
                for n in self.nodes.values()
                if (n.region, n.node) == (fault.region, fault.node) and n.state in ("provisioning", "running")
            ),
            key=lambda n: _order(n.id),
        )
        if not cands:
            return []
        picks = self.rng.permutation(len(cands))[: fault.count]
        killed = []
        for i in sorted(int(p) for p in picks):
            n = cands[i]
            was = n.state
            n.state = "dead"
            if was == "provisioning":
                self._events.append(CloudEvent("failed", n.id))
                continue
            killed.append(n.id)
            if fault.kind == "preemption":
                self._events.append(CloudEvent("preempted", n.id))
        return killed


def _order(node_id: str) -> tuple[int, str]:
    return (len(node_id), node_id)  # n2 before n10


class SimCloud(_Base):
    """The simulated cloud (see the module docstring)."""

    def __init__(self, *, provision_s: float = 30.0, seed: int = 0) -> None:
        super().__init__(seed)
        if not provision_s >= 0:
            raise CloudError(f"provision_s: must not be negative, got {provision_s}")
        self.provision_s = provision_s
        self.avail: dict[Key, int] = {}
        self._next = 0

    def set_market(self, update: MarketUpdate) -> None:
        super().set_market(update)
        self.avail = update.availability()

    def provision(self, region: str, node: str, now: float, *, warm: bool = False) -> str | None:
        if self.held(region, node) >= self.avail.get((region, node), 0):
            return None
        self._next += 1
        nid = f"n{self._next}"
        self.nodes[nid] = CloudNode(nid, region, node, now if warm else now + self.provision_s)
        return nid


class StaticHosts(_Base):
    """The user's machines (see the module docstring)."""

    def __init__(self, hosts: Sequence[Host], *, seed: int = 0) -> None:
        super().__init__(seed)
        if not hosts:
            raise CloudError("hosts: need at least one host")
        self.hosts = {h.name: h for h in sorted(hosts, key=lambda h: h.name)}

    def provision(self, region: str, node: str, now: float, *, warm: bool = False) -> str | None:
        for name, h in self.hosts.items():
            if (h.region, h.node) != (region, node):
                continue
            cur = self.nodes.get(name)
            if cur is None or cur.state == "released":
                self.nodes[name] = CloudNode(name, region, node, now)
                return name
        return None
