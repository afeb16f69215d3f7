"""``coral worker`` with real vLLM: three worker processes on 127.0.0.2/.3/.4 and a kernel with keys.

- A template that spans two workers (a 2-stage pipeline, layers 1 + 3): vLLM's multi-node launch, the head
  on one host and the headless follower on the other, started by the kernel's engines in that order; its
  greedy tokens equal transformers'; stopping it stops both servers.
- ``coral up --backend vllm --hosts FILE`` on the tiny-cpu trace with three registered workers: kill -9 of
  a busy worker (its node is lost, the router retries what it held, the plan's instance is replaced on the
  spare host), then kill -9 of ``coral up`` itself and ``coral up --resume``: the workers reconnect and the
  running engines are adopted, not restarted (the servers of instances it does not adopt stop at once);
  the resumed run completes requests, and once it does it is stopped early (SIGTERM): every request ends
  completed or failed with a reason, also those still open then. Between the two, an OpenAI-compatible
  request to ``coral up --gateway`` reaches a worker's engine and returns transformers' greedy tokens.

The fault figures (time to detect the lost worker, time until a replacement serves, requests retried and
failed, with the load) are printed; run with ``-s`` to see them.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import anyio
import attrs
import pytest

from actors.hosts import HostRegistry
from coral.catalog import load_catalog
from coral.engines import StageAssignment
from coral.kernel import Endpoints, Mesh, read_journal
from coral.kernel.keys import add_client, init_keys, server_keys
from coral.messages import FleetAction, NodeLost, RoutingStats
from coral.messages.hosts import HOSTS
from coral.messages.mesh import Host, MeshResumed
from coral.vllm import client
from coral.vllm.engine import free_port
from coral.vllm.hosted import HostedEngine, HostTable
from coral.vllm.tiny import TINY_MODEL, chain_template, deployment_for
from tests.conftest import ROOT, kernel_port
from tests.vllm.conftest import (
    CATALOG,
    N_TOKENS,
    PROMPTS,
    VLLM_MESH_GROUP,
    cpu_backend,
    reference_tokens,
    steady_scenario,
    work_dir,
)

# in the group of the `coral up` real-vLLM tests (``VLLM_MESH_GROUP``), after test_up, whose server has then
# filled the run's vLLM cache (a server that starts on an empty one runs vLLM's registry in one more process)
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.xdist_group(VLLM_MESH_GROUP)]

CLI = [sys.executable, "-c", "import sys; from coral.cli import main; sys.exit(main())"]


def start_worker(name: str, addr: str, kernel: str, keys: Path, work: Path, model: Path) -> subprocess.Popen[str]:
    cmd = [*CLI, "worker", "--kernel", kernel, "--name", name, "--region", "local", "--node", "cpu-local"]
    cmd += ["--gpus", "1", "--engine-host", addr, "--keys", str(keys), "--catalog", str(CATALOG)]
    cmd += ["--weights", f"{TINY_MODEL}={model}", "--work-dir", str(work / name), "--connect-timeout", "600s"]
    cmd += ["--grace", "600s"]
    log = (work / f"{name}.log").open("a")
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)


def end(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(120)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def servers_of(parent: int) -> list[int]:
    """Pids of the vLLM servers whose parent is ``parent``."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"coral.vllm.serve" in cmd:
            out.append(int(d.name))
    return out


@pytest.fixture
def keys(tmp_path: Path) -> Iterator[Path]:
    d = init_keys(tmp_path / "keys")
    for name in ("h2", "h3", "h4"):
        add_client(d, name)
    yield d


