"""The prediction side of ``just bench pipeline``: Coral's rules fed a known profile, the verdicts, and
bad input refused with one line before any vLLM starts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench import pipeline as bp
from coral.catalog import load_catalog
from coral.perf import PerfModel
from coral.perf.profile import ProfileTable
from coral.vllm.tiny import TINY_MODEL
from solvers.options import prefill_bubble

D = 0.002  # decode seconds per layer at every batch
P = 1e-4  # prompt seconds per layer per token


@pytest.fixture(scope="module")
def perf() -> PerfModel:
    table = ProfileTable(
        TINY_MODEL, bp.GPU, 1, 64, np.array([1.0, 1000.0]), np.array([P, 1000 * P]), np.array([1.0, 64.0]),
        np.array([D, D]), "synthetic",
    )  # fmt: skip
    return PerfModel(load_catalog([bp.CATALOG]), [table])


def test_the_rules_give_n_times_the_slowest_stage_and_n_b_sequences_of_kv(perf: PerfModel) -> None:
    pr = bp.predict(perf, (1, 3), 1)
    assert pr["tpot"] == pytest.approx(2 * 3 * D)  # b = 1: no prompt tail, lat[0] = tau = k * D
    assert pr["tpot_path_sum"] == pytest.approx(4 * D)
    assert pr["kv_tokens"] == 2 * 1 * bp.SHAPE.max_context
    g = prefill_bubble(2, 1, bp.SHAPE.mean_out)
    assert pr["g"] == g > 1.0
    pre = 3 * P * bp.SHAPE.mean_in
    assert pr["cap_req_s"] == pytest.approx(1 / (g * pre + bp.SHAPE.mean_out * 3 * D))
    assert pr["cap_req_s_g1"] == pytest.approx(1 / (pre + bp.SHAPE.mean_out * 3 * D))
    one = bp.predict(perf, (4,), 8)
    assert one["g"] == 1.0 and one["tpot"] > 4 * D  # b = 8: the prompt tail adds to the step
    assert bp.predict_one_batch(perf, (1, 3), 2) == pytest.approx(bp.predict(perf, (1,), 2)["tpot"] * 4)
    assert bp.prompt_pass(perf, 4, 512) == pytest.approx(4 * 512 * P)
    assert bp.lone_ttft(perf, (1, 3), 100) == pytest.approx(4 * (100 * P + D))
    assert bp.template_b_for_rate(perf, (1, 3), 0.5 * pr["cap_req_s"]) == 1
    assert bp.template_b_for_rate(perf, (1, 3), 1.5 * pr["cap_req_s"]) > 1


def test_verdicts() -> None:
    assert bp.verdict(1.05, 1.0) == "holds"
    assert bp.verdict(0.91, 1.0) == "holds"
    assert bp.verdict(1.2, 1.0) == "wrong by +20%"
    assert bp.verdict(0.5, 1.0) == "wrong by -50%"
    assert bp.verdict(float("nan"), 1.0) == "n/a"


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "m"
    d.mkdir()
    cfg = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 32}
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize(
    ("extra", "msg"),
    [
        (["--splits", "2,3"], "--splits 2,3: the stages hold 5 layers, the model has 4"),
        (["--splits", "4", "0,4"], "--splits 0,4: stage 0 holds 0 layers; every stage needs one"),
        (["--splits", "1,1,1,1,1"], "--splits 1,1,1,1,1: PP=5 exceeds the model's 4 layers"),
        (["--splits", "x"], "--splits: 'x' is not a comma-separated list"),
    ],
)
def test_bad_splits_are_refused_before_anything_runs(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], msg: str
) -> None:
    out = tmp_path / "r.json"
    assert bp.main(["--model", str(model_dir), "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0]
    assert not out.exists()


def test_a_profile_or_measurement_of_another_model_is_refused(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prof = tmp_path / "p.csv"
    prof.write_text("model,gpu,tp,phase,x,layer_s,context\nother,cpu-avx512,1,prefill,16,0.001,64\n"
                    "other,cpu-avx512,1,decode,1,0.001,64\n")  # fmt: skip
    out = tmp_path / "r.json"
    assert bp.main(["--model", str(model_dir), "--splits", "4", "--profile", str(prof), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"bench pipeline: --profile {prof}: its table is of model 'other', the bench runs 'tiny-llama'"
    assert not out.exists()
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps({"model": {"digest": "0123", "layers": 4}, "runs": []}))
    assert bp.main(["--model", str(model_dir), "--results", str(saved)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"bench pipeline: --results {saved}: measured on model 0123 (4 layers), not on this one")


def test_a_saved_run_is_compared_again_without_vllm(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads((bp.ROOT / "bench" / "results" / "pipeline-quick-inproc.json").read_text())
    from coral.vllm.pipeline_measure import model_info

    doc["model"]["digest"] = model_info(model_dir).digest
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(doc))
    assert bp.main(["--model", str(model_dir), "--results", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "TPOT n*t (p90)" in out and "KV n*b seqs: sequences" in out and "prompt stall" in out
    assert "PP=2 TPOT n*t (p90): 0/3 points hold -> missed" in out
