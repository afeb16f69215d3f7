"""Shared fixtures: the bundled catalog, the perf model, the mesh-* scenarios' template store (the mesh, actor
and gateway tests' ``world``), files built once a run for every xdist worker (``shared_build``), plus the path
of ../shared when present."""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from coral.catalog import Catalog, load_catalog
from coral.perf import PerfModel

if TYPE_CHECKING:
    from tests.mesh.helpers import World

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
FIXTURES = ROOT / "fixtures"


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return load_catalog()


@pytest.fixture(scope="session")
def perf(catalog: Catalog) -> PerfModel:
    return PerfModel(catalog)


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory, catalog: Catalog, perf: PerfModel) -> World:
    """The catalog, perf model and a template store of every mesh-* scenario, built once a run (``shared_build``)."""
    # imported here, not at the top: tests.mesh.helpers loads the actors and the CLI (measured 7.6 s at
    # load 7 on two cores), which a run of the solver or catalog tests alone should not pay
    from tests.mesh.helpers import World, build_store

    store = shared_build(tmp_path_factory, "mesh-templates.sqlite", lambda p: build_store(p, perf, catalog))
    return World(catalog, perf, store)


def shared_build(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """``build(path)`` run once a run for every xdist worker, its ``path`` returned to each: the first worker to
    ask builds it under a file lock while the others wait, then reuse it (the workers' base temp folders
    share a parent, as ``vllm_cache`` uses). Only for a build whose inputs are fixed, so that every worker
    would have built the same file, and whose users only read it. The build has a folder of its own (for
    files beside ``path``: SQLite's, a journal's provider state)."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-builds"
    root.mkdir(exist_ok=True)
    folder, done = root / name, root / f"{name}.done"
    with (root / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if the build raised
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a build that raised left
            folder.mkdir()
            build(folder / name)
            done.touch()
    return folder / name


def shared_path(*parts: str) -> Path:
    """A path under ../shared/, skipping the test with a reason when it is absent."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} is absent (the shared reference folder is not next to this checkout)")
    return p


def kernel_port(host: str = "127.0.0.1") -> int:
    """A port P such that P and P + 1 are both free on ``host`` now: a kernel bound to ``tcp://HOST:P`` takes
    both (its router and its publisher, ``coral.kernel.address.parse_bind``). A port that is free alone may
    have a busy neighbour (a full run failed on one: the publisher's bind found P + 1 in use)."""
    for _ in range(100):
        with socket.socket() as first:
            first.bind((host, 0))
            port = int(first.getsockname()[1])
            if port >= 65535:
                continue
            with socket.socket() as second:
                try:
                    second.bind((host, port + 1))
                except OSError:
                    continue
                return port
    raise RuntimeError(f"no two consecutive free ports on {host} in 100 tries")
