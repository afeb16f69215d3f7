"""A 2-stage template with an uneven layer split (1 + 3 layers) runs as one vLLM server with PP=2, shared by
the tests of this module: the pipeline measurement on it gives sane figures and vLLM's KV blocks cover the
sequences that ran; it gives the single-stage instance's tokens; and a crash of its server is a fault that
loses nothing silently (last in the module: it kills the server)."""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from coral.messages.requests import WorkItem
from coral.vllm import client
from coral.vllm import pipeline_measure as pm
from coral.vllm.engine import VllmEngine
from tests.vllm.conftest import N_TOKENS, PROMPTS, cpu_backend, reference_tokens, start

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.xdist_group("vllm")]

SCHED = (
    "--enable-chunked-prefill", "--max-num-batched-tokens", "128", "--max-num-seqs", "64",
    "--num-gpu-blocks-override", "512", *pm.SERVER_ARGS,
)  # fmt: skip
"""The scheduler and logging settings of ``just bench pipeline``, which the measurement test runs under."""


@pytest.fixture(scope="module")
def pp2(tiny_model: Path, vllm_dir: Path) -> Iterator[tuple[list[VllmEngine], float]]:
    """The PP=2 instance (split 1,3) with the bench's scheduler settings: its engines (head first) and the
    wall time its clock started at."""
    # a PP=2 start took 8-10 min on this 2-core machine under a load of 30-40: more than conftest's 400 s
    backend = cpu_backend(tiny_model, vllm_dir)
    backend = attrs.evolve(backend, extra_args=SCHED, env={**backend.env, **pm.SERVER_ENV}, startup_timeout_s=900.0)
    engines, t0 = start(backend, [1, 3], "pp")
    yield engines, t0
    for e in engines:
        e.stop(time.monotonic() - t0)


def test_pp2_measurement_is_sane_and_kv_blocks_cover_the_sequences(pp2: tuple[list[VllmEngine], float]) -> None:
    head = pp2[0][0]
    assert not head.fault, head.fault  # the crash test below kills this server: it runs last
    assert head.server is not None
    tg = pm.Target(head.endpoint, "tiny", head.api_key, 1024, 1024, str(head.server.log_path))
    text = pm.Scraper(tg.endpoint, tg.api_key).text()
    block, blocks = pm.cache_config(text)
    assert blocks == 512
    row = pm.run_closed(tg, 4, 2, 64, 128, seed=5)
    assert row["requests"] == 8
    assert row["tpot_p50"] > 0 and row["ttft_p50"] > 0 and row["tok_s"] > 0
    assert row["steps"] > 0 and 0 < row["micro_batch"] <= 4
    need = max(p + o for p, o in pm.workload(5, 8, 64, 128, 1024))
    assert blocks * block >= 4 * need  # the pool holds the 4 concurrent sequences
    # vLLM's own log lines saw the run, whatever the load: every engine step (the /metrics counters agree),
    # requests running, and KV in use while they ran: at least one block (128 tokens) of the 512 per sequence
    assert abs(row["log_steps"] - row["steps"]) <= 0.05 * row["steps"] + 2
    assert 0 < row["log_micro_batch"] <= 4 and row["log_ticks"] > 0
    assert 1 <= row["log_peak_running"] <= 4
    assert row["log_peak_kv_frac"] * blocks >= row["log_peak_running"] - 0.5
    # and the engine timed every request's tokens (its TPOT histogram, free of the stream's chunking)
    assert row["engine_tpot_n"] == 8 and 0 < row["engine_tpot_p50"] <= row["engine_tpot_p90"] < 4.0
    ttft = pm.run_ttft(tg, [16, 256], 1, seed=1)
    assert all(math.isfinite(r["ttft_p50"]) and r["ttft_p50"] > 0 for r in ttft)


def test_uneven_pp2_equals_the_single_stage_tokens_and_a_crash_is_a_fault(
    pp2: tuple[list[VllmEngine], float], tiny_model: Path
) -> None:
    engines, t0 = pp2
    head, other = engines
    plan = head.plan
    assert plan is not None and plan.pipeline_parallel == 2 and plan.layer_partition == (1, 3)
    assert head.server is not None and other.server is None  # one server runs both stages
    assert other.endpoint == "" and head.endpoint
    got = []
    for p in PROMPTS:
        r = client.post_json(
            head.endpoint,
            "/v1/completions",
            client.completion_body("tiny", p, N_TOKENS, stream=False),
            api_key=head.api_key,
        )
        got.append([int(t) for t in r["choices"][0]["token_ids"]])
    # the single-stage instance gives transformers' tokens (test_single); PP=2 must give the same
    assert got == reference_tokens(tiny_model, PROMPTS, N_TOKENS)

    # a long request in flight, then the server dies (as soon as it generates: on an idle machine the
    # tiny model can finish 1,000 tokens between two scrapes, so no scrape is waited for). A request
    # that ended before the kill (the poll just before it reports it) is replaced by another one.
    for rid in range(1, 6):
        head.scrape_now()
        before = head.server_metrics().get("vllm:generation_tokens_total", 0.0)
        now = time.monotonic() - t0
        head.submit([WorkItem(rid, "tiny", now, now, 16, 1000)], now)
        assert head.poll(now) == []
        deadline = time.monotonic() + 60
        while head.server_metrics().get("vllm:generation_tokens_total", 0.0) <= before:
            assert time.monotonic() < deadline, "the long request never started"
            head.scrape_now()
            time.sleep(0.01)
        if head.poll(time.monotonic() - t0) == []:
            break
    else:
        pytest.fail("each of 5 long requests ended before the server could be killed")
    assert head.metrics().in_flight == 1
    pid = head.server.pid
    os.killpg(pid, signal.SIGKILL)
    outcomes = []
    deadline = time.monotonic() + 60
    while not head.fault and time.monotonic() < deadline:
        outcomes += head.poll(time.monotonic() - t0)
        time.sleep(0.05)
    assert head.fault.startswith(f"the vLLM server (pid {pid}) exited (killed by signal 9)")
    outcomes += head.poll(time.monotonic() - t0)
    # The broken request is not reported failed: the router retries it. On a quiet machine the request
    # can still finish in the moment between the last poll and the kill; then it is reported done.
    assert [o.kind for o in outcomes] in ([], ["done"]) and all(o.id == rid for o in outcomes)
    assert head.stop(time.monotonic() - t0) == 1 - len(outcomes)  # abandoned, for the record
