"""A 2-stage template with an uneven layer split (1 + 3 layers) runs as one vLLM server with PP=2, gives the
single-stage instance's tokens, and a crash of its server is a fault that loses nothing silently."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from coral.messages.requests import WorkItem
from coral.vllm import client
from tests.vllm.conftest import N_TOKENS, PROMPTS, cpu_backend, reference_tokens, start

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.xdist_group("vllm")]


def test_uneven_pp2_equals_the_single_stage_tokens_and_a_crash_is_a_fault(tiny_model: Path, vllm_dir: Path) -> None:
    engines, t0 = start(cpu_backend(tiny_model, vllm_dir), [1, 3], "pp")
    head, other = engines
    try:
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
    finally:
        for e in engines:
            e.stop(0.0)
