"""``pipeline_measure.kv_tokens_peak``: the KV blocks the running requests held at once, from their streams."""

from __future__ import annotations

from coral.vllm import pipeline_measure as pm


def test_overlapping_requests_hold_their_blocks_together() -> None:
    a = pm.Timed(100, 3, 0.0, (1.0, 2.0, 3.0))  # 100 -> 103 tokens: one block of 128 throughout
    b = pm.Timed(127, 2, 1.5, (2.5, 2.8))  # 127 -> 128 -> 129: a second block at its 2nd token
    assert pm.kv_tokens_peak([a], 128) == 128.0
    assert pm.kv_tokens_peak([b], 128) == 256.0
    assert pm.kv_tokens_peak([a, b], 128) == 3 * 128.0  # at t=2.8 a still holds its block (it ends at 3.0)


def test_a_request_that_ended_frees_its_blocks_before_a_later_one_starts() -> None:
    a = pm.Timed(200, 2, 0.0, (1.0, 2.0))
    b = pm.Timed(200, 2, 2.01, (3.0, 4.0))  # starts after a's last token arrived
    assert pm.kv_tokens_peak([a, b], 128) == 256.0
    assert pm.kv_tokens_peak([a, b], 16) == 16 * 13  # 202 tokens: 13 blocks of 16
