"""Host-worker protocol: ``coral worker`` (a program on each GPU host) and the kernel's host registry.

A host worker connects to the kernel as bus client ``host-NAME@INCARNATION`` and registers with the ``hosts`` actor:

- ``WorkerHello`` (request, worker -> ``hosts``): its name, region, node type, GPU count, the address its
  engines listen on, a token that is new for every start of the program (``incarnation``), and the vLLM
  servers it still runs (``running``: after a kernel restart, for the resumed kernel to adopt);
- ``WorkerWelcome`` (the reply): accepted, or refused with a one-line reason naming the field.

Then (directed): ``StartServer`` and ``StopServer`` (``hosts`` -> worker); ``ServerStarted``,
``ServerExited`` and ``HostBeat`` (worker -> ``hosts``, one beat a second with its servers). No key
crosses the bus: a server's API key is derived on the host from the instance id and the engine secret
that the host and the kernel share (``coral.kernel.keys.engine_secret``).
"""

from __future__ import annotations

import attrs

from coral.kernel import message

HOSTS = "hosts"
"""The actor name of the kernel's host registry."""
HOST_PREFIX = "host-"
"""A host worker's bus name is ``host-NAME``."""


def host_bus_name(name: str, incarnation: str) -> str:
    """The bus name of host ``name``'s worker (``host-NAME@INCARNATION``: a second worker under the same name
    never takes over the first one's connection)."""
    return f"{HOST_PREFIX}{name}@{incarnation}"


@attrs.frozen
class RunningServer:
    """A vLLM server a host worker runs: ``key`` is ``INSTANCE.rRANK``."""

    key: str
    instance: str
    rank: int
    pid: int
    http_port: int = 0
    master_port: int = 0


@message("host.hello")
@attrs.frozen
class WorkerHello:
    """Worker -> ``hosts`` (a request): register this host."""

    name: str
    region: str
    node: str
    gpus: int
    engine_host: str
    incarnation: str
    running: tuple[RunningServer, ...] = ()


@message("host.welcome")
@attrs.frozen
class WorkerWelcome:
    """``hosts`` -> worker: the answer to ``WorkerHello`` (``ok``, else ``reason`` says why not)."""

    name: str
    ok: bool
    reason: str = ""


@message("host.start")
@attrs.frozen
class StartServer:
    """``hosts`` -> worker: start one vLLM server of an instance (rank ``rank`` of its multi-node launch).

    ``argv`` runs after the interpreter; the worker sets ``--host`` to its engine address and, where they
    are ``0``, ``--port`` and ``--master-port`` to free ports, and reports them in ``ServerStarted``.
    ``gpus``: the GPUs the server needs on this host."""

    key: str
    instance: str
    model: str
    rank: int
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    gpus: int


@message("host.started")
@attrs.frozen
class ServerStarted:
    """Worker -> ``hosts``: a server started (its pid and ports), or was refused (``reason``)."""

    host: str
    key: str
    ok: bool
    pid: int = 0
    http_port: int = 0
    master_port: int = 0
    reason: str = ""


@message("host.stop")
@attrs.frozen
class StopServer:
    """``hosts`` -> worker: stop a server (SIGTERM to its process group, SIGKILL after a timeout)."""

    key: str
    reason: str = ""


@message("host.exited")
@attrs.frozen
class ServerExited:
    """Worker -> ``hosts``: a server ended without being told to (``code``: exit status, negative for a
    signal); ``tail`` is the end of its log."""

    host: str
    key: str
    code: int
    tail: str = ""


@message("host.beat")
@attrs.frozen
class HostBeat:
    """Worker -> ``hosts``, every second: the servers it runs."""

    host: str
    running: tuple[RunningServer, ...] = ()


__all__ = [
    "HOSTS",
    "HOST_PREFIX",
    "HostBeat",
    "RunningServer",
    "ServerExited",
    "ServerStarted",
    "StartServer",
    "StopServer",
    "WorkerHello",
    "WorkerWelcome",
    "host_bus_name",
]
