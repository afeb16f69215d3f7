"""``coral simulate --json`` carries what its text shows (latency percentiles, re-plans, cost per million
tokens) and no wall-clock figure: the same seed prints the same JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import Coral


@pytest.mark.slow
def test_simulate_json_is_complete_and_repeatable(coral: Coral, tmp_path: Path) -> None:
    store = str(tmp_path / "s.sqlite")
    argv = ("simulate", "--scenario", "mesh-steady", "--duration", "120", "--store", store, "--seed", "3", "--json")
    first = coral(*argv)
    assert first.rc == 0, first.err
    out = json.loads(first.out)
    for key in ("attainment", "latency", "cost_per_million_tokens", "replans", "failed_by_reason", "faults"):
        assert key in out, key
    assert set(out["latency"]["ttft"]) >= {"p50", "p90", "p99"} and out["replans"]["count"] >= 1
    for m in out["per_model"].values():
        assert "latency" in m and "cost_per_million_tokens" in m
    assert "wall_s" not in first.out and "solve_s" not in first.out
    assert coral(*argv).out == first.out
