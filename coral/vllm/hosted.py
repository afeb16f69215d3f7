"""vLLM engines on other machines: the kernel's side of the host workers (``coral worker``).

``HostTable`` is what the kernel knows of the registered hosts (filled by the host registry actor,
``actors.hosts``): each host's region, node type, GPUs, engine address, whether its worker is alive, and
the vLLM servers it runs. ``HostedEngine`` is a stage worker's engine whose server runs on the node's
host: the instance is ``coral.vllm.launch``'s plan over its stages' hosts (one server per host, vLLM's
multi-node launch when there are several). The head node's engine starts the head server (rank 0) on its
host, waits for the ports the host chose, then starts the headless followers (rank > 0, given the head's
address and master port) on theirs: started in that order, and stopped together. Requests and metrics go
straight to the head server's HTTP address from the control host, with the instance's API key, as
``VllmEngine`` does for a local server. A host worker that is lost (its bus connection went silent or
said goodbye), a server that exits, or a server a host refuses (a stage needs more GPUs than the host
has) is the engine's ``fault``: the stage worker reports it and the supervisor loses the node.

Adoption: a worker that outlived the kernel registers again with the servers it still runs; the engine
of an adopted instance (``coral up --resume``) takes them over instead of starting new ones, and the
others are stopped as soon as the run knows which instances it adopted (``HostTable.keep``/``prune``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import attrs

from coral.engines import StageAssignment, check_load
from coral.messages.hosts import (
    HostBeat,
    RunningServer,
    ServerExited,
    ServerStarted,
    StartServer,
    StopServer,
    WorkerHello,
)
from coral.vllm import client
from coral.vllm.engine import VllmBackend, VllmEngine
from coral.vllm.fleet import VllmFleet
from coral.vllm.launch import ServerLaunch, VllmLaunchError, launch_plan

log = logging.getLogger("coral.vllm")
REGISTER_WAIT_S = 30.0
"""How long an engine waits for the workers of its instance's hosts to register before it gives up."""


@attrs.define
class HostRec:
    """One registered host (see the module docstring)."""

    name: str
    region: str
    node: str
    gpus: int
    engine_host: str
    bus: str
    incarnation: str
    alive: bool = True
    lost_reason: str = ""
    lost_at: float = 0.0
    running: dict[str, RunningServer] = attrs.field(factory=dict)
    exited: dict[str, str] = attrs.field(factory=dict)
    refused: dict[str, str] = attrs.field(factory=dict)


def server_key(instance: str, rank: int) -> str:
    """The key of rank ``rank``'s server of ``instance`` (unique on its host)."""
    return f"{instance}.r{rank}"


class HostTable:
    """The registered hosts and their servers; ``send`` and ``locate`` are set once the mesh runs."""

    def __init__(self) -> None:
        self.hosts: dict[str, HostRec] = {}
        self.send: Callable[[str, object], bool] | None = None
        self.locate: Callable[[str], list[str]] | None = None
        """Instance id -> the host of each of its stages (from the provider's node tags)."""
        self.wanted: Callable[[str], bool] | None = None
        """Instance id -> whether the run keeps it (set once the run knows: a resumed run after adopting)."""
        self.orders = 0

    def register(self, hello: WorkerHello, bus: str) -> None:
        rec = HostRec(hello.name, hello.region, hello.node, hello.gpus, hello.engine_host, bus, hello.incarnation)
        rec.running = {r.key: r for r in hello.running}
        cur = self.hosts.get(hello.name)
        if cur is not None and cur.incarnation == hello.incarnation:  # the same worker again: keep what it told
            rec.exited, rec.refused = cur.exited, cur.refused
        self.hosts[hello.name] = rec
        log.info("host %s registered (%s, %s, engine %s, %d servers running)", *attrs.astuple(hello)[:2],
                 hello.node, hello.engine_host, len(hello.running))  # fmt: skip

    def prune(self, name: str) -> list[str]:
        """Stop the servers that host ``name``'s worker listed when it registered and that belong to no
        instance the run keeps (a resumed run's instances it did not adopt, or any on a fresh run): at once,
        not at the end of the worker's grace period. Returns their keys (none while ``wanted`` is unset)."""
        rec = self.hosts.get(name)
        if self.wanted is None or rec is None or not rec.alive:
            return []
        stale = [k for k, r in sorted(rec.running.items()) if not self.wanted(r.instance)]
        for key in stale:
            del rec.running[key]
            self.order(name, StopServer(key, "its instance is not adopted by this kernel"))
            log.info("host %s: stopping %s (its instance is not adopted by this kernel)", name, key)
        return stale

    def keep(self, wanted: Callable[[str], bool]) -> None:
        """The run now knows which instances it keeps: prune every host registered so far."""
        self.wanted = wanted
        for name in sorted(self.hosts):
            self.prune(name)

    def alive(self, name: str) -> bool:
        rec = self.hosts.get(name)
        return rec is not None and rec.alive

    def beat(self, msg: HostBeat) -> bool:
        """A worker's beat; False when the host is not (or no longer) registered here."""
        rec = self.hosts.get(msg.host)
        if rec is None or not rec.alive:
            return False
        rec.running = {r.key: r for r in msg.running}
        return True

    def started(self, msg: ServerStarted) -> None:
        rec = self.hosts.get(msg.host)
        if rec is None:
            return
        if msg.ok:
            rec.running[msg.key] = RunningServer(
                msg.key, msg.key.rsplit(".r", 1)[0], int(msg.key.rsplit(".r", 1)[1]), msg.pid, msg.http_port,
                msg.master_port,
            )  # fmt: skip
        else:
            rec.refused[msg.key] = msg.reason

    def exited(self, msg: ServerExited) -> None:
        rec = self.hosts.get(msg.host)
        if rec is None:
            return
        gone = rec.running.pop(msg.key, None)
        how = f"killed by signal {-msg.code}" if msg.code < 0 else f"exit code {msg.code}"
        pid = f" (pid {gone.pid})" if gone is not None else ""
        rec.exited[msg.key] = f"the vLLM server {msg.key}{pid} on host {msg.host} exited ({how})" + (
            f"; its log ends:\n{msg.tail}" if msg.tail else ""
        )

    def lose(self, name: str, reason: str) -> None:
        rec = self.hosts.get(name)
        if rec is not None and rec.alive:
            rec.alive = False
            rec.lost_reason = reason
            rec.lost_at = time.monotonic()
            log.warning("%s", reason)

    def order(self, host: str, msg: object) -> bool:
        """Send an order to a host's worker; False when it cannot be delivered."""
        if self.send is None or not self.alive(host):
            return False
        self.orders += 1
        try:
            if self.send(self.hosts[host].bus, msg):
                return True
        except Exception as exc:  # the kernel's bus is closed (the run ended): nothing can reach the host
            log.warning("order to host %s not sent: %s", host, exc)
            return False
        # the kernel no longer reaches its worker (gone before the kernel's peer timeout noticed)
        self.lose(host, f"host worker {host} lost (an order could not be delivered)")
        return False


