"""``coral worker`` against a kernel with a host registry: registration and every refusal, on both sides.

The kernel (a ``Mesh`` with the ``HostRegistry``, CURVE on tcp) runs in the test; each worker is a real
``coral worker`` process. Refused locally (before connecting): a node type not in the catalog, a GPU count
that is not the node type's, an engine address off loopback without keys. Refused by the kernel (the
worker's catalog differs): a node type the kernel's catalog lacks, a GPU count that is not its node
type's, a host outside the ``--hosts`` list, a duplicate name. Unreachable: a port where no kernel
listens, and a keyless worker against a keyed kernel (which publishes the refusal). A start order for more
GPUs than the host has is refused by the worker, and a template stage that needs more GPUs than its host
by the kernel's engine.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import attrs
import pytest

from actors.hosts import HostRegistry
from coral.catalog import load_catalog
from coral.engines import StageAssignment
from coral.kernel import AuthRefused, BusClient, Endpoints, Mesh
from coral.kernel.keys import add_client, init_keys, server_keys
from coral.messages.hosts import HOSTS, StartServer
from coral.messages.mesh import Host
from coral.vllm.engine import VllmBackend, free_port
from coral.vllm.hosted import HostedEngine, HostTable
from coral.vllm.tiny import TINY_MODEL, chain_template, deployment_for
from tests.conftest import ROOT, kernel_port

pytestmark = pytest.mark.slow

CATALOG = ROOT / "fixtures" / "catalog" / "tiny-cpu.toml"
HOSTS_LIST = {f"h{i}": Host(f"h{i}", "local", "cpu-local") for i in (1, 2)}


@attrs.frozen
class Kernel:
    endpoints: Endpoints
    keys: Path
    table: HostTable
    mesh: Mesh
    watch: BusClient

    def refused(self) -> list[AuthRefused]:
        """The kernel's published refusals so far."""
        out: list[AuthRefused] = []
        while True:
            try:
                env = self.watch.receive_nowait()
            except anyio.WouldBlock:
                return out
            if isinstance(env.msg, AuthRefused):
                out.append(env.msg)


@contextlib.asynccontextmanager
async def running_kernel(
    tmp_path: Path, port: int = 0, wanted: Callable[[str], bool] | None = None
) -> AsyncIterator[Kernel]:
    """The kernel with its host registry, inside the test (a mesh's task group never crosses a fixture);
    ``wanted``: the instances it keeps (as a resumed run does once it has adopted)."""
    keys = tmp_path / "keys"
    if not keys.exists():
        init_keys(keys)
        for name in ("h1", "h2", "h9", "odd"):
            add_client(keys, name)
    table = HostTable()
    table.wanted = wanted
    port = port or kernel_port()
    eps = Endpoints(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}")
    async with Mesh(endpoints=eps, curve=server_keys(keys), peer_timeout=3.0) as mesh:
        table.send = lambda dest, msg: mesh.send(dest, msg, source=HOSTS)
        table.locate = lambda _iid: ["h1"]
        await mesh.spawn(HostRegistry(table, load_catalog([CATALOG]), HOSTS_LIST))
        watch = await mesh.client("watch", subscribe=["kernel.auth."])
        yield Kernel(mesh.endpoints, keys, table, mesh, watch)


def worker(
    k: Kernel | None, *args: str, name: str = "h1", keys: bool = True, kernel: str = ""
) -> subprocess.Popen[str]:
    cmd = worker_argv(k, *args, name=name, keys=keys, kernel=kernel)
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def worker_argv(k: Kernel | None, *args: str, name: str = "h1", keys: bool = True, kernel: str = "") -> list[str]:
    cmd = [sys.executable, "-c", "import sys; from coral.cli import main; sys.exit(main())", "worker"]
    cmd += ["--kernel", kernel or (k.endpoints.router if k else ""), "--name", name, "--region", "local"]
    if keys and k is not None:
        cmd += ["--keys", str(k.keys)]
    if "--node" not in args:
        cmd += ["--node", "cpu-local"]
    if "--gpus" not in args:
        cmd += ["--gpus", "1"]
    cmd += ["--catalog", str(CATALOG), "--connect-timeout", "20s", *args]
    return cmd


async def ends(p: subprocess.Popen[str], timeout: float = 120.0) -> tuple[int, str]:
    """Wait (without blocking the kernel's loop) for ``p`` to end; its status and last stderr line."""
    deadline = time.monotonic() + timeout
    while p.poll() is None and time.monotonic() < deadline:
        await anyio.sleep(0.2)
    if p.poll() is None:
        p.kill()
    _, err = p.communicate()
    return p.returncode, (err.strip().splitlines() or [""])[-1]