async def test_a_template_across_two_workers_gives_transformers_tokens(
    tiny_model: Path, vllm_cache: Path, keys: Path, tmp_path: Path
) -> None:
    table = HostTable()
    port = kernel_port()
    eps = Endpoints(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}")
    hosts = {n: Host(n, "local", "cpu-local") for n in ("h2", "h3")}
    backend = cpu_backend(tiny_model, work_dir(tmp_path / "vllm", vllm_cache))
    from coral.kernel.keys import engine_secret

    backend = attrs.evolve(backend, engine_secret=engine_secret(keys), cpu_cores=2, startup_timeout_s=1500.0)
    procs = [start_worker(n, f"127.0.0.{n[1]}", eps.router, keys, tmp_path, tiny_model) for n in hosts]
    try:
        async with Mesh(endpoints=eps, curve=server_keys(keys)) as mesh:
            table.send = lambda dest, msg: mesh.send(dest, msg, source=HOSTS)
            table.locate = lambda _iid: ["h2", "h3"]
            await mesh.spawn(HostRegistry(table, load_catalog([CATALOG]), hosts))
            deadline = time.monotonic() + 300
            while not all(table.alive(n) for n in hosts):
                assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
                await anyio.sleep(0.5)
            tpl = chain_template(TINY_MODEL, [1, 3])
            dep = deployment_for(tpl, "tiny")
            engines = [HostedEngine(backend, h, table) for h in hosts]
            for k, e in enumerate(engines):
                e.load(StageAssignment("p1", dep, tpl, k, "local", k == 0), 0.0)
            assert engines[0].plan is not None and engines[0].plan.nnodes == 2
            deadline = time.monotonic() + 1500
            while not all(e.loaded(0.0) for e in engines):
                assert not engines[0].fault, engines[0].fault
                assert time.monotonic() < deadline, "the two-host pipeline never answered /health"
                await anyio.sleep(1.0)
            head = table.hosts["h2"].running["p1.r0"]
            follower = table.hosts["h3"].running["p1.r1"]
            assert engines[0].endpoint == f"http://127.0.0.2:{head.http_port}"
            assert follower.http_port == 0 and follower.master_port == head.master_port
            got = []
            for p in PROMPTS:
                body = client.completion_body("tiny", p, N_TOKENS, stream=False)
                ask = functools.partial(client.post_json, engines[0].endpoint, "/v1/completions", body)
                r = await anyio.to_thread.run_sync(functools.partial(ask, api_key=engines[0].api_key))
                got.append([int(t) for t in r["choices"][0]["token_ids"]])
            with pytest.raises(client.HttpError):  # the head refuses a request without its key
                client.post_json(engines[0].endpoint, "/v1/completions", body)
            for e in engines:
                e.stop(0.0)
            deadline = time.monotonic() + 180
            while table.hosts["h2"].running or table.hosts["h3"].running:  # both stopped together
                assert time.monotonic() < deadline
                await anyio.sleep(1.0)
        assert got == reference_tokens(tiny_model, PROMPTS, N_TOKENS)
    finally:
        end(procs)


_TAGS = ("fleet.action", "fleet.node_lost", "req.stats", "mesh.resumed")


def _journal_events(path: Path) -> list[object]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a torn tail: the writer is mid-record
            return [r.decode() for r in read_journal(path) if r.tag in _TAGS]
    except Exception:  # the writer is mid-record: read again later
        return []


def _completes_after_resume(events: list[object]) -> bool:
    """Whether the router's completed count grew between two of its reports after the (last) resume."""
    starts = [i for i, m in enumerate(events) if isinstance(m, MeshResumed)]
    if not starts:
        return False
    done = [d.completed for m in events[starts[-1] :] if isinstance(m, RoutingStats) for d in m.deployments]
    return len(done) >= 2 and done[-1] > done[0]


