"""The host registry: the kernel's side of ``coral worker`` (one program per GPU host, ``actors.hostworker``).

A worker registers with ``WorkerHello`` (a request). The registry refuses, with one line naming the field:
a node type that is not in the catalog, a GPU count that is not the node type's, a host that is not in the
run's ``--hosts`` file or whose region or node type differ from it there, and a name that a live worker of
another incarnation already holds. Otherwise it records the host in the ``HostTable`` (shared with the
engines of ``coral.vllm.hosted``, which start and watch the host's vLLM servers through it) and answers
``WorkerWelcome``. A worker reconnecting after a kernel restart lists the servers it still runs; the table
keeps them for the engines of adopted instances and stops the others at once (``HostTable.prune``).

It answers every ``HostBeat`` (unknown hosts are told to register again), relays ``ServerStarted`` and
``ServerExited`` into the table, and marks a host lost when its bus connection (``host-NAME@INCARNATION``)
is: ``kernel.peer.lost`` (silent past the kernel's peer timeout) or ``kernel.peer.left`` (a goodbye). A lost host's
engines report a fault, so the supervisor loses the node and the router retries what it held.

``RegisteredHosts`` is the provider of such a run: the ``--hosts`` machines, of which only those whose
worker is registered and alive can be given to an instance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from actors.cloud import TAG_INSTANCE, TAG_STAGE, StaticHosts
from coral.catalog.types import Catalog
from coral.kernel import Actor, Envelope, PeerLeft, PeerLost
from coral.messages.hosts import (
    HOST_PREFIX,
    HOSTS,
    HostBeat,
    ServerExited,
    ServerStarted,
    WorkerHello,
    WorkerWelcome,
    host_bus_name,
)
from coral.messages.mesh import Host
from coral.vllm.hosted import HostTable


def worker_problem(catalog: Catalog, node: str, gpus: int, region: str) -> str | None:
    """Why a worker announcing ``node`` with ``gpus`` GPUs in ``region`` cannot join (None: it can)."""
    nt = catalog.nodes.get(node)
    if nt is None:
        return f"node type {node!r} is not in the catalog"
    if gpus != nt.gpu_count:
        return f"gpus: node type {node!r} has {nt.gpu_count} GPU(s) of {nt.gpu}, the worker announced {gpus}"
    if region not in catalog.regions:
        return f"region {region!r} is not in the catalog"
    return None


class HostRegistry(Actor):
    """Registers host workers and relays their reports (see the module docstring)."""

    def __init__(self, table: HostTable, catalog: Catalog, hosts: Mapping[str, Host], name: str = HOSTS) -> None:
        super().__init__(name, subscribe=["kernel.peer."], inbox_size=4096)
        self.table = table
        self.catalog = catalog
        self.hosts = dict(hosts)

    def problem(self, hello: WorkerHello, source: str) -> str | None:
        """Why ``hello`` (from bus client ``source``) is refused (None: accepted)."""
        if source != host_bus_name(hello.name, hello.incarnation):
            return f"name: worker {hello.name!r} connected as {source!r}"
        bad = worker_problem(self.catalog, hello.node, hello.gpus, hello.region)
        if bad is not None:
            return bad
        want = self.hosts.get(hello.name)
        if want is None:
            return f"name: host {hello.name!r} is not in the --hosts file ({', '.join(sorted(self.hosts))})"
        if (want.region, want.node) != (hello.region, hello.node):
            return (
                f"host {hello.name!r}: the --hosts file has region {want.region!r}, node type {want.node!r}; the "
                f"worker announced {hello.region!r}, {hello.node!r}"
            )
        cur = self.table.hosts.get(hello.name)
        if cur is not None and cur.alive and cur.incarnation != hello.incarnation:
            return f"name: a worker named {hello.name!r} is already registered (engine address {cur.engine_host})"
        return None

    async def handle(self, env: Envelope) -> None:
        msg = env.msg
        if isinstance(msg, WorkerHello):
            bad = self.problem(msg, env.source)
            if bad is None:
                self.table.register(msg, env.source)
            if env.kind == "request":
                await self.ctx.reply(env, WorkerWelcome(msg.name, bad is None, bad or ""))
            if bad is None:
                self.table.prune(msg.name)
        elif isinstance(msg, HostBeat):
            known = self.table.beat(msg)
            if env.kind == "request":
                why = "" if known else "not registered with this kernel"
                await self.ctx.reply(env, WorkerWelcome(msg.host, known, why))
        elif isinstance(msg, ServerStarted):
            self.table.started(msg)
        elif isinstance(msg, ServerExited):
            self.table.exited(msg)
        elif isinstance(msg, PeerLost | PeerLeft) and msg.name.startswith(HOST_PREFIX):
            host = msg.name[len(HOST_PREFIX) :].split("@", 1)[0]
            rec = self.table.hosts.get(host)
            if rec is None or rec.bus != msg.name:
                return  # another incarnation's connection (a refused duplicate)
            how = f"silent for {msg.silent_s:.1f} s" if isinstance(msg, PeerLost) else f"left: {msg.reason or 'bye'}"
            self.table.lose(host, f"host worker {host} lost ({how})")


class RegisteredHosts(StaticHosts):
    """The ``--hosts`` machines, of which only those whose worker is registered and alive can be given."""

    def __init__(self, hosts: Sequence[Host], table: HostTable, **kw: Any) -> None:
        super().__init__(hosts, **kw)
        self.table = table

    def provision(
        self, region: str, node: str, now: float, *, warm: bool = False, tags: Mapping[str, str] | None = None
    ) -> str | None:
        down = {n for n in self.hosts if not self.table.alive(n)}
        hidden = {n: self.hosts.pop(n) for n in down}
        try:
            return super().provision(region, node, now, warm=warm, tags=tags)
        finally:
            self.hosts.update(hidden)
            self.hosts = dict(sorted(self.hosts.items()))

    def free(self, region: str, node: str) -> int:
        return sum(
            1
            for name, h in self.hosts.items()
            if (h.region, h.node) == (region, node)
            and self.table.alive(name)
            and (name not in self.nodes or self.nodes[name].state == "released")
        )

    def locate(self, instance: str) -> list[str]:
        """The host of each stage of ``instance`` (from the tags its nodes were rented with)."""
        nodes = [n for n in self.nodes.values() if n.tags.get(TAG_INSTANCE) == instance and n.state != "released"]
        return [n.id for n in sorted(nodes, key=lambda n: int(n.tags.get(TAG_STAGE, "0")))]


__all__ = ["HostRegistry", "RegisteredHosts", "worker_problem"]
