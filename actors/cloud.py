"""Cloud providers behind the instance supervisor: the simulated cloud and a list of static hosts.

``SimCloud``: a node of (region, node type) can be provisioned while fewer than the market's availability
of that type are held there (the rest is a stockout: refused); it is ready ``provision_s`` later (at once
when ``warm``). Faults (``inject``) kill ``count`` running nodes of a (region, node type), drawn with a
seeded generator: a ``node_loss`` is silent (the supervisor notices missing heartbeats), a
``preemption`` comes with a notice. A node that dies while still provisioning is reported as failed.

``StaticHosts``: the user's machines; a node is a free host of the asked type, ready at once; availability
is the hosts themselves (the market's availability is ignored). Faults kill hosts likewise.

Durable provider state: a real cloud's rentals outlive the control plane that made them. Given a
``state_file``, a provider writes its whole state (every node with its state and tags, the id counter and
the fault generator's state) there after each change, atomically (temp file, fsync, rename), and
``load_state`` reads it back: so after a crash of ``coral up`` the simulated cloud still has the nodes it
rented, "running", for ``coral up --resume`` to reconcile with. Tags (``provision(..., tags=...)``) are
the labels a real cloud keeps on a machine; the supervisor tags each node with its instance, deployment,
template and stage, which is what lets a resumed run adopt a node the journal never heard of.
Real providers are out of scope here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import attrs
import numpy as np

from coral.errors import CoralError
from coral.messages.fleet import FAULT_KINDS, FaultInjected
from coral.messages.market import MarketUpdate
from coral.messages.mesh import Host

Key = tuple[str, str]
TAG_INSTANCE = "coral.instance"
TAG_DEPLOYMENT = "coral.deployment"
TAG_TEMPLATE = "coral.template"
TAG_STAGE = "coral.stage"
"""The tags the supervisor puts on each node it rents (what a resumed run adopts a node by)."""


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
    tags: dict[str, str] = attrs.field(factory=dict)


class CloudProvider(Protocol):
    """What the supervisor needs from a cloud."""

    def set_market(self, update: MarketUpdate) -> None: ...

    def provision(
        self, region: str, node: str, now: float, *, warm: bool = False, tags: Mapping[str, str] | None = None
    ) -> str | None: ...

    def release(self, node_id: str, now: float) -> None: ...

    def free(self, region: str, node: str) -> int:
        """Nodes of ``node`` in ``region`` that ``provision`` would give now."""
        ...

    def poll(self, now: float) -> list[CloudEvent]: ...

    def inject(self, fault: FaultInjected, now: float) -> list[str]: ...

    def price(self, node_id: str) -> float: ...

    def alive(self) -> list[CloudNode]: ...


STATE_VERSION = 1


class _Base:
    def __init__(self, seed: int, state_file: str | os.PathLike[str] | None = None) -> None:
        self.nodes: dict[str, CloudNode] = {}
        self.prices: dict[Key, float] = {}
        self.rng = np.random.default_rng(seed)
        self._events: list[CloudEvent] = []
        self._next = 0
        self.now = -float("inf")  # the latest kernel time the provider acted at (saved with its state)
        self.state_file = Path(state_file) if state_file is not None else None

    # -- durable state -------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The provider's state as JSON-able data (what ``state_file`` holds)."""
        return {
            "version": STATE_VERSION,
            "kind": type(self).__name__,
            "next": self._next,
            "at": self.now if self.now > -float("inf") else None,
            "rng": self.rng.bit_generator.state,
            "nodes": [attrs.asdict(n) for n in sorted(self.nodes.values(), key=lambda n: _order(n.id))],
        }

    def save(self) -> None:
        """Write the state to ``state_file`` atomically (no-op without one)."""
        if self.state_file is None:
            return
        tmp = self.state_file.with_name(f".{self.state_file.name}.tmp")
        data = json.dumps(self.state(), indent=1, sort_keys=True).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.state_file)

    def load_state(self, path: str | os.PathLike[str]) -> None:
        """Take over the state a provider saved in ``path`` (and keep saving there)."""
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except FileNotFoundError:
            raise CloudError(f"{p}: no provider state file (was the run recorded with --record?)") from None
        except (OSError, ValueError) as exc:
            raise CloudError(f"{p}: unreadable provider state: {exc}") from None
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            raise CloudError(f"{p}: not a provider state file of version {STATE_VERSION}")
        if data.get("kind") != type(self).__name__:
            raise CloudError(f"{p}: state of a {data.get('kind')} provider, not of a {type(self).__name__}")
        try:
            nodes = {}
            for i, n in enumerate(data["nodes"]):
                node = CloudNode(
                    str(n["id"]), str(n["region"]), str(n["node"]), float(n["ready_at"]), str(n["state"]),
                    {str(k): str(v) for k, v in n.get("tags", {}).items()},
                )  # fmt: skip
                if node.state not in ("provisioning", "running", "dead", "released"):
                    raise CloudError(f"{p}: nodes[{i}].state: unknown state {node.state!r}")
                nodes[node.id] = node
            self._next = int(data["next"])
            at = data.get("at")
            self.now = float(at) if at is not None else -float("inf")
            self.rng.bit_generator.state = data["rng"]
        except (KeyError, TypeError, ValueError) as exc:
            raise CloudError(f"{p}: malformed provider state: {type(exc).__name__}: {exc}") from None
        self.nodes = nodes
        self.state_file = p

    def alive(self) -> list[CloudNode]:
        """The nodes provisioning or running (rented), in id order."""
        return [
            n for n in sorted(self.nodes.values(), key=lambda n: _order(n.id)) if n.state in ("provisioning", "running")
        ]

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
        if n.state not in ("dead", "released"):
            n.state = "released"
            self.now = max(self.now, now)
            self.save()

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
        if out:
            self.now = max(self.now, now)
            self.save()
        return out

    def inject(self, fault: FaultInjected, now: float) -> list[str]:
        """Kill nodes per the fault; return the killed nodes that were running (their processes die).

        A ``hang`` kills nothing: it returns the running nodes whose workers wedge."""
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
            if fault.kind == "hang":  # the machine stays up (and billed); its worker wedges
                if n.state == "running":
                    killed.append(n.id)
                continue
            was = n.state
            n.state = "dead"
            if was == "provisioning":
                self._events.append(CloudEvent("failed", n.id))
                continue
            killed.append(n.id)
            if fault.kind == "preemption":
                self._events.append(CloudEvent("preempted", n.id))
        self.now = max(self.now, now)
        self.save()
        return killed