async def registered(k: Kernel, name: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not k.table.alive(name):
        assert time.monotonic() < deadline, f"{name} never registered"
        await anyio.sleep(0.2)


async def stop(p: subprocess.Popen[str]) -> tuple[int, str]:
    p.terminate()
    return await ends(p, 60.0)


async def test_refused_locally_before_connecting(tmp_path: Path) -> None:
    k = None
    rc, line = await ends(worker(k, "--node", "dgx-9000", kernel="tcp://127.0.0.1:9"))
    assert rc == 2 and line == "coral: error: --node: node type 'dgx-9000' is not in the catalog"
    rc, line = await ends(worker(k, "--gpus", "2", kernel="tcp://127.0.0.1:9"))
    assert rc == 2 and line == (
        "coral: error: --gpus: node type 'cpu-local' has 1 GPU(s) of cpu-avx512, the worker announced 2"
    )
    rc, line = await ends(worker(k, "--engine-host", "10.1.2.3", kernel="tcp://127.0.0.1:9", keys=False))
    assert rc == 2 and line.startswith("coral: error: --engine-host: 10.1.2.3 is reachable from other machines")
    rc, line = await ends(worker(k, kernel="tcp://10.1.2.3:7450", keys=False))
    assert rc == 2 and line.startswith("coral: error: --kernel: tcp://10.1.2.3:7450 is reachable from other machines")


async def test_unreachable_kernel_and_keyless_worker_are_refused(tmp_path: Path) -> None:
    async with running_kernel(tmp_path) as kernel:
        nobody = f"tcp://127.0.0.1:{free_port()}"
        rc, line = await ends(worker(kernel, "--connect-timeout", "2s", kernel=nobody))
        assert rc == 2 and line.startswith(f"coral: error: --kernel: cannot reach the kernel at {nobody}: ")
        rc, line = await ends(worker(kernel, "--connect-timeout", "3s", keys=False))
        assert rc == 2 and "a kernel with keys refuses plaintext clients" in line
        assert kernel.refused() and not kernel.table.hosts  # the kernel side: published, nothing registered


async def test_kernel_refuses_what_its_catalog_or_hosts_list_does_not_allow(tmp_path: Path) -> None:
    async with running_kernel(tmp_path) as kernel:
        other = tmp_path / "other.toml"  # the worker's catalog: a node type the kernel lacks, cpu-local with 2 GPUs
        other.write_text(
            '[[node]]\nname = "cpu-big"\ncloud = "local"\ngpu = "cpu-avx512"\ngpu_count = 1\nnic_gbps = 10\n'
            'intra_link = "pcie"\nintra_link_gbs = 16\ndisk_gbs = 1.0\nsource = "test"\n'
        )
        rc, line = await ends(worker(kernel, "--catalog", str(other), "--node", "cpu-big"))
        at = kernel.endpoints.router
        assert rc == 2 and line.endswith(f"refused by the kernel at {at}: node type 'cpu-big' is not in the catalog")
        two = tmp_path / "two.toml"
        two.write_text('[[node]]\nname = "cpu-local"\nextend = true\ngpu_count = 2\n')
        rc, line = await ends(worker(kernel, "--catalog", str(two), "--gpus", "2"))
        assert rc == 2 and line.endswith(
            "gpus: node type 'cpu-local' has 1 GPU(s) of cpu-avx512, the worker announced 2"
        ), line
        rc, line = await ends(worker(kernel, name="h9"))
        assert rc == 2 and line.endswith("name: host 'h9' is not in the --hosts file (h1, h2)")
        assert not kernel.table.hosts


async def test_registration_duplicate_and_a_start_beyond_the_hosts_gpus(tmp_path: Path) -> None:
    async with running_kernel(tmp_path) as kernel:
        first = worker(kernel, "--work-dir", str(tmp_path / "w1"))
        try:
            await registered(kernel, "h1")
            rec = kernel.table.hosts["h1"]
            assert (rec.region, rec.node, rec.gpus, rec.engine_host) == ("local", "cpu-local", 1, "127.0.0.1")
            rc, line = await ends(worker(kernel, "--work-dir", str(tmp_path / "w2")))
            assert rc == 2 and line.endswith(
                "name: a worker named 'h1' is already registered (engine address 127.0.0.1)"
            )
            assert kernel.table.alive("h1") and first.poll() is None  # the first one is untouched
            # the worker refuses an order for more GPUs than it has
            order = StartServer("i1.r0", "i1", TINY_MODEL, 0, ("-c", "pass"), (), 2)
            assert kernel.mesh.send(rec.bus, order, source=HOSTS)
            deadline = time.monotonic() + 60
            while "i1.r0" not in rec.refused:
                assert time.monotonic() < deadline
                await anyio.sleep(0.2)
            assert rec.refused["i1.r0"] == "the server needs 2 GPUs, host h1 (cpu-local) has 1"
            # the kernel's engine refuses a stage that needs more GPUs than its host
            tpl = chain_template(TINY_MODEL, [4])
            tpl = attrs.evolve(tpl, stages=(attrs.evolve(tpl.stages[0], tp=2),))
            engine = HostedEngine(VllmBackend({TINY_MODEL: "/nowhere"}, device="cpu"), "h1", kernel.table)
            engine.load(StageAssignment("i2", deployment_for(tpl, "tiny"), tpl, 0, "local", True), 0.0)
            assert engine.fault == f"launch refused: stage 0 of template {tpl.id} needs 2 GPUs, host h1 has 1"
            assert "i2.r0" not in rec.running and "i2.r0" not in rec.refused  # nothing was sent
        finally:
            rc, line = await stop(first)
        assert rc == 0, line
        deadline = time.monotonic() + 30
        while kernel.table.alive("h1"):  # its goodbye: the host is lost at once
            assert time.monotonic() < deadline
            await anyio.sleep(0.2)
        assert kernel.table.hosts["h1"].lost_reason.startswith("host worker h1 lost (left")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def test_a_new_kernel_stops_at_once_the_servers_of_instances_it_does_not_keep(tmp_path: Path) -> None:
    """A worker outlives its kernel with two servers (plain processes stand in for vLLM: what is tested is
    who stops them, and when); the next kernel on the same address keeps one instance (a resumed run's
    adoption) and stops the other's server as soon as the worker registers, long before the grace period."""
    port = kernel_port()
    sleeper = ("-c", "import time; time.sleep(900)")
    async with running_kernel(tmp_path, port) as kernel:
        w = worker(kernel, "--work-dir", str(tmp_path / "w1"), "--grace", "600s")
        await registered(kernel, "h1")
        rec = kernel.table.hosts["h1"]
        for iid in ("i7", "i8"):
            assert kernel.mesh.send(rec.bus, StartServer(f"{iid}.r0", iid, TINY_MODEL, 0, sleeper, (), 1), source=HOSTS)
        deadline = time.monotonic() + 60
        while set(rec.running) != {"i7.r0", "i8.r0"}:
            assert time.monotonic() < deadline, rec.running
            await anyio.sleep(0.2)
        pids = {k: r.pid for k, r in rec.running.items()}
    try:
        assert all(alive(p) for p in pids.values())  # the kernel is gone; the servers keep running
        async with running_kernel(tmp_path, port, wanted=lambda iid: iid == "i7") as kernel:
            await registered(kernel, "h1", 60.0)
            t0 = time.monotonic()
            while alive(pids["i8.r0"]):
                assert time.monotonic() - t0 < 30, "the server of the instance not kept still runs"
                await anyio.sleep(0.2)
            assert alive(pids["i7.r0"]) and set(kernel.table.hosts["h1"].running) == {"i7.r0"}
            await anyio.sleep(2.5)  # the worker's next beats agree
            assert set(kernel.table.hosts["h1"].running) == {"i7.r0"}
    finally:
        rc, line = await stop(w)
    assert rc == 0, line
    assert not any(alive(p) for p in pids.values())  # a stopped worker stops every server


def children(parent: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                out.append(int(d.name))
        except OSError:
            continue
    return out


async def test_a_local_worker_stops_its_servers_and_exits_when_its_coral_up_dies(tmp_path: Path) -> None:
    """A local worker of ``coral up --backend vllm`` watches the process that started it
    (``CORAL_WORKER_PARENT``); a shell stands in for ``coral up`` and is killed with SIGKILL."""
    sleeper = ("-c", "import time; time.sleep(900)")
    async with running_kernel(tmp_path) as kernel:
        argv = worker_argv(kernel, "--work-dir", str(tmp_path / "w1"), "--grace", "600s")
        shell = subprocess.Popen(["bash", "-c", 'CORAL_WORKER_PARENT=$$ "$@" & wait', "bash", *argv], cwd=ROOT)
        try:
            await registered(kernel, "h1")
            rec = kernel.table.hosts["h1"]
            assert kernel.mesh.send(rec.bus, StartServer("i1.r0", "i1", TINY_MODEL, 0, sleeper, (), 1), source=HOSTS)
            deadline = time.monotonic() + 60
            while "i1.r0" not in rec.running:
                assert time.monotonic() < deadline
                await anyio.sleep(0.2)
            server = rec.running["i1.r0"].pid
            (pid,) = [p for p in children(shell.pid) if p != server]
            shell.kill()
            shell.wait()
            deadline = time.monotonic() + 60
            while kernel.table.alive("h1") or alive(server) or alive(pid):
                assert time.monotonic() < deadline, "the orphaned worker or its server still runs"
                await anyio.sleep(0.2)
            assert rec.lost_reason.startswith("host worker h1 lost (left")  # it said goodbye
        finally:
            if shell.poll() is None:
                shell.kill()
                shell.wait()
