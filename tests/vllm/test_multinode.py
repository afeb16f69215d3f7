"""vLLM's multi-node launch of a 2-stage template (``--nnodes 2``; rank 1 ``--headless``), with both "nodes"
on this machine under two host names. Opt-in (``CORAL_VLLM_MULTINODE=1``): it starts two more server
processes, about a minute on a 2-core machine."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import coral
from coral.vllm import client
from coral.vllm.engine import free_port
from coral.vllm.launch import LaunchOptions, launch_plan
from coral.vllm.tiny import TINY_MODEL, chain_template
from tests.vllm.conftest import N_TOKENS, PROMPTS, reference_tokens

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.xdist_group("vllm"),
    pytest.mark.skipif(
        os.environ.get("CORAL_VLLM_MULTINODE") != "1",
        reason="multi-node launch test is opt-in (CORAL_VLLM_MULTINODE=1): it starts two more vLLM processes",
    ),
]


def test_two_node_pipeline_launch_gives_the_single_stage_tokens(tiny_model: Path, vllm_dir: Path) -> None:
    opts = LaunchOptions(
        model_path=str(tiny_model), served_name="tiny", device="cpu", port=free_port(), master_port=free_port(),
        dtype="float32", enforce_eager=True, max_model_len=512, cache_root=str(vllm_dir / "cache"), cpu_cores=2,
    )  # fmt: skip
    plan = launch_plan(chain_template(TINY_MODEL, [1, 3]), ["127.0.0.1", "localhost"], opts)
    assert plan.nnodes == 2 and [s.serves_http for s in plan.servers] == [True, False]
    root = str(Path(coral.__file__).resolve().parent.parent)
    procs = []
    for s in plan.servers:
        env = dict(os.environ, **s.env, HF_HUB_OFFLINE="1", PYTHONPATH=root)
        log = (vllm_dir / f"multinode-rank{s.node_rank}.log").open("w")
        procs.append(subprocess.Popen([sys.executable, *s.argv], env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))  # fmt: skip
    try:
        deadline = time.monotonic() + 400
        while not client.healthy(plan.url):
            assert all(p.poll() is None for p in procs), [p.poll() for p in procs]
            assert time.monotonic() < deadline
            time.sleep(1)
        got = []
        for p in PROMPTS:
            r = client.post_json(plan.url, "/v1/completions", client.completion_body("tiny", p, N_TOKENS, stream=False))
            got.append([int(t) for t in r["choices"][0]["token_ids"]])
        assert got == reference_tokens(tiny_model, PROMPTS, N_TOKENS)
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(60))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                codes.append(p.wait())
    assert codes == [0, 0]  # both stop cleanly on SIGTERM
