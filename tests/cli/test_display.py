"""Readable abbreviations and column choice (``coral.display``), and ``templates list`` at 80 columns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coral.display import abbreviate, abbreviate_all, fit_columns, fit_table
from tests.conftest import shared_build

from .conftest import Coral

NAMES = ["chat-8b", "chat-32b", "code-14b", "llama-3.1-8b", "qwen3-14b", "qwen3-32b", "g6e.xlarge", "g6e.12xlarge",
         "a2-highgpu-1g", "a2-ultragpu-1g", "g2-standard-4", "aggregated", "prefill", "decode"]  # fmt: skip


def test_known_words_and_sizes() -> None:
    assert abbreviate("aggregated", 3) == "agg" and abbreviate("decode", 3) == "dec"
    assert abbreviate("g6e.12xlarge", 8) == "g6e.12xl" and abbreviate("a2-highgpu-1g", 8) == "a2-hg-1g"
    assert abbreviate("g2-standard-4", 8) == "g2-std-4"
    assert abbreviate("chat-8b", 7) == "chat-8b"  # fits: unchanged
    assert abbreviate("llama-3.1-8b", 10) == "lla-3.1-8b"


@pytest.mark.parametrize("width", [4, 5, 6, 8, 10])
def test_sizes_keep_names_apart(width: int) -> None:
    pairs = [("chat-8b", "chat-32b"), ("qwen3-14b", "qwen3-32b"), ("g6e.xlarge", "g6e.12xlarge")]
    for a, b in pairs:
        short = abbreviate_all([a, b], width)
        assert short[a] != short[b], (a, b, short)


@pytest.mark.slow
@given(st.sampled_from(NAMES) | st.text(min_size=1, max_size=30), st.integers(1, 40))
def test_never_longer_than_asked(name: str, width: int) -> None:
    short = abbreviate(name, width)
    assert len(short) <= width and (short == name or len(name) > width)


def test_clashing_short_forms_keep_their_names() -> None:
    assert abbreviate_all(["abcdefgh-1", "abcdefxy-1"], 4) == {"abcdefgh-1": "abcdefgh-1", "abcdefxy-1": "abcdefxy-1"}
    with pytest.raises(ValueError, match="width"):
        abbreviate("x", 0)


def test_fit_columns_leaves_out_the_least_useful() -> None:
    widths, prio = [10, 10, 10, 10], [9, 1, 5, 5]
    assert fit_columns(widths, prio, 200) == [0, 1, 2, 3]
    assert fit_columns(widths, prio, 40) == [0, 2, 3]  # each column takes 10 + 3, the table 1 more
    assert fit_columns(widths, prio, 39) == [0, 2]  # of equal priority, the rightmost goes first
    assert fit_columns(widths, prio, 10) == [0]  # the first column of top priority stays


def test_fit_table_uses_short_headings_only_when_narrow() -> None:
    heads, rows = ["name", "capacity req/s"], [["chat-8b", "1.00"]]
    assert fit_table(heads, rows, [9, 5], 80, short_heads={"capacity req/s": "cap/s"}) == ([0, 1], heads)
    assert fit_table(heads, rows, [9, 5], 20, short_heads={"capacity req/s": "cap/s"}) == ([0, 1], ["name", "cap/s"])
    assert fit_table(heads, rows, [9, 5], 12)[0] == [0]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from coral.cli import main

    def build(path: Path) -> None:
        argv = ["templates", "build", "--scenario", "mesh-surge", "--models", "llama-3.1-8b,qwen3-14b", "--store",
                str(path), "--workers", "1", "--json"]  # fmt: skip
        assert main(argv) == 0

    return shared_build(tmp_path_factory, "display-templates.sqlite", build)


@pytest.mark.slow
def test_templates_list_at_80_columns(coral: Coral, store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    r = coral("templates", "list", "--store", str(store), "--json")
    models = {t["model"] for t in json.loads(r.out)}
    assert len(models) >= 2
    monkeypatch.setenv("COLUMNS", "80")
    r = coral("templates", "list", "--store", str(store))
    lines = r.out.splitlines()
    assert r.rc == 0 and max(len(line) for line in lines) <= 80
    header = next(line for line in lines if "id" in line and "model" in line)
    for head in ("id", "model", "mode", "nodes", "tok/s"):
        assert head in header
    shown = {abbreviate_all(sorted(models), 10)[m] for m in models}
    assert all(any(f" {s} " in line for line in lines) for s in shown)
    assert "…" not in r.out
    monkeypatch.setenv("COLUMNS", "200")
    wide = coral("templates", "list", "--store", str(store)).out
    assert all(f" {m} " in wide for m in models) and "prefill tok/s" in wide and "status" in wide


@pytest.mark.slow
def test_show_finds_a_template_by_query(coral: Coral, store: Path) -> None:
    tpls = json.loads(coral("templates", "list", "--store", str(store), "--mode", "aggregated", "--json").out)
    tpl = max(tpls, key=lambda t: len(set(t["nodes"])))
    nodes = ",".join(reversed(tpl["nodes"]))  # in any order
    by_query = coral("templates", "show", "--model", tpl["model"], "--nodes", nodes, "--store", str(store), "--json")
    assert by_query.rc == 0 and json.loads(by_query.out)["id"] == tpl["id"]
    by_id = coral("templates", "show", tpl["id"][:8], "--store", str(store), "--json")
    assert by_id.out == by_query.out
    miss = coral("templates", "show", "--model", tpl["model"], "--nodes", "p5.4xlarge", "--store", str(store))
    assert miss.rc == 2 and "no aggregated template" in miss.err and len(miss.err.splitlines()) == 1
    both = coral("templates", "show", tpl["id"], "--model", tpl["model"], "--nodes", nodes, "--store", str(store))
    assert both.rc == 2 and "not both" in both.err
