"""Template builds on Ray (``coral templates build --ray``): the same outcomes as the local pool, resume
after an interruption, and the refusals (Ray not installed, a bad address, ``--workers`` with ``--ray``).

The Ray tests start one local Ray instance of 2 CPUs for the module; they skip where Ray (the ``ray``
extra) is not installed."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from coral.cli import main
from coral.cli.build import BuildJob, build_library
from coral.perf import PerfModel
from coral.store import TemplateStore
from coral.workload import Slo, WorkloadShape

NODES = ["g6e.xlarge", "g6.xlarge", "p5.4xlarge", "g5.xlarge"]
SLO, SHAPE = Slo(2.0, 0.1), WorkloadShape(1155, 211)
JOBS = [BuildJob("qwen3-32b", "aggregated", SLO, SHAPE), BuildJob("llama-3.1-8b", "prefill", SLO, SHAPE)]
ARGS = ["--models", "qwen3-32b", "--modes", "aggregated,prefill", "--nodes", ",".join(NODES), "--nmax", "3"]

needs_ray = pytest.mark.skipif(find_spec("ray") is None, reason='Ray is not installed (pip install -e ".[ray]")')


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """A local Ray instance of 2 CPUs, shared by the module's tests (it takes tens of seconds to start)."""
    import ray  # optional dependency: the `ray` extra

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def contents(path: Path) -> tuple[list[tuple[Any, ...]], list[tuple[str, dict[str, Any]]]]:
    """A store's outcome rows and template bodies, without the solve times (wall-clock, not outcomes)."""
    with TemplateStore(path, readonly=True) as store:
        rows = store.db.execute("SELECT * FROM outcomes ORDER BY key").fetchall()
        bodies = store.db.execute("SELECT id, body FROM templates ORDER BY id").fetchall()
    return rows, [(i, {k: v for k, v in json.loads(b).items() if k != "solve_s"}) for i, b in bodies]


def test_no_ray_is_one_line_naming_the_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where it is not installed
    monkeypatch.delitem(sys.modules, "coral.cli.build_ray", raising=False)
    store = tmp_path / "s.sqlite"
    assert main(["templates", "build", *ARGS, "--store", str(store), "--ray"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--ray" in err and 'pip install -e ".[ray]"' in err
    assert not store.exists()


def test_workers_and_ray_together_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "s.sqlite"
    assert main(["templates", "build", *ARGS, "--store", str(store), "--ray", "--workers", "2"]) == 2
    assert "--workers: not with --ray" in capsys.readouterr().err
    assert not store.exists()


@needs_ray
@pytest.mark.parametrize(
    ("address", "needle"),
    [
        ("127.0.0.1:1", "--ray 127.0.0.1:1: cannot reach a Ray cluster there"),
        ("ray://127.0.0.1:1", "--ray ray://127.0.0.1:1: cannot reach a Ray cluster there"),
        ("no-such-host.invalid:6379", "--ray no-such-host.invalid:6379: cannot reach a Ray cluster there"),
        ("headnode", "--ray headnode: not a Ray address"),
        ("10.0.0.1:99999", "--ray 10.0.0.1:99999: not a Ray address"),
        ("auto", "--ray auto: cannot connect (Could not find any running Ray instance"),  # no `ray start` here
    ],
)
def test_bad_address_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], address: str, needle: str
) -> None:
    store = tmp_path / "s.sqlite"
    assert main(["templates", "build", *ARGS, "--store", str(store), "--ray", address]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and needle in err
    assert not store.exists()


@needs_ray
@pytest.mark.slow
@pytest.mark.xdist_group("ray")  # one local Ray instance at a time on a 2-core machine
def test_ray_build_has_the_local_outcomes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI's ``--ray`` build (a local Ray instance of its own, this machine's 2 CPUs, Coral's code
    uploaded as the job's py_modules) stores exactly the outcomes and templates of the local pool's build,
    and stops its instance at the end."""
    import ray  # optional dependency: the `ray` extra

    local, remote = tmp_path / "local.sqlite", tmp_path / "ray.sqlite"
    assert main(["templates", "build", *ARGS, "--workers", "1", "--store", str(local), "--json"]) == 0
    want = json.loads(capsys.readouterr().out)
    assert main(["templates", "build", *ARGS, "--ray", "--store", str(remote), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["workers"] >= 1 and want["kept"] > 0  # Ray counts the CPUs that this machine's cgroup allows
    for k in ("enumerated", "solved", "kept", "infeasible", "dominated", "split", "bound_skipped", "by_path"):
        assert got[k] == want[k], k
    assert contents(remote) == contents(local)
    assert not ray.is_initialized()


@needs_ray
@pytest.mark.slow
@pytest.mark.xdist_group("ray")  # one local Ray instance at a time on a 2-core machine
def test_interrupted_ray_build_resumes(tmp_path: Path, perf: PerfModel, ray_cluster: Any) -> None:
    """Ctrl-C in the middle of a level keeps what arrived; the next build solves only the rest, and the
    store ends with the local build's outcomes."""
    from coral.cli.build_ray import RaySolver  # optional dependency: the `ray` extra

    with TemplateStore(tmp_path / "local.sqlite") as store:
        full = build_library(perf, store, JOBS, NODES, nmax=3)
    stop = full.enumerated // 2

    def interrupt(done: int, total: int) -> None:
        if done >= stop:
            raise KeyboardInterrupt

    path = tmp_path / "ray.sqlite"
    solver = RaySolver(None, perf, 10.0)
    assert solver.workers == 2
    try:
        with TemplateStore(path) as store, pytest.raises(KeyboardInterrupt):
            build_library(perf, store, JOBS, NODES, nmax=3, solver=solver, progress=interrupt)
        with TemplateStore(path) as store:
            kept = sum(store.counts().values())
            assert 0 < kept < full.enumerated
            again = build_library(perf, store, JOBS, NODES, nmax=3, solver=solver)
    finally:
        solver.close()
    assert again.reused == kept and sum(again.level_tasks.values()) == full.enumerated - kept
    assert contents(path) == contents(tmp_path / "local.sqlite")
    assert ray_cluster.is_initialized()  # a connection the build found open stays open
