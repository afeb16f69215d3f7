"""The SQLite template store: round trips, content keys, and refusal of corrupt, foreign or newer files."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import attrs
import pytest

from coral.catalog import Catalog
from coral.store import Outcome, StoreError, TemplateStore, template_key
from coral.templates import SINK, SOURCE, Route, Stage, Template
from coral.workload import Slo, WorkloadShape

SLO = Slo(ttft_s=2.0, tpot_s=0.1)
SHAPE = WorkloadShape(1000, 200)


def make_template(tid: str = "abc123", nodes: tuple[str, ...] = ("g6e.xlarge", "g6e.xlarge")) -> Template:
    stages = tuple(Stage(i, n, "l40s-48g", 1, 16 * i, 16 * (i + 1), 8, 20e9, 0.01, 0.1) for i, n in enumerate(nodes))
    routes = (Route(SOURCE, 0, 1.5), Route(0, 1, 1.5), Route(1, SINK, 1.5))
    return Template(
        id=tid, model="llama-3.1-8b", num_layers=32, mode="aggregated", slo=SLO, shape=SHAPE, nodes=nodes,
        stages=stages, routes=routes, prefill_tok_s=1500.0, decode_tok_s=300.0, ttft_s=0.2, tpot_s=0.02,
        perf_version="roofline-1", status="optimal", gap=0.0, bound=1.5, method="dp-proven", solve_s=0.01,
    )  # fmt: skip


def test_round_trip_and_queries(tmp_path: Path) -> None:
    t = make_template()
    with TemplateStore(tmp_path / "s.sqlite") as store:
        store.put([Outcome("k1", t.model, t.mode, SLO.key, t.nodes, "template", t.id, 1.5)], [t])
        assert store.get("abc") == t
        assert store.query(model="llama-3.1-8b", slo=SLO) == [t]
        assert store.query(model="qwen3-14b") == []
        assert store.fitting({"g6e.xlarge": 2}) == [t]
        assert store.fitting({"g6e.xlarge": 1}) == []
        assert store.outcomes(["k1", "k2"])["k1"].capacity == 1.5
        assert store.pareto("llama-3.1-8b", {"g6e.xlarge": 1.86}) == [t]
    with TemplateStore(tmp_path / "s.sqlite", readonly=True) as ro:
        assert ro.get("abc123").to_json() == t.to_json()


def test_key_ignores_prices_but_not_model_or_perf(catalog: Catalog) -> None:
    args = ("llama-3.1-8b", ["g6e.xlarge"], "aggregated", SLO, SHAPE, "roofline-1", {"nmax": 3})
    k = template_key(catalog, *args)
    region = catalog.regions["aws-us-east-1"]
    offers = dict(region.offers)
    offers["g6e.xlarge"] = attrs.evolve(offers["g6e.xlarge"], price=99.0)
    cheaper = attrs.evolve(catalog, regions={**catalog.regions, "aws-us-east-1": attrs.evolve(region, offers=offers)})
    assert template_key(cheaper, *args) == k
    assert template_key(catalog, "llama-3.1-8b", ["g6e.xlarge"], "decode", SLO, SHAPE, "roofline-1", {"nmax": 3}) != k
    assert template_key(catalog, *args[:5], "roofline-2", {"nmax": 3}) != k
    gpu = attrs.evolve(catalog.gpus["l40s-48g"], mem_bw_gbs=900)
    assert template_key(attrs.evolve(catalog, gpus={**catalog.gpus, "l40s-48g": gpu}), *args) != k


def test_corrupt_file_is_refused_and_untouched(tmp_path: Path) -> None:
    p = tmp_path / "bad.sqlite"
    p.write_bytes(b"this is not sqlite at all" * 100)
    before = p.read_bytes()
    with pytest.raises(StoreError, match="not a Coral template store"):
        TemplateStore(p)
    assert p.read_bytes() == before


def test_foreign_database_is_refused_and_untouched(tmp_path: Path) -> None:
    p = tmp_path / "other.sqlite"
    db = sqlite3.connect(p)
    db.execute("CREATE TABLE users (name TEXT)")
    db.commit()
    db.close()
    before = p.read_bytes()
    with pytest.raises(StoreError, match="foreign"):
        TemplateStore(p)
    assert p.read_bytes() == before


def test_incompatible_schema_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "s.sqlite"
    TemplateStore(p).close()
    db = sqlite3.connect(p)
    db.execute("UPDATE meta SET value = '99' WHERE key = 'schema'")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="schema 99 is not supported"):
        TemplateStore(p)


def test_readonly_missing_store_names_the_build_command(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="coral templates build"):
        TemplateStore(tmp_path / "none.sqlite", readonly=True)


def test_ambiguous_and_unknown_ids(tmp_path: Path) -> None:
    with TemplateStore(tmp_path / "s.sqlite") as store:
        store.put([], [make_template("aa1"), make_template("aa2")])
        with pytest.raises(StoreError, match="ambiguous"):
            store.get("aa")
        with pytest.raises(StoreError, match="no template"):
            store.get("zz")
