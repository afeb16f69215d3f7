"""``coral up --backend vllm`` without ``--hosts``: the run's machine is this one, served by local ``coral worker``s.

``coral up`` starts them itself, so one code path (the host registry, ``coral.vllm.hosted``) serves one
machine and many. The hosts are those the scenario's offers hold at its start: each (region, node type)
pair up to its availability, named ``coral-local-K`` (a name ``--hosts`` files may not use), each with a
``coral worker`` child whose engine address is loopback (127.0.0.1). Keys are handled as for remote
workers: with a key directory (``--keys`` or ``$CORAL_KEYS``) the bus is CurveZMQ, each local worker has a
client key of its name (added to the directory when missing) and the servers' API keys derive from the
directory's engine secret; without one, the kernel listens on loopback in plaintext (as it may) and the
workers get the run's random engine secret in their environment (``CORAL_ENGINE_SECRET``), so every server
still requires its API key. A local worker exits, stopping its servers, when ``coral up`` dies
(``CORAL_WORKER_PARENT``). At the end of the run the engines' stop orders stop the servers; then each
worker gets SIGTERM (it stops whatever is left and says goodbye) and SIGKILL if it outlives ``stop_s``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

from coral.catalog.types import Catalog
from coral.errors import CoralError
from coral.kernel import Endpoints
from coral.kernel.keys import CLIENTS, add_client
from coral.messages.mesh import Host
from coral.scenario import Scenario

log = logging.getLogger("coral.vllm")
LOCAL_PREFIX = "coral-local-"
"""The names of a local run's hosts (``coral up`` refuses them in a ``--hosts`` file)."""
MAX_LOCAL_HOSTS = 64
PARENT_ENV = "CORAL_WORKER_PARENT"
SECRET_ENV = "CORAL_ENGINE_SECRET"


def local_hosts(sc: Scenario, cat: Catalog) -> tuple[Host, ...]:
    """One host per node the scenario's offers hold at its start (see the module docstring)."""
    _, avail = sc.market_at(cat, 0.0)
    hosts: list[Host] = []
    for (region, node), n in sorted(avail.items()):
        for _ in range(max(0, n)):
            hosts.append(Host(f"{LOCAL_PREFIX}{len(hosts) + 1}", region, node))
            if len(hosts) > MAX_LOCAL_HOSTS:
                raise CoralError(
                    f"--backend vllm: the scenario's offers hold more than {MAX_LOCAL_HOSTS} nodes at its start; "
                    "on one machine give the hosts to use with --hosts FILE"
                )
    if not hosts:
        raise CoralError("--backend vllm: the scenario's offers hold no node at its start; give --hosts FILE")
    return tuple(hosts)


def is_local(hosts: Sequence[Host]) -> bool:
    """Whether these are a local run's hosts (``local_hosts``)."""
    return bool(hosts) and all(h.name.startswith(LOCAL_PREFIX) for h in hosts)


@attrs.define
class LocalWorkers:
    """The ``coral worker`` children of a local run (see the module docstring)."""

    hosts: tuple[Host, ...]
    catalog_files: tuple[str, ...]
    work_dir: Path
    keys: Path | None
    secret: bytes = attrs.field(repr=False)
    gpus: dict[str, int]
    stop_s: float = 60.0
    procs: dict[str, subprocess.Popen[bytes]] = attrs.field(factory=dict)

    def check_keys(self) -> None:
        """Add the client key of each local worker that the key directory lacks."""
        if self.keys is None:
            return
        for h in self.hosts:
            if not (self.keys / CLIENTS / f"{h.name}.key_secret").exists():
                add_client(self.keys, h.name)
                log.info("added the client key %s to %s for a local worker", h.name, self.keys)

    def start(self, endpoints: Endpoints) -> None:
        """Start one worker per host against the kernel at ``endpoints`` (tcp)."""
        env = {**os.environ, PARENT_ENV: str(os.getpid())}
        env.pop(SECRET_ENV, None)
        if self.keys is None:
            env[SECRET_ENV] = self.secret.hex()
        root = str(Path(__file__).resolve().parents[2])  # the workers import this checkout's coral
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        (self.work_dir / "workers").mkdir(parents=True, exist_ok=True)
        for h in self.hosts:
            cmd = [sys.executable, "-c", "import sys; from coral.cli import main; sys.exit(main())", "worker"]
            cmd += ["--kernel", endpoints.router, "--name", h.name, "--region", h.region, "--node", h.node]
            cmd += ["--gpus", str(self.gpus[h.node]), "--engine-host", "127.0.0.1"]
            cmd += ["--work-dir", str(self.work_dir / "workers" / h.name), "--connect-timeout", "120s"]
            for f in self.catalog_files:
                cmd += ["--catalog", f]
            if self.keys is not None:
                cmd += ["--keys", str(self.keys)]
            with (self.work_dir / "workers" / f"{h.name}.log").open("ab") as out:
                # its own session: a Ctrl-C reaches coral up alone, which stops the workers in order
                self.procs[h.name] = subprocess.Popen(
                    cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            log.info("local worker %s started (pid %d)", h.name, self.procs[h.name].pid)

    def stop(self) -> None:
        """SIGTERM to every worker, then wait (SIGKILL after ``stop_s``): none is left behind."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_s
        for name, p in sorted(self.procs.items()):
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("local worker %s did not stop within %g s: killed", name, self.stop_s)
                p.kill()
                p.wait()


__all__ = ["LOCAL_PREFIX", "LocalWorkers", "is_local", "local_hosts"]