def test_up_on_three_workers_survives_a_killed_worker_and_a_kernel_restart(
    tiny_model: Path, vllm_cache: Path, keys: Path, tmp_path: Path
) -> None:
    work_dir(tmp_path / "vllm", vllm_cache)  # the run's servers find vLLM's model info cached
    # a steady demand that outlasts the servers' start-up
    scenario = steady_scenario(tmp_path / "steady.toml", 0.6, "{ mean_in = 128, mean_out = 64 }", 1200)
    hosts_file = tmp_path / "hosts.toml"
    hosts_file.write_text(
        "".join(f'[[host]]\nname = "h{i}"\nregion = "local"\nnode = "cpu-local"\n' for i in (2, 3, 4))
    )
    port = kernel_port()
    kernel = f"tcp://127.0.0.1:{port}"
    journal = tmp_path / "run.journal"
    up = [*CLI, "up", "--backend", "vllm", "--scenario", str(scenario), "--store", str(tmp_path / "store.db")]
    up += ["--weights", f"tiny-llama={tiny_model}", "--vllm-dtype", "float32", "--vllm-dir", str(tmp_path / "vllm")]
    up += ["--json", "--bind", kernel, "--keys", str(keys), "--hosts", str(hosts_file), "--until-idle"]
    up += ["--drain", "600s", "--for", "1500s", "--queue-timeout", "900s"]
    workers = [start_worker(f"h{i}", f"127.0.0.{i}", kernel, keys, tmp_path, tiny_model) for i in (2, 3, 4)]
    gateway = f"127.0.0.1:{free_port()}"
    first = subprocess.Popen([*up, "--record", str(journal), "--gateway", gateway], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=(tmp_path / "up1.err").open("w"), text=True)  # fmt: skip
    procs = [first, *workers]
    figures: dict[str, object] = {}
    try:
        # 1. a worker dies (kill -9) once an instance serves (the backlog queued during start-up in flight)
        deadline = time.monotonic() + 1200
        while True:
            assert time.monotonic() < deadline and first.poll() is None, (tmp_path / "up1.err").read_text()[-3000:]
            served = [m for m in _journal_events(journal) if isinstance(m, FleetAction) and m.action == "serving"]
            if served:
                break
            time.sleep(1.0)
        victim = next(w for i, w in zip((2, 3, 4), workers, strict=True)
                      if f"started {served[0].instance}.r0" in (tmp_path / f"h{i}.log").read_text())  # fmt: skip
        time.sleep(2.0)
        killed_at = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        lost_at = serving_at = None
        while serving_at is None and time.monotonic() < killed_at + 900:
            events = _journal_events(journal)
            if lost_at is None and any(isinstance(m, NodeLost) for m in events):
                lost_at = time.monotonic()
            news = [m for m in events if isinstance(m, FleetAction) and m.action == "serving"]
            if lost_at is not None and len(news) > len(served):
                serving_at = time.monotonic()
            time.sleep(0.5)
        assert lost_at is not None and serving_at is not None, (tmp_path / "up1.err").read_text()[-3000:]
        events = _journal_events(journal)
        loss = next(m for m in events if isinstance(m, NodeLost))
        (stats,) = [m for m in events if isinstance(m, RoutingStats)][-1].deployments
        figures.update(
            detect_lost_worker_s=round(lost_at - killed_at, 1),
            until_replacement_serves_s=round(serving_at - killed_at, 1),
            lost_cause=loss.cause, retried=stats.retries, failed=stats.failed, failed_by=stats.failed_by,
            load_at_kill=os.getloadavg(),
        )  # fmt: skip
        assert stats.retries >= 1  # the killed worker's server held requests; the router sent them again
        # an OpenAI-compatible request to the HTTP gateway reaches a worker's engine (with its API key)
        body = client.completion_body("tiny", PROMPTS[0], N_TOKENS, stream=False)
        via_gateway = None
        while via_gateway is None and time.monotonic() < serving_at + 300:
            try:
                r = client.post_json(f"http://{gateway}", "/v1/completions", body)
            except client.HttpError:
                time.sleep(0.5)  # no instance serving through the gateway at this moment
                continue
            via_gateway = [int(t) for t in r["choices"][0]["token_ids"]]
        assert via_gateway == reference_tokens(tiny_model, PROMPTS[:1], N_TOKENS)[0]
        # 2. the kernel dies (kill -9) and comes back with --resume: the workers reconnect, their servers adopted
        running = {w.pid: servers_of(w.pid) for w in workers if w is not victim}
        first.kill()
        first.wait()
        time.sleep(5.0)
        second = subprocess.Popen([*up, "--resume", str(journal)], cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=(tmp_path / "up2.err").open("w"), text=True)  # fmt: skip
        procs.append(second)
        resumed_at = time.monotonic()
        # the resumed run serves: its router completes requests after the resume; then it is stopped early
        # (SIGTERM sets the same stop event as --for), with requests still open
        deadline = resumed_at + 900
        while not _completes_after_resume(_journal_events(journal)):
            assert time.monotonic() < deadline and second.poll() is None, (tmp_path / "up2.err").read_text()[-3000:]
            time.sleep(1.0)
        figures.update(resumed_serves_after_s=round(time.monotonic() - resumed_at, 1))
        second.send_signal(signal.SIGTERM)
        out, _ = second.communicate(timeout=600)
        assert second.returncode == 0, (tmp_path / "up2.err").read_text()[-3000:]
        summary = json.loads(out)
        resumed = summary["resumed"]
        figures.update(adopted=resumed["adopted"], resubmitted=resumed["resubmitted"],
                       resumed_run_wall_s=round(time.monotonic() - resumed_at, 1))  # fmt: skip
        tiny = summary["deployments"]["tiny"]
        stopped = sum((tmp_path / f"h{i}.log").read_text().count("is not adopted by this kernel") for i in (2, 3, 4))
        figures.update(after_resume=tiny, load_at_end=os.getloadavg(), unadopted_servers_stopped=stopped)
        print("fault figures:", json.dumps(figures, default=str))
        assert resumed["adopted"], resumed  # the serving instance(s), their servers kept
        adopted = [a for a in _journal_events(journal) if isinstance(a, FleetAction) and a.action == "serving"]
        assert adopted and any(pids for pids in running.values())  # the spare host ran none
        assert sum(tiny["failed_by"].values()) == tiny["failed"]
        assert tiny["open"] == 0  # cut early: what was still open failed as unfinished, with its reason
        pre = resumed["pre_crash"]["tiny"]
        assert pre["arrived"] == pre["completed"] + pre["failed"] + pre["resubmitted"]
    finally:
        end(procs)