def _order(node_id: str) -> tuple[int, str]:
    return (len(node_id), node_id)  # n2 before n10


class SimCloud(_Base):
    """The simulated cloud (see the module docstring)."""

    def __init__(
        self, *, provision_s: float = 30.0, seed: int = 0, state_file: str | os.PathLike[str] | None = None
    ) -> None:
        super().__init__(seed, state_file)
        if not provision_s >= 0:
            raise CloudError(f"provision_s: must not be negative, got {provision_s}")
        self.provision_s = provision_s
        self.avail: dict[Key, int] = {}

    def set_market(self, update: MarketUpdate) -> None:
        super().set_market(update)
        self.avail = update.availability()

    def provision(
        self, region: str, node: str, now: float, *, warm: bool = False, tags: Mapping[str, str] | None = None
    ) -> str | None:
        if self.held(region, node) >= self.avail.get((region, node), 0):
            return None
        self._next += 1
        nid = f"n{self._next}"
        self.nodes[nid] = CloudNode(nid, region, node, now if warm else now + self.provision_s, tags=dict(tags or {}))
        self.now = max(self.now, now)
        self.save()
        return nid

    def free(self, region: str, node: str) -> int:
        return max(0, self.avail.get((region, node), 0) - self.held(region, node))


class StaticHosts(_Base):
    """The user's machines (see the module docstring)."""

    def __init__(
        self, hosts: Sequence[Host], *, seed: int = 0, state_file: str | os.PathLike[str] | None = None
    ) -> None:
        super().__init__(seed, state_file)
        if not hosts:
            raise CloudError("hosts: need at least one host")
        self.hosts = {h.name: h for h in sorted(hosts, key=lambda h: h.name)}

    def provision(
        self, region: str, node: str, now: float, *, warm: bool = False, tags: Mapping[str, str] | None = None
    ) -> str | None:
        for name, h in self.hosts.items():
            if (h.region, h.node) != (region, node):
                continue
            cur = self.nodes.get(name)
            if cur is None or cur.state == "released":
                self.nodes[name] = CloudNode(name, region, node, now, tags=dict(tags or {}))
                self.now = max(self.now, now)
                self.save()
                return name
        return None

    def free(self, region: str, node: str) -> int:
        return sum(
            1
            for name, h in self.hosts.items()
            if (h.region, h.node) == (region, node) and (name not in self.nodes or self.nodes[name].state == "released")
        )
