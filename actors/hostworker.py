"""``coral worker``: the program on a GPU host that runs the vLLM servers the kernel assigns to it.

It connects to the kernel as bus client ``host-NAME@INCARNATION`` (CurveZMQ on tcp, with the client key ``NAME`` of the
key directory) and registers its host with the ``hosts`` actor (``actors.hosts``): name, region, node
type, GPU count and the address its engines listen on. Both sides check the announcement against the
catalog; a refusal ends the program with the kernel's one-line reason.

Orders (``coral.messages.hosts``): ``StartServer`` starts one vLLM server (``coral.vllm.serve``) as a
child in a process group of its own, on the engine address, with free ports it picks where the order
says ``0``, the model's weights (``--weights`` overrides the kernel's path), and the API key derived from
the instance id and the engine secret the host shares with the kernel (so no key crosses the bus); an
order for more GPUs than the host has is refused. ``StopServer`` stops one (SIGTERM to its group, SIGKILL
after ``stop_timeout_s``). Every ``beat_s`` the worker reports the servers it runs (``HostBeat``, a
request: the answer says whether the kernel still knows the host) and any server that ended by itself
(``ServerExited``).

Kernel loss: a beat without an answer within ``beat_timeout_s`` means the kernel is gone. The servers keep
serving; the worker reconnects every ``retry_s`` and registers again, listing the servers it still runs,
which a resumed kernel adopts. After ``grace_s`` without a kernel it stops them (and keeps trying). A
server notices its worker's death by itself (``CORAL_VLLM_PARENT``) and stops, so a ``kill -9`` of the
worker leaves nothing running; the kernel sees the host's bus connection go silent and loses its node.
SIGTERM or SIGINT stops every server and says goodbye.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import time
from collections.abc import Mapping
from pathlib import Path

import anyio
import attrs

from coral.errors import CoralError
from coral.kernel import BusClient, BusError, ClientKeys, Endpoints, RequestError
from coral.messages.hosts import (
    HOSTS,
    HostBeat,
    RunningServer,
    ServerExited,
    ServerStarted,
    StartServer,
    StopServer,
    WorkerHello,
    WorkerWelcome,
    host_bus_name,
)
from coral.vllm.engine import ServerProcess, free_port
from coral.vllm.launch import API_KEY_ENV, engine_key

log = logging.getLogger("coral.worker")


@attrs.frozen
class WorkerConfig:
    """Who the host is, where the kernel is, and how the worker behaves."""

    name: str
    region: str
    node: str
    gpus: int
    engine_host: str
    endpoints: Endpoints
    curve: ClientKeys | None = None
    secret: bytes = attrs.field(default=b"", repr=False)
    work_dir: Path = Path(".coral-worker")
    weights: Mapping[str, str] = attrs.field(factory=dict)
    grace_s: float = 60.0
    beat_s: float = 1.0
    beat_timeout_s: float = 3.0
    retry_s: float = 1.0
    connect_timeout_s: float = 10.0
    stop_timeout_s: float = 30.0


@attrs.define
class _Running:
    info: RunningServer
    proc: ServerProcess
    reported: bool = False


class KernelLost(Exception):
    """The kernel stopped answering (internal: the worker reconnects)."""


class HostWorker:
    """The host worker (see the module docstring)."""

    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        self.incarnation = secrets.token_hex(8)
        self.servers: dict[str, _Running] = {}
        self.registrations = 0
        self.lost_at: float | None = None

    # -- the connection ------------------------------------------------------------------------------

    async def run(self, stop: anyio.Event) -> None:
        """Register, take orders, reconnect after a kernel loss, until ``stop``; raises ``CoralError`` when the
        first connection fails or the kernel refuses the host."""
        cfg = self.cfg
        try:
            while not stop.is_set():
                try:
                    async with BusClient(
                        host_bus_name(cfg.name, self.incarnation),
                        cfg.endpoints,
                        curve=cfg.curve,
                        handshake_timeout=cfg.connect_timeout_s if self.registrations == 0 else cfg.retry_s + 2.0,
                    ) as bus:
                        await self._register(bus)
                        await self._session(bus, stop)
                except (BusError, KernelLost) as exc:
                    if self.registrations == 0:
                        raise CoralError(
                            f"--kernel: cannot reach the kernel at {cfg.endpoints.router}: {exc}"
                        ) from None
                    if self.lost_at is None:
                        self.lost_at = time.monotonic()
                        log.warning("kernel lost (%s); the servers keep serving for %g s", exc, cfg.grace_s)
                    if self.servers and time.monotonic() - self.lost_at > cfg.grace_s:
                        log.warning("no kernel for %g s: stopping %d servers", cfg.grace_s, len(self.servers))
                        await self._stop_all("grace period over")
                    with anyio.move_on_after(cfg.retry_s):
                        await stop.wait()
        finally:
            with anyio.CancelScope(shield=True):
                await self._stop_all("worker stopping")

    async def _register(self, bus: BusClient) -> None:
        cfg = self.cfg
        hello = WorkerHello(
            cfg.name, cfg.region, cfg.node, cfg.gpus, cfg.engine_host, self.incarnation, self._running()
        )
        deadline = time.monotonic() + cfg.connect_timeout_s
        while True:
            try:
                reply = await bus.request(HOSTS, hello, timeout=cfg.connect_timeout_s)
                break
            except RequestError:  # no registry (yet: a kernel spawns it just after its bus is up)
                if time.monotonic() > deadline:
                    raise CoralError(
                        f"--kernel: the kernel at {cfg.endpoints.router} takes no workers (no host registry: start "
                        "it with `coral up --backend vllm --hosts FILE`)"
                    ) from None
                await anyio.sleep(cfg.retry_s)
            except BusError as exc:
                raise KernelLost(str(exc)) from None
        if not isinstance(reply, WorkerWelcome) or not reply.ok:
            why = reply.reason if isinstance(reply, WorkerWelcome) else f"unexpected reply {type(reply).__name__}"
            raise CoralError(f"refused by the kernel at {cfg.endpoints.router}: {why}")
        self.registrations += 1
        self.lost_at = None
        log.info("registered with %s as %s (%d servers running)", cfg.endpoints.router, cfg.name, len(self.servers))

    async def _session(self, bus: BusClient, stop: anyio.Event) -> None:
        lost: list[str] = []
        async with anyio.create_task_group() as tg:

            async def beats() -> None:
                while True:
                    await anyio.sleep(self.cfg.beat_s)
                    await self._report_exits(bus)
                    try:
                        reply = await bus.request(
                            HOSTS, HostBeat(self.cfg.name, self._running()), timeout=self.cfg.beat_timeout_s
                        )
                    except BusError as exc:
                        lost.append(f"no answer to a beat: {exc}")
                        tg.cancel_scope.cancel()
                        return
                    if isinstance(reply, WorkerWelcome) and not reply.ok:
                        lost.append(f"the kernel does not know this host any more ({reply.reason})")
                        tg.cancel_scope.cancel()
                        return

            async def orders() -> None:
                async for env in bus:
                    if isinstance(env.msg, StartServer):
                        await bus.send(HOSTS, self._start(env.msg))
                    elif isinstance(env.msg, StopServer):
                        await self._stop(env.msg.key, env.msg.reason)

            async def stopper() -> None:
                await stop.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(beats)
            tg.start_soon(orders)
            tg.start_soon(stopper)
        if lost and not stop.is_set():
            raise KernelLost(lost[0])

    # -- the servers ----------------------------------------------------------------------------------

    def _running(self) -> tuple[RunningServer, ...]:
        return tuple(r.info for _, r in sorted(self.servers.items()) if r.proc.exit_code() is None)

    def _start(self, order: StartServer) -> ServerStarted:
        cfg = self.cfg
        cur = self.servers.get(order.key)
        if cur is not None and cur.proc.exit_code() is None:
            got = cur.info
            return ServerStarted(cfg.name, order.key, True, got.pid, got.http_port, got.master_port)
        if order.gpus > cfg.gpus:
            reason = f"the server needs {order.gpus} GPUs, host {cfg.name} ({cfg.node}) has {cfg.gpus}"
            log.warning("refused %s: %s", order.key, reason)
            return ServerStarted(cfg.name, order.key, False, reason=reason)
        argv = list(order.argv)
        ports = {"--port": 0, "--master-port": 0}
        for flag in ports:
            if flag in argv:
                i = argv.index(flag) + 1
                if argv[i] == "0":
                    argv[i] = str(free_port(cfg.engine_host))
                ports[flag] = int(argv[i])
        if "--host" in argv:
            argv[argv.index("--host") + 1] = cfg.engine_host
        if "--model" in argv and order.model in cfg.weights:
            argv[argv.index("--model") + 1] = cfg.weights[order.model]
        env = dict(order.env)
        if cfg.secret and "--headless" not in argv:
            env[API_KEY_ENV] = engine_key(cfg.secret, order.instance)
        log_path = cfg.work_dir / "logs" / f"{order.key}-{cfg.name}-{os.getpid()}.log"
        try:
            proc = ServerProcess(argv, env, log_path, str(cfg.work_dir))
        except OSError as exc:
            return ServerStarted(cfg.name, order.key, False, reason=f"cannot start the server: {exc}")
        http = ports["--port"] if "--headless" not in argv else 0
        info = RunningServer(order.key, order.instance, order.rank, proc.pid, http, ports["--master-port"])
        self.servers[order.key] = _Running(info, proc)
        log.info("started %s (pid %d, port %d, master port %d), log %s", order.key, proc.pid, http,
                 info.master_port, log_path)  # fmt: skip
        return ServerStarted(cfg.name, order.key, True, proc.pid, http, info.master_port)

    async def _stop(self, key: str, reason: str) -> None:
        run = self.servers.pop(key, None)
        if run is None:
            return
        log.info("stopping %s (%s)", key, reason)
        await anyio.to_thread.run_sync(run.proc.stop, self.cfg.stop_timeout_s)

    async def _stop_all(self, reason: str) -> None:
        for key in sorted(self.servers):
            await self._stop(key, reason)

    async def _report_exits(self, bus: BusClient) -> None:
        for key, run in sorted(self.servers.items()):
            code = run.proc.exit_code()
            if code is None or run.reported:
                continue
            run.reported = True
            log.warning("server %s exited (%s)", key, code)
            with contextlib.suppress(BusError):
                await bus.send(HOSTS, ServerExited(self.cfg.name, key, code, run.proc.tail()))
            del self.servers[key]
            with contextlib.suppress(OSError):
                run.proc.stop(0.0)


__all__ = ["HostWorker", "KernelLost", "WorkerConfig"]