def _set_arg(argv: tuple[str, ...], flag: str, value: str) -> tuple[str, ...]:
    out = list(argv)
    if flag in out:
        out[out.index(flag) + 1] = value
    return tuple(out)


class HostedEngine(VllmEngine):
    """A stage worker's engine whose vLLM server runs on the node's host (see the module docstring)."""

    def __init__(self, backend: VllmBackend, node_id: str, table: HostTable) -> None:
        self._fault = ""
        super().__init__(backend, node_id)
        self.table = table
        self.hosts: list[str] = []  # the host of each launch rank
        self.keys: list[str] = []
        self._followers_started = False
        self._stop_sent = False

    @property
    def fault(self) -> str:
        """Why the engine is broken: its own fault, else a lost host or a server that exited or was refused.

        A lost host, an exit or a refusal is kept as the engine's own fault once seen: the host's record may
        change afterwards (a worker that registers again starts a new record), but the node stays lost. Once
        the engine is stopped or killed, its server's exit and its host's goodbye are what was asked for, not
        faults.
        """
        if self._fault or not self.hosts or self._stopped:
            return self._fault
        for host, key in zip(self.hosts, self.keys, strict=True):
            rec = self.table.hosts.get(host)
            if rec is None:
                return f"host {host} is not registered"  # not kept: a resumed kernel hears from it later
            if not rec.alive:
                self._fault = rec.lost_reason
            elif key in rec.exited:
                self._fault = rec.exited[key]
            elif key in rec.refused:
                self._fault = f"launch refused by host {host}: {rec.refused[key]}"
            if self._fault:
                return self._fault
        return ""

    @fault.setter
    def fault(self, value: str) -> None:
        self._fault = value

    def load(self, stage: StageAssignment, now: float) -> float:
        """Plan the instance over its stages' hosts (waiting up to ``REGISTER_WAIT_S`` for their workers to
        register: a resumed kernel hears from them a few seconds after it starts); the head node's engine
        starts the head server."""
        check_load(self.stage, stage)
        self.stage = stage
        self._started_wall = time.monotonic()
        self._plan()
        return now if self._ready else math.inf

    def _plan(self) -> None:
        stage = self.stage
        assert stage is not None and self.plan is None
        tpl = stage.template
        hosts = self.table.locate(stage.instance) if self.table.locate is not None else []
        if len(hosts) != len(tpl.stages):
            self._set_fault(f"launch refused: instance {stage.instance} has hosts {hosts} for {len(tpl.stages)} stages")
            return
        recs = [self.table.hosts.get(h) for h in hosts]
        for k, (h, rec) in enumerate(zip(hosts, recs, strict=True)):
            if rec is None or not rec.alive:
                if time.monotonic() - self._started_wall > REGISTER_WAIT_S:
                    self._set_fault(f"launch refused: host {h} of stage {k} has no live worker")
                return
            if tpl.stages[k].tp > rec.gpus:
                self._set_fault(
                    f"launch refused: stage {k} of template {tpl.id} needs {tpl.stages[k].tp} GPUs, host {h} has "
                    f"{rec.gpus}"
                )
                return
        live = [r for r in recs if r is not None]
        opts = self.launch_options(stage, 1, 1)
        try:
            plan = launch_plan(tpl, [r.engine_host for r in live], opts)
        except VllmLaunchError as e:
            self._set_fault(f"launch refused: {e}")
            return
        by_engine_host = {r.engine_host: r.name for r in live}
        self.plan = plan
        self.hosts = [by_engine_host[s.host] for s in plan.servers]
        self.keys = [server_key(stage.instance, s.node_rank) for s in plan.servers]
        if not stage.head:
            self._ready = True  # the head node's engine runs the launch and its health
            return
        self._owner = True
        if self.keys[0] not in self.table.hosts[self.hosts[0]].running:
            self._start(0, plan.head, {"--port": "0", "--master-port": "0"})

    def _start(self, rank: int, launch: ServerLaunch, args: dict[str, str]) -> None:
        assert self.stage is not None and self.plan is not None
        b = self.backend
        argv = launch.argv
        for flag, value in args.items():
            argv = _set_arg(argv, flag, value)
        env = {**b.env, **launch.env, "HF_HUB_OFFLINE": b.env.get("HF_HUB_OFFLINE", "1")}
        if b.device == "cpu" and self.plan.nnodes == 1:
            env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        order = StartServer(
            self.keys[rank], self.stage.instance, self.stage.template.model, rank, argv, tuple(sorted(env.items())),
            self.plan.tensor_parallel * self.plan.pipeline_parallel // self.plan.nnodes,
        )  # fmt: skip
        if not self.table.order(self.hosts[rank], order):
            self._set_fault(f"could not send the start of {self.keys[rank]} to host {self.hosts[rank]}")
        log.info("%s: asked host %s to start %s", self.node_id, self.hosts[rank], self.keys[rank])

    def _running(self, rank: int) -> RunningServer | None:
        rec = self.table.hosts.get(self.hosts[rank])
        return None if rec is None else rec.running.get(self.keys[rank])

    def loaded(self, now: float) -> bool:
        """Whether the head server answers ``/health`` (its followers started once the head has its ports)."""
        if self._ready or self.fault:
            return self._ready
        if self.plan is None and self.stage is not None:
            self._plan()
        plan = self.plan
        if plan is None or self._ready:
            return self._ready
        head = self._running(0)
        if head is None:
            self._check_startup()
            return False
        if not self._followers_started:
            self._followers_started = True
            for rank in range(1, plan.nnodes):
                if self._running(rank) is None:
                    self._start(rank, plan.servers[rank], {"--master-port": str(head.master_port)})
        self.endpoint = f"http://{self.table.hosts[self.hosts[0]].engine_host}:{head.http_port}"
        if client.healthy(self.endpoint, api_key=self.api_key):
            self._ready = True
            log.info("%s: server ready at %s", self.node_id, self.endpoint)
        else:
            self._check_startup()
        return self._ready

    def _check_startup(self) -> None:
        if time.monotonic() - self._started_wall > self.backend.startup_timeout_s:
            self._set_fault(f"no /health answer within {self.backend.startup_timeout_s:g} s")

    def stop(self, now: float) -> int:
        """Stop serving; the head node's engine stops every server of the launch, the others their own."""
        n = super().stop(now)
        self._send_stops("stopped")
        return n

    def _send_stops(self, reason: str) -> None:
        if self._stop_sent or not self.keys:
            return
        self._stop_sent = True
        ranks = range(len(self.keys)) if self._owner else [i for i, h in enumerate(self.hosts) if h == self.node_id]
        for rank in ranks:
            self.table.order(self.hosts[rank], StopServer(self.keys[rank], reason))

    def kill(self) -> None:
        self._stopped = True
        self._send_stops("node killed")

    def _set_fault(self, reason: str) -> None:
        self._fault = reason
        log.warning("%s: engine fault: %s", self.node_id, reason)


class HostedFleet(VllmFleet):
    """Makes a ``HostedEngine`` per node (on the registered hosts) and stops their servers at the end."""

    def __init__(self, backend: VllmBackend, table: HostTable) -> None:
        super().__init__(backend)
        self.table = table

    def __call__(self, node_id: str) -> VllmEngine:
        return self.remember(HostedEngine(self.backend, node_id, self.table))

    def close(self) -> int:
        n = 0
        for e in self.engines.values():
            if isinstance(e, HostedEngine) and e.keys and not e._stop_sent:
                n += e.stop(0.0)
        return n + super().close()

    def servers_started(self) -> int:
        return sum(1 for e in self.engines.values() if isinstance(e, HostedEngine) and e._owner)


__all__ = ["HostRec", "HostTable", "HostedEngine", "HostedFleet", "server_key"]
