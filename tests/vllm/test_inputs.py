"""Bad input to the vLLM pieces gets a clear error naming what is wrong (pure: no vLLM server needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coral.catalog import load_catalog
from coral.cli import main
from coral.engines import EngineError
from coral.errors import CoralError
from coral.scenario import ScenarioError, load_scenario, scenario_catalogs
from coral.vllm.client import parse_metrics
from coral.vllm.engine import VllmBackend, VllmEngine, prompt_ids
from coral.vllm.fleet import detect_device, parse_weights
from coral.vllm.profile import ProfileRunError, ProfileSpec, model_layers
from tests.conftest import FIXTURES

TINY = FIXTURES / "scenarios" / "tiny-cpu.toml"


def test_the_tiny_scenario_brings_its_catalog() -> None:
    (cat_file,) = scenario_catalogs(str(TINY))
    assert cat_file == (FIXTURES / "catalog" / "tiny-cpu.toml").resolve()
    sc = load_scenario(str(TINY), load_catalog([cat_file]))
    assert sc.node_types == ("cpu-local",) or list(sc.node_types) == ["cpu-local"]
    assert sc.deployments[0].model == "tiny-llama"


def test_scenario_catalog_key_errors(tmp_path: Path) -> None:
    bad = tmp_path / "s.toml"
    bad.write_text('catalog = "x.toml"\n')
    with pytest.raises(ScenarioError, match="key 'catalog': must be a list"):
        scenario_catalogs(str(bad))
    bad.write_text('catalog = ["missing.toml"]\n')
    with pytest.raises(ScenarioError, match=r"catalog file 'missing\.toml' not found"):
        scenario_catalogs(str(bad))


def test_backend_and_weights_errors() -> None:
    with pytest.raises(EngineError, match="vllm device: must be one of cpu, gpu"):
        VllmBackend({"m": "/w"}, device="tpu").check()
    with pytest.raises(EngineError, match="no model weights"):
        VllmBackend({}).check()
    with pytest.raises(EngineError, match="startup_timeout_s: must be a positive"):
        VllmBackend({"m": "/w"}, startup_timeout_s=0).check()
    with pytest.raises(EngineError, match="no weights for model 'other'"):
        VllmBackend({"m": "/w"}).weights("other")
    cat = load_catalog([FIXTURES / "catalog" / "tiny-cpu.toml"])
    assert parse_weights(["tiny-llama=/models/t"], cat) == {"tiny-llama": "/models/t"}
    with pytest.raises(CoralError, match="--weights: expected MODEL=DIR"):
        parse_weights(["tiny-llama"], cat)
    with pytest.raises(CoralError, match="--weights: unknown model 'nope'"):
        parse_weights(["nope=/x"], cat)
    with pytest.raises(CoralError, match="--vllm-device: must be auto, cpu or gpu"):
        detect_device("tpu")


def test_engine_use_out_of_order_is_an_error() -> None:
    e = VllmEngine(VllmBackend({"m": "/w"}))
    with pytest.raises(EngineError, match="submit: this engine takes no requests"):
        e.submit([], 0.0)
    assert e.poll(0.0) == [] and not e.loaded(0.0) and e.fault == ""


def test_prompt_ids_are_deterministic_and_in_the_vocabulary() -> None:
    a = prompt_ids(0, 42, 100, 1024)
    assert a == prompt_ids(0, 42, 100, 1024) and a != prompt_ids(0, 43, 100, 1024)
    assert len(a) == 100 and all(8 <= t < 1024 for t in a)


def test_metrics_parsing_sums_label_sets_and_skips_created() -> None:
    text = (
        "# HELP vllm:num_requests_running x\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        'vllm:request_success_total{finished_reason="length"} 3.0\n'
        'vllm:request_success_total{finished_reason="stop"} 1.0\n'
        'vllm:request_success_created{finished_reason="stop"} 1.7e9\n'
    )
    assert parse_metrics(text) == {"vllm:num_requests_running": 2.0, "vllm:request_success_total": 4.0}


def test_profile_input_errors(tmp_path: Path) -> None:
    with pytest.raises(ProfileRunError, match="--batches: need increasing positive integers"):
        ProfileSpec(batches=(4, 1)).check()
    with pytest.raises(ProfileRunError, match="--steps: must be at least 1"):
        ProfileSpec(steps=0).check()
    with pytest.raises(ProfileRunError, match="needs 257 tokens, the model allows 128"):
        ProfileSpec(prompt_tokens=(256,), context=8).check(128)
    with pytest.raises(ProfileRunError, match=r"cannot read config\.json"):
        model_layers(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ProfileRunError, match="lacks num_hidden_layers"):
        model_layers(tmp_path)


def test_cli_errors_change_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.csv"
    assert main(["profile", "--model", str(tmp_path / "none"), "--out", str(out)]) == 2
    assert "--model:" in capsys.readouterr().err and not out.exists()
    store = tmp_path / "s.db"
    args = ["up", "--backend", "vllm", "--scenario", str(TINY), "--store", str(store), "--speed", "60"]
    assert main(args) == 2
    assert "--speed: the vllm backend runs in real time" in capsys.readouterr().err
    assert main(["tiny-model", "--out", str(tmp_path / "m"), "--seed", "-1"]) == 2
    assert "--seed: must be >= 0" in capsys.readouterr().err and not (tmp_path / "m").exists()


def test_plan_vllm_only_names_the_filter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "s.db"
    assert main(["plan", "--scenario", str(TINY), "--store", str(store), "--vllm-only", "--json"]) == 0
    assert '"aggregated"' in capsys.readouterr().out
