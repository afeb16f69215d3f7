"""Memory per stage: the ends a stage holds, its activation workspace, and KV for the micro-batches it holds."""

from __future__ import annotations

import json

import pytest

from coral.catalog import Catalog
from coral.cli import main
from coral.perf import PerfModel


def _mem(perf: PerfModel, model: str, k: int, ends: tuple[bool, bool] | None, seqs: int = 1, tp: int = 1) -> float:
    return float(perf.stage_bytes(model, layers=k, batch=seqs, context=1024, tp=tp, ends=ends))


def test_embedding_on_the_first_stage_head_on_the_last(perf: PerfModel, catalog: Catalog) -> None:
    m = catalog.models["llama-3.3-70b"]  # untied: embedding and head are two matrices
    one = m.vocab * m.hidden * m.dtype_bytes
    middle = _mem(perf, m.name, 20, (False, False))
    assert _mem(perf, m.name, 20, (True, False)) - middle == pytest.approx(one)
    # the last stage also holds the logits of its sequences
    logits = m.vocab * 4.0
    assert _mem(perf, m.name, 20, (False, True)) - middle == pytest.approx(one + logits)
    whole = _mem(perf, m.name, m.num_layers, (True, True))
    spread = m.weight_bytes  # the old even spread counted every weight once over the layers
    assert whole - _mem(perf, m.name, m.num_layers, (False, False)) == pytest.approx(2 * one + logits)
    assert whole > spread


def test_tied_embeddings_one_copy_on_one_stage_a_copy_each_on_two(perf: PerfModel, catalog: Catalog) -> None:
    g = catalog.models["gemma-3-27b"]
    assert g.tied_embeddings
    one = g.vocab * g.hidden * g.dtype_bytes
    assert g.end_bytes(True, True) == one
    assert g.end_bytes(True, False) == one and g.end_bytes(False, True) == one
    # the case: a first stage of gemma-3-27b on a 24 GB GPU carries its 1.4 GB embedding
    k = 30
    assert _mem(perf, g.name, k, (True, False)) - _mem(perf, g.name, k, (False, False)) == pytest.approx(one)


def test_conservative_ends_when_not_known(perf: PerfModel, catalog: Catalog) -> None:
    m = catalog.models["qwen3-32b"]
    assert _mem(perf, m.name, 10, None) == pytest.approx(_mem(perf, m.name, 10, (False, True)))
    assert _mem(perf, m.name, m.num_layers, None) == pytest.approx(_mem(perf, m.name, m.num_layers, (True, True)))
    k = perf.max_layers(m.name, "g6e.xlarge", batch=4, context=1024)
    usable = perf.usable_bytes("g6e.xlarge")
    assert float(perf.stage_bytes(m.name, layers=k, batch=4, context=1024, node="g6e.xlarge")) <= usable
    assert float(perf.stage_bytes(m.name, layers=k + 1, batch=4, context=1024, node="g6e.xlarge")) > usable


def test_kv_for_the_micro_batches_held_and_workspace_per_gpu(perf: PerfModel, catalog: Catalog) -> None:
    m = catalog.models["llama-3.1-8b"]
    kv = 10 * 1024 * m.kv_bytes_per_token_layer
    # two micro-batches of 4 held: KV of 8 sequences (and their logits on the head's stage)
    d = _mem(perf, m.name, 10, (False, False), seqs=8) - _mem(perf, m.name, 10, (False, False), seqs=4)
    assert d == pytest.approx(4 * kv)
    # each of the tp GPUs keeps a workspace for a prefill chunk's activations
    w1 = _mem(perf, m.name, 10, (False, False), tp=1) - 10 * m.block_weight_bytes - kv
    w4 = _mem(perf, m.name, 10, (False, False), tp=4) - 10 * m.block_weight_bytes - kv
    assert 0 < w1 < w4 < 4 * w1


def test_cli_perf_accepts_a_fractional_context(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        ["perf", "--model", "qwen3-32b", "--node", "g6e.xlarge", "--context", "1260.5", "--layers", "8", "--json"]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["context"] == 1260.5 and out["layers"] == 8
    assert "opcurve" in out["source"] and "derived from a40-48g" in out["source"]


@pytest.mark.parametrize("value", ["0", "nan", "-3"])
def test_cli_perf_rejects_a_bad_context(capsys: pytest.CaptureFixture[str], value: str) -> None:
    rc = main(["perf", "--model", "qwen3-32b", "--node", "g6e.xlarge", f"--context={value}"])
    assert rc != 0
    assert "context must be a number of at least 1" in capsys.readouterr().err
